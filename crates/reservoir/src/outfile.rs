//! Writing a file the user named, without ever losing or deleting what was
//! there before: the one rule every output of the workspace follows (the C
//! API's `reservoir_allocator_snapshot`, the CLI's `--out`, `--json FILE`,
//! `--html FILE` and `--oracle-trace`, the Python package's snapshot dumps).
//!
//! [`write_file`] resolves `path` through its symbolic links, then:
//!
//! * a **regular file, or nothing yet**: the bytes go to a new temporary
//!   file in the same folder (`tempfile::NamedTempFile::new_in`), which is
//!   flushed, synced and renamed over the target only when everything was
//!   written. On any failure only the temporary file is removed: an
//!   existing file keeps its old contents, a symbolic link stays a link to
//!   it, and a half-written file never appears. A replaced file keeps its
//!   permission bits (not its owner); a new one gets `0o666` less the
//!   umask, as `File::create` gives.
//! * **anything else that exists** (a character device such as
//!   `/dev/stdout` or `/dev/null`, a FIFO, a socket): the bytes are written
//!   straight to it, as a shell's `>` would, and it is never removed or
//!   replaced, whatever fails. A directory is refused (`InvalidInput`, "PATH is a directory").
//!
//! Each error names the path and what failed.

use std::fs::OpenOptions;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// The most symbolic links followed from the named path (Linux's own limit
/// is 40); more is `ELOOP`-like `InvalidInput`.
const MAX_LINKS: usize = 40;

/// The buffer between the writer and the file.
const BUFFER: usize = 1 << 16;

/// `path` with its symbolic links followed, link by link, to the first
/// component that is not a link (which may not exist yet: a dangling link
/// names the file to create).
fn resolve(path: &Path) -> io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&p)?;
                p = match p.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
            }
            _ => return Ok(p),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{}: more than {MAX_LINKS} symbolic links to follow",
            path.display()
        ),
    ))
}

/// `e` with `what` in front of its text, its kind kept.
fn context(e: io::Error, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Write the file `path` with `write`, which gets a buffered writer; see the
/// [module](self) for what happens to what `path` names. Returns what
/// `write` returned. On failure nothing at `path` has changed, except
/// bytes already written to a device or FIFO.
pub fn write_file<T>(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<T>,
) -> io::Result<T> {
    let shown = path.display();
    let target = resolve(path).map_err(|e| context(e, format_args!("resolving {shown}")))?;
    let existing = match std::fs::metadata(&target) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(context(e, format_args!("reading {shown}"))),
    };
    if let Some(m) = &existing {
        if m.is_dir() {
            // (`ErrorKind::IsADirectory` is newer than the MSRV.)
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{shown} is a directory"),
            ));
        }
        if !m.is_file() {
            // A device, FIFO or socket: write through, never replace.
            let f = OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&target)
                .map_err(|e| context(e, format_args!("opening {shown}")))?;
            let mut w = BufWriter::with_capacity(BUFFER, f);
            let out = write(&mut w).map_err(|e| context(e, format_args!("writing {shown}")))?;
            w.flush()
                .map_err(|e| context(e, format_args!("writing {shown}")))?;
            return Ok(out);
        }
    }
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    builder.prefix(".reservoir-").suffix(".tmp");
    #[cfg(unix)]
    {
        // Made with 0o666, which the kernel masks with the umask, as
        // `File::create` does (tempfile's own default is 0o600).
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut tmp = builder.tempfile_in(dir).map_err(|e| {
        context(
            e,
            format_args!("creating a temporary file in {} for {shown}", dir.display()),
        )
    })?;
    if let Some(m) = &existing {
        // A replaced file keeps its permission bits.
        tmp.as_file()
            .set_permissions(m.permissions())
            .map_err(|e| context(e, format_args!("setting the permissions of {shown}")))?;
    }
    let out = {
        let mut w = BufWriter::with_capacity(BUFFER, tmp.as_file_mut());
        let out = write(&mut w).map_err(|e| context(e, format_args!("writing {shown}")))?;
        w.flush()
            .map_err(|e| context(e, format_args!("writing {shown}")))?;
        out
    };
    tmp.as_file()
        .sync_all()
        .map_err(|e| context(e, format_args!("writing {shown}")))?;
    // On failure the error holds the temporary file, removed when dropped.
    tmp.persist(&target)
        .map_err(|e| context(e.error, format_args!("renaming the new file onto {shown}")))?;
    Ok(out)
}
