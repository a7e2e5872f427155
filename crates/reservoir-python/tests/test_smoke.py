"""Smoke test of the reservoir.torch package inside real torch on the fake
CUDA device (spec ../shared/spec/pytorch-allocator.md section 3, pluggable).

Run by tools/torch-proof.sh (which builds and installs the wheel):
    ../shared/oracle/oracle-python crates/reservoir-torch/tests/test_smoke.py
Each test_* function runs in order in one process (enable() is process-wide);
the last line is "smoke: N passed, M failed".
"""

import json
import os
import pickle
import subprocess
import sys
import tempfile
import traceback

import torch

import reservoir.torch as rt

MIB = 1 << 20


def expect_error(fn, *words, exc=rt.ReservoirError):
    try:
        fn()
    except exc as e:
        for w in words:
            assert w in str(e), f"{w!r} not in {e}"
        return str(e)
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def test_enable_runs_the_allocator_of_the_running_torch_release():
    # Issue 33 item 4: without a policy, Reservoir is the running torch's release.
    assert rt.running_release("2.11.0+cu126") == "2.11"
    assert rt.running_release("2.15.0a0+git1234") == "2.15"
    assert rt.running_release("2.10.1") is None and rt.running_release("3.0.0") is None
    assert rt.running_release() == ".".join(torch.__version__.split(".")[:2])
    assert rt.effective_conf("", "2.12.0") == "policy:pytorch-2.12"
    assert rt.effective_conf("expandable_segments:True", "2.11.0") == "policy:pytorch-2.11,expandable_segments:True"
    # A policy the user names wins; an unsupported release keeps PyTorch's newest rules.
    assert rt.effective_conf("policy:reservoir", "2.12.0") == "policy:reservoir"
    assert rt.effective_conf(" policy : pytorch-2.13", "2.12.0") == " policy : pytorch-2.13"
    assert rt.effective_conf("max_split_size_mb:64", "2.9.0") == "max_split_size_mb:64"
    old = os.environ.get("RESERVOIR_ALLOC_CONF")
    os.environ["RESERVOIR_ALLOC_CONF"] = "garbage_collection_threshold:0.6"
    try:
        assert rt.effective_conf(None, "2.13.1") == "policy:pytorch-2.13,garbage_collection_threshold:0.6"
    finally:
        if old is None:
            del os.environ["RESERVOIR_ALLOC_CONF"]
        else:
            os.environ["RESERVOIR_ALLOC_CONF"] = old


def test_bad_conf_is_refused_and_changes_nothing():
    expect_error(lambda: rt.enable("max_split_size_mb:lots"), "max_split_size_mb", "RESERVOIR_ERR_INVALID_CONFIG")
    assert not rt.is_enabled()


def test_enable_serves_torch_from_reservoir():
    rt.enable("max_split_size_mb:40")
    assert rt.is_enabled()
    rt.enable("max_split_size_mb:40")  # same conf: nothing to do
    expect_error(lambda: rt.enable("max_split_size_mb:80"), "already enabled")
    x = torch.empty(MIB, dtype=torch.uint8, device="cuda")
    s = rt.memory_stats()
    assert s["allocated_bytes.all.current"] == MIB, s
    assert s["reserved_bytes.all.current"] == 2 * MIB, s  # PyTorch's small-pool segment rule
    assert s["max_split_size"] == 40 * MIB, "the conf given to enable() applies"
    del x
    assert rt.memory_allocated() == 0
    assert rt.memory_reserved() == 2 * MIB, "freed blocks stay cached"
    rt.empty_cache()
    assert rt.memory_reserved() == 0
    rt.check_invariants()


def test_enable_after_cuda_use_is_a_clear_error():
    code = (
        "import torch, reservoir.torch as rt\n"
        "torch.zeros(1, device='cuda')\n"
        "try:\n    rt.enable()\nexcept rt.ReservoirError as e:\n    print('ERR', e)\n"
        "print('enabled', rt.is_enabled())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "ERR RESERVOIR_ERR_INVALID_STATE" in out.stdout and "before CUDA is first used" in out.stdout, out
    assert "enabled False" in out.stdout, out


def test_training_step_and_stats_agree_with_torch_accounting():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        loss = model(torch.randn(32, 64, device="cuda")).square().mean()
        loss.backward()
        opt.step()
    del loss
    opt.zero_grad(set_to_none=True)
    s = rt.memory_stats()
    # Live: the parameters, each rounded to 512 bytes (PyTorch's rounding).
    rounded = sum(-(-p.numel() * p.element_size() // 512) * 512 for p in model.parameters())
    assert rounded >= params and s["allocated_bytes.all.current"] >= rounded, (rounded, s)
    # The statistics agree with the blocks of the snapshot.
    live = sum(b["size"] for seg in rt.memory_snapshot() for b in seg["blocks"] if b["state"] == "active_allocated")
    assert live == s["allocated_bytes.all.current"], (live, s["allocated_bytes.all.current"])
    assert s["num_alloc_retries"] == 0 and s["num_ooms"] == 0
    rt.check_invariants()


def test_memory_fraction_caps_and_oom_raises():
    rt.set_per_process_memory_fraction(0.0005)  # ~40 MiB of the 80 GB fake device
    assert abs(rt.get_per_process_memory_fraction() - 0.0005) < 1e-9
    before = rt.memory_stats()["num_ooms"]
    # Through Reservoir's C++ face (issue 32) an allocation that does not fit
    # raises torch.OutOfMemoryError with PyTorch's text, counted by Reservoir.
    try:
        torch.empty(512 * MIB, dtype=torch.uint8, device="cuda")
        raise AssertionError("no torch.OutOfMemoryError")
    except torch.OutOfMemoryError as e:
        assert str(e).startswith("CUDA out of memory. Tried to allocate 512.00 MiB."), str(e)
    assert rt.memory_stats()["num_ooms"] == before + 1
    expect_error(lambda: rt.set_per_process_memory_fraction(1.5), "1.5", "RESERVOIR_ERR_INVALID_ARGUMENT")
    assert abs(rt.get_per_process_memory_fraction() - 0.0005) < 1e-9, "a refused fraction changes nothing"
    rt.set_per_process_memory_fraction(1.0)
    y = torch.empty(512 * MIB, dtype=torch.uint8, device="cuda")
    del y
    rt.check_invariants()


def test_history_and_snapshot_open_in_memory_viz():
    from torch.cuda import _memory_viz

    rt.record_memory_history(max_entries=1000)
    keep = [torch.empty(n * MIB, dtype=torch.uint8, device="cuda") for n in (1, 3, 25)]
    del keep[1]
    snap = rt.snapshot()
    assert {"segments", "device_traces"} <= set(snap), snap.keys()
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert actions.count("alloc") >= 3 and "free_requested" in actions, actions
    assert len(rt.memory_snapshot()) == len(snap["segments"])
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "snap.pickle")
        rt.dump_snapshot(path)
        with open(path, "rb") as f:
            data = pickle.load(f)
    summary = _memory_viz.segsum(data)
    assert "Summary of segments" in summary, summary[:200]
    assert "<html" in _memory_viz.trace_plot(data).lower()
    assert "<html" in _memory_viz.segment_plot(data).lower()
    rt.record_memory_history(enabled=None)
    expect_error(lambda: rt.record_memory_history(enabled="sometimes"), "sometimes")
    del keep


def test_bad_device_is_a_clear_error():
    before = rt.memory_stats()
    expect_error(lambda: rt.memory_stats(device=7), "device 7")
    expect_error(lambda: rt.empty_cache(device=7), "device 7")
    assert rt.memory_stats() == before


def test_record_stream_is_forwarded():
    s = torch.cuda.Stream()
    x = torch.empty(4 * MIB, dtype=torch.uint8, device="cuda")
    rt.record_stream(x, s)
    x.record_stream(s)  # torch's method, forwarded by enable()
    expect_error(
        lambda: rt.record_stream(torch.empty(0, device="cpu"), s),
        "RESERVOIR_ERR_INVALID_POINTER: reservoir_torch_record_stream",
    )
    torch.empty(0, device="cuda").record_stream(s)  # no memory: nothing to track
    del x
    rt.check_invariants()


def test_mempool_backed_by_reservoir_without_enable():
    # torch's own caching allocator, one pool of it fed by Reservoir: torch
    # asks reservoir_alloc for that pool's segments (fresh process).
    code = (
        "import torch, reservoir.torch as rt\n"
        "pool = torch.cuda.MemPool(allocator=rt.allocator())\n"
        "with torch.cuda.use_mem_pool(pool):\n"
        "    x = torch.empty(3 << 20, dtype=torch.uint8, device='cuda')\n"
        "s = rt.memory_stats()\n"
        "print('pool', torch.cuda.memory_allocated(), s['allocated_bytes.all.current'], s['segment.all.current'])\n"
        "rt.set_per_process_memory_fraction(0.0005)\n"
        "try:\n"
        "    with torch.cuda.use_mem_pool(pool):\n"
        "        torch.empty(512 << 20, dtype=torch.uint8, device='cuda')\n"
        "except torch.OutOfMemoryError:\n"
        "    print('oom raised')\n"
        "rt.set_per_process_memory_fraction(1.0)\n"
        "del x\n"
        "del pool\n"
        "torch.cuda.empty_cache()\n"
        "print('after', rt.memory_stats()['allocated_bytes.all.current'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = {l.split()[0]: l.split()[1:] for l in out.stdout.splitlines() if l.split()}
    assert "pool" in lines, out
    torch_alloc, ours, _segments = map(int, lines["pool"])
    # torch allocated 3 MiB from its pool; the pool's segment (torch rounds
    # a 3 MiB request to a 20 MiB large segment) came from Reservoir.
    assert torch_alloc == 3 * MIB and ours == 20 * MIB, out
    assert lines.get("after") == ["0"], out
    # Here a null from Reservoir is an out-of-memory error (spec 1, "N").
    assert lines.get("oom") == ["raised"], out


def test_pluggable_allocator_is_withdrawn():
    # Issue 44 F12: change_current_allocator(pluggable_allocator()) handed out
    # a tensor at address 0 on OOM (printing it: SIGSEGV). The route is not
    # offered: it raises, naming enable(), and changes nothing.
    expect_error(rt.pluggable_allocator, "RESERVOIR_ERR_BACKEND_UNAVAILABLE", "withdrawn",
                 "reservoir.torch.enable()", "torch.OutOfMemoryError")
    assert rt._allocator is None
    assert "Withdrawn" in rt.pluggable_allocator.__doc__


EXPANDABLE_WORKLOAD = """
import json, os, sys, torch
if sys.argv[1] == 'reservoir':
    import reservoir.torch as rt
    rt.enable('expandable_segments:True')
    stats = lambda: dict(rt.memory_stats())
else:
    stats = lambda: dict(torch.cuda.memory_stats())
keep = []
for i, n in enumerate([30 << 20, 100 << 10, 7 << 20, 1 << 20, 64 << 20, 3000, 25 << 20]):
    keep.append(torch.empty(n, dtype=torch.uint8, device='cuda'))
    if i % 3 == 2:
        del keep[0]
print(json.dumps(stats()))
"""


def test_expandable_segments_match_pytorch():
    # The same tensors under enable("expandable_segments:True") and under
    # torch's own allocator with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    # (spec 1, expandable segments): every memory_stats key is equal.
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    runs = {}
    for who in ("reservoir", "pytorch"):
        out = subprocess.run([sys.executable, "-c", EXPANDABLE_WORKLOAD, who], capture_output=True, text=True,
                             timeout=120, env=env if who == "pytorch" else os.environ)
        assert out.returncode == 0, out.stderr[-2000:]
        runs[who] = json.loads(out.stdout.strip().splitlines()[-1])
    ours, theirs = runs["reservoir"], runs["pytorch"]
    differ = {k: (ours.get(k), v) for k, v in theirs.items() if ours.get(k) != v}
    assert len(theirs) > 100 and not differ, differ


def main():
    tests = [(n, f) for n, f in globals().items() if n.startswith("test_")]
    passed = failed = 0
    for name, fn in tests:
        try:
            fn()
            passed += 1
            print(f"ok   {name}")
        except Exception:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
    print(f"smoke: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
