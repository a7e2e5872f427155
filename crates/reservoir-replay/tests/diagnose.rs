//! scratch
use reservoir_replay::oracle_trace::Trace;
use reservoir_replay::replay::explain::explain_on_device;
use reservoir_replay::replay::sites::Sites;
use reservoir_replay::replay::{replay, ReplayOptions, ReplaySetting};

const M: u64 = 1 << 20;

fn show(name: &str, text: &str, conf: &str, cap: u64, total: Option<u64>) {
    let trace = Trace::parse(text).unwrap();
    let s = ReplaySetting::new("pytorch", conf);
    let o = ReplayOptions { capacity: cap, ..ReplayOptions::default() };
    let report = replay(&trace, &s, &o).unwrap();
    let general: Vec<ReplaySetting> = ["expandable_segments:True", "max_split_size_mb:128"].iter().map(|c| ReplaySetting::new(*c, *c)).collect();
    let ex = explain_on_device(&trace, None, &s, &o, &report, &Sites::new(), &general, total).unwrap();
    println!("== {name}: ooms {}\n{}", report.ooms, serde_json::to_string_pretty(&ex.oom.map(|o| (o.op, o.unusable_free, o.diagnosis))).unwrap());
}

#[test]
fn scratch() {
    let m = |n: u64| (n * M).to_string();
    if false { show("capacity", &format!("a 1 {}\na 2 {}\na 3 {}\n", m(30), m(20), m(20)), "", 64 * M, None);
    }
    show("split_limit", &format!("a 1 {}\nf 1\na 2 {}\na 3 {}\n", m(60), m(45), m(14)), "max_split_size_mb:40", 70 * M, None);
    let mut t = String::new();
    for i in 1..=10 { t += &format!("a {i} {}\n", 2 * M); }
    for i in [1, 3, 5, 7, 9] { t += &format!("f {i}\n"); }
    t += &format!("a 11 {}\n", m(6));
    show("scattered", &t, "", 30 * M, None);
    let mut t = String::new();
    for i in 1..=10 { t += &format!("a {i} {}\n", M); }
    for i in [1, 3, 5, 7, 9] { t += &format!("f {i}\n"); }
    t += &format!("a 11 {}\n", m(16));
    if false {
    show("pool_split", &t, "", 24 * M, None);
    show("stranding", &format!("a 1 {} 0\na 2 {} 0\nf 1\na 3 {} s1\n", m(2), m(2), m(16)), "", 30 * M, None);
    show("fraction", &format!("a 1 {}\na 2 {}\n", m(20), m(20)), "per_process_memory_fraction:0.5", 64 * M, None);
    show("outside", &format!("a 1 {}\na 2 {}\n", m(20), m(20)), "", 32 * M, Some(128 * M));
    show("expandable", &format!("a 1 {0}\na 2 {0}\na 3 {0}\na 4 {0}\na 5 {0}\nf 1\nf 3\na 6 {1}\n", m(8), m(12)), "expandable_segments:True", 40 * M, None);
    show("rounding", &format!("a 1 {0}\na 2 {0}\n", m(33)), "roundup_power2_divisions:2", 90 * M, None);
    }
}
