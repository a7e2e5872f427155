#!/usr/bin/env bash
# The HTML report a user opens first, in headless Chromium (issue 41 item 4):
# `reservoir replay` of a real snapshot (../shared/traces, by default
# select_n-bert-llama/ec5be110_snapshot.pickle on a 19 GiB device, where
# PyTorch's defaults run out of memory), rendered at 1300x900 (one screen):
#   - target/report-screenshot/first-screen.png: the first screen (the
#     summary and the diagnosis must be on it), and full.png (the page);
#   - DOM checks on Chromium's rendering (--dump-dom): the summary (what
#     happened, why, what to do, what fits) before the first timeline, one
#     table of settings, an OOM marker on each timeline.
# Ends with "report-screenshot: N passed, M failed".
# Usage: tools/report-screenshot.sh [SNAPSHOT [CAPACITY]]
#   RESERVOIR_BIN (default target/release/reservoir, else target/debug/reservoir)
set -uo pipefail
cd "$(dirname "$0")/.."
out=$PWD/target/report-screenshot
mkdir -p "$out"
snap=${1:-../shared/traces/select_n-bert-llama/ec5be110_snapshot.pickle}
cap=${2:-19GiB}
bin=${RESERVOIR_BIN:-}
[ -z "$bin" ] && for b in target/release/reservoir target/debug/reservoir; do [ -x "$b" ] && bin=$b && break; done
passed=0 failed=0
ok() { echo "report-screenshot ok: $*"; passed=$((passed + 1)); }
bad() { echo "report-screenshot FAILED: $*"; failed=$((failed + 1)); }
chrome=$(command -v chromium || command -v chromium-browser || true)
if [ ! -f "$snap" ]; then echo "report-screenshot: SKIPPED ($snap not found)"; exit 0; fi
if [ -z "$bin" ] || [ -z "$chrome" ]; then bad "no reservoir binary ($bin) or no chromium"; echo "report-screenshot: $passed passed, $failed failed"; exit 1; fi
page=$out/report.html
if "$bin" replay "$snap" -p pytorch -p expandable -p reservoir --capacity "$cap" --min-capacity --html "$page" >"$out/report.txt" 2>"$out/replay.log"; then
  ok "reservoir replay $snap --capacity $cap --min-capacity --html"
else
  bad "reservoir replay failed: $(tail -3 "$out/replay.log")"
fi
flags=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars --user-data-dir="$out/chromium-profile")
rm -f "$out/first-screen.png" "$out/full.png"
timeout 120 "$chrome" "${flags[@]}" --window-size=1300,900 --screenshot="$out/first-screen.png" "file://$page" >/dev/null 2>&1
timeout 120 "$chrome" "${flags[@]}" --window-size=1300,6000 --screenshot="$out/full.png" "file://$page" >/dev/null 2>&1
if [ -s "$out/first-screen.png" ]; then ok "screenshot $out/first-screen.png"; else bad "no screenshot"; fi
timeout 120 "$chrome" "${flags[@]}" --dump-dom "file://$page" >"$out/dom.html" 2>"$out/chromium.log"
python3 - "$out/dom.html" <<'PY'
import sys
dom = open(sys.argv[1], encoding="utf-8").read()
body = dom[dom.find("<body"):]
first = body[: body.find('<svg class="timeline"')]
checks = {
    "the summary (what happened, why, what to do, what fits) before the timelines":
        all(k in first for k in ("What happened", "Why", "What to do", "What fits")),
    "the diagnosis within the first 4,000 bytes of the body": 0 <= body.find("What to do") < 4000,
    "one table of settings": body.count('class="numbers settings"') == 1,
    "an OOM marker on each timeline": body.count('class="oom-marker"') >= 2,
}
for what, good in checks.items():
    print(("report-screenshot ok: DOM: " if good else "report-screenshot FAILED: DOM: ") + what)
sys.exit(sum(not g for g in checks.values()))
PY
n=$?; passed=$((passed + 4 - n)); failed=$((failed + n))
echo "report-screenshot: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
