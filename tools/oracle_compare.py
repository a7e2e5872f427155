#!/usr/bin/env python3
"""Run a recorded snapshot's trace through PyTorch's real allocator (the
oracle) and compare its segment events with the recorded ones.

usage: tools/oracle_compare.py SNAPSHOT.pickle [--device N]
Needs the release CLI (target/release/reservoir or $RESERVOIR) and
../shared/oracle set up (oracle_replay.py)."""
import json, os, pickle, re, subprocess, sys, tempfile

snap = sys.argv[1]
dev = int(sys.argv[sys.argv.index("--device") + 1]) if "--device" in sys.argv else 0
exe = os.environ.get("RESERVOIR", "target/release/reservoir")
oracle = os.environ.get("ORACLE", "../shared/oracle/oracle_replay.py")
tmp = tempfile.mkdtemp()
trace, out = os.path.join(tmp, "t.txt"), os.path.join(tmp, "o.json")
subprocess.run([exe, "convert", snap, "--oracle-trace", trace, "--device", str(dev)], check=True)
head = open(trace).read(4000)
prelude_segments = int(re.search(r"\((\d+) segment allocations\)", head).group(1))
cap = re.search(r"capacity reproducing the recorded OOMs: (\d+)", head)
cmd = [sys.executable, oracle, trace, out] + (["--capacity", cap.group(1)] if cap else [])
subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
o = json.load(open(out))
got = [(e["action"], e["size"]) for e in o["segment_events"]][prelude_segments:]
d = pickle.load(open(snap, "rb"))
want = [(e["action"], e["size"]) for e in d["device_traces"][dev]
        if e["action"].startswith("segment_")]
first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b),
             None if len(want) == len(got) else min(len(want), len(got)))
print(f"{snap}: oracle segment events {'exact' if got == want else 'DIFFER'} "
      f"({len(got)} vs {len(want)} recorded; first difference at {first}); "
      f"oracle OOMs {len(o['ooms'])}")
