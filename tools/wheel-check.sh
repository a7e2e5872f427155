#!/usr/bin/env bash
# The reservoir wheel as a user gets it: installed into a FRESH venv, on a
# PATH without cargo, no torch.
#
# 1. takes the wheel in target/wheels (tools/torch-proof.sh builds it in CI;
#    built here with maturin when absent, or RESERVOIR_WHEEL=path);
# 2. makes a fresh venv (python3 -m venv) in target/wheel-check/venv and pip
#    installs the wheel, pytest, hypothesis (test_args.py's property test),
#    fsspec (test_remote.py) and (when the index has it) pandas;
# 3. with PATH=venv/bin:/usr/local/bin:/usr/bin:/bin (checks that
#    `command -v cargo` fails there):
#    - the console script on shared traces: its --json equal to the Rust
#      command's (RESERVOIR_BIN, default target/release/reservoir; the
#      measured allocator times aside), `workloads` byte for byte, `compare`
#      and `diff` JSON, `python -m reservoir` equal to the console script;
#    - crates/reservoir-python/tests/test_api.py and test_args.py (the API's
#      argument handling, with a hypothesis property test) and test_remote.py
#      (snapshots by URL through fsspec: memory:// and file://, installed
#      here) and test_executor.py (compare/replay on a concurrent.futures
#      executor: a ProcessPoolExecutor, a worker killed, retries, per-input
#      failures, the tqdm bar) (pytest);
#    - reservoir.replay(...)._repr_html_() rendered in headless Chromium
#      (Debian's chromium, apt-installed when missing): a screenshot
#      (target/wheel-check/report.png), DOM checks (the peak table, both
#      timelines with a series per setting, the segment map) and no console
#      message, the console detector proven on a negative control page.
# Ends with "wheel-check: N passed, M failed" and the wheel's size line.
# Usage: tools/wheel-check.sh   (exit status 1 if anything failed)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$root/target/wheel-check
traces=${RESERVOIR_SHARED_TRACES:-$(cd "$root/../shared/traces" && pwd)}
mkdir -p "$out"
passed=0
failed=0
ok() { echo "wheel-check ok: $*"; passed=$((passed + 1)); }
bad() { echo "wheel-check FAILED: $*"; failed=$((failed + 1)); }

# --- 1. the wheel --------------------------------------------------------
wheel=${RESERVOIR_WHEEL:-$(ls -t target/wheels/reservoir_allocator-*.whl 2>/dev/null | head -n 1)}
if [ -z "$wheel" ]; then
  echo "wheel-check: no wheel in target/wheels: building it (maturin build --release --locked)"
  bvenv=$out/build-venv
  [ -x "$bvenv/bin/maturin" ] || { python3 -m venv "$bvenv" && "$bvenv/bin/pip" install --quiet 'maturin>=1.5,<2'; } || exit 2
  (cd crates/reservoir-python && "$bvenv/bin/maturin" build --release --locked --quiet -o "$root/target/wheels") || exit 2
  wheel=$(ls -t target/wheels/reservoir_allocator-*.whl | head -n 1)
fi
wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
rust_bin=${RESERVOIR_BIN:-$root/target/release/reservoir}
if [ -z "${RESERVOIR_BIN:-}" ] && command -v cargo >/dev/null 2>&1; then
  cargo build --release --locked -q -p reservoir-cli || exit 2
fi
[ -x "$rust_bin" ] || { echo "wheel-check: no Rust command at $rust_bin (RESERVOIR_BIN)"; exit 2; }
echo "wheel-check: wheel $wheel"
echo "wheel-check: Rust command $rust_bin"

# --- 2. a fresh venv -----------------------------------------------------
venv=$out/venv
rm -rf "$venv"
python3 -m venv "$venv" || exit 2
"$venv/bin/pip" install --quiet --disable-pip-version-check "$wheel" pytest hypothesis || exit 2
# fsspec (the wheel's [fsspec] extra): test_remote.py reads snapshots by URL.
"$venv/bin/pip" install --quiet --disable-pip-version-check fsspec || exit 2
if "$venv/bin/pip" install --quiet --disable-pip-version-check pandas; then
  echo "wheel-check: pandas installed (to_pandas() is tested with it and without)"
else
  echo "wheel-check: pandas not installed (to_pandas() is tested without it)"
fi

# --- 3. as a user: no cargo on PATH --------------------------------------
export PATH=$venv/bin:/usr/local/bin:/usr/bin:/bin
unset PYTHONPATH VIRTUAL_ENV
if command -v cargo >/dev/null 2>&1; then
  bad "cargo is on the user's PATH ($(command -v cargo))"
else
  ok "no cargo on PATH; reservoir is $(command -v reservoir)"
fi
if python -c 'import torch' 2>/dev/null; then bad "torch is importable in the fresh venv"; else ok "no torch in the fresh venv"; fi

# json_equal NAME A B: A and B hold equal JSON but for measured times.
json_equal() {
  python - "$2" "$3" <<'EOF'
import json, sys
T = {"allocator_ns_p50", "allocator_ns_p99", "allocator_ns_per_op", "allocator_time_ns"}
def strip(v):
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if k not in T}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v
a, b = (strip(json.load(open(p))) for p in sys.argv[1:3])
sys.exit(0 if a == b else 1)
EOF
}

cmpdir=$out/compare
rm -rf "$cmpdir" && mkdir -p "$cmpdir"
i=0
for t in cs336-bcrafton/06f51ae4_memory_snapshot.pickle cs336-kkaitlyn111/740a7f24_memory_small_forward.pickle \
  allocatorsim-alexnet/07702e3a_input_alexnet_train.log cs336-magma27/a80ccc7b_memory_snapshot.pickle; do
  f=$traces/$t
  [ -e "$f" ] || { bad "missing shared trace $t"; continue; }
  i=$((i + 1))
  reservoir replay "$f" --json --min-capacity >"$cmpdir/py$i.json" 2>"$cmpdir/py$i.err"; a=$?
  "$rust_bin" replay "$f" --json --min-capacity >"$cmpdir/rs$i.json" 2>"$cmpdir/rs$i.err"; b=$?
  if [ $a -eq 0 ] && [ $b -eq 0 ] && json_equal "$t" "$cmpdir/py$i.json" "$cmpdir/rs$i.json" &&
    cmp -s "$cmpdir/py$i.err" "$cmpdir/rs$i.err"; then
    ok "reservoir replay $t --json --min-capacity: equal to the Rust command's ($(python -c "import json,sys; print(len(json.load(open(sys.argv[1]))))" "$cmpdir/py$i.json") reports)"
  else
    bad "reservoir replay $t --json: differs from the Rust command's (exit $a vs $b; see $cmpdir)"
  fi
done
snap=$traces/cs336-bcrafton/06f51ae4_memory_snapshot.pickle
if reservoir workloads >"$cmpdir/w.py" && "$rust_bin" workloads >"$cmpdir/w.rs" && cmp -s "$cmpdir/w.py" "$cmpdir/w.rs" &&
  python -m reservoir workloads | cmp -s - "$cmpdir/w.rs"; then
  ok "reservoir workloads and python -m reservoir workloads: byte for byte the Rust command's"
else
  bad "reservoir workloads differs from the Rust command's"
fi
if reservoir diff "$snap" "$traces/cs336-magma27/a80ccc7b_memory_snapshot.pickle" --json - >"$cmpdir/d.py" &&
  "$rust_bin" diff "$snap" "$traces/cs336-magma27/a80ccc7b_memory_snapshot.pickle" --json - >"$cmpdir/d.rs" &&
  cmp -s "$cmpdir/d.py" "$cmpdir/d.rs"; then
  ok "reservoir diff A B --json -: byte for byte the Rust command's"
else
  bad "reservoir diff differs from the Rust command's"
fi
if reservoir compare --traces "$traces/cs336-silmont2000" --workload gpt-train:layers=1,steps=2 --json >"$cmpdir/c.py" &&
  "$rust_bin" compare --traces "$traces/cs336-silmont2000" --workload gpt-train:layers=1,steps=2 --json >"$cmpdir/c.rs" &&
  json_equal compare "$cmpdir/c.py" "$cmpdir/c.rs"; then
  ok "reservoir compare --traces cs336-silmont2000 --json: equal to the Rust command's"
else
  bad "reservoir compare differs from the Rust command's"
fi
reservoir replay --policy fastest >"$cmpdir/e.out" 2>"$cmpdir/e.py"; a=$?
"$rust_bin" replay --policy fastest 2>"$cmpdir/e.rs"; b=$?
if [ $a -eq 1 ] && [ $b -eq 1 ] && cmp -s "$cmpdir/e.py" "$cmpdir/e.rs" && [ ! -s "$cmpdir/e.out" ]; then
  ok "a bad policy: exit 1 and the Rust command's one error line ($(cat "$cmpdir/e.py" | cut -c1-60)...)"
else
  bad "a bad policy: exit $a vs $b, or another message"
fi

# The API's pytest suite.
pylog=$out/pytest.log
# hypothesis keeps its caches in target/wheel-check/hypothesis, not in the work tree.
(cd "$root" && RESERVOIR_SHARED_TRACES=$traces HYPOTHESIS_STORAGE_DIRECTORY=$out/hypothesis python -m pytest -q -p no:cacheprovider crates/reservoir-python/tests/test_api.py \
  crates/reservoir-python/tests/test_args.py crates/reservoir-python/tests/test_remote.py crates/reservoir-python/tests/test_executor.py) >"$pylog" 2>&1
pystatus=$?
tail -n 15 "$pylog"
p_passed=$(tail -n 1 "$pylog" | sed -nE 's/.* ([0-9]+) passed.*/\1/p; s/^([0-9]+) passed.*/\1/p' | head -n 1)
p_failed=$(tail -n 1 "$pylog" | sed -nE 's/.* ([0-9]+) failed.*/\1/p; s/^([0-9]+) failed.*/\1/p' | head -n 1)
passed=$((passed + ${p_passed:-0}))
failed=$((failed + ${p_failed:-0}))
if [ $pystatus -ne 0 ] && [ "${p_failed:-0}" -eq 0 ]; then bad "pytest exited $pystatus"; fi
[ "${p_passed:-0}" -gt 0 ] || bad "pytest ran no test"

# --- the HTML report in headless Chromium --------------------------------
chrome=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chrome" ]; then
  echo "wheel-check: installing chromium (apt)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) >"$out/apt.log" 2>&1
  chrome=$(command -v chromium || true)
fi
if [ -z "$chrome" ]; then
  bad "no chromium (see $out/apt.log)"
else
  page=$out/repr.html
  python - "$snap" "$page" <<'EOF'
import sys
import reservoir
r = reservoir.replay(sys.argv[1], policies=["pytorch", "expandable", "reservoir"])
with open(sys.argv[2], "w", encoding="utf-8") as f:
    f.write(r._repr_html_())
EOF
  printf '<!doctype html><html><body><p>negative control</p><script>console.error("reservoir-negative-control")</script></body></html>\n' >"$out/control.html"
  flags=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars --user-data-dir="$out/chromium-profile"
    --enable-logging=stderr --v=0 --virtual-time-budget=2000)
  # console_lines FILE: the console messages Chromium logged rendering FILE.
  console_lines() { timeout 120 "$chrome" "${flags[@]}" --dump-dom "file://$1" 2>&1 >/dev/null | grep -E 'CONSOLE|Uncaught' || true; }
  control=$(console_lines "$out/control.html")
  if echo "$control" | grep -q reservoir-negative-control; then
    ok "the console detector sees the negative control's console.error"
  else
    bad "the console detector missed the negative control's console.error"
  fi
  timeout 120 "$chrome" "${flags[@]}" --dump-dom "file://$page" >"$out/dom.html" 2>"$out/chromium.log"
  messages=$(grep -E 'CONSOLE|Uncaught' "$out/chromium.log" || true)
  if [ -z "$messages" ]; then ok "no console message rendering _repr_html_"; else bad "console messages: $messages"; fi
  rm -f "$out/report.png"
  timeout 120 "$chrome" "${flags[@]}" --window-size=1300,2600 --screenshot="$out/report.png" "file://$page" >/dev/null 2>&1
  if [ -s "$out/report.png" ]; then
    ok "screenshot of the rendered report: $out/report.png ($(stat -c %s "$out/report.png") bytes)"
  else
    bad "no screenshot"
  fi
  if python - "$out/dom.html" <<'EOF'
import sys
from html.parser import HTMLParser

class P(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.tables, self.timelines, self.segmaps = [], [], {}, {}
        self.series, self.blocks, self.text = {}, 0, []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = (a.get("class") or "").split()
        if tag == "table" and "numbers" in cls:
            self.tables.append("")
        if tag == "svg" and "timeline" in cls:
            self.timelines[a.get("id")] = 0
            self.cur = a.get("id")
        if tag == "path" and "series" in cls:
            self.series.setdefault(self.cur, set()).add(a.get("data-setting"))
        if tag == "svg" and "segmap" in cls:
            self.segmaps[a.get("id")] = 0
        if tag == "rect" and "block" in cls:
            self.blocks += 1
    def handle_data(self, d):
        if self.tables:
            self.tables[-1] += d

p = P()
p.feed(open(sys.argv[1], encoding="utf-8").read())
settings = {"pytorch", "expandable", "reservoir"}
checks = {
    "the peak table (peak allocated / peak reserved for each setting)": any(
        "peak reserved" in t and "peak allocated" in t and all(s in t for s in settings) for t in p.tables),
    "both timelines (allocated, reserved), a series per setting": len(p.timelines) >= 2 and all(
        p.series.get(t) == settings for t in p.timelines),
    "the segment map with its blocks": len(p.segmaps) >= 1 and p.blocks > 0,
}
for what, good in checks.items():
    print(("wheel-check ok: DOM: " if good else "wheel-check FAILED: DOM: ") + what)
sys.exit(sum(not good for good in checks.values()))
EOF
  then passed=$((passed + 3)); else n=$?; passed=$((passed + 3 - n)); failed=$((failed + n)); fi
  echo "wheel-check: screenshot $out/report.png"
fi

echo "wheel-check: $passed passed, $failed failed"
echo "wheel: $(basename "$wheel"), $(stat -c %s "$wheel") bytes ($(python -c "import sys; print(f'{int(sys.argv[1]) / 2**20:.1f}')" "$(stat -c %s "$wheel")") MiB)"
[ "$failed" -eq 0 ]
