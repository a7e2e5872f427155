//! [`CudaDevice`]: set-up, segments, streams, events, IPC and peers (the
//! [`Backend`] contract). Virtual memory is in `vm.rs`, device work for
//! tests in `work.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_char, c_int};

use cudarc::driver::sys::{self, CUresult};
use parking_lot::Mutex;
use reservoir::backend::{
    Backend, BackendError, DevicePtr, DeviceWork, EventId, Ipc, MemInfo, Memcpy, StreamId,
    VirtualMemory,
};

use crate::driver::{self, check, Driver};
use crate::fake::FakeDriver;
use crate::{CudaError, NAME};

/// An IPC handle of a device allocation (`CUipcMemHandle`, 64 opaque bytes).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct IpcMemHandle(pub [u8; 64]);

/// One reservation of address space and its mapped pages.
pub(crate) struct Resv {
    /// Its length in bytes.
    pub(crate) size: u64,
    /// Mapped pages: offset -> physical handle (`cuMemCreate`).
    pub(crate) pages: BTreeMap<u64, u64>,
}

/// Everything the device hands out, so that every handle the driver sees
/// is one it made and that is still alive.
pub(crate) struct State {
    /// Known streams: raw handle -> created here (destroyed on drop).
    pub(crate) streams: BTreeMap<u64, bool>,
    /// Events handed out and not destroyed (raw handles).
    pub(crate) events: BTreeSet<u64>,
    /// Destroyed events, recorded again before new ones are created.
    pub(crate) event_pool: Vec<u64>,
    /// Live segments: address -> size.
    pub(crate) allocs: BTreeMap<u64, u64>,
    /// Live reservations by base address.
    pub(crate) resv: BTreeMap<u64, Resv>,
    /// Peer devices whose primary context is retained (peer access).
    pub(crate) peers: BTreeSet<sys::CUdevice>,
    /// IPC mappings opened here: address -> size.
    pub(crate) ipc_opened: BTreeMap<u64, u64>,
}

impl State {
    pub(crate) fn stream(&self, s: StreamId) -> Result<sys::CUstream, BackendError> {
        if self.streams.contains_key(&s.0) {
            Ok(s.0 as sys::CUstream)
        } else {
            Err(BackendError::InvalidValue(format!(
                "unknown stream {s} on CUDA (create it, or adopt a foreign one first)"
            )))
        }
    }

    pub(crate) fn event(&self, e: EventId) -> Result<sys::CUevent, BackendError> {
        if self.events.contains(&e.0) {
            Ok(e.0 as sys::CUevent)
        } else {
            Err(BackendError::InvalidValue(format!(
                "unknown event {} on CUDA",
                e.0
            )))
        }
    }
}

/// A CUDA device as a Reservoir backend. See the [crate documentation](crate).
pub struct CudaDevice {
    pub(crate) ordinal: i32,
    /// The primary context (a `CUcontext` as an integer, so the device is
    /// `Send + Sync` without an unsafe impl).
    ctx: usize,
    name: String,
    /// Page size of the virtual-memory capability; 0 without it.
    pub(crate) granularity: u64,
    ipc: bool,
    peer: bool,
    fake: Option<FakeDriver>,
    pub(crate) state: Mutex<State>,
    /// Adopted streams forgotten so far ([`Backend::stream_epoch`]).
    forgotten_streams: std::sync::atomic::AtomicU64,
    /// Keeps the library referenced while the device lives.
    _driver: Driver,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("granularity", &self.granularity)
            .field("fake", &self.fake.is_some())
            .finish_non_exhaustive()
    }
}

fn setup(call: &'static str, r: CUresult) -> Result<(), CudaError> {
    check(call, r).map_err(CudaError::Setup)
}

impl CudaDevice {
    /// Open device `ordinal` (0 for the first) in its primary context.
    ///
    /// Fails with [`CudaError::NoDriver`] when no driver library loads,
    /// [`CudaError::MissingSymbol`] when it lacks an entry point this crate
    /// calls, [`CudaError::NoDevice`] for a bad ordinal or a driver without
    /// a GPU; never panics.
    pub fn new(ordinal: i32) -> Result<CudaDevice, CudaError> {
        let drv = Driver::open()?;
        // Every entry point was checked to exist by `Driver::open` (so
        // cudarc's lazy loader finds it), and every out-pointer below is a
        // live local of the right type.
        // SAFETY: see above.
        let r = unsafe { sys::cuInit(0) };
        if r == CUresult::CUDA_ERROR_NO_DEVICE {
            // A driver without a GPU (a container with the driver mounted).
            return Err(CudaError::NoDevice { ordinal, count: 0 });
        }
        setup("cuInit", r)?;
        let mut count: c_int = 0;
        // SAFETY: see above.
        setup("cuDeviceGetCount", unsafe {
            sys::cuDeviceGetCount(&mut count)
        })?;
        if ordinal < 0 || ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: see above.
        setup("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut dev, ordinal)
        })?;
        let mut raw_name = [0 as c_char; 256];
        // SAFETY: see above; the buffer holds `len` bytes.
        setup("cuDeviceGetName", unsafe {
            sys::cuDeviceGetName(raw_name.as_mut_ptr(), raw_name.len() as c_int, dev)
        })?;
        let name: String = raw_name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8 as char)
            .collect();
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: see above.
        setup("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        let fake = FakeDriver::load(&drv.file);
        let mut device = CudaDevice {
            ordinal,
            ctx: ctx as usize,
            name,
            granularity: 0,
            ipc: drv.has_all(driver::IPC),
            peer: false,
            fake,
            state: Mutex::new(State {
                streams: BTreeMap::from([(0, false)]),
                events: BTreeSet::new(),
                event_pool: Vec::new(),
                allocs: BTreeMap::new(),
                resv: BTreeMap::new(),
                ipc_opened: BTreeMap::new(),
                peers: BTreeSet::new(),
            }),
            forgotten_streams: std::sync::atomic::AtomicU64::new(0),
            _driver: drv,
        };
        // From here on `device` releases the context if set-up fails.
        device.bind().map_err(CudaError::Setup)?;
        let vmm = device._driver.has_all(driver::VMM)
            && device
                .attribute(
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                )
                .map_err(CudaError::Setup)?
                != 0;
        if vmm {
            device.granularity = device.query_granularity().map_err(CudaError::Setup)?;
        }
        if device._driver.has_all(driver::PEER) {
            for peer in (0..count).filter(|&p| p != ordinal) {
                if device.can_access_peer(peer).map_err(CudaError::Setup)? {
                    device.peer = true;
                }
            }
        }
        Ok(device)
    }

    /// The device's name as the driver reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True when the driver exports the IPC entry points
    /// ([`ipc_get_handle`](Self::ipc_get_handle) and the rest).
    pub fn supports_ipc(&self) -> bool {
        self.ipc
    }

    /// True when another device reported peer access to this one at start-up.
    pub fn has_peers(&self) -> bool {
        self.peer
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// The fake driver's process-wide hooks, when the driver is the fake of
    /// `../shared/oracle` (`None` on a real driver).
    pub fn fake(&self) -> Option<&FakeDriver> {
        self.fake.as_ref()
    }

    /// Make the primary context current on this thread.
    pub(crate) fn bind(&self) -> Result<(), BackendError> {
        // SAFETY: checked entry point; the context is retained until drop.
        check("cuCtxSetCurrent", unsafe {
            sys::cuCtxSetCurrent(self.ctx as sys::CUcontext)
        })
    }

    fn attribute(&self, a: sys::CUdevice_attribute) -> Result<i32, BackendError> {
        let mut dev: sys::CUdevice = 0;
        let mut v: c_int = 0;
        // SAFETY: checked entry points; out-pointers are live locals.
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut dev, self.ordinal)
        })?;
        // SAFETY: as above.
        check("cuDeviceGetAttribute", unsafe {
            sys::cuDeviceGetAttribute(&mut v, a, dev)
        })?;
        Ok(v)
    }

    /// `BackendError::OutOfMemory` for a request of `requested` bytes, with
    /// the free bytes the driver reports now.
    pub(crate) fn oom(&self, requested: u64) -> BackendError {
        BackendError::OutOfMemory {
            requested,
            free: self.mem_info().map(|m| m.free).unwrap_or(0),
        }
    }

    /// Use a stream made elsewhere (PyTorch's `cudaStream_t`, another
    /// library's `CUstream`) with this device; its [`StreamId`] is the
    /// handle value. Adopting a stream twice, or the default stream, is a
    /// no-op. The device never destroys an adopted stream.
    ///
    /// # Safety
    ///
    /// `stream` must be a live stream of this device's primary context (or
    /// `CU_STREAM_LEGACY` / `CU_STREAM_PER_THREAD`), and must stay live
    /// until [`forget_stream`](Self::forget_stream) or until the device is
    /// dropped: the driver is handed it without further checks.
    pub unsafe fn adopt_stream(&self, stream: sys::CUstream) -> StreamId {
        let id = stream as u64;
        self.state.lock().streams.entry(id).or_insert(false);
        StreamId(id)
    }

    /// Stop using an adopted stream. Streams created by the device and the
    /// default stream cannot be forgotten.
    pub fn forget_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        let mut st = self.state.lock();
        match st.streams.get(&stream.0) {
            Some(false) if stream.0 != 0 => {
                st.streams.remove(&stream.0);
                self.forgotten_streams
                    .fetch_add(1, std::sync::atomic::Ordering::Release);
                Ok(())
            }
            _ => Err(BackendError::InvalidValue(format!(
                "stream {stream} is not an adopted CUDA stream"
            ))),
        }
    }

    /// Can this device access device `peer`'s memory
    /// (`cuDeviceCanAccessPeer`)? A device is not its own peer.
    pub fn can_access_peer(&self, peer: i32) -> Result<bool, BackendError> {
        let mut me: sys::CUdevice = 0;
        let mut other: sys::CUdevice = 0;
        let mut can: c_int = 0;
        // SAFETY: checked entry points; out-pointers are live locals.
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut me, self.ordinal)
        })?;
        // SAFETY: as above.
        check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut other, peer) })?;
        // SAFETY: as above.
        check("cuDeviceCanAccessPeer", unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, me, other)
        })?;
        Ok(can != 0)
    }

    /// Let this device's context access device `peer`'s memory
    /// (`cuCtxEnablePeerAccess` on `peer`'s primary context). Answers
    /// [`BackendError::Unsupported`] when the driver says the devices
    /// cannot be peers; enabling twice is fine.
    pub fn enable_peer_access(&self, peer: i32) -> Result<(), BackendError> {
        if !self._driver.has_all(driver::PEER) || !self.can_access_peer(peer)? {
            return Err(BackendError::Unsupported {
                backend: NAME,
                what: "peer access (cuDeviceCanAccessPeer says no)",
            });
        }
        let mut st = self.state.lock();
        self.bind()?;
        let mut dev: sys::CUdevice = 0;
        let mut peer_ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: checked entry points; out-pointers are live locals.
        check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, peer) })?;
        // SAFETY: as above. The peer's primary context stays retained until
        // the device is dropped (once per peer), so it outlives the access.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut peer_ctx, dev)
        })?;
        if !st.peers.insert(dev) {
            // SAFETY: drops the extra reference just taken: one is kept.
            let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) };
        }
        // SAFETY: `peer_ctx` is retained; checked entry point.
        match unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) } {
            CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
            r => check("cuCtxEnablePeerAccess", r),
        }
    }

    /// Export the segment at `ptr` (the base of a live segment) for another
    /// process (`cuIpcGetMemHandle`).
    pub fn ipc_get_handle(&self, ptr: DevicePtr) -> Result<IpcMemHandle, BackendError> {
        self.need_ipc("cuIpcGetMemHandle")?;
        let st = self.state.lock();
        if !st.allocs.contains_key(&ptr.0) {
            return Err(BackendError::InvalidValue(format!(
                "IPC export of {ptr}, which is not the base of a live CUDA segment"
            )));
        }
        self.bind()?;
        let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: checked entry point; `ptr` is a live segment of this
        // context; `h` is a live local.
        check("cuIpcGetMemHandle", unsafe {
            sys::cuIpcGetMemHandle(&mut h, ptr.0)
        })?;
        Ok(IpcMemHandle(h.reserved.map(|c| c as u8)))
    }

    /// Map a segment exported by another process
    /// (`cuIpcOpenMemHandle_v2` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`,
    /// as PyTorch does). Opening a handle in the process that exported it
    /// fails with the driver's `CUDA_ERROR_INVALID_CONTEXT`.
    pub fn ipc_open(&self, handle: &IpcMemHandle) -> Result<DevicePtr, BackendError> {
        self.need_ipc("cuIpcOpenMemHandle_v2")?;
        let mut st = self.state.lock();
        self.bind()?;
        let h = sys::CUipcMemHandle {
            reserved: handle.0.map(|b| b as c_char),
        };
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: checked entry point; the driver validates the handle's
        // bytes; `ptr` is a live local.
        check("cuIpcOpenMemHandle_v2", unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                h,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        })?;
        let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: checked entry point; `ptr` was just mapped; out-pointers
        // are live locals.
        let r = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) };
        if let Err(e) = check("cuMemGetAddressRange_v2", r) {
            // SAFETY: `ptr` was opened above and is closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(ptr) };
            return Err(e);
        }
        st.ipc_opened.insert(ptr, size as u64);
        Ok(DevicePtr(ptr))
    }

    /// Unmap a segment opened with [`ipc_open`](Self::ipc_open).
    pub fn ipc_close(&self, ptr: DevicePtr) -> Result<(), BackendError> {
        self.need_ipc("cuIpcCloseMemHandle")?;
        let mut st = self.state.lock();
        if !st.ipc_opened.contains_key(&ptr.0) {
            return Err(BackendError::InvalidValue(format!(
                "IPC close of {ptr}, which was not opened here"
            )));
        }
        self.bind()?;
        // SAFETY: checked entry point; `ptr` was opened by `ipc_open`.
        check("cuIpcCloseMemHandle", unsafe {
            sys::cuIpcCloseMemHandle(ptr.0)
        })?;
        st.ipc_opened.remove(&ptr.0);
        Ok(())
    }

    fn need_ipc(&self, what: &'static str) -> Result<(), BackendError> {
        if self.ipc {
            Ok(())
        } else {
            Err(BackendError::Unsupported {
                backend: NAME,
                what,
            })
        }
    }

    /// Live segments and the bytes they hold.
    pub fn live(&self) -> (usize, u64) {
        let st = self.state.lock();
        (st.allocs.len(), st.allocs.values().sum())
    }

    /// Events handed out and not destroyed, and events in the pool.
    pub fn event_counts(&self) -> (usize, usize) {
        let st = self.state.lock();
        (st.events.len(), st.event_pool.len())
    }

    /// Operations pending on `stream` (`fakecuda_stream_pending`; needs the
    /// fake driver).
    pub fn pending(&self, stream: StreamId) -> Result<u64, BackendError> {
        let fake = self.need_fake("pending")?;
        let s = self.state.lock().stream(stream)? as u64;
        Ok(fake.pending(s))
    }

    /// Enqueue a fake kernel on `stream` that touches `len` bytes at `ptr`
    /// (`fakecuda_stream_enqueue`; needs the fake driver): the sanitizer
    /// checks the range against other streams' pending work.
    pub fn enqueue(
        &self,
        stream: StreamId,
        ptr: DevicePtr,
        len: u64,
        write: bool,
    ) -> Result<(), BackendError> {
        let fake = self.need_fake("enqueue")?;
        let s = self.state.lock().stream(stream)? as u64;
        match fake.enqueue(s, ptr.0, len, write) {
            0 => Ok(()),
            e => Err(BackendError::InvalidValue(format!(
                "fakecuda_stream_enqueue({stream}, {ptr}, {len}) returned {e}"
            ))),
        }
    }

    pub(crate) fn need_fake(&self, what: &'static str) -> Result<&FakeDriver, BackendError> {
        self.fake.as_ref().ok_or(BackendError::Unsupported {
            backend: NAME,
            what,
        })
    }

    /// Synchronise the context, logging (not returning) a failure: for drop.
    fn sync_quietly(&self) {
        if let Err(e) = self.synchronize_device() {
            tracing::warn!(error = %e, "CUDA device synchronisation failed while dropping");
        }
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        self.sync_quietly();
        let st = self.state.get_mut();
        let live = st.allocs.len() + st.resv.len() + st.ipc_opened.len();
        if live > 0 {
            tracing::warn!(
                segments = st.allocs.len(),
                reservations = st.resv.len(),
                ipc = st.ipc_opened.len(),
                "CUDA device dropped with live memory; freeing it"
            );
        }
        // Every handle below was made by this device, is still live
        // (tracked in `state`) and is released exactly once; the context
        // has been synchronised, so no work uses the memory, streams or
        // events.
        for (addr, _) in std::mem::take(&mut st.allocs) {
            // SAFETY: a live segment of this context (see above).
            let _ = unsafe { sys::cuMemFree_v2(addr) };
        }
        for (base, r) in std::mem::take(&mut st.resv) {
            for (off, h) in r.pages {
                // SAFETY: a page this device mapped (see above).
                let _ = unsafe { sys::cuMemUnmap(base + off, self.granularity as usize) };
                // SAFETY: the page's physical handle (see above).
                let _ = unsafe { sys::cuMemRelease(h) };
            }
            // SAFETY: a live reservation, now unmapped (see above).
            let _ = unsafe { sys::cuMemAddressFree(base, r.size as usize) };
        }
        for (p, _) in std::mem::take(&mut st.ipc_opened) {
            // SAFETY: an IPC mapping opened here (see above).
            let _ = unsafe { sys::cuIpcCloseMemHandle(p) };
        }
        for e in st.events.iter().chain(&st.event_pool) {
            // SAFETY: an event created here (see above).
            let _ = unsafe { sys::cuEventDestroy_v2(*e as sys::CUevent) };
        }
        for (&s, &owned) in &st.streams {
            if owned {
                // SAFETY: a stream created here (see above).
                let _ = unsafe { sys::cuStreamDestroy_v2(s as sys::CUstream) };
            }
        }
        for &peer in &st.peers {
            // SAFETY: releases the reference `enable_peer_access` kept.
            let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(peer) };
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: checked entry point; `dev` is a live local.
        if unsafe { sys::cuDeviceGet(&mut dev, self.ordinal) } == CUresult::CUDA_SUCCESS {
            // SAFETY: releases the reference `new` retained.
            let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) };
        }
    }
}

impl Backend for CudaDevice {
    fn name(&self) -> &'static str {
        NAME
    }

    /// `cuMemAlloc_v2`.
    fn allocate(&self, size: u64, _stream: StreamId) -> Result<DevicePtr, BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("allocate")?;
        if size == 0 {
            return Err(BackendError::InvalidValue(
                "zero-byte CUDA allocation".into(),
            ));
        }
        let mut st = self.state.lock();
        self.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: checked entry point; `ptr` is a live local.
        match unsafe { sys::cuMemAlloc_v2(&mut ptr, size as usize) } {
            CUresult::CUDA_SUCCESS => {
                st.allocs.insert(ptr, size);
                Ok(DevicePtr(ptr))
            }
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                drop(st);
                Err(self.oom(size))
            }
            r => Err(driver::error("cuMemAlloc_v2", r)),
        }
    }

    /// `cuCtxSynchronize` (what `cudaFree` does on a GPU), then
    /// `cuMemFree_v2`.
    fn free(&self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("free")?;
        let mut st = self.state.lock();
        match st.allocs.get(&ptr.0) {
            Some(&s) if s == size => {}
            Some(&s) => {
                return Err(BackendError::InvalidValue(format!(
                    "CUDA free of {ptr} with size {size}, but it was allocated with {s}"
                )))
            }
            None => {
                return Err(BackendError::InvalidValue(format!(
                    "CUDA free of {ptr}, which is not a live segment"
                )))
            }
        }
        self.bind()?;
        // SAFETY: checked entry point.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })?;
        // SAFETY: `ptr` is a live segment of this context, freed once (it
        // leaves the map below); the device has finished all work.
        check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(ptr.0) })?;
        st.allocs.remove(&ptr.0);
        Ok(())
    }

    /// `cuMemGetInfo_v2`.
    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("mem_info")?;
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: checked entry point; out-pointers are live locals.
        check("cuMemGetInfo_v2", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    /// `cuStreamCreate(CU_STREAM_NON_BLOCKING)`.
    fn create_stream(&self) -> Result<StreamId, BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("create_stream")?;
        let mut st = self.state.lock();
        self.bind()?;
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: checked entry point; `s` is a live local.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        st.streams.insert(s as u64, true);
        Ok(StreamId(s as u64))
    }

    /// A created or adopted stream, or the default stream.
    fn check_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("check_stream")?;
        self.state.lock().stream(stream).map(|_| ())
    }

    /// Changes when [`forget_stream`](CudaDevice::forget_stream) forgets one.
    fn stream_epoch(&self) -> u64 {
        self.forgotten_streams
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// `cuEventRecord` of a pooled `CU_EVENT_DISABLE_TIMING` event.
    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("record_event")?;
        let mut st = self.state.lock();
        let s = st.stream(stream)?;
        self.bind()?;
        let e = match st.event_pool.pop() {
            Some(e) => e as sys::CUevent,
            None => {
                let mut e: sys::CUevent = std::ptr::null_mut();
                // SAFETY: checked entry point; `e` is a live local.
                check("cuEventCreate", unsafe {
                    sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
                })?;
                e
            }
        };
        // SAFETY: `e` is a live event and `s` a live stream of this context.
        if let Err(err) = check("cuEventRecord", unsafe { sys::cuEventRecord(e, s) }) {
            st.event_pool.push(e as u64);
            return Err(err);
        }
        st.events.insert(e as u64);
        Ok(EventId(e as u64))
    }

    /// `cuEventQuery`: `CUDA_ERROR_NOT_READY` is `false`.
    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("query_event")?;
        let st = self.state.lock();
        let e = st.event(event)?;
        self.bind()?;
        // SAFETY: `e` is a live event of this device.
        match unsafe { sys::cuEventQuery(e) } {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => Err(driver::error("cuEventQuery", r)),
        }
    }

    /// `cuEventSynchronize`.
    fn synchronize_event(&self, event: EventId) -> Result<(), BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("synchronize_event")?;
        let st = self.state.lock();
        let e = st.event(event)?;
        self.bind()?;
        // SAFETY: `e` is a live event of this device.
        check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(e) })
    }

    /// Back to the event pool (destroyed with the device).
    fn destroy_event(&self, event: EventId) -> Result<(), BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("destroy_event")?;
        let mut st = self.state.lock();
        st.event(event)?;
        st.events.remove(&event.0);
        st.event_pool.push(event.0);
        Ok(())
    }

    /// `cuStreamSynchronize`.
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("synchronize_stream")?;
        let st = self.state.lock();
        let s = st.stream(stream)?;
        self.bind()?;
        // SAFETY: `s` is a live stream of this context.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(s)
        })
    }

    /// `cuCtxSynchronize`.
    fn synchronize_device(&self) -> Result<(), BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("synchronize_device")?;
        self.bind()?;
        // SAFETY: checked entry point.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// `cuStreamWaitEvent`.
    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("stream_wait_event")?;
        let st = self.state.lock();
        let s = st.stream(stream)?;
        let e = st.event(event)?;
        self.bind()?;
        // SAFETY: live stream and event of this context.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(s, e, 0)
        })
    }

    fn as_virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        (self.granularity > 0).then_some(self as &dyn VirtualMemory)
    }

    fn as_memcpy(&self) -> Option<&dyn Memcpy> {
        Some(self)
    }

    fn as_device_work(&self) -> Option<&dyn DeviceWork> {
        Some(self)
    }

    fn as_ipc(&self) -> Option<&dyn Ipc> {
        self.ipc.then_some(self as &dyn Ipc)
    }
}

/// The caching allocator's IPC (spec 1.16) over `cuIpc*`: a handle is the
/// 64 bytes of the segment's `CUipcMemHandle`.
impl Ipc for CudaDevice {
    fn export_segment(&self, segment: DevicePtr) -> Result<Vec<u8>, BackendError> {
        Ok(self.ipc_get_handle(segment)?.0.to_vec())
    }

    fn open_segment(&self, handle: &[u8]) -> Result<(DevicePtr, u64), BackendError> {
        let bytes: [u8; 64] = handle.try_into().map_err(|_| {
            BackendError::InvalidValue(format!(
                "CUDA IPC handle of {} bytes: a cudaIpcMemHandle is 64 bytes",
                handle.len()
            ))
        })?;
        let ptr = self.ipc_open(&IpcMemHandle(bytes))?;
        let size = self.state.lock().ipc_opened[&ptr.0];
        Ok((ptr, size))
    }

    fn close_segment(&self, base: DevicePtr) -> Result<(), BackendError> {
        self.ipc_close(base)
    }
}
