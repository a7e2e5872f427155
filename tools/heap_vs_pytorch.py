#!/usr/bin/env python3
"""The MPS heap allocator against PyTorch's caching allocator on every shared trace.

Runs `reservoir replay FILE -p pytorch -p mps-heap --json` on each trace of
../shared/traces (or the folder given) and prints the BENCHMARKS.md table:
peak reserved, its ratio to peak live (the peak of the bytes the program
asked for, `requested_bytes.all.peak`), driver calls (allocations + frees)
and OOMs, then a summary line.

Usage: tools/heap_vs_pytorch.py [TRACES_DIR] (after cargo build --release -p reservoir-cli)
"""
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "reservoir")
MIB = 1 << 20


def traces(folder):
    for dirpath, _, files in sorted(os.walk(folder)):
        for f in sorted(files):
            if not f.endswith(".md"):
                yield os.path.join(dirpath, f)


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared", "traces")
    if not os.path.isdir(folder):
        folder = os.path.join(ROOT, "..", "..", "shared", "traces")
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} is missing: run cargo build --release -p reservoir-cli first")
    print("| trace | ops | peak live | pytorch peak reserved (x live) | mps-heap peak reserved (x live) "
          "| heap / pytorch | driver calls pytorch / mps-heap | OOMs pytorch / mps-heap |")
    print("|---|---|---|---|---|---|---|---|")
    ratios, skipped, live_p, live_h, calls_p, calls_h = [], [], [], [], 0, 0
    files = list(traces(folder))
    for k, path in enumerate(files):
        rel = os.path.relpath(path, folder)
        print(f"[{k + 1}/{len(files)}] {rel}", file=sys.stderr)
        run = subprocess.run([BIN, "replay", path, "-p", "pytorch", "-p", "mps-heap", "--json"],
                             capture_output=True, text=True)
        if run.returncode != 0:
            skipped.append((rel, run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "failed"))
            continue
        reports = json.loads(run.stdout)
        by_device = {}
        for r in reports:
            by_device.setdefault(r["device"], {})[r["setting"]] = r
        for dev, rs in sorted(by_device.items()):
            p, h = rs["pytorch"], rs["mps-heap"]
            live = p["memory_stats"].get("requested_bytes.all.peak", 0) or p["peak_allocated"]
            if not live or not p["peak_reserved"]:
                continue  # a device with nothing allocated
            ratio = h["peak_reserved"] / p["peak_reserved"] if p["peak_reserved"] else float("nan")
            ratios.append((ratio, f"{rel}#{dev}"))
            live_p.append(p["peak_reserved"] / live)
            live_h.append(h["peak_reserved"] / live)
            calls_p += p["driver_allocs"] + p["driver_frees"]
            calls_h += h["driver_allocs"] + h["driver_frees"]
            x = lambda r: f"{r['peak_reserved'] / MIB:.1f} MiB ({r['peak_reserved'] / live:.2f}x)" if live else "-"
            calls = lambda r: r["driver_allocs"] + r["driver_frees"]
            print(f"| `{rel}#{dev}` | {p['ops']} | {live / MIB:.1f} MiB | {x(p)} | {x(h)} | {ratio:.2f} "
                  f"| {calls(p)} / {calls(h)} | {p['ooms']} / {h['ooms']} |")
    values = [r for r, _ in ratios]
    worst = max(ratios)
    print()
    print(f"Summary over {len(values)} device traces: mps-heap peak reserved / pytorch peak reserved "
          f"median {statistics.median(values):.2f}x, best {min(values):.2f}x, worst {worst[0]:.2f}x "
          f"(`{worst[1]}`); peak reserved / peak live: pytorch median {statistics.median(live_p):.2f}x "
          f"(worst {max(live_p):.2f}x), mps-heap median {statistics.median(live_h):.2f}x (worst "
          f"{max(live_h):.2f}x); driver calls in all: pytorch {calls_p}, mps-heap {calls_h}.")
    state_only = [rel for rel, why in skipped if "state-only snapshot" in why]
    if state_only:
        print(f"Not replayable by either allocator ({len(state_only)} state-only snapshots, no trace "
              f"entries): {', '.join(f'`{r}`' for r in state_only)}.")
    for rel, why in skipped:
        if rel not in state_only:
            print(f"- not replayed: `{rel}`: {why}")


if __name__ == "__main__":
    main()
