"""Replays the snapshots tools/gpu/record.py wrote with `reservoir replay`
in PyTorch mode of the torch that recorded them, and reports the fidelity.

  python replay.py RESERVOIR_BIN SNAPSHOT_DIR TORCH_VERSION OUT.json
                   [--require-exact] [--known NAME=REASON]...

Prints "replay NAME: exact|NOT exact ..." per snapshot. Exit status 1 when
a replay fails to run, or (with --require-exact: the dry run, torch 2.15 on
the fake device) when one is not exact, except a snapshot named by
--known, a known limit (REASON is printed and kept in the JSON; it fails
when it IS exact, so the exception is dropped once the limit is gone).
"""

import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    exe, snap_dir, version, out = argv[:4]
    require_exact = "--require-exact" in argv
    known = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--known")
    rel = common.release_of(version)
    torch_args = ["--torch", rel] if rel in common.SUPPORTED_RELEASES else []
    results = {}
    failed = 0
    files = sorted(glob.glob(os.path.join(snap_dir, "*.pickle")))
    if not files:
        print(f"replay: no snapshots in {snap_dir}")
        return 1
    for path in files:
        name = os.path.basename(path)[: -len(".pickle")]
        cmd = [exe, "replay", path, "--json", "--policy", "pytorch"] + torch_args
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            failed += 1
            results[name] = {"error": (r.stderr or r.stdout)[-2000:], "command": cmd}
            print(f"replay {name}: FAILED (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-500:]}")
            continue
        reports = json.loads(r.stdout)
        fid = [rep.get("fidelity") or {} for rep in reports]
        exact = all(f.get("placements_matched") == f.get("placements_total")
                    and f.get("segment_events_exact", False) for f in fid) and bool(fid)
        results[name] = {
            "exact": exact,
            "torch_release": [rep.get("torch_release") for rep in reports],
            "torch_release_how": [rep.get("torch_release_how") for rep in reports],
            "config": [rep.get("config") for rep in reports],
            "fidelity": fid,
        }
        summary = "; ".join(
            f"device {rep.get('device')}: placements {f.get('placements_matched')}/{f.get('placements_total')}, "
            f"segment events {f.get('segment_events_matched')}/{f.get('segment_events_total')}"
            f"{' exact' if f.get('segment_events_exact') else ' NOT exact'}, first mismatch "
            f"{f.get('first_segment_mismatch')}"
            for rep, f in zip(reports, fid))
        note = ""
        if name in known:
            results[name]["known_limit"] = known[name]
            note = f"; known limit: {known[name]}"
        if require_exact and exact == (name in known):
            failed += 1
            note += "; FAIL" + (": exact although listed as a known limit (drop --known)" if exact else "")
        print(f"replay {name}: {'exact' if exact else 'NOT exact'} ({summary}; mode "
              f"{reports[0].get('config') if reports else '?'}){note}")
    common.write_json(out, {"torch": version, "snapshots": results})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
