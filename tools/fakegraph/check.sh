#!/usr/bin/env bash
# Builds the capture layer and runs its self-test inside torch on the fake
# device (needs ../shared/oracle/setup-torch.sh's venv). About 15 s.
# Prints "fakegraph: N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/../.."
lib=$(tools/fakegraph/build.sh)
# shellcheck disable=SC1091
. ../shared/oracle/env.sh
export LD_PRELOAD="$lib $LD_PRELOAD"
exec "$PYTORCH_ORACLE_PYTHON" tools/fakegraph/test_fakegraph.py
