//! Many inputs at once: `reservoir compare`, `replay --min-capacity` and
//! `reservoir replay A B C...` spread their independent replays over every
//! core with [rayon] (work stealing), and put the results back in input
//! order, so the output is byte for byte the one-thread run's (save the
//! host-timed allocator nanoseconds, which differ between any two runs).
//! `--jobs N` caps the threads (default: every core, or
//! `RAYON_NUM_THREADS`).

use std::io::IsTerminal;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Run `f` on a pool of `jobs` threads (`None`: rayon's global pool, one
/// thread per core unless `RAYON_NUM_THREADS` says otherwise).
pub(crate) fn with_jobs<R: Send>(jobs: Option<usize>, f: impl FnOnce() -> R + Send) -> Result<R> {
    match jobs {
        None => Ok(f()),
        Some(n) => {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .with_context(|| format!("cannot start {n} worker threads (--jobs {n})"))?;
            Ok(pool.install(f))
        }
    }
}

/// A progress bar drawn on standard error when it is a terminal, and
/// hidden when it is piped or redirected. `template` is indicatif's.
pub(crate) fn progress_bar(len: u64, template: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(
        Some(len),
        if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    bar.set_style(
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar
}

/// `--jobs N`: a number of threads, at least 1.
pub(crate) fn parse_jobs(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=4096).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a number of threads from 1 to 4096 (leave --jobs out to use every core)"
        )),
    }
}
