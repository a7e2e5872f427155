//! [`HostDevice`]: the backend, its bookkeeping and the memory accessors.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::ptr;

use parking_lot::Mutex;
use reservoir::backend::{
    Backend, BackendError, DevicePtr, EventId, HostMapping, HostWrite, Ipc, MemInfo, Memcpy,
    Reservation, StreamId, VirtualMemory,
};

use crate::config::{HostConfig, HostConfigError};
use crate::ipc::{self, HostIpcHandle};
use crate::mapping::{os_page_size, Mapping};

mod counters;
mod vm;

pub use counters::{HostCounters, LeakReport};

/// The backend's name, as [`Backend::name`] reports it.
pub const NAME: &str = "host";

fn invalid(msg: String) -> BackendError {
    BackendError::InvalidValue(msg)
}

/// Turn an OS error into a backend error: `ENOMEM` is out of memory
/// (retryable: freeing cached memory gives address space and pages back),
/// anything else a driver error with the system's words.
fn os_error(what: &str, err: &io::Error, requested: u64, free: u64) -> BackendError {
    if err.raw_os_error() == Some(libc::ENOMEM) {
        BackendError::OutOfMemory { requested, free }
    } else {
        BackendError::Driver(format!("host device: {what}: {err}"))
    }
}

/// A `u64` length as `usize`; lengths that do not fit cannot be mapped.
fn to_usize(v: u64) -> Result<usize, BackendError> {
    usize::try_from(v).map_err(|_| invalid(format!("{v} bytes do not fit in this address space")))
}

/// A live plain allocation.
struct Allocation {
    /// The memory, read-write, `accounted` bytes long.
    map: Mapping,
    /// The size it was allocated with: accessible bytes, and the size
    /// [`Backend::free`] must name.
    size: u64,
    /// `size` rounded up to the page size: what it counts against the budget.
    accounted: u64,
    /// The memfd behind a shareable allocation and its serial (see `ipc.rs`).
    memfd: Option<(OwnedFd, u64)>,
}

/// A shared allocation of another process, opened here (see `ipc.rs`).
struct Opened {
    /// The shared pages, read-write, page-rounded.
    map: Mapping,
    /// The handle it was opened from; `handle.size` bytes are accessible.
    handle: HostIpcHandle,
}

/// A live reservation.
struct Resv {
    /// The address range; `PROT_NONE` except the runs.
    map: Mapping,
    /// Mapped (read-write) runs, offset -> length: disjoint, never adjacent
    /// (adjacent runs are merged), granularity-aligned, inside the range.
    runs: BTreeMap<u64, u64>,
    /// Sum of the runs' lengths.
    mapped: u64,
}

/// Everything behind the device's mutex.
struct State {
    /// The budget ([`HostConfig::capacity`]).
    capacity: u64,
    /// Bytes counted against it: `Σ allocs.accounted + Σ resv.mapped`.
    used: u64,
    /// Live allocations by address. Ranges never overlap each other nor a
    /// reservation (the kernel placed them all).
    allocs: BTreeMap<u64, Allocation>,
    /// Live reservations by base address.
    resv: BTreeMap<u64, Resv>,
    /// Known streams: the default stream, created and registered ones.
    streams: BTreeSet<u64>,
    /// Next id `create_stream` tries.
    next_stream: u64,
    /// [`HostConfig::max_streams`].
    max_streams: usize,
    /// Live events and the stream each was recorded on.
    events: HashMap<u64, StreamId>,
    /// Next event id.
    next_event: u64,
    /// Event counters (the `live_*` and byte fields are filled on snapshot).
    c: HostCounters,
    /// [`HostConfig::shareable`]: plain allocations are memfd-backed.
    shareable: bool,
    /// Serial of the next shareable allocation.
    next_serial: u64,
    /// Shared allocations of other processes opened here, by address. They
    /// count nothing against the budget (the exporter's memory).
    opened: BTreeMap<u64, Opened>,
}

impl State {
    fn free_bytes(&self) -> u64 {
        self.capacity.saturating_sub(self.used)
    }

    fn fits(&self, bytes: u64) -> bool {
        self.used
            .checked_add(bytes)
            .is_some_and(|t| t <= self.capacity)
    }

    fn take(&mut self, bytes: u64) {
        self.used += bytes;
        self.c.peak_bytes = self.c.peak_bytes.max(self.used);
    }

    fn oom(&self, requested: u64) -> BackendError {
        BackendError::OutOfMemory {
            requested,
            free: self.free_bytes(),
        }
    }

    fn allocate(&mut self, size: u64, page_size: u64) -> Result<DevicePtr, BackendError> {
        if size == 0 {
            return Err(invalid(
                "allocation of 0 bytes on the host device".to_string(),
            ));
        }
        let Some(accounted) = size.checked_next_multiple_of(page_size) else {
            self.c.failed_allocs += 1;
            return Err(self.oom(size));
        };
        if !self.fits(accounted) {
            self.c.failed_allocs += 1;
            tracing::debug!(
                size,
                used = self.used,
                capacity = self.capacity,
                "host: over budget"
            );
            return Err(self.oom(size));
        }
        let map = match to_usize(accounted).map(|len| self.map_plain(len)) {
            Ok(Ok(map)) => map,
            Ok(Err(e)) => {
                self.c.failed_allocs += 1;
                return Err(os_error("mmap", &e, size, self.free_bytes()));
            }
            Err(_) => {
                self.c.failed_allocs += 1;
                return Err(self.oom(size));
            }
        };
        let (map, memfd) = map;
        let addr = map.addr();
        self.allocs.insert(
            addr,
            Allocation {
                map,
                size,
                accounted,
                memfd,
            },
        );
        self.take(accounted);
        self.c.allocs += 1;
        Ok(DevicePtr(addr))
    }

    /// Fresh memory for a plain allocation: anonymous, or a new memfd when
    /// the device is shareable.
    fn map_plain(&mut self, len: usize) -> io::Result<(Mapping, Option<(OwnedFd, u64)>)> {
        if !self.shareable {
            return Ok((Mapping::anonymous_rw(len)?, None));
        }
        let serial = self.next_serial;
        let (map, fd) = Mapping::shared_memfd(len, &ipc::memfd_name(std::process::id(), serial))?;
        self.next_serial += 1;
        Ok((map, Some((fd, serial))))
    }

    fn export(&self, ptr: DevicePtr) -> Result<HostIpcHandle, BackendError> {
        let Some(a) = self.allocs.get(&ptr.0) else {
            return Err(invalid(format!(
                "IPC export of {ptr}: not the start of a live allocation of the host device"
            )));
        };
        let Some((fd, serial)) = &a.memfd else {
            return Err(invalid(format!(
                "IPC export of {ptr}: the allocation is not shareable; create the host device                  with HostConfig.shareable = true"
            )));
        };
        Ok(HostIpcHandle {
            pid: std::process::id(),
            fd: fd.as_raw_fd(),
            serial: *serial,
            size: a.size,
        })
    }

    fn open(&mut self, bytes: &[u8], page_size: u64) -> Result<(DevicePtr, u64), BackendError> {
        let handle = HostIpcHandle::from_bytes(bytes)?;
        if let Some((&addr, _)) = self.opened.iter().find(|(_, o)| o.handle == handle) {
            return Err(invalid(format!(
                "host IPC handle of pid {} fd {} is already open here at {addr:#x}; a handle                  opens once per process",
                handle.pid, handle.fd
            )));
        }
        let fd = ipc::open_exported(&handle)?;
        let len = handle
            .size
            .checked_next_multiple_of(page_size)
            .ok_or_else(|| invalid(format!("host IPC handle size {} overflows", handle.size)))?;
        let map = Mapping::map_shared_fd(fd.as_fd(), to_usize(len)?)
            .map_err(|e| os_error("mmap (IPC open)", &e, len, self.free_bytes()))?;
        let addr = map.addr();
        self.opened.insert(addr, Opened { map, handle });
        self.c.ipc_opens += 1;
        Ok((DevicePtr(addr), handle.size))
    }

    fn close_opened(&mut self, ptr: DevicePtr) -> Result<(), BackendError> {
        let Some(o) = self.opened.remove(&ptr.0) else {
            return Err(invalid(format!(
                "IPC close of {ptr}: not a shared allocation opened on this host device"
            )));
        };
        if let Err((map, e)) = o.map.unmap() {
            self.opened.insert(ptr.0, Opened { map, ..o });
            return Err(BackendError::Driver(format!(
                "host device: munmap of IPC mapping {ptr}: {e}"
            )));
        }
        Ok(())
    }

    fn free(&mut self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let Some(a) = self.allocs.get(&ptr.0) else {
            return Err(invalid(format!(
                "free of {ptr}: not a live allocation of the host device (double free or foreign \
                 address)"
            )));
        };
        if a.size != size {
            return Err(invalid(format!(
                "free of {ptr} with size {size}, but it was allocated with size {}",
                a.size
            )));
        }
        let a = self.allocs.remove(&ptr.0).expect("looked up above");
        let accounted = a.accounted;
        if let Err((map, e)) = a.map.unmap() {
            self.allocs.insert(ptr.0, Allocation { map, ..a });
            return Err(BackendError::Driver(format!(
                "host device: munmap of {ptr}: {e}"
            )));
        }
        self.used -= accounted;
        self.c.frees += 1;
        Ok(())
    }

    /// A pointer to `[ptr, ptr + len)` if the whole range is accessible
    /// memory: inside one live allocation's requested size, or inside the
    /// mapped runs of one reservation. `len` must be positive.
    fn locate(&self, ptr: DevicePtr, len: u64) -> Result<*mut u8, BackendError> {
        debug_assert!(len > 0);
        let Some(end) = ptr.0.checked_add(len) else {
            return Err(invalid(format!("range {ptr} + {len} bytes overflows")));
        };
        if let Some((&a, alloc)) = self.allocs.range(..=ptr.0).next_back() {
            if ptr.0 < a + alloc.size {
                if end > a + alloc.size {
                    return Err(invalid(format!(
                        "range [{ptr}, {end:#x}) runs past the end of allocation {a:#x} of {} \
                         bytes",
                        alloc.size
                    )));
                }
                return Ok(alloc.map.ptr((ptr.0 - a) as usize));
            }
        }
        if let Some((&b, resv)) = self.resv.range(..=ptr.0).next_back() {
            let size = resv.map.len() as u64;
            if ptr.0 < b + size {
                let off = ptr.0 - b;
                let covered = resv
                    .runs
                    .range(..=off)
                    .next_back()
                    .is_some_and(|(&o, &l)| o + l >= off + len);
                if !covered {
                    return Err(invalid(format!(
                        "range [{ptr}, {end:#x}) of reservation {b:#x} is not all mapped"
                    )));
                }
                return Ok(resv.map.ptr(off as usize));
            }
        }
        if let Some((&a, o)) = self.opened.range(..=ptr.0).next_back() {
            if ptr.0 < a + o.handle.size {
                if end > a + o.handle.size {
                    return Err(invalid(format!(
                        "range [{ptr}, {end:#x}) runs past the end of IPC mapping {a:#x} of {} \
                         bytes",
                        o.handle.size
                    )));
                }
                return Ok(o.map.ptr((ptr.0 - a) as usize));
            }
        }
        Err(invalid(format!(
            "{ptr}: not inside live memory of the host device"
        )))
    }

    fn check_stream(&self, s: StreamId) -> Result<(), BackendError> {
        if self.streams.contains(&s.0) {
            Ok(())
        } else {
            Err(invalid(format!(
                "unknown stream {s} on the host device (streams come from create_stream; 0 is \
                 the default stream)"
            )))
        }
    }

    fn check_event(&self, e: EventId) -> Result<(), BackendError> {
        if self.events.contains_key(&e.0) {
            Ok(())
        } else {
            Err(invalid(format!("unknown event {} on the host device", e.0)))
        }
    }

    fn leak_report(&self) -> LeakReport {
        LeakReport {
            allocations: self.allocs.len() as u64,
            allocation_bytes: self.allocs.values().map(|a| a.size).sum(),
            reservations: self.resv.len() as u64,
            reserved_bytes: self.resv.values().map(|r| r.map.len() as u64).sum(),
            mapped_bytes: self.resv.values().map(|r| r.mapped).sum(),
        }
    }
}

/// Host memory as a device: real, process-addressable memory from `mmap`,
/// behind the [`Backend`] contract. See the [crate docs](crate) for the
/// model.
///
/// `Send + Sync`; every method takes `&self` and locks one mutex. Dropping
/// the device unmaps everything it still holds and logs a [`LeakReport`]
/// if that is not nothing.
pub struct HostDevice {
    /// The OS page size: plain allocations are accounted in its units.
    page_size: u64,
    /// [`HostConfig::vm_granularity`].
    granularity: u64,
    state: Mutex<State>,
}

impl HostDevice {
    /// A host device with these settings.
    pub fn new(config: HostConfig) -> Result<HostDevice, HostConfigError> {
        config.validate()?;
        Ok(HostDevice {
            page_size: os_page_size(),
            granularity: config.vm_granularity,
            state: Mutex::new(State {
                capacity: config.capacity,
                used: 0,
                allocs: BTreeMap::new(),
                resv: BTreeMap::new(),
                streams: BTreeSet::from([StreamId::DEFAULT.0]),
                next_stream: 1,
                max_streams: config.max_streams,
                events: HashMap::new(),
                next_event: 1,
                c: HostCounters::default(),
                shareable: config.shareable,
                next_serial: 0,
                opened: BTreeMap::new(),
            }),
        })
    }

    /// A host device with a budget of `bytes` and default settings
    /// otherwise.
    pub fn with_capacity(bytes: u64) -> Result<HostDevice, HostConfigError> {
        HostDevice::new(HostConfig::with_capacity(bytes))
    }

    /// The capacity budget in bytes.
    pub fn capacity(&self) -> u64 {
        self.state.lock().capacity
    }

    /// Change the capacity budget. Memory already handed out stays; if it
    /// exceeds the new budget, every allocation and map fails until enough
    /// is given back.
    pub fn set_capacity(&self, bytes: u64) {
        self.state.lock().capacity = bytes;
    }

    /// The OS page size: plain allocations count their size rounded up to it.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> HostCounters {
        let s = self.state.lock();
        let mut c = HostCounters {
            live_reservations: s.resv.len() as u64,
            mapped_bytes: s.resv.values().map(|r| r.mapped).sum(),
            live_ipc_mappings: s.opened.len() as u64,
            ..s.c
        };
        c.live_allocs = s.allocs.len() as u64;
        c.bytes_in_use = s.used;
        c.live_events = s.events.len() as u64;
        c
    }

    /// Restart the peak (`peak_bytes`) from the current use.
    pub fn reset_peak(&self) {
        let mut s = self.state.lock();
        s.c.peak_bytes = s.used;
    }

    /// What the device still holds.
    pub fn leak_report(&self) -> LeakReport {
        self.state.lock().leak_report()
    }

    /// The size a live allocation starting at `ptr` was made with.
    pub fn allocation_size(&self, ptr: DevicePtr) -> Option<u64> {
        self.state.lock().allocs.get(&ptr.0).map(|a| a.size)
    }

    /// The mapped runs of a live reservation as `(offset, len)` pairs in
    /// address order (adjacent mapped ranges are reported as one run).
    pub fn mapped_runs(&self, reservation: Reservation) -> Result<Vec<(u64, u64)>, BackendError> {
        let s = self.state.lock();
        match s.resv.get(&reservation.base.0) {
            Some(r) if r.map.len() as u64 == reservation.size => {
                Ok(r.runs.iter().map(|(&o, &l)| (o, l)).collect())
            }
            _ => Err(invalid(format!(
                "{}: not a live reservation of {} bytes of the host device",
                reservation.base, reservation.size
            ))),
        }
    }

    /// True when `[ptr, ptr + len)` is accessible memory of this device:
    /// inside one live allocation (its requested size) or inside mapped
    /// pages of one reservation. An empty range is never live.
    pub fn is_live(&self, ptr: DevicePtr, len: u64) -> bool {
        len > 0 && self.state.lock().locate(ptr, len).is_ok()
    }

    /// Set `len` bytes at `ptr` to `byte`. The range must be live memory
    /// ([`is_live`](Self::is_live)); otherwise nothing is written and the
    /// error says why. An empty range is a no-op.
    pub fn fill(&self, ptr: DevicePtr, len: u64, byte: u8) -> Result<(), BackendError> {
        if len == 0 {
            return Ok(());
        }
        let s = self.state.lock();
        let p = s.locate(ptr, len)?;
        // SAFETY: `locate` proved `[p, p + len)` lies in committed read-write
        // memory of one live mapping, and the held lock keeps it mapped and
        // committed until we return. Device memory is accessed only through
        // raw pointers (never Rust references that could alias) by this
        // device's accessors under the same lock, or by callers' unsafe code
        // that the crate docs oblige not to race with them.
        unsafe { ptr::write_bytes(p, byte, len as usize) };
        Ok(())
    }

    /// The [`checksum_bytes`] of `len` bytes at `ptr`. The range must be
    /// live memory ([`is_live`](Self::is_live)). An empty range has the
    /// checksum of an empty slice.
    pub fn checksum(&self, ptr: DevicePtr, len: u64) -> Result<u64, BackendError> {
        if len == 0 {
            return Ok(checksum_bytes(&[]));
        }
        let s = self.state.lock();
        let p = s.locate(ptr, len)?;
        // SAFETY: `locate` proved `[p, p + len)` lies in committed readable
        // memory of one live mapping (initialised: fresh pages read zero),
        // and the held lock keeps it mapped, committed and unmodified by this
        // device for the slice's lifetime, which ends before we return.
        // Callers' own unsafe writes must not race with the device's
        // accessors (crate docs).
        let bytes = unsafe { std::slice::from_raw_parts(p.cast_const(), len as usize) };
        Ok(checksum_bytes(bytes))
    }

    /// Copy `data` into device memory at `dst`. The range must be live
    /// memory; otherwise nothing is written.
    pub fn copy_from_host(&self, dst: DevicePtr, data: &[u8]) -> Result<(), BackendError> {
        if data.is_empty() {
            return Ok(());
        }
        let s = self.state.lock();
        let p = s.locate(dst, data.len() as u64)?;
        // SAFETY: `locate` proved `[p, p + len)` is committed read-write
        // memory of one live mapping, kept so by the held lock; `data` is a
        // valid slice of that length. `ptr::copy` tolerates overlap, should
        // `data` itself point into device memory.
        unsafe { ptr::copy(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    /// Copy device memory at `src` into `out`. The range must be live
    /// memory; otherwise `out` is untouched.
    pub fn copy_to_host(&self, src: DevicePtr, out: &mut [u8]) -> Result<(), BackendError> {
        if out.is_empty() {
            return Ok(());
        }
        let s = self.state.lock();
        let p = s.locate(src, out.len() as u64)?;
        // SAFETY: `locate` proved `[p, p + len)` is committed readable memory
        // of one live mapping, kept so by the held lock; `out` is a valid
        // mutable slice of that length. `ptr::copy` tolerates overlap.
        unsafe { ptr::copy(p.cast_const(), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Make `stream` known to the device (for replays that use recorded
    /// stream values). Registering a known stream is a no-op.
    pub fn register_stream(&self, stream: StreamId) {
        self.state.lock().streams.insert(stream.0);
    }

    /// The known streams in id order (the default stream first).
    pub fn streams(&self) -> Vec<StreamId> {
        self.state
            .lock()
            .streams
            .iter()
            .map(|&s| StreamId(s))
            .collect()
    }
}

impl fmt::Debug for HostDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("HostDevice");
        d.field("page_size", &self.page_size)
            .field("granularity", &self.granularity);
        match self.state.try_lock() {
            Some(s) => d
                .field("capacity", &s.capacity)
                .field("used", &s.used)
                .field("live", &s.leak_report()),
            None => d.field("state", &"<locked>"),
        };
        d.finish()
    }
}

impl Drop for HostDevice {
    fn drop(&mut self) {
        let state = self.state.get_mut();
        let report = state.leak_report();
        if !report.is_empty() {
            tracing::warn!(
                allocations = report.allocations,
                allocation_bytes = report.allocation_bytes,
                reservations = report.reservations,
                reserved_bytes = report.reserved_bytes,
                mapped_bytes = report.mapped_bytes,
                "host device dropped with live memory: {report}; unmapping it"
            );
        }
        // The mappings are unmapped when `state` is dropped (Mapping's Drop,
        // which logs instead of panicking if munmap fails).
    }
}

impl HostDevice {
    /// The IPC handle of the shareable allocation starting at `ptr` (see
    /// [`HostConfig::shareable`]). Not an allocation start, or not
    /// shareable: [`BackendError::InvalidValue`] naming `ptr`.
    pub fn ipc_get_handle(&self, ptr: DevicePtr) -> Result<HostIpcHandle, BackendError> {
        self.state.lock().export(ptr)
    }

    /// Map another process's shareable allocation; returns its address
    /// here. The memory is readable and writable through this device's
    /// accessors ([`fill`](Self::fill), [`copy_to_host`](Self::copy_to_host)
    /// ...) and raw pointers; writes are seen by the exporter. Bad, stale or
    /// own-process handles are [`BackendError::InvalidValue`] and map
    /// nothing.
    pub fn ipc_open(&self, handle: &HostIpcHandle) -> Result<DevicePtr, BackendError> {
        Ok(self
            .state
            .lock()
            .open(&handle.to_bytes(), self.page_size)?
            .0)
    }

    /// Unmap an allocation opened with [`ipc_open`](Self::ipc_open).
    pub fn ipc_close(&self, ptr: DevicePtr) -> Result<(), BackendError> {
        self.state.lock().close_opened(ptr)
    }
}

impl Ipc for HostDevice {
    fn export_segment(&self, segment: DevicePtr) -> Result<Vec<u8>, BackendError> {
        Ok(self.ipc_get_handle(segment)?.to_bytes().to_vec())
    }

    fn open_segment(&self, handle: &[u8]) -> Result<(DevicePtr, u64), BackendError> {
        self.state.lock().open(handle, self.page_size)
    }

    fn close_segment(&self, base: DevicePtr) -> Result<(), BackendError> {
        self.ipc_close(base)
    }
}

impl Backend for HostDevice {
    fn name(&self) -> &'static str {
        NAME
    }

    fn allocate(&self, size: u64, _stream: StreamId) -> Result<DevicePtr, BackendError> {
        self.state.lock().allocate(size, self.page_size)
    }

    fn free(&self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        self.state.lock().free(ptr, size)
    }

    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        let s = self.state.lock();
        Ok(MemInfo {
            free: s.free_bytes(),
            total: s.capacity,
        })
    }

    fn create_stream(&self) -> Result<StreamId, BackendError> {
        let mut s = self.state.lock();
        let (live, max) = (s.streams.len(), s.max_streams);
        if live >= max {
            return Err(BackendError::Driver(format!(
                "the host device holds {live} streams, its limit (HostConfig::max_streams = \
                 {max}); streams cannot be destroyed, so reuse the ones you have or raise the limit"
            )));
        }
        while s.streams.contains(&s.next_stream) {
            s.next_stream += 1;
        }
        let id = s.next_stream;
        s.next_stream += 1;
        s.streams.insert(id);
        s.c.streams_created += 1;
        Ok(StreamId(id))
    }

    fn check_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.state.lock().check_stream(stream)
    }

    /// Host work is synchronous: the event is complete when recorded.
    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError> {
        let mut s = self.state.lock();
        s.check_stream(stream)?;
        let id = s.next_event;
        s.next_event += 1;
        s.events.insert(id, stream);
        s.c.events_recorded += 1;
        Ok(EventId(id))
    }

    /// Always true for a live event.
    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        self.state.lock().check_event(event)?;
        Ok(true)
    }

    /// Returns at once for a live event.
    fn synchronize_event(&self, event: EventId) -> Result<(), BackendError> {
        self.state.lock().check_event(event)
    }

    fn destroy_event(&self, event: EventId) -> Result<(), BackendError> {
        let mut s = self.state.lock();
        s.check_event(event)?;
        s.events.remove(&event.0);
        Ok(())
    }

    /// Returns at once for a known stream.
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.state.lock().check_stream(stream)
    }

    /// Returns at once.
    fn synchronize_device(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn as_virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        Some(self)
    }

    fn as_ipc(&self) -> Option<&dyn Ipc> {
        Some(self)
    }

    fn as_memcpy(&self) -> Option<&dyn Memcpy> {
        Some(self)
    }

    fn as_host_write(&self) -> Option<&dyn HostWrite> {
        Some(self)
    }

    fn as_host_mapping(&self) -> Option<&dyn HostMapping> {
        Some(self)
    }
}

/// Host memory is the host's: [`HostDevice::copy_from_host`].
impl HostWrite for HostDevice {
    fn write_host(&self, ptr: DevicePtr, data: &[u8]) -> Result<(), BackendError> {
        self.copy_from_host(ptr, data)
    }
}

/// Device pointers are host addresses: the host address of live memory is
/// its device pointer.
impl HostMapping for HostDevice {
    fn host_address(&self, ptr: DevicePtr, len: u64) -> Result<u64, BackendError> {
        self.state.lock().locate(ptr, len.max(1))?;
        Ok(ptr.0)
    }
}

impl Memcpy for HostDevice {
    /// Copies at once (host work is synchronous); `stream` must be known.
    /// Both ranges must be live memory; they may overlap (memmove).
    fn copy(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        let mut s = self.state.lock();
        s.check_stream(stream)?;
        if len == 0 {
            return Ok(());
        }
        let d = s.locate(dst, len)?;
        let p = s.locate(src, len)?;
        // SAFETY: `locate` proved both `[d, d + len)` and `[p, p + len)` are
        // committed read-write memory of live mappings, kept so by the held
        // lock; `ptr::copy` is a memmove, so overlapping ranges are fine.
        unsafe { ptr::copy(p.cast_const(), d, len as usize) };
        s.c.copies += 1;
        Ok(())
    }
}

/// A fast, non-cryptographic 64-bit checksum of `data`: the value
/// [`HostDevice::checksum`] computes over device memory, so tests can compare
/// it with the checksum of the bytes they expect. Deterministic across runs
/// and platforms; any change of a single byte changes it.
pub fn checksum_bytes(data: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    fn step(lane: u64, word: u64) -> u64 {
        (lane ^ word).wrapping_mul(K).rotate_left(29)
    }
    // Four independent lanes over 32-byte chunks (fast even without full
    // optimisation). Each step is a bijection of the lane for a fixed word,
    // so a changed word changes its lane.
    let mut lanes: [u64; 4] = [
        0x243f_6a88_85a3_08d3,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
        0x082e_fa98_ec4e_6c89,
    ];
    let mut chunks = data.chunks_exact(32);
    for c in &mut chunks {
        // Every slice is 8 bytes long: the fallback is never taken.
        let word = |i: usize| u64::from_le_bytes(c[i..i + 8].try_into().unwrap_or([0; 8]));
        lanes[0] = step(lanes[0], word(0));
        lanes[1] = step(lanes[1], word(8));
        lanes[2] = step(lanes[2], word(16));
        lanes[3] = step(lanes[3], word(24));
    }
    let mut h = (data.len() as u64).wrapping_mul(K);
    for lane in lanes {
        h = (h ^ lane).wrapping_mul(K).rotate_left(31);
    }
    for &b in chunks.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(K).rotate_left(17);
    }
    h ^ (h >> 32)
}
