#!/usr/bin/env python3
"""Hand-made traces for the order in which cross-stream frees complete (FINDINGS.md 10).

usage: gen_stream_order_traces.py OUT_DIR [FIRST LAST]

Writes OUT_DIR/ord-NN.txt for NN in FIRST..LAST (default 0..15): 3 to 31 streams created in a
shuffled order (so c10 stream ids and cudaStream_t order disagree), then 25 rounds of: pending
work on every stream; 4-11 equal blocks allocated side by side on one stream; each recorded on
1-3 other streams (the default stream too) and freed in random order; every stream released in
random order; one allocation, whose process_events reaps all those events at once. The order in
which PyTorch walks its per-stream event queues decides how the freed blocks merge, which the
inactive_split totals show. Make the goldens with tools/make_extra_golden.py (`--capacity 1G`).
Traces with more than 32 streams are skipped: c10 hands out 32 pool streams round robin, so
names would share streams.
"""
import os
import random
import sys


def gen(seed, nstreams, rounds):
    r = random.Random(seed)
    streams = [f"s{i}" for i in range(1, nstreams + 1)]
    order = streams[:]
    r.shuffle(order)
    out = [f"h {s}" for s in order]  # creation order = shuffled
    nid = 1
    for _ in range(rounds):
        for s in streams:
            out.append(f"k {s}")
        alloc_stream = r.choice(["0", "0", r.choice(streams)])
        m = r.randrange(4, 12)
        size = r.choice([2 << 20, 1 << 20, 600000, 100000])
        ids = []
        for _ in range(m):
            out.append(f"a {nid} {size + r.randrange(0, 512)} {alloc_stream}")
            ids.append(nid)
            nid += 1
        r.shuffle(ids)
        for i in ids:
            cand = [s for s in streams + ["0"] if s != alloc_stream]
            for s in r.sample(cand, r.choice([1, 1, 2, 3])):
                out.append(f"r {i} {s}")
            out.append(f"f {i}")
        rel = streams[:]
        r.shuffle(rel)
        for s in rel:
            out.append(f"u {s}")
        out.append(f"a {nid} 512 {alloc_stream}")
        out.append(f"f {nid}")
        nid += 1
        for s in rel:
            out.append(f"h {s}")
        if r.random() < 0.2:
            out.append("e")
    return "\n".join(out) + "\n"


def main():
    out = sys.argv[1]
    first, last = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (0, 16)
    os.makedirs(out, exist_ok=True)
    for k in range(first, last):
        nstreams = [3, 5, 8, 12, 17, 24, 31, 40][k % 8]
        if nstreams > 32:
            continue
        with open(os.path.join(out, f"ord-{k:02d}.txt"), "w") as f:
            f.write(gen(2000 + k, nstreams, 25))


if __name__ == "__main__":
    main()
