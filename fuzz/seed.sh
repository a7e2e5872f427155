#!/bin/sh
# Build the fuzz seed corpora from the real traces in ../shared/traces
# (relative to the project root) without copying them into the repository:
# everything goes to fuzz/corpus/<target>/, which git ignores. The
# committed seeds of capi_calls and config_parser (corpus-seeds/<target>/)
# and their regressions (regressions/<target>/) are copied there too.
#
# Usage: fuzz/seed.sh [TRACES_DIR]   (default: $RESERVOIR_TRACES, else
# ../shared/traces from the project root or one of its ancestors)
# Pickles bigger than MAX bytes (default 65536) are only kept as truncated
# prefixes (the fuzzer then learns the opcode structure from the head of each
# file); the small pickles are copied whole.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
traces=${1:-${RESERVOIR_TRACES:-}}
if [ -z "$traces" ]; then
    # ../shared/traces from the project root, or shared/traces next to any
    # ancestor (git worktrees sit deeper than the main checkout).
    d=$root
    while [ "$d" != / ]; do
        if [ -d "$d/../shared/traces" ]; then traces=$d/../shared/traces; break; fi
        d=$(dirname "$d")
    done
fi
max=${MAX:-65536}
[ -n "$traces" ] && [ -d "$traces" ] || { echo "no traces dir: $traces" >&2; exit 1; }
for t in pickle_reader snapshot_loader trace_readers; do
    mkdir -p "$here/corpus/$t"
done
# committed hand-written seeds and minimized fuzzer findings
for d in "$here/hand_seeds" "$here/regressions"; do
    [ -d "$d" ] || continue
    for f in "$d"/*; do
        [ -f "$f" ] || continue
        for t in pickle_reader snapshot_loader trace_readers; do
            cp "$f" "$here/corpus/$t/"
        done
    done
done
# the targets whose inputs are not files of a format (capi_calls: call
# sequences; config_parser: settings strings): their committed seeds and
# regressions only
for t in capi_calls config_parser; do
    mkdir -p "$here/corpus/$t"
    for d in "$here/corpus-seeds/$t" "$here/regressions/$t"; do
        [ -d "$d" ] || continue
        for f in "$d"/*; do
            [ -f "$f" ] && cp "$f" "$here/corpus/$t/"
        done
    done
done
find "$traces" -type f | sort | while read -r f; do
    name=$(basename "$f")
    size=$(wc -c < "$f")
    case "$name" in
    *.pickle|*.pkl)
        for t in pickle_reader snapshot_loader; do
            if [ "$size" -le "$max" ]; then
                cp "$f" "$here/corpus/$t/$name"
            else
                head -c "$max" "$f" > "$here/corpus/$t/$name.head"
            fi
        done
        ;;
    *.json|*.log)
        if [ "$size" -le "$max" ]; then
            cp "$f" "$here/corpus/trace_readers/$name"
            cp "$f" "$here/corpus/snapshot_loader/$name"
        else
            head -c "$max" "$f" > "$here/corpus/trace_readers/$name.head"
        fi
        ;;
    esac
done
for t in pickle_reader snapshot_loader trace_readers capi_calls config_parser; do
    echo "$t: $(ls "$here/corpus/$t" | wc -l) seeds"
done
