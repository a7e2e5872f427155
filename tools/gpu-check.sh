#!/usr/bin/env bash
# The real-GPU check of issue 32 (item 3): Reservoir on one NVIDIA H100/H200
# with Python 3.12 and torch (2.11 on the machines lent here), no Rust, at
# most 8 minutes. What it runs comes prebuilt from tools/gpu-pack.sh (the
# folder target/gpu-pack, carried there). Stages, each timed and bounded by
# `timeout`; a failed stage is recorded and the next one still runs:
#   env               torch's version, CUDA, the device, the driver
#   integrity         reservoir-cuda's integrity runs on the driver (plain and
#                     expandable segments on cuMemAlloc / cuMemCreate+cuMemMap,
#                     cross-stream reuse, the reservoir policy, the MPS heap,
#                     virtual memory, events, IPC between two processes)
#   wheel             the reservoir wheel unpacked onto PYTHONPATH, imported
#   proof             crates/reservoir-python/tests/test_native_api.py (issue
#                     32 item 2's proof), where present
#   train-native      a small transformer trained with torch's allocator,
#   train-reservoir   and with Reservoir (PyTorch mode of the running torch:
#                     `policy:pytorch-X.Y`), same seed; train-compare: losses
#                     equal step by step, memory_stats equal key by key, the
#                     steps/s ratio and ns per torch.empty
#   record-*          real snapshots with torch's native allocator of what
#                     ../shared/traces lacks: streams (record_stream), graph
#                     (torch.cuda.graph's private pool), expandable
#                     (expandable_segments:True), mempool (torch.cuda.MemPool)
#   replay            `reservoir replay` of those snapshots in the mode of the
#                     torch that recorded them: the fidelity
#   conformance       PyTorch's own memory tests (../shared/torch-tests, in
#                     the pack's conformance/) natively and on Reservoir in
#                     three modes (tools/torch_conformance.py): on a real GPU
#                     the CUDA-graph tests run too; the dry run runs two
#                     tests (CI's own step runs the whole suite on the fake)
# Output (OUT: --out DIR, else $OUT where set, as on the device machine, else
# target/gpu-check-out or target/gpu-check-dry): summary.json, summary.txt,
# gpu-check.log (everything printed) and details.tar.gz (every stage's log
# and JSON, the snapshots), rewritten after every stage so that a run cut
# short still leaves them. The details folder itself is removed at the end
# when OUT is the device machine's $OUT (it returns at most 8 files).
#
# Usage:
#   tools/gpu-pack.sh && tools/gpu-check.sh        # on the GPU machine: carry target/gpu-pack
#   tools/gpu-check.sh --dry-run                   # here and in CI: the fake driver of
#                                                  # ../shared/oracle, torch 2.15 (oracle venv)
# Options: --pack DIR (default target/gpu-pack; the dry run makes its own from
# target/wheels and a debug build of the integrity example when absent),
# --out DIR, --steps N (training steps; 300, dry run 8), --python PY,
# --budget S (seconds for all the stages, default 540: a stage's limit is
# cut to what is left, and stages past the budget fail unrun, so that the
# summary is written inside the device machine's 10 minutes a command), --skip
# STAGE[,STAGE...] (recorded as skipped; CI skips `proof`, which
# tools/torch-proof.sh runs just before).
# Closes with "gpu-check: N passed, M failed" ("gpu-check dry-run: ..." in the
# dry run); exit status 1 when a stage failed.
set -u -o pipefail
cd "$(dirname "$0")/.."
root=$PWD
t_start=$SECONDS

dry=0
pack=""
out=""
steps=""
py=""
budget=540
skip=","
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=1; shift ;;
    --pack) pack=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --python) py=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --skip) skip="$skip$2,"; shift 2 ;;
    *) echo "gpu-check: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done

device_out=0
if [ -z "$out" ]; then
  if [ -n "${OUT:-}" ]; then out=$OUT; device_out=1
  elif [ "$dry" = 1 ]; then out=target/gpu-check-dry
  else out=target/gpu-check-out; fi
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
details=$out/details
rm -rf "$details" "$out/details.tar.gz" "$out/summary.json" "$out/summary.txt"
mkdir -p "$details/snapshots"
exec > >(tee "$out/gpu-check.log") 2>&1
label="gpu-check"
[ "$dry" = 1 ] && label="gpu-check dry-run"
echo "$label: started $(date -u +%Y-%m-%dT%H:%M:%SZ) in $root, output in $out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- the environment: the fake driver (dry run) or the machine's own -------
if [ "$dry" = 1 ]; then
  oracle_home=${PYTORCH_ORACLE_HOME:-$HOME/.cache/pytorch-oracle}
  export PYTORCH_ORACLE_VENV=${PYTORCH_ORACLE_VENV:-$oracle_home/venv}
  if [ ! -e "$oracle_home/lib/libcublas.so.13" ]; then
    echo "$label: the torch oracle is not set up: run ../shared/oracle/setup-torch.sh" >&2
    exit 2
  fi
  # shellcheck disable=SC1091
  . ../shared/oracle/env.sh
  if [ -z "$py" ]; then
    venv=${RESERVOIR_TORCH_VENV:-$HOME/.cache/reservoir-torch/venv}
    if [ -x "$venv/bin/python" ]; then py=$venv/bin/python; else py=$PYTORCH_ORACLE_VENV/bin/python; fi
  fi
  steps=${steps:-8}
  export GPU_CHECK_DRY_RUN=1
  integrity_args=(--ops 800 --event-mib 16)
  empty_calls=2000
else
  py=${py:-python3}
  steps=${steps:-300}
  integrity_args=()
  empty_calls=20000
fi
export PYTHONUNBUFFERED=1
export PYTHONDONTWRITEBYTECODE=1

if [ -z "$pack" ]; then
  pack=target/gpu-pack
  if [ "$dry" = 1 ] && [ ! -x "$pack/bin/gpu_integrity" ]; then
    # The dry run's own pack: the wheel tools/torch-proof.sh built and a
    # debug build of the integrity example (cargo test built its deps).
    pack=$work/pack
    mkdir -p "$pack/bin" "$pack/wheels"
    echo "$label: making a pack from target/wheels and debug builds"
    # (RESERVOIR_PREBUILT_DEBUG=1, CI: built with the workspace's selection,
    # tools/torch-proof.sh says why.)
    if [ "${RESERVOIR_PREBUILT_DEBUG:-0}" = 1 ] || cargo build --locked -q -p reservoir-cuda --example gpu_integrity; then
      cp target/debug/examples/gpu_integrity "$pack/bin/"
    fi
    if [ -x target/debug/reservoir ]; then cp target/debug/reservoir "$pack/bin/"; fi
    cp target/wheels/reservoir_allocator-*.whl "$pack/wheels/" 2>/dev/null ||
      echo "$label: no wheel in target/wheels (tools/torch-proof.sh builds it)"
    tools/gpu-pack.sh --out "$pack" --conformance-only ||
      echo "$label: could not pack the conformance suite (tools/gpu-pack.sh --conformance-only)"
  fi
fi
pack=$(cd "$pack" 2>/dev/null && pwd || echo "$pack")
[ -e "$pack/MANIFEST.txt" ] && cp "$pack/MANIFEST.txt" "$details/pack-MANIFEST.txt"

# --- stages ------------------------------------------------------------------
passed=0
failed=0
skipped=0
bundle() {
  tar -czf "$out/details.tar.gz.tmp" -C "$out" details 2>/dev/null &&
    mv "$out/details.tar.gz.tmp" "$out/details.tar.gz"
}
# stage NAME LIMIT_S NOTE CMD...: runs CMD with its output in details/NAME.log
# (and shown); exit 77 means skipped (the last line printed says why).
stage() {
  local name=$1 limit=$2 note=$3
  shift 3
  local t0=$SECONDS rc status left=$((budget - (SECONDS - t_start)))
  if [[ $skip == *",$name,"* ]]; then
    echo "$label: $name: skipped (--skip)"
    printf '%s\t%s\t0\t77\t%s\n' "$name" skipped "skipped by --skip" >>"$details/stages.tsv"
    skipped=$((skipped + 1))
    return
  fi
  if [ "$left" -lt 15 ]; then
    # A check that did not run is not a pass.
    echo "$label: $name: FAILED: not run, the budget of ${budget}s is spent"
    printf '%s\t%s\t0\t124\t%s\n' "$name" FAILED "not run: the budget of ${budget}s was spent" >>"$details/stages.tsv"
    failed=$((failed + 1))
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "$label: == $name (limit ${limit}s, at $((SECONDS - t_start))s)"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$details/$name.log"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) status=ok; passed=$((passed + 1)) ;;
    77) status=skipped; skipped=$((skipped + 1)); note=$(tail -n 1 "$details/$name.log") ;;
    124 | 137) status=FAILED; failed=$((failed + 1)); note="timed out after ${limit}s; $note" ;;
    *) status=FAILED; failed=$((failed + 1)); note="exit $rc; $note" ;;
  esac
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - t0))" "$rc" "${note//$'\t'/ }" >>"$details/stages.tsv"
  echo "$label: $name: $status ($((SECONDS - t0)) s)"
  bundle
}
gpu=tools/gpu

stage env 120 "torch and the device" "$py" $gpu/env_info.py "$details/env.json" "$([ "$dry" = 1 ] && echo dry-run || echo gpu)"
torch_version=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["torch"])' "$details/env.json" 2>/dev/null || echo unknown)
echo "$label: torch $torch_version"

if [ "$dry" = 1 ]; then
  # The fake's asynchronous streams and race sanitizer: the integrity runs
  # must give no report.
  stage integrity 120 "fake driver, async, sanitizer" env FAKECUDA_ASYNC=1 FAKECUDA_SANITIZE=1 \
    "$pack/bin/gpu_integrity" "${integrity_args[@]}"
else
  stage integrity 150 "real driver" "$pack/bin/gpu_integrity" "${integrity_args[@]}"
fi

# A fixed place (under target/, ignored by git), with the wheel's file
# times: the C++ face compiled from it once is found again by the next run.
site=$root/target/gpu-check-site
# shellcheck disable=SC2016
stage wheel 120 "unpacked onto PYTHONPATH" bash -c 'set -e
  "$1" tools/gpu/unpack.py "$(ls "$2"/wheels/reservoir_allocator-*.whl)" "$3"
  PYTHONPATH=$3 "$1" -c "import reservoir, reservoir._native; print(\"reservoir\", reservoir.__version__, \"from\", reservoir.__file__)"' \
  _ "$py" "$pack" "$site"
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}

# The C++ face (reservoir.torch.face(), where this reservoir has it): the
# wheel's prebuilt face when this torch matches its manifest (the same torch
# version, commit, C++ ABI and Python as the release build's), else compiled
# against the running torch on first use and cached (by torch version and
# source content) in ~/.cache/reservoir/torch-ext or $TORCH_EXTENSIONS_DIR:
# loaded or compiled here, timed, so the later stages find it; the line says
# which (reservoir.torch.face_info()).
# shellcheck disable=SC2016
stage face 300 "the C++ face for this torch (prebuilt or compiled, cached)" "$py" -c 'import sys, time
import reservoir.torch as rt
if not hasattr(rt, "face"):
    print("face: skipped: this reservoir has no C++ face (enable() is the CUDAPluggableAllocator route)")
    sys.exit(77)
t = time.time()
m = rt.face()
info = rt.face_info() if hasattr(rt, "face_info") else {}
origin, reason = info.get("origin", "built"), info.get("reason", "")
print(f"face: {m.__file__} ready in {time.time() - t:.1f} s ({origin}: {reason})")'

proof_test=crates/reservoir-python/tests/test_native_api.py
if [ -e "$proof_test" ]; then
  stage proof 240 "torch's own memory API, native vs Reservoir" env RESERVOIR_PROOF_PYTHON="$py" \
    RESERVOIR_PROOF_REPLAY_BIN="$pack/bin/reservoir" "$py" "$proof_test"
else
  stage proof 10 "" bash -c "echo 'proof: skipped: $proof_test is not on this branch'; exit 77"
fi

stage train-native 200 "$steps steps" "$py" $gpu/train.py run native "$details/train-native.json" --steps "$steps" --empty-calls $empty_calls
stage train-reservoir 200 "$steps steps" "$py" $gpu/train.py run reservoir "$details/train-reservoir.json" --steps "$steps" --empty-calls $empty_calls
stage train-compare 60 "losses, memory_stats, speed" "$py" $gpu/train.py compare "$details/train-native.json" "$details/train-reservoir.json" "$details/train-compare.json"

for scenario in streams graph expandable mempool; do
  stage "record-$scenario" 120 "native torch snapshot" "$py" $gpu/record.py "$scenario" "$details/snapshots"
done
if [ -x "$pack/bin/reservoir" ]; then
  exact=()
  # The dry run (torch 2.15, the release Reservoir's goldens follow) requires
  # every snapshot exact (`--known NAME=REASON` would name a limit of
  # docs/limits.md; there is none now).
  [ "$dry" = 1 ] && exact=(--require-exact)
  stage replay 240 "reservoir replay of the recorded snapshots" "$py" $gpu/replay.py "$pack/bin/reservoir" \
    "$details/snapshots" "$torch_version" "$details/replay.json" "${exact[@]}"
else
  stage replay 10 "" bash -c "echo 'replay: skipped: no reservoir binary in $pack/bin'; exit 77"
fi

# PyTorch's memory tests, natively and on Reservoir in three modes. Their
# pure-Python needs (pytest, expecttest, pytest-timeout) come as wheels in
# the pack, unpacked onto PYTHONPATH (the machine's torch install is left
# alone). Two processes at a time: the tests measure the one GPU's memory.
if [ -d "$pack/conformance/torch-tests" ]; then
  conf_args=(--jobs 2)
  [ "$dry" = 1 ] && conf_args+=(--tests TestCudaUpstreamHead)
  # shellcheck disable=SC2016
  stage conformance 300 "PyTorch's memory tests, native vs Reservoir in three modes" bash -c 'set -e
    py=$1 c=$2/conformance site=$3; shift 3
    for w in "$c"/wheels/*.whl; do "$py" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$w" "$site"; done
    PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} "$py" "$c/torch_conformance.py" --python "$py" \
      --tests-dir "$c/torch-tests" --known "$c/torch-conformance-known.txt" "$@"' \
    _ "$py" "$pack" "$work/conformance-site" "${conf_args[@]}" --json "$details/conformance.json"
else
  stage conformance 10 "" bash -c "echo 'conformance: skipped: the pack has no conformance/ (tools/gpu-pack.sh makes it)'; exit 77"
fi

# --- summary -----------------------------------------------------------------
"$py" $gpu/summarize.py "$details" "$out" || echo "$label: the summary failed"
bundle
if [ "$device_out" = 1 ]; then rm -rf "$details"; fi
echo "$label: output in $out ($(ls "$out" | tr '\n' ' ')), $((SECONDS - t_start)) s in all"
echo "$label: $passed passed, $failed failed ($skipped skipped)"
[ "$failed" -eq 0 ]
