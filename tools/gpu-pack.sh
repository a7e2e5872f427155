#!/usr/bin/env bash
# Builds here what tools/gpu-check.sh needs on a GPU machine that has no Rust
# (issue 32 item 3) into one folder, target/gpu-pack by default (ignored by
# git; carried to the device machine as the `carry` path `target/gpu-pack`):
#   bin/gpu_integrity   reservoir-cuda's integrity runs (example gpu_integrity,
#                       release, stripped): plain and expandable segments,
#                       events, IPC between two processes, on the real driver;
#   bin/reservoir       the CLI (release, stripped), to replay the snapshots
#                       recorded there (`reservoir replay`);
#   wheels/*.whl        the reservoir wheel (crates/reservoir-python, maturin,
#                       release, abi3: Python 3.12 there, 3.11 here);
#   conformance/        PyTorch's memory tests (../shared/torch-tests), their
#                       runner (tools/torch_conformance.py) and its list of
#                       known differences, and wheels/ with pytest,
#                       expecttest and pytest-timeout (pure Python, from the
#                       package index): gpu-check.sh's `conformance` stage;
#   MANIFEST.txt        commit, files, sizes.
# The folder must stay well under 64 MiB together with the repository's
# tracked files (about 27 MiB): the script fails above 30 MiB.
#
# Usage: tools/gpu-pack.sh [--out DIR] [--reuse-wheel] [--conformance-only]
#   --reuse-wheel       take target/wheels/reservoir_allocator-*.whl (as
#                       tools/torch-proof.sh built it) instead of building it.
#   --conformance-only  write DIR/conformance only (gpu-check.sh's dry run
#                       makes the rest of its pack from debug builds).
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/gpu-pack
reuse_wheel=0
conformance_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --reuse-wheel) reuse_wheel=1; shift ;;
    --conformance-only) conformance_only=1; shift ;;
    *) echo "gpu-pack: unknown argument $1" >&2; exit 2 ;;
  esac
done
venv=${RESERVOIR_TORCH_VENV:-$HOME/.cache/reservoir-torch/venv}
maturin=${MATURIN:-$venv/bin/maturin}

# conformance/: the tests, the runner, and the pure-Python packages the
# tests need that a GPU machine's torch install may lack.
pack_conformance() {
  local c=$out/conformance pip=(python3 -m pip)
  [ -x "$venv/bin/pip" ] && pip=("$venv/bin/pip")
  rm -rf "$c"
  mkdir -p "$c/wheels"
  cp tools/torch_conformance.py tools/torch-conformance-known.txt "$c/"
  cp -r ../shared/torch-tests "$c/torch-tests"
  "${pip[@]}" download --quiet --no-deps --only-binary=:all: --dest "$c/wheels" \
    'pytest>=7,<9' 'pluggy>=1.5,<2' 'iniconfig>=1' 'packaging>=20' 'expecttest>=0.2' 'pytest-timeout>=2'
}
if [ "$conformance_only" = 1 ]; then
  echo "gpu-pack: PyTorch's memory tests, their runner and pytest into $out/conformance"
  pack_conformance
  exit 0
fi
rm -rf "$out"
mkdir -p "$out/bin" "$out/wheels"

echo "gpu-pack: building gpu_integrity and the CLI (cargo build --release --locked)"
cargo build --release --locked -q -p reservoir-cuda --example gpu_integrity
cargo build --release --locked -q -p reservoir-cli --bin reservoir
cp target/release/examples/gpu_integrity target/release/reservoir "$out/bin/"
strip "$out/bin/gpu_integrity" "$out/bin/reservoir"

if [ "$reuse_wheel" = 0 ]; then
  echo "gpu-pack: building the wheel (maturin build --release --locked)"
  command -v "$maturin" >/dev/null 2>&1 || maturin=maturin
  rm -f target/wheels/reservoir_allocator-*.whl
  (cd crates/reservoir-python && "$maturin" build --release --locked --quiet -o "$PWD/../../target/wheels")
fi
set -- target/wheels/reservoir_allocator-*.whl
if [ ! -e "$1" ] || [ $# -ne 1 ]; then
  echo "gpu-pack: expected one target/wheels/reservoir_allocator-*.whl, found: $*" >&2
  exit 1
fi
cp "$1" "$out/wheels/"
echo "gpu-pack: PyTorch's memory tests, their runner and pytest (conformance/)"
pack_conformance

{
  echo "gpu-pack of $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
  (cd "$out" && find . -type f ! -name MANIFEST.txt -printf '%P %s bytes\n' | sort)
} >"$out/MANIFEST.txt"
kib=$(du -sk "$out" | cut -f1)
cat "$out/MANIFEST.txt"
echo "gpu-pack: $out is $((kib / 1024)) MiB ($kib KiB)"
if [ "$kib" -gt $((30 * 1024)) ]; then
  echo "gpu-pack: over 30 MiB: with the repository it would not fit the 64 MiB that travels" >&2
  exit 1
fi
