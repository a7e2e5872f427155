//! Which allocator recorded a snapshot ([`detect`]): PyTorch's CUDA caching
//! allocator, or another PyTorch device backend that writes the same pickle
//! format with an allocator of its own, so that a PyTorch-CUDA-exact replay
//! is not expected to match it.
//!
//! Known other recorders:
//!
//! | recorder | how it differs | how it is recognised |
//! |---|---|---|
//! | `torch_npu` (Ascend NPU) | a port of the CUDA allocator that pads every request by 32 bytes before rounding it (a 40 MiB request makes a 42 MiB segment) | a frame of the `torch_npu` package, or the blocks of the dump-time small-pool segments: each allocated block whose rounding differs with and without 32 bytes of padding has the padded size, and at least [`MIN_PADDED_BLOCKS`] do |
//!
//! The snapshot format has no field naming the device type or the
//! allocator, so the padding is read off the blocks: in PyTorch's small
//! pool an allocated block is exactly its request rounded up to 512 bytes
//! (the remainder is split off whenever it is at least 512 bytes, spec
//! 1.3-1.4), so a block of `round(requested + 32)` where that is 512 bytes
//! more than `round(requested)` cannot come from PyTorch's allocator. Large
//! blocks are not used (a large-pool block keeps a remainder of up to
//! 1 MiB), nor are snapshots whose recorded settings round with
//! `roundup_power2_divisions`.
//!
//! Replayed with the padding modelled ([`pad_requests`]: every allocation of
//! the trace asks for 32 more bytes), both `torch_npu` files of
//! `../shared/traces-foreign` reproduce their segment events exactly (and
//! the one without expandable segments every block placement too).

use crate::input::LoadedInput;
use crate::oracle_trace::Op;
use crate::replay::recorded::{overlay_config, RecordedTrace};
use reservoir::observe::snapshot::{BlockState, SegmentType, Snapshot};
use reservoir::observe::trace::{Frame, TraceAction};

/// Bytes `torch_npu`'s NPU caching allocator adds to every request.
pub const NPU_REQUEST_PADDING: u64 = 32;

/// Padded small blocks needed (with no unpadded one) to call a snapshot a
/// `torch_npu` recording when no frame names `torch_npu`.
pub const MIN_PADDED_BLOCKS: u64 = 4;

/// The allocator that recorded a snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum Recorder {
    /// PyTorch's CUDA caching allocator (or nothing shows otherwise).
    #[default]
    #[serde(rename = "pytorch-cuda")]
    PytorchCuda,
    /// `torch_npu`'s NPU caching allocator (Ascend): pads every request by
    /// [`NPU_REQUEST_PADDING`] bytes.
    #[serde(rename = "torch_npu")]
    TorchNpu,
}

impl Recorder {
    /// The stable name (JSON `recorded_by`): `pytorch-cuda` or `torch_npu`.
    pub fn key(self) -> &'static str {
        match self {
            Recorder::PytorchCuda => "pytorch-cuda",
            Recorder::TorchNpu => "torch_npu",
        }
    }

    /// Bytes the recorder adds to every request before rounding it.
    pub fn request_padding(self) -> u64 {
        match self {
            Recorder::PytorchCuda => 0,
            Recorder::TorchNpu => NPU_REQUEST_PADDING,
        }
    }

    /// True for any recorder but PyTorch's CUDA caching allocator.
    pub fn is_foreign(self) -> bool {
        self != Recorder::PytorchCuda
    }

    /// The recorder's name in words.
    pub fn name(self) -> &'static str {
        match self {
            Recorder::PytorchCuda => "PyTorch's CUDA caching allocator",
            Recorder::TorchNpu => "torch_npu's NPU caching allocator (Ascend)",
        }
    }

    /// The recorder and what it means for a replay, in words.
    pub fn describe(self) -> &'static str {
        match self {
            Recorder::PytorchCuda => "recorded by PyTorch's CUDA caching allocator",
            Recorder::TorchNpu => {
                "recorded by torch_npu's NPU caching allocator (Ascend), which pads each request \
                 by 32 bytes: a PyTorch-CUDA-exact replay is not expected to match"
            }
        }
    }
}

/// What [`detect`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Detection {
    /// The recorder.
    pub recorder: Recorder,
    /// Allocated small-pool blocks of the dump-time segments whose size is
    /// their request rounded with the padding (and not without it).
    pub padded_blocks: u64,
    /// Those whose size is their request rounded without the padding (and
    /// not with it).
    pub unpadded_blocks: u64,
    /// Frames (of trace entries and blocks) in the `torch_npu` package.
    pub npu_frames: u64,
    /// The evidence, in words (empty for PyTorch's CUDA allocator).
    pub how: String,
}

/// PyTorch's small-pool rounding (spec 1.3): at least 512, a multiple of 512.
fn round512(n: u64) -> u64 {
    n.max(1).div_ceil(512) * 512
}

fn is_npu_frame(f: &Frame) -> bool {
    f.filename.contains("torch_npu") || f.name.contains("torch_npu")
}

/// Which allocator recorded `snap` (see the module documentation).
pub fn detect_snapshot(snap: &Snapshot) -> Detection {
    let mut d = Detection::default();
    let rounds_by_divisions = snap
        .allocator_settings
        .as_ref()
        .and_then(|s| s.roundup_power2_divisions.as_ref())
        .is_some_and(|divs| divs.iter().any(|(_, d)| *d > 1));
    let frames = snap
        .device_traces
        .iter()
        .flatten()
        .flat_map(|e| e.frames.iter())
        .chain(
            snap.segments
                .iter()
                .flat_map(|s| &s.blocks)
                .filter_map(|b| b.frames.as_deref())
                .flatten(),
        );
    d.npu_frames = frames.filter(|f| is_npu_frame(f)).count() as u64;
    if !rounds_by_divisions {
        for seg in snap
            .segments
            .iter()
            .filter(|s| s.segment_type == SegmentType::Small)
        {
            for b in seg
                .blocks
                .iter()
                .filter(|b| b.state == BlockState::ActiveAllocated)
            {
                let Some(q) = b.requested_size else { continue };
                let (plain, padded) = (round512(q), round512(q + NPU_REQUEST_PADDING));
                if plain == padded {
                    continue;
                }
                if b.size == padded {
                    d.padded_blocks += 1;
                } else if b.size == plain {
                    d.unpadded_blocks += 1;
                }
            }
        }
    }
    if d.npu_frames > 0 {
        d.recorder = Recorder::TorchNpu;
        d.how = format!("{} frames of the torch_npu package", d.npu_frames);
    } else if d.padded_blocks >= MIN_PADDED_BLOCKS && d.unpadded_blocks == 0 {
        d.recorder = Recorder::TorchNpu;
        d.how = format!(
            "{} small blocks of the dump-time segments sized as their request plus 32 bytes, \
             rounded (PyTorch's CUDA allocator rounds the request alone: no block is sized so)",
            d.padded_blocks
        );
    }
    d
}

/// Which allocator recorded `loaded` (PyTorch's CUDA one for inputs that
/// are not snapshots).
pub fn detect(loaded: &LoadedInput) -> Detection {
    loaded.snapshot().map(detect_snapshot).unwrap_or_default()
}

impl Detection {
    /// The settings string to replay device `device` of a recording with
    /// in PyTorch mode: `config` (the recorded settings), with
    /// `expandable_segments:True` added for a foreign recorder whose
    /// snapshot records no settings but shows expandable segments on that
    /// device (`is_expandable` segments or `segment_map` entries of its
    /// trace). Each device is judged by its own segments: a device that
    /// mapped nothing keeps `config`.
    pub fn recorded_config(&self, loaded: &LoadedInput, config: &str, device: u32) -> String {
        let Some(snap) = loaded.snapshot() else {
            return config.to_string();
        };
        let expandable = snap
            .segments_of(device)
            .any(|s| s.is_expandable == Some(true))
            || snap
                .device_traces
                .get(device as usize)
                .into_iter()
                .flatten()
                .any(|e| e.action == TraceAction::SegmentMap);
        if self.recorder.is_foreign() && snap.allocator_settings.is_none() && expandable {
            overlay_config(config, "expandable_segments:True")
        } else {
            config.to_string()
        }
    }

    /// The recorded trace with the recorder's padding modelled
    /// ([`pad_requests`]); unchanged for PyTorch's CUDA allocator.
    pub fn model(&self, rec: &mut RecordedTrace) {
        pad_requests(rec, self.recorder.request_padding());
    }

    /// The line that says who recorded the input and what the replay
    /// models; `None` for PyTorch's CUDA allocator.
    pub fn note(&self) -> Option<String> {
        self.recorder.is_foreign().then(|| {
            format!(
                "{}; PyTorch mode models the padding (each request replayed {} bytes larger). \
                 Recognised by {}.",
                self.recorder.describe(),
                self.recorder.request_padding(),
                self.how
            )
        })
    }
}

/// Add `pad` bytes to every allocation op of `rec` (a recorder that pads
/// its requests before rounding them, as `torch_npu` does).
pub fn pad_requests(rec: &mut RecordedTrace, pad: u64) {
    if pad == 0 {
        return;
    }
    for op in &mut rec.trace.ops {
        if let Op::Alloc { bytes, .. } = op {
            *bytes = bytes.saturating_add(pad);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reservoir::observe::snapshot::{Block, Segment};

    fn small_segment(blocks: &[(u64, u64)]) -> Segment {
        Segment {
            segment_type: SegmentType::Small,
            total_size: 2 << 20,
            blocks: blocks
                .iter()
                .map(|&(size, requested)| Block {
                    size,
                    requested_size: Some(requested),
                    state: BlockState::ActiveAllocated,
                    ..Block::default()
                })
                .collect(),
            ..Segment::default()
        }
    }

    #[test]
    fn padded_small_blocks_name_torch_npu_and_unpadded_ones_pytorch() {
        // 1024 requested: PyTorch keeps 1024, torch_npu rounds 1056 to 1536.
        let npu = Snapshot {
            segments: vec![small_segment(&[(1536, 1024); 4])],
            ..Snapshot::default()
        };
        let d = detect_snapshot(&npu);
        assert_eq!(d.recorder, Recorder::TorchNpu);
        assert_eq!((d.padded_blocks, d.unpadded_blocks), (4, 0));
        // One block PyTorch's way is enough to say it is not padded.
        let mixed = Snapshot {
            segments: vec![small_segment(&[
                (1536, 1024),
                (1536, 1024),
                (1536, 1024),
                (1536, 1024),
                (1024, 1024),
            ])],
            ..Snapshot::default()
        };
        assert_eq!(detect_snapshot(&mixed).recorder, Recorder::PytorchCuda);
        // Too few padded blocks to tell.
        let few = Snapshot {
            segments: vec![small_segment(&[(1536, 1024); 3])],
            ..Snapshot::default()
        };
        assert_eq!(detect_snapshot(&few).recorder, Recorder::PytorchCuda);
        // Sizes whose rounding the padding does not change say nothing.
        let neutral = Snapshot {
            segments: vec![small_segment(&[(1024, 700); 8])],
            ..Snapshot::default()
        };
        let d = detect_snapshot(&neutral);
        assert_eq!(
            (d.recorder, d.padded_blocks, d.unpadded_blocks),
            (Recorder::PytorchCuda, 0, 0)
        );
    }

    #[test]
    fn a_torch_npu_frame_is_enough() {
        let mut seg = small_segment(&[(512, 100)]);
        seg.blocks[0].frames = Some(
            vec![Frame {
                name: "malloc".into(),
                filename: "/site-packages/torch_npu/npu/memory.py".into(),
                line: 1,
            }]
            .into(),
        );
        let snap = Snapshot {
            segments: vec![seg],
            ..Snapshot::default()
        };
        let d = detect_snapshot(&snap);
        assert_eq!((d.recorder, d.npu_frames), (Recorder::TorchNpu, 1));
        assert!(d.note().unwrap().contains("pads each request by 32 bytes"));
    }
}
