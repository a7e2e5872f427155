#!/usr/bin/env python3
"""Write the traces behind crates/reservoir-replay/tests/replay_fidelity/expandable/ (deterministic).

usage: gen_expandable_snapshots.py DIR

Each trace is in the oracle's text format (../shared/oracle/oracle_replay.py); the line
`# oracle-args: ...` names the extra oracle_replay.py arguments it is recorded with
(tools/regen-expandable-snapshots.sh reads it).
"""
import os
import random
import sys

MIB = 1 << 20


def size(rng, big=64):
    r = rng.random()
    if r < 0.35:
        return rng.randint(1, 1 << 20)            # small pool
    if r < 0.8:
        return rng.randint(1 << 20, 12 * MIB)       # large pool, below one page
    return rng.randint(12 * MIB, big * MIB)         # several pages


def workload(seed, n, streams, empty_every, big=64):
    rng = random.Random(seed)
    ops, live, nid = [], [], 0
    for i in range(n):
        if empty_every and i % empty_every == empty_every - 1:
            ops.append("e")
            continue
        if live and (rng.random() < 0.45 or len(live) > 30):
            k = live.pop(rng.randrange(len(live)))
            ops.append(f"f {k}")
            continue
        nid += 1
        s = rng.choice(streams)
        ops.append(f"a {nid} {size(rng, big)}" + (f" {s}" if s != "0" else ""))
        live.append(nid)
    # free a part at the end, then empty the cache
    for k in live[: len(live) // 2]:
        ops.append(f"f {k}")
    ops.append("e")
    return ops


TRACES = {
    # name: (oracle args, ops)
    "single_stream": ("", workload(1, 260, ["0"], 90)),
    "streams": ("", workload(2, 300, ["0", "s1", "s2"], 110)),
    # A small device: the allocator unmaps cached pages and retries (OOM flush), and some
    # allocations fail.
    "oom_flush": ("--capacity 192M", workload(3, 260, ["0", "s1"], 0, big=80)),
    # A small device where stream s1's small-pool reservation is fully unmapped (released) by a
    # flush and a new one is reserved at another address later; 8 failed allocations.
    "recreated": ("--capacity 320M", workload(12, 260, ["0", "s1"], 0, big=30)),
    # Mid-run: the history ring keeps only the last 120 entries, so the trace starts with
    # segments already mapped and blocks already allocated.
    "mid_run": ("--max-entries 120", workload(4, 260, ["0", "s1"], 100)),
}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, (args, ops) in TRACES.items():
        with open(os.path.join(out, name + ".txt"), "w") as f:
            f.write(f"# oracle-args: {args}\n")
            f.write("\n".join(ops) + "\n")


if __name__ == "__main__":
    main()
