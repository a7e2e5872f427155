//! The virtual-memory capability of [`CudaDevice`]: what PyTorch's
//! `ExpandableSegment` (`c10/cuda/CUDACachingAllocator.cpp`) does with the
//! driver. A reservation is `cuMemAddressReserve`; `map` creates one
//! physical handle per page (`cuMemCreate` of one granularity unit), maps
//! each (`cuMemMap`) and grants read-write access to the range
//! (`cuMemSetAccess`); `unmap` unmaps and releases each page's handle
//! (`cuMemUnmap` + `cuMemRelease`), so any page range can be given back;
//! `release` is `cuMemAddressFree` of a fully unmapped reservation. Ranges
//! are checked against what is mapped before the driver sees them.

use cudarc::driver::sys::{self, CUresult};
use reservoir::backend::{BackendError, DevicePtr, Reservation, VirtualMemory};

use crate::device::{CudaDevice, Resv, State};
use crate::driver::{self, check};

fn invalid(msg: String) -> BackendError {
    BackendError::InvalidValue(msg)
}

impl CudaDevice {
    /// `cuMemGetAllocationGranularity` (minimum) of pinned device memory.
    pub(crate) fn query_granularity(&self) -> Result<u64, BackendError> {
        let prop = self.allocation_prop();
        let mut g: usize = 0;
        // SAFETY: checked entry point (VMM set); `prop` and `g` are live
        // locals.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        Ok(g as u64)
    }

    /// Pinned memory on this device, no shareable handle (as PyTorch when
    /// IPC of expandable segments is off).
    fn allocation_prop(&self) -> sys::CUmemAllocationProp {
        sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: self.location(),
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        }
    }

    fn location(&self) -> sys::CUmemLocation {
        sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            __bindgen_anon_1: sys::CUmemLocation_st__bindgen_ty_1 { id: self.ordinal },
        }
    }

    /// Mapped page runs of `reservation`, as (offset, length) in address
    /// order, adjacent pages merged.
    pub fn mapped_runs(&self, reservation: Reservation) -> Result<Vec<(u64, u64)>, BackendError> {
        let st = self.state.lock();
        let r = live_resv(&st, reservation)?;
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &off in r.pages.keys() {
            match runs.last_mut() {
                Some((o, l)) if *o + *l == off => *l += self.granularity,
                _ => runs.push((off, self.granularity)),
            }
        }
        Ok(runs)
    }

    /// Check `[offset, offset + len)` of `r`: live, aligned, inside.
    fn check_vm_range(
        &self,
        st: &State,
        what: &str,
        r: Reservation,
        offset: u64,
        len: u64,
    ) -> Result<(), BackendError> {
        let resv = live_resv(st, r)?;
        let g = self.granularity;
        if len == 0 || offset % g != 0 || len % g != 0 || offset + len > resv.size {
            return Err(invalid(format!(
                "{what} of [{offset}, +{len}) in reservation {} of {} bytes: not a \
                 non-empty range of whole {g}-byte pages inside it",
                r.base, resv.size
            )));
        }
        Ok(())
    }

    /// Unmap and release the given pages (rolling back a failed map, or
    /// unmapping). Returns the first error.
    fn drop_pages(&self, base: u64, pages: &[(u64, u64, bool)]) -> Result<(), BackendError> {
        let mut first = Ok(());
        for &(off, h, mapped) in pages {
            if mapped {
                // SAFETY: checked entry point; the page at `base + off` was
                // mapped by this device and nothing else unmaps it.
                let r = unsafe { sys::cuMemUnmap(base + off, self.granularity as usize) };
                if first.is_ok() {
                    first = check("cuMemUnmap", r);
                }
            }
            // SAFETY: `h` was created by `cuMemCreate` here and is released
            // once (its page leaves the map, or it never entered it).
            let r = unsafe { sys::cuMemRelease(h) };
            if first.is_ok() {
                first = check("cuMemRelease", r);
            }
        }
        first
    }
}

fn live_resv(st: &State, r: Reservation) -> Result<&Resv, BackendError> {
    match st.resv.get(&r.base.0) {
        Some(x) if x.size == r.size => Ok(x),
        _ => Err(invalid(format!(
            "{}: not a live CUDA reservation of {} bytes",
            r.base, r.size
        ))),
    }
}

impl VirtualMemory for CudaDevice {
    fn granularity(&self) -> u64 {
        self.granularity
    }

    /// `cuMemAddressReserve`.
    fn reserve(&self, size: u64) -> Result<Reservation, BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("reserve")?;
        let g = self.granularity;
        if size == 0 || size % g != 0 {
            return Err(invalid(format!(
                "reserve of {size} bytes: not a positive multiple of the granularity {g}"
            )));
        }
        let mut st = self.state.lock();
        self.bind()?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: checked entry point; `base` is a live local.
        match unsafe { sys::cuMemAddressReserve(&mut base, size as usize, 0, 0, 0) } {
            CUresult::CUDA_SUCCESS => {}
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                drop(st);
                return Err(self.oom(size));
            }
            r => return Err(driver::error("cuMemAddressReserve", r)),
        }
        st.resv.insert(
            base,
            Resv {
                size,
                pages: Default::default(),
            },
        );
        Ok(Reservation {
            base: DevicePtr(base),
            size,
        })
    }

    /// One `cuMemCreate` + `cuMemMap` per page, then `cuMemSetAccess` of
    /// the range; nothing stays mapped on failure.
    fn map(&self, reservation: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("map")?;
        let mut st = self.state.lock();
        self.check_vm_range(&st, "map", reservation, offset, len)?;
        let g = self.granularity;
        let base = reservation.base.0;
        let resv = &st.resv[&base];
        if let Some((&o, _)) = resv.pages.range(offset..offset + len).next() {
            return Err(invalid(format!(
                "map of [{offset}, +{len}) in reservation {}: page {o} is already mapped",
                reservation.base
            )));
        }
        self.bind()?;
        let prop = self.allocation_prop();
        // (offset, handle, mapped) of every page done so far.
        let mut done: Vec<(u64, u64, bool)> = Vec::new();
        let mut failure = None;
        for off in (offset..offset + len).step_by(g as usize) {
            let mut h: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: checked entry point; `h` and `prop` are live locals.
            let r = unsafe { sys::cuMemCreate(&mut h, g as usize, &prop, 0) };
            if r != CUresult::CUDA_SUCCESS {
                failure = Some(("cuMemCreate", r));
                break;
            }
            done.push((off, h, false));
        }
        if failure.is_none() {
            for page in &mut done {
                // SAFETY: the page lies inside a live reservation of this
                // device and is not mapped (checked above); `page.1` is a
                // live physical handle of exactly one page.
                let r = unsafe { sys::cuMemMap(base + page.0, g as usize, 0, page.1, 0) };
                if r != CUresult::CUDA_SUCCESS {
                    failure = Some(("cuMemMap", r));
                    break;
                }
                page.2 = true;
            }
        }
        if failure.is_none() {
            let access = sys::CUmemAccessDesc {
                location: self.location(),
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: the range is mapped (above); `access` is a live local
            // array of one descriptor.
            let r = unsafe { sys::cuMemSetAccess(base + offset, len as usize, &access, 1) };
            if r != CUresult::CUDA_SUCCESS {
                failure = Some(("cuMemSetAccess", r));
            }
        }
        if let Some((call, r)) = failure {
            // Roll back; the original failure is the one to report.
            let _ = self.drop_pages(base, &done);
            drop(st);
            return Err(match r {
                CUresult::CUDA_ERROR_OUT_OF_MEMORY => self.oom(len),
                r => driver::error(call, r),
            });
        }
        let resv = st.resv.get_mut(&base).expect("checked above");
        resv.pages.extend(done.into_iter().map(|(o, h, _)| (o, h)));
        Ok(())
    }

    /// `cuMemUnmap` + `cuMemRelease` of every page (all must be mapped).
    fn unmap(&self, reservation: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("unmap")?;
        let mut st = self.state.lock();
        self.check_vm_range(&st, "unmap", reservation, offset, len)?;
        let base = reservation.base.0;
        let g = self.granularity;
        let resv = st.resv.get_mut(&base).expect("checked above");
        if resv.pages.range(offset..offset + len).count() as u64 != len / g {
            return Err(invalid(format!(
                "unmap of [{offset}, +{len}) in reservation {}: not every page is mapped",
                reservation.base
            )));
        }
        self.bind()?;
        let pages: Vec<(u64, u64, bool)> = (offset..offset + len)
            .step_by(g as usize)
            .map(|o| (o, resv.pages.remove(&o).expect("checked above"), true))
            .collect();
        self.drop_pages(base, &pages)
    }

    /// `cuMemAddressFree` (all pages must be unmapped).
    fn release(&self, reservation: Reservation) -> Result<(), BackendError> {
        #[cfg(feature = "fault-injection")]
        crate::faults::gate("release")?;
        let mut st = self.state.lock();
        let resv = live_resv(&st, reservation)?;
        if !resv.pages.is_empty() {
            return Err(invalid(format!(
                "release of reservation {} with {} page(s) still mapped",
                reservation.base,
                resv.pages.len()
            )));
        }
        self.bind()?;
        // SAFETY: checked entry point; a live, fully unmapped reservation of
        // this device, freed once (it leaves the map below).
        check("cuMemAddressFree", unsafe {
            sys::cuMemAddressFree(reservation.base.0, reservation.size as usize)
        })?;
        st.resv.remove(&reservation.base.0);
        Ok(())
    }
}
