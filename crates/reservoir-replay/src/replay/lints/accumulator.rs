//! What the lint pass accumulates from the allocator's events (the trace
//! entries a trace tracker copies into an [`EventBuffer`]): the active
//! blocks with their stream, pool, site and rounding loss, the stranded
//! bytes of each stream, the idle bytes of each private pool and the frees
//! that waited for their streams; then the [`Lint`]s they add up to.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;

use super::{just_above, Lint, LintKind, LintSite, TOP_PER_KIND, TOP_SITES};
use reservoir::backend::StreamId;
use reservoir::caching::rules;
use reservoir::config::AllocatorConfig;
use reservoir::format::format_size;
use reservoir::observe::trace::{TraceAction, TraceEntry};

/// An active block (allocated, or freed and waiting for its streams).
#[derive(Clone, Debug)]
struct Block {
    size: u64,
    stream: StreamId,
    pool: (i64, i64),
    site: u32,
    request: u64,
    loss: u64,
}

#[derive(Clone, Debug, Default)]
struct StreamAcc {
    reserved: u64,
    active: u64,
    /// Peak stranded bytes, the op, the stream that allocated then.
    peak: u64,
    peak_op: u64,
    peak_by: Option<String>,
    /// Bytes and allocations by site on this stream.
    by_site: FxHashMap<u32, (u64, u64)>,
}

#[derive(Clone, Debug, Default)]
struct PoolAcc {
    reserved: u64,
    active: u64,
    peak: u64,
    peak_op: u64,
    by_site: FxHashMap<u32, (u64, u64)>,
}

#[derive(Clone, Debug, Default)]
struct DelaySite {
    bytes: u64,
    blocks: u64,
}

#[derive(Clone, Debug, Default)]
struct SiteLoss {
    bytes: u64,
    count: u64,
    /// Live allocations by request size.
    requests: FxHashMap<u64, u64>,
}

/// What the pass accumulates from the allocator's events.
#[derive(Debug)]
pub(crate) struct Accumulator {
    config: AllocatorConfig,
    site_names: Vec<String>,
    site_index: FxHashMap<String, u32>,
    blocks: FxHashMap<u64, Block>,
    streams: BTreeMap<StreamId, StreamAcc>,
    pools: BTreeMap<(i64, i64), PoolAcc>,
    /// Freed blocks waiting: address -> op of the request and the
    /// allocations run before it.
    pending: FxHashMap<u64, (u64, u64)>,
    /// Allocation ops run so far.
    allocs_done: u64,
    /// Stranded bytes noted before the current allocation, by stream.
    candidates: Vec<(StreamId, u64)>,
    /// The stream of the current allocation.
    candidate_by: String,
    pending_bytes: u64,
    pending_peak: u64,
    pending_peak_op: u64,
    delayed_blocks: u64,
    delayed_bytes: u64,
    delay_ops_total: u64,
    delay_ops_max: u64,
    /// Delayed until the end of the trace (never completed).
    delayed_to_end: u64,
    delayed_by_site: FxHashMap<u32, DelaySite>,
    live_loss: FxHashMap<u32, SiteLoss>,
    loss_at_peak: Option<(u64, Vec<(u32, SiteLoss)>)>,
}

/// Plain copy of the fields of a trace entry the lints read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Event {
    action: TraceAction,
    addr: u64,
    size: u64,
    stream: StreamId,
    pool: (i64, i64),
}

impl Event {
    fn of(e: &TraceEntry) -> Event {
        Event {
            action: e.action,
            addr: e.addr,
            size: e.size,
            stream: e.stream,
            pool: e.pool_id.unwrap_or((0, 0)),
        }
    }
}

/// A buffer a trace tracker fills, drained after each op.
pub(crate) type EventBuffer = Arc<Mutex<Vec<Event>>>;

/// A trace tracker filling `buf`.
pub(crate) fn tracker(buf: &EventBuffer) -> reservoir::caching::TraceTracker {
    let buf = Arc::clone(buf);
    Arc::new(move |e: &TraceEntry| {
        if let Ok(mut b) = buf.lock() {
            b.push(Event::of(e));
        }
    })
}

/// The events of `buf` so far, emptied.
#[cfg(test)]
pub(crate) fn drain(buf: &EventBuffer) -> Vec<Event> {
    buf.lock()
        .map(|mut b| std::mem::take(&mut *b))
        .unwrap_or_default()
}

impl Accumulator {
    /// The streams seen so far, in order.
    pub(super) fn stream_ids(&self) -> impl Iterator<Item = StreamId> + '_ {
        self.streams.keys().copied()
    }

    pub(crate) fn new(config: AllocatorConfig) -> Self {
        Accumulator {
            config,
            site_names: Vec::new(),
            site_index: FxHashMap::default(),
            blocks: FxHashMap::default(),
            streams: BTreeMap::new(),
            pools: BTreeMap::new(),
            pending: FxHashMap::default(),
            allocs_done: 0,
            candidates: Vec::new(),
            candidate_by: String::new(),
            pending_bytes: 0,
            pending_peak: 0,
            pending_peak_op: 0,
            delayed_blocks: 0,
            delayed_bytes: 0,
            delay_ops_total: 0,
            delay_ops_max: 0,
            delayed_to_end: 0,
            delayed_by_site: FxHashMap::default(),
            live_loss: FxHashMap::default(),
            loss_at_peak: None,
        }
    }

    fn site(&mut self, name: &str) -> u32 {
        if let Some(&k) = self.site_index.get(name) {
            return k;
        }
        let k = self.site_names.len() as u32;
        self.site_names.push(name.to_string());
        self.site_index.insert(name.to_string(), k);
        k
    }

    /// A segment of `size` bytes already reserved on `stream` in `pool`.
    pub(crate) fn seed_segment(&mut self, stream: StreamId, pool: (i64, i64), size: u64) {
        self.streams.entry(stream).or_default().reserved += size;
        if pool != (0, 0) {
            self.pools.entry(pool).or_default().reserved += size;
        }
    }

    /// A block already active at `addr` (allocated before the pass).
    pub(crate) fn seed_block(&mut self, addr: u64, block: NewBlock<'_>) {
        self.add_block(addr, block);
    }

    fn add_block(&mut self, addr: u64, b: NewBlock<'_>) {
        let site = self.site(b.site);
        let loss = match b.request {
            Some(r) if b.size > 0 => rules::round_size(r, &self.config).saturating_sub(r),
            _ => 0,
        };
        let request = b.request.unwrap_or(b.size);
        let s = self.streams.entry(b.stream).or_default();
        s.active += b.size;
        let e = s.by_site.entry(site).or_default();
        e.0 += b.size;
        e.1 += 1;
        if b.pool != (0, 0) {
            let p = self.pools.entry(b.pool).or_default();
            p.active += b.size;
            let e = p.by_site.entry(site).or_default();
            e.0 += b.size;
            e.1 += 1;
        }
        if loss > 0 {
            let l = self.live_loss.entry(site).or_default();
            l.bytes += loss;
            l.count += 1;
            *l.requests.entry(request).or_default() += 1;
        }
        self.blocks.insert(
            addr,
            Block {
                size: b.size,
                stream: b.stream,
                pool: b.pool,
                site,
                request,
                loss,
            },
        );
    }

    /// Before allocation op `op` on `stream`: the bytes stranded on every
    /// other stream whose last allocation (`last_alloc`) came before, kept
    /// until [`op_events`](Self::op_events) says whether the allocation had
    /// to reserve more (or failed): only then did they cost memory.
    /// `stream` is `None` for a stream not seen before; `by` names it.
    pub(crate) fn before_alloc(
        &mut self,
        op: u64,
        stream: Option<StreamId>,
        by: impl Fn() -> String,
        last_alloc: impl Fn(StreamId) -> Option<u64>,
    ) {
        self.candidates.clear();
        for (&s, acc) in self.streams.iter() {
            if Some(s) == stream || last_alloc(s).is_some_and(|l| l >= op) {
                continue;
            }
            let free = acc.reserved.saturating_sub(acc.active);
            if free > acc.peak {
                self.candidates.push((s, free));
            }
        }
        if !self.candidates.is_empty() {
            self.candidate_by = by();
        }
    }

    /// The events of op `op`; `alloc` is the allocation it made, if any
    /// (its site, request and block size).
    /// `alloc_op` says whether the op was an allocation.
    pub(crate) fn op_events(
        &mut self,
        op: u64,
        events: &[Event],
        alloc_op: bool,
        alloc: Option<(&str, u64, u64)>,
    ) {
        let mut served = false;
        let mut grew = false;
        for e in events {
            match e.action {
                TraceAction::SegmentAlloc | TraceAction::SegmentMap => {
                    grew = true;
                    self.seed_segment(e.stream, e.pool, e.size);
                }
                TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                    let s = self.streams.entry(e.stream).or_default();
                    s.reserved = s.reserved.saturating_sub(e.size);
                    if e.pool != (0, 0) {
                        let p = self.pools.entry(e.pool).or_default();
                        p.reserved = p.reserved.saturating_sub(e.size);
                    }
                }
                TraceAction::Alloc => {
                    served = true;
                    if let Some((site, request, size)) = alloc {
                        self.add_block(
                            e.addr,
                            NewBlock {
                                size,
                                stream: e.stream,
                                pool: e.pool,
                                site,
                                request: Some(request),
                            },
                        );
                    }
                }
                TraceAction::FreeRequested => {
                    if let Some(b) = self.blocks.get(&e.addr) {
                        let (site, loss, request) = (b.site, b.loss, b.request);
                        self.pending.insert(e.addr, (op, self.allocs_done));
                        self.pending_bytes += b.size;
                        if loss > 0 {
                            if let Some(l) = self.live_loss.get_mut(&site) {
                                l.bytes -= loss;
                                l.count -= 1;
                                if let Some(c) = l.requests.get_mut(&request) {
                                    *c -= 1;
                                    if *c == 0 {
                                        l.requests.remove(&request);
                                    }
                                }
                            }
                        }
                    }
                }
                TraceAction::FreeCompleted => {
                    if let Some(b) = self.blocks.remove(&e.addr) {
                        if let Some(s) = self.streams.get_mut(&b.stream) {
                            s.active = s.active.saturating_sub(b.size);
                        }
                        if b.pool != (0, 0) {
                            if let Some(p) = self.pools.get_mut(&b.pool) {
                                p.active = p.active.saturating_sub(b.size);
                            }
                        }
                        if let Some((req, allocs)) = self.pending.remove(&e.addr) {
                            self.pending_bytes -= b.size;
                            // Delayed when an allocation ran while it waited.
                            if self.allocs_done > allocs {
                                self.delayed(b.site, b.size, op - req);
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        if alloc_op {
            // Bytes still waiting after an allocation completed what it could.
            if self.pending_bytes > self.pending_peak {
                self.pending_peak = self.pending_bytes;
                self.pending_peak_op = op;
            }
            if grew || !served {
                for &(s, free) in &self.candidates {
                    if let Some(acc) = self.streams.get_mut(&s) {
                        if free > acc.peak {
                            acc.peak = free;
                            acc.peak_op = op;
                            acc.peak_by = Some(self.candidate_by.clone());
                        }
                    }
                }
            }
            self.candidates.clear();
            self.allocs_done += 1;
        }
        for p in self.pools.values_mut() {
            let idle = p.reserved.saturating_sub(p.active);
            if idle > p.peak {
                p.peak = idle;
                p.peak_op = op;
            }
        }
    }

    fn delayed(&mut self, site: u32, size: u64, ops: u64) {
        self.delayed_blocks += 1;
        self.delayed_bytes += size;
        self.delay_ops_total += ops;
        self.delay_ops_max = self.delay_ops_max.max(ops);
        let d = self.delayed_by_site.entry(site).or_default();
        d.bytes += size;
        d.blocks += 1;
    }

    /// The state is the reserved peak's: keep the rounding losses of the
    /// live allocations.
    pub(crate) fn at_peak(&mut self, op: u64) {
        let mut v: Vec<(u32, SiteLoss)> = self
            .live_loss
            .iter()
            .filter(|(_, l)| l.bytes > 0)
            .map(|(&k, l)| (k, l.clone()))
            .collect();
        v.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(&b.0)));
        self.loss_at_peak = Some((op, v));
    }

    /// The trace ended after `ops` ops: blocks still waiting count as
    /// delayed to the end.
    pub(crate) fn finish(&mut self, ops: u64) {
        let mut waiting: Vec<(u64, (u64, u64))> = self.pending.drain().collect();
        waiting.sort_unstable();
        for (addr, (req, allocs)) in waiting {
            match self.blocks.get(&addr) {
                Some(b) if self.allocs_done > allocs => {
                    let (site, size) = (b.site, b.size);
                    self.delayed_to_end += 1;
                    self.delayed(site, size, ops.saturating_sub(req));
                }
                _ => {}
            }
        }
    }

    fn site_name(&self, k: u32) -> String {
        self.site_names[k as usize].clone()
    }

    fn top_sites(&self, by: &FxHashMap<u32, (u64, u64)>) -> Vec<LintSite> {
        let mut v: Vec<_> = by.iter().map(|(&k, &(b, c))| (k, b, c)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.into_iter()
            .take(TOP_SITES)
            .map(|(k, bytes, count)| LintSite {
                site: self.site_name(k),
                bytes,
                count,
                request: None,
            })
            .collect()
    }

    /// The lints of the pass, at `threshold` bytes or more; `name` names a
    /// stream.
    pub(crate) fn lints(
        &self,
        threshold: u64,
        name: impl Fn(StreamId) -> String,
        last_alloc: impl Fn(StreamId) -> Option<u64>,
        setting_config: &str,
    ) -> Vec<Lint> {
        let mut out = Vec::new();
        // Stranded bytes, largest first.
        let mut stranded: Vec<(&StreamId, &StreamAcc)> = self
            .streams
            .iter()
            .filter(|(_, a)| a.peak >= threshold)
            .collect();
        stranded.sort_by(|a, b| b.1.peak.cmp(&a.1.peak).then(a.0.cmp(b.0)));
        for (&s, a) in stranded.into_iter().take(TOP_PER_KIND) {
            let stream = name(s);
            let last = match last_alloc(s) {
                Some(l) => format!("after its last allocation (op {l})"),
                None => "which allocates nothing in the trace".to_string(),
            };
            let by = a.peak_by.clone().unwrap_or_default();
            out.push(Lint {
                kind: LintKind::StrandedStream,
                bytes: a.peak,
                op: Some(a.peak_op),
                stream: Some(stream.clone()),
                pool: None,
                ops: None,
                detail: format!(
                    "{} cached free on stream {stream} {last} when stream {by} had to \
                     reserve more at op {}: cached blocks serve their own stream only",
                    format_size(a.peak),
                    a.peak_op
                ),
                sites: self.top_sites(&a.by_site),
                fix: match last_alloc(s) {
                    Some(l) => format!(
                        "call torch.cuda.empty_cache() after stream {stream}'s last use \
                         (op {l}), or allocate these tensors on stream {by} (the stream that \
                         goes on allocating) and hand them to stream {stream} with record_stream"
                    ),
                    None => format!(
                        "call torch.cuda.empty_cache() once stream {stream} is done with its memory"
                    ),
                },
            });
        }
        // Delayed frees.
        if self.pending_peak >= threshold {
            out.push(self.delayed_lint());
        }
        // Idle private pools.
        let mut pools: Vec<_> = self
            .pools
            .iter()
            .filter(|(_, p)| p.peak >= threshold)
            .collect();
        pools.sort_by(|a, b| b.1.peak.cmp(&a.1.peak).then(a.0.cmp(b.0)));
        for (&id, p) in pools.into_iter().take(TOP_PER_KIND) {
            out.push(Lint {
                kind: LintKind::IdlePool,
                bytes: p.peak,
                op: Some(p.peak_op),
                stream: None,
                pool: Some(id),
                ops: None,
                detail: format!(
                    "private pool ({}, {}) held {} reserved but not allocated (after op {})",
                    id.0,
                    id.1,
                    format_size(p.peak),
                    p.peak_op
                ),
                sites: self.top_sites(&p.by_site),
                fix: "release the pool when its graph or MemPool is done \
                      (torch._C._cuda_releasePool / drop the MemPool and call \
                      torch.cuda.empty_cache()), or share one pool between graphs \
                      (graph_pool_handle())"
                    .to_string(),
            });
        }
        // Rounding.
        if let Some((op, sites)) = &self.loss_at_peak {
            let total: u64 = sites.iter().map(|s| s.1.bytes).sum();
            if total >= threshold {
                out.push(self.rounding_lint(*op, total, sites, setting_config));
            }
        }
        out
    }

    /// The delayed-free lint: blocks whose free waited for the streams
    /// recorded with `record_stream`.
    fn delayed_lint(&self) -> Lint {
        let mut by: Vec<_> = self.delayed_by_site.iter().collect();
        by.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(b.0)));
        let sites = by
            .into_iter()
            .take(TOP_SITES)
            .map(|(&k, d)| LintSite {
                site: self.site_name(k),
                bytes: d.bytes,
                count: d.blocks,
                request: None,
            })
            .collect();
        let mean = self.delay_ops_total / self.delayed_blocks.max(1);
        let mut detail = format!(
            "{} blocks ({}) waited for the streams recorded with record_stream before \
             returning to the cache: {} ops on average, {} at most; up to {} waited at \
             once (after op {})",
            self.delayed_blocks,
            format_size(self.delayed_bytes),
            mean,
            self.delay_ops_max,
            format_size(self.pending_peak),
            self.pending_peak_op
        );
        if self.delayed_to_end > 0 {
            detail.push_str(&format!(
                "; {} were still waiting at the end",
                self.delayed_to_end
            ));
        }
        Lint {
            kind: LintKind::DelayedFree,
            bytes: self.pending_peak,
            op: Some(self.pending_peak_op),
            stream: None,
            pool: None,
            ops: Some(self.delay_ops_max),
            detail,
            sites,
            fix: "free the tensor after the consumer stream's work is done (e.g. \
                  torch.cuda.current_stream().wait_stream(consumer) or an event \
                  synchronize before del), or allocate it on the consumer stream \
                  so no record_stream is needed"
                .to_string(),
        }
    }

    fn rounding_lint(
        &self,
        op: u64,
        total: u64,
        sites: &[(u32, SiteLoss)],
        setting_config: &str,
    ) -> Lint {
        let top: Vec<LintSite> = sites
            .iter()
            .take(TOP_SITES)
            .map(|(k, l)| {
                let loss = |r: u64| rules::round_size(r, &self.config) - r;
                let request = l
                    .requests
                    .iter()
                    .max_by_key(|(&r, &c)| (loss(r) * c, std::cmp::Reverse(r)))
                    .map(|(&r, _)| r);
                LintSite {
                    site: self.site_name(*k),
                    bytes: l.bytes,
                    count: l.count,
                    request,
                }
            })
            .collect();
        let mut fixes = Vec::new();
        let mut detail = format!(
            "{} of the blocks live at the reserved peak (op {op}) is rounding (spec 1.3: \
             rounded size minus request)",
            format_size(total)
        );
        if let Some(first) = top.first() {
            if let Some(r) = first.request {
                let rounded = rules::round_size(r, &self.config);
                detail.push_str(&format!(
                    "; the largest, {}, asks {} ({} B), rounded to {}",
                    first.site,
                    format_size(r),
                    r,
                    format_size(rounded)
                ));
                if let Some(below) = just_above(r, &self.config) {
                    detail.push_str(&format!(", just above the boundary {}", format_size(below)));
                    fixes.push(format!(
                        "trim {}'s request to {} ({} B) to save {} per allocation",
                        first.site,
                        format_size(below),
                        below,
                        format_size(rounded - below)
                    ));
                }
            }
        }
        if setting_config.contains("roundup_power2_divisions") {
            fixes.push(
                "more roundup_power2_divisions (finer steps) or none in this size range"
                    .to_string(),
            );
        } else {
            fixes.push("pad or trim the requests to a multiple of 512 bytes".to_string());
        }
        Lint {
            kind: LintKind::Rounding,
            bytes: total,
            op: Some(op),
            stream: None,
            pool: None,
            ops: None,
            detail,
            sites: top,
            fix: fixes.join("; or "),
        }
    }
}

/// A block to note: its size, stream, pool, site and request.
pub(crate) struct NewBlock<'a> {
    pub(crate) size: u64,
    pub(crate) stream: StreamId,
    pub(crate) pool: (i64, i64),
    pub(crate) site: &'a str,
    pub(crate) request: Option<u64>,
}
