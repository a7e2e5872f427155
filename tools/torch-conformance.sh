#!/usr/bin/env bash
# PyTorch's own memory tests (../shared/torch-tests) on the fake CUDA device,
# natively and on Reservoir in three modes (tools/torch_conformance.py says
# how). Needs the venv and wheel of tools/torch-proof.sh (run it first, or
# pass --build to build and install the wheel here).
# CUDA graph capture comes from tools/fakegraph (built here, preloaded ahead
# of the fake runtime).
# Usage: tools/torch-conformance.sh [--build] [torch_conformance.py args...]
set -euo pipefail
cd "$(dirname "$0")/.."
oracle_home=${PYTORCH_ORACLE_HOME:-$HOME/.cache/pytorch-oracle}
oracle_venv=${PYTORCH_ORACLE_VENV:-$oracle_home/venv}
venv=${RESERVOIR_TORCH_VENV:-$HOME/.cache/reservoir-torch/venv}
if [ "${1:-}" = "--build" ]; then
  shift
  tools/torch-proof.sh --build-only
fi
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import reservoir.torch' 2>/dev/null; then
  echo "torch-conformance: no venv with torch and the reservoir wheel at $venv: run tools/torch-proof.sh first" >&2
  exit 2
fi
# PyTorch's test files need pytest and expecttest (torch.testing._internal);
# pytest-timeout ends a hung test.
"$venv/bin/python" -c 'import pytest, expecttest, pytest_timeout' 2>/dev/null ||
  "$venv/bin/pip" install --quiet 'pytest>=7,<9' 'expecttest>=0.2' 'pytest-timeout>=2'
export PYTORCH_ORACLE_VENV=$oracle_venv
# shellcheck disable=SC1091
. ../shared/oracle/env.sh
# CUDA stream capture on the fake device (tools/fakegraph): ahead of the fake
# libcudart.so.13, for the native runs and the Reservoir runs alike, so that
# torch's CUDA-graph memory tests run instead of being refused.
# RESERVOIR_CONFORMANCE_NO_FAKEGRAPH=1 leaves it out (to see the difference).
if [ "${RESERVOIR_CONFORMANCE_NO_FAKEGRAPH:-0}" != 1 ]; then
  fakegraph=$(tools/fakegraph/build.sh)
  export LD_PRELOAD="$fakegraph $LD_PRELOAD"
  echo "torch-conformance: graph capture by $fakegraph (tools/fakegraph)"
else
  echo "torch-conformance: no graph capture layer (RESERVOIR_CONFORMANCE_NO_FAKEGRAPH=1)"
fi
export PYTHONUNBUFFERED=1
exec "$venv/bin/python" tools/torch_conformance.py --python "$venv/bin/python" "$@"
