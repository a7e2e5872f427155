#!/usr/bin/env bash
# Instruction-count regression check (issue 16): runs two small fixed
# workloads under `valgrind --tool=callgrind`, counting only the measured
# loop (--toggle-collect), and compares the instructions per operation with
# tools/icount-baseline.txt. Instruction counts are deterministic, so this is
# not a timed test: it fails (exit 1) when any measurement is more than 5 %
# above its baseline.
#
#   tools/icount.sh            check against the baseline
#   tools/icount.sh --update   rewrite the baseline with the new counts
#   tools/icount.sh --prebuilt check the examples already in target/release
#                              (CI's release step built them with its own
#                              package selection; building them here with
#                              this one would resolve other features and
#                              compile the graph again)
#
# Measurements:
#   alloc_free_pair  instructions per 1 KiB raw_alloc + raw_free pair on a
#                    warm cache (the `alloc_free_pair` example's loop_pairs,
#                    100,000 pairs)
#   replay_entry     instructions per replayed entry of the largest trace in
#                    ../shared/traces (the `replay_profile` example, 2 replays;
#                    replay_recorded inclusive of seeding, the report and the
#                    fidelity measurement)
# Repeated runs give the same per-operation values: the pair loop's count is
# identical, the replay's total varies by a few tens of instructions in 46 M
# (hash-map seeds), far below the one decimal printed.
set -euo pipefail
cd "$(dirname "$0")/.."

baseline=tools/icount-baseline.txt
threshold=1.05
update=0
build=1
case "${1:-}" in
  "") ;;
  --update) update=1 ;;
  --prebuilt) build=0 ;;
  *) echo "usage: tools/icount.sh [--update | --prebuilt]" >&2; exit 2 ;;
esac

command -v valgrind >/dev/null 2>&1 || { echo "icount: valgrind is not installed" >&2; exit 1; }

pairs=100000
replays=2

bin="${CARGO_TARGET_DIR:-target}/release/examples"
if [ "$build" -eq 1 ]; then
  cargo build --release --locked -p reservoir --example alloc_free_pair \
    -p reservoir-replay --example replay_profile
elif [ ! -x "$bin/alloc_free_pair" ] || [ ! -x "$bin/replay_profile" ]; then
  echo "icount: --prebuilt, but $bin has no alloc_free_pair or replay_profile" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# callgrind NAME TOGGLE BINARY ARGS...: runs BINARY under callgrind, counting
# only inside TOGGLE; prints the program's stdout to $work/NAME.out and the
# collected instruction count on stdout.
callgrind() {
  local name=$1 toggle=$2
  shift 2
  if ! valgrind --tool=callgrind --callgrind-out-file="$work/$name.cg" \
    --toggle-collect="$toggle" "$@" >"$work/$name.out" 2>"$work/$name.err"; then
    echo "icount: $name: the run failed:" >&2
    cat "$work/$name.out" "$work/$name.err" >&2
    exit 1
  fi
  sed -n 's/^totals: *\([0-9][0-9]*\).*/\1/p' "$work/$name.cg"
}

# per_op TOTAL OPS: instructions per operation, one decimal.
per_op() { awk -v t="$1" -v n="$2" 'BEGIN { printf "%.1f", t / n }'; }

names=()
declare -A value detail

total=$(callgrind alloc_free_pair 'alloc_free_pair::loop_pairs*' "$bin/alloc_free_pair" "$pairs")
names+=(alloc_free_pair)
value[alloc_free_pair]=$(per_op "$total" "$pairs")
detail[alloc_free_pair]="$total instructions / $pairs pairs"

total=$(callgrind replay_entry 'reservoir_replay::replay::recorded::replay_recorded*' \
  "$bin/replay_profile" "$replays")
entries=$(sed -n 's/^[0-9]* replays of \([0-9]*\) entries.*/\1/p' "$work/replay_entry.out")
if [ -z "$entries" ]; then
  echo "icount: replay_entry: replay_profile did not replay the trace (is ../shared/traces beside the repository?):" >&2
  cat "$work/replay_entry.out" "$work/replay_entry.err" >&2
  exit 1
fi
names+=(replay_entry)
value[replay_entry]=$(per_op "$total" $((replays * entries)))
detail[replay_entry]="$total instructions / ($replays replays x $entries entries)"

if [ "$update" = 1 ]; then
  {
    echo "# Instruction-count baseline for tools/icount.sh (instructions per operation,"
    echo "# valgrind --tool=callgrind on release builds, measured loop only)."
    echo "# Written by \`tools/icount.sh --update\` on $(date -u +%Y-%m-%d) at $(git rev-parse --short HEAD)"
    echo "# with $(valgrind --version) and $(rustc --version | cut -d' ' -f1-2)."
    echo "# alloc_free_pair: per 1 KiB raw_alloc + raw_free pair ($pairs pairs, warm cache)."
    echo "# replay_entry: per replayed entry of the largest shared trace ($replays replays)."
    for n in "${names[@]}"; do echo "$n ${value[$n]}"; done
  } >"$baseline"
  echo "icount: wrote $baseline:"
  grep -v '^#' "$baseline"
  exit 0
fi

[ -f "$baseline" ] || { echo "icount: $baseline is missing; run tools/icount.sh --update" >&2; exit 1; }

status=0
printf '\n%-16s %12s %12s %8s  %s\n' measurement baseline new ratio detail
for n in "${names[@]}"; do
  base=$(awk -v n="$n" '$1 == n { print $2 }' "$baseline")
  if [ -z "$base" ]; then
    echo "icount: $n has no baseline in $baseline; run tools/icount.sh --update" >&2
    status=1
    continue
  fi
  ratio=$(awk -v a="${value[$n]}" -v b="$base" 'BEGIN { printf "%.4f", a / b }')
  printf '%-16s %12s %12s %8s  %s\n' "$n" "$base" "${value[$n]}" "$ratio" "${detail[$n]}"
  if awk -v r="$ratio" -v t="$threshold" 'BEGIN { exit !(r > t) }'; then
    echo "icount: REGRESSION: $n is ${value[$n]} instructions per operation, baseline $base, ratio $ratio (more than 5 % above)" >&2
    status=1
  fi
done
if [ "$status" = 0 ]; then
  echo "icount: ok (every measurement within 5 % above its baseline)"
else
  echo "icount: failed; if the extra cost is intended, run tools/icount.sh --update and commit $baseline with the reason" >&2
fi
exit "$status"
