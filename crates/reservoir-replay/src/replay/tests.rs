use super::*;

#[test]
fn peaks_found_by_a_second_replay_are_the_same() {
    let trace = crate::workload::generate("gpt-train:steps=2").unwrap();
    for setting in ReplaySetting::defaults() {
        let options = ReplayOptions::default();
        let mut scanned = Replay::new(&trace, &setting, &options).unwrap();
        scanned.run().unwrap();
        assert!(scanned.peak_pending.is_none());
        let mut starved = Replay::new(&trace, &setting, &options).unwrap();
        starved.scan_budget = 0;
        starved.scan_credit_per_op = 0;
        starved.last_scan_cost = 1;
        starved.run().unwrap();
        assert!(starved.peak.is_none() && starved.peak_pending.is_some());
        let (a, b) = (scanned.report(), starved.report());
        assert_eq!(a.peak, b.peak, "{}", setting.name);
        assert!(a.largest_free_block_at_peak > 0);
    }
}

#[test]
fn stream_table_numbers_in_first_use_order() {
    let mut t = StreamTable::new();
    assert_eq!(
        t.resolve(&StreamName::new("default")),
        (StreamId::DEFAULT, false)
    );
    assert_eq!(t.resolve(&StreamName::new("b")), (StreamId(1), true));
    assert_eq!(t.resolve(&StreamName::new("a")), (StreamId(2), true));
    assert_eq!(t.resolve(&StreamName::new("b")), (StreamId(1), false));
    assert_eq!(t.resolve(&StreamName::new("0")), (StreamId::DEFAULT, false));
    assert_eq!(t.get(&StreamName::new("a")), Some(StreamId(2)));
    assert_eq!(t.get(&StreamName::new("c")), None);
}
