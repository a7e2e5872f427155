//! Anonymous memory mappings: the only place that holds raw pointers and
//! calls the operating system.
//!
//! A [`Mapping`] owns one range of this process's address space obtained
//! from `mmap`. It never hands out references to the memory: it changes
//! protections, drops physical pages and computes raw pointers into its own
//! range. Whether a page may be *accessed* (it is committed read-write) is
//! tracked by the device's state, which validates every access before it
//! dereferences a pointer from [`Mapping::ptr`].

use std::ffi::CStr;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::{self, NonNull};

/// One anonymous mapping owned by this process.
///
/// Invariants (relied on by every `unsafe` block of this module):
/// * `base..base + len` is a live mapping created by this module and not
///   unmapped by anyone else: only [`Mapping::unmap`] and `Drop` unmap it,
///   and both consume the value;
/// * `base` and `len` are multiples of the OS page size, `len > 0`.
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a `Mapping` is plain process memory, not tied to the thread that
// created it (mmap/mprotect/madvise/munmap may be called from any thread).
// The pointer is only dereferenced by the host device under its mutex.
unsafe impl Send for Mapping {}

// SAFETY: the shared methods (`ptr`, `addr`, `len`, `protect`, `decommit`)
// only compute addresses or change page state inside the owned range through
// system calls that are thread-safe; none creates a reference to the memory.
unsafe impl Sync for Mapping {}

/// Why a range argument was refused before any system call.
fn out_of_range(offset: usize, len: usize, total: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("range [{offset:#x}, +{len:#x}) is outside the mapping of {total:#x} bytes"),
    )
}

impl Mapping {
    /// Map `len` bytes of fresh, zero-filled, read-write anonymous memory.
    /// `len` must be a positive multiple of the page size.
    pub(crate) fn anonymous_rw(len: usize) -> io::Result<Mapping> {
        Self::map_new(
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        )
    }

    /// Map `len` bytes of fresh, zero-filled, read-write memory backed by a
    /// new memfd named `name` (`memfd_create`, `ftruncate`, `mmap
    /// MAP_SHARED`), so that another process can map the same pages. Returns
    /// the mapping and the file, which the caller keeps open while the
    /// memory may be shared. `len` must be a positive multiple of the page
    /// size. Linux only.
    pub(crate) fn shared_memfd(len: usize, name: &CStr) -> io::Result<(Mapping, OwnedFd)> {
        // SAFETY: `name` is a valid NUL-terminated string; memfd_create
        // only creates a new anonymous file and returns its descriptor.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor memfd_create just returned, owned by
        // nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd size overflows"))?;
        // SAFETY: `fd` is a live memfd we own; ftruncate only sizes it.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let map = Self::map_shared_fd(fd.as_fd(), len)?;
        Ok((map, fd))
    }

    /// Map the first `len` bytes of the file `fd` read-write and shared
    /// (`MAP_SHARED`): writes are seen by every process mapping it. The
    /// file must be at least `len` bytes long (checked by the caller), `len`
    /// a positive multiple of the page size.
    pub(crate) fn map_shared_fd(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        // SAFETY: without MAP_FIXED the kernel picks an unused range, so the
        // mapping aliases no memory of this process that Rust code owns;
        // `fd` is a live descriptor for the duration of the call.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        match NonNull::new(p.cast::<u8>()) {
            Some(base) => Ok(Mapping { base, len }),
            None => {
                // SAFETY: the mapping just created above; nothing refers to it.
                unsafe { libc::munmap(p, len) };
                Err(io::Error::other("mmap returned address 0"))
            }
        }
    }

    /// Reserve `len` bytes of address space with no access and no backing
    /// memory (`PROT_NONE`, `MAP_NORESERVE`), starting at a multiple of
    /// `align`. `align` must be a power of two and a multiple of the page
    /// size, `len` a positive multiple of `align`.
    ///
    /// Over-reserves `len + align` bytes and trims both ends so that the
    /// base is aligned.
    pub(crate) fn reserve_aligned(len: usize, align: usize) -> io::Result<Mapping> {
        debug_assert!(align.is_power_of_two() && len > 0 && len % align == 0);
        let total = len.checked_add(align).ok_or_else(|| {
            io::Error::new(io::ErrorKind::OutOfMemory, "reservation size overflows")
        })?;
        let raw = Self::map_new(
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
        )?;
        let raw = ManuallyDrop::new(raw);
        let start = raw.base.as_ptr() as usize;
        let head = start.next_multiple_of(align) - start;
        let tail = total - head - len;
        // The trimmed pieces are page-aligned because `start`, `align` and
        // `len` are.
        let trims = [(0, head), (head + len, tail)];
        for (i, &(offset, size)) in trims.iter().enumerate() {
            if size == 0 {
                continue;
            }
            // SAFETY: `[offset, offset + size)` lies inside `raw`, a mapping
            // we created above and nobody else knows about; unmapping it
            // invalidates no reference (none exists).
            let rc = unsafe { libc::munmap(raw.ptr(offset).cast(), size) };
            if rc != 0 {
                let err = io::Error::last_os_error();
                // Give back what is still mapped of the over-reservation:
                // the aligned part and the trims not yet done.
                let mut rest = vec![(head, len)];
                rest.extend(trims[i..].iter().copied().filter(|&(_, s)| s > 0));
                for (o, s) in rest {
                    // SAFETY: as above, each range is an untouched part of
                    // `raw` (trims before `i` are already gone and skipped).
                    unsafe { libc::munmap(raw.ptr(o).cast(), s) };
                }
                return Err(err);
            }
        }
        let base = raw.base.as_ptr().wrapping_add(head);
        Ok(Mapping {
            // `base` is inside a mapping the kernel placed, which never
            // includes address 0.
            base: NonNull::new(base).ok_or_else(|| io::Error::other("mmap returned null"))?,
            len,
        })
    }

    /// `mmap` a new anonymous range where the kernel chooses.
    fn map_new(len: usize, prot: libc::c_int, flags: libc::c_int) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        // SAFETY: without MAP_FIXED the kernel picks an address range that
        // is not in use, so the new mapping cannot replace or alias any
        // existing memory; an anonymous mapping needs fd -1 and offset 0.
        let p = unsafe { libc::mmap(ptr::null_mut(), len, prot, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        match NonNull::new(p.cast::<u8>()) {
            Some(base) => Ok(Mapping { base, len }),
            None => {
                // SAFETY: `p` (null) with `len` is the mapping just created
                // above; nothing refers to it yet.
                unsafe { libc::munmap(p, len) };
                Err(io::Error::other("mmap returned address 0"))
            }
        }
    }

    /// First address of the mapping.
    pub(crate) fn addr(&self) -> u64 {
        self.base.as_ptr() as usize as u64
    }

    /// Length of the mapping in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// A raw pointer `offset` bytes into the mapping. Computing it is safe;
    /// dereferencing it is only sound where the device state says the page
    /// is committed read-write.
    pub(crate) fn ptr(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.len);
        self.base.as_ptr().wrapping_add(offset)
    }

    /// Check that `[offset, offset + len)` is a non-empty range of this
    /// mapping.
    fn check(&self, offset: usize, len: usize) -> io::Result<()> {
        if len == 0 || offset.checked_add(len).map_or(true, |end| end > self.len) {
            return Err(out_of_range(offset, len, self.len));
        }
        Ok(())
    }

    /// Make `[offset, offset + len)` readable and writable (commit it).
    /// Offsets and lengths must be page-aligned.
    pub(crate) fn commit(&self, offset: usize, len: usize) -> io::Result<()> {
        self.protect(offset, len, libc::PROT_READ | libc::PROT_WRITE)
    }

    /// Change the protection of `[offset, offset + len)`.
    fn protect(&self, offset: usize, len: usize, prot: libc::c_int) -> io::Result<()> {
        self.check(offset, len)?;
        // SAFETY: the range is inside this mapping (checked above), which we
        // own (type invariant), so no memory outside it is affected. The
        // device state never dereferences pages it does not consider
        // committed, so revoking access cannot fault a pending access.
        let rc = unsafe { libc::mprotect(self.ptr(offset).cast(), len, prot) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Give the physical pages behind `[offset, offset + len)` back to the
    /// system and make the range inaccessible. Committing it again yields
    /// zero-filled pages.
    pub(crate) fn decommit(&self, offset: usize, len: usize) -> io::Result<()> {
        self.check(offset, len)?;
        self.discard(offset, len)?;
        self.protect(offset, len, libc::PROT_NONE)
    }

    /// Drop the contents of a private anonymous range (Linux: the next
    /// touch reads zero-filled pages).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn discard(&self, offset: usize, len: usize) -> io::Result<()> {
        // SAFETY: the range is inside this mapping (checked by the caller),
        // private and anonymous, so MADV_DONTNEED only discards our own
        // pages. The device state has stopped treating the range as live
        // before decommitting it, so no access relies on its contents.
        let rc = unsafe { libc::madvise(self.ptr(offset).cast(), len, libc::MADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Drop the contents of a private anonymous range (other Unix systems,
    /// where MADV_DONTNEED does not zero pages): replace it with a fresh
    /// no-access, no-reserve mapping. Untested outside Linux.
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    fn discard(&self, offset: usize, len: usize) -> io::Result<()> {
        // SAFETY: MAP_FIXED replaces exactly `[offset, offset + len)`, which
        // lies inside this mapping (checked by the caller) and so belongs to
        // us; the replacement stays part of the range we unmap on drop.
        let p = unsafe {
            libc::mmap(
                self.ptr(offset).cast(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Unmap the whole range. On failure the mapping is handed back intact
    /// together with the error.
    pub(crate) fn unmap(self) -> Result<(), (Mapping, io::Error)> {
        let me = ManuallyDrop::new(self);
        // SAFETY: `me` owns the whole range (type invariant) and is consumed
        // here: nothing can compute pointers into it afterwards.
        let rc = unsafe { libc::munmap(me.base.as_ptr().cast(), me.len) };
        if rc != 0 {
            return Err((ManuallyDrop::into_inner(me), io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `self` owns the whole range (type invariant) and is being
        // dropped: nothing can compute pointers into it afterwards.
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
        if rc != 0 {
            // Never panic in drop: report and leak the address range.
            tracing::error!(
                addr = self.addr(),
                len = self.len,
                error = %io::Error::last_os_error(),
                "reservoir-host: munmap failed; the range stays mapped"
            );
        }
    }
}

/// The operating system's page size in bytes.
pub fn os_page_size() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(v).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// The machine's physical memory in bytes, if the system reports it.
pub fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf only reads system constants.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let pages = u64::try_from(pages).ok().filter(|&p| p > 0)?;
    let size = u64::try_from(size).ok().filter(|&p| p > 0)?;
    pages.checked_mul(size)
}
