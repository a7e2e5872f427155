"""Writes summary.json and summary.txt of a tools/gpu-check.sh run from the
files it left in DETAILS (stages.tsv, env.json, train-compare.json,
replay.json, the stage logs).

  python summarize.py DETAILS OUT_DIR
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def tail(path, n=6):
    try:
        with open(path, errors="replace") as f:
            return [line.rstrip() for line in f.readlines()[-n:]]
    except OSError:
        return []


def main(argv):
    details, out = argv
    stages = []
    try:
        with open(os.path.join(details, "stages.tsv")) as f:
            for line in f:
                name, status, secs, rc, note = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
                stages.append({"stage": name, "status": status, "seconds": float(secs or 0),
                               "exit": int(rc or 0), "note": note,
                               "log_tail": tail(os.path.join(details, name + ".log"))})
    except OSError:
        pass
    env = load(os.path.join(details, "env.json")) or {}
    version = env.get("torch", "")
    s = {
        "format": "reservoir-gpu-check/1",
        "mode": env.get("mode"),
        "env": env,
        "stages": stages,
        "passed": sum(st["status"] == "ok" for st in stages),
        "failed": sum(st["status"] == "FAILED" for st in stages),
        "skipped": sum(st["status"] == "skipped" for st in stages),
        "train": load(os.path.join(details, "train-compare.json")),
        "replay": load(os.path.join(details, "replay.json")),
        "conformance": (load(os.path.join(details, "conformance.json")) or {}).get("summary"),
        "reservoir_conf": common.reservoir_conf(version) if version else None,
        "torch_release_differences": (common.TORCH_2_11_DIFFERENCES
                                      if common.release_of(version) == "2.11" else []),
    }
    common.write_json(os.path.join(out, "summary.json"), s)
    lines = [f"gpu-check summary ({s['mode']}): {s['passed']} passed, {s['failed']} failed, "
             f"{s['skipped']} skipped",
             f"torch {version or '?'} (CUDA {env.get('torch_cuda', '?')}), device {env.get('device', '?')}, "
             f"driver {env.get('driver', '?')}; Reservoir in `{s['reservoir_conf']}`"]
    for st in stages:
        lines.append(f"  {st['stage']:<22} {st['status']:<8} {st['seconds']:7.1f} s  {st['note']}")
    t = s["train"]
    if t:
        for c in t["claims"]:
            status = {True: "ok", False: "FAIL", None: "-"}[c["ok"]]
            lines.append(f"  train {c['claim']}: {status}: {c['detail']}")
    r = s["replay"]
    if r:
        for name, v in sorted(r["snapshots"].items()):
            if "error" in v:
                lines.append(f"  replay {name}: FAILED to run")
                continue
            f = v["fidelity"][0] if v["fidelity"] else {}
            lines.append(f"  replay {name}: {'exact' if v['exact'] else 'NOT exact'}: placements "
                         f"{f.get('placements_matched')}/{f.get('placements_total')}, segment events "
                         f"{f.get('segment_events_matched')}/{f.get('segment_events_total')} ({v['config'][0]})")
    for mode, c in sorted((s["conformance"] or {}).items()):
        listed = len(c["regressions"]) - len(c["unlisted"])
        lines.append(f"  conformance {mode}: native {c['native_pass']} pass, Reservoir {c['reservoir_pass']} pass, "
                     f"{len(c['regressions'])} regressions ({listed} listed)"
                     + "".join(f"\n    not listed: {t}" for t in c["unlisted"]))
    if s["torch_release_differences"]:
        lines.append("torch 2.11's known differences from 2.15 (Reservoir runs in 2.11's mode here):")
        lines += [f"  - {d}" for d in s["torch_release_differences"]]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
