#!/usr/bin/env bash
# PyTorch on Reservoir, proven inside real torch 2.15 on the fake CUDA device
# (../shared/oracle, full path: run ../shared/oracle/setup-torch.sh first).
#
# 1. builds the reservoir wheel (crates/reservoir-python) (maturin, release) into target/wheels;
# 2. installs it into a venv derived from the oracle venv (a .pth file makes
#    the oracle's torch visible; the oracle venv itself is left alone);
# 3. runs crates/reservoir-python/tests/test_smoke.py (the package's API) and
#    crates/reservoir-python/tests/test_in_torch.py (the proof: training on two
#    streams, a real trace replayed through tensors, the fake driver's call
#    log, memory_stats against Reservoir's own replay, _memory_viz, and the
#    sanitizer run with its negative control) and
#    crates/reservoir-python/tests/test_native_api.py (torch's own memory API
#    answered by Reservoir: the same program under torch's native allocator
#    and under Reservoir, compared claim by claim, in PyTorch mode, with
#    expandable segments and under the reservoir policy) and
#    crates/reservoir-python/tests/test_face_modes.py (multi-stream
#    programs and the rest of torch's memory API in all three modes) and
#    crates/reservoir-python/tests/test_graphs.py (CUDA graphs in all three
#    modes, with the capture layer tools/fakegraph preloaded) and
#    crates/reservoir-python/tests/test_face_prebuilt.py (the wheel's
#    prebuilt C++ face: its fallbacks, and enable() in a fresh venv with no
#    compiler on PATH).
#
# The wheel carries the C++ face compiled against this torch
# (tools/build-face.py, run before maturin).
#
# Prints lines starting "torch proof" and closes with "torch-proof: N passed, M failed".
# Usage: tools/torch-proof.sh [--skip-build | --build-only]
# RESERVOIR_PREBUILT_DEBUG=1 runs target/debug/reservoir and
# target/debug/examples/oracle_trace_stats as `cargo build --workspace --bins
# --examples` left them (CI), instead of `cargo run -p` of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
oracle_home=${PYTORCH_ORACLE_HOME:-$HOME/.cache/pytorch-oracle}
oracle_venv=${PYTORCH_ORACLE_VENV:-$oracle_home/venv}
venv=${RESERVOIR_TORCH_VENV:-$HOME/.cache/reservoir-torch/venv}

if [ ! -x "$oracle_venv/bin/python" ] || [ ! -e "$oracle_home/lib/libcublas.so.13" ]; then
  echo "torch-proof: the torch oracle is not set up: run ../shared/oracle/setup-torch.sh" >&2
  exit 2
fi

# The derived venv: the oracle's interpreter, the oracle's site-packages via a
# .pth file, and maturin of its own.
if [ ! -x "$venv/bin/python" ]; then
  "$oracle_venv/bin/python" -m venv "$venv"
fi
oracle_site=$("$oracle_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$oracle_site" >"$site/pytorch_oracle.pth"
if ! "$venv/bin/maturin" --version >/dev/null 2>&1; then
  "$venv/bin/pip" install --quiet 'maturin>=1.5,<2'
fi
# ninja builds reservoir.torch's C++ face (torch.utils.cpp_extension) on the first enable().
"$venv/bin/python" -c 'import ninja' 2>/dev/null || "$venv/bin/pip" install --quiet ninja

if [ "${1:-}" != "--skip-build" ]; then
  # The C++ face compiled against this torch, into the package (.gitignore'd)
  # where maturin takes it into the wheel: enable() loads it with no compiler
  # when the running torch matches (tools/build-face.py).
  echo "torch-proof: prebuilding the C++ face (tools/build-face.py)"
  "$venv/bin/python" tools/build-face.py
  echo "torch-proof: building the wheel (maturin build --release --locked)"
  rm -f target/wheels/reservoir_allocator-*.whl
  (cd crates/reservoir-python && "$venv/bin/maturin" build --release --locked --quiet -o "$root/target/wheels")
  "$venv/bin/pip" install --quiet --force-reinstall --no-deps target/wheels/reservoir_allocator-*.whl
fi
if [ "${1:-}" = "--build-only" ]; then
  echo "torch-proof: the wheel is installed in $venv (--build-only: nothing run)"
  exit 0
fi

# The proof's trace: a real one, in the oracle's text format, and Reservoir's
# own replay of it on the simulated device (the fake device's capacity).
# (Debug builds: they compile in a fraction of the release time and the
# replay takes well under a second.)
snapshot=${RESERVOIR_PROOF_SNAPSHOT:-../shared/traces/cs336-bcrafton/06f51ae4_memory_snapshot.pickle}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# RESERVOIR_PREBUILT_DEBUG=1 (CI): the workspace's debug command and examples
# are built (`cargo build --workspace --bins --examples`, what `cargo test
# --workspace` compiled): run them from target/debug. A `cargo run -p` of its
# own resolves the package's own features and compiles most of the graph again.
if [ "${RESERVOIR_PREBUILT_DEBUG:-0}" = 1 ]; then
  reservoir_cmd=(target/debug/reservoir)
  trace_stats=(target/debug/examples/oracle_trace_stats)
  # The proof's `reservoir replay` (crates/reservoir-python/tests/test_native_api.py).
  RESERVOIR_PROOF_REPLAY_BIN=${RESERVOIR_PROOF_REPLAY_BIN:-$root/target/debug/reservoir}
  export RESERVOIR_PROOF_REPLAY_BIN
else
  reservoir_cmd=(cargo run --locked -q -p reservoir-cli --)
  trace_stats=(cargo run --locked -q -p reservoir-python --example oracle_trace_stats --)
fi
"${reservoir_cmd[@]}" convert "$snapshot" --oracle-trace "$work/trace.txt"
"${trace_stats[@]}" "$work/trace.txt" "${FAKECUDA_TOTAL_MEM:-85045870592}" >"$work/sim.json"
export RESERVOIR_PROOF_SOURCE=$snapshot RESERVOIR_PROOF_TRACE=$work/trace.txt RESERVOIR_PROOF_SIM_STATS=$work/sim.json

# The fake CUDA stack (what ../shared/oracle/env.sh sets), with our python.
export PYTORCH_ORACLE_VENV=$oracle_venv
# shellcheck disable=SC1091
. ../shared/oracle/env.sh
export PYTHONUNBUFFERED=1
py="$venv/bin/python"
export RESERVOIR_PROOF_PYTHON=$py

passed=0
failed=0
run() {
  local name=$1
  shift
  echo "torch-proof: $name"
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "torch-proof: $name FAILED"; fi
}
run smoke "$py" crates/reservoir-python/tests/test_smoke.py
run proof "$py" crates/reservoir-python/tests/test_in_torch.py
run face "$py" crates/reservoir-python/tests/test_face.py
# The wheel's prebuilt face (issue 43): which face face() takes for a matching
# manifest and for each mismatch (cpp_extension stubbed); then a FRESH venv
# with the oracle's torch, the wheel, and a PATH holding only its bin (python
# and pip: no compiler, no ninja; CXX and CC point nowhere, an empty extension
# cache, cpp_extension.load replaced by a function that fails):
# enable() and a tensor on the fake device, the line
# "torch-proof face: prebuilt face loaded without a compiler (...)".
run prebuilt-fallback "$py" crates/reservoir-python/tests/test_face_prebuilt.py fallback
no_compiler() {
  local nc=$root/target/torch-proof/no-compiler wheel
  wheel=$(ls -t "$root"/target/wheels/reservoir_allocator-*.whl | head -n 1)
  rm -rf "$nc" && mkdir -p "$nc/ext" || return 1
  "$oracle_venv/bin/python" -m venv "$nc/venv" || return 1
  echo "$oracle_site" >"$("$nc/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/pytorch_oracle.pth"
  "$nc/venv/bin/pip" install --quiet --no-deps --disable-pip-version-check "$wheel" || return 1
  # PATH: the venv's bin alone (python, pip; the test checks no c++, g++,
  # gcc, cc, clang or ninja is found on it).
  env PATH="$nc/venv/bin" CXX=/nonexistent/c++ CC=/nonexistent/cc TORCH_EXTENSIONS_DIR="$nc/ext" \
    RESERVOIR_FACE_PREBUILT=1 "$nc/venv/bin/python" crates/reservoir-python/tests/test_face_prebuilt.py no-compiler
}
run prebuilt-no-compiler no_compiler
# torch's own memory API on Reservoir against torch's native allocator (issue
# 32): the same program under each; lines "torch proof native ...". Its
# `reservoir replay` is the debug binary built above for `convert`.
export RESERVOIR_PROOF_REPLAY_BIN=$root/target/debug/reservoir
run native-api "$py" crates/reservoir-python/tests/test_native_api.py
# Every mode a user can turn on (issue 40): multi-stream programs with the
# race sanitizer, GPU trace hooks, torch.accelerator, run-time settings, the
# CUDA Sanitizer; "modes: N passed, M failed".
run modes "$py" crates/reservoir-python/tests/test_face_modes.py
# CUDA graphs inside torch (issue 40, item 3), with the project's capture
# layer (tools/fakegraph) ahead of the fake runtime, for this run only:
# private pools, pool sharing, make_graphed_callables, checkPoolLiveAllocations,
# checkpoint/restore, OOM during capture; "graphs: N passed, M failed".
graphs() {
  local lib
  lib=$(tools/fakegraph/build.sh) || return 1
  LD_PRELOAD="$lib $LD_PRELOAD" "$py" crates/reservoir-python/tests/test_graphs.py
}
run graphs graphs
echo "torch-proof: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
