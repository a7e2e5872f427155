//! Virtual memory of the host device: reservations of `PROT_NONE` address
//! space whose granularity-aligned runs are mapped read-write on demand.

use std::collections::BTreeMap;

use reservoir::backend::{BackendError, DevicePtr, Reservation, VirtualMemory};

use super::{invalid, os_error, to_usize, HostDevice, Resv, State};
use crate::mapping::Mapping;

impl State {
    fn reserve(&mut self, size: u64, gran: u64) -> Result<Reservation, BackendError> {
        if size == 0 || size % gran != 0 {
            return Err(invalid(format!(
                "reserve of {size} bytes: not a positive multiple of the granularity {gran}"
            )));
        }
        let map = Mapping::reserve_aligned(to_usize(size)?, to_usize(gran)?)
            .map_err(|e| os_error("mmap (reserve)", &e, size, self.free_bytes()))?;
        let base = map.addr();
        self.resv.insert(
            base,
            Resv {
                map,
                runs: BTreeMap::new(),
                mapped: 0,
            },
        );
        self.c.reserves += 1;
        Ok(Reservation {
            base: DevicePtr(base),
            size,
        })
    }

    /// Validate a map/unmap range of a live reservation.
    fn check_range(
        &self,
        what: &str,
        r: Reservation,
        offset: u64,
        len: u64,
        gran: u64,
    ) -> Result<(), BackendError> {
        let Some(resv) = self.resv.get(&r.base.0) else {
            return Err(invalid(format!(
                "{what} in reservation {}: not a live reservation of the host device",
                r.base
            )));
        };
        let size = resv.map.len() as u64;
        if size != r.size {
            return Err(invalid(format!(
                "{what} in reservation {}: it has size {size}, not {}",
                r.base, r.size
            )));
        }
        if len == 0 || offset % gran != 0 || len % gran != 0 {
            return Err(invalid(format!(
                "{what} of [{offset:#x}, +{len:#x}) in reservation {}: empty or not aligned to \
                 the granularity {gran:#x}",
                r.base
            )));
        }
        if offset.checked_add(len).map_or(true, |end| end > size) {
            return Err(invalid(format!(
                "{what} of [{offset:#x}, +{len:#x}) is outside reservation {} of {size:#x} bytes",
                r.base
            )));
        }
        Ok(())
    }

    fn map(
        &mut self,
        r: Reservation,
        offset: u64,
        len: u64,
        gran: u64,
    ) -> Result<(), BackendError> {
        self.check_range("map", r, offset, len, gran)?;
        let end = offset + len;
        let resv = &self.resv[&r.base.0];
        if let Some((&o, &l)) = resv.runs.range(..end).next_back() {
            if o + l > offset {
                return Err(invalid(format!(
                    "map of [{offset:#x}, {end:#x}) in reservation {}: [{o:#x}, {:#x}) is \
                     already mapped",
                    r.base,
                    o + l
                )));
            }
        }
        if !self.fits(len) {
            self.c.failed_maps += 1;
            tracing::debug!(
                len,
                used = self.used,
                capacity = self.capacity,
                "host: map over budget"
            );
            return Err(self.oom(len));
        }
        // Offsets fit in usize: they are inside a mapping of this process.
        let (o, l) = (offset as usize, len as usize);
        if let Err(e) = resv.map.commit(o, l) {
            // Put the range back the way it was (no access, no pages); a
            // failure here leaves pages we never hand out.
            let _ = resv.map.decommit(o, l);
            self.c.failed_maps += 1;
            return Err(os_error("mprotect (map)", &e, len, self.free_bytes()));
        }
        let resv = self.resv.get_mut(&r.base.0).expect("checked");
        insert_run(&mut resv.runs, offset, len);
        resv.mapped += len;
        self.take(len);
        self.c.maps += 1;
        Ok(())
    }

    fn unmap(
        &mut self,
        r: Reservation,
        offset: u64,
        len: u64,
        gran: u64,
    ) -> Result<(), BackendError> {
        self.check_range("unmap", r, offset, len, gran)?;
        let end = offset + len;
        let resv = self.resv.get_mut(&r.base.0).expect("checked");
        // Runs are merged, so a fully mapped range lies inside one run.
        let run = resv
            .runs
            .range(..=offset)
            .next_back()
            .map(|(&o, &l)| (o, l))
            .filter(|&(o, l)| o + l >= end);
        let Some((ro, rl)) = run else {
            return Err(invalid(format!(
                "unmap of [{offset:#x}, {end:#x}) in reservation {}: not all of it is mapped",
                r.base
            )));
        };
        resv.map
            .decommit(offset as usize, len as usize)
            .map_err(|e| BackendError::Driver(format!("host device: unmap: {e}")))?;
        resv.runs.remove(&ro);
        if ro < offset {
            resv.runs.insert(ro, offset - ro);
        }
        if end < ro + rl {
            resv.runs.insert(end, ro + rl - end);
        }
        resv.mapped -= len;
        self.used -= len;
        self.c.unmaps += 1;
        Ok(())
    }

    fn release(&mut self, r: Reservation) -> Result<(), BackendError> {
        let Some(resv) = self.resv.get(&r.base.0) else {
            return Err(invalid(format!(
                "release of {}: not a live reservation of the host device",
                r.base
            )));
        };
        let size = resv.map.len() as u64;
        if size != r.size {
            return Err(invalid(format!(
                "release of reservation {} with size {}, but it has size {size}",
                r.base, r.size
            )));
        }
        if resv.mapped != 0 {
            return Err(invalid(format!(
                "release of reservation {}: {} bytes are still mapped",
                r.base, resv.mapped
            )));
        }
        let resv = self.resv.remove(&r.base.0).expect("checked");
        if let Err((map, e)) = resv.map.unmap() {
            self.resv.insert(
                r.base.0,
                Resv {
                    map,
                    runs: BTreeMap::new(),
                    mapped: 0,
                },
            );
            return Err(BackendError::Driver(format!(
                "host device: munmap of reservation {}: {e}",
                r.base
            )));
        }
        self.c.releases += 1;
        Ok(())
    }
}

impl VirtualMemory for HostDevice {
    fn granularity(&self) -> u64 {
        self.granularity
    }

    fn reserve(&self, size: u64) -> Result<Reservation, BackendError> {
        self.state.lock().reserve(size, self.granularity)
    }

    fn map(&self, reservation: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        self.state
            .lock()
            .map(reservation, offset, len, self.granularity)
    }

    fn unmap(&self, reservation: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        self.state
            .lock()
            .unmap(reservation, offset, len, self.granularity)
    }

    fn release(&self, reservation: Reservation) -> Result<(), BackendError> {
        self.state.lock().release(reservation)
    }
}

/// Add `[o, o + l)` to disjoint runs that do not overlap it, merging it with
/// the runs it touches.
fn insert_run(runs: &mut BTreeMap<u64, u64>, mut o: u64, mut l: u64) {
    if let Some((&po, &pl)) = runs.range(..o).next_back() {
        if po + pl == o {
            runs.remove(&po);
            o = po;
            l += pl;
        }
    }
    if let Some(nl) = runs.remove(&(o + l)) {
        l += nl;
    }
    runs.insert(o, l);
}
