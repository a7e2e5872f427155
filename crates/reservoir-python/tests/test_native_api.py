"""Proof that torch's own memory API reaches Reservoir (issue 32, item 2), in
real torch 2.15 on the fake CUDA device of ../shared/oracle.

The same program runs in a fresh process (the allocator is chosen before
CUDA is first used) under torch's native caching allocator and under
Reservoir (``reservoir.torch.enable("")``: PyTorch mode), and the answers of
torch's own API are compared:

  train      ``torch.cuda.memory._record_memory_history()``, MLP training and
             tensors of the small and large pools; ``torch.cuda.memory_stats()``
             (every key) and ``torch.cuda.memory_snapshot()`` (segment by
             segment, block by block, addresses aside) at each checkpoint
  empty      ``torch.cuda.empty_cache()``: the fake driver's log shows the
             frees (as many as the cached segments, none from torch itself)
  oom200     ``torch.empty(200 << 30)`` raises ``torch.OutOfMemoryError`` with
             native's text, ``except torch.cuda.OutOfMemoryError`` catches
             it, then training goes on
  dump       ``torch.cuda.memory._dump_snapshot()`` of the history so far:
             opens in ``torch.cuda._memory_viz``, its trace entries equal
             native's, and ``reservoir replay FILE --json`` reproduces it
             (fidelity; the history stops here, as a snapshot does not
             record a memory fraction)
  fraction   ``torch.cuda.set_per_process_memory_fraction(f)``: the OOM comes
             at the same request as native's, with the same message; the
             getter equals native's
  private    private pools through ``torch._C._cuda_beginAllocateToPool`` /
             ``_cuda_endAllocateToPool`` / ``_cuda_releasePool``
  streams    asynchronous fake device with its race sanitizer: a block used
             on another stream and freed is not reused early, whether the
             use was declared by ``Tensor.record_stream`` or by torch's C++
             (the autograd engine's ``recordStream`` on a gradient produced
             on one stream and consumed on another); 0 reports. Negative
             control: the same program with Reservoir behind torch's plain
             ``CUDAPluggableAllocator`` (``reservoir_alloc``/``reservoir_free``,
             no recordStream hook) is reported
  mempool    ``torch.cuda.MemPool`` + ``use_mem_pool`` (last: the newest API)
  devices    every device allocation is Reservoir's: torch's own
             ``cudaMalloc`` count is 0 (native's is not: the control)

The claims run in every mode a user can turn on (issue 40): PyTorch mode
(lines "torch proof native ..."), ``expandable_segments:True`` against native
torch run with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (lines
"torch proof expandable ...", every number equal), and ``policy:reservoir``
(lines "torch proof reservoir ...": its placements are its own, so the claims
comparing numbers with native's become "answers without an error" and the
behaviour claims stay). RESERVOIR_PROOF_MODES (default
"native,expandable,reservoir") chooses them.

Each claim prints one line starting "torch proof MODE " ("ok" or "FAIL"),
and the file closes with "native-api: N passed, M failed". Run by
tools/torch-proof.sh (``run native-api``); RESERVOIR_PROOF_REPLAY_BIN may
name a prebuilt ``reservoir`` binary (else ``cargo run -q -p reservoir-cli``).
"""

import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile

from fakecuda import EV_ALLOC, EV_CREATE, EV_FREE, EV_RELEASE, LogEntry, diff_stats, fake_driver

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))

MIB = 1 << 20
BATCH, IN, HIDDEN, OUT = 64, 256, 512, 10


REAL_GPU = "needs the fake driver's call log and race sanitizer (not on a real GPU)"

# The fake driver's log tags, one per section of the program.
TAGS = ["train", "empty", "oom200", "dump", "fraction", "private", "streams", "mempool"]


# ---------------------------------------------------------------------------
# The program (run in a subprocess: `--phase ALLOC`)
# ---------------------------------------------------------------------------

def device_log(fake):
    """Every device memory call of the fake's log: (section, kind, api, size, result)."""
    out = []
    e = LogEntry()
    for i in range(fake.fakecuda_log_count()):
        fake.fakecuda_log_get(i, ctypes.byref(e))
        out.append((TAGS[e.tag] if 0 <= e.tag < len(TAGS) else str(e.tag), e.kind, e.api.decode(), e.size, e.result))
    return out


class Program:
    """One run of the program under `alloc` ("native", "reservoir" or
    "pluggable", the negative control: Reservoir without torch's hooks)."""

    def __init__(self, alloc):
        import torch

        self.torch = torch
        self.alloc = alloc
        if alloc == "reservoir":
            import reservoir.torch as rt

            rt.enable(os.environ.get("RESERVOIR_PROOF_CONF", ""))
        elif alloc == "pluggable":
            import reservoir._native as native

            torch.cuda.memory.change_current_allocator(
                torch.cuda.memory.CUDAPluggableAllocator(native.__file__, "reservoir_alloc", "reservoir_free"))
        elif alloc != "native":
            raise SystemExit(f"unknown allocator {alloc!r}")
        # None on a real GPU (tools/gpu-check.sh): the claims that need the
        # fake driver's log or sanitizer are then skipped, saying so.
        self.fake = fake_driver(optional=True)
        if self.fake:
            self.fake.fakecuda_log_enable(1)
        self.dev = torch.device("cuda", 0)
        torch.backends.cudnn.enabled = False
        self.streams = {0: "default"}
        self.out = {"alloc": alloc, "checkpoints": {}, "errors": {}}

    def section(self, name):
        if self.fake:
            self.fake.fakecuda_log_set_tag(TAGS.index(name))

    def stream_name(self, handle):
        return self.streams.get(handle, f"stream{handle:#x}")

    def segments(self, raw):
        """A snapshot's segments with addresses aside: streams by name,
        blocks in address order, sorted by content (addresses decide the
        order of segments, and the two allocators' devices give different
        addresses)."""
        segs = []
        for s in raw:
            seg = {k: v for k, v in s.items() if k not in ("address", "blocks", "frames")}
            seg["stream"] = self.stream_name(s["stream"])
            seg["segment_pool_id"] = list(s.get("segment_pool_id", ()))
            seg["blocks"] = [{k: v for k, v in b.items() if k not in ("address", "frames")}
                             for b in sorted(s["blocks"], key=lambda b: b["address"])]
            segs.append(seg)
        return sorted(segs, key=lambda s: json.dumps(s, sort_keys=True))

    def checkpoint(self, name):
        torch = self.torch
        try:
            self.out["checkpoints"][name] = {
                "stats": dict(torch.cuda.memory_stats(self.dev)),
                "segments": self.segments(torch.cuda.memory_snapshot()),
            }
        except Exception as e:  # noqa: BLE001 (the driver reports it for this checkpoint)
            self.out["checkpoints"][name] = {"error": f"{type(e).__name__}: {e}"[:300]}
        self.report()  # kept should the process abort before its section ends

    def train(self, steps):
        torch = self.torch
        for _ in range(steps):
            x = torch.randn(BATCH, IN, device=self.dev)
            y = torch.randint(0, OUT, (BATCH,), device=self.dev)
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        return float(loss.detach().cpu())

    def guarded(self, name, fn, *args):
        """Run section `name`; an exception is recorded (a finding), not fatal."""
        self.section(name)
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 (reported by the driver)
            import traceback

            self.out["errors"][name] = f"{type(e).__name__}: {e}"[:600]
            sys.stderr.write(traceback.format_exc())
        # What was reached so far: the driver takes the last RESULT line,
        # so a crash (an abort in C++) later keeps the sections before it.
        self.out.setdefault("done", []).append(name)
        self.report()

    def run_api(self, dump_path):
        torch = self.torch
        self.out["allocator_backend"] = torch._C._cuda_getAllocatorBackend()
        self.guarded("train", self.s_train)
        self.guarded("empty", self.s_empty)
        self.guarded("oom200", self.s_oom200)
        # (The history ends here: a snapshot does not record a memory
        # fraction's changes, so `reservoir replay` could not know the
        # fraction section's limit.)
        self.guarded("dump", self.s_dump, dump_path)
        self.guarded("fraction", self.s_fraction)
        self.guarded("private", self.s_private)

    def s_train(self):
        torch = self.torch
        torch.cuda.memory._record_memory_history(max_entries=100000)
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT)).to(self.dev)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.train(3)
        # The small pool (<= 1 MiB), the large pool (split and oversize
        # segments), and frees in between.
        self.keep = [torch.empty(n, dtype=torch.uint8, device=self.dev)
                     for n in (512, 3000, 700 * 1024, 3 * MIB, 5 * MIB + 123, 25 * MIB, 1 * MIB + 1)]
        del self.keep[1], self.keep[3]
        self.spare = [torch.empty(n, dtype=torch.uint8, device=self.dev) for n in (12 * MIB, 2 * MIB)]
        self.checkpoint("train")

    def s_empty(self):
        """empty_cache: the cached segments go back to the device."""
        torch = self.torch
        del self.spare, self.keep[-1]
        # Two segments of their own (requests above the large pool's
        # 20 MiB segments), freed whole: cached until empty_cache.
        whole = [torch.empty(n, dtype=torch.uint8, device=self.dev) for n in (60 * MIB, 48 * MIB + 5)]
        del whole
        gc.collect()
        cached = [s for s in torch.cuda.memory_snapshot() if s["allocated_size"] == 0]
        self.out["empty"] = {"cached_segments": len(cached), "cached_bytes": sum(s["total_size"] for s in cached)}
        self.checkpoint("empty_before")
        torch.cuda.empty_cache()
        self.checkpoint("empty_after")

    def s_oom200(self):
        """The 200 GiB request: torch.OutOfMemoryError, caught by `except
        torch.cuda.OutOfMemoryError`, and training goes on."""
        torch = self.torch
        oom = {"raised": None}
        self.out["oom200"] = oom
        try:
            y = torch.empty(200 << 30, dtype=torch.uint8, device=self.dev)
            oom["data_ptr_zero"] = y.data_ptr() == 0
            del y
        except torch.cuda.OutOfMemoryError as e:
            oom.update(raised=type(e).__name__, is_torch_oom=isinstance(e, torch.OutOfMemoryError),
                       message=str(e))
        except Exception as e:  # noqa: BLE001 (reported: a wrong exception type is a finding)
            oom.update(raised=type(e).__name__, is_torch_oom=False, message=str(e))
        oom["loss_after"] = self.train(2)
        self.checkpoint("oom200")

    def s_fraction(self):
        """set_per_process_memory_fraction: which request fails, and how."""
        torch = self.torch
        frac = {"fraction": 0.02}
        self.out["fraction"] = frac
        torch.cuda.set_per_process_memory_fraction(frac["fraction"], self.dev)
        frac["get"] = torch.cuda.get_per_process_memory_fraction(self.dev)
        held = []
        try:
            for i in range(200):
                held.append(torch.empty(96 * MIB + i * 4097, dtype=torch.uint8, device=self.dev))
            frac["failed_at"] = None
        except torch.cuda.OutOfMemoryError as e:
            frac.update(failed_at=len(held), message=str(e))
        self.checkpoint("fraction_oom")
        del held
        torch.cuda.set_per_process_memory_fraction(1.0, self.dev)
        torch.cuda.empty_cache()
        self.checkpoint("fraction_after")

    def s_mempool(self):
        """torch.cuda.MemPool + use_mem_pool."""
        torch = self.torch
        mp = {}
        self.out["mempool"] = mp
        pool = torch.cuda.MemPool()
        mp["id"] = list(pool.id)
        with torch.cuda.use_mem_pool(pool):
            in_pool = [torch.empty(n, dtype=torch.uint8, device=self.dev) for n in (600, 3 * MIB, 30 * MIB)]
        outside = torch.empty(3 * MIB, dtype=torch.uint8, device=self.dev)
        mp["use_count"] = pool.use_count()
        mp["pool_segments"] = self.segments(pool.snapshot())
        self.checkpoint("mempool_live")
        del in_pool[1]
        self.checkpoint("mempool_partly_freed")
        del in_pool, outside
        del pool
        gc.collect()
        self.checkpoint("mempool_deleted")
        torch.cuda.empty_cache()
        self.checkpoint("mempool_emptied")

    def s_private(self):
        """Private pools as CUDA graphs use them."""
        torch = self.torch
        pid = torch.cuda.graph_pool_handle()
        self.out["private_pool_id"] = list(pid)
        torch._C._cuda_beginAllocateToPool(self.dev.index, pid)
        private = [torch.empty(n, dtype=torch.uint8, device=self.dev) for n in (5 * MIB, 100, 40 * MIB)]
        torch._C._cuda_endAllocateToPool(self.dev.index, pid)
        public = torch.empty(5 * MIB, dtype=torch.uint8, device=self.dev)
        self.checkpoint("private_live")
        del private
        self.checkpoint("private_freed")
        torch._C._cuda_releasePool(self.dev.index, pid)
        torch.cuda.empty_cache()
        self.checkpoint("private_released")
        del public

    def s_dump(self, dump_path):
        """The history: dumped, opened in torch's viewer."""
        torch = self.torch
        torch.cuda.memory._dump_snapshot(dump_path)
        torch.cuda.memory._record_memory_history(enabled=None)
        import pickle

        from torch.cuda import _memory_viz

        with open(dump_path, "rb") as f:
            snap = pickle.load(f)
        self.out["dump"] = {
            # The history without addresses and stacks: what happened, in order.
            "entries": [[e["action"], e["size"], self.stream_name(e["stream"])]
                        for t in snap["device_traces"] for e in t],
            "segments": len(snap["segments"]),
            "trace_entries": sum(len(t) for t in snap["device_traces"]),
            "viz": "Summary of segments" in _memory_viz.segsum(snap)
            and "<html" in _memory_viz.trace_plot(snap).lower()
            and "<html" in _memory_viz.segment_plot(snap).lower(),
        }

    def s_streams(self):
        """A block used on another stream, then freed: reused early only if
        the use did not reach the allocator (FAKECUDA_ASYNC: work stays
        pending; the sanitizer reports a write racing a pending read)."""
        torch = self.torch
        fake = self.fake
        if not fake:
            self.out["streams"] = {"skipped": REAL_GPU}
            return
        torch.cuda.synchronize()
        fake.fakecuda_set_async(1)
        fake.fakecuda_set_sanitize(1)
        fake.fakecuda_sanitizer_reset()
        res = {}
        self.out["streams"] = res
        a, b = torch.cuda.Stream(self.dev), torch.cuda.Stream(self.dev)
        self.streams.update({a.cuda_stream: "a", b.cuda_stream: "b"})
        # Requests above 10 MiB get segments of their own (spec 1.3), so the
        # freed block is the only exact fit of the next request of its size
        # on its stream: reused at once unless the other stream's use reached
        # the allocator.
        n = 22 * MIB

        # 1. Tensor.record_stream from Python.
        with torch.cuda.stream(a):
            x = torch.empty(n, dtype=torch.uint8, device=self.dev)
            fake.fakecuda_stream_enqueue(a.cuda_stream, x.data_ptr(), n, 1)
        b.wait_stream(a)
        fake.fakecuda_stream_enqueue(b.cuda_stream, x.data_ptr(), n, 0)  # b reads x, still pending
        x.record_stream(b)
        del x
        with torch.cuda.stream(a):
            y = torch.empty(n, dtype=torch.uint8, device=self.dev)
            fake.fakecuda_stream_enqueue(a.cuda_stream, y.data_ptr(), n, 1)  # a writes y
        res["python_record_stream_reports"] = fake.fakecuda_sanitizer_violations()
        res["python_record_stream_last"] = self.sanitizer_last()
        del y
        torch.cuda.synchronize()
        fake.fakecuda_sanitizer_reset()

        # 2. recordStream from torch's C++: the autograd engine records a
        # gradient produced on stream a (Second's backward) and consumed on
        # stream b (First's backward) on b.
        class First(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t):
                return t.clone()

            @staticmethod
            def backward(ctx, g):
                s = torch.cuda.current_stream()
                fake.fakecuda_stream_enqueue(s.cuda_stream, g.data_ptr(), g.numel() * g.element_size(), 0)
                return None

        class Second(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t):
                return t.clone()

            @staticmethod
            def backward(ctx, g):
                s = torch.cuda.current_stream()
                grad = torch.empty_like(g)
                fake.fakecuda_stream_enqueue(s.cuda_stream, grad.data_ptr(), grad.numel() * grad.element_size(), 1)
                res["grad_stream"] = self.stream_name(s.cuda_stream)
                return grad

        n = 24 * MIB
        leaf = torch.empty(n // 4, dtype=torch.float32, device=self.dev, requires_grad=True)
        with torch.cuda.stream(b):
            h = First.apply(leaf)
        a.wait_stream(b)
        with torch.cuda.stream(a):
            out = Second.apply(h)
        seed = torch.empty_like(out)
        torch.cuda.current_stream().wait_stream(a)
        out.backward(seed)  # First's backward runs on b, reading Second's gradient made on a
        # The gradient's block is free now (out's, of the same size on a, is
        # still held): z on a would get it at once.
        with torch.cuda.stream(a):
            z = torch.empty(n, dtype=torch.uint8, device=self.dev)
            fake.fakecuda_stream_enqueue(a.cuda_stream, z.data_ptr(), n, 1)  # a writes z
        res["cpp_record_stream_reports"] = fake.fakecuda_sanitizer_violations()
        res["cpp_record_stream_last"] = self.sanitizer_last()
        del z, leaf, out, h, seed
        torch.cuda.synchronize()
        fake.fakecuda_set_sanitize(0)
        fake.fakecuda_set_async(0)

    def sanitizer_last(self):
        buf = ctypes.create_string_buffer(400)
        self.fake.fakecuda_sanitizer_last(buf, 400)
        return buf.value.decode(errors="replace")

    def report(self):
        """Print the results so far as one RESULT line."""
        if not self.fake:
            self.out["device"] = {"skipped": REAL_GPU}
            print("RESULT " + json.dumps(self.out), flush=True)
            return
        log = device_log(self.fake)
        allocs = [(sec, api, size) for sec, kind, api, size, res in log if kind in (EV_ALLOC, EV_CREATE) and res == 0]
        frees = [(sec, api) for sec, kind, api, size, res in log if kind in (EV_FREE, EV_RELEASE) and res == 0]
        by_api = {}
        for _, api, _ in allocs:
            by_api[api] = by_api.get(api, 0) + 1
        self.out["device"] = {
            "allocations": len(allocs),
            "by_api": by_api,
            "torch_cudaMalloc": sum(1 for _, api, _ in allocs if api.startswith("cuda")),
            "frees_by_section": {s: sum(1 for sec, _ in frees if sec == s) for s in TAGS},
            "free_apis": sorted({api for _, api in frees}),
        }
        print("RESULT " + json.dumps(self.out), flush=True)


def phase(alloc, sections, dump_path):
    p = Program(alloc)
    if "api" in sections:
        p.run_api(dump_path)
    if "streams" in sections:
        p.guarded("streams", p.s_streams)
    if "api" in sections:
        # Last: the newest API (a crash in it loses no other section).
        p.guarded("mempool", p.s_mempool)
    p.report()


# ---------------------------------------------------------------------------
# The driver: runs the phases and compares
# ---------------------------------------------------------------------------

def run_phase(args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([sys.executable, __file__] + args, capture_output=True, text=True, env=e, timeout=600)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    out = json.loads(lines[-1][len("RESULT "):]) if lines else {"checkpoints": {}, "errors": {}}
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-3000:])
        # The results up to the crash stay (the last RESULT line).
        out["failed"] = f"phase {args} exited with {r.returncode} after sections {sorted(out.get('done', []))}"
    return out


def replay(path):
    """`reservoir replay PATH --json`: the fidelity of PyTorch mode."""
    exe = os.environ.get("RESERVOIR_PROOF_REPLAY_BIN")
    cmd = [exe] if exe and os.path.exists(exe) else ["cargo", "run", "--locked", "-q", "-p", "reservoir-cli", "--"]
    r = subprocess.run(cmd + ["replay", path, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout)[-800:]}
    for rep in json.loads(r.stdout):  # one report per setting; PyTorch mode's has the fidelity
        if rep.get("fidelity"):
            return dict(rep["fidelity"], peak_reserved=rep["peak_reserved"], ooms=rep["ooms"])
    return {"error": "no fidelity in the report"}


def fidelity_exact(f):
    return (
        "error" not in f
        and f["segment_events_exact"]
        and f["placements_matched"] == f["placements_total"]
        and f["peak_reserved"] == f["recorded_peak_reserved"]
        and f["ooms"] == f["recorded_ooms"]
    )


def fidelity_text(f):
    if "error" in f:
        return f"replay failed: {f['error']}"
    return (f"segment events {f['segment_events_matched']}/{f['segment_events_total']}, "
            f"block placements {f['placements_matched']}/{f['placements_total']}, "
            f"peak reserved {f['peak_reserved']} (recorded {f['recorded_peak_reserved']}), "
            f"OOMs {f['ooms']} (recorded {f['recorded_ooms']})")


class Checks:
    def __init__(self):
        self.passed = self.failed = 0
        self.label = "native"

    skipped = 0

    def skip(self, text, why):
        self.skipped += 1
        print(f"torch proof {self.label} skip {text}: {why}")

    def claim(self, ok, text, detail=None):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(f"torch proof {self.label} {'ok  ' if ok else 'FAIL'} {text}")
        if not ok and detail:
            print(f"    differs: {detail}")


def diff_segments(a, b):
    """The first difference of two normalized segment lists."""
    if len(a) != len(b):
        return f"{len(a)} segments vs {len(b)}: native {[s['total_size'] for s in a]} vs reservoir {[s['total_size'] for s in b]}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            return f"segment {i} ({x['total_size']} B): " + "; ".join(
                f"{k}: native {x.get(k)!r} vs reservoir {y.get(k)!r}" for k in keys)
    return None


# The modes the claims run in (issue 40: every claim in every mode a user can
# turn on): (label, Reservoir's settings, native torch's
# PYTORCH_CUDA_ALLOC_CONF, exact). In an exact mode native torch with the
# same settings is the oracle and every number must equal its; the
# `reservoir` policy places blocks its own way, so there the claims that
# compare numbers with native's are replaced by "the section ran without an
# error" and only the behaviour claims stay (OOM type and training after it,
# streams and the sanitizer, every device allocation Reservoir's).
MODES = [
    ("native", "", None, True),
    ("expandable", "expandable_segments:True", "expandable_segments:True", True),
    ("reservoir", "policy:reservoir", None, False),
]


def main():
    c = Checks()
    wanted = os.environ.get("RESERVOIR_PROOF_MODES", "native,expandable,reservoir").split(",")
    with tempfile.TemporaryDirectory() as d:
        neg = run_phase(["--phase", "pluggable", "streams", os.path.join(d, "pluggable.pickle")])
        natives = {}
        for label, conf, native_conf, exact in MODES:
            if label not in wanted:
                continue
            if native_conf not in natives:
                path = os.path.join(d, f"native-{len(natives)}.pickle")
                env = {"PYTORCH_CUDA_ALLOC_CONF": native_conf} if native_conf else {}
                natives[native_conf] = (run_phase(["--phase", "native", "api,streams", path], env), path)
            nat, nat_dump = natives[native_conf]
            res_dump = os.path.join(d, f"reservoir-{label}.pickle")
            res = run_phase(["--phase", "reservoir", "api,streams", res_dump], {"RESERVOIR_PROOF_CONF": conf})
            fids = {a: replay(p) if os.path.exists(p) else {"error": "no dump"}
                    for a, p in (("native", nat_dump), ("reservoir", res_dump))}
            c.label = label
            mode_claims(c, nat, res, neg, fids, exact, label == "native")
    print(f"native-api: {c.passed} passed, {c.failed} failed"
          + (f", {c.skipped} skipped (not on the fake driver)" if c.skipped else ""))
    sys.exit(1 if c.failed else 0)


def mode_claims(c, nat, res, neg, fids, exact, control):
    """The claims of one mode; `control`: also the negative control's claim."""
    for name, r in (("native", nat), ("reservoir", res), ("pluggable", neg)):
        if "failed" in r:
            print(f"torch proof {c.label}: the {name} program failed: {r['failed']}")
        for k, v in r["errors"].items():
            print(f"torch proof {c.label}: the {name} program's {k} section raised {v}")

    c.claim(res.get("allocator_backend") == "reservoir",
            f"allocator: torch._C._cuda_getAllocatorBackend() is {res.get('allocator_backend')!r} under Reservoir "
            f"(native: {nat.get('allocator_backend')!r})")

    # memory_stats and memory_snapshot at each checkpoint.
    names = list(nat["checkpoints"])
    for name in names:
        n, r = nat["checkpoints"][name], res["checkpoints"].get(name) or {"error": "not reached"}
        if "stats" not in n:
            c.claim(False, f"{name}: memory_stats/memory_snapshot under torch's native allocator: {n['error']}")
            continue
        if "stats" not in r:
            c.claim(False, f"{name}: memory_stats()/memory_snapshot() under Reservoir: {r['error']}")
            continue
        if not exact:
            c.claim(r["stats"].get("allocated_bytes.all.current") is not None and bool(r["segments"]) or name.endswith(("released", "emptied", "after")),
                    f"{name}: memory_stats() ({len(r['stats'])} keys) and memory_snapshot() ({len(r['segments'])} segments) answer")
            continue
        d = diff_stats(n["stats"], r["stats"])
        c.claim(not d, f"{name}: memory_stats() every key equal ({len(n['stats']) - len(d)} of {len(n['stats'])})",
                dict(list(d.items())[:12]))
        ds = diff_segments(n["segments"], r["segments"])
        blocks = sum(len(s["blocks"]) for s in n["segments"])
        c.claim(ds is None, f"{name}: memory_snapshot() equal segment by segment, block by block "
                f"({len(n['segments'])} segments, {blocks} blocks)", ds)

    # The history: viewer and replay.
    nd, rd = nat.get("dump", {}), res.get("dump", {})
    c.claim(bool(rd.get("viz")) and (rd.get("segments") == nd.get("segments") or not exact),
            f"history: _record_memory_history + _dump_snapshot opens in torch.cuda._memory_viz "
            f"({rd.get('segments')} segments, {rd.get('trace_entries')} trace entries; native "
            f"{nd.get('segments')} segments, {nd.get('trace_entries')} trace entries)")
    nh, rh = nd.get("entries"), rd.get("entries")
    first = next((i for i, (x, y) in enumerate(zip(nh or [], rh or [])) if x != y), None)
    if exact:
        c.claim(bool(nh) and nh == rh,
                f"history: the trace entries (action, size, stream) equal native's, in order "
                f"({len(rh or [])} entries; native {len(nh or [])})",
                None if first is None else f"entry {first}: native {nh[first]} vs reservoir {rh[first]}")
        c.claim(fidelity_exact(fids["reservoir"]),
                f"history: reservoir replay reproduces Reservoir's dump exactly: {fidelity_text(fids['reservoir'])} "
                f"(native's dump: {fidelity_text(fids['native'])})")

    real_gpu = "skipped" in res.get("device", {})
    # empty_cache: the driver's frees.
    ne, re_ = nat.get("empty", {}), res.get("empty", {})
    nfree = nat.get("device", {}).get("frees_by_section", {}).get("empty")
    rfree = res.get("device", {}).get("frees_by_section", {}).get("empty")
    if real_gpu:
        c.skip("empty_cache: device frees in the driver's log", REAL_GPU)
    elif not control:
        # Expandable segments give memory back by unmapping pages (one
        # cuMemRelease per physical handle), not a cuMemFree per cached
        # segment: the frees are counted, their number is the backend's
        # (Reservoir's CUDA backend makes a handle per 2 MiB page where torch
        # makes one per segment page, 2 or 20 MiB); what empty_cache leaves
        # is compared key by key above (empty_after).
        c.claim((rfree or 0) > 0,
                f"empty_cache: {rfree} device frees and unmaps in the driver's log (native {nfree}) "
                f"via {res.get('device', {}).get('free_apis')}")
    else:
        c.claim(re_.get("cached_segments", 0) > 0 and rfree == re_.get("cached_segments")
                and (not exact or rfree == nfree == ne.get("cached_segments")),
                f"empty_cache: {rfree} device frees in the driver's log for {re_.get('cached_segments')} cached segments "
                f"({re_.get('cached_bytes')} B; native {nfree} frees of {ne.get('cached_segments')}) "
                f"via {res.get('device', {}).get('free_apis')}")

    # The 200 GiB tensor.
    no, ro = nat.get("oom200", {}), res.get("oom200", {})
    c.claim(ro.get("raised") == "OutOfMemoryError" and ro.get("is_torch_oom") is True,
            f"oom: torch.empty(200 << 30) raises {ro.get('raised')} (a torch.OutOfMemoryError: {ro.get('is_torch_oom')}), "
            f"caught by except torch.cuda.OutOfMemoryError")
    c.claim(ro.get("message") is not None and (ro.get("message") == no.get("message") or not exact),
            "oom: the message equals native's" if exact else "oom: it has a message", f"native {no.get('message')!r} vs reservoir {ro.get('message')!r}")
    c.claim(ro.get("loss_after") is not None, f"oom: training goes on after it (loss {ro.get('loss_after')})")

    # The memory fraction.
    nf, rf = nat.get("fraction", {}), res.get("fraction", {})
    c.claim(rf.get("failed_at") is not None and (rf.get("failed_at") == nf.get("failed_at") or not exact),
            f"fraction: set_per_process_memory_fraction({rf.get('fraction')}): OOM at request {rf.get('failed_at')} "
            f"(native {nf.get('failed_at')})")
    c.claim(rf.get("get") is not None and rf.get("get") == nf.get("get"),
            f"fraction: get_per_process_memory_fraction() {rf.get('get')!r} (native {nf.get('get')!r})")
    c.claim(rf.get("message") is not None and (rf.get("message") == nf.get("message") or not exact),
            "fraction: the OOM message equals native's" if exact else "fraction: the OOM has a message",
            f"native {nf.get('message')!r} vs reservoir {rf.get('message')!r}")

    # MemPool and private pools.
    nm, rm = nat.get("mempool", {}), res.get("mempool", {})
    c.claim("mempool" not in res["errors"] and (rm.get("pool_segments") == nm.get("pool_segments") or not exact)
            and rm.get("use_count") == nm.get("use_count") and bool(rm.get("pool_segments")),
            f"mempool: MemPool.snapshot() equal ({len(rm.get('pool_segments') or [])} segments), "
            f"use_count {rm.get('use_count')} (native {nm.get('use_count')})",
            res["errors"].get("mempool") or diff_segments(nm.get("pool_segments") or [], rm.get("pool_segments") or []))
    def pool_segments(r, name, pid):
        cp = r["checkpoints"].get(name, {})
        return [s for s in cp.get("segments", []) if s["segment_pool_id"] == pid] if "segments" in cp else None

    pid = nat.get("private_pool_id")
    np_, rp = pool_segments(nat, "private_live", pid), pool_segments(res, "private_live", pid)
    nrel, rrel = pool_segments(nat, "private_released", pid), pool_segments(res, "private_released", pid)
    c.claim("private" not in res["errors"] and bool(rp) and (rp == np_ or not exact) and rrel == nrel == [],
            f"private pool {pid}: _cuda_beginAllocateToPool/_cuda_endAllocateToPool serve "
            f"{len(rp or [])} segments of the pool (native {len(np_ or [])}), equal; _cuda_releasePool + "
            f"empty_cache leave {None if rrel is None else len(rrel)} (native {None if nrel is None else len(nrel)})",
            res["errors"].get("private") or diff_segments(np_ or [], rp or []))

    # Streams and the sanitizer.
    ns, rs, gs = nat.get("streams", {}), res.get("streams", {}), neg.get("streams", {})
    if real_gpu:
        c.skip("streams: Tensor.record_stream and C++ recordStream, with the negative control", REAL_GPU)
        c.skip("devices: torch's own cudaMalloc count", REAL_GPU)
        return
    c.claim(rs.get("python_record_stream_reports") == 0,
            f"streams: Tensor.record_stream reaches the allocator: sanitizer reports "
            f"{rs.get('python_record_stream_reports')} (native {ns.get('python_record_stream_reports')}; "
            f"negative control {gs.get('python_record_stream_reports')})",
            rs.get("python_record_stream_last"))
    c.claim(rs.get("cpp_record_stream_reports") == 0,
            f"streams: C++ recordStream (autograd, gradient made on stream {rs.get('grad_stream')}, consumed on b) "
            f"reaches the allocator: sanitizer reports {rs.get('cpp_record_stream_reports')} "
            f"(native {ns.get('cpp_record_stream_reports')}; negative control {gs.get('cpp_record_stream_reports')})",
            rs.get("cpp_record_stream_last"))
    if control:
        c.claim((gs.get("python_record_stream_reports") or 0) > 0 and (gs.get("cpp_record_stream_reports") or 0) > 0,
                f"streams: negative control (Reservoir behind the plain CUDAPluggableAllocator, no hooks) is reported: "
                f"{gs.get('python_record_stream_reports')} and {gs.get('cpp_record_stream_reports')} reports")

    # Every device allocation is Reservoir's.
    ndev, rdev = nat.get("device", {}), res.get("device", {})
    # (Native torch with expandable segments maps with the driver API too,
    # so its cudaMalloc count is the control in PyTorch mode only.)
    c.claim(rdev.get("allocations", 0) > 0 and rdev.get("torch_cudaMalloc") == 0
            and (not control or ndev.get("torch_cudaMalloc", 0) > 0),
            f"devices: torch's own cudaMalloc count {rdev.get('torch_cudaMalloc')} under Reservoir "
            f"({rdev.get('allocations')} device allocations: {rdev.get('by_api')}; native: {ndev.get('by_api')})")


if __name__ == "__main__":
    if "--phase" in sys.argv:
        i = sys.argv.index("--phase")
        phase(sys.argv[i + 1], sys.argv[i + 2].split(","), sys.argv[i + 3])
    else:
        main()
