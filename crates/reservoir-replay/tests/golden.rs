//! Differential test against PyTorch's real CUDA caching allocator.
//!
//! `tests/golden/` holds what PyTorch 2.15's allocator did on a fake CUDA
//! device for a few hundred generated traces (`tools/regen-goldens.sh` made
//! them; see `tests/golden/README.md`). This test regenerates each trace from
//! its seed ([`reservoir_replay::oracle_trace`]), replays it through Reservoir's
//! [`CachingAllocator`] on a [`SimDevice`] set up like the fake driver, and
//! compares:
//!
//! * every `torch.cuda.memory_stats()` key at the end of the trace;
//! * the segment events of the history (`segment_alloc`, `segment_free`,
//!   `segment_map`, `segment_unmap`, `oom`): op, action, size, stream (and
//!   the device's free bytes for `oom`);
//! * every out-of-memory outcome: the op and the exact message text;
//! * the device calls (op, call, size, error). Virtual-memory calls are
//!   compared per op as totals (PyTorch logs one `cuMemCreate` + `cuMemMap`
//!   per page, the simulated device one map call per range; see
//!   [`normalize_oracle_calls`]).
//!
//! Each golden is replayed in PyTorch mode of the release in its `torch`
//! field ([`TorchRelease`], docs/replay-fidelity.md "PyTorch releases"):
//! `tests/golden/traces` are torch 2.15's, `tests/golden/releases/<release>/`
//! hold other releases' (`release_goldens_match_pytorch`;
//! `RESERVOIR_GOLDEN_RELEASE=2.13[,2.12]` selects releases), and the extra
//! goldens (`RESERVOIR_GOLDEN_EXTRA`) may mix releases in one folder.
//!
//! On a mismatch it prints the first diverging entry with its context and the
//! ops around it, and how to get the trace. No torch needed: the goldens are
//! committed JSON.
//!
//! Environment: `RESERVOIR_GOLDEN=substr[,substr...]` runs only the traces
//! whose name contains one of them; `RESERVOIR_GOLDEN_DETAILS=N` prints the
//! details of the first N failing traces (default 5); `RESERVOIR_GOLDEN_CHECK=1`
//! also runs `check_invariants` after every op; `RESERVOIR_GOLDEN_ADDRESSES=sim`
//! lets the simulated device place segments itself instead of handing out
//! the oracle's segment addresses (PyTorch breaks best-fit ties by address,
//! and the fake driver's `mmap` addresses interleave with the rest of the
//! process's mappings).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use reservoir::caching::stream_order;
use reservoir::checksum::Fnv1a;
use reservoir::observe::trace::TraceAction;
use reservoir::sim::{CallKind, CallResult, DeviceCall, SimConfig, SimDevice};
use reservoir::{
    AllocError, AllocatorConfig, Backend, CachingAllocator, DevicePtr, StreamId, TorchRelease,
};
use reservoir_replay::oracle_trace::{golden_specs, GenKind, GenSpec, Op, Trace};
use serde_json::Value;

const GOLDEN_FORMAT: &str = "reservoir-golden/1";

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden")
}

// ---------------------------------------------------------------------------
// Golden files
// ---------------------------------------------------------------------------

/// A segment event: `[op, action, size, stream]`, plus `device_free` for `oom`.
///
/// Equality compares action, size, stream and device_free, not `op`: the
/// oracle attributes an event to an op by matching addresses in the history,
/// and gets it wrong for some expandable-segment maps (e.g. uniform-015 labels
/// a map made at op 97 as op 2). The sequence order still pins when it happened.
#[derive(Clone, Debug)]
struct SegEvent {
    op: Option<usize>,
    action: String,
    size: u64,
    stream: String,
    device_free: Option<u64>,
}

impl PartialEq for SegEvent {
    fn eq(&self, other: &SegEvent) -> bool {
        (&self.action, self.size, &self.stream, self.device_free)
            == (&other.action, other.size, &other.stream, other.device_free)
    }
}

impl Eq for SegEvent {}

impl std::fmt::Display for SegEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "op {} {} {} stream {}",
            opt(self.op),
            self.action,
            self.size,
            self.stream
        )?;
        if let Some(d) = self.device_free {
            write!(f, " device_free {d}")?;
        }
        Ok(())
    }
}

/// A device call after normalization: `[op, call, size, error]`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Call {
    op: Option<usize>,
    call: String,
    size: u64,
    error: u64,
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "op {} {} {}", opt(self.op), self.call, self.size)?;
        if self.error != 0 {
            write!(f, " error {}", self.error)?;
        }
        Ok(())
    }
}

/// An out-of-memory outcome: the op and the message.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Oom {
    op: usize,
    message: String,
}

impl std::fmt::Display for Oom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "op {}: {}", self.op, self.message)
    }
}

fn opt(op: Option<usize>) -> String {
    op.map_or("-".to_string(), |o| o.to_string())
}

/// What a replay produced (the oracle's, from a golden file, or ours).
#[derive(Clone, Debug, Default)]
struct Outcome {
    stats: BTreeMap<String, i64>,
    ooms: Vec<Oom>,
    segment_events: Vec<SegEvent>,
    /// Raw rows for the oracle (`[op, call, size, error]`, expanded);
    /// normalized before comparing.
    device_calls: Vec<Call>,
    /// One hash per window of ops of where the allocations went (see
    /// [`placement_hashes`]).
    placement: Vec<u64>,
}

struct Golden {
    name: String,
    /// The release of the golden's `torch` field: the PyTorch mode it is
    /// replayed in.
    release: TorchRelease,
    /// The `memory_stats()` keys of that release.
    keys: Vec<String>,
    spec: GenSpec,
    fingerprint: u64,
    ops: usize,
    capacity: u64,
    stream_order: Vec<String>,
    placement_window: usize,
    /// Base address of each segment in the oracle, in order of creation.
    segment_addresses: Vec<u64>,
    expected: Outcome,
}

fn spec_from_json(v: &Value) -> Result<(GenSpec, Option<u64>), String> {
    let s = |k: &str| {
        v[k].as_str()
            .ok_or_else(|| format!("spec field {k:?} missing"))
    };
    let u = |k: &str| {
        v[k].as_u64()
            .ok_or_else(|| format!("spec field {k:?} missing"))
    };
    let kind = GenKind::parse(s("kind")?).ok_or_else(|| format!("unknown kind {:?}", v["kind"]))?;
    let spec = GenSpec {
        name: s("name")?.to_string(),
        kind,
        seed: u("seed")?,
        ops: u("ops")? as usize,
        conf: s("conf")?.to_string(),
        capacity: u("capacity")?,
        fraction: v["fraction"].as_f64(),
    };
    let fp = v["fingerprint"]
        .as_str()
        .and_then(|h| u64::from_str_radix(h, 16).ok());
    Ok((spec, fp))
}

fn load_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn load_manifest() -> Vec<(GenSpec, Option<u64>)> {
    let m = load_json(&golden_dir().join("manifest.json")).unwrap();
    m["specs"]
        .as_array()
        .expect("manifest: specs")
        .iter()
        .map(|v| spec_from_json(v).unwrap())
        .collect()
}

fn load_stats_keys() -> Vec<String> {
    let v = load_json(&golden_dir().join("stats_keys.json")).unwrap();
    v["keys"]
        .as_array()
        .expect("stats_keys.json: keys")
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect()
}

/// The `memory_stats()` keys of `release`: `keys` (torch 2.15's, from
/// `stats_keys.json`) less those the release does not have
/// ([`reservoir::ReleaseRules::missing_stat_keys`]).
fn release_keys(keys: &[String], release: TorchRelease) -> Vec<String> {
    let missing = release.rules().missing_stat_keys();
    keys.iter()
        .filter(|k| !missing.contains(&k.as_str()))
        .cloned()
        .collect()
}

fn load_golden_at(path: &Path, keys: &[String]) -> Result<Golden, String> {
    let path = path.to_path_buf();
    let g = load_json(&path)?;
    if g["format"] != GOLDEN_FORMAT {
        return Err(format!(
            "{}: format {:?}, expected {GOLDEN_FORMAT}",
            path.display(),
            g["format"]
        ));
    }
    let bad = |what: &str| format!("{}: bad {what}", path.display());
    let (spec, _) = spec_from_json(&g["spec"])?;
    let fingerprint = g["fingerprint"]
        .as_str()
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .ok_or_else(|| bad("fingerprint"))?;
    let op_of = |v: &Value| v.as_u64().map(|o| o as usize);
    let torch = g["torch"].as_str().ok_or_else(|| bad("torch"))?;
    let release = TorchRelease::from_version(torch).ok_or_else(|| {
        format!(
            "{}: torch {torch:?} is not a supported release",
            path.display()
        )
    })?;
    let keys = release_keys(keys, release);
    let mut expected = Outcome::default();
    let values = g["stats"].as_array().ok_or_else(|| bad("stats"))?;
    if values.len() != keys.len() {
        return Err(bad(
            "stats (not one value per key of stats_keys.json, less the keys the release lacks)",
        ));
    }
    for (k, v) in keys.iter().zip(values) {
        expected
            .stats
            .insert(k.clone(), v.as_i64().ok_or_else(|| bad("stats value"))?);
    }
    let tails: Vec<&str> = g["oom_tails"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for row in g["ooms"].as_array().ok_or_else(|| bad("ooms"))? {
        let head = row[1].as_str().ok_or_else(|| bad("oom message"))?;
        let tail = tails
            .get(row[2].as_u64().unwrap_or(0) as usize)
            .copied()
            .unwrap_or("");
        expected.ooms.push(Oom {
            op: row[0].as_u64().ok_or_else(|| bad("oom op"))? as usize,
            message: format!("{head}{tail}"),
        });
    }
    for row in g["segment_events"]
        .as_array()
        .ok_or_else(|| bad("segment_events"))?
    {
        expected.segment_events.push(SegEvent {
            op: op_of(&row[0]),
            action: row[1]
                .as_str()
                .ok_or_else(|| bad("segment action"))?
                .to_string(),
            size: row[2].as_u64().ok_or_else(|| bad("segment size"))?,
            stream: row[3]
                .as_str()
                .ok_or_else(|| bad("segment stream"))?
                .to_string(),
            device_free: row.get(4).and_then(Value::as_u64),
        });
    }
    for row in g["device_calls"]
        .as_array()
        .ok_or_else(|| bad("device_calls"))?
    {
        let name = row[1].as_str().ok_or_else(|| bad("call"))?;
        // "unmap+release": an unmap followed by a release of the same op and size.
        let names: &[&str] = if name == "unmap+release" {
            &["unmap", "release"]
        } else {
            &[name]
        };
        for _ in 0..row[4].as_u64().unwrap_or(1) {
            for n in names {
                expected.device_calls.push(Call {
                    op: op_of(&row[0]),
                    call: n.to_string(),
                    size: row[2].as_u64().ok_or_else(|| bad("call size"))?,
                    error: row[3].as_u64().unwrap_or(0),
                });
            }
        }
    }
    for h in g["placement"].as_array().ok_or_else(|| bad("placement"))? {
        let h = h.as_str().and_then(|h| u64::from_str_radix(h, 16).ok());
        expected
            .placement
            .push(h.ok_or_else(|| bad("placement hash"))?);
    }
    let mut segment_addresses = Vec::new();
    let mut page = 0i64;
    for d in g["segment_addresses"]
        .as_array()
        .ok_or_else(|| bad("segment_addresses"))?
    {
        page += d.as_i64().ok_or_else(|| bad("segment address"))?;
        segment_addresses.push(page as u64 * 4096);
    }
    let stream_order = g["stream_order"]
        .as_array()
        .ok_or_else(|| bad("stream_order"))?
        .iter()
        .map(|s| s.as_str().unwrap_or("?").to_string())
        .collect();
    Ok(Golden {
        name: spec.name.clone(),
        release,
        keys,
        spec,
        fingerprint,
        ops: g["ops"].as_u64().ok_or_else(|| bad("ops"))? as usize,
        capacity: g["capacity"].as_u64().ok_or_else(|| bad("capacity"))?,
        stream_order,
        segment_addresses,
        placement_window: g["placement_window"]
            .as_u64()
            .ok_or_else(|| bad("placement_window"))? as usize,
        expected,
    })
}

// ---------------------------------------------------------------------------
// Device-call normalization
// ---------------------------------------------------------------------------

/// Append `c`, adding its size to the previous entry if that is the same
/// successful virtual-memory call of the same op.
fn push_merged(out: &mut Vec<Call>, c: Call) {
    if c.error == 0 && (c.call == "map" || c.call == "unmap") {
        if let Some(last) = out.last_mut() {
            if last.op == c.op && last.call == c.call && last.error == 0 {
                last.size += c.size;
                return;
            }
        }
    }
    out.push(c);
}

/// The oracle's device calls in comparable form. Plain calls (`alloc`,
/// `free`, `reserve`, `addr_free`) stay as they are. PyTorch maps a range as
/// one `cuMemCreate` per page, then one `cuMemMap` per page, and unmaps it
/// as `cuMemUnmap` + `cuMemRelease` per page; a failed `cuMemCreate` is
/// followed by releasing the handles created so far. So: successful
/// `create` and every `release` are dropped (they pair with map and unmap),
/// a failed `create` becomes a failed `map` (size 0: how much was asked for
/// is not in the log), and consecutive successful `map` (or `unmap`) calls
/// of one op become one call with the total size.
fn normalize_oracle_calls(rows: &[Call]) -> Vec<Call> {
    let mut out = Vec::new();
    for c in rows {
        match c.call.as_str() {
            "create" if c.error == 0 => {}
            "create" => out.push(Call {
                op: c.op,
                call: "map".into(),
                size: 0,
                error: c.error,
            }),
            "release" => {}
            _ => push_merged(&mut out, c.clone()),
        }
    }
    out
}

/// The simulated device's call log in the same form as
/// [`normalize_oracle_calls`].
fn normalize_sim_calls(log: &[DeviceCall]) -> Vec<Call> {
    let mut out = Vec::new();
    for c in log {
        let error = u64::from(c.result.error_code());
        let op = c.tag.map(|t| t as usize);
        let call = c.kind.oracle_name().to_string();
        let size = if c.kind == CallKind::Map && c.result != CallResult::Ok {
            0
        } else {
            c.size
        };
        push_merged(
            &mut out,
            Call {
                op,
                call,
                size,
                error,
            },
        );
    }
    out
}

// ---------------------------------------------------------------------------
// Replay through Reservoir
// ---------------------------------------------------------------------------

struct Replay {
    outcome: Outcome,
    /// Normalized device calls.
    calls: Vec<Call>,
    /// Every successful allocation: (op, segment, offset).
    placements: Vec<(usize, usize, u64)>,
}

fn replay(g: &Golden, trace: &Trace, check_each_op: bool) -> Result<Replay, String> {
    let mut config = AllocatorConfig::parse(&g.spec.conf)
        .map_err(|e| format!("AllocatorConfig::parse({:?}): {e:?}", g.spec.conf))?;
    // PyTorch mode of the release that made the golden (its `torch` field).
    config.torch_release = g.release;
    let sim_config = SimConfig {
        capacity: g.capacity,
        call_log: true,
        ..SimConfig::like_fake_driver()
    };
    // PyTorch breaks best-fit ties by address: hand out the oracle's segment
    // addresses in order, unless asked to test the simulated placement.
    let dev = if std::env::var("RESERVOIR_GOLDEN_ADDRESSES").is_ok_and(|v| v == "sim") {
        SimDevice::new(sim_config)
    } else {
        SimDevice::with_recorded_addresses(sim_config, g.segment_addresses.iter().copied())
    };
    let alloc = CachingAllocator::new(dev, config);
    alloc.record_history(Some(usize::MAX));
    if let Some(f) = g.spec.fraction {
        alloc
            .set_memory_fraction(f)
            .map_err(|e| format!("set_memory_fraction({f}): {e}"))?;
    }

    // Streams: ranked by the oracle's cudaStream_t order, default first.
    let mut ids: BTreeMap<String, StreamId> = BTreeMap::new();
    let mut names: BTreeMap<StreamId, String> = BTreeMap::new();
    ids.insert("0".into(), StreamId::DEFAULT);
    ids.insert("default".into(), StreamId::DEFAULT);
    names.insert(StreamId::DEFAULT, "0".into());
    for (rank, name) in g.stream_order.iter().enumerate().skip(1) {
        let id = StreamId(rank as u64);
        alloc.backend().register_stream(id);
        ids.insert(name.clone(), id);
        names.insert(id, name.clone());
    }
    // c10 stream ids: the oracle creates a `torch.cuda.Stream()` at the first
    // use of a name, and c10 hands out default-priority pool streams round
    // robin. They order PyTorch's per-stream event queues (its hash map).
    let mut created: BTreeSet<String> = BTreeSet::new();
    let mut stream_of = |name: &str, alloc: &CachingAllocator<SimDevice>| -> StreamId {
        if name != "0" && name != "default" && !created.contains(name) {
            let index = created.len() as u32;
            created.insert(name.to_string());
            let id = match ids.get(name) {
                Some(&id) => id,
                None => {
                    // Used in the trace but never created by the oracle (only by ops it
                    // skipped): give it an id after the others.
                    let id = StreamId(1000 + ids.len() as u64);
                    alloc.backend().register_stream(id);
                    ids.insert(name.to_string(), id);
                    names.insert(id, name.to_string());
                    id
                }
            };
            alloc
                .seeder()
                .set_c10_stream_id(id, stream_order::c10_pool_stream_id(0, index));
        }
        if let Some(&id) = ids.get(name) {
            return id;
        }
        // Used in the trace but never created by the oracle (only by ops it
        // skipped): give it an id after the others.
        let id = StreamId(1000 + ids.len() as u64);
        alloc.backend().register_stream(id);
        ids.insert(name.to_string(), id);
        names.insert(id, name.to_string());
        id
    };

    let mut out = Outcome::default();
    let mut live: BTreeMap<u64, DevicePtr> = BTreeMap::new();
    let mut allocated: Vec<(usize, DevicePtr)> = Vec::new();
    let mut oom_ids: BTreeSet<u64> = BTreeSet::new();
    let mut current = StreamId::DEFAULT;
    for (i, op) in trace.ops.iter().enumerate() {
        alloc.backend().set_call_tag(Some(i as u64));
        let at = |what: String| format!("op {i} (line {}: `{op}`): {what}", trace.lines[i]);
        match op {
            Op::Alloc { id, bytes, stream } => {
                if live.contains_key(id) {
                    return Err(at("id already live (invalid trace)".into()));
                }
                let s = match stream {
                    Some(s) => stream_of(s.as_str(), &alloc),
                    None => current,
                };
                match alloc.raw_alloc(*bytes, s) {
                    Ok(p) => {
                        live.insert(*id, p);
                        oom_ids.remove(id);
                        if !p.is_null() {
                            allocated.push((i, p));
                        }
                    }
                    Err(AllocError::OutOfMemory(e)) => {
                        oom_ids.insert(*id);
                        out.ooms.push(Oom {
                            op: i,
                            message: e.message().to_string(),
                        });
                    }
                    Err(e) => return Err(at(format!("raw_alloc failed: {e}"))),
                }
            }
            Op::Free { id } => match live.remove(id) {
                Some(p) => alloc
                    .raw_free(p)
                    .map_err(|e| at(format!("raw_free failed: {e}")))?,
                None if oom_ids.remove(id) => {}
                None => return Err(at("free of an id that is not live (invalid trace)".into())),
            },
            Op::EmptyCache => {
                alloc
                    .empty_cache()
                    .map_err(|e| at(format!("empty_cache failed: {e}")))?;
            }
            Op::SetStream { stream } => current = stream_of(stream.as_str(), &alloc),
            Op::RecordStream { id, stream } => match live.get(id) {
                Some(&p) => {
                    let s = stream_of(stream.as_str(), &alloc);
                    alloc
                        .record_stream(p, s)
                        .map_err(|e| at(format!("record_stream failed: {e}")))?;
                }
                None if oom_ids.contains(id) => {}
                None => return Err(at("record_stream of an id that is not live".into())),
            },
            Op::Kernel { stream, ids: kids } => {
                let s = stream_of(stream.as_str(), &alloc);
                // The oracle enqueues one piece of work per live id (one if none).
                let n = kids.iter().filter(|k| live.contains_key(k)).count().max(1);
                for _ in 0..n {
                    alloc
                        .backend()
                        .enqueue_work(s)
                        .map_err(|e| at(format!("enqueue_work: {e}")))?;
                }
            }
            Op::Hold { stream } => {
                let s = stream_of(stream.as_str(), &alloc);
                alloc
                    .backend()
                    .hold_stream(s)
                    .map_err(|e| at(format!("hold_stream: {e}")))?;
            }
            Op::Release { stream } => {
                let s = stream_of(stream.as_str(), &alloc);
                alloc
                    .backend()
                    .release_stream(s)
                    .map_err(|e| at(format!("release_stream: {e}")))?;
            }
            Op::Sync { stream: None } => alloc.backend().synchronize_all(),
            Op::Sync {
                stream: Some(stream),
            } => {
                let s = stream_of(stream.as_str(), &alloc);
                alloc
                    .backend()
                    .synchronize_stream(s)
                    .map_err(|e| at(format!("synchronize_stream: {e}")))?;
            }
            Op::Wait { waiter, waited } => {
                // s1.wait_stream(s2): record an event on s2, make s1 wait for it.
                let a = stream_of(waiter.as_str(), &alloc);
                let b = stream_of(waited.as_str(), &alloc);
                let dev = alloc.backend();
                let ev = dev
                    .record_event(b)
                    .map_err(|e| at(format!("record_event: {e}")))?;
                dev.wait_event(a, ev)
                    .map_err(|e| at(format!("wait_event: {e}")))?;
                dev.destroy_event(ev)
                    .map_err(|e| at(format!("destroy_event: {e}")))?;
            }
            // Private-pool ops come from recorded snapshots, never from
            // the oracle's traces.
            Op::UsePool { .. } | Op::ReleasePool { .. } | Op::EmptyPool { .. } => {
                return Err(at("a private-pool op in an oracle trace".into()));
            }
        }
        if check_each_op {
            alloc
                .check_invariants()
                .map_err(|e| at(format!("invariant violated: {e:?}")))?;
        }
    }
    alloc.backend().set_call_tag(None);
    alloc
        .check_invariants()
        .map_err(|e| format!("after the last op: invariant violated: {e:?}"))?;
    out.stats = alloc.memory_stats();

    // Segment events from the history; their op is the op of the matching
    // device call (as the oracle matches them), OOMs in order.
    let log = alloc.backend().call_log();
    let mut used = vec![false; log.len()];
    let mut find = |kind: CallKind, addr: u64| -> Option<usize> {
        for (j, c) in log.iter().enumerate() {
            if !used[j]
                && c.kind == kind
                && c.result == CallResult::Ok
                && c.addr.0 + c.offset == addr
            {
                used[j] = true;
                return c.tag.map(|t| t as usize);
            }
        }
        None
    };
    let mut oom_ops = out.ooms.iter().map(|o| o.op);
    for e in alloc.history() {
        let kind = match e.action {
            TraceAction::SegmentAlloc => Some(CallKind::Alloc),
            TraceAction::SegmentFree => Some(CallKind::Free),
            TraceAction::SegmentMap => Some(CallKind::Map),
            TraceAction::SegmentUnmap => Some(CallKind::Unmap),
            TraceAction::Oom => None,
            _ => continue,
        };
        let stream = names
            .get(&e.stream)
            .cloned()
            .unwrap_or_else(|| format!("?{}", e.stream.0));
        let (op, device_free) = match kind {
            Some(k) => (find(k, e.addr), None),
            None => (oom_ops.next(), Some(e.addr)),
        };
        out.segment_events.push(SegEvent {
            op,
            action: e.action.as_str().to_string(),
            size: e.size,
            stream,
            device_free,
        });
    }
    let placements = locate_allocations(&log, &allocated);
    out.placement = placement_hashes(&placements, trace.ops.len(), g.placement_window);
    Ok(Replay {
        calls: normalize_sim_calls(&log),
        outcome: out,
        placements,
    })
}

/// Segment and offset of each allocation, as the oracle computes them:
/// segments (plain allocations and reservations) are numbered in order of
/// creation; an address belongs to the latest segment containing it that
/// was created at or before the op and not freed before it.
fn locate_allocations(
    log: &[DeviceCall],
    allocated: &[(usize, DevicePtr)],
) -> Vec<(usize, usize, u64)> {
    // (segment, base, size, first op, last op, is a reservation)
    let mut spans: Vec<(usize, u64, u64, usize, Option<usize>, bool)> = Vec::new();
    for c in log {
        if c.result != CallResult::Ok {
            continue;
        }
        let op = c.tag.map_or(0, |t| t as usize);
        match c.kind {
            CallKind::Alloc | CallKind::Reserve => {
                let resv = c.kind == CallKind::Reserve;
                spans.push((spans.len(), c.addr.0, c.size, op, None, resv));
            }
            CallKind::Free | CallKind::Release => {
                let resv = c.kind == CallKind::Release;
                if let Some(s) = spans
                    .iter_mut()
                    .rev()
                    .find(|s| s.1 == c.addr.0 && s.4.is_none() && s.5 == resv)
                {
                    s.4 = Some(op);
                }
            }
            _ => {}
        }
    }
    allocated
        .iter()
        .map(|&(op, p)| {
            let best = spans
                .iter()
                .filter(|s| {
                    s.1 <= p.0 && p.0 < s.1 + s.2 && s.3 <= op && s.4.map_or(true, |l| l >= op)
                })
                .max_by_key(|s| s.3);
            match best {
                Some(s) => (op, s.0, p.0 - s.1),
                None => (op, usize::MAX, p.0),
            }
        })
        .collect()
}

/// FNV-1a of `op:segment:offset;` for the allocations of each window of
/// `window` ops (the golden's `placement`).
fn placement_hashes(placements: &[(usize, usize, u64)], ops: usize, window: usize) -> Vec<u64> {
    let mut h = vec![Fnv1a::new(); ops / window + 1];
    for &(op, seg, off) in placements {
        h[op / window].write(format!("{op}:{seg}:{off};").as_bytes());
    }
    h.into_iter().map(|f| f.finish()).collect()
}

// ---------------------------------------------------------------------------
// Comparison and reporting
// ---------------------------------------------------------------------------

/// The ops leading to `op`, as text.
fn ops_around(trace: &Trace, op: Option<usize>) -> String {
    let Some(op) = op else { return String::new() };
    let mut s = String::new();
    let lo = op.saturating_sub(6);
    for i in lo..=op.min(trace.ops.len().saturating_sub(1)) {
        let _ = writeln!(
            s,
            "      {}op {i:>5}: {}",
            if i == op { "> " } else { "  " },
            trace.ops[i]
        );
    }
    s
}

/// Compare two sequences; describe the first difference with context.
fn diff_seq<T: PartialEq + std::fmt::Display>(
    what: &str,
    expected: &[T],
    actual: &[T],
    op_of: impl Fn(&T) -> Option<usize>,
    trace: &Trace,
) -> Option<String> {
    let n = expected.len().min(actual.len());
    let first = (0..n).find(|&i| expected[i] != actual[i]);
    let at = match first {
        Some(i) => i,
        None if expected.len() == actual.len() => return None,
        None => n,
    };
    let mut s = format!(
        "  {what}: first difference at entry {at} (expected {} entries, got {})\n",
        expected.len(),
        actual.len()
    );
    let lo = at.saturating_sub(3);
    for (label, list) in [
        ("expected (PyTorch)", expected),
        ("actual (Reservoir)", actual),
    ] {
        let _ = writeln!(s, "    {label}:");
        for (i, x) in list.iter().enumerate().take(at + 3).skip(lo) {
            let _ = writeln!(s, "      {}[{i}] {x}", if i == at { "> " } else { "  " });
        }
        if at >= list.len() {
            let _ = writeln!(s, "      > [{at}] (none)");
        }
    }
    let op = expected
        .get(at)
        .and_then(&op_of)
        .or_else(|| actual.get(at).and_then(&op_of));
    if op.is_some() {
        let _ = writeln!(s, "    ops up to op {}:", opt(op));
        s.push_str(&ops_around(trace, op));
    }
    Some(s)
}

fn compare(g: &Golden, trace: &Trace, r: &Replay) -> Vec<String> {
    let keys = &g.keys;
    let mut problems = Vec::new();
    let exp = &g.expected;
    let act = &r.outcome;
    // stats: every key of the torch version, absent = 0
    let mut bad = Vec::new();
    for k in keys {
        let e = exp.stats.get(k).copied().unwrap_or(0);
        match act.stats.get(k) {
            Some(&a) if a == e => {}
            Some(&a) => bad.push(format!("{k}: expected {e}, got {a}")),
            None => bad.push(format!("{k}: expected {e}, key missing")),
        }
    }
    for k in act.stats.keys() {
        if !keys.contains(k) {
            bad.push(format!(
                "{k}: not a PyTorch {} key (got {})",
                g.release, act.stats[k]
            ));
        }
    }
    if !bad.is_empty() {
        let mut s = format!("  memory_stats: {} keys differ\n", bad.len());
        for b in bad.iter().take(24) {
            let _ = writeln!(s, "    {b}");
        }
        if bad.len() > 24 {
            let _ = writeln!(s, "    ...");
        }
        problems.push(s);
    }
    problems.extend(diff_seq(
        "ooms",
        &exp.ooms,
        &act.ooms,
        |o| Some(o.op),
        trace,
    ));
    problems.extend(diff_seq(
        "segment_events",
        &exp.segment_events,
        &act.segment_events,
        |e| e.op,
        trace,
    ));
    let exp_calls = normalize_oracle_calls(&exp.device_calls);
    problems.extend(diff_seq(
        "device_calls",
        &exp_calls,
        &r.calls,
        |c| c.op,
        trace,
    ));
    if let Some(w) = (0..exp.placement.len().max(act.placement.len()))
        .find(|&w| exp.placement.get(w) != act.placement.get(w))
    {
        let (lo, hi) = (w * g.placement_window, (w + 1) * g.placement_window);
        let mut s = format!(
            "  block placement: first differs in ops {lo}..{} (the golden keeps one hash per \
             {} ops; KEEP_FULL=1 tools/regen-goldens.sh {} keeps PyTorch's placements)\n    \
             Reservoir placed (op: segment + offset):\n",
            hi - 1,
            g.placement_window,
            g.name
        );
        for &(op, seg, off) in r.placements.iter().filter(|p| (lo..hi).contains(&p.0)) {
            let seg = if seg == usize::MAX {
                "?".to_string()
            } else {
                seg.to_string()
            };
            let _ = writeln!(
                s,
                "      op {op:>5}: {seg} + {off:#x}    `{}`",
                trace.ops[op]
            );
        }
        problems.push(s);
    }
    problems
}

fn describe(g: &Golden) -> String {
    format!(
        "golden {} (torch {}, kind {}, seed {}, {} ops, conf {:?}, capacity {}, fraction {})",
        g.name,
        g.release,
        g.spec.kind,
        g.spec.seed,
        g.ops,
        g.spec.conf,
        g.capacity,
        g.spec
            .fraction
            .map_or("none".to_string(), |f| f.to_string())
    )
}

fn reproduce(g: &Golden) -> String {
    let mut args = String::new();
    for a in g.spec.oracle_args() {
        let _ = write!(
            args,
            " {}",
            if a.contains(['[', ']', '>', ' ']) {
                format!("'{a}'")
            } else {
                a
            }
        );
    }
    format!(
        "  reproduce: cargo run -p reservoir-replay --example gen_trace -- trace {n} > /tmp/{n}.txt\n\
         \x20            python3 tools/oracle_replay_ext.py /tmp/{n}.txt /tmp/{n}.json{args}\n",
        n = g.name
    )
}

enum Verdict {
    Pass,
    /// The report, and which checks failed.
    Fail(String, Vec<String>),
}

fn run_one(
    dir: &Path,
    name: &str,
    keys: &[String],
    expect: TorchRelease,
    check_each_op: bool,
) -> Verdict {
    let g = match load_golden_at(&dir.join("traces").join(format!("{name}.json")), keys) {
        Ok(g) if g.release != expect => {
            return Verdict::Fail(
                format!(
                    "golden {name} in {} is of torch {}, not {expect}\n",
                    dir.display(),
                    g.release
                ),
                vec!["loading".into()],
            )
        }
        Ok(g) => g,
        Err(e) => {
            return Verdict::Fail(
                format!("cannot load golden {name}: {e}\n"),
                vec!["loading".into()],
            )
        }
    };
    let trace = g.spec.trace();
    if trace.fingerprint() != g.fingerprint || trace.ops.len() != g.ops {
        let mut report = describe(&g) + "\n";
        report.push_str(
            "  the generator no longer produces this trace (fingerprint or op count differs):\n  \
             run tools/regen-goldens.sh, or restore the generator\n",
        );
        return Verdict::Fail(report, vec!["generator".into()]);
    }
    run_trace(&g, &trace, check_each_op)
}

/// Replay `trace` and compare with its golden `g`.
fn run_trace(g: &Golden, trace: &Trace, check_each_op: bool) -> Verdict {
    let mut report = describe(g) + "\n";
    let result = catch_unwind(AssertUnwindSafe(|| replay(g, trace, check_each_op)));
    let problems = match result {
        Ok(Ok(r)) => compare(g, trace, &r),
        Ok(Err(e)) => vec![format!("  replay stopped: {e}\n")],
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            vec![format!("  replay panicked: {msg}\n")]
        }
    };
    if problems.is_empty() {
        return Verdict::Pass;
    }
    // Each problem starts with "  <check>: ".
    let checks = problems
        .iter()
        .map(|p| p.trim_start().split(':').next().unwrap_or("?").to_string())
        .collect();
    for p in problems {
        report.push_str(&p);
    }
    report.push_str(&reproduce(g));
    Verdict::Fail(report, checks)
}

fn selected(name: &str) -> bool {
    match std::env::var("RESERVOIR_GOLDEN") {
        Ok(f) if !f.is_empty() => f.split(',').any(|p| name.contains(p)),
        _ => true,
    }
}

/// What a run of goldens found: the failing traces with their reports,
/// (matching, total) per kind, failing traces per check.
#[derive(Default)]
struct SuiteResult {
    failed: Vec<(String, String)>,
    per_kind: BTreeMap<String, (usize, usize)>,
    per_check: BTreeMap<String, usize>,
}

/// Replay the goldens `dir/traces/<name>.json` of `names` on all cores,
/// each in the PyTorch mode of its `torch` field, which must be `expect`.
fn run_suite(
    dir: &Path,
    names: &[String],
    keys: &[String],
    expect: TorchRelease,
    check: bool,
) -> SuiteResult {
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(names.len())
        .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<Verdict>>> =
        names.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= names.len() {
                    break;
                }
                let v = run_one(dir, &names[i], keys, expect, check);
                *results[i].lock().unwrap() = Some(v);
            });
        }
    });
    let mut out = SuiteResult::default();
    for (name, r) in names.iter().zip(results) {
        let kind = name
            .rsplit_once('-')
            .map_or(name.as_str(), |(k, _)| k)
            .to_string();
        let e = out.per_kind.entry(kind).or_default();
        e.1 += 1;
        match r.into_inner().unwrap().expect("every trace ran") {
            Verdict::Pass => e.0 += 1,
            Verdict::Fail(rep, checks) => {
                for c in checks {
                    *out.per_check.entry(c).or_default() += 1;
                }
                out.failed.push((name.clone(), rep));
            }
        }
    }
    out
}

/// The panic message for `failed` (a subset of `r.failed`) out of `total`.
fn failure_message(
    what: &str,
    r: &SuiteResult,
    failed: &[(String, String)],
    total: usize,
    details: usize,
) -> String {
    let mut msg = String::new();
    for (_, rep) in failed.iter().take(details) {
        msg.push_str(rep);
        msg.push('\n');
    }
    let _ = writeln!(msg, "failing traces per check:");
    for (c, n) in &r.per_check {
        let _ = writeln!(msg, "  {c:<20} {n:>4}");
    }
    let _ = writeln!(msg, "per kind (matching / total):");
    for (k, (ok, n)) in &r.per_kind {
        let _ = writeln!(msg, "  {k:<14} {ok:>4} / {n}");
    }
    let _ = writeln!(
        msg,
        "{} of {} {what} differ from PyTorch: {}",
        failed.len(),
        total,
        failed
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let _ = writeln!(
        msg,
        "(RESERVOIR_GOLDEN=name[,name] selects traces, RESERVOIR_GOLDEN_DETAILS=N shows more)"
    );
    msg
}

fn details() -> usize {
    std::env::var("RESERVOIR_GOLDEN_DETAILS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

/// A suite's failures read against its known divergences: the failures not
/// listed (they fail the test) and the listed traces of `names` that now
/// match (they fail it too: the list must shrink as fixes land).
fn against_known(
    r: &SuiteResult,
    names: &[String],
    known: &std::collections::BTreeSet<String>,
) -> (Vec<(String, String)>, Vec<String>) {
    let failed = (r.failed.iter())
        .filter(|(n, _)| !known.contains(n))
        .cloned()
        .collect();
    let fixed = (known.iter())
        .filter(|k| names.contains(k) && !r.failed.iter().any(|(n, _)| n == *k))
        .cloned()
        .collect();
    (failed, fixed)
}

/// Replay every golden trace and compare with PyTorch.
#[test]
fn golden_traces_match_pytorch() {
    let keys = load_stats_keys();
    let names: Vec<String> = load_manifest()
        .into_iter()
        .map(|(s, _)| s.name)
        .filter(|n| selected(n))
        .collect();
    assert!(!names.is_empty(), "no golden trace selected");
    let check = std::env::var("RESERVOIR_GOLDEN_CHECK").is_ok_and(|v| v == "1");
    let r = run_suite(&golden_dir(), &names, &keys, TorchRelease::NEWEST, check);
    // Known divergences (tests/golden/KNOWN_DIVERGENCES.md) are reported,
    // not failed; anything else that differs fails, and so does a listed
    // trace that now matches (the list must shrink as fixes land).
    let (failed, fixed) = against_known(&r, &names, &known_divergences());
    eprintln!(
        "golden: {} of {} traces match PyTorch exactly; {} differ as listed in KNOWN_DIVERGENCES.md",
        names.len() - r.failed.len(),
        names.len(),
        r.failed.len() - failed.len()
    );
    assert!(
        fixed.is_empty(),
        "these traces now match PyTorch: remove them from tests/golden/KNOWN_DIVERGENCES.md: {fixed:?}"
    );
    if !failed.is_empty() {
        panic!(
            "{}",
            failure_message("golden traces", &r, &failed, names.len(), details())
        );
    }
}

/// The release folders of `tests/golden/releases` (`2.11`, ... as named by
/// their folders), oldest first.
fn release_dirs() -> Vec<(TorchRelease, PathBuf)> {
    let root = golden_dir().join("releases");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Vec::new();
    };
    let mut dirs: Vec<(TorchRelease, PathBuf)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            let release = TorchRelease::from_version(&name)
                .unwrap_or_else(|| panic!("{}: not a supported torch release", p.display()));
            (release, p)
        })
        .collect();
    dirs.sort();
    dirs
}

/// The goldens of every other supported release (`tests/golden/releases/<release>/`,
/// made by `tools/regen-release-goldens.sh` with that release's oracle):
/// every trace of the manifest, replayed in the PyTorch mode of the release,
/// must match. `RESERVOIR_GOLDEN_RELEASE=2.13[,2.12]` checks only those.
/// This is the test of each rule of `ReleaseRules` (docs/replay-fidelity.md,
/// "PyTorch releases", names the golden that shows each):
/// `expandable_oom_advice` (the OOM tails of the expandable goldens of 2.13
/// and 2.14), `expandable_oversize_released_unmapped` (`huge-004` op 19 and
/// the device calls of 2.13/2.14's `oom-*`), `stat_num_oom_rejections`
/// (2.11's `stats_keys.json`).
#[test]
fn release_goldens_match_pytorch() {
    let keys = load_stats_keys();
    let manifest: Vec<String> = load_manifest().into_iter().map(|(s, _)| s.name).collect();
    let wanted = std::env::var("RESERVOIR_GOLDEN_RELEASE").unwrap_or_default();
    let check = std::env::var("RESERVOIR_GOLDEN_CHECK").is_ok_and(|v| v == "1");
    let mut problems = Vec::new();
    for (release, dir) in release_dirs() {
        if !wanted.is_empty()
            && !wanted
                .split(',')
                .any(|w| TorchRelease::from_version(w) == Some(release))
        {
            continue;
        }
        // The stats key set of the release is the rule table's.
        let rel_keys = load_json(&dir.join("stats_keys.json")).unwrap();
        let rel_keys: Vec<String> = rel_keys["keys"]
            .as_array()
            .expect("stats_keys.json: keys")
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            rel_keys,
            release_keys(&keys, release),
            "{}: the memory_stats() keys of torch {release} differ from ReleaseRules's",
            dir.display()
        );
        let present: BTreeSet<String> = std::fs::read_dir(dir.join("traces"))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_string_lossy()
                    .strip_suffix(".json")
                    .map(str::to_string)
            })
            .collect();
        for p in &present {
            assert!(
                manifest.contains(p),
                "{}: {p}.json is not a trace of the manifest",
                dir.display()
            );
        }
        let names: Vec<String> = manifest
            .iter()
            .filter(|n| present.contains(*n) && selected(n))
            .cloned()
            .collect();
        let r = run_suite(&dir, &names, &keys, release, check);
        // As for tests/golden: the release's KNOWN_DIVERGENCES.md lists the
        // goldens that differ (reported, not failed); a listed one that now
        // matches fails.
        let (failed, fixed) = against_known(&r, &names, &known_divergences_in(&dir));
        eprintln!(
            "golden {release}: {} of {} traces match PyTorch {release} exactly (replayed as \
             pytorch-{release}; {} differ as listed in its KNOWN_DIVERGENCES.md; the release has \
             goldens for {} of the manifest's {} traces)",
            names.len() - r.failed.len(),
            names.len(),
            r.failed.len() - failed.len(),
            present.len(),
            manifest.len()
        );
        if !fixed.is_empty() {
            problems.push(format!(
                "these torch {release} goldens now match: remove them from {}: {fixed:?}",
                dir.join("KNOWN_DIVERGENCES.md").display()
            ));
        }
        if !failed.is_empty() {
            problems.push(failure_message(
                &format!("torch {release} golden traces"),
                &r,
                &failed,
                names.len(),
                details(),
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Hand-made traces (ones the generator cannot make) checked against the
/// oracle: every `<name>.txt` with a golden `<name>.json` (made by
/// `tools/make_extra_golden.py`) in `tests/golden/extra`, or in the folder
/// `RESERVOIR_GOLDEN_EXTRA` names, must match. The committed ones
/// (`tools/gen_stream_order_traces.py`) pin the order in which cross-stream
/// frees complete with up to 31 streams.
#[test]
fn extra_traces_match_pytorch() {
    let dir = std::env::var("RESERVOIR_GOLDEN_EXTRA")
        .map(PathBuf::from)
        .unwrap_or_else(|_| golden_dir().join("extra"));
    let keys = load_stats_keys();
    let check = std::env::var("RESERVOIR_GOLDEN_CHECK").is_ok_and(|v| v == "1");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt") && p.with_extension("json").exists())
        .collect();
    names.sort();
    let mut failed = Vec::new();
    for path in &names {
        let text = std::fs::read_to_string(path).unwrap();
        let trace = Trace::parse(&text).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
        let g = load_golden_at(&path.with_extension("json"), &keys)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!(
            "golden extra: {} replayed as pytorch-{} (its torch field)",
            path.display(),
            g.release
        );
        if let Verdict::Fail(report, _) = run_trace(&g, &trace, check) {
            eprintln!("{report}");
            failed.push(path.display().to_string());
        }
    }
    eprintln!(
        "golden extra: {} of {} traces match PyTorch exactly",
        names.len() - failed.len(),
        names.len()
    );
    assert!(failed.is_empty(), "differ from PyTorch: {failed:?}");
}

/// Names listed in `tests/golden/KNOWN_DIVERGENCES.md` (lines `- name: cause`).
fn known_divergences() -> std::collections::BTreeSet<String> {
    known_divergences_in(&golden_dir())
}

/// Names listed in `dir/KNOWN_DIVERGENCES.md` (lines `- name: cause`).
fn known_divergences_in(dir: &Path) -> std::collections::BTreeSet<String> {
    let path = dir.join("KNOWN_DIVERGENCES.md");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.strip_prefix("- "))
        .filter_map(|l| l.split(':').next())
        .map(|n| n.trim().to_string())
        .collect()
}

/// The committed goldens were made from exactly the generator's current
/// golden list, and every one of them exists.
#[test]
fn manifest_matches_generator() {
    let manifest = load_manifest();
    let specs = golden_specs();
    let mut problems = Vec::new();
    if manifest.len() != specs.len() {
        problems.push(format!(
            "the manifest has {} specs, golden_specs() {}",
            manifest.len(),
            specs.len()
        ));
    }
    for (spec, fp) in &manifest {
        match specs.iter().find(|s| s.name == spec.name) {
            None => problems.push(format!("{}: not in golden_specs()", spec.name)),
            Some(s) if s != spec => {
                problems.push(format!("{}: spec differs: {s:?} vs {spec:?}", spec.name))
            }
            Some(s) => {
                if *fp != Some(s.trace().fingerprint()) {
                    problems.push(format!("{}: trace fingerprint differs", spec.name));
                }
            }
        }
        if !golden_dir()
            .join("traces")
            .join(format!("{}.json", spec.name))
            .exists()
        {
            problems.push(format!("{}: golden file missing", spec.name));
        }
    }
    assert!(
        problems.is_empty(),
        "goldens are out of date (run tools/regen-goldens.sh):\n{}",
        problems.join("\n")
    );
}

/// The normalization of virtual-memory calls pairs PyTorch's per-page calls.
#[test]
fn oracle_call_normalization() {
    let c = |op: usize, call: &str, size: u64, error: u64| Call {
        op: Some(op),
        call: call.into(),
        size,
        error,
    };
    let rows = vec![
        c(0, "reserve", 100, 0),
        c(0, "create", 20, 0),
        c(0, "create", 20, 0),
        c(0, "map", 20, 0),
        c(0, "map", 20, 0),
        c(1, "create", 20, 0),
        c(1, "create", 20, 2),
        c(1, "release", 20, 0),
        c(2, "unmap", 20, 0),
        c(2, "release", 20, 0),
        c(2, "unmap", 20, 0),
        c(2, "release", 20, 0),
        c(2, "addr_free", 100, 0),
        c(3, "alloc", 40, 2),
        c(3, "alloc", 40, 2),
    ];
    let n = normalize_oracle_calls(&rows);
    assert_eq!(
        n,
        vec![
            c(0, "reserve", 100, 0),
            c(0, "map", 40, 0),
            c(1, "map", 0, 2),
            c(2, "unmap", 40, 0),
            c(2, "addr_free", 100, 0),
            c(3, "alloc", 40, 2),
            c(3, "alloc", 40, 2),
        ]
    );
}
