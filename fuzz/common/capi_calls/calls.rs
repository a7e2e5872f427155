//! The calls of `Runner::op`: one method per [`Op`], each making its call
//! (or calls) of the C ABI and checking the statuses, messages and
//! statistics against the model.

use super::*;

impl Runner {
    /// `reservoir_allocator_destroy`: the status, and that the handle is
    /// gone.
    pub(super) fn destroy(&mut self, r: HandleRef) {
        let (h, idx) = self.resolve(r);
        let live = self.live_tokens();
        if let Some(i) = idx {
            // What destroy releases is checked by FreeAll; here only
            // the status and that the handle is gone.
            self.handles[i].live = false;
        }
        let s = reservoir_allocator_destroy(h);
        let allowed = match handle_error(h, &live) {
            Some(e) => vec![e],
            None => vec![RESERVOIR_OK],
        };
        self.check("reservoir_allocator_destroy", s, &allowed, 0);
        if idx.is_some() {
            let mut v = 0;
            // SAFETY: `v` is writable; the key is NUL-terminated.
            let s2 = unsafe { reservoir_allocator_stat(h, c"num_ooms".as_ptr(), &mut v) };
            self.check(
                "reservoir_allocator_stat",
                s2,
                &[RESERVOIR_ERR_INVALID_HANDLE],
                0,
            );
        }
    }

    /// `reservoir_allocator_create_stream`: a new id, never handed out
    /// before.
    pub(super) fn create_stream(&mut self, r: HandleRef) {
        let (h, idx) = self.resolve(r);
        let mut id = u64::MAX;
        // SAFETY: `id` is writable.
        let s = unsafe { reservoir_allocator_create_stream(h, &mut id) };
        match idx {
            Some(i) => {
                // A limit on streams may refuse one (issue 29 item 2).
                self.check(
                    "reservoir_allocator_create_stream",
                    s,
                    &[
                        RESERVOIR_OK,
                        RESERVOIR_ERR_INVALID_STATE,
                        RESERVOIR_ERR_INVALID_ARGUMENT,
                        RESERVOIR_ERR_BACKEND,
                    ],
                    0,
                );
                if s == RESERVOIR_OK {
                    if id == 0 || self.handles[i].streams.contains(&id) {
                        self.fail(format!("create_stream handed out stream {id} again"));
                    }
                    self.handles[i].streams.push(id);
                }
            }
            None => {
                let e = handle_error(h, &self.live_tokens()).expect("not live");
                self.check("reservoir_allocator_create_stream", s, &[e], 0);
            }
        }
    }

    /// `reservoir_allocator_empty_cache`, then the statistics.
    pub(super) fn empty_cache(&mut self, r: HandleRef) {
        let (h, idx) = self.resolve(r);
        let s = reservoir_allocator_empty_cache(h);
        self.simple("reservoir_allocator_empty_cache", h, idx, s, RESERVOIR_OK);
        if let Some(i) = idx {
            self.check_stats(i, "empty_cache");
        }
    }

    /// `reservoir_allocator_set_memory_fraction` (only `0..=1` is valid;
    /// a refusal changes nothing), then `reservoir_allocator_memory_fraction`.
    pub(super) fn fraction(&mut self, r: HandleRef, f: FractionChoice) {
        let (h, idx) = self.resolve(r);
        let f = match f {
            FractionChoice::Ratio(k) => f64::from(k) / 255.0,
            FractionChoice::Any(x) => x,
        };
        let before = idx.map(|i| self.before(i));
        let s = reservoir_allocator_set_memory_fraction(h, f);
        let ok = (0.0..=1.0).contains(&f);
        let arg = if ok {
            RESERVOIR_OK
        } else {
            RESERVOIR_ERR_INVALID_ARGUMENT
        };
        self.simple("reservoir_allocator_set_memory_fraction", h, idx, s, arg);
        if let (Some(i), Some(b)) = (idx, before) {
            if s == RESERVOIR_OK {
                self.check_stats(i, "set_memory_fraction");
            } else {
                self.check_unchanged(i, b, s, "set_memory_fraction");
            }
        }
        let mut got = f64::NAN;
        // SAFETY: `got` is writable.
        let s = unsafe { reservoir_allocator_memory_fraction(h, &mut got) };
        self.simple(
            "reservoir_allocator_memory_fraction",
            h,
            idx,
            s,
            RESERVOIR_OK,
        );
        if s == RESERVOIR_OK && !(0.0..=1.0).contains(&got) {
            self.fail(format!("memory_fraction answered {got}"));
        }
    }

    /// `reservoir_allocator_record_history`.
    pub(super) fn record_history(&mut self, r: HandleRef, on: bool, max: u16) {
        let (h, idx) = self.resolve(r);
        let s = reservoir_allocator_record_history(h, on, usize::from(max));
        self.simple(
            "reservoir_allocator_record_history",
            h,
            idx,
            s,
            RESERVOIR_OK,
        );
    }

    /// `reservoir_allocator_stats_count` and `reservoir_allocator_stat_at`
    /// into a key buffer of `capacity` bytes (or none): the key written
    /// whole, and its value the one `reservoir_allocator_stat` reads.
    pub(super) fn stat_at(&mut self, r: HandleRef, index: u8, capacity: u8, null_key: bool) {
        let (h, idx) = self.resolve(r);
        let mut n = usize::MAX;
        // SAFETY: `n` is writable.
        let s = unsafe { reservoir_allocator_stats_count(h, &mut n) };
        self.simple("reservoir_allocator_stats_count", h, idx, s, RESERVOIR_OK);
        let mut buf = vec![0xffu8; usize::from(capacity)];
        let key = if null_key {
            std::ptr::null_mut()
        } else {
            buf.as_mut_ptr().cast::<c_char>()
        };
        let (mut len, mut value) = (usize::MAX, i64::MIN);
        let index = usize::from(index);
        // SAFETY: `key` is null or holds `capacity` writable bytes;
        // `len` and `value` are writable.
        let s2 = unsafe {
            reservoir_allocator_stat_at(
                h,
                index,
                key,
                if null_key { 0 } else { buf.len() },
                &mut len,
                &mut value,
            )
        };
        let arg = if idx.is_some() && index >= n {
            RESERVOIR_ERR_INVALID_ARGUMENT
        } else if idx.is_some() {
            // The key's length is only known from the answer.
            if s2 == RESERVOIR_ERR_BUFFER_TOO_SMALL {
                if len == usize::MAX || (!null_key && usize::from(capacity) > len) {
                    self.fail(format!(
                        "stat_at: buffer of {capacity} too small for a key of {len}"
                    ));
                }
                RESERVOIR_ERR_BUFFER_TOO_SMALL
            } else {
                RESERVOIR_OK
            }
        } else {
            RESERVOIR_OK
        };
        self.simple("reservoir_allocator_stat_at", h, idx, s2, arg);
        if s2 == RESERVOIR_OK {
            if null_key || len >= buf.len() || buf[len] != 0 || buf[..len].contains(&0) {
                self.fail(format!(
                    "stat_at wrote a key of length {len} badly: {buf:?}"
                ));
            }
            let k = std::str::from_utf8(&buf[..len])
                .unwrap_or_else(|e| self.fail(format!("key not UTF-8: {e}")));
            let key = CString::new(k).expect("no NUL");
            let again = self.stat(h, &key);
            // `stat_at` and `stat` read the same counters.
            if again != value {
                self.fail(format!("stat_at said {k} = {value}, stat says {again}"));
            }
        }
    }

    /// `reservoir_allocator_stat` with a known, made-up or null key.
    pub(super) fn stat_key(&mut self, r: HandleRef, key: &StatKey) {
        let (h, idx) = self.resolve(r);
        let text = match key {
            StatKey::Known(i) => Some(STAT_KEYS[*i as usize % STAT_KEYS.len()].as_bytes().to_vec()),
            StatKey::Text(t) => Some(t.as_bytes().to_vec()),
            StatKey::Null => None,
        };
        let c = text.as_deref().map(c_text);
        let mut v = i64::MIN;
        // SAFETY: the key is null or NUL-terminated; `v` is writable.
        let s = unsafe {
            reservoir_allocator_stat(
                h,
                c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                &mut v,
            )
        };
        let len = c.as_ref().map_or(0, |c| c.as_bytes().len());
        let allowed: Vec<ReservoirStatus> = match (c.as_ref(), idx) {
            // Whether the key exists is the library's to say.
            (Some(_), Some(_)) => vec![RESERVOIR_OK, RESERVOIR_ERR_INVALID_ARGUMENT],
            (None, _) => vec![RESERVOIR_ERR_INVALID_ARGUMENT],
            (Some(_), None) => {
                let mut a = vec![handle_error(h, &self.live_tokens()).expect("not live")];
                if std::str::from_utf8(c.as_ref().unwrap().as_bytes()).is_err() {
                    a.push(RESERVOIR_ERR_INVALID_ARGUMENT);
                }
                a
            }
        };
        self.check("reservoir_allocator_stat", s, &allowed, len);
        if let (Some(k), true) = (key_known(key), idx.is_some()) {
            if s != RESERVOIR_OK
                && STAT_KEYS
                    .iter()
                    .position(|x| *x == k)
                    .is_some_and(|p| p < 10)
            {
                self.fail(format!("stat {k:?} exists but answered {s:?}"));
            }
        }
    }

    /// `reservoir_status_name`: a `RESERVOIR_` name for every status,
    /// `RESERVOIR_UNKNOWN_STATUS` for the rest.
    pub(super) fn status_name(&mut self, st: i32) {
        // SAFETY: a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr(reservoir_status_name(st)) };
        let name = name
            .to_str()
            .unwrap_or_else(|e| self.fail(format!("status name not UTF-8: {e}")));
        let want = if (0..=13).contains(&st) {
            "RESERVOIR_"
        } else {
            "RESERVOIR_UNKNOWN_STATUS"
        };
        if !name.starts_with(want) || ((0..=13).contains(&st) && name == "RESERVOIR_UNKNOWN_STATUS")
        {
            self.fail(format!("status {st} is named {name:?}"));
        }
    }

    /// A call whose only failure causes are the handle and `arg` (the
    /// status its arguments call for on a live handle).
    pub(super) fn simple(
        &self,
        func: &str,
        h: *mut ReservoirAllocator,
        idx: Option<usize>,
        s: ReservoirStatus,
        arg: ReservoirStatus,
    ) {
        let allowed: Vec<ReservoirStatus> = match idx {
            Some(_) => vec![arg],
            None => {
                let mut a = vec![handle_error(h, &self.live_tokens()).expect("not live")];
                if arg != RESERVOIR_OK && arg != RESERVOIR_ERR_BUFFER_TOO_SMALL {
                    a.push(arg);
                }
                a
            }
        };
        self.check(func, s, &allowed, 0);
    }

    pub(super) fn create(
        &mut self,
        backend: BackendChoice,
        device: i8,
        capacity: CapacityChoice,
        config: &ConfigChoice,
    ) {
        let (backend_id, host) = match backend {
            BackendChoice::Sim => (0u32, false),
            BackendChoice::Host => (1, true),
            BackendChoice::CudaWithCapacity => (2, false),
            BackendChoice::Any(b) => (b, b == 1),
        };
        let mut cap = match capacity {
            CapacityChoice::Default => 0,
            CapacityChoice::Tiny(n) => u64::from(n),
            CapacityChoice::Mib(n) => (u64::from(n) + 1) * MIB,
            CapacityChoice::Any(n) => n,
        };
        if host {
            cap = cap.clamp(1, 256 * MIB);
        }
        if backend_id == 2 && cap == 0 {
            cap = MIB;
        }
        // Never touch a CUDA driver: `Any(2)` gets a capacity too.
        let cfg: Option<Vec<u8>> = match config {
            ConfigChoice::Null => None,
            ConfigChoice::Known(i) => {
                Some(CONFIGS[*i as usize % CONFIGS.len()].as_bytes().to_vec())
            }
            ConfigChoice::Text(t) => Some(t.as_bytes().to_vec()),
            ConfigChoice::Bytes(b) => Some(b.clone()),
        };
        let c = cfg.as_deref().map(c_text);
        let cfg_len = c.as_ref().map_or(0, |c| c.as_bytes().len());
        let parses = match c.as_ref().map(|c| c.to_str()) {
            None => Some(true),
            Some(Ok(s)) => Some(reservoir::config::AllocatorConfig::parse_with_policy(s).is_ok()),
            Some(Err(_)) => None, // not UTF-8
        };
        let mut out: *mut ReservoirAllocator = 0x1 as *mut _;
        // SAFETY: the config is null or NUL-terminated; `out` is writable.
        let s = unsafe {
            reservoir_allocator_create(
                backend_id,
                i32::from(device),
                cap,
                c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                &mut out,
            )
        };
        let mut allowed = Vec::new();
        let args_ok = device >= 0 && backend_id <= 1;
        if parses == Some(false) {
            allowed.push(RESERVOIR_ERR_INVALID_CONFIG);
        }
        if parses.is_none() || !args_ok {
            allowed.push(RESERVOIR_ERR_INVALID_ARGUMENT);
        }
        if allowed.is_empty() {
            allowed.push(RESERVOIR_OK);
        }
        self.check("reservoir_allocator_create", s, &allowed, cfg_len);
        if s != RESERVOIR_OK {
            if !out.is_null() {
                self.fail(format!("create failed with {s:?} but *out is {out:p}"));
            }
            return;
        }
        if out.is_null() || self.handles.iter().any(|m| m.h == out) {
            self.fail(format!(
                "create answered OK with handle {out:p} (null or reused)"
            ));
        }
        self.handles.push(Model {
            h: out,
            live: true,
            host,
            capacity: (cap != 0).then_some(cap),
            streams: Vec::new(),
            blocks: BTreeMap::new(),
            freed: Vec::new(),
            last: std::cell::Cell::new(None),
        });
        let i = self.handles.len() - 1;
        let st = self.check_stats(i, "create");
        if st.reserved != 0 || st.allocated != 0 {
            self.fail(format!("a new allocator holds memory: {st:?}"));
        }
        if self.handles.iter().filter(|m| m.live).count() > MAX_LIVE {
            self.handles[i].live = false;
            let s = reservoir_allocator_destroy(out);
            self.check("reservoir_allocator_destroy", s, &[RESERVOIR_OK], 0);
        }
    }

    pub(super) fn alloc(&mut self, r: HandleRef, size: u64, stream: StreamRef) {
        let (h, idx) = self.resolve(r);
        let (stream, known) = self.stream(idx, stream);
        let before = idx.map(|i| self.before(i));
        let mut out: *mut c_void = 0x1 as *mut c_void;
        // SAFETY: `out` is writable; the simulated and host devices take any
        // stream number.
        let s = unsafe { reservoir_allocator_alloc(h, size, stream, &mut out) };
        let size_ok = size != 0 && size <= isize::MAX as u64;
        let allowed: Vec<ReservoirStatus> = match idx {
            None => {
                let mut a = vec![handle_error(h, &self.live_tokens()).expect("not live")];
                if !size_ok {
                    a.push(RESERVOIR_ERR_INVALID_ARGUMENT);
                }
                a
            }
            Some(_) if !size_ok || !known => vec![RESERVOIR_ERR_INVALID_ARGUMENT],
            Some(_) => vec![RESERVOIR_OK, RESERVOIR_ERR_OUT_OF_MEMORY],
        };
        self.check("reservoir_allocator_alloc", s, &allowed, 0);
        if s != RESERVOIR_OK {
            if !out.is_null() {
                self.fail(format!("alloc failed with {s:?} but *out is {out:p}"));
            }
            if let (Some(i), Some(b)) = (idx, before) {
                self.check_unchanged(i, b, s, &format!("alloc({size}, stream {stream})"));
            }
            return;
        }
        let i = idx.expect("OK only on a live handle");
        let p = out as usize as u64;
        if p == 0 || p % 512 != 0 {
            self.fail(format!(
                "alloc({size}) handed out {p:#x}: null or not 512-byte aligned"
            ));
        }
        let end = p
            .checked_add(size)
            .unwrap_or_else(|| self.fail(format!("block {p:#x}+{size} wraps")));
        let m = &self.handles[i];
        if let Some((&q, &(qs, _))) = m.blocks.range(..end).next_back() {
            if q + qs > p {
                self.fail(format!(
                    "alloc({size}) handed out {p:#x}, overlapping live block {q:#x}+{qs}"
                ));
            }
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        if m.host {
            // SAFETY: host memory: the block [p, p+size) is ours and
            // writable; unaligned writes of the tag at both ends.
            unsafe {
                (p as *mut u8).cast::<u64>().write_unaligned(tag);
                if size >= 16 {
                    ((end - 8) as *mut u8).cast::<u64>().write_unaligned(tag);
                }
            }
        }
        let m = &mut self.handles[i];
        m.blocks.insert(p, (size, tag));
        m.freed.retain(|&f| f != p);
        self.check_stats(i, &format!("alloc({size})"));
    }

    pub(super) fn free(&mut self, r: HandleRef, pr: PtrRef) {
        let (h, idx) = self.resolve(r);
        let (p, live_size) = self.pointer(idx, pr);
        let before = idx.map(|i| self.before(i));
        if let (Some(i), Some(size)) = (idx, live_size) {
            self.check_tag(i, p, size);
        }
        let s = reservoir_allocator_free(h, p as usize as *mut c_void);
        let allowed: Vec<ReservoirStatus> = match idx {
            None => vec![handle_error(h, &self.live_tokens()).expect("not live")],
            Some(_) if live_size.is_some() => vec![RESERVOIR_OK],
            Some(_) => vec![RESERVOIR_ERR_INVALID_POINTER],
        };
        self.check("reservoir_allocator_free", s, &allowed, 0);
        if let Some(i) = idx {
            if s == RESERVOIR_OK {
                let m = &mut self.handles[i];
                m.blocks.remove(&p);
                m.freed.push(p);
                if m.freed.len() > 32 {
                    m.freed.remove(0);
                }
                self.check_stats(i, &format!("free({p:#x})"));
            } else if let Some(b) = before {
                self.check_unchanged(i, b, s, &format!("free({p:#x})"));
            }
        }
    }

    pub(super) fn check_tag(&self, i: usize, p: u64, size: u64) {
        let m = &self.handles[i];
        if !m.host {
            return;
        }
        let tag = m.blocks[&p].1;
        // SAFETY: a live host block of ours, [p, p+size).
        let (a, b) = unsafe {
            let a = (p as *const u8).cast::<u64>().read_unaligned();
            let b = if size >= 16 {
                ((p + size - 8) as *const u8).cast::<u64>().read_unaligned()
            } else {
                tag
            };
            (a, b)
        };
        if a != tag || b != tag {
            self.fail(format!("host block {p:#x}+{size}: its tags were overwritten ({a:#x}, {b:#x}, want {tag:#x})"));
        }
    }

    pub(super) fn record_stream(&mut self, r: HandleRef, pr: PtrRef, stream: StreamRef) {
        let (h, idx) = self.resolve(r);
        let (p, live_size) = self.pointer(idx, pr);
        let (stream, known) = self.stream(idx, stream);
        let before = idx.map(|i| self.before(i));
        // SAFETY: the simulated and host devices take any stream number.
        let s = unsafe { reservoir_allocator_record_stream(h, p as usize as *mut c_void, stream) };
        let allowed: Vec<ReservoirStatus> = match idx {
            None => vec![handle_error(h, &self.live_tokens()).expect("not live")],
            // A null pointer is a no-op, as in PyTorch's recordStream (an
            // empty tensor has no block); the header does not say so.
            Some(_) if p == 0 => {
                let mut a = vec![RESERVOIR_OK];
                if !known {
                    a.push(RESERVOIR_ERR_INVALID_ARGUMENT);
                }
                a
            }
            Some(_) => {
                let mut a = Vec::new();
                if live_size.is_none() {
                    a.push(RESERVOIR_ERR_INVALID_POINTER);
                }
                if !known {
                    a.push(RESERVOIR_ERR_INVALID_ARGUMENT);
                }
                if a.is_empty() {
                    a.push(RESERVOIR_OK);
                }
                a
            }
        };
        self.check("reservoir_allocator_record_stream", s, &allowed, 0);
        if let (Some(i), Some(b)) = (idx, before) {
            if s == RESERVOIR_OK {
                self.check_stats(i, "record_stream");
            } else {
                self.check_unchanged(i, b, s, &format!("record_stream({p:#x}, {stream})"));
            }
        }
    }

    pub(super) fn snapshot(&mut self, r: HandleRef, path: PathChoice) {
        let (h, idx) = self.resolve(r);
        let file = self.dir.join("snapshot.pickle");
        let bytes: Option<Vec<u8>> = match path {
            PathChoice::Temp => Some(file.to_str().expect("UTF-8 temp dir").as_bytes().to_vec()),
            PathChoice::Null => None,
            PathChoice::NoFolder => Some(
                self.dir
                    .join("no/such/folder/s.pickle")
                    .to_str()
                    .expect("UTF-8")
                    .as_bytes()
                    .to_vec(),
            ),
            PathChoice::NotUtf8 => {
                let mut b = self.dir.to_str().expect("UTF-8").as_bytes().to_vec();
                b.extend_from_slice(b"/s\xff\xfe.pickle");
                Some(b)
            }
        };
        let c = bytes.as_deref().map(c_text);
        let _ = std::fs::remove_file(&file);
        // SAFETY: the path is null or NUL-terminated.
        let s = unsafe {
            reservoir_allocator_snapshot(h, c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
        };
        let len = c.as_ref().map_or(0, |c| c.as_bytes().len());
        let mut allowed: Vec<ReservoirStatus> = match (path, idx) {
            (PathChoice::Null, _) => vec![RESERVOIR_ERR_INVALID_ARGUMENT],
            (PathChoice::Temp, Some(_)) => vec![RESERVOIR_OK],
            (PathChoice::NoFolder, Some(_)) => vec![RESERVOIR_ERR_IO],
            // Refused today; issue 29 item 8 asks for byte paths.
            (PathChoice::NotUtf8, Some(_)) => vec![RESERVOIR_ERR_INVALID_ARGUMENT, RESERVOIR_OK],
            (PathChoice::NotUtf8, None) => vec![RESERVOIR_ERR_INVALID_ARGUMENT],
            (_, None) => vec![],
        };
        if idx.is_none() {
            allowed.push(handle_error(h, &self.live_tokens()).expect("not live"));
        }
        self.check("reservoir_allocator_snapshot", s, &allowed, len);
        if s == RESERVOIR_OK && matches!(path, PathChoice::Temp) {
            let b =
                std::fs::read(&file).unwrap_or_else(|e| self.fail(format!("snapshot file: {e}")));
            if b.len() < 3 || b[0] != 0x80 || *b.last().unwrap() != b'.' {
                self.fail(format!(
                    "snapshot wrote {} bytes that are no pickle",
                    b.len()
                ));
            }
        }
        if let Some(i) = idx {
            self.check_stats(i, "snapshot");
        }
    }

    pub(super) fn null_out(&mut self, r: HandleRef, which: u8) {
        let (h, idx) = self.resolve(r);
        let before = idx.map(|i| self.before(i));
        let live = self.live_tokens();
        let bad = || handle_error(h, &live);
        let null = std::ptr::null_mut();
        let (func, s, out_first) = match which % 5 {
            0 => {
                // SAFETY: a null `out` is allowed (refused).
                let s = unsafe { reservoir_allocator_alloc(h, 4096, 0, null) };
                ("reservoir_allocator_alloc", s, true)
            }
            1 => {
                // SAFETY: a null `out` is allowed (refused).
                let s = unsafe { reservoir_allocator_stats_count(h, null.cast()) };
                ("reservoir_allocator_stats_count", s, false)
            }
            2 => {
                // SAFETY: a null `out` is allowed (refused).
                let s = unsafe { reservoir_allocator_memory_fraction(h, null.cast()) };
                ("reservoir_allocator_memory_fraction", s, false)
            }
            3 => {
                // SAFETY: the key is NUL-terminated; a null `value` is
                // allowed (refused).
                let s = unsafe { reservoir_allocator_stat(h, c"num_ooms".as_ptr(), null.cast()) };
                ("reservoir_allocator_stat", s, false)
            }
            _ => {
                // SAFETY: a null config and a null `out` are allowed; create
                // checks `out` first, whatever the other arguments.
                let s =
                    unsafe { reservoir_allocator_create(0, 0, 0, std::ptr::null(), null.cast()) };
                self.check(
                    "reservoir_allocator_create",
                    s,
                    &[RESERVOIR_ERR_INVALID_ARGUMENT],
                    0,
                );
                return;
            }
        };
        // alloc checks `out` before the handle; the others the handle first.
        let allowed: Vec<ReservoirStatus> = match bad() {
            Some(e) if !out_first => vec![e],
            _ => vec![RESERVOIR_ERR_INVALID_ARGUMENT],
        };
        self.check(func, s, &allowed, 0);
        if let (Some(i), Some(b)) = (idx, before) {
            self.check_unchanged(i, b, s, &format!("{func} with a null out-pointer"));
        }
    }

    /// Free every live block of handle `i`, empty its cache: nothing may
    /// remain allocated, active or reserved.
    pub(super) fn free_all(&mut self, i: usize) {
        let h = self.handles[i].h;
        let ptrs: Vec<(u64, u64)> = self.handles[i]
            .blocks
            .iter()
            .map(|(&p, &(s, _))| (p, s))
            .collect();
        for (p, size) in ptrs {
            self.check_tag(i, p, size);
            let s = reservoir_allocator_free(h, p as usize as *mut c_void);
            self.check("reservoir_allocator_free", s, &[RESERVOIR_OK], 0);
            self.handles[i].blocks.remove(&p);
            self.handles[i].freed.push(p);
        }
        let s = reservoir_allocator_empty_cache(h);
        self.check("reservoir_allocator_empty_cache", s, &[RESERVOIR_OK], 0);
        let st = self.check_stats(i, "freeing everything and empty_cache");
        if st.allocated != 0
            || st.active != 0
            || st.requested != 0
            || st.reserved != 0
            || st.segments != 0
            || st.inactive_split != 0
        {
            self.fail(format!(
                "everything freed and the cache emptied, yet {st:?}"
            ));
        }
    }
}
