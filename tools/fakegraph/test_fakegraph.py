"""Self-test of the capture layer (tools/fakegraph), inside torch on the fake
device: run by tools/fakegraph/check.sh. Prints "fakegraph: N passed, M failed"."""

import ctypes
import sys

import torch

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"fakegraph check: {name}: ok")
    else:
        failed += 1
        print(f"fakegraph check: {name}: FAILED {detail}")


lib = ctypes.CDLL(None)
try:
    loaded = lib.fakegraph_is_loaded() == 1
except AttributeError:
    loaded = False
check("the layer is loaded ahead of the fake runtime", loaded)
if not loaded:
    print(f"fakegraph: {passed} passed, {failed + 1} failed")
    sys.exit(1)
stat = lib.fakegraph_stat
stat.argtypes = [ctypes.c_char_p]
stat.restype = ctypes.c_long

s = torch.cuda.Stream()
check("a stream is not capturing outside a capture", not s.is_capturing() if hasattr(s, "is_capturing") else True)
with torch.cuda.stream(s):
    a = torch.ones(1000, device="cuda")
    g = torch.cuda.CUDAGraph()
    g.capture_begin()
    capturing = torch.cuda.is_current_stream_capturing()
    b = a + 1
    c = b * 2
    g.capture_end()
check("is_current_stream_capturing() is True during a capture", capturing)
check("and False after it", not torch.cuda.is_current_stream_capturing())
torch.cuda.current_stream().wait_stream(s)
g.replay()
check("capture_end, instantiate and replay succeed", stat(b"launches") >= 1, stat(b"launches"))
pool = g.pool()
segs = [x for x in torch.cuda.memory_snapshot() if tuple(x.get("segment_pool_id", (0, 0))) == tuple(pool)]
check("allocations during the capture went to the graph's private pool", len(segs) >= 1 and c.data_ptr() != 0,
      f"pool {pool}, segments {len(segs)}")

# Unique capture ids: two graphs get two pools.
g2 = torch.cuda.CUDAGraph()
with torch.cuda.stream(s):
    g2.capture_begin()
    d = a * 3
    g2.capture_end()
check("each capture gets its own pool", g2.pool() != g.pool(), f"{g.pool()} {g2.pool()}")

# A side stream joins the capture through an event, allocates into its pool.
side = torch.cuda.Stream()
g3 = torch.cuda.CUDAGraph()
with torch.cuda.stream(s):
    g3.capture_begin()
    side.wait_stream(s)
    with torch.cuda.stream(side):
        side_capturing = torch.cuda.is_current_stream_capturing()
        e = a + 5
    s.wait_stream(side)
    g3.capture_end()
with torch.cuda.stream(side):
    side_after = torch.cuda.is_current_stream_capturing()
check("a stream waiting on a capturing stream's event joins the capture", side_capturing)
check("and leaves it when the capture ends", not side_after)
seg_of_e = [x for x in torch.cuda.memory_snapshot()
            if x["address"] <= e.data_ptr() < x["address"] + x["total_size"]]
check("a joined stream allocates from the capture's pool",
      len(seg_of_e) == 1 and tuple(seg_of_e[0]["segment_pool_id"]) == tuple(g3.pool()),
      seg_of_e[0]["segment_pool_id"] if seg_of_e else None)

# Synchronizing a capturing stream fails and invalidates the capture.
g4 = torch.cuda.CUDAGraph()
msg = ""
with torch.cuda.stream(s):
    g4.capture_begin()
    try:
        s.synchronize()
    except RuntimeError as ex:
        msg = str(ex)
    try:
        g4.capture_end()
        end_msg = ""
    except RuntimeError as ex:
        end_msg = str(ex)
check("synchronize() on a capturing stream is refused", "capture" in msg.lower(), msg[:120])
check("and the capture is invalidated", "invalidated" in end_msg.lower(), end_msg[:120])

# OOM during capture is torch's OOM.
try:
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        torch.zeros(2**40, device="cuda")
    oom = ""
except torch.OutOfMemoryError as ex:
    oom = str(ex)
check("an allocation too large during capture raises torch.OutOfMemoryError", "out of memory" in oom, oom[:80])
check("no capture left open", not torch.cuda.is_current_stream_capturing())

del g, g2, g3, g4
torch.cuda.synchronize()
print(f"fakegraph: {passed} passed, {failed} failed")
sys.exit(0 if failed == 0 else 1)
