//! Device work on streams, for tests and the stream-safety scenarios:
//! fills (`cuMemsetD8Async`), device-to-device copies
//! (`cuMemcpyDtoDAsync_v2`, also the [`Memcpy`] capability) and read-backs
//! (`cuMemcpyDtoHAsync_v2` + `cuStreamSynchronize`). Every range is checked
//! to lie in one live segment (or IPC mapping), or in mapped pages of one
//! reservation,
//! before the driver sees it: with the fake driver device memory is memory
//! of this process, so an unchecked address would be a wild write.

use cudarc::driver::sys;
use reservoir::backend::{Backend, BackendError, DevicePtr, DeviceWork, Memcpy, StreamId};
use reservoir::checksum::checksum;

use crate::device::{CudaDevice, State};
use crate::driver::check;

impl State {
    /// Check that `[ptr, ptr + len)` is live device memory of this device.
    fn check_range(&self, ptr: DevicePtr, len: u64, granularity: u64) -> Result<(), BackendError> {
        let end = ptr.0.checked_add(len);
        let inside = |map: &std::collections::BTreeMap<u64, u64>| {
            map.range(..=ptr.0)
                .next_back()
                .is_some_and(|(&a, &size)| end.is_some_and(|e| e <= a + size))
        };
        let in_segment = inside(&self.allocs) || inside(&self.ipc_opened);
        let in_mapping = || {
            let Some((&base, r)) = self.resv.range(..=ptr.0).next_back() else {
                return false;
            };
            let Some(end) = end.filter(|&e| e <= base + r.size) else {
                return false;
            };
            let first = (ptr.0 - base) / granularity * granularity;
            (first..end - base)
                .step_by(granularity as usize)
                .all(|o| r.pages.contains_key(&o))
        };
        if len > 0 && (in_segment || in_mapping()) {
            Ok(())
        } else {
            Err(BackendError::InvalidValue(format!(
                "range [{ptr}, +{len}) is not inside live CUDA device memory"
            )))
        }
    }
}

impl CudaDevice {
    /// Copy `len` bytes at `ptr` to host memory after the work enqueued on
    /// `stream` so far, and wait for it.
    pub fn read(
        &self,
        ptr: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<Vec<u8>, BackendError> {
        let st = self.state.lock();
        st.check_range(ptr, len, self.granularity)?;
        let s = st.stream(stream)?;
        self.bind()?;
        let mut host = vec![0u8; len as usize];
        // SAFETY: the source is live device memory (checked); the
        // destination is `len` writable bytes of `host`, which is not
        // touched or freed before the stream has been synchronised below
        // (or leaked if that fails).
        let r =
            unsafe { sys::cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast(), ptr.0, len as usize, s) };
        check("cuMemcpyDtoHAsync_v2", r)?;
        // SAFETY: `s` is a live stream.
        if let Err(e) = check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(s)
        }) {
            // The copy may still write `host`: never free it.
            std::mem::forget(host);
            return Err(e);
        }
        Ok(host)
    }

    /// The [`checksum`] of `len` bytes at `ptr`, read on `stream`.
    pub fn checksum(
        &self,
        ptr: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<u64, BackendError> {
        Ok(checksum(&self.read(ptr, len, stream)?))
    }
}

impl Memcpy for CudaDevice {
    /// Copy `len` bytes from `src` to `dst` on `stream`
    /// (`cuMemcpyDtoDAsync_v2`). The ranges must not overlap.
    fn copy(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        let st = self.state.lock();
        st.check_range(dst, len, self.granularity)?;
        st.check_range(src, len, self.granularity)?;
        if dst.0 < src.0 + len && src.0 < dst.0 + len {
            return Err(BackendError::InvalidValue(format!(
                "overlapping CUDA copy from [{src}, +{len}) to [{dst}, +{len})"
            )));
        }
        let s = st.stream(stream)?;
        self.bind()?;
        // SAFETY: both ranges are live device memory (checked) and do not
        // overlap; `s` is a live stream.
        check("cuMemcpyDtoDAsync_v2", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst.0, src.0, len as usize, s)
        })
    }
}

impl DeviceWork for CudaDevice {
    /// Set `len` bytes at `ptr` to `byte` on `stream` (`cuMemsetD8Async`).
    fn fill(
        &self,
        ptr: DevicePtr,
        len: u64,
        byte: u8,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        let st = self.state.lock();
        st.check_range(ptr, len, self.granularity)?;
        let s = st.stream(stream)?;
        self.bind()?;
        // SAFETY: the range is live device memory of this device (checked)
        // and `s` a live stream; memory stays allocated while work may use
        // it because frees synchronise the context first.
        check("cuMemsetD8Async", unsafe {
            sys::cuMemsetD8Async(ptr.0, byte, len as usize, s)
        })
    }

    fn read_checksum(
        &self,
        ptr: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<Option<u64>, BackendError> {
        self.checksum(ptr, len, stream).map(Some)
    }

    /// Keep `stream` busy: work enqueued on it stays pending until
    /// [`release`](DeviceWork::release) (`fakecuda_stream_hold`; needs the fake
    /// driver). A synchronisation that waits for the stream (a free, a
    /// device synchronisation) completes its work anyway, as a CPU would
    /// wait for a GPU.
    fn hold(&self, stream: StreamId) -> Result<(), BackendError> {
        let fake = self.need_fake("hold")?;
        let s = self.state.lock().stream(stream)? as u64;
        match fake.hold(s) {
            0 => Ok(()),
            e => Err(BackendError::InvalidValue(format!(
                "fakecuda_stream_hold({stream}) returned {e}"
            ))),
        }
    }

    /// End a [`hold`](DeviceWork::hold) and wait for the stream's work.
    fn release(&self, stream: StreamId) -> Result<(), BackendError> {
        let fake = self.need_fake("release")?;
        let s = self.state.lock().stream(stream)? as u64;
        match fake.release(s) {
            0 => self.synchronize_stream(stream),
            e => Err(BackendError::InvalidValue(format!(
                "fakecuda_stream_release({stream}) returned {e}"
            ))),
        }
    }
}
