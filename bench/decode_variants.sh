#!/usr/bin/env bash
# On the GPU machine: decode tok/s of one synthetic model under build
# variants (the LMX_GEMV_*, LMX_PDL_EARLY and LMX_DEC_* macros of the CUDA
# sources), each built into its own directory, all run on the same
# checkpoint in one go.
#   bench/decode_variants.sh MODEL 'NAME:FLAGS' ...
# e.g. bench/decode_variants.sh qwen3-8b 'base:' 'w8:-DLMX_GEMV_WARPS=8'
# (BENCH_ARGS go to gpu_bench, e.g. "--quant q4 --depth 0,4096").
set -uo pipefail
cd "$(dirname "$0")/.."
lmx_cmake_pc=()
. bench/gpu_env.sh
model=$1
shift
for v in "$@"; do # builds in parallel: one nvcc job each
    name=${v%%:*} flags=${v#*:}
    (cmake -S . -B "build-v-$name" -DCMAKE_BUILD_TYPE=Release "${lmx_cmake_pc[@]}" -DCMAKE_CUDA_FLAGS="$flags" \
        >/dev/null && cmake --build "build-v-$name" -j4 --target lmx gpu_bench >/dev/null) ||
        echo "variant $name: build failed" &
done
wait
d=/tmp/lmx-synth/$model
[ -d "$d" ] || "build-v-${1%%:*}/lmx" synth --like "$model" "$d" >/dev/null || exit 1
for rep in 1 2; do
    for v in "$@"; do
        name=${v%%:*}
        printf '%s (%s) run %d: ' "$name" "${v#*:}" "$rep"
        "build-v-$name/gpu_bench" "$d" --decode-only --gen 128 ${BENCH_ARGS:-} 2>&1 | grep -E "^decode at|rror" | tr "\n" " "; echo
    done
done
