//! The C entry points of Reservoir's C++ face for torch
//! (`crates/reservoir-python/python/reservoir/torch/csrc/reservoir_allocator.cpp`,
//! a `c10::cuda::CUDACachingAllocator::CUDAAllocator`): everything torch's
//! allocator interface asks, on the same per-device allocators as
//! [`reservoir_alloc`](crate::reservoir_alloc) / [`reservoir_free`](crate::reservoir_free).
//! This file holds allocation, statistics and pools; `torch_state.rs` the
//! entry points that read the allocator's state or set it back (history,
//! snapshot, trace tracker, expandable segment sizes, pool checkpoints).
//!
//! Every function answers a [`ReservoirStatus`] and sets
//! [`reservoir_last_error`](crate::reservoir_last_error) on failure; a failed
//! call changes nothing (an out-of-memory error changes what PyTorch's
//! retry chain changes: the flushed cache and `num_ooms`). Pools are named by
//! torch's `MempoolId_t`, two `u64` halves.

use std::ffi::{c_char, c_void};
use std::sync::Arc;

use reservoir::caching::PoolFilter;
use reservoir::observe::snapshot::BlockState;
use reservoir::{DevicePtr, MempoolId, StreamId};

use crate::error::{Failure, ReservoirStatus, RESERVOIR_ERR_INVALID_POINTER};
use crate::torch::{allocator, built_allocators, stream_of, torch_guard};

/// The number of `i64` values [`reservoir_torch_device_stats`] writes.
pub const RESERVOIR_TORCH_DEVICE_STATS_LEN: usize = 123;

/// What an out-of-memory failure of [`reservoir_torch_malloc`] reports, for
/// torch's out-of-memory observers and its `OutOfMemoryError`.
#[repr(C)]
#[derive(Debug)]
pub struct ReservoirTorchOom {
    /// Bytes the allocator tried to obtain from the device (the observers'
    /// `allocated` argument).
    pub alloc_size: u64,
    /// The device's capacity, or the memory-fraction limit when one is set
    /// (the observers' `device_total`).
    pub device_total: u64,
    /// Free device memory when the allocation failed.
    pub device_free: u64,
    /// Filled with PyTorch's exact out-of-memory text, NUL-terminated and
    /// cut to `capacity - 1` bytes (null: not written).
    pub message: *mut c_char,
    /// Bytes at `message`.
    pub capacity: usize,
    /// The text's full length in bytes (without the NUL).
    pub length: usize,
}

/// A pool id from its two halves.
pub(crate) fn pool(p0: u64, p1: u64) -> MempoolId {
    MempoolId(p0, p1)
}

/// A private pool id: the default pool `(0, 0)` is refused.
pub(crate) fn private_pool(p0: u64, p1: u64) -> Result<MempoolId, Failure> {
    let id = pool(p0, p1);
    if id.is_default() {
        return Err(Failure::invalid(
            "pool (0, 0) is the default pool, not a private pool",
        ));
    }
    Ok(id)
}

/// torch's `allocate` / `raw_alloc_with_stream`: `size` bytes on `device`
/// for `stream` (null: the default stream) into `*out` (null for size 0).
/// Out of memory answers `RESERVOIR_ERR_OUT_OF_MEMORY`, fills `*oom` (when
/// non-null) with PyTorch's exact message and the observers' numbers, and
/// Reservoir's own observers have run.
///
/// # Safety
/// `stream` is null or a live CUDA stream of `device`; `out` is valid for a
/// write; `oom` is null or valid, its `message` null or `capacity` writable
/// bytes.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_malloc(
    size: usize,
    device: i32,
    stream: *mut c_void,
    out: *mut *mut c_void,
    oom: *mut ReservoirTorchOom,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_malloc", || {
        if out.is_null() {
            return Err(Failure::invalid("out is null"));
        }
        let a = allocator(device)?;
        // SAFETY: a live stream of `device` (caller's contract).
        let s = unsafe { stream_of(&a, stream) };
        match a.raw_alloc(size as u64, s) {
            Ok(p) => {
                // SAFETY: non-null and writable (caller's contract).
                unsafe { out.write(p.0 as usize as *mut c_void) };
                Ok(())
            }
            Err(reservoir::AllocError::OutOfMemory(e)) => {
                if !oom.is_null() {
                    // SAFETY: valid (caller's contract).
                    let o = unsafe { &mut *oom };
                    o.alloc_size = e.alloc_size;
                    o.device_total = e.allowed.unwrap_or(e.device_total);
                    o.device_free = e.device_free;
                    o.length = e.message.len();
                    if !o.message.is_null() && o.capacity > 0 {
                        let n = e.message.len().min(o.capacity - 1);
                        // SAFETY: `capacity` writable bytes (caller's contract), n < capacity.
                        unsafe {
                            std::ptr::copy_nonoverlapping(e.message.as_ptr(), o.message.cast(), n);
                            o.message.add(n).write(0);
                        }
                    }
                }
                Err(Failure::from(reservoir::AllocError::OutOfMemory(e)))
            }
            Err(e) => Err(Failure::context(
                e,
                format_args!("size {size} on device {device}"),
            )),
        }
    })
}

/// torch's `raw_delete`: free `ptr`, handed out by [`reservoir_torch_malloc`]
/// (or `reservoir_alloc`) on any device. Null does nothing; a pointer not
/// handed out (foreign, or already freed) is `RESERVOIR_ERR_INVALID_POINTER`
/// and changes nothing. A free the device cannot record events for is done
/// after synchronising the device, as `reservoir_free` does.
#[no_mangle]
pub extern "C" fn reservoir_torch_delete(ptr: *mut c_void) -> ReservoirStatus {
    torch_guard("reservoir_torch_delete", || {
        if ptr.is_null() {
            return Ok(());
        }
        let p = DevicePtr(ptr as usize as u64);
        for a in built_allocators() {
            match a.raw_free(p) {
                Ok(()) => return Ok(()),
                Err(reservoir::AllocError::InvalidPointer { .. }) => continue,
                Err(reservoir::AllocError::FreeFailed { source, .. }) => {
                    tracing::warn!(
                        target: "reservoir::capi",
                        "reservoir_torch_delete: ptr {ptr:p}: {source}; synchronising the device to free it without events"
                    );
                    return a
                        .free_after_sync(p)
                        .map_err(|e| Failure::context(e, format_args!("ptr {ptr:p}")));
                }
                Err(e) => return Err(Failure::context(e, format_args!("ptr {ptr:p}"))),
            }
        }
        Err(Failure::new(
            RESERVOIR_ERR_INVALID_POINTER,
            format!(
                "ptr {ptr:p} was not handed out by Reservoir or was already freed \
                 (double free or foreign pointer); nothing was changed"
            ),
        ))
    })
}

/// torch's `getDeviceStats(device)` in one call: writes
/// [`RESERVOIR_TORCH_DEVICE_STATS_LEN`] values to `out` (`len` must be at
/// least that), in `c10::CachingDeviceAllocator::DeviceStats`'s order:
/// the nine stat arrays `allocation, segment, active, inactive_split,
/// allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes,
/// requested_bytes`, each as `aggregate, small_pool, large_pool`, each as
/// `current, peak, allocated, freed` (108 values); then `num_alloc_retries,
/// num_ooms`, `oversize_allocations` and `oversize_segments` (4 values each),
/// `num_sync_all_streams, num_device_alloc, num_device_free,
/// num_oom_rejections, max_split_size`.
///
/// # Safety
/// `out` is null or valid for `len` writes.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_device_stats(
    device: i32,
    out: *mut i64,
    len: usize,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_device_stats", || {
        if out.is_null() {
            return Err(Failure::invalid("out is null"));
        }
        if len < RESERVOIR_TORCH_DEVICE_STATS_LEN {
            return Err(Failure::invalid(format!(
                "len {len} is less than RESERVOIR_TORCH_DEVICE_STATS_LEN ({RESERVOIR_TORCH_DEVICE_STATS_LEN})"
            )));
        }
        let v = device_stats_flat(&allocator(device)?.stats());
        debug_assert_eq!(v.len(), RESERVOIR_TORCH_DEVICE_STATS_LEN);
        // SAFETY: `len` >= v.len() writable values (caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, v.len()) };
        Ok(())
    })
}

/// The number of `i64` values [`reservoir_torch_private_pool_stats`] writes
/// per private pool: the pool id's two halves, then its reserved-bytes
/// array as `aggregate, small_pool, large_pool`, each `current, peak,
/// allocated, freed`.
pub const RESERVOIR_TORCH_PRIVATE_POOL_STATS_LEN: usize = 14;

/// torch 2.13+'s `DeviceStats::reserved_bytes_by_private_pools` of
/// `device` (spec 1.12): one entry per private pool that ever held driver
/// memory, in pool id order, each [`RESERVOIR_TORCH_PRIVATE_POOL_STATS_LEN`]
/// values. `*count` (if `count` is not null) receives the number of pools.
/// With `out` null only the count is written; otherwise `len` must be at
/// least `count * RESERVOIR_TORCH_PRIVATE_POOL_STATS_LEN`, else the call is
/// `RESERVOIR_ERR_INVALID_ARGUMENT` naming both lengths and writes only the
/// count (ask again with a larger buffer: pools may appear between calls).
///
/// # Safety
/// `out` is null or valid for `len` writes; `count` is null or valid for
/// one write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_private_pool_stats(
    device: i32,
    out: *mut i64,
    len: usize,
    count: *mut usize,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_private_pool_stats", || {
        let v = private_pool_stats_flat(&allocator(device)?.private_pool_reserved());
        let pools = v.len() / RESERVOIR_TORCH_PRIVATE_POOL_STATS_LEN;
        if !count.is_null() {
            // SAFETY: `count` is valid for one write (caller's contract).
            unsafe { count.write(pools) };
        }
        if out.is_null() {
            return Ok(());
        }
        if len < v.len() {
            return Err(Failure::invalid(format!(
                "len {len} is less than the {} values of {pools} private pools",
                v.len()
            )));
        }
        // SAFETY: `len` >= v.len() writable values (caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, v.len()) };
        Ok(())
    })
}

/// The flat form of [`reservoir_torch_private_pool_stats`].
pub fn private_pool_stats_flat(
    pools: &std::collections::BTreeMap<MempoolId, reservoir::StatArray>,
) -> Vec<i64> {
    let mut v = Vec::with_capacity(pools.len() * RESERVOIR_TORCH_PRIVATE_POOL_STATS_LEN);
    for (id, array) in pools {
        // MempoolId_t is a pair of unsigned long long; i64 carries the bits.
        v.extend([id.0 as i64, id.1 as i64]);
        for s in &array.0 {
            v.extend([s.current, s.peak, s.allocated, s.freed]);
        }
    }
    v
}

/// The flat form of [`reservoir_torch_device_stats`].
pub fn device_stats_flat(s: &reservoir::DeviceStats) -> Vec<i64> {
    let mut v = Vec::with_capacity(RESERVOIR_TORCH_DEVICE_STATS_LEN);
    let stat = |v: &mut Vec<i64>, s: &reservoir::Stat| {
        v.extend([s.current, s.peak, s.allocated, s.freed]);
    };
    for arr in [
        &s.allocation,
        &s.segment,
        &s.active,
        &s.inactive_split,
        &s.allocated_bytes,
        &s.reserved_bytes,
        &s.active_bytes,
        &s.inactive_split_bytes,
        &s.requested_bytes,
    ] {
        for st in &arr.0 {
            stat(&mut v, st);
        }
    }
    v.extend([s.num_alloc_retries, s.num_ooms]);
    stat(&mut v, &s.oversize_allocations);
    stat(&mut v, &s.oversize_segments);
    v.extend([
        s.num_sync_all_streams,
        s.num_device_alloc,
        s.num_device_free,
        s.num_oom_rejections,
        s.max_split_size,
    ]);
    v
}

/// torch's `resetPeakStats(device)`.
#[no_mangle]
pub extern "C" fn reservoir_torch_reset_peak_stats(device: i32) -> ReservoirStatus {
    torch_guard("reservoir_torch_reset_peak_stats", || {
        allocator(device)?.reset_peak_stats();
        Ok(())
    })
}

/// torch's `resetAccumulatedStats(device)`.
#[no_mangle]
pub extern "C" fn reservoir_torch_reset_accumulated_stats(device: i32) -> ReservoirStatus {
    torch_guard("reservoir_torch_reset_accumulated_stats", || {
        allocator(device)?.reset_accumulated_stats();
        Ok(())
    })
}

/// torch's `emptyCache(mempool_id)` on every device Reservoir has built:
/// `(0, 0)` releases the global pools and every freeable private pool, a
/// private pool's id only that pool.
#[no_mangle]
pub extern "C" fn reservoir_torch_empty_cache_pool(p0: u64, p1: u64) -> ReservoirStatus {
    torch_guard("reservoir_torch_empty_cache_pool", || {
        for a in built_allocators() {
            a.empty_cache_pool(pool(p0, p1))?;
        }
        Ok(())
    })
}

/// torch's `setMemoryFraction(fraction, device)`: a fraction outside
/// `0..=1` is `RESERVOIR_ERR_INVALID_ARGUMENT` and changes nothing.
#[no_mangle]
pub extern "C" fn reservoir_torch_set_memory_fraction(
    device: i32,
    fraction: f64,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_set_memory_fraction", || {
        Ok(allocator(device)?.set_memory_fraction(fraction)?)
    })
}

/// torch's `getMemoryFraction(device)` into `*out`.
///
/// # Safety
/// `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_memory_fraction(
    device: i32,
    out: *mut f64,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_memory_fraction", || {
        if out.is_null() {
            return Err(Failure::invalid("out is null"));
        }
        let f = allocator(device)?.memory_fraction()?;
        // SAFETY: non-null and writable (caller's contract).
        unsafe { out.write(f) };
        Ok(())
    })
}

/// torch's `cacheInfo(device, &largestBlock)`: the largest block that could
/// be handed out without a new driver allocation, or the device's free
/// memory if larger.
///
/// # Safety
/// `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_cache_info(device: i32, out: *mut u64) -> ReservoirStatus {
    torch_guard("reservoir_torch_cache_info", || {
        if out.is_null() {
            return Err(Failure::invalid("out is null"));
        }
        let v = allocator(device)?.cache_info()?;
        // SAFETY: non-null and writable (caller's contract).
        unsafe { out.write(v) };
        Ok(())
    })
}

/// torch's `getBaseAllocation(ptr, &size)`: the start and size of the
/// segment holding `ptr` (a live block of any device).
///
/// # Safety
/// `base` and `size` are null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_base_allocation(
    ptr: *mut c_void,
    base: *mut *mut c_void,
    size: *mut u64,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_base_allocation", || {
        if base.is_null() || size.is_null() {
            return Err(Failure::invalid("base or size is null"));
        }
        let p = DevicePtr(ptr as usize as u64);
        let owner = built_allocators()
            .into_iter()
            .find(|a| a.is_allocated(p))
            .ok_or_else(|| {
                Failure::new(
                    RESERVOIR_ERR_INVALID_POINTER,
                    format!("ptr {ptr:p} is not a live block handed out by Reservoir"),
                )
            })?;
        // An expandable segment's block is live but has no base allocation:
        // PyTorch's error (it cannot be shared between processes).
        let (b, s) = owner
            .base_allocation(p)
            .map_err(|e| Failure::context(e, format_args!("ptr {ptr:p}")))?;
        // SAFETY: non-null and writable (caller's contract).
        unsafe {
            base.write(b.0 as usize as *mut c_void);
            size.write(s);
        }
        Ok(())
    })
}

/// A C predicate over the allocation stream (a `cudaStream_t`), the filter
/// of [`reservoir_torch_begin_allocate_to_pool`]; null is allowed there.
///
/// The nullable function pointers of the header are `Option`s of function
/// types written out here, never of another alias: cbindgen turns
/// `Option<unsafe extern "C" fn(..)>` into a plain C function pointer, but
/// an `Option` of an alias into an undefined `struct Option_...`
/// (issue 44, G2).
pub type ReservoirStreamFilter =
    Option<unsafe extern "C" fn(ctx: *mut c_void, stream: *mut c_void) -> bool>;

/// Drops a filter's context (nullable).
pub type ReservoirFilterDrop = Option<unsafe extern "C" fn(ctx: *mut c_void)>;

/// Owns a context a C caller handed over with the functions that take it
/// (a pool filter, a pool allocator): `drop` is called on it exactly once,
/// when the owner goes.
struct CContext {
    ctx: *mut c_void,
    drop: ReservoirFilterDrop,
}

// SAFETY: the callers of reservoir_torch_begin_allocate_to_pool and
// reservoir_torch_create_or_incref_pool_with_allocator promise that the
// functions they pass and `drop` may be called with the context from any
// thread.
unsafe impl Send for CContext {}
// SAFETY: as above, calls from several threads at once included.
unsafe impl Sync for CContext {}

impl CContext {
    /// The context, for the functions it was handed over with (a method,
    /// so that a closure captures the owner, not the bare pointer).
    fn get(&self) -> *mut c_void {
        self.ctx
    }
}

impl Drop for CContext {
    fn drop(&mut self) {
        if let Some(d) = self.drop {
            // SAFETY: the context is dropped once, when its owner goes.
            unsafe { d(self.ctx) }
        }
    }
}

/// torch's `beginAllocateToPool(device, mempool_id, filter)`: route the
/// allocations `filter(ctx, stream)` accepts to private pool `(p0, p1)`,
/// creating it (use count 1) or adding a use. A null `filter` routes the
/// calling thread's allocations (`torch.cuda.use_mem_pool`). `drop_ctx`
/// (may be null) is called once on `ctx` when the filter is discarded,
/// including when this call fails. The default pool is refused.
///
/// # Safety
/// `filter`, when non-null, may be called with `ctx` from any thread while
/// the pool is being allocated to; `drop_ctx` likewise.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_begin_allocate_to_pool(
    device: i32,
    p0: u64,
    p1: u64,
    filter: ReservoirStreamFilter,
    ctx: *mut c_void,
    drop_ctx: ReservoirFilterDrop,
) -> ReservoirStatus {
    let context = CContext {
        ctx,
        drop: drop_ctx,
    };
    // Without a filter nothing keeps the context: it is dropped here.
    let owned = filter.map(|filter| (filter, context));
    torch_guard("reservoir_torch_begin_allocate_to_pool", move || {
        let id = private_pool(p0, p1)?;
        let a = allocator(device)?;
        let f = match owned {
            None => PoolFilter::current_thread(),
            Some((filter, c)) => PoolFilter::Custom(Arc::new(move |s: StreamId| {
                // SAFETY: callable from any thread (caller's contract).
                unsafe { filter(c.get(), s.0 as usize as *mut c_void) }
            })),
        };
        Ok(a.begin_allocate_to_pool(id, f)?)
    })
}

/// torch's `endAllocateToPool(device, mempool_id)`.
#[no_mangle]
pub extern "C" fn reservoir_torch_end_allocate_to_pool(
    device: i32,
    p0: u64,
    p1: u64,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_end_allocate_to_pool", || {
        let id = private_pool(p0, p1)?;
        Ok(allocator(device)?.end_allocate_to_pool(id)?)
    })
}

/// torch's `releasePool(device, mempool_id)`: drop one use.
#[no_mangle]
pub extern "C" fn reservoir_torch_release_pool(device: i32, p0: u64, p1: u64) -> ReservoirStatus {
    torch_guard("reservoir_torch_release_pool", || {
        let id = private_pool(p0, p1)?;
        Ok(allocator(device)?.release_pool(id)?)
    })
}

/// torch's `createOrIncrefPool(device, mempool_id)`: create the private
/// pool (use count 1) or add a use, without routing any allocation to it.
#[no_mangle]
pub extern "C" fn reservoir_torch_create_or_incref_pool(
    device: i32,
    p0: u64,
    p1: u64,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_create_or_incref_pool", || {
        let id = private_pool(p0, p1)?;
        let a = allocator(device)?;
        a.begin_allocate_to_pool(id, PoolFilter::Custom(Arc::new(|_| false)))?;
        Ok(a.end_allocate_to_pool(id)?)
    })
}

/// A pool allocator's `alloc(ctx, size, device, stream)`
/// (`CUDAPluggableAllocator`'s, for `MemPool(allocator=...)`): a new
/// segment of `size` bytes, or null for out of memory. Must not unwind.
pub type ReservoirPoolAlloc = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        size: u64,
        device: i32,
        stream: *mut c_void,
    ) -> *mut c_void,
>;
/// A pool allocator's `free(ctx, ptr, size, device, stream)`, called with
/// the values `ptr` was allocated with. Must not unwind.
pub type ReservoirPoolFree = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        ptr: *mut c_void,
        size: u64,
        device: i32,
        stream: *mut c_void,
    ),
>;

/// torch's `createOrIncrefPool(device, mempool_id, allocator)` with another
/// allocator (`MemPool(allocator=CUDAPluggableAllocator(...))`): create the
/// private pool `(p0, p1)` (use count 1) whose segments come from
/// `alloc(ctx, ...)` and go back through `free(ctx, ...)`, its blocks cached
/// by Reservoir (never expandable segments; a null from `alloc` is out of
/// memory), or add a use to the existing pool with an allocator (which keeps
/// its first one). `drop_ctx` (may be null) is called once on `ctx` when
/// the pool no longer needs the allocator (the pool is gone, or this call
/// failed or only added a use). Null `alloc` or `free`, the default pool
/// and an existing pool without an allocator are refused, changing nothing.
///
/// # Safety
/// `alloc`, `free` and `drop_ctx` may be called with `ctx` from any thread
/// until `drop_ctx` is; none may unwind or call back into Reservoir.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_create_or_incref_pool_with_allocator(
    device: i32,
    p0: u64,
    p1: u64,
    alloc: ReservoirPoolAlloc,
    free: ReservoirPoolFree,
    ctx: *mut c_void,
    drop_ctx: ReservoirFilterDrop,
) -> ReservoirStatus {
    let owned = Arc::new(CContext {
        ctx,
        drop: drop_ctx,
    });
    torch_guard(
        "reservoir_torch_create_or_incref_pool_with_allocator",
        move || {
            let (Some(alloc_fn), Some(free_fn)) = (alloc, free) else {
                return Err(Failure::invalid(
                    "a pool allocator needs both alloc and free (one is null)",
                ));
            };
            let id = private_pool(p0, p1)?;
            let a = allocator(device)?;
            let (c_alloc, c_free) = (owned.clone(), owned);
            let alloc: reservoir::pluggable::AllocFn = Arc::new(move |size, device, stream| {
                // SAFETY: callable from any thread with its context (caller's contract).
                let p = unsafe {
                    alloc_fn(
                        c_alloc.ctx,
                        size,
                        i32::from(device),
                        stream.0 as usize as *mut c_void,
                    )
                };
                (!p.is_null()).then_some(DevicePtr(p as u64))
            });
            let free: reservoir::pluggable::FreeFn = Arc::new(move |ptr, size, device, stream| {
                // SAFETY: as above; `ptr` came from `alloc` with these values.
                unsafe {
                    free_fn(
                        c_free.ctx,
                        ptr.0 as usize as *mut c_void,
                        size,
                        i32::from(device),
                        stream.0 as usize as *mut c_void,
                    )
                }
            });
            let pool_allocator = reservoir::pluggable::PluggableAllocator::new(alloc, free);
            Ok(a.create_or_incref_pool_with_allocator(id, Arc::new(pool_allocator))?)
        },
    )
}

/// torch's `setNoSplit(device, mempool_id)` (`MemPool(no_split=True)`):
/// the pool's blocks are handed out whole, never split (spec 1.7). An
/// unknown pool is `RESERVOIR_ERR_INVALID_STATE` and changes nothing.
#[no_mangle]
pub extern "C" fn reservoir_torch_set_no_split(device: i32, p0: u64, p1: u64) -> ReservoirStatus {
    torch_guard("reservoir_torch_set_no_split", || {
        let id = private_pool(p0, p1)?;
        Ok(allocator(device)?.set_no_split(id)?)
    })
}

/// torch's `setUseOnOOM(device, mempool_id, use_on_oom)`
/// (`MemPool(use_on_oom=True)`): when an allocation outside every private
/// pool would run out of memory, the free blocks of this pool may serve it
/// (nonzero `on`), or no longer (0). Marking an unknown pool is
/// `RESERVOIR_ERR_INVALID_STATE` and changes nothing; unmarking any pool is
/// accepted (torch's `~MemPool` unmarks every pool).
#[no_mangle]
pub extern "C" fn reservoir_torch_set_use_on_oom(
    device: i32,
    p0: u64,
    p1: u64,
    on: i32,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_set_use_on_oom", || {
        let id = private_pool(p0, p1)?;
        Ok(allocator(device)?.set_use_on_oom(id, on != 0)?)
    })
}

/// torch's `getPoolUseCount(device, mempool_id)` into `*out` (0 for a pool
/// Reservoir does not know).
///
/// # Safety
/// `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_pool_use_count(
    device: i32,
    p0: u64,
    p1: u64,
    out: *mut u32,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_pool_use_count", || {
        if out.is_null() {
            return Err(Failure::invalid("out is null"));
        }
        let n = allocator(device)?.pool_use_count(pool(p0, p1));
        // SAFETY: non-null and writable (caller's contract).
        unsafe { out.write(n) };
        Ok(())
    })
}

/// torch's `checkPoolLiveAllocations(device, mempool_id, expected)`: `*out`
/// is true when the allocated blocks of the pool are exactly the `n`
/// addresses at `expected` (PyTorch's rule: every allocated block is
/// expected, and their count equals `n`).
///
/// # Safety
/// `expected` is valid for `n` reads (may be null when `n` is 0); `out` is
/// null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_check_pool_live_allocations(
    device: i32,
    p0: u64,
    p1: u64,
    expected: *const u64,
    n: usize,
    out: *mut bool,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_check_pool_live_allocations", || {
        if out.is_null() || (expected.is_null() && n > 0) {
            return Err(Failure::invalid(
                "out is null, or expected is null with n > 0",
            ));
        }
        let want: std::collections::HashSet<u64> = if n == 0 {
            Default::default()
        } else {
            // SAFETY: `n` readable values (caller's contract).
            unsafe { std::slice::from_raw_parts(expected, n) }
                .iter()
                .copied()
                .collect()
        };
        let segments = allocator(device)?.pool_segments(pool(p0, p1));
        let mut allocated = 0usize;
        let mut ok = true;
        'outer: for s in &segments {
            for (addr, b) in s.blocks_with_addresses() {
                if b.state != BlockState::ActiveAllocated {
                    continue;
                }
                if !want.contains(&addr) {
                    ok = false;
                    break 'outer;
                }
                allocated += 1;
            }
        }
        // SAFETY: non-null and writable (caller's contract).
        unsafe { out.write(ok && allocated == want.len()) };
        Ok(())
    })
}
