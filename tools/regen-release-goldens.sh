#!/bin/sh
# Regenerate the goldens of one other PyTorch release in
# crates/reservoir-replay/tests/golden/releases/<RELEASE>/ from that release's real allocator.
#
# usage: tools/regen-release-goldens.sh RELEASE [SUBSTR[,SUBSTR...]]     (RELEASE: 2.11 ... 2.14)
#
# Same traces as tools/regen-goldens.sh (the manifest of tests/golden, which must not change),
# run through the oracle of torch RELEASE: set it up first with
#   PYTORCH_ORACLE_HOME=$HOME/.cache/oracle-RELEASE PYTORCH_ORACLE_TORCH_VERSION=RELEASE.0 \
#     ../shared/oracle/setup-torch.sh
# Writes releases/<RELEASE>/stats_keys.json (that release's memory_stats() keys) and
# releases/<RELEASE>/traces/<name>.json (format reservoir-golden/1, `torch` = that release).
# `cargo test -p reservoir-replay --test golden release` replays each in PyTorch mode of its release.
# About 4 s per trace per core. Environment: PYTORCH_ORACLE_HOME (default
# $HOME/.cache/oracle-RELEASE), JOBS (default: number of CPUs), WORK (default
# target/regen-goldens-RELEASE), TRACES (a folder of traces `gen_trace write` already wrote, to
# skip generating them), RESERVOIR_ORACLE_DIR (default ../shared/oracle), KEEP_FULL=1.
set -eu
[ $# -ge 1 ] || { echo "usage: $0 RELEASE [SUBSTR[,SUBSTR...]]" >&2; exit 2; }
REL=$1
shift
case $REL in
  2.11|2.12|2.13|2.14) ;;
  2.15) echo "regen-release-goldens: 2.15 is tests/golden itself: use tools/regen-goldens.sh" >&2; exit 2 ;;
  *) echo "regen-release-goldens: unsupported release '$REL' (2.11 to 2.14)" >&2; exit 2 ;;
esac
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GOLDEN=$ROOT/crates/reservoir-replay/tests/golden
WORK=${WORK:-$ROOT/target/regen-goldens-$REL}
OUT=$GOLDEN/releases/$REL
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
export PYTORCH_ORACLE_HOME=${PYTORCH_ORACLE_HOME:-$HOME/.cache/oracle-$REL}
export RESERVOIR_ORACLE_DIR=${RESERVOIR_ORACLE_DIR:-$(cd "$ROOT/.." && pwd)/shared/oracle}

[ -d "$PYTORCH_ORACLE_HOME/venv" ] || {
  echo "regen-release-goldens: no oracle at $PYTORCH_ORACLE_HOME (see the usage above)" >&2; exit 1; }
mkdir -p "$WORK"
if [ -n "${TRACES:-}" ]; then
  rm -rf "$WORK/traces"
  cp -r "$TRACES" "$WORK/traces"
else
  rm -rf "$WORK/traces"
  (cd "$ROOT" && cargo run --quiet -p reservoir-replay --example gen_trace -- write "$WORK/traces")
fi
set -- ${1:+--only "$1"}
[ "${KEEP_FULL:-0}" = 1 ] && set -- "$@" --keep-full
python3 "$ROOT/tools/make_goldens.py" --work "$WORK" --out "$WORK/out" --jobs "$JOBS" "$@"
python3 - "$WORK/out" "$GOLDEN" "$OUT" "$REL" <<'PY'
import json, os, shutil, sys
src, golden, out, rel = sys.argv[1:]
with open(os.path.join(src, "manifest.json")) as f:
    made = json.load(f)
with open(os.path.join(golden, "manifest.json")) as f:
    main = json.load(f)
if made != main:
    sys.exit("regen-release-goldens: the traces differ from tests/golden/manifest.json")
os.makedirs(os.path.join(out, "traces"), exist_ok=True)
shutil.copy(os.path.join(src, "stats_keys.json"), os.path.join(out, "stats_keys.json"))
n = 0
for name in sorted(os.listdir(os.path.join(src, "traces"))):
    with open(os.path.join(src, "traces", name)) as f:
        torch = json.load(f)["torch"]
    if not (torch == rel or torch.startswith(rel + ".")):
        sys.exit(f"regen-release-goldens: {name} was made by torch {torch}, not {rel}")
    shutil.copy(os.path.join(src, "traces", name), os.path.join(out, "traces", name))
    n += 1
print(f"regen-release-goldens: {n} goldens of torch {rel} in {out}")
PY
du -sh "$OUT" | sed 's/^/regen-release-goldens: size /'
