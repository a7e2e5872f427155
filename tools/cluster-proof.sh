#!/usr/bin/env bash
# reservoir.compare(..., executor=) on a real cluster engine (issue 43):
# a Dask LocalCluster of two worker processes on this machine.
#
# 1. uses the torch venv (RESERVOIR_TORCH_VENV, default
#    ~/.cache/reservoir-torch/venv), where tools/torch-proof.sh installs the
#    wheel of this tree, and pip installs dask and distributed into it when
#    they are not importable (idempotent);
# 2. runs tools/cluster_proof.py there: compare over the shared traces
#    (../shared/traces, linked, never copied) and 300 generated per-rank
#    folders on the cluster, equal to the one-process run; again with one
#    worker SIGKILLed mid-run (Dask's allowed-failures 0, so reservoir's
#    retry is what saves the tasks), complete and equal; and the
#    inputs-per-second / memory table ("cluster-proof bench:" lines,
#    BENCHMARKS.md "Many inputs on a cluster engine").
# Ends with "cluster-proof: N passed, M failed" (exit status 1 if any failed).
# Usage: tools/cluster-proof.sh [cluster_proof.py options: --ranks N, --no-shared, --out DIR]
# Ray's local mode is not run: see BENCHMARKS.md (its wheel is not installed here).
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${RESERVOIR_TORCH_VENV:-$HOME/.cache/reservoir-torch/venv}
if [ ! -x "$venv/bin/python" ]; then
  echo "cluster-proof: no venv at $venv (tools/torch-proof.sh --build-only makes it)"
  echo "cluster-proof: 0 passed, 1 failed"
  exit 1
fi
if ! "$venv/bin/python" -c 'import dask.distributed' 2>/dev/null; then
  echo "cluster-proof: installing dask and distributed into $venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check dask distributed || {
    echo "cluster-proof: pip install dask distributed failed"
    echo "cluster-proof: 0 passed, 1 failed"
    exit 1
  }
fi
exec "$venv/bin/python" tools/cluster_proof.py "$@"
