#!/bin/sh
# Regenerate the expandable-segment snapshots of
# crates/reservoir-replay/tests/replay_fidelity/expandable/ with PyTorch 2.15's real allocator on the
# oracle's fake device (expandable_segments:True, history recorded).
#
# usage: tools/regen-expandable-snapshots.sh
# Needs the oracle set up (../shared/oracle/setup-torch.sh). Environment: RESERVOIR_ORACLE_DIR
# (default ../shared/oracle, or ../../shared/oracle), WORK (scratch folder, default target/regen-expandable).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$ROOT/target/regen-expandable}
OUT=$ROOT/crates/reservoir-replay/tests/replay_fidelity/expandable
ORACLE=${RESERVOIR_ORACLE_DIR:-$(cd "$ROOT/.." && pwd)/shared/oracle}
# a git worktree one level deeper
[ -d "$ORACLE" ] || ORACLE=$(cd "$ROOT/../.." && pwd)/shared/oracle
[ -x "$ORACLE/oracle-python" ] || {
  echo "regen-expandable-snapshots: no oracle at $ORACLE (set RESERVOIR_ORACLE_DIR)" >&2; exit 1; }
rm -rf "$WORK"
mkdir -p "$WORK" "$OUT"
python3 "$ROOT/tools/gen_expandable_snapshots.py" "$WORK"
for t in "$WORK"/*.txt; do
  name=$(basename "$t" .txt)
  args=$(sed -n 's/^# oracle-args: *//p' "$t")
  # shellcheck disable=SC2086
  python3 "$ORACLE/oracle_replay.py" "$t" "$WORK/$name.json" --quiet \
    --conf expandable_segments:True --snapshot "$OUT/$name.pickle" $args
  cp "$t" "$OUT/$name.txt"
  echo "regen-expandable-snapshots: $name ($(wc -c < "$OUT/$name.pickle") bytes)"
done
