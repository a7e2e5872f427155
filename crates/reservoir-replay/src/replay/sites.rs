//! Where allocations come from: the innermost *user* frame of each recorded
//! allocation's stack ([`Sites`]), to group live memory by the code that
//! asked for it.
//!
//! A frame is PyTorch's own (not a user frame) when it is native code
//! (`.c`, `.cpp`, `.h`, `.cu`, `??`, `<unknown>`, a `c10::` / `at::` / `torch::`
//! function), Python's (`<frozen ...>`, `<string>`), or a file of the
//! `torch` package (`/torch/` in its path). A site is written
//! `FILE:LINE:FUNCTION` with the file's name only (no directory: reports
//! carry no path of the machine that recorded them).

use rustc_hash::FxHashMap;

pub use super::frames::is_internal;
use super::frames::{hint_of, Hint};
use crate::oracle_trace::AllocId;
use reservoir::observe::trace::Frame;

/// Site of an allocation whose entry kept no stack.
pub const NO_STACK: &str = "(no stack recorded)";
/// Site of an allocation whose stack has PyTorch's frames only.
pub const NO_USER_FRAME: &str = "(no user frame)";
/// Site of a block already allocated when the trace began.
pub const BEFORE_TRACE: &str = "(allocated before the trace)";

/// Sites listed per moment, at most.
pub const TOP_SITES: usize = 10;

/// Live allocations of one site.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SiteUsage {
    /// `FILE:LINE:FUNCTION` (a recorded trace), what the allocation is for
    /// (a built-in workload: "parameters", "KV cache", ...), or a
    /// placeholder in parentheses.
    pub site: String,
    /// Bytes of their blocks.
    pub bytes: u64,
    /// Allocations.
    pub count: u64,
}

/// The site of a stack (innermost frame first): its innermost user frame.
pub fn site_of(frames: &[Frame]) -> String {
    if frames.is_empty() {
        return NO_STACK.to_string();
    }
    match frames.iter().find(|f| !is_internal(f)) {
        Some(f) => {
            let file = f.filename.rsplit(['/', '\\']).next().unwrap_or("");
            format!("{file}:{}:{}", f.line, f.name)
        }
        None => NO_USER_FRAME.to_string(),
    }
}

/// The call path of a stack (innermost frame first) without line numbers:
/// its user frames as `FILE:FUNCTION`, innermost first, joined by ` < `
/// (empty when it has none). Two runs of one program whose code moved by a
/// few lines give an allocation the same call path but another site.
pub fn call_path_of(frames: &[Frame]) -> String {
    frames
        .iter()
        .filter(|f| !is_internal(f))
        .map(|f| {
            let file = f.filename.rsplit(['/', '\\']).next().unwrap_or("");
            format!("{file}:{}", f.name)
        })
        .collect::<Vec<_>>()
        .join(" < ")
}

/// The site of each allocation of a recorded trace, interned, with the call
/// path of the first stack recorded for each site.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sites {
    names: Vec<String>,
    /// The call path ([`call_path_of`]) of each name (empty when named
    /// without a stack).
    paths: Vec<String>,
    index: FxHashMap<String, u32>,
    of: FxHashMap<AllocId, u32>,
    /// What the frames of each allocation say about its role
    /// ([`roles`](super::roles)); absent when they say nothing.
    hints: FxHashMap<AllocId, Hint>,
}

impl Sites {
    /// No site known.
    pub fn new() -> Self {
        Sites::default()
    }

    /// Note the stack of allocation `id`.
    pub fn record(&mut self, id: AllocId, frames: &[Frame]) {
        let site = site_of(frames);
        self.set_hint(id, hint_of(frames));
        let fresh = !self.index.contains_key(&site);
        self.name(id, &site);
        if fresh {
            if let Some(p) = self.paths.last_mut() {
                *p = call_path_of(frames);
            }
        }
    }

    /// The call path recorded for `site` ([`call_path_of`]); empty when the
    /// site was named without a stack or is unknown.
    pub fn call_path(&self, site: &str) -> &str {
        self.index
            .get(site)
            .map_or("", |&k| self.paths[k as usize].as_str())
    }

    /// Note that allocation `id` comes from `site` (a source that names
    /// its sites without stacks, such as a built-in workload).
    pub fn name(&mut self, id: AllocId, site: &str) {
        let k = match self.index.get(site) {
            Some(&k) => k,
            None => {
                let k = self.names.len() as u32;
                self.names.push(site.to_string());
                self.paths.push(String::new());
                self.index.insert(site.to_string(), k);
                k
            }
        };
        self.of.insert(id, k);
    }

    /// Note what the frames of allocation `id` say about its role (a
    /// recorded stack's [`hint_of`], or a built-in workload's stand-in).
    pub fn set_hint(&mut self, id: AllocId, hint: Hint) {
        if hint == Hint::default() {
            self.hints.remove(&id);
        } else {
            self.hints.insert(id, hint);
        }
    }

    /// What the frames of `id` say about its role (nothing when no stack
    /// was recorded).
    pub fn hint(&self, id: AllocId) -> Hint {
        self.hints.get(&id).copied().unwrap_or_default()
    }

    /// The site of `id`: [`BEFORE_TRACE`] when none was recorded (a block of
    /// the start state), [`NO_STACK`] for a source without stacks.
    pub fn site(&self, id: AllocId) -> &str {
        match self.of.get(&id) {
            Some(&k) => &self.names[k as usize],
            None if self.of.is_empty() => NO_STACK,
            None => BEFORE_TRACE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(file: &str, line: i64, name: &str) -> Frame {
        Frame {
            name: name.into(),
            filename: file.into(),
            line,
        }
    }

    #[test]
    fn the_innermost_user_frame_with_the_file_name_only() {
        let stack = [
            frame("??", 0, "c10::cuda::CUDACachingAllocator::malloc"),
            frame(
                "/usr/lib/python3/site-packages/torch/nn/functional.py",
                10,
                "linear",
            ),
            frame("<frozen runpy>", 1, "_run"),
            frame("/home/me/project/model.py", 42, "forward"),
            frame("/home/me/project/train.py", 7, "main"),
        ];
        assert_eq!(site_of(&stack), "model.py:42:forward");
        assert_eq!(site_of(&stack[..3]), NO_USER_FRAME);
        assert_eq!(site_of(&[]), NO_STACK);
        let mut s = Sites::new();
        assert_eq!(s.site(1), NO_STACK);
        s.record(5, &stack);
        s.record(6, &stack[3..]);
        assert_eq!(s.site(5), "model.py:42:forward");
        assert_eq!(s.site(6), "model.py:42:forward");
        assert_eq!(s.names.len(), 1);
        assert_eq!(s.site(1), BEFORE_TRACE);
        // The call path: user frames' files and functions, no lines.
        assert_eq!(call_path_of(&stack), "model.py:forward < train.py:main");
        assert_eq!(
            s.call_path("model.py:42:forward"),
            "model.py:forward < train.py:main"
        );
        s.name(7, "KV cache");
        assert_eq!(s.call_path("KV cache"), "");
        assert_eq!(s.call_path("unknown.py:1:f"), "");
    }
}
