//! `reservoir replay`'s lints (waste that is not an OOM yet) on a real
//! trace, through the binary: the JSON `lints` array of every setting, the
//! table's "waste" block and the HTML section.

use std::process::Command;

use reservoir_testkit::traces::shared_trace;

#[test]
fn a_real_trace_is_linted_in_json_table_and_html() {
    let Some(file) = shared_trace("tomi-mlp/91c77ee1_snapshot.pickle") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let file = file.to_str().unwrap();
    let html = std::env::temp_dir().join(format!("reservoir-lints-{}.html", std::process::id()));
    let run = |extra: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_reservoir"))
            .args(["replay", file, "-p", "pytorch", "-p", "roundup-4"])
            .args(extra)
            .output()
            .expect("the reservoir binary runs");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let v: serde_json::Value = serde_json::from_str(&run(&["--json"])).unwrap();
    let a = v.as_array().unwrap();
    assert_eq!(a.len(), 2);
    for r in a {
        assert!(r["lints"].is_array(), "no lints in {}", r["setting"]);
        assert_eq!(r["lints_threshold"], 1 << 20);
        assert_eq!(r["lints_computed"], true);
    }
    // PyTorch's 512-byte steps waste nothing worth a lint here.
    assert_eq!(a[0]["lints"].as_array().unwrap().len(), 0);
    // 4 divisions round the 8519680-byte requests (8 MiB + 128 KiB) of
    // generate_snapshot.py:20 up to 10 MiB.
    let l = a[1]["lints"].as_array().unwrap();
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0]["kind"], "rounding");
    assert_eq!(l[0]["bytes"], 3935288);
    assert_eq!(l[0]["op"], 13);
    assert_eq!(l[0]["sites"][0]["site"], "generate_snapshot.py:20:forward");
    assert_eq!(l[0]["sites"][0]["request"], 8519680);
    assert!(l[0]["fix"].as_str().unwrap().starts_with(
        "trim generate_snapshot.py:20:forward's request to 8.00 MiB (8388608 B) to save \
             2.00 MiB per allocation (replayed: the trim does not lower peak reserved here: \
             22.00 MiB against 22.00 MiB); or "
    ));

    let table = run(&["--html", html.to_str().unwrap()]);
    assert!(
        table.contains("roundup-4: waste (lints of 1024.00 KiB or more):"),
        "{table}"
    );
    assert!(table.contains("lost to rounding: 3.75 MiB"), "{table}");
    assert!(!table.contains("pytorch: waste"), "{table}");
    let page = std::fs::read_to_string(&html).unwrap();
    let _ = std::fs::remove_file(&html);
    assert!(
        page.contains("<h3 class=\"lints\">roundup-4: waste"),
        "{page}"
    );
    assert!(page.contains("<h3 class=\"lints\">pytorch: waste"));
    assert!(page.contains("No waste above the threshold."));
}
