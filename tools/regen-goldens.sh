#!/bin/sh
# Regenerate the golden files of crates/reservoir-replay/tests/golden from the real PyTorch allocator.
#
# usage: tools/regen-goldens.sh [SUBSTR[,SUBSTR...]]
#   only re-run the traces whose name contains one of them (the other goldens are kept; the
#   manifest is always rewritten, so only do this when the other traces did not change)
#
# 1. builds the trace generator (the gen_trace example of reservoir-replay)
# 2. writes every golden trace + manifest to $WORK/traces (gen_trace write)
# 3. replays each through PyTorch 2.15's allocator on the fake device
#    (tools/oracle_replay_ext.py = ../shared/oracle/oracle_replay.py + memory fraction + stream order)
# 4. writes compact goldens to crates/reservoir-replay/tests/golden/ (tools/make_goldens.py)
#
# Needs the oracle set up (../shared/oracle/setup-torch.sh). About 4 s per trace per core.
# Environment: JOBS (parallel oracle runs, default: number of CPUs), WORK (scratch folder,
# default target/regen-goldens), RESERVOIR_ORACLE_DIR (default ../shared/oracle), KEEP_FULL=1
# (keep the oracle's full JSON output in $WORK/full for debugging).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$ROOT/target/regen-goldens}
OUT=$ROOT/crates/reservoir-replay/tests/golden
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
export RESERVOIR_ORACLE_DIR=${RESERVOIR_ORACLE_DIR:-$(cd "$ROOT/.." && pwd)/shared/oracle}

[ -x "$RESERVOIR_ORACLE_DIR/oracle-python" ] || {
  echo "regen-goldens: no oracle at $RESERVOIR_ORACLE_DIR (set RESERVOIR_ORACLE_DIR)" >&2; exit 1; }
mkdir -p "$WORK"
rm -rf "$WORK/traces"
(cd "$ROOT" && cargo run --release --quiet -p reservoir-replay --example gen_trace -- write "$WORK/traces")
set -- ${1:+--only "$1"}
[ "${KEEP_FULL:-0}" = 1 ] && set -- "$@" --keep-full
python3 "$ROOT/tools/make_goldens.py" --work "$WORK" --out "$OUT" --jobs "$JOBS" "$@"
du -sh "$OUT" | sed 's/^/regen-goldens: total size /'
