//! Sharing plain allocations with other processes (spec 1.16 on the host).
//!
//! With [`HostConfig::shareable`](crate::HostConfig::shareable) on, every
//! plain allocation is backed by its own memfd named
//! `reservoir-ipc-<pid>-<serial>` and mapped `MAP_SHARED`. A
//! [`HostIpcHandle`] names the exporting process, the descriptor and the
//! serial; another process of the same user opens
//! `/proc/<pid>/fd/<fd>` (the way the oracle's fake CUDA driver shares
//! memory) and maps the same pages. Before mapping, the receiver checks
//! that the descriptor it opened is exactly that memfd (`readlink` of its
//! own descriptor), so a stale handle whose descriptor number was reused
//! for another file is refused instead of mapping the wrong memory.
//!
//! The handle is 32 bytes ([`HostIpcHandle::to_bytes`]) and travels by any
//! channel (a pipe, a socket, an environment variable in hex). The exporter
//! must keep the allocation alive while others use it; a receiver's mapping
//! stays valid even if the exporter frees it later (the pages live until
//! the last mapping goes).

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

use reservoir::backend::BackendError;

/// Length of a serialized [`HostIpcHandle`].
pub const HANDLE_LEN: usize = 32;
const MAGIC: [u8; 4] = *b"RSVH";
const VERSION: u8 = 1;

/// A host device allocation exported to other processes: the exporter's
/// process id, its memfd's descriptor number and serial, and the
/// allocation's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostIpcHandle {
    /// The exporting process.
    pub pid: u32,
    /// The memfd's descriptor number in the exporting process.
    pub fd: i32,
    /// The allocation's serial in the exporting device (part of the memfd's
    /// name, so a reused descriptor number is detected).
    pub serial: u64,
    /// The allocation's size in bytes.
    pub size: u64,
}

fn bad(msg: String) -> BackendError {
    BackendError::InvalidValue(msg)
}

impl HostIpcHandle {
    /// The handle as bytes: magic `RSVH`, version 1, three zero bytes, then
    /// pid (u32), fd (i32), serial (u64) and size (u64), little-endian.
    pub fn to_bytes(&self) -> [u8; HANDLE_LEN] {
        let mut b = [0u8; HANDLE_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[12..16].copy_from_slice(&self.fd.to_le_bytes());
        b[16..24].copy_from_slice(&self.serial.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        b
    }

    /// Parse [`to_bytes`](Self::to_bytes)'s output. Wrong length, magic or
    /// version, a negative descriptor or a zero size are
    /// [`BackendError::InvalidValue`] naming the bad field.
    pub fn from_bytes(b: &[u8]) -> Result<HostIpcHandle, BackendError> {
        if b.len() != HANDLE_LEN {
            return Err(bad(format!(
                "host IPC handle of {} bytes: a handle is {HANDLE_LEN} bytes",
                b.len()
            )));
        }
        if b[..4] != MAGIC {
            return Err(bad(format!(
                "host IPC handle starts with {:02x?}, not the magic \"RSVH\": not a host device handle",
                &b[..4]
            )));
        }
        if b[4] != VERSION {
            return Err(bad(format!(
                "host IPC handle version {}: this build reads version {VERSION}",
                b[4]
            )));
        }
        let word = |r: std::ops::Range<usize>| -> [u8; 8] {
            let mut w = [0u8; 8];
            w[..r.len()].copy_from_slice(&b[r]);
            w
        };
        let h = HostIpcHandle {
            pid: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            fd: i32::from_le_bytes(b[12..16].try_into().expect("4 bytes")),
            serial: u64::from_le_bytes(word(16..24)),
            size: u64::from_le_bytes(word(24..32)),
        };
        if h.fd < 0 || h.pid == 0 || h.size == 0 {
            return Err(bad(format!(
                "host IPC handle with pid {}, fd {}, size {}: pid and size must be positive, fd \
                 not negative",
                h.pid, h.fd, h.size
            )));
        }
        Ok(h)
    }
}

/// The memfd name of allocation `serial` of process `pid`.
pub(crate) fn memfd_name(pid: u32, serial: u64) -> CString {
    CString::new(format!("reservoir-ipc-{pid}-{serial}")).expect("no NUL in a formatted number")
}

/// What `readlink` shows for that memfd.
fn memfd_link(pid: u32, serial: u64) -> String {
    format!("/memfd:reservoir-ipc-{pid}-{serial} (deleted)")
}

/// Open the memfd a handle names, read-write, checking that it is that
/// memfd and long enough. Refuses handles exported by this process.
pub(crate) fn open_exported(h: &HostIpcHandle) -> Result<OwnedFd, BackendError> {
    if h.pid == std::process::id() {
        return Err(bad(format!(
            "host IPC handle exported by this process (pid {}): use the allocation's own \
             pointer; handles open in other processes only",
            h.pid
        )));
    }
    let path = PathBuf::from(format!("/proc/{}/fd/{}", h.pid, h.fd));
    let expected = memfd_link(h.pid, h.serial);
    let gone = |e: io::Error| {
        bad(format!(
            "host IPC handle: cannot open {}: {e} (the exporting process exited, freed the \
             allocation, or belongs to another user)",
            path.display()
        ))
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(gone)?;
    // Check the file we hold, not the path (which may change under us).
    let mine = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    let link = fs::read_link(&mine).map_err(gone)?;
    if link.as_os_str() != expected.as_str() {
        return Err(bad(format!(
            "host IPC handle: descriptor {} of process {} is {:?}, not the shared allocation {} \
             (a stale handle: the allocation was freed and the descriptor reused)",
            h.fd,
            h.pid,
            link.display(),
            expected
        )));
    }
    let len = file.metadata().map_err(gone)?.len();
    if len < h.size {
        return Err(bad(format!(
            "host IPC handle claims {} bytes but the shared allocation has {len}",
            h.size
        )));
    }
    Ok(OwnedFd::from(file))
}
