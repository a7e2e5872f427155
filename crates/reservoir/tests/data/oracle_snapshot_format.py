import torch, pickle, sys, json
def keys(d): return list(d.keys())
def run(label, enabled, context, stacks="python", conf=None):
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history(enabled=enabled, context=context, stacks=stacks, max_entries=1000)
    a = torch.empty(3<<20, dtype=torch.uint8, device="cuda")
    b = torch.empty(20<<20, dtype=torch.uint8, device="cuda")  # exact segment
    c = torch.empty(500, dtype=torch.uint8, device="cuda")
    del c
    s1 = torch.cuda.memory._snapshot()
    s2 = torch.cuda.memory._snapshot()
    print("=====", label)
    for seg in s2["segments"]:
        print("SEG", keys(seg), "frames", len(seg["frames"]), seg["total_size"])
        for bl in seg["blocks"]:
            print("   BLK", keys(bl), bl["state"], bl["size"], bl["requested_size"], "frames", len(bl["frames"]))
    for e in s2["device_traces"][0]:
        print("  TE", e["action"], e["size"], keys(e), len(e.get("frames", [])) if "frames" in e else None)
    del a, b
run("all/all", "all", "all")
run("all/alloc", "all", "alloc")
run("all/state", "all", "state")
run("all/None", "all", None)
run("state/state", "state", "state")
run("state/all", "state", "all")
torch.cuda.memory._record_memory_history(enabled=None)
s = torch.cuda.memory._snapshot()
print("disabled traces", s["device_traces"])
print("top", keys(s), s["host_segments"], s["host_traces"], s["external_annotations"])
# Run: ../shared/oracle/oracle-python crates/reservoir/tests/data/oracle_snapshot_format.py
# (torch 2.15.0 on the fake CUDA device). tests/all/observe.rs asserts the
# key orders, sizes, states and frames this prints for the "all/all" run.
