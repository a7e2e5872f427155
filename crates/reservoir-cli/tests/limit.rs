//! Issue 30 item 2: the limit (peak live, best offline placement) and each
//! setting's fragmentation tax in `reservoir replay --min-capacity` and
//! `reservoir compare` (table, JSON, HTML).

use std::path::PathBuf;
use std::process::{Command, Output};

fn reservoir(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_reservoir"))
        .args(args)
        .output()
        .expect("the reservoir binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const WORKLOAD: &str = "gpt-train:layers=2,steps=2";

/// Each report's tax is its minimum capacity minus the best placement, in
/// bytes and in % of the best placement.
fn check_tax(
    min: u64,
    limit: &serde_json::Value,
    tax: &serde_json::Value,
    pct: &serde_json::Value,
) {
    let best = limit["best_placement"].as_u64().unwrap();
    assert_eq!(tax.as_i64().unwrap(), min as i64 - best as i64);
    let pct = pct.as_f64().unwrap();
    assert!((pct - (min as f64 - best as f64) * 100.0 / best as f64).abs() < 1e-9);
}

#[test]
fn replay_min_capacity_shows_the_limit_and_the_tax() {
    let html = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("limit.html");
    let args = [
        "replay",
        "--workload",
        WORKLOAD,
        "-p",
        "pytorch",
        "-p",
        "reservoir",
        "--min-capacity",
    ];
    let o = reservoir(&[&args[..], &["--html", html.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    for needle in [
        "fragmentation tax (vs best placement)",
        "the limit: peak live ",
        "rounded up to 512 bytes",
        "exact (proven optimal)",
        "found in 2 MiB steps",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in\n{out}");
    }
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("fragmentation tax</th>"), "{page}");
    assert!(page.contains("The limit and each setting"), "{page}");

    let o = reservoir(&[&args[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for r in v.as_array().unwrap() {
        let l = &r["limit"];
        let (live, lb, best) = (
            l["peak_live"].as_u64().unwrap(),
            l["lower_bound"].as_u64().unwrap(),
            l["best_placement"].as_u64().unwrap(),
        );
        assert_eq!(live, r["peak_live"].as_u64().unwrap());
        assert!(live <= lb && lb <= best, "{l}");
        assert_eq!(l["exact"], serde_json::json!(lb == best));
        assert_eq!(l["unit"], 512);
        check_tax(
            r["min_capacity"].as_u64().unwrap(),
            l,
            &r["fragmentation_tax_bytes"],
            &r["fragmentation_tax_pct"],
        );
    }
    // Without --min-capacity: no limit is computed.
    let o = reservoir(&["replay", "--workload", WORKLOAD, "-p", "pytorch", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v[0].get("limit").is_none());
    assert!(v[0].get("fragmentation_tax_bytes").is_none());
}

#[test]
fn compare_shows_the_limit_and_the_tax_per_policy() {
    let args = [
        "compare",
        "--no-traces",
        "--workload",
        WORKLOAD,
        "-p",
        "pytorch",
        "-p",
        "reservoir",
    ];
    let o = reservoir(&args);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    for needle in [
        "fragmentation tax",
        "the limit: peak live and the best placement",
        "best placement",
        "at most 2 MiB above the true tax",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in\n{out}");
    }
    let o = reservoir(&[&args[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let row = &v["rows"][0];
    let l = &row["limit"];
    assert!(l["best_placement"].as_u64().unwrap() >= l["peak_live"].as_u64().unwrap());
    for p in row["policies"].as_array().unwrap() {
        check_tax(
            p["min_capacity"].as_u64().unwrap(),
            l,
            &p["fragmentation_tax_bytes"],
            &p["fragmentation_tax_pct"],
        );
    }
    let summary = v["fragmentation_tax"].as_array().unwrap();
    assert_eq!(summary.len(), 2);
    assert_eq!(summary[0]["policy"], "pytorch");
    assert_eq!(summary[0]["inputs"], 1);
    // One input: the median is the worst is its tax.
    assert_eq!(
        summary[1]["worst_bytes"],
        row["policies"][1]["fragmentation_tax_bytes"]
    );
    assert_eq!(summary[1]["median_pct"], summary[1]["worst_pct"]);
}
