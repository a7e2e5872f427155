"""Reservoir under torch in every mode a user can turn on (issue 40): PyTorch
mode, ``expandable_segments:True`` and ``policy:reservoir``, each against
torch's native allocator with the same settings, in real torch 2.15 on the
fake CUDA device of ../shared/oracle. Run by tools/torch-proof.sh ("run
modes ..."), or by hand under ../shared/oracle/env.sh with the venv's python.

Each (allocator, mode) runs in a fresh process, the same program:

  streams    the multi-stream programs of distributed training, on the fake
             device's asynchronous streams with its race sanitizer (the
             kernels' reads and writes are declared with
             fakecuda_stream_enqueue): a DDP-like step (gradient buckets made
             and reduced on a side stream, copied back on the main stream),
             an FSDP-like step (all-gather buffers made on a side stream,
             used on the main stream, record_stream, freed) and a
             prefetching loop (non-blocking host-to-device copies on a copy
             stream); then the same programs without record_stream (the
             negative control: the sanitizer must report)
  backward   autograd across streams (a gradient made on one stream and
             consumed on another: the engine's C++ recordStream)
  trace      torch.cuda._gpu_trace's memory callbacks see every allocation
             and free (c10::impl::GPUTrace)
  accel      torch.accelerator.memory_stats / memory_allocated /
             memory_reserved / empty_cache answer from the allocator in use
  settings   torch.cuda.memory._set_allocator_settings at run time:
             roundup_power2_divisions:4 (an 84 MiB request is a 96 MiB
             block), then expandable_segments flipped
  use_on_oom MemPool(use_on_oom=True) under a memory fraction: an
             allocation that would run out of memory borrows a free block of
             that pool (never of another pool), which goes back to its pool
  pool_allocator  MemPool(allocator=CUDAPluggableAllocator(...)) with a C
             allocator compiled here: its segments, cached blocks, give-back
  stats      torch.cuda.memory_stats() at the end

and, in a process of its own under TORCH_CUDA_SANITIZER=1 (torch's CUDA
Sanitizer), a correct program that frees and reuses memory across streams
(no report) and a seeded race (reported).

Claims: no error anywhere; the sanitizer reports 0 with record_stream and
more than 0 without it; the trace callbacks saw each allocation and free;
torch.accelerator equals torch.cuda; the run-time settings act as natively
(the block sizes, the segment kinds). In PyTorch mode and with expandable
segments every memory_stats() key equals native's with the same settings;
the `reservoir` policy's placements are its own, so there only the
behaviour is compared. Prints "ok MODE NAME" / "FAIL MODE NAME detail" and
closes with "modes: N passed, M failed".
"""

import json
import os
import subprocess
import sys

from fakecuda import Checks, diff_stats, fake_driver

MIB = 1 << 20
N = 22 * MIB  # above 10 MiB: a segment of its own, so a freed block is the next exact fit

# (label, Reservoir's settings, native torch's PYTORCH_CUDA_ALLOC_CONF, exact)
MODES = [
    ("pytorch", "", "", True),
    ("expandable", "expandable_segments:True", "expandable_segments:True", True),
    ("reservoir", "policy:reservoir", "", False),
]


class Program:
    def __init__(self, alloc, conf):
        import torch

        self.torch = torch
        if alloc == "reservoir":
            import reservoir.torch as rt

            rt.enable(conf)
        self.fake = fake_driver()
        self.out = {"errors": {}}

    def guarded(self, name, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 (a finding, reported by the driver)
            import traceback

            self.out["errors"][name] = f"{type(e).__name__}: {e}"[:600]
            sys.stderr.write(traceback.format_exc())

    def touch(self, t, stream, write):
        """Declare a kernel's read or write of `t` on `stream` (kernels do
        nothing on the fake device; its sanitizer sees what is declared)."""
        self.fake.fakecuda_stream_enqueue(stream.cuda_stream, t.data_ptr(), t.numel() * t.element_size(),
                                          1 if write else 0)

    # -- the multi-stream programs ------------------------------------------

    def ddp_step(self, record):
        torch = self.torch
        main, side = torch.cuda.current_stream(), self.side
        grads = [torch.empty(N // 2, dtype=torch.uint8, device="cuda") for _ in range(2)]
        for g in grads:
            self.touch(g, main, True)  # backward writes the gradients
        side.wait_stream(main)
        with torch.cuda.stream(side):
            bucket = torch.empty(N, dtype=torch.uint8, device="cuda")
            for g in grads:
                self.touch(g, side, False)
            self.touch(bucket, side, True)  # flatten + all-reduce
        main.wait_stream(side)
        self.touch(bucket, main, False)  # copied back into the gradients
        for g in grads:
            self.touch(g, main, True)
        if record:
            bucket.record_stream(main)
        del bucket
        with torch.cuda.stream(side):
            nxt = torch.empty(N, dtype=torch.uint8, device="cuda")  # the next step's bucket
            self.touch(nxt, side, True)
        del nxt, grads

    def fsdp_step(self, record):
        torch = self.torch
        main, side = torch.cuda.current_stream(), self.side
        shard = torch.empty(N // 4, dtype=torch.uint8, device="cuda")
        self.touch(shard, main, True)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            full = torch.empty(N, dtype=torch.uint8, device="cuda")  # all-gather buffer
            self.touch(shard, side, False)
            self.touch(full, side, True)
        main.wait_stream(side)
        self.touch(full, main, False)  # the layer's compute
        if record:
            full.record_stream(main)
        del full
        with torch.cuda.stream(side):
            nxt = torch.empty(N, dtype=torch.uint8, device="cuda")  # the next layer's all-gather
            self.touch(nxt, side, True)
        del nxt, shard

    def prefetch(self, record):
        torch = self.torch
        main, copy = torch.cuda.current_stream(), self.copy
        host = torch.empty(N, dtype=torch.uint8).pin_memory()
        for _ in range(3):
            with torch.cuda.stream(copy):
                d = host.to("cuda", non_blocking=True)
                self.touch(d, copy, True)
            main.wait_stream(copy)
            self.touch(d, main, False)
            if record:
                d.record_stream(main)
            del d

    def s_streams(self):
        torch, fake = self.torch, self.fake
        self.side, self.copy = torch.cuda.Stream(), torch.cuda.Stream()
        res = {}
        self.out["streams"] = res
        for record in (True, False):
            for name, fn in (("ddp", self.ddp_step), ("fsdp", self.fsdp_step), ("prefetch", self.prefetch)):
                torch.cuda.synchronize()
                fake.fakecuda_set_async(1)
                fake.fakecuda_set_sanitize(1)
                fake.fakecuda_sanitizer_reset()
                fn(record)
                res[f"{name}{'' if record else '_control'}"] = fake.fakecuda_sanitizer_violations()
                torch.cuda.synchronize()
                fake.fakecuda_set_sanitize(0)
                fake.fakecuda_set_async(0)

    def s_backward(self):
        torch = self.torch
        a, b = torch.cuda.Stream(), torch.cuda.Stream()
        leaf = torch.randn(1 << 16, device="cuda", requires_grad=True)
        with torch.cuda.stream(a):
            h = leaf * 2
        b.wait_stream(a)
        with torch.cuda.stream(b):
            loss = (h * 3).sum()
        torch.cuda.current_stream().wait_stream(b)
        loss.backward()
        torch.cuda.synchronize()
        self.out["backward_grad_ok"] = bool(leaf.grad is not None and leaf.grad.shape == leaf.shape)

    def s_trace(self):
        torch = self.torch
        import torch.cuda._gpu_trace as gpu_trace

        torch._C._activate_gpu_trace()
        allocs, frees = [], []
        gpu_trace.register_callback_for_memory_allocation(allocs.append)
        gpu_trace.register_callback_for_memory_deallocation(frees.append)
        t = torch.empty(3 * MIB, dtype=torch.uint8, device="cuda")
        ptr = t.data_ptr()
        del t
        self.out["trace"] = {"alloc_seen": ptr in allocs, "free_seen": ptr in frees}

    def s_accel(self):
        torch = self.torch
        keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (5 * MIB, 700)]
        spare = torch.empty(30 * MIB, dtype=torch.uint8, device="cuda")
        del spare
        a_st, c_st = dict(torch.accelerator.memory_stats()), dict(torch.cuda.memory_stats())
        acc = {
            # torch 2.15's accelerator dict lacks num_oom_rejections natively too.
            "stats_equal": all(a_st[k] == c_st[k] for k in set(a_st) & set(c_st)) and len(a_st) > 100,
            "keys_only_in_one": sorted(set(a_st) ^ set(c_st)),
            "allocated": [torch.accelerator.memory_allocated(), torch.cuda.memory_allocated()],
            "reserved": [torch.accelerator.memory_reserved(), torch.cuda.memory_reserved()],
        }
        torch.accelerator.empty_cache()
        acc["reserved_after_empty_cache"] = [torch.accelerator.memory_reserved(), torch.cuda.memory_reserved()]
        self.out["accel"] = acc
        del keep

    def s_settings(self):
        torch = self.torch
        st = {}
        self.out["settings"] = st

        def block_of(n):
            before = torch.cuda.memory_allocated()
            t = torch.empty(n, dtype=torch.uint8, device="cuda")
            b = torch.cuda.memory_allocated() - before
            del t
            return b

        st["default"] = block_of(84 * MIB)
        torch.cuda.memory._set_allocator_settings("roundup_power2_divisions:4")
        st["roundup4"] = block_of(84 * MIB)
        torch.cuda.memory._set_allocator_settings("roundup_power2_divisions:1")
        torch.cuda.empty_cache()
        kinds = {}
        for flag in ("True", "False"):
            torch.cuda.memory._set_allocator_settings(f"expandable_segments:{flag}")
            t = torch.empty(7 * MIB, dtype=torch.uint8, device="cuda")
            seg = [s for s in torch.cuda.memory_snapshot()
                   if s["address"] <= t.data_ptr() < s["address"] + s["total_size"]]
            kinds[flag] = bool(seg and seg[0].get("is_expandable"))
            del t
            torch.cuda.empty_cache()
        st["expandable_segment_when"] = kinds

    def s_use_on_oom(self):
        # MemPool(use_on_oom=True) (upstream's test_mempool_limited_memory_with_allocator
        # without the allocator): under an 80 MiB budget, an allocation outside
        # every pool that would run out of memory takes a free block of the
        # use_on_oom pool, never of another pool; the block goes back to its pool.
        torch = self.torch
        u8 = torch.uint8
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        init = torch.cuda.get_per_process_memory_fraction()
        _, total = torch.cuda.mem_get_info()
        torch.cuda.set_per_process_memory_fraction((80 * MIB + torch.cuda.memory_reserved()) / total)
        r = {}
        self.out["use_on_oom"] = r

        def ooms(n):
            try:
                torch.empty(n, dtype=u8, device="cuda")
            except torch.OutOfMemoryError:
                return True
            return False

        try:
            other, use = torch.cuda.MemPool(), torch.cuda.MemPool(use_on_oom=True)
            with torch.cuda.use_mem_pool(other):
                a = torch.empty(40 * MIB, dtype=u8, device="cuda")
            with torch.cuda.use_mem_pool(use):
                b = torch.empty(40 * MIB, dtype=u8, device="cuda")
            b_ptr = b.data_ptr()
            r["full_ooms"] = ooms(40 * MIB)
            del a, b
            c = torch.empty(30 * MIB, dtype=u8, device="cuda")
            r["borrowed"] = c.data_ptr() == b_ptr
            r["other_pool_not_borrowed"] = ooms(30 * MIB)
            del c
            with torch.cuda.use_mem_pool(use):
                e = torch.empty(20 * MIB, dtype=u8, device="cuda")
            r["back_in_its_pool"] = e.data_ptr() == b_ptr
            del e, other, use
        finally:
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(init)

    def s_pool_allocator(self):
        # MemPool(allocator=CUDAPluggableAllocator(...)) (upstream's
        # test_mempool_with_allocator with a C allocator compiled here: the
        # CUDA runtime's cudaMalloc/cudaFree, counted): the pool's segments
        # come from it, its blocks are cached (1 MiB and 512 KiB share a
        # 2 MiB segment, a second 1 MiB needs another), other allocations
        # never reach it, and ~MemPool gives the segments back to it.
        import ctypes
        import shutil
        import tempfile

        torch = self.torch
        u8 = torch.uint8
        d = tempfile.mkdtemp(prefix="reservoir-pool-alloc-")
        with open(os.path.join(d, "a.c"), "w") as f:
            f.write(POOL_ALLOCATOR_C)
        so = os.path.join(d, "libpoolalloc.so")
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", os.path.join(d, "a.c"), "-o", so, "-ldl"], check=True)
        lib = ctypes.CDLL(so)
        count = {n: ctypes.c_int.in_dll(lib, n) for n in ("allocs", "frees")}
        alloc = torch.cuda.memory.CUDAPluggableAllocator(so, "pool_alloc", "pool_free")
        shutil.rmtree(d)  # loaded: the files are not needed any more
        pool = torch.cuda.MemPool(alloc.allocator())
        r = {"use_count": pool.use_count()}
        self.out["pool_allocator"] = r
        with torch.cuda.use_mem_pool(pool):
            x0 = torch.empty(MIB, dtype=u8, device="cuda")
            x1 = torch.empty(MIB // 2, dtype=u8, device="cuda")
            r["segments_1"] = len(pool.snapshot())
            x2 = torch.empty(MIB, dtype=u8, device="cuda")
            r["segments_2"] = len(pool.snapshot())
        r["allocs"] = count["allocs"].value
        outside = torch.empty(MIB, dtype=u8, device="cuda")
        r["allocs_after_outside"] = count["allocs"].value
        del x0, x1, x2, outside
        r["frees_while_pool_lives"] = count["frees"].value
        del pool
        r["frees_after_del_pool"] = count["frees"].value

    def run(self):
        self.guarded("streams", self.s_streams)
        self.guarded("backward", self.s_backward)
        self.guarded("trace", self.s_trace)
        self.guarded("accel", self.s_accel)
        self.guarded("settings", self.s_settings)
        self.guarded("use_on_oom", self.s_use_on_oom)
        self.guarded("pool_allocator", self.s_pool_allocator)
        self.torch.cuda.synchronize()
        self.out["stats"] = dict(self.torch.cuda.memory_stats())
        print("RESULT " + json.dumps(self.out), flush=True)


# A CUDAPluggableAllocator library: the CUDA runtime torch loaded, counted.
POOL_ALLOCATOR_C = r"""
#include <dlfcn.h>
#include <stddef.h>
int allocs = 0, frees = 0;
static void* rt(const char* name) {
  void* h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
  return h ? dlsym(h, name) : NULL;
}
void* pool_alloc(size_t size, int device, void* stream) {
  int (*f)(void**, size_t) = (int (*)(void**, size_t))rt("cudaMalloc");
  void* p = NULL;
  if (!f || f(&p, size) != 0) return NULL;
  allocs++;
  return p;
}
void pool_free(void* ptr, size_t size, int device, void* stream) {
  int (*f)(void*) = (int (*)(void*))rt("cudaFree");
  if (f) f(ptr);
  frees++;
}
"""

CSAN_PROGRAM = r"""
import os, sys, torch
conf = os.environ.get("MODES_RESERVOIR_CONF")
if conf is not None:
    import reservoir.torch as rt
    rt.enable(conf)
import torch.cuda._sanitizer as csan
out = {}
s = torch.cuda.Stream()
if sys.argv[1] == "race":
    # The seeded race: `a` written on the default stream, read on s with no wait.
    try:
        a = torch.ones(1 << 20, device="cuda")
        with torch.cuda.stream(s):
            b = a * 2
        torch.cuda.synchronize()
        out["race_reported"] = False
    except csan.CUDASanitizerErrors as e:
        out["race_reported"] = "detected" in str(e)
    print("RESULT " + __import__("json").dumps(out), flush=True)
    sys.exit(0)
# Correct: memory freed on one stream and reused on another, synchronised.
for _ in range(3):
    a = torch.ones(1 << 20, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        b = a * 2
    a.record_stream(s)
    del a
    torch.cuda.current_stream().wait_stream(s)
    b.record_stream(torch.cuda.current_stream())
    c = b + 1
    del b, c
torch.cuda.synchronize()
out["correct_ok"] = True
print("RESULT " + __import__("json").dumps(out), flush=True)
"""


def run_program(alloc, conf, native_conf):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if native_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = native_conf
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--phase", alloc, conf], capture_output=True,
                       text=True, env=env, timeout=600)
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"failed": f"exit {p.returncode}: {(p.stderr or p.stdout)[-1500:]}", "errors": {}}
    return json.loads(lines[-1][len("RESULT "):])


def run_csan(conf):
    """The correct program and the seeded race, each in a process of its own."""
    env = dict(os.environ)
    env["TORCH_CUDA_SANITIZER"] = "1"
    env.pop("MODES_RESERVOIR_CONF", None)
    if conf is not None:
        env["MODES_RESERVOIR_CONF"] = conf
    out = {}
    for which in ("correct", "race"):
        p = subprocess.run([sys.executable, "-c", CSAN_PROGRAM, which], capture_output=True, text=True, env=env,
                           timeout=600)
        lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
        if not lines:
            out[f"{which}_failed"] = f"exit {p.returncode}: {(p.stderr or p.stdout)[-800:]}"
        else:
            out.update(json.loads(lines[-1][len("RESULT "):]))
    return out


def main():
    c = Checks()
    wanted = os.environ.get("RESERVOIR_PROOF_MODES", "pytorch,expandable,reservoir").split(",")
    natives, csan_native = {}, run_csan(None)
    for label, conf, native_conf, exact in MODES:
        if label not in wanted:
            continue
        if native_conf not in natives:
            natives[native_conf] = run_program("native", "", native_conf)
        nat = natives[native_conf]
        res = run_program("reservoir", conf, None)

        def claim(ok, name, detail=""):
            c.check(f"{label} {name}", ok, detail)

        claim("failed" not in res and not res["errors"], "the program runs without an error",
              res.get("failed") or res["errors"])
        claim("failed" not in nat and not nat["errors"], "(native torch runs it without an error)",
              nat.get("failed") or nat["errors"])
        st, nst = res.get("streams", {}), nat.get("streams", {})
        for prog in ("ddp", "fsdp", "prefetch"):
            claim(st.get(prog) == 0 and (st.get(f"{prog}_control") or 0) > 0,
                  f"{prog}: the race sanitizer reports {st.get(prog)} with record_stream "
                  f"(native {nst.get(prog)}), {st.get(f'{prog}_control')} without (the negative control; "
                  f"native {nst.get(f'{prog}_control')})")
        claim(res.get("backward_grad_ok") is True, "backward across streams gives the gradient")
        tr = res.get("trace", {})
        claim(tr.get("alloc_seen") and tr.get("free_seen"),
              f"torch.cuda._gpu_trace sees the allocation and the free: {tr} (native {nat.get('trace')})")
        ac = res.get("accel", {})
        claim(ac.get("stats_equal") and ac.get("keys_only_in_one") == nat.get("accel", {}).get("keys_only_in_one")
              and len(set(ac.get("allocated", [None, 0]))) == 1
              and len(set(ac.get("reserved", [None, 0]))) == 1
              and len(set(ac.get("reserved_after_empty_cache", [None, 0]))) == 1
              and ac["reserved_after_empty_cache"][0] < ac["reserved"][0],
              f"torch.accelerator answers as torch.cuda: {ac}")
        se, nse = res.get("settings", {}), nat.get("settings", {})
        claim(se.get("roundup4") == nse.get("roundup4") == 96 * MIB and se.get("default") == nse.get("default"),
              f"_set_allocator_settings('roundup_power2_divisions:4'): an 84 MiB request gets "
              f"{se.get('roundup4')} B (native {nse.get('roundup4')}; before {se.get('default')}, native "
              f"{nse.get('default')})")
        claim(se.get("expandable_segment_when") == nse.get("expandable_segment_when") == {"True": True, "False": False},
              f"_set_allocator_settings('expandable_segments:...'): expandable segment when True/False "
              f"{se.get('expandable_segment_when')} (native {nse.get('expandable_segment_when')})")
        uo, nuo = res.get("use_on_oom"), nat.get("use_on_oom")
        want = {"full_ooms": True, "borrowed": True, "other_pool_not_borrowed": True, "back_in_its_pool": True}
        claim(uo == nuo == want,
              f"MemPool(use_on_oom=True): an allocation that would run out of memory takes the pool's free "
              f"block, never another pool's, and the block goes back to its pool: {uo} (native {nuo})")
        pa, npa = res.get("pool_allocator"), nat.get("pool_allocator")
        want = {"use_count": 1, "segments_1": 1, "segments_2": 2, "allocs": 2, "allocs_after_outside": 2,
                "frees_while_pool_lives": 0, "frees_after_del_pool": 2}
        claim(pa == npa == want,
              f"MemPool(allocator=CUDAPluggableAllocator(...)): the pool's segments come from its allocator, "
              f"its blocks are cached, ~MemPool gives them back: {pa} (native {npa})")
        if exact:
            d = diff_stats(nat.get("stats", {}), res.get("stats", {}))
            claim(bool(res.get("stats")) and not d,
                  f"memory_stats() every key equal native's ({len(res.get('stats', {})) - len(d)} of "
                  f"{len(nat.get('stats', {}))})", dict(list(d.items())[:10]))
        cs = run_csan(conf)
        claim(cs.get("correct_ok") is True and cs.get("race_reported") is True,
              f"the CUDA Sanitizer (TORCH_CUDA_SANITIZER=1): a correct cross-stream program passes, the seeded "
              f"race is reported: {cs} (native {csan_native})")
    print(f"modes: {c.passed} passed, {c.failed} failed")
    sys.exit(1 if c.failed else 0)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--phase":
        Program(sys.argv[2], sys.argv[3]).run()
    else:
        main()
