//! The virtual-memory side of an expandable segment: PyTorch's
//! `ExpandableSegment`, a reserved address range mapped page by page.

use std::ops::Range;

use crate::backend::{BackendError, Reservation, VirtualMemory};

/// A range of addresses (PyTorch's `SegmentRange`): what
/// [`Expandable::map`] and [`Expandable::unmap`] changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentRange {
    /// First address.
    pub ptr: u64,
    /// Bytes (0: nothing).
    pub size: u64,
}

/// The mapping state of an expandable segment (PyTorch's
/// `ExpandableSegment`): its reservation, its page size and which pages are
/// mapped.
///
/// Invariants: a page is marked mapped exactly while the backend has it
/// mapped (only [`map`](Self::map) and [`unmap`](Self::unmap) change the
/// marks, after the driver call succeeded); `pages` is trimmed after the
/// last mapped page. With the blocks of its segment (kept by
/// `caching/expandable.rs`, recounted by `caching/check.rs`): runs of
/// mapped blocks cover exactly the mapped pages.
#[derive(Clone, Debug)]
pub(crate) struct Expandable {
    /// The reserved range.
    reservation: Reservation,
    /// Page size: 2 MiB for the small pool, `large_segment_size` for the large.
    page_size: u64,
    /// Which pages are mapped, trimmed after the last mapped page.
    pages: Vec<bool>,
}

impl Expandable {
    /// A reservation of pages of `page_size` bytes, none mapped yet.
    pub fn new(reservation: Reservation, page_size: u64) -> Expandable {
        Expandable {
            reservation,
            page_size,
            pages: Vec::new(),
        }
    }

    /// A reservation whose pages under `mapped` (sorted, disjoint,
    /// page-aligned `(offset, bytes)` ranges) the caller has mapped already
    /// (a seeded segment, see `caching/seed.rs`).
    pub fn seeded(reservation: Reservation, page_size: u64, mapped: &[(u64, u64)]) -> Expandable {
        let end = mapped.last().map_or(0, |&(o, l)| o + l);
        let mut pages = vec![false; (end / page_size) as usize];
        for &(o, l) in mapped {
            pages[(o / page_size) as usize..((o + l) / page_size) as usize]
                .iter_mut()
                .for_each(|p| *p = true);
        }
        Expandable {
            reservation,
            page_size,
            pages,
        }
    }

    /// The reserved range.
    #[inline]
    pub fn reservation(&self) -> Reservation {
        self.reservation
    }

    /// The first address of the reserved range.
    #[inline]
    pub fn base(&self) -> u64 {
        self.reservation.base.0
    }

    /// The page size.
    #[inline]
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// Is page `page` (counted from the base) mapped?
    #[inline]
    pub fn is_mapped(&self, page: u64) -> bool {
        self.pages.get(page as usize).copied().unwrap_or(false)
    }

    /// The bytes mapped now.
    pub fn mapped_bytes(&self) -> u64 {
        self.pages.iter().filter(|&&m| m).count() as u64 * self.page_size
    }

    /// The pages under the `len` bytes at `addr` (partly covered ones
    /// included): what mapping them maps.
    #[inline]
    fn pages_covering(&self, addr: u64, len: u64) -> Range<u64> {
        let base = self.base();
        (addr - base) / self.page_size..(addr + len - base).div_ceil(self.page_size)
    }

    /// The pages entirely inside `[from, to)`: what unmapping it unmaps.
    /// Empty (`start >= end`) when no whole page is inside.
    #[inline]
    fn pages_inside(&self, from: u64, to: u64) -> Range<u64> {
        let base = self.base();
        (from - base).div_ceil(self.page_size)..(to - base) / self.page_size
    }

    /// The range of the pages `pages`.
    #[inline]
    fn range_of(&self, pages: &Range<u64>) -> SegmentRange {
        SegmentRange {
            ptr: self.base() + pages.start * self.page_size,
            size: (pages.end - pages.start) * self.page_size,
        }
    }

    /// PyTorch's `ExpandableSegment::map`: back the unmapped pages under
    /// the `len` bytes at `addr` (rounded out to whole pages) with physical
    /// memory. Returns the range mapped: empty (and no driver call) when
    /// `len` is 0. On a driver error nothing is mapped and nothing changes.
    pub fn map(
        &mut self,
        vm: &dyn VirtualMemory,
        addr: u64,
        len: u64,
    ) -> Result<SegmentRange, BackendError> {
        let pages = self.pages_covering(addr, len);
        let range = self.range_of(&pages);
        if pages.is_empty() {
            return Ok(range);
        }
        debug_assert!(pages.clone().all(|p| !self.is_mapped(p)));
        vm.map(self.reservation, range.ptr - self.base(), range.size)?;
        if self.pages.len() < pages.end as usize {
            self.pages.resize(pages.end as usize, false);
        }
        self.pages[pages.start as usize..pages.end as usize]
            .iter_mut()
            .for_each(|p| *p = true);
        Ok(range)
    }

    /// Does `[from, to)` hold a whole page (something for
    /// [`unmap`](Self::unmap) to do)?
    #[inline]
    pub fn holds_a_page(&self, from: u64, to: u64) -> bool {
        !self.pages_inside(from, to).is_empty()
    }

    /// PyTorch's `ExpandableSegment::unmap`: give back the physical memory
    /// of the mapped pages entirely inside `[from, to)`. Returns the range
    /// unmapped: empty (and no driver call) when it holds no whole page. On
    /// a driver error nothing changes.
    pub fn unmap(
        &mut self,
        vm: &dyn VirtualMemory,
        from: u64,
        to: u64,
    ) -> Result<SegmentRange, BackendError> {
        let pages = self.pages_inside(from, to);
        if pages.is_empty() {
            return Ok(SegmentRange { ptr: from, size: 0 });
        }
        let range = self.range_of(&pages);
        debug_assert!(pages.clone().all(|p| self.is_mapped(p)));
        vm.unmap(self.reservation, range.ptr - self.base(), range.size)?;
        self.pages[pages.start as usize..pages.end as usize]
            .iter_mut()
            .for_each(|p| *p = false);
        while self.pages.last() == Some(&false) {
            self.pages.pop();
        }
        Ok(range)
    }

    /// Unmap every mapped run of pages, then release the reservation (a
    /// segment given back whole, or at teardown). Returns the bytes that
    /// were mapped. The first driver error stops it.
    pub fn release(&self, vm: &dyn VirtualMemory) -> Result<u64, BackendError> {
        let mut mapped = 0;
        let mut page = 0;
        while page < self.pages.len() {
            if !self.pages[page] {
                page += 1;
                continue;
            }
            let start = page;
            while page < self.pages.len() && self.pages[page] {
                page += 1;
            }
            let len = (page - start) as u64 * self.page_size;
            vm.unmap(self.reservation, start as u64 * self.page_size, len)?;
            mapped += len;
        }
        vm.release(self.reservation)?;
        Ok(mapped)
    }
}
