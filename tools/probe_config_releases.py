#!/usr/bin/env python3
"""Measure how each supported torch release reads every settings string of the 2.15 golden table.

For every input of GOLDEN in crates/reservoir/src/config/tests/golden.rs, and for each release's oracle
(~/.cache/oracle-2.11 .. oracle-2.14, the PyTorch oracle of ../shared/oracle set up for that release),
this runs the string twice in a fresh fork of one python that imported torch (so every case starts
from PyTorch's defaults):
  runtime  torch._C._accelerator_setAllocatorSettings(s) (torch.cuda.memory._set_allocator_settings)
  startup  PYTORCH_CUDA_ALLOC_CONF=s, then the first CUDA allocation
and writes crates/reservoir/src/config/tests/golden_releases.rs: per release, the outcome ("ok", or the
exception and PyTorch's message) of each case where it differs from 2.15 (the 2.15 outcomes are GOLDEN's).

The backend scan of PYTORCH_CUDA_ALLOC_CONF runs when libc10_cuda loads, before the fork, so a fork
cannot measure what it raises: the start-up cases that name `backend` or where 2.15 raises an internal
assertion (all the backend scan raises) run in a fresh process each instead. torch 2.15 is probed the
same way as a control: start-up cases where the control differs from GOLDEN's start-up column are left
out, and so are those choosing `backend:cudaMallocAsync`: with that backend a program never reads the
native allocator's keys (GOLDEN's C++ probe called the parsers itself), so a process cannot show how
the release reads them. Exceptions are named as the C++ probe of golden.rs names them
(std::invalid_argument -> InvalidArgument, std::out_of_range -> OutOfRange, TORCH_INTERNAL_ASSERT ->
InternalAssert). At start-up torch 2.11 to 2.14 wrap the std exceptions of stoull/stod in
RuntimeError: their class is then taken from the same string's run-time outcome (the same C++
conversion of the same value throws it).

usage: tools/probe_config_releases.py [RELEASE ...]   (default: 2.11 2.12 2.13 2.14)
"""
import io
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "crates/reservoir/src/config/tests/golden.rs")
OUT = os.path.join(ROOT, "crates/reservoir/src/config/tests/golden_releases.rs")
ORACLE = os.path.join(ROOT, "..", "shared", "oracle", "oracle-python")

PROBE = r'''
import json, os, sys, torch
cases = json.load(sys.stdin)
def run(mode, s):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            if mode == "runtime":
                f = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or torch.cuda.memory._set_allocator_settings
                f(s)
            else:
                os.environ["PYTORCH_CUDA_ALLOC_CONF"] = s
                torch.empty(1, device="cuda")
            out = "ok"
        except BaseException as e:
            out = type(e).__name__ + " " + str(e).split("\n")[0]
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        d = os.read(r, 65536)
        if not d:
            break
        data += d
    os.close(r)
    os.waitpid(pid, 0)
    return data.decode()
print(json.dumps({"version": torch.__version__,
                  "runtime": [run("runtime", s) for s in cases],
                  "startup": [run("startup", s) for s in cases]}))
'''


def rust_unescape(s):
    s = re.sub(r"\\u\{([0-9a-f]+)\}", lambda m: chr(int(m.group(1), 16)), s)
    return s.replace('\\"', '"').replace("\\\\", "\\")


def rust_escape(s):
    out = []
    for ch in s:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ord(ch) < 0x20 or ord(ch) > 0x7E:
            out.append("\\u{%x}" % ord(ch))
        else:
            out.append(ch)
    return "".join(out)


def golden_cases():
    src = open(GOLDEN).read()
    body = src[src.index("const GOLDEN: &[GoldenCase]"):src.index("const GOLDEN_SEQUENCES")]
    s = r'"((?:[^"\\]|\\.)*)"'
    a = r'&\[((?:\s*"(?:[^"\\]|\\.)*",?)*)\]'
    cases = []
    for line in body.splitlines():
        if line.startswith('("'):
            m = re.match(r"\(" + s + ", " + s + ", " + a + ", " + s + ", " + a + r"\),$", line)
            assert m, line[:80]
            cases.append((rust_unescape(m.group(1)), rust_unescape(m.group(2)), rust_unescape(m.group(4))))
    return cases


def outcome(raw, runtime=None):
    """The outcome as golden.rs writes it; `runtime`: the same string's run-time outcome."""
    kind, _, msg = raw.partition(" ")
    if kind == "ok":
        return "ok"
    if "INTERNAL ASSERT FAILED" in msg:
        return "InternalAssert " + msg
    if msg in ("stoull", "stod"):
        if kind == "RuntimeError" and runtime is not None and runtime.endswith(" " + msg):
            return runtime
        return ("OutOfRange " if kind == "IndexError" else "InvalidArgument ") + msg
    return "ValueError " + msg


def golden_outcome(g):
    return "ok" if g.startswith("ok") else g


FRESH = r'''
try:
    import torch
    torch.empty(1, device="cuda")
    print("ok")
except BaseException as e:
    print(type(e).__name__ + " " + str(e).split("\n")[0])
'''


def probe(rel, inputs, fresh):
    """Run PROBE on release `rel`'s oracle (2.15: the default oracle home); the start-up cases of
    `fresh` in a fresh process each."""
    home = os.path.expanduser("~/.cache/pytorch-oracle" if rel == "2.15" else f"~/.cache/oracle-{rel}")
    env = dict(os.environ, PYTORCH_ORACLE_HOME=home, TORCH_SHOW_CPP_STACKTRACES="0")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    p = subprocess.run([ORACLE, "-c", PROBE], input=json.dumps(inputs), env=env,
                       capture_output=True, text=True, check=True)
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["version"].startswith(rel + "."), (rel, got["version"])
    for k, inp in enumerate(inputs):
        if inp in fresh:
            q = subprocess.run([ORACLE, "-c", FRESH], env=dict(env, PYTORCH_CUDA_ALLOC_CONF=inp),
                               capture_output=True, text=True)
            got["startup"][k] = fresh_outcome(q)
    return got


def fresh_outcome(q):
    """What a fresh process printed; an exception thrown while libc10_cuda loads terminates it
    ("terminate called after throwing an instance of 'c10::Error'  what():  ...")."""
    if q.stdout.strip():
        return q.stdout.strip().splitlines()[-1]
    m = re.search(r"throwing an instance of '([^']+)'\n\s*what\(\):\s+(.*)", q.stderr)
    assert m, q.stderr[-2000:]
    kind = {"c10::Error": "RuntimeError", "c10::ValueError": "ValueError",
            "std::invalid_argument": "ValueError", "std::out_of_range": "IndexError"}[m.group(1)]
    return kind + " " + m.group(2).strip()


def main():
    releases = sys.argv[1:] or ["2.11", "2.12", "2.13", "2.14"]
    cases = golden_cases()
    inputs = [c[0] for c in cases]
    rows = {"runtime": {}, "startup": {}}
    fresh = {inp for inp, _, st in cases if "backend" in inp or st.startswith("InternalAssert")}
    control = probe("2.15", inputs, fresh)
    unmeasured = {inp for (inp, _, st), raw, rt in zip(cases, control["startup"], control["runtime"])
                  if outcome(raw, outcome(rt)) != golden_outcome(st) or "backend:cudaMallocAsync" in inp}
    bad = [inp for (inp, rt, _), raw in zip(cases, control["runtime"]) if outcome(raw) != golden_outcome(rt)]
    assert not bad, f"the 2.15 control differs from GOLDEN at run time: {bad}"
    print(f"2.15 control: run time as GOLDEN; {len(unmeasured)} start-up cases differ: {sorted(unmeasured)}",
          file=sys.stderr)
    for rel in releases:
        got = probe(rel, inputs, fresh)
        for mode, col in (("runtime", 1), ("startup", 2)):
            for (inp, *gold), raw, rt in zip(cases, got[mode], got["runtime"]):
                if mode == "startup" and inp in unmeasured:
                    continue
                o = outcome(raw, outcome(rt))
                if o != golden_outcome(gold[col - 1]):
                    rows[mode].setdefault(inp, {})[rel] = o
        print(f"{rel}: {sum(rel in r for r in rows['runtime'].values())} runtime and "
              f"{sum(rel in r for r in rows['startup'].values())} start-up outcomes differ from 2.15",
              file=sys.stderr)
    f = io.StringIO()
    f.write("// @generated by tools/probe_config_releases.py: do not edit.\n")
    f.write("//\n// Where torch 2.11 to 2.14 read a string of GOLDEN (golden.rs) otherwise than 2.15:\n")
    f.write("// (release, input, outcome), run time (`_set_allocator_settings`) and start-up\n")
    f.write("// (PYTORCH_CUDA_ALLOC_CONF; not measured: the cases listed in UNMEASURED_STARTUP).\n\n")
    f.write("#[rustfmt::skip]\n")
    f.write("pub(super) const UNMEASURED_STARTUP: &[&str] = &[\n")
    for inp in inputs:
        if inp in unmeasured:
            f.write(f'"{rust_escape(inp)}",\n')
    f.write("];\n\n")
    for mode in ("runtime", "startup"):
        f.write("#[rustfmt::skip]\n")
        f.write(f"pub(super) const {mode.upper()}: &[(&str, &str, &str)] = &[\n")
        for inp in inputs:
            for rel in releases:
                o = rows[mode].get(inp, {}).get(rel)
                if o is not None:
                    f.write(f'("{rel}", "{rust_escape(inp)}", "{rust_escape(o)}"),\n')
        f.write("];\n\n")
    with open(OUT, "w") as out:
        out.write(f.getvalue().rstrip("\n") + "\n")


if __name__ == "__main__":
    main()
