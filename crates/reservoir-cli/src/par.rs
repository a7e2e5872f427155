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

/// The most worker threads `--jobs` (or `RAYON_NUM_THREADS`) may ask for:
/// 256, or the number of cores where there are more. Threads past the
/// cores only wait, and cost time that grows with the square of their
/// number (1,024 threads took 10 s, 4,096 over a minute, for a run of
/// 0.26 s). See docs/limits.md.
pub(crate) fn max_jobs() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    cores.max(MIN_MAX_JOBS)
}

/// The floor of [`max_jobs`].
const MIN_MAX_JOBS: usize = 256;

/// Run `f` on a pool of `jobs` threads (`None`: rayon's global pool, one
/// thread per core unless `RAYON_NUM_THREADS` says otherwise, within
/// [`max_jobs`]).
pub(crate) fn with_jobs<R: Send>(jobs: Option<usize>, f: impl FnOnce() -> R + Send) -> Result<R> {
    let jobs = match jobs {
        Some(n) => Some(n),
        None => rayon_num_threads()?,
    };
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

/// `RAYON_NUM_THREADS`, when it asks for more threads than [`max_jobs`]:
/// refused, as `--jobs` would be. `None` leaves rayon to read it.
fn rayon_num_threads() -> Result<Option<usize>> {
    let Some(v) = std::env::var_os("RAYON_NUM_THREADS") else {
        return Ok(None);
    };
    match v.to_str().and_then(|s| s.trim().parse::<usize>().ok()) {
        Some(n) if n > max_jobs() => anyhow::bail!(
            "RAYON_NUM_THREADS={n}: more than {} worker threads ({}); unset it to use \
             every core",
            max_jobs(),
            JOBS_LIMIT_WHY
        ),
        _ => Ok(None),
    }
}

/// Why [`max_jobs`] exists, for its errors.
const JOBS_LIMIT_WHY: &str = "256, or the number of cores where there are more: threads \
     past the cores only wait, at a cost that grows with the square of their number";

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

/// `--jobs N`: a number of threads, from 1 to [`max_jobs`].
pub(crate) fn parse_jobs(s: &str) -> Result<usize, String> {
    let max = max_jobs();
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        Ok(n) if n > max => Err(format!(
            "{n} threads is more than the limit of {max} ({JOBS_LIMIT_WHY}); use --jobs {max} \
             or less, or leave --jobs out to use every core"
        )),
        _ => Err(format!(
            "{} is not a number of threads from 1 to {max} (leave --jobs out to use every core)",
            crate::quoted(s)
        )),
    }
}
