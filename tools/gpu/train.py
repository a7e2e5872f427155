"""A small transformer trained under torch's native allocator or under
Reservoir (issue 32 item 3), one allocator per process (the allocator is
chosen before CUDA is first used), and the two runs compared.

  python train.py run native|reservoir OUT.json [--steps N] [--empty-calls N]
  python train.py compare NATIVE.json RESERVOIR.json OUT.json

`run` trains with a fixed seed and deterministic algorithms and writes the
loss of every step (as exact floats), `memory_stats` at the end, steps/s
(after 5 warm-up steps) and the allocator's ns per `torch.empty` + free
(a 4 KiB tensor made and dropped in a loop, minus the same loop taking a
view of an existing tensor, so Python's own cost is mostly left out; the
fastest of 5 rounds of each).

`compare` prints lines "train: CLAIM: ok|FAIL ..." and exits 1 when a claim
fails: losses equal step by step (not claimed on the fake device, whose
kernels compute nothing: the losses there are whatever bytes memory held),
every `memory_stats` key equal (keys of one side only are listed), the
steps/s ratio and ns per torch.empty (reported, not judged).
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

VOCAB, D_MODEL, HEADS, LAYERS, SEQ, BATCH = 1024, 256, 8, 4, 128, 16
WARMUP = 5


def run(alloc, out, steps, empty_calls):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    res = {"alloc": alloc, "torch": torch.__version__, "steps": steps}
    reservoir = alloc == "reservoir"
    if reservoir:
        res["reservoir_conf"], res["allocator"] = common.enable_reservoir(torch)
    elif alloc != "native":
        raise SystemExit(f"unknown allocator {alloc!r}")
    fake = common.is_fake_device()
    res["fake_device"] = fake
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.enabled = not fake
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda", 0)
    res["device"] = torch.cuda.get_device_name(0)

    layer = torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, 4 * D_MODEL, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential()
    model.add_module("embed", torch.nn.Embedding(VOCAB, D_MODEL))
    model.add_module("encoder", torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False))
    model.add_module("head", torch.nn.Linear(D_MODEL, VOCAB))
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)
    gen = torch.Generator(device="cpu").manual_seed(99)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(SEQ, device=dev)
    losses = []
    t0 = None
    for step in range(steps):
        if step == WARMUP:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen).to(dev, non_blocking=True)
        x, y = tokens[:, :-1], tokens[:, 1:]
        h = model.embed(x)
        h = model.encoder(h, mask=mask, is_causal=True)
        logits = model.head(h)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    if t0 is not None:
        res["steps_per_s"] = (steps - WARMUP) / (time.perf_counter() - t0)
    res["losses"] = [float(v) for v in torch.stack(losses).cpu().tolist()]
    res["losses_hex"] = [v.hex() for v in res["losses"]]
    res["memory_stats"], res["memory_stats_source"] = common.memory_stats(torch, reservoir)
    res["max_memory_allocated"] = res["memory_stats"].get("allocated_bytes.all.peak")

    # Allocator cost: torch.empty of 4 KiB and its free, in a loop; the same
    # loop over an existing tensor's view (no allocation) is subtracted.
    keep = torch.empty(4096, dtype=torch.uint8, device=dev)
    for _ in range(1000):
        torch.empty(4096, dtype=torch.uint8, device=dev)
    alloc_ns, base_ns = [], []
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(empty_calls):
            torch.empty(4096, dtype=torch.uint8, device=dev)
        alloc_ns.append(time.perf_counter_ns() - t)
        t = time.perf_counter_ns()
        for _ in range(empty_calls):
            keep.view(4096)
        base_ns.append(time.perf_counter_ns() - t)
    best = (min(alloc_ns) - min(base_ns)) / empty_calls
    res["empty_ns_per_call_with_python"] = min(alloc_ns) / empty_calls
    res["empty_ns_per_call"] = best
    res["empty_calls"] = empty_calls
    common.write_json(out, res)
    print(f"train {alloc}: {steps} steps, last loss {res['losses'][-1]!r}, "
          f"{res.get('steps_per_s', 0):.1f} steps/s, {best:.0f} ns per torch.empty+free "
          f"(python loop overhead subtracted), stats from {res['memory_stats_source']}")


def compare(native_path, reservoir_path, out):
    import json

    n = json.load(open(native_path))
    r = json.load(open(reservoir_path))
    claims = []

    def claim(name, ok, detail):
        claims.append({"claim": name, "ok": ok, "detail": detail})
        status = {True: "ok", False: "FAIL", None: "not judged"}[ok]
        print(f"train: {name}: {status}: {detail}")

    ln, lr = n["losses"], r["losses"]
    diffs = [i for i, (a, b) in enumerate(zip(ln, lr)) if a != b and not (a != a and b != b)]
    if n.get("fake_device"):
        claim("losses equal step by step", None,
              f"not judged on the fake device (kernels compute nothing); {len(diffs)} of {len(ln)} differ")
    else:
        detail = (f"{len(ln)} steps, all bit-equal, last {ln[-1]!r}" if not diffs and len(ln) == len(lr)
                  else f"{len(diffs)} of {len(ln)} steps differ; first at step {diffs[0] if diffs else len(ln)}: "
                       f"native {ln[diffs[0]] if diffs else None!r} vs reservoir {lr[diffs[0]] if diffs else None!r}")
        claim("losses equal step by step", not diffs and len(ln) == len(lr), detail)
    sn, sr = n["memory_stats"], r["memory_stats"]
    only_n = sorted(set(sn) - set(sr))
    only_r = sorted(set(sr) - set(sn))
    differ = {k: [sn[k], sr[k]] for k in sorted(set(sn) & set(sr)) if sn[k] != sr[k]}
    detail = (f"{len(set(sn) & set(sr))} common keys, {len(differ)} differ"
              f"{': ' + ', '.join(f'{k} {v[0]} vs {v[1]}' for k, v in list(differ.items())[:8]) if differ else ''}; "
              f"native only: {only_n or 'none'}; reservoir only: {only_r or 'none'}; "
              f"reservoir's from {r['memory_stats_source']}")
    claim("memory_stats equal", not differ and bool(sn), detail)
    if "steps_per_s" in n and "steps_per_s" in r:
        claim("steps/s (reservoir / native)", None,
              f"{r['steps_per_s'] / n['steps_per_s']:.3f} ({r['steps_per_s']:.1f} vs {n['steps_per_s']:.1f})")
    claim("ns per torch.empty+free", None,
          f"native {n['empty_ns_per_call']:.0f}, reservoir {r['empty_ns_per_call']:.0f} (Python's loop "
          f"subtracted; with it: {n['empty_ns_per_call_with_python']:.0f} and "
          f"{r['empty_ns_per_call_with_python']:.0f})")
    res = {
        "claims": claims,
        "steps": len(ln),
        "loss_diffs": len(diffs),
        "stats_differ": differ,
        "stats_native_only": only_n,
        "stats_reservoir_only": only_r,
        "steps_per_s": {"native": n.get("steps_per_s"), "reservoir": r.get("steps_per_s")},
        "empty_ns_per_call": {"native": n["empty_ns_per_call"], "reservoir": r["empty_ns_per_call"]},
        "reservoir_conf": r.get("reservoir_conf"),
        "allocator": r.get("allocator"),
    }
    common.write_json(out, res)
    return 0 if all(c["ok"] is not False for c in claims) else 1


def main(argv):
    if len(argv) >= 3 and argv[0] == "run":
        steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 300
        calls = int(argv[argv.index("--empty-calls") + 1]) if "--empty-calls" in argv else 20000
        run(argv[1], argv[2], steps, calls)
        return 0
    if len(argv) == 4 and argv[0] == "compare":
        return compare(*argv[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
