#!/usr/bin/env python3
"""PyTorch's own memory tests as a conformance suite for Reservoir (issue 40).

Runs the tests listed in ../shared/torch-tests/memory-tests.txt on the fake
CUDA device of ../shared/oracle, once under torch's native allocator and
once per Reservoir mode, the same way each time: by default one pytest
process per test file (importing torch and a test file takes 10 to 20 s, so
a process per test would take about 40 minutes on 2 cores; the files say
which tests need a process of their own, and those get one), with
--isolate a process per test. A test that hangs past --timeout is ended by
pytest-timeout, counts as a failure, and the tests after it go on in a new
process. A test listed in tools/torch-conformance-known.txt for a mode runs
in a process of its own in that mode; in every process a plugin drops each
test's traceback after it (pytest keeps the last failure's, and with it the
failed test's tensors and pools, alive for the tests after it). The modes:

  pytorch     reservoir.torch.enable("policy:pytorch-2.15")   (PyTorch mode)
  expandable  reservoir.torch.enable("expandable_segments:True")
  reservoir   reservoir.torch.enable("policy:reservoir")

Reservoir is enabled before the test file is imported by a sitecustomize.py
that this script writes (so every process the test starts gets it too).

A test that passes natively must pass on Reservoir in every mode. The file
tools/torch-conformance-known.txt lists, per mode, the tests that do not yet,
each with its cause, reviewed like code:

  MODE  TEST_ID  regression|difference  cause

`regression` is a defect still to fix; `difference` is a number the
`reservoir` policy legitimately changes (the assertion and why in the cause).
The run fails on a regression the file does not list, and on a listed test
that now passes (the list can only shrink: delete its line).

Prints one table per mode (test, native, Reservoir, cause), a line per mode

  torch-conformance MODE: native P/N pass, reservoir Q/N pass, R regressions (K listed)

and closes with "torch-conformance: X passed, Y failed" (X: modes whose every
natively passing test passes or is listed; Y: the others). --json writes every
result. Usage:

  tools/torch-conformance.sh [--modes pytorch,expandable,reservoir]
      [--tests PATTERN] [--timeout S] [--jobs N] [--json OUT]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = {
    "native": None,
    "native-expandable": None,
    "pytorch": "policy:pytorch-2.15",
    "expandable": "expandable_segments:True",
    "reservoir": "policy:reservoir",
}
# Native torch's own settings per run (PYTORCH_CUDA_ALLOC_CONF), and the
# native run each Reservoir mode is compared with: expandable segments
# against native torch with expandable segments, as a user switching
# allocators would compare.
NATIVE_CONF = {"native-expandable": "expandable_segments:True"}
BASELINE = {"pytorch": "native", "expandable": "native-expandable", "reservoir": "native"}

SITECUSTOMIZE = """\
# Written by tools/torch_conformance.py: Reservoir serves torch in this process.
import os
_conf = os.environ.get("RESERVOIR_CONFORMANCE_CONF")
if _conf is not None:
    import reservoir.torch
    reservoir.torch.enable(_conf)
"""


def parse_known(path: Path) -> dict:
    """{(mode, test): (kind, cause)} from the known-differences file."""
    known = {}
    if not path.exists():
        return known
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 3)
        if len(parts) < 4 or parts[0] not in MODES or parts[2] not in ("regression", "difference"):
            raise SystemExit(f"{path}:{n}: expected 'MODE TEST regression|difference CAUSE', got {line!r}")
        known[(parts[0], parts[1])] = (parts[2], parts[3])
    return known


# Loaded into every pytest process (-p): a failed test's traceback (pytest
# keeps the last one in sys.last_traceback, and a unittest test's on its
# item) holds the test's frames, so its tensors and MemPools would stay
# alive for the tests after it, natively and on Reservoir alike; dropped,
# and collected, after each test (and after a failed one, the cache emptied).
PLUGIN = """\
# Written by tools/torch_conformance.py: each test starts without what the one before held.
import gc
import sys

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if outcome.get_result().failed:
        item._conformance_failed = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            setattr(sys, name, None)
    if hasattr(item, "_excinfo"):
        item._excinfo = None
    gc.collect()
    # A failed test's tearDown may not have run to its end: what it freed
    # only now stays cached, and a test that counts segments (setUp against
    # tearDown) would count it. Emptied, as its tearDown would have.
    if getattr(item, "_conformance_failed", False) and "torch" in sys.modules:
        torch = sys.modules["torch"]
        try:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        except Exception:
            pass
"""

RESULT_RE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
KIND = {"PASSED": "pass", "XPASS": "pass", "FAILED": "fail", "ERROR": "error", "SKIPPED": "skip", "XFAIL": "skip"}
# Files whose tests each need a brand new process (they say so: process-wide hooks).
ONE_PROCESS_PER_TEST = ("test_cuda_trace.py",)


def run_group(python: str, tests_dir: Path, tests: list, conf, site_dir: Path, timeout: float,
              native_conf=None) -> dict:
    """Run `tests` (of one test file, or one test) in one pytest process; a
    test that hangs past `timeout` ends the process, counts as `timeout`, and
    the tests after it run in a new process."""
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONPATH"] = str(site_dir) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("RESERVOIR_CONFORMANCE_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if conf is not None:
        env["RESERVOIR_CONFORMANCE_CONF"] = conf
    if native_conf is not None:
        env["PYTORCH_CUDA_ALLOC_CONF"] = native_conf
    results = {}
    todo = list(tests)
    while todo:
        cmd = [python, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "conformance_plugin", "--tb=short",
               "-o", "console_output_style=classic",
               f"--timeout={timeout:.0f}", "--timeout_method=thread"] + todo
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=tests_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, text=True, errors="replace")
        try:
            # pytest-timeout ends a hung test's process; this is the backstop.
            out, _ = proc.communicate(timeout=timeout * (len(todo) + 1) + 120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        secs = time.monotonic() - t0
        got = {}
        for line in out.splitlines():
            m = RESULT_RE.match(line)
            if m and m.group(1) in todo and m.group(1) not in got:
                got[m.group(1)] = KIND[m.group(2)]
        # The failure sections: "____ Class.test ____" up to the next header.
        sections = {}
        heads = list(re.finditer(r"^_{3,} (?:\S+\.)?(\S+?)(?:\[.*\])? _{3,}$", out, re.M))
        for k, h in enumerate(heads):
            end = heads[k + 1].start() if k + 1 < len(heads) else len(out)
            sections.setdefault(h.group(1), out[h.start():end])
        for t, kind in got.items():
            reason, block = "", ""
            if kind in ("fail", "error"):
                block = sections.get(t.split("::")[-1], "")
                errs = [l for l in block.splitlines() if re.match(r"^E\s", l)]
                reason = (errs[0][1:].strip() if errs else "")[:160]
            results[t] = {"test": t, "result": kind, "reason": reason, "output": block[-3000:]}
        rest = [t for t in todo if t not in got]
        if rest:
            # The process ended at rest[0]: a hang ended by pytest-timeout, a
            # crash, or (nothing ran at all) a failed collection.
            hung = rest[0]
            last = (out.strip().splitlines() or ["no output"])[-1]
            timed_out = "Timeout" in out
            results[hung] = {"test": hung, "result": "timeout" if timed_out else "error",
                             "reason": f"no result after {timeout:.0f} s (killed)" if timed_out
                             else (last[:160] if not got else "the process ended in this test: " + last[:120]),
                             "output": out[-3000:]}
            rest = rest[1:]
        for t in got:
            results[t]["seconds"] = round(secs / max(1, len(got)), 1)
        todo = rest
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--tests-dir", type=Path, default=Path(__file__).resolve().parents[1] / ".." / "shared" / "torch-tests")
    ap.add_argument("--modes", default="pytorch,expandable,reservoir",
                    help="Reservoir modes (each with its native baseline)")
    ap.add_argument("--tests", default=None, help="only tests whose id contains this text")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per test (default 120)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--isolate", action="store_true", help="a process per test (slow: about 40 min on 2 cores)")
    ap.add_argument("--known", type=Path, default=Path(__file__).resolve().parent / "torch-conformance-known.txt")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"--modes: unknown mode {m!r}; the modes are {', '.join(MODES)}")
    for m in list(modes):
        if m in BASELINE and BASELINE[m] not in modes:
            modes.insert(0, BASELINE[m])
    tests_dir = args.tests_dir.resolve()
    tests = [l.strip() for l in (tests_dir / "memory-tests.txt").read_text().splitlines() if l.strip()]
    if args.tests:
        tests = [t for t in tests if args.tests in t]
    if not tests:
        raise SystemExit("no test selected")
    known = parse_known(args.known)

    site_dir = Path(tempfile.mkdtemp(prefix="reservoir-conformance-"))
    (site_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (site_dir / "conformance_plugin.py").write_text(PLUGIN)
    # The C++ face is compiled once, before the parallel runs race to build it.
    if any(MODES[m] is not None for m in modes):
        subprocess.run([args.python, "-c", "import reservoir.torch as r; r.face()"], check=True)

    groups = []
    for m in modes:
        files = {}
        for t in tests:
            files.setdefault(t.split("::")[0], []).append(t)
        for f, ts in files.items():
            if f in ONE_PROCESS_PER_TEST or args.isolate:
                groups.extend((m, [t]) for t in ts)
                continue
            # A listed test is expected to fail, and a failing unittest test
            # keeps its frames (and so its tensors and pools) alive for the
            # rest of the process (pytest holds the traceback): a process of
            # its own, so that what it leaves does not fail the tests after it.
            alone = [t for t in ts if (m, t) in known]
            groups.extend((m, [t]) for t in alone)
            rest = [t for t in ts if (m, t) not in known]
            if rest:
                groups.append((m, rest))
    results: dict = {m: {} for m in modes}
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        futs = {ex.submit(run_group, args.python, tests_dir, ts, MODES[m], site_dir, args.timeout,
                          NATIVE_CONF.get(m)): (m, ts)
                for m, ts in groups}
        for i, fut in enumerate(cf.as_completed(futs), 1):
            m, ts = futs[fut]
            got = fut.result()
            results[m].update(got)
            counts = {}
            for r in got.values():
                counts[r["result"]] = counts.get(r["result"], 0) + 1
            print(f"[{i}/{len(groups)} {time.monotonic() - t0:5.0f}s] {m:10} {ts[0].split('::')[0]}: "
                  + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), flush=True)

    passed_modes = failed_modes = 0
    summary = {}
    for m in modes:
        if m not in BASELINE:
            continue
        native = results[BASELINE[m]]
        rows = []
        regressions, unlisted, stale = [], [], []
        for t in tests:
            nat, res = native[t]["result"], results[m][t]["result"]
            k = known.get((m, t))
            cause = ""
            if nat == "pass" and res != "pass":
                regressions.append(t)
                if k is None:
                    unlisted.append(t)
                    cause = "NOT LISTED: " + results[m][t]["reason"]
                else:
                    cause = f"{k[0]}: {k[1]}"
            elif k is not None:
                stale.append(t)
                cause = f"LISTED BUT {res.upper()} (native {nat}): delete its line"
            elif nat != "pass" and res == "pass":
                cause = "passes on Reservoir only"
            elif nat != "pass":
                cause = "native: " + native[t]["reason"]
            rows.append((t, nat, res, cause))
        print(f"\n## {m} ({MODES[m]}; against {BASELINE[m]})\n")
        w = max(len(t) for t in tests)
        print(f"{'test':{w}}  {'native':7}  {'reservoir':9}  cause")
        for t, nat, res, cause in rows:
            print(f"{t:{w}}  {nat:7}  {res:9}  {cause}")
        npass = sum(1 for t in tests if native[t]["result"] == "pass")
        rpass = sum(1 for t in tests if results[m][t]["result"] == "pass")
        listed = len(regressions) - len(unlisted)
        line = (f"torch-conformance {m}: native {npass}/{len(tests)} pass, reservoir {rpass}/{len(tests)} pass, "
                f"{len(regressions)} regressions ({listed} listed)")
        summary[m] = {"native_pass": npass, "reservoir_pass": rpass, "regressions": regressions,
                      "unlisted": unlisted, "stale": stale}
        ok = not unlisted and not stale
        passed_modes += ok
        failed_modes += not ok
        print()
        print(line)
        for t in unlisted:
            print(f"torch-conformance {m}: REGRESSION not in {args.known.name}: {t}: {results[m][t]['reason']}")
            print("    " + results[m][t]["output"][-1500:].replace("\n", "\n    "))
        for t in stale:
            print(f"torch-conformance {m}: {t} is listed in {args.known.name} but is no longer a regression: delete its line")
    if args.json:
        args.json.write_text(json.dumps({"modes": {m: MODES[m] for m in modes}, "summary": summary,
                                         "results": results}, indent=1))
    print(f"\ntorch-conformance: {passed_modes} passed, {failed_modes} failed")
    return 0 if failed_modes == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
