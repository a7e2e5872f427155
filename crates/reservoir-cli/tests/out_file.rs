//! Issue 44, G1 (the class): every output file the CLI writes
//! (`workload --out`, `oracle-trace`, `--html FILE`, `diff --json FILE`)
//! goes through `reservoir::outfile::write_file`: a temporary file renamed
//! into place, so a failed write keeps the previous file, and a device is
//! written straight, never replaced. Before, `File::create` truncated the
//! previous file first and a failure left half of the new one.
//!
//! The write is made to fail with `EFBIG` under a file-size limit
//! (`ulimit -f`, in a shell around the binary), which root gets too.

use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::process::Command;

fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("out-file-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_failed_out_keeps_the_previous_file() {
    let dir = scratch("fsize");
    let out = dir.join("trace.txt");
    std::fs::write(&out, "the previous trace\n").unwrap();
    std::os::unix::fs::symlink("trace.txt", dir.join("link")).unwrap();
    for target in ["trace.txt", "link"] {
        // SIGXFSZ ignored, files capped at 4 blocks (2 KiB): the workload's
        // trace is about 36 KiB.
        let o = Command::new("sh")
            .arg("-c")
            .arg(r#"trap '' XFSZ; ulimit -f 4 && exec "$0" "$@""#)
            .arg(env!("CARGO_BIN_EXE_reservoir"))
            .args(["workload", "gpt-train", "--out"])
            .arg(dir.join(target))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{target}: {stderr}");
        assert!(stderr.contains("cannot write"), "{target}: {stderr}");
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "the previous trace\n",
            "{target}: the previous file was changed"
        );
        assert!(std::fs::symlink_metadata(dir.join("link"))
            .unwrap()
            .file_type()
            .is_symlink());
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["link", "trace.txt"], "{target}: a file was left");
    }
    // Without the limit the file is replaced, through the link too.
    let o = Command::new(env!("CARGO_BIN_EXE_reservoir"))
        .args(["workload", "gpt-train", "--out"])
        .arg(dir.join("link"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.len() > 4096, "{} bytes", text.len());
    assert!(std::fs::symlink_metadata(dir.join("link"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn out_to_a_device_writes_through_it() {
    let o = Command::new(env!("CARGO_BIN_EXE_reservoir"))
        .args(["workload", "gpt-train", "--out", "/dev/null"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::symlink_metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
}
