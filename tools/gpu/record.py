"""Real memory snapshots, recorded with torch's native allocator, of what
../shared/traces lacks (issue 32 item 3): one scenario per process.

  python record.py SCENARIO OUT_DIR

Scenarios (each writes OUT_DIR/SCENARIO.pickle with
`torch.cuda.memory._dump_snapshot` after `_record_memory_history`):
  streams      two side streams; tensors made on one and used on the other
               with `record_stream`, freed while the other stream may still
               run, and the memory reused
  graph        a `torch.cuda.graph` capture of an MLP's forward and backward
               (its private pool), replayed, then the graph dropped
  expandable   a training loop under `expandable_segments:True` (set by
               this script before CUDA is used)
  mempool      `torch.cuda.MemPool` + `torch.cuda.use_mem_pool`: tensors in
               the pool and outside it, the pool released
Exit status 77: the scenario cannot run here (the fake device cannot
capture CUDA graphs); the line printed says why.
"""

import os
import sys

SCENARIOS = ("streams", "graph", "expandable", "mempool")
MIB = 1 << 20


def mlp(torch, dev):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512)).to(dev)


def streams(torch, dev):
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    keep = []
    for i in range(20):
        with torch.cuda.stream(s1):
            x = torch.empty((i % 5 + 1) * MIB, dtype=torch.uint8, device=dev).fill_(i)
            big = torch.empty(24 * MIB + i * 4096, dtype=torch.uint8, device=dev).fill_(1)
        s2.wait_stream(s1)
        with torch.cuda.stream(s2):
            y = x.float().sum() + big[:1024].float().sum()
            x.record_stream(s2)
            big.record_stream(s2)
        keep.append(y)
        del x, big
        with torch.cuda.stream(s1):
            z = torch.empty(3 * MIB, dtype=torch.uint8, device=dev).fill_(2)
        del z
        if i % 7 == 6:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    del keep
    torch.cuda.empty_cache()


def graph(torch, dev):
    model = mlp(torch, dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(256, 512, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch's docs do
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
    for _ in range(5):
        x.copy_(torch.randn(256, 512, device=dev))
        g.replay()
    torch.cuda.synchronize()
    del g, loss
    torch.cuda.empty_cache()


def expandable(torch, dev):
    model = mlp(torch, dev)
    opt = torch.optim.Adam(model.parameters())
    for step in range(12):
        x = torch.randn(64 * (1 + step % 4), 512, device=dev)
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        big = torch.empty((40 + 10 * step) * MIB, dtype=torch.uint8, device=dev)
        del big
        if step == 8:
            torch.cuda.empty_cache()
    torch.cuda.synchronize()


def mempool(torch, dev):
    pool = torch.cuda.MemPool()
    outside = torch.empty(5 * MIB, dtype=torch.uint8, device=dev)
    with torch.cuda.use_mem_pool(pool):
        inside = [torch.empty((i + 1) * MIB, dtype=torch.uint8, device=dev) for i in range(6)]
        small = torch.empty(4096, dtype=torch.uint8, device=dev)
    del inside[::2]
    later = torch.empty(7 * MIB, dtype=torch.uint8, device=dev)
    del inside, small
    del pool
    del later, outside
    torch.cuda.empty_cache()


def main(argv):
    if len(argv) != 2 or argv[0] not in SCENARIOS:
        print(__doc__, file=sys.stderr)
        return 2
    name, out_dir = argv
    if name == "graph" and os.environ.get("GPU_CHECK_DRY_RUN") == "1":
        print("record graph: skipped: the fake CUDA device cannot capture CUDA graphs "
              "(cudaStreamBeginCapture answers NOT_SUPPORTED); runs on a real GPU")
        return 77
    if name == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import common
    import torch

    if name == "graph" and common.is_fake_device():
        print("record graph: skipped: the fake CUDA device cannot capture CUDA graphs "
              "(cudaStreamBeginCapture answers NOT_SUPPORTED); runs on a real GPU")
        return 77
    dev = torch.device("cuda", 0)
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=200000)
    globals()[name](torch, dev)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(None)
    import pickle

    with open(path, "rb") as f:
        snap = pickle.load(f)
    entries = sum(len(t) for t in snap.get("device_traces", []))
    if entries == 0:
        print(f"record {name}: {path} holds no trace entries")
        return 1
    print(f"record {name}: {path}: {os.path.getsize(path)} bytes, {entries} trace "
          f"entries, torch {torch.__version__}, allocator settings "
          f"{os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '(defaults)')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
