"""Proof that real torch 2.15 runs on Reservoir (issue 15, deliverable 5;
spec ../shared/spec/pytorch-allocator.md section 3), on the fake CUDA device
of ../shared/oracle. Run by tools/torch-proof.sh, which prepares:

  RESERVOIR_PROOF_TRACE      a real trace (../shared/traces) in the oracle's text format
                             (`reservoir convert SNAPSHOT --oracle-trace TRACE`)
  RESERVOIR_PROOF_SIM_STATS  Reservoir's own replay of it on the simulated device
                             (examples/oracle_trace_stats.rs), JSON

Each phase runs in a fresh process (torch's allocator is chosen once per
process):
  train    reservoir.torch.enable(), then MLP training steps on two streams (a
           data stream copying batches in, a compute stream reading them),
           with Tensor.record_stream (forwarded by enable()) for the cross-stream use;
           --no-record-stream is the negative control
  replay   the trace's allocation sequence through torch.empty/del

The driver prints lines starting "torch proof" with the numbers, and closes
with "proof: N passed, M failed".
"""

import ctypes
import json
import os
import subprocess
import sys
import tempfile

from fakecuda import EV_ALLOC, EV_CREATE, Checks, LogEntry, fake_driver

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
ORACLE = os.path.join(ROOT, "..", "shared", "oracle")

STEPS = 6
BATCH, IN, HIDDEN, OUT = 64, 256, 512, 10


def device_allocations(fake):
    """(api, size) of every successful device allocation in the fake's log."""
    out = []
    e = LogEntry()
    for i in range(fake.fakecuda_log_count()):
        fake.fakecuda_log_get(i, ctypes.byref(e))
        if e.kind in (EV_ALLOC, EV_CREATE) and e.result == 0:
            out.append((e.api.decode(), e.size))
    return out


def log_summary(fake, stats):
    allocs = device_allocations(fake)
    apis = {}
    for api, _ in allocs:
        apis[api] = apis.get(api, 0) + 1
    return {
        "device_allocations": len(allocs),
        "device_bytes": sum(s for _, s in allocs),
        "by_api": apis,
        "torch_cudaMalloc": sum(n for api, n in apis.items() if api.startswith("cuda")),
        "reservoir_device_allocs": stats["num_device_alloc"],
        "reservoir_segment_bytes": stats["reserved_bytes.all.allocated"],
    }


def phase_train(record, native=False):
    """Training on two streams; `native`: on torch's own caching allocator
    instead (for comparison), else on Reservoir."""
    import torch
    import reservoir.torch as rt

    if native:
        memory_stats, memory_snapshot = torch.cuda.memory_stats, torch.cuda.memory_snapshot
    else:
        rt.enable()
        memory_stats, memory_snapshot = rt.memory_stats, rt.memory_snapshot
    fake = fake_driver()
    fake.fakecuda_log_enable(1)
    dev = torch.device("cuda", 0)
    torch.backends.cudnn.enabled = False
    model = torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT)
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.cuda.Stream(dev)
    compute = torch.cuda.Stream(dev)
    compute.wait_stream(torch.cuda.current_stream(dev))
    host = torch.randn(BATCH, IN).pin_memory()
    target = torch.zeros(BATCH, dtype=torch.long)
    for _ in range(STEPS):
        with torch.cuda.stream(data):
            x = host.to(dev, non_blocking=True)  # an H2D copy on the data stream
            y = target.to(dev, non_blocking=True)
            # a "kernel" on the data stream writing the batch (the sanitizer
            # sees copies and these ranges, not real kernels)
            fake.fakecuda_stream_enqueue(data.cuda_stream, x.data_ptr(), x.numel() * x.element_size(), 1)
        with torch.cuda.stream(compute):
            compute.wait_stream(data)
            fake.fakecuda_stream_enqueue(compute.cuda_stream, x.data_ptr(), x.numel() * x.element_size(), 0)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if record:  # torch's own idiom: enable() forwards it to Reservoir
                x.record_stream(compute)
                y.record_stream(compute)
        del x, y, loss  # freed while the compute stream may still read them
    stats = dict(memory_stats())
    live = sum(b["size"] for s in memory_snapshot() for b in s["blocks"] if b["state"] == "active_allocated")
    if not native:
        rt.check_invariants()
    torch.cuda.synchronize(dev)
    out = log_summary(fake, stats)
    out.update(
        steps=STEPS,
        streams=2,
        allocated_peak=stats["allocated_bytes.all.peak"],
        reserved_peak=stats["reserved_bytes.all.peak"],
        allocations=stats["allocation.all.allocated"],
        live_bytes=stats["allocated_bytes.all.current"],
        snapshot_live_bytes=live,
        sanitizer_reports=fake.fakecuda_sanitizer_violations(),
        stats=stats,
    )
    if out["sanitizer_reports"]:
        buf = ctypes.create_string_buffer(400)
        fake.fakecuda_sanitizer_last(buf, 400)
        out["sanitizer_last"] = buf.value.decode(errors="replace")
    print("RESULT " + json.dumps(out))


def load_trace(path):
    ops = []
    with open(path) as f:
        for line in f:
            p = line.split("#", 1)[0].split()
            if p:
                ops.append(p)
    return ops


def phase_replay(trace, snapshot_path):
    import torch
    import reservoir.torch as rt

    rt.enable()
    fake = fake_driver()
    fake.fakecuda_log_enable(1)
    dev = torch.device("cuda", 0)
    torch.cuda.init()
    rt.record_memory_history(context=None, max_entries=1 << 20)
    default = torch.cuda.default_stream(dev)
    streams = {"0": default, "default": default}

    def stream(name):
        if name not in streams:
            streams[name] = torch.cuda.Stream(dev)
        return streams[name]

    live, failed = {}, set()
    current = default
    for p in load_trace(trace):
        k = p[0]
        if k == "a":
            st = stream(p[3]) if len(p) == 4 else current
            with torch.cuda.stream(st):
                t = torch.empty(int(p[2]), dtype=torch.uint8, device=dev)
            if t.data_ptr() == 0 and t.numel() > 0:
                failed.add(int(p[1]))  # refused by Reservoir (out of memory)
            else:
                live[int(p[1])] = t
            del t
        elif k == "f":
            ident = int(p[1])
            if live.pop(ident, None) is None and ident not in failed:
                raise SystemExit(f"free of id {ident}, which is not live")
        elif k == "e":
            rt.empty_cache()
        elif k == "s":
            current = stream(p[1])
        elif k == "r":
            live[int(p[1])].record_stream(stream(p[2]))
        elif k == "y":
            torch.cuda.synchronize(dev) if len(p) == 1 else stream(p[1]).synchronize()
        elif k == "w":
            stream(p[1]).wait_stream(stream(p[2]))
        else:
            raise SystemExit(f"op {k!r} is not used by the proof's traces")
    stats = dict(rt.memory_stats())
    rt.check_invariants()
    rt.dump_snapshot(snapshot_path)
    out = log_summary(fake, stats)
    out.update(ops=len(load_trace(trace)), ooms=len(failed), stats=stats)
    print("RESULT " + json.dumps(out))


def run_phase(args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run([sys.executable, __file__] + args, capture_output=True, text=True, env=e, timeout=600)
    lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        sys.stderr.write(r.stdout[-3000:] + r.stderr[-3000:])
        raise RuntimeError(f"phase {args} failed with exit code {r.returncode}")
    return json.loads(lines[-1][len("RESULT "):])


def main():
    c = Checks()
    trace = os.environ["RESERVOIR_PROOF_TRACE"]
    with open(os.environ["RESERVOIR_PROOF_SIM_STATS"]) as f:
        sim = json.load(f)["memory_stats"]

    # 1. Training on two streams, synchronous fake device.
    t = run_phase(["--phase", "train"])
    print(
        f"torch proof train: {t['steps']} steps on {t['streams']} streams, {t['allocations']} allocations, "
        f"peak allocated {t['allocated_peak']} B, peak reserved {t['reserved_peak']} B; "
        f"device allocations {t['device_allocations']} ({t['by_api']}), "
        f"Reservoir segments {t['reservoir_device_allocs']}, torch cudaMalloc {t['torch_cudaMalloc']}"
    )
    c.check("train: torch made no cudaMalloc of its own", t["torch_cudaMalloc"] == 0, t["by_api"])
    c.check(
        "train: every device allocation is one of Reservoir's segments",
        t["device_allocations"] > 0
        and t["device_allocations"] == t["reservoir_device_allocs"]
        and t["device_bytes"] == t["reservoir_segment_bytes"],
        t,
    )
    c.check("train: memory_stats agrees with the snapshot", t["live_bytes"] == t["snapshot_live_bytes"], t)
    # The same training on torch's own caching allocator (default settings).
    nat = run_phase(["--phase", "train", "--native"])["stats"]
    keys = [k for k in nat if k in t["stats"]]
    agree = [k for k in keys if nat[k] == t["stats"][k]]
    print(f"torch proof train vs PyTorch's allocator: {len(agree)} of {len(keys)} memory_stats keys equal "
          f"(reserved peak {nat['reserved_bytes.all.peak']} vs {t['reserved_peak']} B)")
    c.check("train: every memory_stats key equals PyTorch's own allocator's", len(agree) == len(keys) > 100,
            {k: (nat[k], t["stats"][k]) for k in keys if k not in agree})

    # 2. A real trace's allocation sequence through torch tensors.
    with tempfile.TemporaryDirectory() as d:
        snap_path = os.path.join(d, "replay.pickle")
        r = run_phase(["--phase", "replay", trace, snap_path])
        import pickle

        from torch.cuda import _memory_viz

        with open(snap_path, "rb") as f:
            snap = pickle.load(f)
        viz_ok = (
            "Summary of segments" in _memory_viz.segsum(snap)
            and "<html" in _memory_viz.trace_plot(snap).lower()
            and "<html" in _memory_viz.segment_plot(snap).lower()
        )
        segments = len(snap["segments"])
        entries = sum(len(t) for t in snap["device_traces"])
    got = r["stats"]
    same = sorted(k for k in sim if got.get(k) == sim[k])
    differ = sorted(k for k in sim if got.get(k) != sim[k])
    print(
        f"torch proof replay: {os.environ.get('RESERVOIR_PROOF_SOURCE', trace)} {r['ops']} ops through torch.empty, "
        f"device allocations {r['device_allocations']} ({r['by_api']}), torch cudaMalloc {r['torch_cudaMalloc']}, "
        f"peak allocated {got['allocated_bytes.all.peak']} B, peak reserved {got['reserved_bytes.all.peak']} B"
    )
    print(f"torch proof stats: {len(same)} of {len(sim)} memory_stats keys equal Reservoir's own replay"
          + (f"; differ: {differ[:8]}" if differ else ""))
    c.check("replay: torch made no cudaMalloc of its own", r["torch_cudaMalloc"] == 0, r["by_api"])
    c.check(
        "replay: every device allocation is one of Reservoir's segments",
        r["device_allocations"] == r["reservoir_device_allocs"] > 0,
        r,
    )
    c.check("replay: memory_stats() equals Reservoir's own replay of the sequence", not differ,
            {k: (got.get(k), sim[k]) for k in differ[:10]})
    print(f"torch proof snapshot: {segments} segments, {entries} trace entries, opens in torch.cuda._memory_viz: {viz_ok}")
    c.check("replay: the snapshot opens in torch.cuda._memory_viz", viz_ok and segments == got["segment.all.current"])

    # 3. PyTorch's own allocator (the oracle) on the same sequence.
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "oracle.json")
        subprocess.run([sys.executable, os.path.join(ORACLE, "oracle_replay.py"), trace, out, "--quiet"],
                       check=True, capture_output=True, timeout=600)
        with open(out) as f:
            oracle = json.load(f)["stats"]
    keys = [k for k in sim if k in oracle]
    agree = [k for k in keys if oracle[k] == got.get(k)]
    print(f"torch proof vs PyTorch's allocator: {len(agree)} of {len(keys)} memory_stats keys equal "
          f"(reserved peak {oracle['reserved_bytes.all.peak']} vs {got['reserved_bytes.all.peak']} B)")
    c.check("replay: every memory_stats key equals PyTorch's own allocator's",
            len(agree) == len(keys) > 100, {k: (oracle[k], got.get(k)) for k in keys if k not in agree})

    # 4. Asynchronous streams and the race sanitizer: zero reports; without
    # record_stream the sanitizer catches the reuse (negative control).
    env = {"FAKECUDA_ASYNC": "1", "FAKECUDA_SANITIZE": "1"}
    a = run_phase(["--phase", "train"], env)
    n = run_phase(["--phase", "train", "--no-record-stream"], env)
    print(f"torch proof sanitizer: FAKECUDA_ASYNC=1 FAKECUDA_SANITIZE=1 reports {a['sanitizer_reports']} "
          f"(torch cudaMalloc {a['torch_cudaMalloc']}); negative control without record_stream reports "
          f"{n['sanitizer_reports']}")
    c.check("async + sanitizer: zero reports", a["sanitizer_reports"] == 0, a.get("sanitizer_last"))
    c.check("async + sanitizer: torch made no cudaMalloc of its own", a["torch_cudaMalloc"] == 0)
    c.check("negative control: a missing record_stream is reported", n["sanitizer_reports"] > 0)
    print(f"proof: {c.passed} passed, {c.failed} failed")
    sys.exit(1 if c.failed else 0)


if __name__ == "__main__":
    if "--phase" in sys.argv:
        phase = sys.argv[sys.argv.index("--phase") + 1]
        if phase == "train":
            phase_train(record="--no-record-stream" not in sys.argv, native="--native" in sys.argv)
        elif phase == "replay":
            i = sys.argv.index("--phase")
            phase_replay(sys.argv[i + 2], sys.argv[i + 3])
        else:
            raise SystemExit(f"unknown phase {phase!r}")
    else:
        main()
