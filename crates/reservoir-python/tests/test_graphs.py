"""CUDA graphs inside torch on Reservoir, in every mode (issue 40, item 3):
PyTorch mode, ``expandable_segments:True`` and ``policy:reservoir``, each
against torch's native allocator with the same settings, in real torch 2.15
on the fake CUDA device of ../shared/oracle with the project's capture layer
(tools/fakegraph) loaded ahead of the fake runtime. Run by
tools/torch-proof.sh ("run graphs"), or by hand:

    lib=$(tools/fakegraph/build.sh); . ../shared/oracle/env.sh
    LD_PRELOAD="$lib $LD_PRELOAD" $VENV/bin/python crates/reservoir-python/tests/test_graphs.py

PyTorch's own graph tests (../shared/torch-tests) mostly assert replayed
values, which the fake device's kernels do not compute; this program asserts
what the allocator decides, the same program under each allocator, each in
a fresh process:

  capture    a capture on a side stream: memory_stats() deltas over the
             capture (segments, reserved, active, per pool), the graph's
             private-pool segments (sizes, block sizes and states), after
             replay, and after the graph is deleted and the cache emptied
             while its output lives (the stats of
             test_graph_memory_stats_and_use_result_after_destroy_graph)
  sharing    two graphs in one pool, via pool() and via graph_pool_handle(),
             against two pools: reserved bytes (test_graph_two_successive)
  graphed    make_graphed_callables of three models sharing one
             graph_pool_handle(), forward and backward
  live       checkPoolLiveAllocations (exact set, superset, empty set, after
             the outputs die)
  checkpoint getCheckpointState / setCheckpointPoolState after the pool
             diverged (a second capture into it): the pool's segments equal
             the checkpointed ones block by block
  oom        an allocation too large during a capture: torch.OutOfMemoryError,
             the capture ended, num_ooms
  stats      memory_stats() at the end

Claims: no error anywhere; the capture layer is loaded and each capture ran;
in PyTorch mode and with expandable segments every recorded number and every
memory_stats() key equals native's; under the `reservoir` policy (its own
placements) the behaviour: the capture allocates from the graph's private
pool, sharing a pool reserves less than two pools, the live-allocation
answers, the checkpoint round trip and the OOM equal native's. Prints
"ok MODE NAME" / "FAIL MODE NAME detail" and closes with
"graphs: N passed, M failed".
"""

import ctypes
import gc
import json
import os
import subprocess
import sys

from fakecuda import Checks, diff_stats

MIB = 1 << 20

# (label, Reservoir's settings, native torch's PYTORCH_CUDA_ALLOC_CONF, exact)
MODES = [
    ("pytorch", "", "", True),
    ("expandable", "expandable_segments:True", "expandable_segments:True", True),
    ("reservoir", "policy:reservoir", "", False),
]


def pool_shape(torch, pool):
    """The pool's segments, each (total, [(size, state)] in address order),
    sorted (where the fake device maps a segment is not the allocator's
    choice, so segments are compared as a multiset)."""
    segs = [s for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) == tuple(pool)]
    return sorted([s["total_size"], [[b["size"], b["state"]] for b in s["blocks"]]] for s in segs)


class Program:
    def __init__(self, alloc, conf):
        import torch

        self.torch = torch
        if alloc == "reservoir":
            import reservoir.torch as rt

            rt.enable(conf)
        lib = ctypes.CDLL(None)
        try:
            self.layer = lib.fakegraph_stat
            self.layer.argtypes = [ctypes.c_char_p]
            self.layer.restype = ctypes.c_long
        except AttributeError:
            self.layer = None
        self.out = {"errors": {}, "layer": self.layer is not None}

    def guarded(self, name, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 (a finding, reported by the driver)
            import traceback

            self.out["errors"][name] = f"{type(e).__name__}: {e}"[:600]
            sys.stderr.write(traceback.format_exc())

    def stats(self):
        return self.torch.cuda.memory_stats()

    def capture(self):
        torch = self.torch
        keys = ("segment", "reserved_bytes", "active", "active_bytes", "allocated_bytes")
        out = self.out["capture"] = {}
        s = torch.cuda.Stream()
        for numel in (128, (MIB + 512) // 4, (10 * MIB + 512) // 4):
            case = out[str(numel)] = {}
            g = torch.cuda.CUDAGraph()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                a = torch.ones((numel,), device="cuda")
                pre = self.stats()
                g.capture_begin()
                b = a.clone()
                for _ in range(5):
                    b = b.clone() + 1
                g.capture_end()
            torch.cuda.current_stream().wait_stream(s)
            gc.collect()
            post = self.stats()
            case["delta"] = {f"{k}.{p}.current": post[f"{k}.{p}.current"] - pre[f"{k}.{p}.current"]
                             for k in keys for p in ("all", "small_pool", "large_pool")}
            case["pool"] = pool_shape(torch, g.pool())
            g.replay()
            torch.cuda.synchronize()
            case["after_replay"] = pool_shape(torch, g.pool())
            del g
            gc.collect()
            torch.cuda.empty_cache()
            post = self.stats()
            case["after_delete"] = {f"{k}.{p}.current": post[f"{k}.{p}.current"] - pre[f"{k}.{p}.current"]
                                    for k in keys for p in ("all", "small_pool", "large_pool")}
            del a, b
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def sharing(self):
        torch = self.torch
        out = self.out["sharing"] = {}

        def func_with_temps(t, val):
            x = t.clone() + val
            y = t.clone() + val
            return x + y

        s = torch.cuda.Stream()
        for share in ("none", "pool()", "graph_pool_handle()"):
            g0, g1 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            a = torch.ones((1000,), device="cuda")
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                args0 = (torch.cuda.graph_pool_handle(),) if share == "graph_pool_handle()" else ()
                g0.capture_begin(*args0)
                b = a.clone()
                for _ in range(5):
                    b = func_with_temps(b, 1)
                g0.capture_end()
                args1 = (g0.pool(),) if share == "pool()" else args0
                g1.capture_begin(*args1)
                for _ in range(5):
                    b = func_with_temps(b, 1)
                g1.capture_end()
            torch.cuda.current_stream().wait_stream(s)
            g0.replay()
            g1.replay()
            out[share] = {"reserved": self.stats()["reserved_bytes.all.current"],
                          "same_pool": g0.pool() == g1.pool(),
                          "pools": [pool_shape(torch, g0.pool()), pool_shape(torch, g1.pool())]}
            del a, b, g0, g1
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def graphed(self):
        torch = self.torch
        torch.manual_seed(5)
        models = [torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128)).cuda()
                  for _ in range(3)]
        pool = torch.cuda.graph_pool_handle()
        graphed = [torch.cuda.make_graphed_callables(m, (torch.randn([64, 32], device="cuda"),), pool=pool)
                   for m in models]
        shapes = pool_shape(torch, pool)
        for gm in graphed:
            y = gm(torch.randn([64, 32], device="cuda"))
            y.norm().backward()
        torch.cuda.synchronize()
        self.out["graphed"] = {"pool": shapes, "grads": all(p.grad is not None for m in graphed for p in m.parameters()),
                               "active": self.stats()["active_bytes.all.current"]}
        del graphed, models
        gc.collect()
        torch.cuda.empty_cache()

    def cudagraphify(self, fn, pool=None):
        torch = self.torch
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            g.capture_begin(pool) if pool is not None else g.capture_begin()
            outs = fn()
            g.capture_end()
        torch.cuda.current_stream().wait_stream(s)
        return g, outs

    def live(self):
        torch = self.torch
        pool = torch.cuda.graph_pool_handle()
        g, outs = self.cudagraphify(lambda: [torch.ones([4], device="cuda")], pool)

        def check(ptrs):
            return torch._C._cuda_checkPoolLiveAllocations(0, pool, ptrs)

        res = [check({outs[0].data_ptr()}), check({outs[0].data_ptr(), 0}), check(set())]
        del outs
        res.append(check(set()))
        self.out["live"] = res
        del g
        gc.collect()
        torch.cuda.empty_cache()

    def checkpoint(self):
        torch = self.torch
        big = 2 * MIB + 512

        def foo():
            xs = [torch.empty(512, dtype=torch.uint8, device="cuda") for _ in range(11)]
            return [xs[5], xs[8], torch.empty(big, dtype=torch.uint8, device="cuda")]

        g, outs = self.cudagraphify(foo)
        pool = g.pool()
        before = pool_shape(torch, pool)
        state = torch._C._cuda_getCheckpointState(0, pool)
        g2, outs2 = self.cudagraphify(lambda: [torch.empty(512, dtype=torch.uint8, device="cuda")], pool)
        diverged = pool_shape(torch, pool)
        torch._C._cuda_setCheckpointPoolState(0, state, [t.untyped_storage()._cdata for t in outs2], [])
        del outs2
        after = pool_shape(torch, pool)
        self.out["checkpoint"] = {"before": before, "diverged_differs": diverged != before, "after": after}
        del outs, g, g2
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def oom(self):
        torch = self.torch
        out = self.out["oom"] = {"ooms_before": self.stats().get("num_ooms", 0)}
        try:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                torch.zeros(2**40, device="cuda")
            out["raised"] = None
        except torch.OutOfMemoryError as e:
            out["raised"] = "OutOfMemoryError"
            out["message_head"] = str(e).split(".")[0]
        out["capturing_after"] = torch.cuda.is_current_stream_capturing()
        out["ooms_after"] = self.stats().get("num_ooms", 0)
        gc.collect()
        torch.cuda.empty_cache()

    def run(self):
        for name in ("capture", "sharing", "graphed", "live", "checkpoint", "oom"):
            self.guarded(name, getattr(self, name))
        self.torch.cuda.synchronize()
        self.out["stats"] = {k: v for k, v in self.stats().items()}
        if self.layer is not None:
            self.out["captures"] = self.layer(b"captures_ended")
        print("RESULT " + json.dumps(self.out), flush=True)


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


def main():
    c = Checks()
    wanted = os.environ.get("RESERVOIR_PROOF_MODES", "pytorch,expandable,reservoir").split(",")
    natives = {}
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
        if "failed" in res or "failed" in nat:
            continue
        claim(res["layer"] and res.get("captures", 0) >= 10 and res.get("captures") == nat.get("captures"),
              f"the capture layer is loaded and every capture ended ({res.get('captures')}, native "
              f"{nat.get('captures')})")
        cap, ncap = res.get("capture", {}), nat.get("capture", {})
        if exact:
            claim(cap == ncap and bool(cap),
                  "capture: stats deltas over the capture, the private pool's segments, after replay and after "
                  "the graph is deleted equal native's", {k: (cap.get(k), ncap.get(k)) for k in ncap
                                                          if cap.get(k) != ncap.get(k)})
        else:
            claim(bool(cap) and all(v["pool"] and v["after_delete"]["active_bytes.all.current"]
                                    == ncap[k]["after_delete"]["active_bytes.all.current"]
                                    for k, v in cap.items()),
                  "capture: the capture allocates from the graph's private pool, and after the graph is deleted "
                  "only its output stays active (as natively)", cap)
        sh, nsh = res.get("sharing", {}), nat.get("sharing", {})
        if exact:
            claim(sh == nsh and bool(sh), "sharing: reserved bytes and pool segments with no sharing, via pool() "
                  "and via graph_pool_handle() equal native's", {"reservoir": sh, "native": nsh})
        else:
            claim(bool(sh) and sh["pool()"]["same_pool"] and sh["graph_pool_handle()"]["same_pool"]
                  and not sh["none"]["same_pool"]
                  and sh["pool()"]["reserved"] < sh["none"]["reserved"]
                  and sh["graph_pool_handle()"]["reserved"] < sh["none"]["reserved"],
                  "sharing: pool() and graph_pool_handle() put both graphs in one pool, which reserves less "
                  "than two pools", {k: (v.get("same_pool"), v.get("reserved")) for k, v in sh.items()})
        gr, ngr = res.get("graphed", {}), nat.get("graphed", {})
        claim(gr.get("grads") is True and bool(gr.get("pool")),
              "make_graphed_callables(pool=graph_pool_handle()): three models captured into one pool, backward "
              "gives every gradient")
        if exact:
            claim(gr == ngr, "make_graphed_callables: the shared pool's segments and active bytes equal native's",
                  {"reservoir": gr, "native": ngr})
        claim(res.get("live") == nat.get("live") == [True, False, False, True],
              f"checkPoolLiveAllocations: {res.get('live')} (native {nat.get('live')})")
        ck, nck = res.get("checkpoint", {}), nat.get("checkpoint", {})
        claim(bool(ck) and ck.get("diverged_differs") and all(seg in ck.get("after", []) for seg in ck["before"]),
              "checkpoint: after the pool diverged, setCheckpointPoolState gives back every checkpointed segment "
              "block by block (a segment made since stays, free)", ck)
        if exact:
            claim(ck == nck, "checkpoint: the pool's segments equal native's", {"reservoir": ck, "native": nck})
        oo, noo = res.get("oom", {}), nat.get("oom", {})
        claim(oo == noo and oo.get("raised") == "OutOfMemoryError" and oo.get("capturing_after") is False
              and oo.get("ooms_after") == oo.get("ooms_before", 0) + 1,
              f"OOM during capture: torch.OutOfMemoryError, the capture ended, num_ooms + 1: {oo} (native {noo})")
        if exact:
            d = diff_stats(nat.get("stats", {}), res.get("stats", {}))
            claim(bool(res.get("stats")) and not d,
                  f"memory_stats() every key equal native's ({len(res.get('stats', {})) - len(d)} of "
                  f"{len(nat.get('stats', {}))})", dict(list(d.items())[:10]))
    print(f"graphs: {c.passed} passed, {c.failed} failed")
    sys.exit(1 if c.failed else 0)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--phase":
        Program(sys.argv[2], sys.argv[3]).run()
    else:
        main()
