#!/usr/bin/env python3
"""Prediction error of `reservoir predict` on the real families of ../shared/traces.

Each family: recordings of one program at several sizes. For each target size,
predict it from the smaller recordings, replay the real recording (PyTorch mode,
from its recorded start and from a cold start, as the prediction replays) and
print the errors as a Markdown table (BENCHMARKS.md, "Predicting another size").

    python3 tools/predict-bench.py [--bin target/debug/reservoir] [--traces ../shared/traces]
"""
import argparse
import json
import os
import subprocess
import sys
import time

# (family, program, [(file, size)...]): files of one program (one commit of
# one repository, one script), by size.
FAMILIES = [
    ("cs336-kkaitlyn111", "forward fp32", [
        ("a97ea92b_memory_ctx128_forward_.pickle", 128),
        ("019e70b3_memory_ctx256_forward_.pickle", 256),
        ("b9620ccc_memory_ctx512_forward_.pickle", 512)]),
    ("cs336-kkaitlyn111", "full step fp32", [
        ("332e0bb4_memory_ctx128_fullstep_.pickle", 128),
        ("cd7ef486_memory_ctx256_fullstep_.pickle", 256),
        ("d42ed7d6_memory_ctx512_fullstep_.pickle", 512)]),
    ("cs336-kkaitlyn111", "forward mixed", [
        ("bebd77a3_memory_ctx128_forward_mixed.pickle", 128),
        ("73107f1a_memory_ctx256_forward_mixed.pickle", 256),
        ("f1bbbe19_memory_ctx512_forward_mixed.pickle", 512)]),
    ("cs336-kkaitlyn111", "forward (other commit)", [
        ("03016ee6_memory_ctx128_forward.pickle", 128),
        ("cbac0d91_memory_ctx256_forward.pickle", 256),
        ("1fcf79fe_memory_ctx512_forward.pickle", 512)]),
    ("cs336-wedsonlin", "medium training", [
        ("0db7d8c0_medium_128_training_memory_snapshot.pickle", 128),
        ("8a4284c4_medium_256_training_memory_snapshot.pickle", 256),
        ("61dcd14d_medium_512_training_memory_snapshot.pickle", 512),
        ("83e7cb0c_medium_1024_training_memory_snapshot.pickle", 1024)]),
    ("cs336-wedsonlin", "medium inference", [
        ("77da8fef_medium_128_inference_memory_snapshot.pickle", 128),
        ("e0143d82_medium_256_inference_memory_snapshot.pickle", 256),
        ("2afd8bc6_medium_512_inference_memory_snapshot.pickle", 512),
        ("1cfc21cd_medium_1024_inference_memory_snapshot.pickle", 1024)]),
]


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"
    return json.loads(out.stdout), None


def pct(pred, real):
    return f"{100.0 * (pred - real) / real:+.1f} %"


def gib(b):
    return f"{b / 2**30:.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/debug/reservoir")
    ap.add_argument("--traces", default="../shared/traces")
    a = ap.parse_args()
    print("| family | program | from | at | predicted alloc / reserved GiB | recorded alloc / reserved GiB "
          "| error alloc | error reserved | cold replay of the recording GiB | error vs cold alloc / reserved | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for fam, prog, files in FAMILIES:
        paths = [(os.path.join(a.traces, fam, f), n) for f, n in files]
        if not all(os.path.exists(p) for p, _ in paths):
            print(f"| {fam} | {prog} | missing | | | | | | | | |")
            continue
        for k in range(2, len(paths)):
            target, at = paths[k]
            # From the two recordings just below, and from all below.
            for given in {(k - 2, k), (0, k)}:
                inputs = [f"{p}@{n}" for p, n in paths[given[0]:given[1]]]
                t0 = time.time()
                pred, err = run([a.bin, "predict", *inputs, "--at", str(at), "--json"])
                secs = time.time() - t0
                sizes = ",".join(str(n) for _, n in paths[given[0]:given[1]])
                if pred is None:
                    print(f"| {fam} | {prog} | {sizes} | {at} | error: {err} | | | | | | |")
                    continue
                rec, _ = run([a.bin, "replay", target, "--policy", "pytorch", "--json"])
                cold, _ = run([a.bin, "replay", target, "--policy", "pytorch", "--json", "--start", "cold"])
                pa, pr = pred["predicted"]["peak_allocated"], pred["predicted"]["peak_reserved"]
                ra, rr = rec[0]["peak_allocated"], rec[0]["peak_reserved"]
                ca, cr = cold[0]["peak_allocated"], cold[0]["peak_reserved"]
                print(f"| {fam} | {prog} | {sizes} | {at} | {gib(pa)} / {gib(pr)} | {gib(ra)} / {gib(rr)} "
                      f"| {pct(pa, ra)} | {pct(pr, rr)} | {gib(ca)} / {gib(cr)} | {pct(pa, ca)} / {pct(pr, cr)} "
                      f"| {secs:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
