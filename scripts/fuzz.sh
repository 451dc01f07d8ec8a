#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 300) over its corpus in
# fuzz/corpus/<target>/ (new inputs go to a scratch dir, not the repo).
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-300}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for f in "$root"/fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi
for t in "${targets[@]}"; do
    bin="$root/build-fuzz/fuzz/$t"
    [ -x "$bin" ] || { echo "missing $bin (build with CC=clang -DLMX_FUZZ=ON)"; exit 1; }
    scratch=$(mktemp -d)
    mkdir -p "$root/fuzz/corpus/$t"
    echo "-- $t for ${secs}s"
    "$bin" -max_total_time="$secs" -rss_limit_mb=4096 -timeout=30 -print_final_stats=1 \
        -artifact_prefix="$scratch/" "$scratch" "$root/fuzz/corpus/$t" 2>&1 | tail -n 12
    rm -rf "$scratch"
done
