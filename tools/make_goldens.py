#!/usr/bin/env python3
"""Run generated traces through the oracle and write compact golden files.

usage: make_goldens.py --work DIR --out DIR [--jobs N] [--only SUBSTR[,SUBSTR...]] [--keep-full]

Reads DIR/traces/args.tsv and DIR/traces/manifest.json (written by `gen_trace write`), runs
tools/oracle_replay_ext.py on every trace (N at a time), and writes to the output folder:

  manifest.json          the specs (copied), one per line
  stats_keys.json        every torch.cuda.memory_stats() key of this torch version, sorted
  traces/<name>.json     one compact golden per trace (format "reservoir-golden/1", below)

Golden format (JSON; one event per line so that diffs stay readable):
  name, torch, ops (number of ops), fingerprint (of the trace text), spec (as in the manifest),
  capacity, mem_get_info [free, total] at the end, stream_order (stream names by handle value,
  default "0" first),
  stats: memory_stats() at the end of the trace (before anything is freed): the values, in the
         order of the keys in stats_keys.json (sorted),
  oom_tails: the distinct endings of the OOM messages (after OOM_MARK, below),
  ooms: [op, head, tail] per failed allocation: the message is head + oom_tails[tail]
        (head ends with " is reserved by PyTorch but unallocated."),
  segment_events: [op, action, size, stream] (action segment_alloc/free/map/unmap), and
                  [op, "oom", size, stream, device_free],
  device_calls: [op, call, size, error, count]: consecutive identical calls are merged (count);
                call "unmap+release" stands for an unmap followed by a release of the same op,
                size and error; error 0 = success, 2 = out of memory,
  segment_addresses: the base address of every segment (plain allocations and expandable-segment
                reservations, in order of creation), as 4 KiB page numbers: the first page, then
                the difference to the previous one. PyTorch breaks best-fit ties by address; a
                replay hands these addresses out in order to break them the same way,
  placement_window (64) and placement: where each allocation was placed, one hash per window of
                64 ops: FNV-1a 64 (hex) of "op:segment:offset;" for every successful allocation
                of the window in order, segment = segments and expandable reservations numbered
                in order of creation, offset = from the segment's start. It locates the first
                window where block placement diverges without storing every placement.
With --only, only the traces whose name contains one of the substrings are run and the other golden files are kept.
"""
import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FORMAT = "reservoir-golden/1"
OOM_MARK = " is reserved by PyTorch but unallocated."
WINDOW = 64
FNV_BASIS = 0xCBF29CE484222325


def fnv1a(h, data):
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def run_one(work, name, args, keep_full):
    trace = os.path.join(work, "traces", name + ".txt")
    full = os.path.join(work, "full", name + ".json")
    cmd = [sys.executable, os.path.join(HERE, "oracle_replay_ext.py"), trace, full, "--quiet",
           "--all-events"] + args
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return name, None, f"exit {p.returncode}: {p.stderr.strip()[-2000:]}", time.time() - t0
    with open(full) as f:
        d = json.load(f)
    if not keep_full:
        os.remove(full)
    return name, d, None, time.time() - t0


def compact_calls(device_calls):
    """[op, call, size, error, count] rows: PyTorch unmaps page by page (cuMemUnmap then
    cuMemRelease), so an adjacent unmap + release pair of one op, size and error becomes one
    "unmap+release" call first; then runs of identical calls become one row with a count."""
    calls = []
    for c in device_calls:
        row = [c["op"], c["call"], c["size"], c.get("error", 0)]
        if row[1] == "release" and calls and calls[-1][1] == "unmap" and \
                [calls[-1][0], calls[-1][2], calls[-1][3]] == [row[0], row[2], row[3]]:
            calls[-1][1] = "unmap+release"
        else:
            calls.append(row)
    rows = []
    for row in calls:
        if rows and rows[-1][:4] == row:
            rows[-1][4] += 1
        else:
            rows.append(row + [1])
    return rows


def address_deltas(addrs):
    """Segment base addresses as 4 KiB page numbers: the first one, then differences."""
    out, prev = [], 0
    for a in addrs:
        if a % 4096:
            raise RuntimeError(f"segment address {a:#x} is not page aligned")
        out.append(a // 4096 - prev)
        prev = a // 4096
    return out


def compact(d, spec):
    # OOM messages end in one of a few long constant tails: keep each tail once.
    tails, ooms = [], []
    for o in d["ooms"]:
        msg = o["message"]
        cut = msg.find(OOM_MARK)
        head, tail = (msg, "") if cut < 0 else (msg[:cut + len(OOM_MARK)], msg[cut + len(OOM_MARK):])
        if tail not in tails:
            tails.append(tail)
        ooms.append([o["op"], head, tails.index(tail)])
    seg = []
    for e in d["segment_events"]:
        row = [e["op"], e["action"], e["size"], e["stream"]]
        if e["action"] == "oom":
            row.append(e.get("device_free"))
        seg.append(row)
    calls = compact_calls(d["device_calls"])
    stats = [v for _, v in sorted(d["stats"].items())]
    # Where every allocation went, as one hash per window of WINDOW ops.
    windows = [FNV_BASIS] * (d["ops"] // WINDOW + 1)
    for e in d["events"]:
        if e["action"] == "alloc":
            if e["op"] is None or e["segment"] is None:
                raise RuntimeError(f"alloc event without op or segment: {e}")
            w = e["op"] // WINDOW
            windows[w] = fnv1a(windows[w], f"{e['op']}:{e['segment']}:{e['offset']};".encode())
    return {
        "format": FORMAT,
        "name": spec["name"],
        "torch": d["torch"],
        "ops": d["ops"],
        "fingerprint": spec["fingerprint"],
        "spec": {k: spec[k] for k in ("name", "kind", "seed", "ops", "conf", "capacity", "fraction")},
        "capacity": d["device"]["total_memory"],
        "mem_get_info": d["mem_get_info"],
        "stream_order": d["stream_handle_order"],
        "stats": stats,
        "oom_tails": tails,
        "ooms": ooms,
        "segment_events": seg,
        "device_calls": calls,
        "segment_addresses": address_deltas(d["segment_addresses"]),
        "placement_window": WINDOW,
        "placement": [f"{h:016x}" for h in windows],
    }


def dump(g):
    """JSON with one list element per line for the event lists."""
    out = ["{"]
    keys = list(g)
    for i, k in enumerate(keys):
        v = g[k]
        end = "," if i + 1 < len(keys) else ""
        if isinstance(v, list) and v and isinstance(v[0], list):
            out.append(f" {json.dumps(k)}: [")
            for j, row in enumerate(v):
                out.append("  " + json.dumps(row, separators=(",", ":")) + ("," if j + 1 < len(v) else ""))
            out.append(" ]" + end)
        else:
            out.append(f" {json.dumps(k)}: {json.dumps(v)}{end}")
    out.append("}")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--only", default=None)
    ap.add_argument("--keep-full", action="store_true", help="keep the oracle's full JSON in WORK/full")
    a = ap.parse_args()

    with open(os.path.join(a.work, "traces", "manifest.json")) as f:
        manifest = json.load(f)
    specs = {s["name"]: s for s in manifest["specs"]}
    jobs = []
    with open(os.path.join(a.work, "traces", "args.tsv")) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if a.only is None or any(p and p in parts[0] for p in a.only.split(",")):
                jobs.append((parts[0], parts[1:]))
    os.makedirs(os.path.join(a.work, "full"), exist_ok=True)
    gdir = os.path.join(a.out, "traces")
    os.makedirs(gdir, exist_ok=True)

    failed, keysets = [], {}
    t0 = time.time()
    with cf.ThreadPoolExecutor(max_workers=a.jobs) as ex:
        futs = [ex.submit(run_one, a.work, n, args, a.keep_full) for n, args in jobs]
        for i, fut in enumerate(cf.as_completed(futs), 1):
            name, d, err, dt = fut.result()
            if err:
                failed.append((name, err))
                print(f"[{i}/{len(jobs)}] {name}: FAILED {err}", file=sys.stderr)
                continue
            g = compact(d, specs[name])
            keysets[name] = tuple(sorted(d["stats"]))
            with open(os.path.join(gdir, name + ".json"), "w") as f:
                f.write(dump(g))
            print(f"[{i}/{len(jobs)}] {name}: {d['ops']} ops, {len(g['ooms'])} OOM, "
                  f"{len(g['segment_events'])} segment events, {dt:.1f} s", file=sys.stderr)
    if failed:
        sys.exit(f"make_goldens: {len(failed)} traces failed: " + ", ".join(n for n, _ in failed))

    distinct = set(keysets.values())
    if len(distinct) > 1:
        sys.exit("make_goldens: memory_stats() key sets differ between traces")
    keys_path = os.path.join(a.out, "stats_keys.json")
    if distinct:
        keys = list(distinct.pop())
        if a.only is not None and os.path.exists(keys_path):
            with open(keys_path) as f:
                if json.load(f)["keys"] != keys:
                    sys.exit("make_goldens: memory_stats() keys changed; regenerate everything")
        with open(keys_path, "w") as f:
            f.write('{"keys": [\n' + ",\n".join("  " + json.dumps(k) for k in keys) + "\n]}\n")

    # the manifest, as written by gen_trace (one spec per line)
    with open(os.path.join(a.work, "traces", "manifest.json")) as src, \
            open(os.path.join(a.out, "manifest.json"), "w") as dst:
        dst.write(src.read())
    if a.only is None:  # drop goldens of specs that no longer exist
        for fn in os.listdir(gdir):
            if fn.endswith(".json") and fn[:-5] not in specs:
                os.remove(os.path.join(gdir, fn))
                print(f"removed stale {fn}", file=sys.stderr)
    print(f"make_goldens: {len(jobs)} traces in {time.time() - t0:.0f} s -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
