#!/usr/bin/env bash
# The working tree against an earlier revision in one run on the GPU
# machine (device tool): both built side by side, test_cuda on the working
# tree, then bench/gpu_bench on each build in turn (speed ratios hold only
# within one run, bench/RESULTS.md).
#
#   bench/gpu_ab.sh pack REV           here: .base/HASH.tar.xz, REV's sources
#                                      without tests/data; prints HASH
#   bench/gpu_ab.sh run HASH [MODEL...]   there, with carry [".debs", ".base"]
#
# run: MODEL is a `lmx synth --like` name; for each, every format in QUANTS
# ("none q8 q4"; default none: as stored) is benched REPS times (default 2),
# base then new, with BENCH_ARGS (e.g. "--chunk 4096 --gen 8"). TEST=0
# skips test_cuda. Each result line is tagged "MODEL FORMAT base|new";
# logs go to $OUT. TRACE=1 also runs each build once more per model and
# format under bench/kernel_trace.c and writes the timeline's summary
# (bench/kernel_trace.py) to $OUT/trace-MODEL-FORMAT-base|new.sum.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
usage() {
    echo "usage: bench/gpu_ab.sh pack REV | run HASH [MODEL...]" >&2
    exit 2
}
[ $# -ge 2 ] || usage
cmd=$1 rev=$2
shift 2

if [ "$cmd" = pack ]; then
    hash=$(git rev-parse --short "$rev") || exit 1
    mkdir -p .base
    grep -qx '/.base/' .git/info/exclude 2>/dev/null || echo /.base/ >>.git/info/exclude
    git archive "$hash" -- . ':!tests/data' | xz -T2 >".base/$hash.tar.xz" || exit 1
    echo "$hash"
    exit 0
fi
[ "$cmd" = run ] || usage

out=${OUT:-/tmp/lmx-out}
mkdir -p "$out"
lmx_cmake_pc=()
. bench/gpu_env.sh
base=/tmp/gpu-ab-$rev
if [ ! -f "$base/CMakeLists.txt" ]; then
    mkdir -p "$base" && tar -C "$base" -xJf ".base/$rev.tar.xz" || exit 1
fi

targets=(lmx gpu_bench test_cuda)
[ "${TRACE:-0}" = 1 ] && targets+=(kernel_trace)
build() { # SOURCE NAME
    cmake -S "$1" -B "$1/build-gpu" -DCMAKE_BUILD_TYPE=Release "${lmx_cmake_pc[@]}" >"$out/cmake-$2.log" 2>&1 &&
        cmake --build "$1/build-gpu" -j8 --target "${targets[@]}" >"$out/build-$2.log" 2>&1 && return 0
    echo "$2: build failed ($out/build-$2.log)"
    grep -m10 error "$out/build-$2.log"
    return 1
}
build "$base" base &
pid=$!
build "$PWD" new || exit 1
wait "$pid" || exit 1

if [ "${TEST:-1}" = 1 ]; then
    (cd build-gpu && ./tests/test_cuda) >"$out/test_cuda.log" 2>&1
    echo "test_cuda (new): exit $?, $(tail -1 "$out/test_cuda.log")"
    grep -m10 "CHECK(" "$out/test_cuda.log"
fi

build_of() { # base|new: sets b to that build's directory
    b=$PWD/build-gpu
    [ "$1" = base ] && b=$base/build-gpu
}

# a build's gpu_bench on d with BENCH_ARGS and qa (uses b, d, qa)
bench() { # [VAR=value...]: added to its environment
    # shellcheck disable=SC2086 # BENCH_ARGS is a list of options
    env "$@" "$b/gpu_bench" "$d" ${BENCH_ARGS:-} "${qa[@]}"
}

# one traced gpu_bench run of a build (uses m, q, d, qa)
trace() { # base|new
    local t=/tmp/trace-$m-$q-$1.csv sum=$out/trace-$m-$q-$1.sum
    build_of "$1"
    bench CUDA_INJECTION64_PATH="$b/libkernel_trace.so" LMX_TRACE="$t" >/dev/null 2>&1 &&
        python3 bench/kernel_trace.py "$t" --steps 2 >"$sum" 2>&1
    echo "$m $q $1: traced (exit $?), $sum"
}

for m in "$@"; do
    synth_model "$m" || exit 1
    for q in ${QUANTS:-none}; do
        quant_args "$q"
        for _ in $(seq "${REPS:-2}"); do
            for v in base new; do
                build_of $v
                bench 2>&1 | grep -E "^\| [0-9]|^prefill|gpu_bench" | sed "s/^/$m $q $v: /" | tee -a "$out/ab.log"
            done
        done
        if [ "${TRACE:-0}" = 1 ]; then
            trace base
            trace new
        fi
    done
    rm -rf "$d" # the disk holds one large checkpoint at a time
done
