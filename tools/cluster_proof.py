#!/usr/bin/env python3
"""reservoir.compare(..., executor=...) on a real cluster engine (issue 43).

usage: cluster_proof.py [--ranks N] [--traces DIR] [--no-shared] [--out DIR]

Run by tools/cluster-proof.sh (which installs dask/distributed). Builds one
input folder in a temporary directory: a symbolic link to each file of the
shared traces (read where they are, never copied) and N generated per-rank
folders (rank-NNNN/trace.log: an allocatorSim log of a small `reservoir
workload gpt-train` trace, a different seed per rank). Then:

1. starts a Dask LocalCluster(n_workers=2, processes=True, threads_per_worker=1)
   and runs reservoir.compare(folder, executor=client.get_executor()):
   equal to the one-process run (reservoir.compare(folder), in a child
   process) field for field, measured times aside;
2. replay([40 ranks], executor=...) equal to the one-process replay; runs
   compare again with Dask's allowed-failures at 0 (a task on a killed
   worker fails at once, so reservoir's own retry is what saves it) and
   SIGKILLs one worker mid-run: the result is complete and equal, no input
   failed, and the worker was killed before the run ended;
3. measures inputs per second (one process vs the 2-worker cluster) and
   the peak memory of the process that holds the result.

Prints "cluster-proof ok: ..." / "cluster-proof FAILED: ..." lines, a
"cluster-proof bench: ..." table, and ends with
"cluster-proof: N passed, M failed" (exit status 1 if any failed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc

import reservoir
from reservoir import _executor, _native

TIMING_KEYS = {"allocator_ns_p50", "allocator_ns_p99", "allocator_ns_per_op", "allocator_time_ns"}
passed = 0
failed = 0


def ok(what: str) -> None:
    global passed
    passed += 1
    print(f"cluster-proof ok: {what}", flush=True)


def bad(what: str) -> None:
    global failed
    failed += 1
    print(f"cluster-proof FAILED: {what}", flush=True)


def untimed(v):
    if isinstance(v, dict):
        return {k: untimed(x) for k, x in v.items() if k not in TIMING_KEYS}
    if isinstance(v, list):
        return [untimed(x) for x in v]
    return v


def rank_log(seed: int) -> str:
    """A small synthetic rank: `reservoir workload gpt-train` (one layer, one
    step, this seed's sequence lengths) as an allocatorSim log
    (`alloc_event free_event size` per block)."""
    out, _ = _native.run_captured(
        ["reservoir", "workload", f"gpt-train:layers=1,hidden=256,steps=1,batch=4,seed={seed}"]
    )
    live, blocks, t = {}, [], 0
    for line in out.decode().splitlines():
        p = line.split()
        if not p or p[0].startswith("#"):
            continue
        if p[0] == "a":
            live[p[1]] = (t, int(p[2]))
        elif p[0] == "f" and p[1] in live:
            a, size = live.pop(p[1])
            blocks.append((a, t, size))
        t += 1
    for a, size in live.values():
        blocks.append((a, t, size))
        t += 1
    return "".join(f"{a} {f} {s}\n" for a, f, s in sorted(blocks))


def build_inputs(root: str, traces: str | None, ranks: int) -> int:
    """The input folder; the number of files in it."""
    n = 0
    if traces:
        for d, _, files in os.walk(traces):
            for f in files:
                src = os.path.join(d, f)
                dst = os.path.join(root, "shared", os.path.relpath(src, traces))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.symlink(src, dst)
                n += not f.endswith(".md")
    for r in range(ranks):
        d = os.path.join(root, "ranks", f"rank-{r:04d}")
        os.makedirs(d)
        with open(os.path.join(d, "trace.log"), "w") as f:
            f.write(rank_log(r))
        n += 1
    return n


ONE_PROCESS = r"""
import json, resource, sys, time
import reservoir
t = time.perf_counter()
c = reservoir.compare(sys.argv[1])
dt = time.perf_counter() - t
with open(sys.argv[2], "w") as f:
    f.write(c.to_json())
print(json.dumps({"seconds": dt, "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=300)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--traces", default=os.environ.get("RESERVOIR_SHARED_TRACES", os.path.join(here, "..", "..", "shared", "traces")))
    ap.add_argument("--no-shared", action="store_true", help="the generated ranks only")
    ap.add_argument("--out", default=None, help="where to keep the JSON outputs")
    args = ap.parse_args()
    traces = None if args.no_shared else os.path.realpath(args.traces)
    if traces and not os.path.isdir(traces):
        bad(f"no shared traces at {traces} (--traces DIR or --no-shared)")
        traces = None

    # Dask's own log: errors only (the worker killed on purpose makes
    # warnings that list every task it held).
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "error")
    import dask
    from dask.distributed import Client, LocalCluster

    print(f"cluster-proof: reservoir {reservoir.__version__} from {os.path.dirname(reservoir.__file__)}; "
          f"dask {dask.__version__}", flush=True)
    import inspect
    if "executor" not in inspect.signature(reservoir.compare).parameters:
        bad("this reservoir has no compare(..., executor=...): install the wheel of this tree")
        print(f"cluster-proof: {passed} passed, {failed} failed")
        return 1

    with tempfile.TemporaryDirectory(prefix="cluster-proof-") as tmp:
        root = os.path.join(tmp, "inputs")
        out = args.out or os.path.join(tmp, "out")
        os.makedirs(out, exist_ok=True)
        t = time.perf_counter()
        n_files = build_inputs(root, traces, args.ranks)
        print(f"cluster-proof: {n_files} input files ({'the shared traces, linked, and ' if traces else ''}"
              f"{args.ranks} generated ranks) in {time.perf_counter() - t:.1f} s", flush=True)

        rows = []  # the benchmark table
        with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            ex = client.get_executor()
            # 1. the cluster run.
            rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            load_cluster = os.getloadavg()[0]
            t = time.perf_counter()
            c = reservoir.compare(root, executor=ex, progress=False)
            dt = time.perf_counter() - t
            rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            with open(os.path.join(out, "cluster.json"), "w") as f:
                f.write(c.to_json())
            cluster_rows, cluster_skipped, cluster_failed = len(c.rows), len(c.skipped), c.failed
            cluster_json = len(c.to_json())
            del c

            # The one-process run, in a child (its memory its own).
            load_one = os.getloadavg()[0]
            p = subprocess.run([sys.executable, "-c", ONE_PROCESS, root, os.path.join(out, "one.json")],
                               capture_output=True, text=True)
            if p.returncode != 0:
                bad(f"the one-process run failed: {p.stderr[-2000:]}")
                print(f"cluster-proof: {passed} passed, {failed} failed")
                return 1
            one = json.loads(p.stdout.strip().splitlines()[-1])
            with open(os.path.join(out, "one.json")) as f:
                whole = untimed(json.load(f))
            with open(os.path.join(out, "cluster.json")) as f:
                merged = untimed(json.load(f))
            n_inputs = n_files
            if merged == whole and cluster_rows == len(whole["rows"]) and not cluster_failed:
                ok(f"Dask LocalCluster(2 worker processes): compare over {n_inputs} inputs "
                   f"({cluster_rows} rows, {cluster_skipped} skipped) equal to the one-process run, field for field")
            else:
                bad(f"Dask run differs from the one-process run ({cluster_rows} vs {len(whole['rows'])} rows, "
                    f"failed {cluster_failed}; see {out})")
            rows.append(("one process (the engine's threads on both cores)", load_one, n_inputs, one["seconds"],
                         one["maxrss_kib"]))
            rows.append(("Dask LocalCluster, 2 worker processes x 1 thread", load_cluster, n_inputs, dt, rss1))

            # replay([...]) on the cluster: 40 ranks, reports in input order.
            files = sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, "ranks")) for f in fs)[:40]
            if files:
                r_one = reservoir.replay(files, policies=["pytorch", "expandable"], min_capacity=True)
                r_ex = reservoir.replay(files, policies=["pytorch", "expandable"], min_capacity=True,
                                        executor=ex, progress=False)
                if untimed(json.loads(r_ex.to_json())) == untimed(json.loads(r_one.to_json())) and not r_ex.failed:
                    ok(f"replay({len(files)} ranks, executor=Dask): {len(r_ex)} reports equal to the one-process run's")
                else:
                    bad(f"replay({len(files)} ranks) on Dask differs from the one-process run (failed {r_ex.failed[:2]})")

            # 2. a worker killed mid-run; Dask does not reschedule it
            # (allowed-failures 0): reservoir's retry does.
            pids = client.run(os.getpid)
            victim_addr, victim = sorted(pids.items())[0]
            killed_at = []

            def kill() -> None:
                time.sleep(max(0.5, 0.3 * dt))
                try:
                    os.kill(victim, signal.SIGKILL)
                    killed_at.append(time.perf_counter())
                except OSError as e:
                    print(f"cluster-proof: kill {victim}: {e}", flush=True)

            retried0 = _executor.stats["retried"]

            def no_second_chance(dask_scheduler, n=0) -> int:
                dask_scheduler.allowed_failures = n
                return n

            client.run_on_scheduler(no_second_chance)
            killer = threading.Thread(target=kill)
            tracemalloc.start()
            t = time.perf_counter()
            killer.start()
            c = reservoir.compare(root, executor=ex, progress=False)
            end = time.perf_counter()
            heap_peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            killer.join()
            retried = _executor.stats["retried"] - retried0
            got = untimed(c.to_dict())
            if not killed_at or killed_at[0] >= end:
                bad(f"the worker {victim_addr} (pid {victim}) was not killed before the run ended")
            else:
                ok(f"worker {victim_addr} (pid {victim}) SIGKILLed {killed_at[0] - t:.1f} s into a "
                   f"{end - t:.1f} s run")
            if got == whole and not c.failed:
                ok(f"with a worker killed mid-run: complete and equal to the one-process run "
                   f"({len(c.rows)} rows; {retried} tasks failed on the killed worker and were retried)")
            else:
                bad(f"with a worker killed: differs from the one-process run ({len(c.rows)} rows, "
                    f"failed {c.failed[:3]})")
            if retried > 0:
                ok(f"reservoir's retry ran ({retried} tasks; Dask's allowed-failures 0)")
            else:
                bad("no task was retried: the kill did not hit a running task")
            del c

        print("cluster-proof bench: | run | load before | inputs | seconds | inputs/s | peak RSS of the process holding the result |")
        for what, load, n, s, rss in rows:
            print(f"cluster-proof bench: | {what} | {load:.1f} | {n} | {s:.1f} | {n / s:.1f} | {rss / 1024:.0f} MiB |")
        print(f"cluster-proof bench: client peak RSS before the cluster run {rss0 / 1024:.0f} MiB "
              f"(Dask client and scheduler in it), after {rss1 / 1024:.0f} MiB; the result's JSON "
              f"{cluster_json / 1024:.0f} KiB; the client's Python heap peak (tracemalloc, the killed-worker "
              f"run, the scheduler's objects included) {heap_peak / 2**20:.1f} MiB")
    print(f"cluster-proof: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
