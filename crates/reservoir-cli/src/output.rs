//! Where a command's output goes: standard output and the `--html` file, or,
//! inside [`run_captured`](crate::run_captured) (the Python API), memory.

use std::cell::RefCell;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

/// What a command run inside [`run_captured`](crate::run_captured) wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// Its standard output, byte for byte.
    pub stdout: Vec<u8>,
    /// The HTML page it was asked to write (`--html FILE`: the file is not
    /// written), if any.
    pub html: Option<String>,
}

thread_local! {
    /// The output of the command running on this thread inside [`capture`].
    static CAPTURE: RefCell<Option<Captured>> = const { RefCell::new(None) };
}

/// Run `f` with its standard output and HTML page kept in memory (see
/// [`with_stdout`], [`write_html`]), and return them.
pub(crate) fn capture(f: impl FnOnce() -> Result<()>) -> Result<Captured> {
    let outer = CAPTURE.with(|c| c.replace(Some(Captured::default())));
    let result = f();
    let captured = CAPTURE.with(|c| c.replace(outer)).unwrap_or_default();
    result.map(|()| captured)
}

/// Call `f` with standard output, or the capture buffer inside [`capture`].
pub(crate) fn with_stdout<R>(f: impl FnOnce(&mut dyn Write) -> Result<R>) -> Result<R> {
    let mut buf = match CAPTURE.with(|c| {
        c.borrow_mut()
            .as_mut()
            .map(|c| std::mem::take(&mut c.stdout))
    }) {
        Some(buf) => buf,
        None => {
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            let r = f(&mut out)?;
            out.flush()?;
            return Ok(r);
        }
    };
    let r = f(&mut buf);
    CAPTURE.with(|c| {
        if let Some(c) = c.borrow_mut().as_mut() {
            c.stdout = buf;
        }
    });
    r
}

/// Write the HTML page `page` to `path`, or keep it inside [`capture`].
pub(crate) fn write_html(path: &Path, page: String) -> Result<()> {
    let page = CAPTURE.with(|c| match c.borrow_mut().as_mut() {
        Some(c) => {
            c.html = Some(page);
            None
        }
        None => Some(page),
    });
    if let Some(page) = page {
        reservoir::outfile::write_file(path, |w| w.write_all(page.as_bytes()))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Whether `e` is standard output closed by its reader (a broken pipe).
pub(crate) fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        let kind = c
            .downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
            .or_else(|| c.downcast_ref::<serde_json::Error>()?.io_error_kind());
        kind == Some(std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_stdout_and_html_and_restores_the_outer_state() {
        let got = capture(|| {
            with_stdout(|out| Ok(out.write_all(b"one ")?))?;
            with_stdout(|out| Ok(out.write_all(b"two")?))?;
            write_html(Path::new("/nonexistent/dir/report.html"), "<p>".into())
        })
        .unwrap();
        assert_eq!(got.stdout, b"one two");
        assert_eq!(got.html.as_deref(), Some("<p>"));
        assert!(CAPTURE.with(|c| c.borrow().is_none()));
        let err = capture(|| anyhow::bail!("bad")).unwrap_err();
        assert_eq!(err.to_string(), "bad");
        assert!(CAPTURE.with(|c| c.borrow().is_none()));
    }

    #[test]
    fn broken_pipe_is_recognised_through_context() {
        let e = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("writing JSON");
        assert!(is_broken_pipe(&e));
        assert!(!is_broken_pipe(&anyhow::anyhow!("other")));
    }
}
