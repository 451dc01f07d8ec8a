#!/usr/bin/env bash
# On the GPU machine (device tool): build, run test_cuda, then bench/gpu_bench
# on synthetic bf16 checkpoints. Usage: bench/gpu_run.sh [MODEL...]
# (models as in `lmx synth --like`; none = tests only; BENCH_ARGS are passed
# to gpu_bench, e.g. "--chunk 4096"; QUANTS="none q8 q4" benches each
# weight format (default none: as stored); COMPARE="VAR=value ..." repeats each
# bench with those environment settings; PROFILE=1 adds an Nsight Compute
# listing of the first kernels of a decode step, $OUT/ncu-MODEL.log).
# Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/lmx-out}
mkdir -p "$out"
lmx_cmake_pc=()
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DLMX_WERROR=ON "${lmx_cmake_pc[@]}" >"$out/cmake.log" 2>&1 ||
    { tail -30 "$out/cmake.log"; exit 1; }
cmake --build build-gpu -j16 >"$out/build.log" 2>&1 || { grep -E "error|Error" "$out/build.log" | head -30; exit 1; }
(cd build-gpu && ctest -R test_cuda --output-on-failure -V) >"$out/test_cuda.log" 2>&1
grep -E "relative error|worst|passed|failed|Skipped|CHECK" "$out/test_cuda.log" | head -40
echo "test_cuda with LMX_CUDA_ATTN=simt:"
LMX_CUDA_ATTN=simt ./build-gpu/tests/test_cuda 2>&1 | grep -E "worst|passed|CHECK" | head -20
# the CLI on both devices: same greedy text
if [ -f tests/data/qwen3-tiny/tokenizer.json ]; then
    for d in cuda cpu; do
        printf '%s: ' $d
        ./build-gpu/lmx run tests/data/qwen3-tiny --device $d -p "The sky is" -n 12 --temp 0 2>&1 | tr '\n' ' '
        echo
    done
fi
./build-gpu/lmx info tests/data/gemma3-small --device cuda | head -2
[ $# -gt 0 ] || exit 0
for m in "$@"; do
    synth_model "$m" || exit 1
    for q in ${QUANTS:-none}; do
        quant_args "$q"
        ./build-gpu/gpu_bench "$d" ${BENCH_ARGS:-} "${qa[@]}" 2>&1 | tee -a "$out/bench.log"
    done
    if [ "${PROFILE:-0}" = 1 ]; then # kernel by kernel: the first eager decode step
        ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum -c 48 \
            ./build-gpu/gpu_bench "$d" --decode-only --gen 2 >"$out/ncu-$m.log" 2>&1 || echo "ncu failed: $out/ncu-$m.log"
    fi
    if [ -n "${COMPARE:-}" ]; then # the same bench under other settings, e.g. COMPARE=LMX_CUDA_ATTN=simt
        env $COMPARE ./build-gpu/gpu_bench "$d" ${BENCH_ARGS:-} 2>&1 | tail -1 | sed "s/^/$COMPARE: /" |
            tee -a "$out/bench.log"
    fi
    rm -rf "$d" # the disk holds one large checkpoint at a time
done
