//! Issue 44, G1: a failed `reservoir_allocator_snapshot` removed whatever
//! `path` named (`std::fs::remove_file(path)` on a write error): a device
//! node (as root, `/dev/full` for every process), a FIFO, a symbolic link,
//! or the previous snapshot on a full disk. Now the pickle goes to a
//! temporary file renamed into place only when whole
//! (`reservoir::outfile::write_file`), and a device or FIFO is written
//! straight and never removed.
//!
//! The failures used are ones root gets too (the tests run as root):
//! `EPIPE` on a FIFO whose reader leaves, `ENOSPC` on a `/dev/full`-like
//! node made with `mknod` in a scratch folder (never `/dev/full` itself),
//! `EFBIG` under a file-size limit (`ulimit -f`, in a child process),
//! `ENOTDIR` and `EISDIR`.

use std::ffi::{CStr, CString};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use reservoir_capi::{
    reservoir_allocator_alloc, reservoir_allocator_create, reservoir_allocator_destroy,
    reservoir_allocator_free, reservoir_allocator_record_history, reservoir_allocator_snapshot,
    reservoir_last_error, ReservoirAllocator, ReservoirBackend, ReservoirStatus,
};

/// The child test run under `ulimit -f` (see [`a_failed_write_keeps_the_previous_snapshot_and_its_link`]).
const CHILD_DIR: &str = "RESERVOIR_TEST_SNAPSHOT_FSIZE_DIR";

fn last_error() -> String {
    // SAFETY: NUL-terminated, owned by the library, copied at once.
    unsafe { CStr::from_ptr(reservoir_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("snapshot-file-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A simulated allocator whose history makes a pickle of several MiB (far
/// more than a pipe, a buffer or the child's file-size limit holds).
fn allocator_with_history() -> *mut ReservoirAllocator {
    let mut h = std::ptr::null_mut();
    // SAFETY: null config, `h` a live local.
    let s = unsafe {
        reservoir_allocator_create(
            ReservoirBackend::RESERVOIR_BACKEND_SIM as u32,
            0,
            0,
            std::ptr::null(),
            &mut h,
        )
    };
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
    assert_eq!(
        reservoir_allocator_record_history(h, true, 100_000),
        ReservoirStatus::RESERVOIR_OK
    );
    for i in 0..20_000u64 {
        let mut p = std::ptr::null_mut();
        // SAFETY: default stream, `p` a live local.
        let s = unsafe { reservoir_allocator_alloc(h, 512 + i % 4096, 0, &mut p) };
        assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
        assert_eq!(
            reservoir_allocator_free(h, p),
            ReservoirStatus::RESERVOIR_OK
        );
    }
    h
}

fn snapshot(h: *mut ReservoirAllocator, path: &Path) -> (ReservoirStatus, String) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    let s = unsafe { reservoir_allocator_snapshot(h, c.as_ptr()) };
    (s, last_error())
}

/// The names in `dir`, sorted (no temporary file may be left behind).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

#[test]
fn a_fifo_whose_reader_leaves_is_not_removed() {
    let dir = scratch("fifo");
    let fifo = dir.join("pipe");
    mkfifo(&fifo);
    let h = allocator_with_history();
    // The read end, opened first without blocking, so the writer's open
    // returns at once.
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let token = h as usize;
    let path = fifo.clone();
    let writer = std::thread::spawn(move || snapshot(token as *mut ReservoirAllocator, &path));
    // Wait for the first bytes (the writer opened it and is writing), then
    // leave: the writer's next write fails with EPIPE.
    let start = Instant::now();
    let mut buf = [0u8; 16];
    loop {
        match reader.read(&mut buf) {
            Ok(n) if n > 0 => break,
            _ => {
                assert!(
                    start.elapsed() < Duration::from_secs(120),
                    "the snapshot never wrote to the FIFO"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    drop(reader);
    let (s, msg) = writer.join().unwrap();
    assert_eq!(s, ReservoirStatus::RESERVOIR_ERR_IO, "{msg}");
    assert!(msg.contains(&fifo.display().to_string()), "{msg}");
    let m = std::fs::symlink_metadata(&fifo).expect("the FIFO survives a failed write");
    assert!(m.file_type().is_fifo(), "{:?}", m.file_type());
    assert_eq!(names(&dir), ["pipe"]);
    assert_eq!(
        reservoir_allocator_destroy(h),
        ReservoirStatus::RESERVOIR_OK
    );
}

#[test]
fn a_full_device_node_is_not_removed() {
    let dir = scratch("full");
    let node = dir.join("full");
    let c = CString::new(node.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; 1:7 is the kernel's `full` device.
    let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 7)) };
    if made != 0 || std::fs::OpenOptions::new().write(true).open(&node).is_err() {
        println!(
            "note: no /dev/full-like node here ({}): the device case is covered by the FIFO test",
            std::io::Error::last_os_error()
        );
        return;
    }
    let h = allocator_with_history();
    let (s, msg) = snapshot(h, &node);
    assert_eq!(s, ReservoirStatus::RESERVOIR_ERR_IO, "{msg}");
    assert!(msg.contains(&node.display().to_string()), "{msg}");
    let m = std::fs::symlink_metadata(&node).expect("the device node survives");
    assert!(m.file_type().is_char_device(), "{:?}", m.file_type());
    // And through a symbolic link to it.
    let link = dir.join("link");
    std::os::unix::fs::symlink("full", &link).unwrap();
    let (s, msg) = snapshot(h, &link);
    assert_eq!(s, ReservoirStatus::RESERVOIR_ERR_IO, "{msg}");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(std::fs::symlink_metadata(&node)
        .unwrap()
        .file_type()
        .is_char_device());
    assert_eq!(names(&dir), ["full", "link"]);
    assert_eq!(
        reservoir_allocator_destroy(h),
        ReservoirStatus::RESERVOIR_OK
    );
}

/// Run only in the child of
/// [`a_failed_write_keeps_the_previous_snapshot_and_its_link`], under a
/// file-size limit: both snapshots fail with `EFBIG`.
#[test]
fn child_snapshots_under_a_file_size_limit() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let h = allocator_with_history();
    for name in ["link", "snap.pickle", "new.pickle"] {
        let (s, msg) = snapshot(h, &dir.join(name));
        assert_eq!(s, ReservoirStatus::RESERVOIR_ERR_IO, "{name}: {msg}");
        println!("child {name}: {msg}");
    }
    assert_eq!(
        reservoir_allocator_destroy(h),
        ReservoirStatus::RESERVOIR_OK
    );
}

#[test]
fn a_failed_write_keeps_the_previous_snapshot_and_its_link() {
    let dir = scratch("fsize");
    let old = dir.join("snap.pickle");
    std::fs::write(&old, b"the previous snapshot").unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::symlink("snap.pickle", dir.join("link")).unwrap();
    // SIGXFSZ ignored (inherited through exec), files capped at 16 blocks.
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"trap '' XFSZ; ulimit -f 16 && exec "$0" "$@""#)
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_snapshots_under_a_file_size_limit",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, &dir)
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child: {}\n{stdout}\n{stderr}",
        out.status
    );
    println!("{stdout}");
    assert!(stdout.contains("child link: "), "{stdout}");
    assert_eq!(
        std::fs::read(&old).expect("the previous snapshot survives"),
        b"the previous snapshot"
    );
    assert_eq!(
        std::fs::metadata(&old).unwrap().permissions().mode() & 0o777,
        0o640
    );
    let link = std::fs::symlink_metadata(dir.join("link")).expect("the link survives");
    assert!(link.file_type().is_symlink());
    assert_eq!(
        std::fs::read_link(dir.join("link")).unwrap(),
        Path::new("snap.pickle")
    );
    // No temporary file and no half-written new file are left.
    assert_eq!(names(&dir), ["link", "snap.pickle"]);
}

#[test]
fn enotdir_and_eisdir_touch_nothing() {
    let dir = scratch("notdir");
    let file = dir.join("file");
    std::fs::write(&file, b"keep").unwrap();
    let h = allocator_with_history();
    let (s, msg) = snapshot(h, &file.join("snap.pickle"));
    assert_eq!(s, ReservoirStatus::RESERVOIR_ERR_IO, "{msg}");
    assert!(msg.contains("file/snap.pickle"), "{msg}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let (s, msg) = snapshot(h, &sub);
    assert_eq!(s, ReservoirStatus::RESERVOIR_ERR_IO, "{msg}");
    assert!(msg.contains("directory"), "{msg}");
    assert!(sub.is_dir());
    assert_eq!(names(&dir), ["file", "sub"]);
    assert_eq!(
        reservoir_allocator_destroy(h),
        ReservoirStatus::RESERVOIR_OK
    );
}

#[test]
fn a_successful_write_replaces_the_target_and_keeps_the_link() {
    let dir = scratch("ok");
    let old = dir.join("snap.pickle");
    std::fs::write(&old, b"old").unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o604)).unwrap();
    std::os::unix::fs::symlink("snap.pickle", dir.join("link")).unwrap();
    let h = allocator_with_history();
    let (s, msg) = snapshot(h, &dir.join("link"));
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{msg}");
    let bytes = std::fs::read(&old).unwrap();
    assert_eq!(&bytes[..2], b"\x80\x04", "a protocol-4 pickle");
    assert!(bytes.len() > 1 << 20, "{} bytes", bytes.len());
    assert_eq!(
        std::fs::metadata(&old).unwrap().permissions().mode() & 0o777,
        0o604
    );
    assert!(std::fs::symlink_metadata(dir.join("link"))
        .unwrap()
        .file_type()
        .is_symlink());
    // A new file; and a FIFO with a reader gets the whole pickle.
    let (s, msg) = snapshot(h, &dir.join("new.pickle"));
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{msg}");
    let new = std::fs::read(dir.join("new.pickle")).unwrap();
    assert!(
        new.starts_with(b"\x80\x04") && new.len() > 1 << 20,
        "{} bytes",
        new.len()
    );
    let fifo = dir.join("pipe");
    mkfifo(&fifo);
    let path = fifo.clone();
    let reader = std::thread::spawn(move || std::fs::read(path).unwrap());
    let (s, msg) = snapshot(h, &fifo);
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{msg}");
    let piped = reader.join().unwrap();
    assert!(
        piped.starts_with(b"\x80\x04") && piped.ends_with(b".") && piped.len() > 1 << 20,
        "{} bytes",
        piped.len()
    );
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(names(&dir), ["link", "new.pickle", "pipe", "snap.pickle"]);
    assert_eq!(
        reservoir_allocator_destroy(h),
        ReservoirStatus::RESERVOIR_OK
    );
}
