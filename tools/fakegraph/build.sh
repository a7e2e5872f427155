#!/usr/bin/env bash
# Builds the CUDA stream-capture layer for the fake device (fakegraph.cpp;
# README.md) into a cache folder, idempotently and without network: the CUDA
# headers are those ../shared/oracle/build-driver.sh already unpacked into
# $PYTORCH_ORACLE_HOME/cuda-headers. Rebuilds only when the sources, the
# flags or the compiler change (a stamp of their hash).
#
# Prints the library's path on stdout (everything else on stderr):
#   lib=$(tools/fakegraph/build.sh) && export LD_PRELOAD="$lib $LD_PRELOAD"
# The library must come BEFORE the fake libcudart.so.13 in LD_PRELOAD.
#
# Env: RESERVOIR_FAKEGRAPH_DIR (default $HOME/.cache/reservoir-fakegraph),
# PYTORCH_ORACLE_HOME (default $HOME/.cache/pytorch-oracle), CXX (default g++).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
oracle_home=${PYTORCH_ORACLE_HOME:-$HOME/.cache/pytorch-oracle}
out=${RESERVOIR_FAKEGRAPH_DIR:-$HOME/.cache/reservoir-fakegraph}
cxx=${CXX:-g++}
headers=$oracle_home/cuda-headers
if [ ! -e "$headers/cuda_runtime_api.h" ]; then
  echo "fakegraph: no CUDA headers at $headers: run ../shared/oracle/build-driver.sh first" >&2
  exit 2
fi
flags=(-std=c++17 -O2 -g -fPIC -shared -Wall -Wextra -Wno-unused-parameter -I"$headers"
  -Wl,--version-script="$here/fakegraph.map" -Wl,-soname,libfakegraph.so)
stamp=$( (cat "$here/fakegraph.cpp" "$here/fakegraph.map"; echo "${flags[*]}"; "$cxx" --version | head -n 1) | sha256sum | cut -c1-16)
lib=$out/libfakegraph.so
if [ -e "$lib" ] && [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$lib"
  exit 0
fi
mkdir -p "$out"
tmp=$(mktemp "$out/libfakegraph.so.XXXXXX")
trap 'rm -f "$tmp"' EXIT
"$cxx" "${flags[@]}" -o "$tmp" "$here/fakegraph.cpp" -ldl >&2
mv -f "$tmp" "$lib"
echo "$stamp" >"$out/stamp"
echo "fakegraph: built $lib" >&2
echo "$lib"
