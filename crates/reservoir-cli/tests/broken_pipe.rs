//! The binary's behaviour on a closed standard output.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};

use reservoir_testkit::traces::shared_trace;

const WORKLOAD: &str = "gpt-train:layers=1,steps=2";

/// `reservoir replay ... --json | head -c0`: the reader is gone before the
/// report is written. The command ends quietly with 141 (a shell's status
/// for SIGPIPE), not "error: writing JSON: Broken pipe" (status 1, as
/// before), a panic (`diff`, which printed with `print!`: status 101) or
/// success (`workloads`: status 0).
#[test]
fn a_closed_stdout_ends_quietly() {
    let snap =
        shared_trace("cs336-bcrafton/06f51ae4_memory_snapshot.pickle").expect("../shared/traces");
    let snap = snap.to_str().unwrap();
    for args in [
        &["replay", "--workload", WORKLOAD, "-p", "pytorch", "--json"][..],
        &["workloads"][..],
        &["workload", WORKLOAD][..],
        &["diff", snap, snap][..],
    ] {
        // A standard output whose reader is gone before the command starts
        // (a pipe closed later races with a small output that fits in it):
        // one end of a socket pair, the other end closed.
        let (stdout, reader) = UnixStream::pair().unwrap();
        drop(reader);
        let mut child = Command::new(env!("CARGO_BIN_EXE_reservoir"))
            .args(args)
            .stdout(Stdio::from(OwnedFd::from(stdout)))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(141), "{args:?}: {err}");
        assert_eq!(err, "", "{args:?}");
    }
}
