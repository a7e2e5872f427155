//! Virtual memory of the simulated device: reservations take address space
//! only; mapped pages count against the capacity.

use std::collections::BTreeMap;

use super::{invalid, CallKind, CallResult, Resv, SimDevice, State};
use crate::backend::{BackendError, DevicePtr, Reservation, StreamId, VirtualMemory};

impl State {
    fn reserve(&mut self, size: u64) -> Result<Reservation, BackendError> {
        if size == 0 || size % self.vm_gran != 0 {
            return Err(invalid(format!(
                "reserve of {size} bytes: not a positive multiple of the granularity {}",
                self.vm_gran
            )));
        }
        let Some((base, raw, raw_end)) = self.place(size, self.vm_gran) else {
            self.log(
                CallKind::Reserve,
                size,
                0,
                0,
                StreamId::DEFAULT,
                CallResult::OutOfMemory,
            );
            return Err(BackendError::OutOfMemory {
                requested: size,
                free: self.free_bytes(),
            });
        };
        self.resv.insert(
            base,
            Resv {
                size,
                raw,
                raw_end,
                mapped: BTreeMap::new(),
            },
        );
        self.c.reserves += 1;
        self.c.driver_time_ns = self.c.driver_time_ns.saturating_add(self.cost.reserve_ns);
        self.log(
            CallKind::Reserve,
            size,
            base,
            0,
            StreamId::DEFAULT,
            CallResult::Ok,
        );
        Ok(Reservation {
            base: DevicePtr(base),
            size,
        })
    }

    /// Validate a map/unmap range of a live reservation.
    fn check_range(&self, r: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        let Some(resv) = self.resv.get(&r.base.0) else {
            return Err(invalid(format!(
                "reservation at {}: not a live reservation of the sim device",
                r.base
            )));
        };
        if resv.size != r.size {
            return Err(invalid(format!(
                "reservation at {} has size {}, not {}",
                r.base, resv.size, r.size
            )));
        }
        let g = self.vm_gran;
        if len == 0 || offset % g != 0 || len % g != 0 {
            return Err(invalid(format!(
                "range [{offset:#x}, +{len:#x}) of reservation {}: not granularity-aligned ({g:#x}) or empty",
                r.base
            )));
        }
        if offset.checked_add(len).map_or(true, |e| e > resv.size) {
            return Err(invalid(format!(
                "range [{offset:#x}, +{len:#x}) is outside reservation {} of {} bytes",
                r.base, resv.size
            )));
        }
        Ok(())
    }

    fn map(&mut self, r: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        self.check_range(r, offset, len)?;
        let resv = &self.resv[&r.base.0];
        let end = offset + len;
        if let Some((&o, &l)) = resv.mapped.range(..end).next_back() {
            if o + l > offset {
                return Err(invalid(format!(
                    "map of [{offset:#x}, {end:#x}) in reservation {}: [{o:#x}, {:#x}) is already mapped",
                    r.base,
                    o + l
                )));
            }
        }
        self.map_calls += 1;
        let n = self.map_calls;
        let injected = self.faults.nth_map.remove(&n);
        if injected || !self.fits(len) {
            self.c.failed_maps += 1;
            self.c.driver_time_ns = self.c.driver_time_ns.saturating_add(self.cost.map_ns);
            self.log(
                CallKind::Map,
                len,
                r.base.0,
                offset,
                StreamId::DEFAULT,
                CallResult::OutOfMemory,
            );
            tracing::debug!(len, injected, "sim: map failed");
            return Err(BackendError::OutOfMemory {
                requested: len,
                free: self.free_bytes(),
            });
        }
        self.resv
            .get_mut(&r.base.0)
            .expect("checked")
            .mapped
            .insert(offset, len);
        self.take(len);
        let pages = len / self.vm_gran;
        self.c.maps += 1;
        self.c.pages_mapped += pages;
        self.c.driver_time_ns = self.c.driver_time_ns.saturating_add(self.cost.map(pages));
        self.log(
            CallKind::Map,
            len,
            r.base.0,
            offset,
            StreamId::DEFAULT,
            CallResult::Ok,
        );
        Ok(())
    }

    fn unmap(&mut self, r: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        self.check_range(r, offset, len)?;
        let end = offset + len;
        let resv = self.resv.get_mut(&r.base.0).expect("checked");
        // The runs covering [offset, end), which must be contiguous.
        let not_mapped = || {
            invalid(format!(
                "unmap of [{offset:#x}, {end:#x}) in reservation {}: not all of it is mapped",
                r.base
            ))
        };
        let Some((&first, &first_len)) = resv.mapped.range(..=offset).next_back() else {
            return Err(not_mapped());
        };
        let mut covered = first + first_len;
        if covered <= offset {
            return Err(not_mapped());
        }
        let mut runs = vec![first];
        while covered < end {
            match resv.mapped.get(&covered) {
                Some(&l) => {
                    runs.push(covered);
                    covered += l;
                }
                None => return Err(not_mapped()),
            }
        }
        for o in runs {
            resv.mapped.remove(&o);
        }
        if first < offset {
            resv.mapped.insert(first, offset - first);
        }
        if end < covered {
            resv.mapped.insert(end, covered - end);
        }
        self.used -= len;
        let pages = len / self.vm_gran;
        self.c.unmaps += 1;
        self.c.pages_mapped -= pages;
        self.c.driver_time_ns = self.c.driver_time_ns.saturating_add(self.cost.unmap(pages));
        self.log(
            CallKind::Unmap,
            len,
            r.base.0,
            offset,
            StreamId::DEFAULT,
            CallResult::Ok,
        );
        Ok(())
    }

    fn release(&mut self, r: Reservation) -> Result<(), BackendError> {
        let Some(resv) = self.resv.get(&r.base.0) else {
            return Err(invalid(format!(
                "release of {}: not a live reservation of the sim device",
                r.base
            )));
        };
        if resv.size != r.size {
            return Err(invalid(format!(
                "release of reservation {} with size {}, but it has size {}",
                r.base, r.size, resv.size
            )));
        }
        if !resv.mapped.is_empty() {
            let mapped: u64 = resv.mapped.values().sum();
            return Err(invalid(format!(
                "release of reservation {}: {mapped} bytes are still mapped",
                r.base
            )));
        }
        let resv = self.resv.remove(&r.base.0).expect("checked");
        self.space.give(resv.raw, resv.raw_end);
        self.c.releases += 1;
        self.c.driver_time_ns = self.c.driver_time_ns.saturating_add(self.cost.release_ns);
        self.log(
            CallKind::Release,
            r.size,
            r.base.0,
            0,
            StreamId::DEFAULT,
            CallResult::Ok,
        );
        Ok(())
    }
}

impl VirtualMemory for SimDevice {
    fn granularity(&self) -> u64 {
        self.state.lock().vm_gran
    }

    /// Reserve address space (no capacity cost). `size` must be a positive
    /// multiple of the granularity.
    fn reserve(&self, size: u64) -> Result<Reservation, BackendError> {
        self.state.lock().reserve(size)
    }

    /// Map `[offset, offset + len)`: granularity-aligned, inside the
    /// reservation, not mapped yet. Counts `len` against the capacity.
    fn map(&self, reservation: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        self.state.lock().map(reservation, offset, len)
    }

    /// Unmap `[offset, offset + len)`, all of which must be mapped (it may
    /// span several map calls, or part of one).
    fn unmap(&self, reservation: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        self.state.lock().unmap(reservation, offset, len)
    }

    fn release(&self, reservation: Reservation) -> Result<(), BackendError> {
        self.state.lock().release(reservation)
    }
}
