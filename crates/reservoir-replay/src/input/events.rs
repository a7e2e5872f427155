//! Replayable event sequences: from snapshots, and from the two non-pickle
//! trace formats found in the wild.

use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use super::decode::{as_dict, as_seq, as_str, as_u64, expected, missing, At, Fail, Warnings, R};
use reservoir::backend::StreamId;
use reservoir::observe::pickle::Value;
use reservoir::observe::snapshot::{AllocatorSettings, Segment, Snapshot};
use reservoir::observe::trace::{Frame, TraceAction, TraceEntry};

/// What the addresses of a [`TraceInput`] are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AddressKind {
    /// Device addresses recorded by the allocator.
    Device,
    /// Handles made up by the reader (the source recorded none): unique
    /// among live blocks, matching each free to its allocation, and
    /// nothing more.
    Synthetic,
}

/// An allocation sequence to replay: per device, the recorded events in
/// order, and what is known of the allocator state around them.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TraceInput {
    /// Whether `addr` fields are device addresses or synthetic handles.
    pub addresses: AddressKind,
    /// One entry per device that has events or segments, by device index.
    pub devices: Vec<DeviceEvents>,
    /// The allocator settings the trace was recorded with, when known.
    pub allocator_settings: Option<AllocatorSettings>,
}

/// The events of one device.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DeviceEvents {
    /// Device index.
    pub device: u32,
    /// The events, oldest first, with PyTorch's actions. Sources without
    /// segment events give `alloc`, then `free_requested` + `free_completed`
    /// for each free (what PyTorch records for a single-stream program).
    pub events: Vec<TraceEntry>,
    /// Blocks live before the first event, when the source says
    /// (`Some(vec![])` = the trace starts from an empty allocator). `None`
    /// for snapshots: traces usually start mid-run, and the start state has
    /// to be rebuilt from `final_segments` by walking the events backwards.
    pub initially_allocated: Option<Vec<LiveBlock>>,
    /// The segments at the end of the trace (snapshot time), when known.
    pub final_segments: Option<Vec<Segment>>,
}

/// A block known to be allocated.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LiveBlock {
    /// Address or handle (see [`AddressKind`]).
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// Stream.
    pub stream: StreamId,
    /// Allocation stack, if known.
    pub frames: Arc<[Frame]>,
}

/// The snapshot's traces as replay input: each device's
/// `device_traces` entries with its final segments. Devices are those of
/// [`Snapshot::devices`].
pub(super) fn trace_input(snap: &Snapshot) -> TraceInput {
    let devices = snap
        .devices()
        .into_iter()
        .map(|d| DeviceEvents {
            device: d,
            events: snap
                .device_traces
                .get(d as usize)
                .cloned()
                .unwrap_or_default(),
            initially_allocated: None,
            final_segments: Some(snap.segments_of(d).cloned().collect()),
        })
        .collect();
    TraceInput {
        addresses: AddressKind::Device,
        devices,
        allocator_settings: snap.allocator_settings.clone(),
    }
}

impl TraceInput {
    /// Number of events over all devices.
    pub fn num_events(&self) -> usize {
        self.devices.iter().map(|d| d.events.len()).sum()
    }
}

fn alloc_and_free(
    out: &mut Vec<TraceEntry>,
    action: TraceAction,
    addr: u64,
    size: u64,
    frames: &Arc<[Frame]>,
) {
    let mut push = |a: TraceAction| {
        let mut e = TraceEntry::new(a, addr, size, StreamId::DEFAULT);
        e.frames = frames.clone();
        out.push(e);
    };
    if action == TraceAction::Alloc {
        push(TraceAction::Alloc);
    } else {
        push(TraceAction::FreeRequested);
        push(TraceAction::FreeCompleted);
    }
}

/// Parse `filename:line:name` (the form `_memory_viz` interned stacks in);
/// the filename ends at the first `:<digits>:`.
fn parse_frame_string(s: &str) -> Option<Frame> {
    let b = s.as_bytes();
    let mut i = 0;
    while let Some(off) = b[i..].iter().position(|&c| c == b':') {
        let colon = i + off;
        let digits = b[colon + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        let end = colon + 1 + digits;
        if digits > 0 && b.get(end) == Some(&b':') {
            let line = s[colon + 1..end].parse().ok()?;
            return Some(Frame {
                name: s[end + 1..].to_string(),
                filename: s[..colon].to_string(),
                line,
            });
        }
        i = colon + 1;
    }
    None
}

/// Parse the description `_memory_viz` put first in an element's stack:
/// `b7fb276000000_0 14.6MiB allocation (15360000 bytes)` (address in hex
/// after `b`, then `_version`) → the address.
fn parse_description_address(s: &str) -> Option<u64> {
    let rest = s.strip_prefix('b')?;
    let (hex, tail) = rest.split_once('_')?;
    let (version, _) = tail.split_once(' ')?;
    if hex.is_empty() || !version.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Frames per `suffix_table`/`elements_info` entry the expanded stacks of an
/// `alloc_data` object may hold on average (see [`alloc_data`]).
const MAX_FRAMES_PER_ENTRY: usize = 32;
/// Frames the expanded stacks may always hold.
const MIN_FRAME_BUDGET: usize = 1 << 20;

/// Read the `alloc_data` object of an old `_memory_viz.trace_plot` page
/// (PyTorch 2.0/2.1): `elements_size[i]` is the size of allocation `i`,
/// `actions` lists element indices in time order (the first occurrence of
/// an element allocates it, the second frees it; elements of
/// `initially_allocated` are live at the start, so their first occurrence
/// frees them), and `elements_info` + `suffix_table` + `string_table`
/// intern each element's stack. When every element's stack starts with
/// the `b<hex address>_<version>` description newer pages write, the
/// addresses are real ([`AddressKind::Device`]); otherwise element `i` gets
/// the handle `i + 1`.
pub(super) fn alloc_data(v: &Value) -> R<(TraceInput, Vec<String>)> {
    as_dict(v)?;
    let get = |k: &'static str| v.get(k).ok_or_else(|| missing(k));
    let sizes: Vec<u64> = as_seq(get("elements_size")?)
        .key("elements_size")?
        .iter()
        .enumerate()
        .map(|(i, s)| as_u64(s).idx(i))
        .collect::<R<_>>()
        .key("elements_size")?;
    let n = sizes.len();
    let mut warnings = Warnings::default();

    let strings = alloc_data_strings(v)?;
    let suffixes = alloc_data_suffixes(v, strings.len())?;
    let info = alloc_data_info(v, n)?;
    let (stacks, addresses) = expand_stacks(&strings, &suffixes, &info)?;

    // Addresses: real when every element has one and live ones never collide.
    let actions = element_list(get("actions")?, "actions", n)?;
    let initially: Vec<usize> = match v.get("initially_allocated") {
        Some(Value::None) | None => Vec::new(),
        Some(t) => element_list(t, "initially_allocated", n)?,
    };
    let mut real = n > 0 && addresses.iter().all(Option::is_some);
    let simulate = |addr_of: &dyn Fn(usize) -> u64| {
        alloc_data_events(&initially, &actions, &sizes, &stacks, addr_of)
    };
    let synthetic = |e: usize| e as u64 + 1;
    let (mut events, collided) = if real {
        let addrs: Vec<u64> = addresses.iter().map(|a| a.unwrap_or(0)).collect();
        simulate(&|e| addrs[e])?
    } else {
        simulate(&synthetic)?
    };
    if real && collided {
        warnings.add("recorded addresses collide among live blocks; using synthetic handles");
        real = false;
        events = simulate(&synthetic)?.0;
    }
    let addr_of = |e: usize| {
        if real {
            addresses[e].unwrap_or(0)
        } else {
            synthetic(e)
        }
    };
    let mut seen = vec![false; n];
    for &e in actions.iter().chain(initially.iter()) {
        seen[e] = true;
    }
    let unused = seen.iter().filter(|s| !**s).count();
    if unused > 0 {
        warnings.add(format!("{unused} elements never appear in actions"));
    }
    if !matches!(v.get("elements_category"), None | Some(Value::None)) {
        warnings.add("ignored elements_category");
    }
    let initially_allocated = initially
        .iter()
        .map(|&e| LiveBlock {
            addr: addr_of(e),
            size: sizes[e],
            stream: StreamId::DEFAULT,
            frames: stacks[e].clone(),
        })
        .collect();
    let input = TraceInput {
        addresses: if real {
            AddressKind::Device
        } else {
            AddressKind::Synthetic
        },
        devices: vec![DeviceEvents {
            device: 0,
            events,
            initially_allocated: Some(initially_allocated),
            final_segments: None,
        }],
        allocator_settings: None,
    };
    Ok((input, warnings.finish()))
}

/// The `string_table` of an `alloc_data` object (empty when absent).
fn alloc_data_strings(v: &Value) -> R<Vec<&str>> {
    match v.get("string_table") {
        Some(t) => as_seq(t)
            .key("string_table")?
            .iter()
            .enumerate()
            .map(|(i, s)| as_str(s).idx(i))
            .collect::<R<_>>()
            .key("string_table"),
        None => Ok(Vec::new()),
    }
}

/// The `suffix_table` of an `alloc_data` object: (string index, parent
/// suffix) pairs, each string index below `strings` (empty when absent).
fn alloc_data_suffixes(v: &Value, strings: usize) -> R<Vec<(usize, Option<usize>)>> {
    let Some(t) = v.get("suffix_table") else {
        return Ok(Vec::new());
    };
    let t = as_seq(t).key("suffix_table")?;
    let mut out = Vec::with_capacity(t.len());
    for (i, e) in t.iter().enumerate() {
        let pair = (|| -> R<(usize, Option<usize>)> {
            match as_seq(e)? {
                [s, parent] => {
                    let s = as_u64(s).idx(0)?;
                    let s = usize::try_from(s)
                        .ok()
                        .filter(|&s| s < strings)
                        .ok_or_else(|| Fail::new(format!("string {s} out of range")))
                        .idx(0)?;
                    let parent = match parent {
                        Value::None => None,
                        p => Some(as_u64(p).idx(1)? as usize),
                    };
                    Ok((s, parent))
                }
                _ => Err(expected("a [string, parent] pair", e)),
            }
        })()
        .idx(i)
        .key("suffix_table")?;
        out.push(pair);
    }
    Ok(out)
}

/// The `elements_info` of an `alloc_data` object: each of the `n`
/// elements' first suffix (all `None` when absent).
fn alloc_data_info(v: &Value, n: usize) -> R<Vec<Option<usize>>> {
    match v.get("elements_info") {
        Some(Value::None) | None => Ok(vec![None; n]),
        Some(t) => {
            let t = as_seq(t).key("elements_info")?;
            if t.len() != n {
                return Err(Fail::new(format!(
                    "has {} entries for {n} elements",
                    t.len()
                )))
                .key("elements_info");
            }
            t.iter()
                .enumerate()
                .map(|(i, x)| match x {
                    Value::None => Ok(None),
                    x => as_u64(x).map(|s| Some(s as usize)).idx(i),
                })
                .collect::<R<_>>()
                .key("elements_info")
        }
    }
}

/// An element's stack, shared by equal ones.
type Stack = Arc<[Frame]>;

/// Each element's stack, followed from its `elements_info` suffix through
/// the `suffix_table`, and the address its description gives (the
/// `b<hex address>_<version>` string at the head of its stack, if any).
fn expand_stacks(
    strings: &[&str],
    suffixes: &[(usize, Option<usize>)],
    info: &[Option<usize>],
) -> R<(Vec<Stack>, Vec<Option<u64>>)> {
    let n = info.len();
    // Every element gets its whole stack materialized, so a long suffix
    // chain shared by many elements would take quadratic memory: bound the
    // total number of frames (the real files need < 6 per table entry).
    let frame_budget = (suffixes.len() + n)
        .saturating_mul(MAX_FRAMES_PER_ENTRY)
        .max(MIN_FRAME_BUDGET);
    let mut total_frames = 0usize;
    let mut parsed_frames: FxHashMap<usize, Option<Frame>> = FxHashMap::default();
    let mut stacks: Vec<Arc<[Frame]>> = Vec::with_capacity(n);
    let mut addresses: Vec<Option<u64>> = Vec::with_capacity(n);
    let empty: Arc<[Frame]> = Arc::from(Vec::new());
    for (i, head) in info.iter().enumerate() {
        let mut frames = Vec::new();
        let mut address = None;
        let mut cur = *head;
        let mut steps = 0;
        while let Some(s) = cur {
            let Some(&(str_idx, parent)) = suffixes.get(s) else {
                let msg = format!("suffix {s} out of range ({} suffixes)", suffixes.len());
                return Err(Fail::new(msg)).idx(i).key("elements_info");
            };
            steps += 1;
            if steps > suffixes.len() {
                return Err(Fail::new("suffix_table has a cycle"))
                    .idx(i)
                    .key("elements_info");
            }
            let text = strings[str_idx];
            let f = parsed_frames
                .entry(str_idx)
                .or_insert_with(|| parse_frame_string(text));
            match f {
                Some(f) => frames.push(f.clone()),
                None if steps == 1 => address = parse_description_address(text),
                None => frames.push(Frame {
                    name: text.to_string(),
                    filename: String::new(),
                    line: 0,
                }),
            }
            cur = parent;
        }
        total_frames = total_frames.saturating_add(frames.len());
        if total_frames > frame_budget {
            let msg = format!("stacks expand to more than {frame_budget} frames in all");
            return Err(Fail::new(msg)).idx(i).key("elements_info");
        }
        stacks.push(if frames.is_empty() {
            empty.clone()
        } else {
            frames.into()
        });
        addresses.push(address);
    }
    Ok((stacks, addresses))
}

/// A list of element indices (`actions`, `initially_allocated`), each
/// below `n`.
fn element_list(t: &Value, key: &'static str, n: usize) -> R<Vec<usize>> {
    let element = |x: &Value| -> R<usize> {
        let i = as_u64(x)?;
        usize::try_from(i)
            .ok()
            .filter(|&i| i < n)
            .ok_or_else(|| Fail::new(format!("element {i} out of range ({n} elements)")))
    };
    as_seq(t)
        .key(key)?
        .iter()
        .enumerate()
        .map(|(i, x)| element(x).idx(i))
        .collect::<R<_>>()
        .key(key)
}

/// The trace of an `alloc_data` object's `actions` from its
/// `initially_allocated` elements, each element at `addr_of(element)`, and
/// whether two live elements shared an address.
fn alloc_data_events(
    initially: &[usize],
    actions: &[usize],
    sizes: &[u64],
    stacks: &[Arc<[Frame]>],
    addr_of: &dyn Fn(usize) -> u64,
) -> R<(Vec<TraceEntry>, bool)> {
    // Alive state per element: 0 = not yet seen, 1 = live, 2 = freed.
    let mut state = vec![0u8; sizes.len()];
    let mut live: FxHashSet<u64> = FxHashSet::default();
    let mut collided = false;
    for &e in initially {
        state[e] = 1;
        collided |= !live.insert(addr_of(e));
    }
    let mut events = Vec::with_capacity(actions.len() * 3 / 2);
    for (i, &e) in actions.iter().enumerate() {
        let action = match state[e] {
            0 => {
                state[e] = 1;
                collided |= !live.insert(addr_of(e));
                TraceAction::Alloc
            }
            1 => {
                state[e] = 2;
                live.remove(&addr_of(e));
                TraceAction::FreeCompleted
            }
            _ => {
                return Err(Fail::new(format!("element {e} appears a third time")))
                    .idx(i)
                    .key("actions")
            }
        };
        alloc_and_free(&mut events, action, addr_of(e), sizes[e], &stacks[e]);
    }
    Ok((events, collided))
}

/// Read the trace format of Mao Lin's allocator simulator
/// (`allocatorSim`): one line per block, `alloc_event free_event size`,
/// where both events index one shared counter. Blank lines and `#`
/// comments are skipped. Block `k` (line order) gets the handle `k + 1`;
/// the trace starts from an empty allocator.
pub(super) fn allocator_sim_log(text: &str) -> R<TraceInput> {
    struct Ev {
        index: u64,
        block: usize,
        alloc: bool,
    }
    let mut sizes = Vec::new();
    let mut evs = Vec::new();
    for (lineno, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let nums: Vec<u64> = t
            .split_whitespace()
            .map(|x| {
                x.parse::<u64>()
                    .map_err(|_| Fail::new(format!("expected an unsigned int, found {x:?}")))
            })
            .collect::<R<_>>()
            .line(lineno + 1)?;
        let [a, f, size] = nums[..] else {
            return Err(Fail::new(format!(
                "expected 'alloc_event free_event size', found {t:?}"
            )))
            .line(lineno + 1);
        };
        if f <= a {
            return Err(Fail::new(format!(
                "free event {f} is not after alloc event {a}"
            )))
            .line(lineno + 1);
        }
        let block = sizes.len();
        sizes.push(size);
        evs.push(Ev {
            index: a,
            block,
            alloc: true,
        });
        evs.push(Ev {
            index: f,
            block,
            alloc: false,
        });
    }
    evs.sort_by_key(|e| e.index);
    if let Some(w) = evs.windows(2).find(|w| w[0].index == w[1].index) {
        return Err(Fail::new(format!(
            "event index {} is used twice",
            w[0].index
        )));
    }
    let empty: Arc<[Frame]> = Arc::from(Vec::new());
    let mut events = Vec::with_capacity(evs.len() * 3 / 2);
    for e in &evs {
        let action = if e.alloc {
            TraceAction::Alloc
        } else {
            TraceAction::FreeCompleted
        };
        alloc_and_free(
            &mut events,
            action,
            e.block as u64 + 1,
            sizes[e.block],
            &empty,
        );
    }
    Ok(TraceInput {
        addresses: AddressKind::Synthetic,
        devices: vec![DeviceEvents {
            device: 0,
            events,
            initially_allocated: Some(Vec::new()),
            final_segments: None,
        }],
        allocator_settings: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_strings() {
        let f = parse_frame_string("/a/b.py:12:<module>").unwrap();
        assert_eq!(
            (f.filename.as_str(), f.line, f.name.as_str()),
            ("/a/b.py", 12, "<module>")
        );
        let f = parse_frame_string("??:0:Py_BytesMain").unwrap();
        assert_eq!(
            (f.filename.as_str(), f.line, f.name.as_str()),
            ("??", 0, "Py_BytesMain")
        );
        let f = parse_frame_string(":0:run_mod").unwrap();
        assert_eq!((f.filename.as_str(), f.line), ("", 0));
        let f = parse_frame_string(
            "x.cpp:973:torch::autograd::dispatch_to(at::Tensor const&, c10::Device)",
        )
        .unwrap();
        assert_eq!(
            f.name,
            "torch::autograd::dispatch_to(at::Tensor const&, c10::Device)"
        );
        assert!(parse_frame_string("36.8KiB allocation").is_none());
        assert_eq!(
            parse_description_address("b7fb276000000_0 14.6MiB allocation (15360000 bytes)"),
            Some(0x7fb276000000)
        );
        assert_eq!(parse_description_address("36.8KiB allocation"), None);
    }

    #[test]
    fn sim_log() {
        let t = allocator_sim_log("0 3 100\n1 2 50\n\n# c\n").unwrap();
        let ev: Vec<(TraceAction, u64)> = t.devices[0]
            .events
            .iter()
            .map(|e| (e.action, e.addr))
            .collect();
        use TraceAction::*;
        assert_eq!(
            ev,
            vec![
                (Alloc, 1),
                (Alloc, 2),
                (FreeRequested, 2),
                (FreeCompleted, 2),
                (FreeRequested, 1),
                (FreeCompleted, 1)
            ]
        );
        assert!(allocator_sim_log("0 0 5\n").is_err());
        assert!(allocator_sim_log("0 2 5\n1 2 5\n").is_err());
        let e = allocator_sim_log("0 1 5\nx y z\n")
            .err()
            .unwrap()
            .into_schema_error();
        assert_eq!(
            e.to_string(),
            "line 2: expected an unsigned int, found \"x\""
        );
    }
}
