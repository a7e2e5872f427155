"""Reservoir's C++ face for torch (issue 32, item 1), in real torch on the
fake CUDA device of ../shared/oracle. Run by tools/torch-proof.sh
("run face ..."), or by hand under ../shared/oracle/env.sh with the venv's
python.

Each phase runs in a fresh process (torch chooses its allocator once per
process):
  face     reservoir.torch.enable(), then: the allocator is torch's
           (get_allocator_backend, _get_current_allocator); torch.cuda's own
           memory_stats / memory_snapshot / _record_memory_history /
           empty_cache / set_per_process_memory_fraction / MemPool /
           record_stream answer from Reservoir; a 200 GiB tensor raises
           torch.OutOfMemoryError, the registered OOM observer ran, and
           training goes on; an unsupported method raises naming itself
  native   the same OOM under torch's own allocator (its text)
  late     enable() after CUDA was used: refused, torch's allocator stays

Prints "ok NAME" / "FAIL NAME detail" and closes with "face: N passed, M failed".
"""

import json
import os
import subprocess
import sys

from fakecuda import Checks

HERE = os.path.dirname(os.path.abspath(__file__))
HUGE = 200 << 30


def oom_text(torch):
    """The same request sequence in both phases: 4 MiB, then 200 GiB."""
    keep = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
    try:
        torch.empty(HUGE, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        return keep, str(e), isinstance(e, torch.cuda.OutOfMemoryError)
    return keep, None, False


def train(torch, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 64, device="cuda")
        y = torch.randint(0, 4, (32,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def phase_native():
    import torch

    _, text, _ = oom_text(torch)
    print("RESULT " + json.dumps({"oom": text}))


def phase_late():
    import torch

    import reservoir.torch as rt

    torch.empty(16, device="cuda")
    try:
        rt.enable()
        refused = False
    except rt.ReservoirError as e:
        refused = "before CUDA is first used" in str(e)
    print("RESULT " + json.dumps({"refused": refused, "backend": torch.cuda.get_allocator_backend(),
                                  "enabled": rt.is_enabled()}))


def phase_face():
    import torch

    import reservoir.torch as rt

    out = {}
    rt.enable()
    out["backend"] = torch.cuda.get_allocator_backend()
    out["current"] = type(torch.cuda.memory._get_current_allocator()).__name__

    observed = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *a: observed.append(a))
    keep, text, is_cuda_oom = oom_text(torch)
    out["oom"] = text
    out["oom_is_cuda_oom"] = is_cuda_oom
    out["observer_calls"] = len(observed)
    out["losses"] = train(torch)

    ts, rs = torch.cuda.memory_stats(), rt.memory_stats()
    out["stats_equal"] = dict(ts) == dict(rs)
    out["num_ooms"] = ts["num_ooms"]
    out["allocated"] = ts["allocated_bytes.all.current"]
    out["snapshot_segments"] = [len(torch.cuda.memory_snapshot()), len(rt.memory_snapshot())]

    torch.cuda.memory._record_memory_history(max_entries=1000)
    t = torch.empty(1 << 20, device="cuda")
    del t
    snap = torch.cuda.memory._snapshot()
    trace = snap["device_traces"][0]
    out["trace_actions"] = sorted({e["action"] for e in trace})
    out["trace_has_python_frames"] = any(
        f.get("filename", "").endswith("test_face.py") for e in trace for f in e.get("frames", []))
    torch.cuda.memory._record_memory_history(enabled=None)

    del keep
    torch.cuda.empty_cache()
    out["reserved_after_empty_cache"] = [torch.cuda.memory_reserved(), rt.memory_reserved()]

    torch.cuda.set_per_process_memory_fraction(0.25)
    out["fraction"] = rt.get_per_process_memory_fraction()
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        torch.empty(int(total * 0.3), dtype=torch.uint8, device="cuda")
        out["fraction_oom"] = None
    except torch.OutOfMemoryError as e:
        out["fraction_oom"] = str(e)
    torch.cuda.set_per_process_memory_fraction(1.0)

    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        p = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    out["pool_use_count"] = pool.use_count()
    pid = list(pool.id)
    out["pool_segments"] = sum(1 for s in rt.memory_snapshot() if list(s.get("segment_pool_id", (0, 0))) == pid)
    out["pool_live_ok"] = torch._C._cuda_checkPoolLiveAllocations(0, pool.id, {p.data_ptr()})
    del p

    s = torch.cuda.Stream()
    r = torch.empty(1 << 20, device="cuda")
    r.record_stream(s)
    del r
    rt.check_invariants()

    out["checkpoint"] = torch._C._cuda_getCheckpointState(0, pool.id) is not None
    try:
        torch.empty(1 << 20, device="cuda").untyped_storage()._share_cuda_()
        out["unsupported"] = None
    except RuntimeError as e:
        out["unsupported"] = str(e).splitlines()[0]
    out["train_after"] = train(torch, 2)
    rt.check_invariants()
    print("RESULT " + json.dumps(out))


def run_phase(name):
    p = subprocess.run([sys.executable, os.path.abspath(__file__), name], capture_output=True, text=True,
                       timeout=600)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit(f"phase {name} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")


def main():
    if len(sys.argv) > 1:
        {"face": phase_face, "native": phase_native, "late": phase_late}[sys.argv[1]]()
        return
    face, native, late = run_phase("face"), run_phase("native"), run_phase("late")
    c = Checks()
    c.check("backend is reservoir", face["backend"] == "reservoir", face["backend"])
    c.check("200 GiB raises torch.OutOfMemoryError (torch.cuda.OutOfMemoryError)",
            face["oom"] is not None and face["oom_is_cuda_oom"], face["oom"])
    c.check("OOM text equals native torch's", face["oom"] == native["oom"],
            f"\n  reservoir: {face['oom']}\n  native:    {native['oom']}")
    c.check("the registered OOM observer ran", face["observer_calls"] >= 1, face["observer_calls"])
    c.check("training runs after the OOM", all(x == x for x in face["losses"] + face["train_after"]),
            face["losses"])
    c.check("torch.cuda.memory_stats() is Reservoir's", face["stats_equal"] and face["num_ooms"] >= 1,
            face["num_ooms"])
    c.check("torch.cuda.memory_snapshot() is Reservoir's",
            face["snapshot_segments"][0] == face["snapshot_segments"][1] > 0, face["snapshot_segments"])
    c.check("_record_memory_history records through Reservoir with torch's stacks",
            {"alloc", "free_completed"} <= set(face["trace_actions"]) and face["trace_has_python_frames"],
            face["trace_actions"])
    c.check("torch.cuda.empty_cache() releases Reservoir's cache",
            face["reserved_after_empty_cache"][0] == face["reserved_after_empty_cache"][1]
            and face["reserved_after_empty_cache"][0] < 20 << 20, face["reserved_after_empty_cache"])
    c.check("set_per_process_memory_fraction reaches Reservoir",
            face["fraction"] == 0.25 and face["fraction_oom"] is not None
            and "allowed" in face["fraction_oom"], face["fraction_oom"])
    c.check("MemPool + use_mem_pool allocate in a Reservoir private pool",
            face["pool_segments"] >= 1 and face["pool_use_count"] >= 1 and face["pool_live_ok"],
            (face["pool_segments"], face["pool_use_count"], face["pool_live_ok"]))
    c.check("an unsupported method raises naming itself",
            face["unsupported"] is not None
            and "reservoir: shareIpcHandle is not supported" in face["unsupported"], face["unsupported"])
    c.check("getCheckpointState (CUDA-graph trees) answers from Reservoir", face["checkpoint"])
    c.check("enable() after CUDA was used is refused, torch's allocator stays",
            late["refused"] and late["backend"] == "native" and not late["enabled"], late)
    print(f"face: {c.passed} passed, {c.failed} failed")
    sys.exit(1 if c.failed else 0)


if __name__ == "__main__":
    main()
