#!/usr/bin/env python3
"""Make a golden for a hand-written trace (one the generator cannot produce).

usage: make_extra_golden.py TRACE.txt OUT_DIR [--conf C] [--capacity BYTES] [--fraction F]

Runs TRACE through the oracle (tools/oracle_replay_ext.py --all-events) and writes
OUT_DIR/<name>.txt (a copy of the trace) and OUT_DIR/<name>.json (a golden in the format of
tools/make_goldens.py; spec kind "streams", seed 0, the fingerprint is not checked). Compare with
  RESERVOIR_GOLDEN_EXTRA=OUT_DIR cargo test -p reservoir-replay --test golden extra
Needs the oracle (RESERVOIR_ORACLE_DIR, default ../shared/oracle next to the project).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_goldens  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--conf", default="")
    ap.add_argument("--capacity", type=int, default=None)
    ap.add_argument("--fraction", type=float, default=None)
    a = ap.parse_args()
    name = os.path.splitext(os.path.basename(a.trace))[0]
    args = []
    if a.conf:
        args += ["--conf", a.conf]
    if a.capacity is not None:
        args += ["--capacity", str(a.capacity)]
    if a.fraction is not None:
        args += ["--fraction", str(a.fraction)]
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        full = os.path.join(tmp, "full.json")
        cmd = [sys.executable, os.path.join(HERE, "oracle_replay_ext.py"), a.trace, full,
               "--quiet", "--all-events"] + args
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"oracle failed ({p.returncode}): {p.stderr[-2000:]}")
        with open(full) as f:
            d = json.load(f)
    spec = {"name": name, "kind": "streams", "seed": 0, "ops": d["ops"], "conf": a.conf,
            "capacity": d["device"]["total_memory"], "fraction": a.fraction,
            "fingerprint": "0" * 16}
    g = make_goldens.compact(d, spec)
    with open(os.path.join(a.out, name + ".json"), "w") as f:
        f.write(make_goldens.dump(g))
    if os.path.abspath(a.trace) != os.path.abspath(os.path.join(a.out, name + ".txt")):
        shutil.copyfile(a.trace, os.path.join(a.out, name + ".txt"))
    print(f"{name}: {d['ops']} ops, {len(g['ooms'])} OOM, {len(g['segment_events'])} segment "
          f"events -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
