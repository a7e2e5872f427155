//! The order in which PyTorch walks its per-stream event queues.
//!
//! PyTorch keeps the end-of-life events of cross-stream frees in
//! `ska::flat_hash_map<cuda::CUDAStream, std::deque<(Event, Block*)>>
//! cuda_events` and walks it in *slot order* in `process_events` and
//! `synchronize_and_free_events`. Which stream's queue is reaped first decides
//! the order of `free_block` calls, hence merges and the `inactive_split`
//! lifetime counters. The order of the streams a block was used on
//! (`stream_uses`, a `ska::flat_hash_set<cuda::CUDAStream>`) decides the order
//! in which `insert_events` creates map entries, which moves entries around
//! on collisions. Both are reproduced here exactly:
//!
//! * key hash: `std::hash<CUDAStream>` = `c10::Stream::hash()` =
//!   `device_type << 56 | device_index << 48 | (stream_id & (2^48 - 1))`
//!   (`std::hash<uint64_t>` is the identity in libstdc++; `DeviceType::CUDA`
//!   is 1);
//! * c10 stream ids (`c10/cuda/CUDAStream.cpp`, note "StreamId assignment"):
//!   0 for the default stream; a pool stream is
//!   `index << 5 | (priority_index + 1) << 1 | 1` with `index` handed out round
//!   robin over 32 streams per priority (`torch.cuda.Stream()` = priority 0 =
//!   `priority_index` 0, so the n-th stream created is `(n % 32) << 5 | 3`); an
//!   external stream's id is its `cudaStream_t` pointer;
//! * the table (`c10/util/flat_hash_map.h`, Malte Skarupke's
//!   `sherwood_v3_table`): robin-hood open addressing without wrap-around
//!   (`max_lookups` spare slots after the power-of-two slot array, then a
//!   sentinel), fibonacci hashing (`(11400714819323198485 * hash) >> shift`,
//!   `shift = 64 - log2(slots)`), `max_load_factor` 0.5, growth to
//!   `max(4, 2 * slots)` when the load would pass it or a probe reaches
//!   `max_lookups = max(4, log2(slots))`, rehash by re-inserting the old slots
//!   in order, erase by backward shift, no shrinking (neither `erase` nor
//!   `clear` gives slots back).
//!
//! `FlatHashTable` is that table; `StreamTable` keys it by [`StreamId`]
//! with the hash from `C10Streams::hash`. The same table orders the private
//! pools `release_cached_blocks` frees (`graph_pools_freeable`, `MempoolSet`).

use std::collections::BTreeMap;

use crate::backend::StreamId;
use crate::ids::MempoolId;

/// `c10::DeviceType::CUDA`.
const DEVICE_TYPE_CUDA: u64 = 1;
/// `kStreamsPerPoolBits`.
const STREAMS_PER_POOL_BITS: u32 = 5;
/// `kStreamTypeBits`.
const STREAM_TYPE_BITS: u32 = 4;
/// `ska::detailv3::min_lookups`.
const MIN_LOOKUPS: i8 = 4;
/// 2^64 / golden ratio (`fibonacci_hash_policy`).
const FIBONACCI: u64 = 11400714819323198485;

/// The c10 stream id of the pool stream `index` (taken modulo 32, as c10's
/// round robin does) of priority index `priority_index` (0 for
/// `torch.cuda.Stream()`'s default priority 0, 1 for priority -1, ...).
pub fn c10_pool_stream_id(priority_index: u8, index: u32) -> i64 {
    let index = i64::from(index % (1 << STREAMS_PER_POOL_BITS));
    (index << (STREAM_TYPE_BITS + 1)) | (i64::from(priority_index + 1) << 1) | 1
}

/// `std::hash<c10::cuda::CUDAStream>` of the stream with c10 id `id` on CUDA
/// device `device`.
pub fn c10_stream_hash(device: i8, id: i64) -> u64 {
    // static_cast<uint64_t>(DeviceIndex) sign-extends, as the C++ does.
    (DEVICE_TYPE_CUDA << 56) | ((device as i64 as u64) << 48) | (id as u64 & ((1u64 << 48) - 1))
}

/// The c10 ids of a device's streams, for hashing.
///
/// Without an explicit id, `StreamId(0)` is the default stream (id 0) and
/// `StreamId(n)` the n-th stream taken from the default-priority pool
/// (`c10_pool_stream_id(0, n - 1)`), which is what c10 hands out when streams
/// are created in the order of their ids.
#[derive(Clone, Debug, Default)]
pub(crate) struct C10Streams {
    device: i8,
    ids: BTreeMap<StreamId, i64>,
}

impl C10Streams {
    pub fn new(device: i8) -> Self {
        C10Streams {
            device,
            ids: BTreeMap::new(),
        }
    }

    pub fn set_id(&mut self, stream: StreamId, id: i64) {
        self.ids.insert(stream, id);
    }

    pub fn id(&self, stream: StreamId) -> i64 {
        match self.ids.get(&stream) {
            Some(&id) => id,
            None if stream.0 == 0 => 0,
            None => c10_pool_stream_id(0, ((stream.0 - 1) % 32) as u32),
        }
    }

    pub fn hash(&self, stream: StreamId) -> u64 {
        c10_stream_hash(self.device, self.id(stream))
    }
}

#[derive(Clone, Debug)]
struct Slot<K, V> {
    /// `distance_from_desired`: -1 empty, 0 at its home slot (or the sentinel).
    dist: i8,
    entry: Option<(K, u64, V)>,
}

impl<K, V> Slot<K, V> {
    fn empty() -> Self {
        Slot {
            dist: -1,
            entry: None,
        }
    }
    fn sentinel() -> Self {
        Slot {
            dist: 0,
            entry: None,
        }
    }
}

/// `ska::flat_hash_map<K, V>` with fibonacci hashing, reproducing its slot
/// layout (and so its iteration order) exactly; the caller passes each key's
/// `std::hash` value. Positions returned by [`first`](Self::first) /
/// [`next`](Self::next) / [`erase_at`](Self::erase_at) are slot indices,
/// stable until the next insertion.
#[derive(Clone, Debug)]
pub(crate) struct FlatHashTable<K, V> {
    /// `num_slots_minus_one + max_lookups` slots, then the sentinel.
    slots: Vec<Slot<K, V>>,
    num_slots_minus_one: u64,
    shift: u32,
    max_lookups: i8,
    len: usize,
}

/// PyTorch's `cuda_events` (per-stream event queues).
pub(crate) type StreamTable<V> = FlatHashTable<StreamId, V>;

impl<K: Copy + Eq, V> Default for FlatHashTable<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

/// `ska::detailv3::log2` (floor of log2, for non-zero values).
fn log2(v: u64) -> i8 {
    (63 - v.leading_zeros()) as i8
}

impl<K: Copy + Eq, V> FlatHashTable<K, V> {
    /// The empty table (`empty_default_table`: 3 empty slots and a sentinel).
    pub fn new() -> Self {
        let mut slots: Vec<Slot<K, V>> = (0..MIN_LOOKUPS - 1).map(|_| Slot::empty()).collect();
        slots.push(Slot::sentinel());
        FlatHashTable {
            slots,
            num_slots_minus_one: 0,
            shift: 63,
            max_lookups: MIN_LOOKUPS - 1,
            len: 0,
        }
    }

    #[allow(dead_code)] // complete map API; used by the tests
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `bucket_count()`.
    pub fn bucket_count(&self) -> u64 {
        if self.num_slots_minus_one == 0 {
            0
        } else {
            self.num_slots_minus_one + 1
        }
    }

    fn index_for_hash(&self, hash: u64) -> usize {
        (FIBONACCI.wrapping_mul(hash) >> self.shift) as usize
    }

    /// The value of `key`, inserting `make()` if absent (`operator[]` /
    /// `emplace`).
    pub fn get_or_insert_with(&mut self, key: K, hash: u64, make: impl FnOnce() -> V) -> &mut V {
        let pos = self.emplace(key, hash, make);
        &mut self.slots[pos].entry.as_mut().expect("just placed").2
    }

    /// Where `key` is, if present (`find`).
    #[allow(dead_code)] // complete map API; used by the tests
    pub fn find(&self, key: K, hash: u64) -> Option<usize> {
        let mut pos = self.index_for_hash(hash);
        let mut dist = 0i8;
        while self.slots[pos].dist >= dist {
            if let Some((k, _, _)) = &self.slots[pos].entry {
                if *k == key {
                    return Some(pos);
                }
            }
            pos += 1;
            dist += 1;
        }
        None
    }

    fn emplace(&mut self, key: K, hash: u64, make: impl FnOnce() -> V) -> usize {
        let mut pos = self.index_for_hash(hash);
        let mut dist = 0i8;
        while self.slots[pos].dist >= dist {
            if let Some((k, _, _)) = &self.slots[pos].entry {
                if *k == key {
                    return pos;
                }
            }
            pos += 1;
            dist += 1;
        }
        self.emplace_new_key(dist, pos, (key, hash, make()))
    }

    /// `emplace_new_key`: robin-hood insertion starting at `pos`.
    fn emplace_new_key(&mut self, mut dist: i8, mut pos: usize, entry: (K, u64, V)) -> usize {
        if self.num_slots_minus_one == 0
            || dist == self.max_lookups
            || (self.len + 1) as f64 > (self.num_slots_minus_one + 1) as f64 * 0.5
        {
            self.grow();
            return self.reinsert(entry);
        }
        if self.slots[pos].dist < 0 {
            self.slots[pos] = Slot {
                dist,
                entry: Some(entry),
            };
            self.len += 1;
            return pos;
        }
        // Take the richer slot's place and carry its entry on.
        let result = pos;
        let mut to_insert = entry;
        std::mem::swap(&mut dist, &mut self.slots[pos].dist);
        std::mem::swap(
            &mut to_insert,
            self.slots[pos].entry.as_mut().expect("occupied"),
        );
        dist += 1;
        pos += 1;
        loop {
            if self.slots[pos].dist < 0 {
                self.slots[pos] = Slot {
                    dist,
                    entry: Some(to_insert),
                };
                self.len += 1;
                return result;
            } else if self.slots[pos].dist < dist {
                std::mem::swap(&mut dist, &mut self.slots[pos].dist);
                std::mem::swap(
                    &mut to_insert,
                    self.slots[pos].entry.as_mut().expect("occupied"),
                );
                dist += 1;
            } else {
                dist += 1;
                if dist == self.max_lookups {
                    // As ska does: put the carried entry where the new key
                    // went (keeping that slot's distance), grow, insert the
                    // new key again.
                    std::mem::swap(
                        &mut to_insert,
                        self.slots[result].entry.as_mut().expect("occupied"),
                    );
                    self.grow();
                    return self.reinsert(to_insert);
                }
            }
            pos += 1;
        }
    }

    /// `emplace(std::move(value))` of an entry known to be absent.
    fn reinsert(&mut self, entry: (K, u64, V)) -> usize {
        let mut pos = self.index_for_hash(entry.1);
        let mut dist = 0i8;
        while self.slots[pos].dist >= dist {
            pos += 1;
            dist += 1;
        }
        self.emplace_new_key(dist, pos, entry)
    }

    /// `grow`: `rehash(max(4, 2 * bucket_count()))`.
    fn grow(&mut self) {
        self.rehash((2 * self.bucket_count()).max(4));
    }

    /// `rehash(num_buckets)` (only ever called to grow here).
    fn rehash(&mut self, num_buckets: u64) {
        let num_buckets = num_buckets.max((self.len as f64 / 0.5).ceil() as u64);
        // fibonacci_hash_policy::next_size_over
        let num_buckets = num_buckets.next_power_of_two().max(2);
        let shift = 64 - log2(num_buckets) as u32;
        if num_buckets == self.bucket_count() {
            return;
        }
        let max_lookups = log2(num_buckets).max(MIN_LOOKUPS);
        let total = num_buckets as usize + max_lookups as usize;
        let mut slots: Vec<Slot<K, V>> = (0..total - 1).map(|_| Slot::empty()).collect();
        slots.push(Slot::sentinel());
        let old = std::mem::replace(&mut self.slots, slots);
        self.num_slots_minus_one = num_buckets - 1;
        self.shift = shift;
        self.max_lookups = max_lookups;
        self.len = 0;
        for slot in old {
            if let Some(entry) = slot.entry {
                self.reinsert(entry);
            }
        }
    }

    /// The first occupied slot (`begin()`).
    pub fn first(&self) -> Option<usize> {
        if self.len == 0 {
            // Nothing to scan for (every malloc asks, usually of an empty map).
            return None;
        }
        self.occupied_from(0)
    }

    /// The next occupied slot after `pos` (`++it`).
    pub fn next(&self, pos: usize) -> Option<usize> {
        self.occupied_from(pos + 1)
    }

    fn occupied_from(&self, mut pos: usize) -> Option<usize> {
        while pos < self.slots.len() {
            if self.slots[pos].entry.is_some() {
                return Some(pos);
            }
            pos += 1;
        }
        None
    }

    /// The key at an occupied slot.
    #[allow(dead_code)] // complete map API; used by the tests
    pub fn key_at(&self, pos: usize) -> K {
        self.slots[pos].entry.as_ref().expect("occupied").0
    }

    /// The value at an occupied slot.
    pub fn value_at(&mut self, pos: usize) -> &mut V {
        &mut self.slots[pos].entry.as_mut().expect("occupied").2
    }

    /// `it = map.erase(it)`: remove the entry at `pos` by backward shift and
    /// return the position of the next entry of the iteration.
    pub fn erase_at(&mut self, pos: usize) -> Option<usize> {
        debug_assert!(self.slots[pos].entry.is_some());
        self.slots[pos] = Slot::empty();
        self.len -= 1;
        let mut cur = pos;
        while self.slots[cur + 1].dist > 0 {
            let next = std::mem::replace(&mut self.slots[cur + 1], Slot::empty());
            self.slots[cur] = Slot {
                dist: next.dist - 1,
                entry: next.entry,
            };
            cur += 1;
        }
        self.occupied_from(pos)
    }

    /// Remove every entry, keeping the slot count (`clear()`).
    #[allow(dead_code)] // complete map API; used by the tests
    pub fn clear(&mut self) {
        let n = self.slots.len();
        for slot in &mut self.slots[..n - 1] {
            *slot = Slot::empty();
        }
        self.len = 0;
    }

    /// Keys in iteration order.
    pub fn keys(&self) -> impl Iterator<Item = K> + '_ {
        self.slots
            .iter()
            .filter_map(|s| s.entry.as_ref().map(|e| e.0))
    }

    /// Values in iteration order.
    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.slots
            .iter()
            .filter_map(|s| s.entry.as_ref().map(|e| &e.2))
    }
}

/// PyTorch's `graph_pools_freeable`: a `ska::flat_hash_map<MempoolId_t,
/// PrivatePool*, MempoolIdHash>` whose hash is `id.first != 0 ? id.first :
/// id.second` (fibonacci-hashed like every ska table). `release_cached_blocks`
/// releases the freeable private pools in its slot order (FINDINGS.md 12).
#[derive(Clone, Debug, Default)]
pub(crate) struct MempoolSet {
    table: FlatHashTable<MempoolId, ()>,
}

/// `MempoolIdHash`.
fn mempool_hash(id: MempoolId) -> u64 {
    if id.0 != 0 {
        id.0
    } else {
        id.1
    }
}

impl MempoolSet {
    pub fn contains(&self, id: &MempoolId) -> bool {
        self.table.find(*id, mempool_hash(*id)).is_some()
    }

    pub fn insert(&mut self, id: MempoolId) {
        self.table.get_or_insert_with(id, mempool_hash(id), || ());
    }

    /// `erase(key)` (the same as erasing it at an iterator).
    pub fn remove(&mut self, id: &MempoolId) {
        if let Some(pos) = self.table.find(*id, mempool_hash(*id)) {
            self.table.erase_at(pos);
        }
    }

    /// The ids in iteration (slot) order.
    pub fn iter(&self) -> impl Iterator<Item = MempoolId> + '_ {
        self.table.keys()
    }
}

/// The streams of `uses` in the iteration order of a `ska::flat_hash_set`
/// built by inserting them in this order (a block's `stream_uses`).
pub(crate) fn stream_set_order(uses: &[StreamId], streams: &C10Streams) -> Vec<StreamId> {
    let mut set: StreamTable<()> = StreamTable::new();
    for &s in uses {
        set.get_or_insert_with(s, streams.hash(s), || ());
    }
    set.keys().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c10_ids() {
        assert_eq!(c10_pool_stream_id(0, 0), 3);
        assert_eq!(c10_pool_stream_id(0, 1), 35);
        assert_eq!(c10_pool_stream_id(0, 33), 35);
        assert_eq!(c10_pool_stream_id(1, 0), 5);
        let s = C10Streams::new(0);
        assert_eq!(s.id(StreamId(0)), 0);
        assert_eq!(s.id(StreamId(1)), 3);
        assert_eq!(s.id(StreamId(2)), 35);
        assert_eq!(c10_stream_hash(0, 3), (1 << 56) | 3);
        assert_eq!(
            c10_stream_hash(1, -2),
            (1 << 56) | (1 << 48) | ((1 << 48) - 2)
        );
    }

    fn hash_of(n: u64) -> u64 {
        C10Streams::new(0).hash(StreamId(n))
    }

    fn insert(t: &mut StreamTable<u32>, n: u64) {
        t.get_or_insert_with(StreamId(n), hash_of(n), || n as u32);
    }

    #[test]
    fn grows_at_half_load() {
        let mut t = StreamTable::new();
        assert_eq!(t.bucket_count(), 0);
        insert(&mut t, 0);
        assert_eq!(t.bucket_count(), 4);
        insert(&mut t, 1);
        assert_eq!(t.bucket_count(), 4);
        insert(&mut t, 2);
        assert_eq!(t.bucket_count(), 8);
        insert(&mut t, 2);
        assert_eq!(t.len(), 3);
        for n in 3..40 {
            insert(&mut t, n);
        }
        assert_eq!(t.len(), 40);
        for n in 0..40 {
            let p = t.find(StreamId(n), hash_of(n)).expect("present");
            assert_eq!(*t.value_at(p), n as u32);
        }
    }

    #[test]
    fn freeable_pools_in_torch_order() {
        // Measured on torch 2.15 (FINDINGS.md 12): MemPools (0, 1)..(0, n)
        // released, then one empty_cache frees their segments in this order.
        for (n, expect) in [
            (3, vec![2, 1, 3]),
            (6, vec![5, 2, 4, 1, 6, 3]),
            (9, vec![5, 2, 7, 4, 9, 1, 6, 3, 8]),
        ] {
            for reversed in [false, true] {
                let mut set = MempoolSet::default();
                let mut ids: Vec<u64> = (1..=n).collect();
                if reversed {
                    ids.reverse();
                }
                for i in ids {
                    set.insert(MempoolId(0, i));
                }
                let got: Vec<u64> = set.iter().map(|id| id.1).collect();
                assert_eq!(got, expect, "n = {n}, reversed = {reversed}");
            }
        }
        let mut set = MempoolSet::default();
        set.insert(MempoolId(0, 1));
        set.insert(MempoolId(0, 2));
        assert!(set.contains(&MempoolId(0, 2)));
        set.remove(&MempoolId(0, 2));
        assert!(!set.contains(&MempoolId(0, 2)));
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![MempoolId(0, 1)]);
    }

    #[test]
    fn iteration_is_slot_order_and_erase_keeps_it() {
        let mut t = StreamTable::new();
        for n in [3, 1, 4, 2, 5] {
            insert(&mut t, n);
        }
        let before: Vec<_> = t.keys().collect();
        // Each key sits at or after its home slot, homes ascending.
        let shift = t.shift;
        let homes: Vec<_> = before
            .iter()
            .map(|k| FIBONACCI.wrapping_mul(hash_of(k.0)) >> shift)
            .collect();
        assert!(homes.windows(2).all(|w| w[0] <= w[1]), "{homes:?}");
        // Erasing every other entry while iterating visits all in order.
        let mut seen = Vec::new();
        let mut cur = t.first();
        let mut i = 0;
        while let Some(p) = cur {
            seen.push(t.key_at(p));
            cur = if i % 2 == 0 { t.erase_at(p) } else { t.next(p) };
            i += 1;
        }
        assert_eq!(seen, before);
        let after: Vec<_> = t.keys().collect();
        let expect: Vec<_> = before.iter().copied().skip(1).step_by(2).collect();
        assert_eq!(after, expect);
        for k in after {
            assert!(t.find(k, hash_of(k.0)).is_some());
        }
    }
}
