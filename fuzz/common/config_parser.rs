//! The body of the `config_parser` fuzz target, shared with its stable
//! replay test (`crates/reservoir/tests/fuzz_config_parser.rs`, which
//! includes this file with `#[path]`).
//!
//! The input's bytes (read as UTF-8, lossily) are a settings string for
//! every reader of `reservoir::config` and, split at `\x1f` into up to
//! three values, the MPS heap allocator's environment
//! (`PYTORCH_DEBUG_MPS_ALLOCATOR`, `PYTORCH_MPS_HIGH_WATERMARK_RATIO`,
//! `PYTORCH_MPS_LOW_WATERMARK_RATIO`). Checks:
//!
//! * nothing panics;
//! * a string that parses gives settings whose `to_settings_string` parses
//!   back to the same settings (compared apart from `last_settings` and
//!   `policy`, which the settings string does not carry), and printing those
//!   again gives the same string;
//! * `parse` and `parse_with_warnings` agree; `from_env_with` with only
//!   `PYTORCH_CUDA_ALLOC_CONF` set gives what `parse` gives (its error
//!   wrapped in `ConfigError::Env`); `parse_with_policy` gives what `parse`
//!   gives on a string without `policy`;
//! * `apply_runtime` that fails leaves the settings as they were;
//! * every error's message (`Display` and `pytorch_message`) is non-empty
//!   and at most [`MESSAGE_SLACK`] bytes plus [`MESSAGE_PER_BYTE`] bytes per
//!   input byte;
//! * heap settings that load are valid, and load again from their own
//!   printed values to the same settings;
//! * `strtol_base0` agrees with the C library's `strtol(s, NULL, 0)`.

use std::ffi::{c_char, c_int, c_long, CString};

use reservoir::config::heap::{
    strtol_base0, HeapSettings, ENV_DEBUG, ENV_HIGH_WATERMARK_RATIO, ENV_LOW_WATERMARK_RATIO,
};
use reservoir::config::{AllocatorConfig, ConfigError, ReservoirPolicy, ENV_CUDA_ALLOC_CONF};

/// An error message may be this long plus [`MESSAGE_PER_BYTE`] bytes per
/// input byte.
pub const MESSAGE_SLACK: usize = 4096;
/// See [`MESSAGE_SLACK`]: messages may quote the input (escaped), but not
/// repeat it without bound.
pub const MESSAGE_PER_BYTE: usize = 8;

extern "C" {
    fn strtol(s: *const c_char, end: *mut *mut c_char, base: c_int) -> c_long;
}

/// Run every check on `data`; panics on the first violation.
pub fn run_bytes(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    settings(&text);
    heap(&text, data.first().is_some_and(|b| b & 1 == 1));
    c_strtol(data);
}

fn bounded(what: &str, input: &str, msg: &str) {
    assert!(!msg.is_empty(), "{what}: empty error message for {input:?}");
    let bound = MESSAGE_SLACK + MESSAGE_PER_BYTE * input.len();
    assert!(
        msg.len() <= bound,
        "{what}: a {}-byte message for a {}-byte input (bound {bound})",
        msg.len(),
        input.len()
    );
}

fn check_error(what: &str, input: &str, e: &ConfigError) {
    // The "did you mean" advice of an unknown key costs an edit distance to
    // every known key (key length x about 700 steps): the fuzzer skips it
    // for keys above 256 bytes, whose message is the key once plus a
    // constant text anyway.
    let long_unknown_key = match e {
        ConfigError::UnknownKey { key, .. } => key.len() > 256,
        ConfigError::Env { error, .. } => {
            matches!(error.as_ref(), ConfigError::UnknownKey { key, .. } if key.len() > 256)
        }
        _ => false,
    };
    if !long_unknown_key {
        bounded(what, input, &e.to_string());
    }
    bounded(what, input, &e.pytorch_message());
}

/// The settings a settings string can carry: without `last_settings` and
/// `policy`, as text (so that NaN compares equal to NaN).
fn comparable(c: &AllocatorConfig) -> String {
    let mut c = c.clone();
    c.last_settings = String::new();
    c.policy = ReservoirPolicy::default();
    format!("{c:?}")
}

fn settings(s: &str) {
    let parsed = AllocatorConfig::parse(s);
    match &parsed {
        Ok(cfg) => {
            assert_eq!(
                cfg.last_settings, s,
                "last_settings is not the string parsed"
            );
            let printed = cfg.to_settings_string();
            let back = AllocatorConfig::parse(&printed).unwrap_or_else(|e| {
                panic!("{s:?} parses, but its settings string {printed:?} does not: {e}")
            });
            assert_eq!(
                comparable(&back),
                comparable(cfg),
                "{s:?} parses, and its settings string {printed:?} reads back differently"
            );
            assert_eq!(
                back.to_settings_string(),
                printed,
                "printing the read-back settings of {s:?} changed the string"
            );
        }
        Err(e) => check_error("parse", s, e),
    }

    // parse_with_warnings is parse.
    match (AllocatorConfig::parse_with_warnings(s), &parsed) {
        (Ok((a, warnings)), Ok(b)) => {
            assert_eq!(&a, b, "parse_with_warnings differs from parse on {s:?}");
            for w in warnings {
                bounded("warning", s, &w.pytorch_message());
            }
        }
        (Err(a), Err(b)) => assert_eq!(&a, b, "parse_with_warnings errs differently on {s:?}"),
        (a, b) => panic!("parse_with_warnings and parse disagree on {s:?}: {a:?} / {b:?}"),
    }

    // The environment reader with only PYTORCH_CUDA_ALLOC_CONF set.
    let env =
        AllocatorConfig::from_env_with(|var| (var == ENV_CUDA_ALLOC_CONF).then(|| s.to_owned()));
    match (&env, &parsed) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "from_env_with differs from parse on {s:?}"),
        (Err(ConfigError::Env { var, error }), Err(b)) => {
            assert_eq!(*var, ENV_CUDA_ALLOC_CONF);
            // The same error (checked above), named after the variable.
            assert_eq!(error.as_ref(), b, "from_env_with errs differently on {s:?}");
        }
        (a, b) => panic!("from_env_with and parse disagree on {s:?}: {a:?} / {b:?}"),
    }

    // parse_with_policy: without a `policy` entry it is parse (an empty or
    // blank string gives the defaults).
    let with_policy = AllocatorConfig::parse_with_policy(s);
    match &with_policy {
        Ok(cfg) => {
            let printed = cfg.to_settings_string();
            let back = AllocatorConfig::parse(&printed).unwrap_or_else(|e| {
                panic!("{s:?} parses with a policy, but {printed:?} does not: {e}")
            });
            // A policy may turn expandable segments on; the rest reads back.
            assert_eq!(
                comparable(&back),
                comparable(cfg),
                "{s:?} parses with a policy, and {printed:?} reads back differently"
            );
        }
        // An error of `parse` is checked above (the message of an unknown
        // key costs an edit distance to every known key: check each once).
        Err(e) if parsed.as_ref().err() != Some(e) => check_error("parse_with_policy", s, e),
        Err(_) => {}
    }
    if !s.contains("policy") && !s.trim().is_empty() {
        match (&with_policy, &parsed) {
            (Ok(a), Ok(b)) => assert_eq!(
                comparable(a),
                comparable(b),
                "parse_with_policy differs on {s:?}"
            ),
            (Err(a), Err(b)) => assert_eq!(a, b, "parse_with_policy errs differently on {s:?}"),
            (a, b) => panic!("parse_with_policy and parse disagree on {s:?}: {a:?} / {b:?}"),
        }
    }

    // Run-time settings: an error changes nothing.
    let starts: Vec<AllocatorConfig> = match &parsed {
        Ok(cfg) => vec![AllocatorConfig::default(), cfg.clone()],
        Err(_) => vec![AllocatorConfig::default()],
    };
    for start in starts {
        let mut cfg = start.clone();
        match cfg.apply_runtime(s) {
            Ok(()) => {
                assert_eq!(cfg.last_settings, s, "apply_runtime did not record {s:?}");
            }
            Err(e) => {
                assert_eq!(
                    cfg, start,
                    "a failed apply_runtime({s:?}) changed the settings"
                );
                if parsed.as_ref().err() != Some(&e) {
                    check_error("apply_runtime", s, &e);
                }
            }
        }
    }
}

fn heap(s: &str, unified: bool) {
    let mut parts = s.splitn(3, '\x1f');
    let vars = [
        (ENV_DEBUG, parts.next()),
        (ENV_HIGH_WATERMARK_RATIO, parts.next()),
        (ENV_LOW_WATERMARK_RATIO, parts.next()),
    ];
    let lookup = |vars: &[(&str, Option<&str>)], name: &str| -> Option<String> {
        vars.iter()
            .find(|(v, _)| *v == name)
            .and_then(|(_, x)| x.map(str::to_owned))
    };
    match HeapSettings::from_lookup(unified, |name| lookup(&vars, name)) {
        Ok(h) => {
            h.validate()
                .unwrap_or_else(|e| panic!("loaded heap settings do not validate: {e}"));
            let debug = h.debug.bits().to_string();
            let high = format!("{:?}", h.high_watermark_ratio);
            let low = format!("{:?}", h.low_watermark_ratio);
            let again = [
                (ENV_DEBUG, Some(debug.as_str())),
                (ENV_HIGH_WATERMARK_RATIO, Some(high.as_str())),
                (ENV_LOW_WATERMARK_RATIO, Some(low.as_str())),
            ];
            let back = HeapSettings::from_lookup(unified, |name| lookup(&again, name))
                .unwrap_or_else(|e| {
                    panic!("heap settings {h:?} do not load from their own values: {e}")
                });
            assert_eq!(
                back, h,
                "heap settings changed when loaded from their own values"
            );
        }
        Err(e) => bounded("heap settings", s, &e.to_string()),
    }
}

/// `strtol_base0` against the C library (the text up to the first NUL).
fn c_strtol(data: &[u8]) {
    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let Ok(text) = std::str::from_utf8(&data[..end]) else {
        return;
    };
    let c = CString::new(text).expect("no NUL");
    // SAFETY: `c` is NUL-terminated; a null end pointer is allowed.
    let want = unsafe { strtol(c.as_ptr(), std::ptr::null_mut(), 0) };
    let got = strtol_base0(text);
    #[allow(clippy::useless_conversion)] // `c_long` is `i32` on some targets
    let want = i64::from(want);
    assert_eq!(
        got, want,
        "strtol_base0({text:?}) = {got}, C's strtol says {want}"
    );
}
