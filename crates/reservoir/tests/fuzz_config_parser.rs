//! Replays the `config_parser` fuzz target's committed inputs on stable:
//! `fuzz/corpus-seeds/config_parser/` (small hand-written seeds) and
//! `fuzz/regressions/config_parser/` (minimized findings). The target's
//! body and checks live in `fuzz/common/config_parser.rs` (included below),
//! so `cargo test -p reservoir --test fuzz_config_parser` runs exactly what
//! the fuzzer runs; see `fuzz/README.md`.

use std::path::{Path, PathBuf};

#[path = "../../../fuzz/common/config_parser.rs"]
mod config_parser;

fn inputs(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz")
        .join(dir);
    // A folder git has no file in (regressions/config_parser) is missing.
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && !p.extension().is_some_and(|x| x == "md"))
        .collect();
    v.sort();
    v
}

#[test]
fn config_parser_seeds_and_regressions() {
    let mut files = inputs("corpus-seeds/config_parser");
    let seeds = files.len();
    files.extend(inputs("regressions/config_parser"));
    assert!(seeds > 0, "no seeds in fuzz/corpus-seeds/config_parser");
    for f in &files {
        let data = std::fs::read(f).unwrap();
        if std::panic::catch_unwind(|| config_parser::run_bytes(&data)).is_err() {
            panic!("{} fails (see the panic above)", f.display());
        }
    }
    println!("config_parser: {} inputs replayed", files.len());
}
