#!/usr/bin/env bash
# lmx vs llama.cpp (CUDA backend) vs transformers on one GPU, same weights,
# alternating in one run (issue 6). On the GPU machine, from the repo root:
#
#   bench/llama_cpp_gpu.sh build                 build llama.cpp (CUDA) and lmx
#   bench/llama_cpp_gpu.sh [build] MODEL...      MODEL: a `lmx synth --like` name
#   bench/llama_cpp_gpu.sh table FILE.jsonl...   the summary table (anywhere, python3)
#
# Needs .peer/llama.cpp.tar.xz (bench/make_llama_tarball.sh; the machine has
# no network) and what bench/gpu_env.sh needs (.debs/ when the machine lacks
# cJSON, PCRE2, utf8proc). Every phase skips what is already there, so a
# call cut short can be repeated; a MODEL call on a fresh machine builds
# first (about 5 minutes, or seconds with the prebuilt tools below). Per model: synthetic bf16 checkpoint, BF16 GGUF
# (bench/st_to_gguf.py with the tarball's gguf-py), Q8_0 and Q4_0 by
# `llama-quantize --pure` (every matrix in that format, as lmx's quant does);
# then for each format llama-bench, then bench/gpu_bench on the same weights,
# then (bf16, HF=1) bench/hf_generate.py. Model files are deleted after each
# model: the disk (64 GB) holds one large model and its GGUFs at a time.
#
# Results: $OUT/peer.jsonl (one JSON line per measurement: llama-bench's own
# lines tagged with tool/model/format, lmx's and transformers' one per
# metric); logs: $OUT/run.log, $OUT/llama-build.log, $OUT/lmx-build.log;
# the table: stdout and $OUT/table.md.
#
# Environment (defaults):
#   LMX_FORMATS="bf16"     lmx formats to run (bf16 q8 q4)
#   LLAMA_FORMATS="bf16 q8 q4"  llama.cpp formats to run (the BF16 GGUF is made
#                          anyway: the others are quantized from it)
#   LMX_QUANT_ARG="--quant"  gpu_bench option taking q8/q4 (skipped until gpu_bench has it)
#   HF=0                   1: transformers generate, bf16, as a second reference
#   BENCH_ARGS="--chunk 4096 --gen 128"   for gpu_bench (128 tokens, as tg128)
#   REPS=3                 llama-bench -r
#   LLAMA_ARGS=""          extra llama-bench options (e.g. "-ub 2048")
#   LLAMA_DIR=/tmp/llama-gpu  MODELS=/tmp/lmx-peer  OUT=/tmp/lmx-out
#
# Prebuilt tools: .peer/llama-gpu-bin.tar.xz, when there, is unpacked into
# $LLAMA_DIR/build/bin instead of compiling (device minutes are few):
# llama-bench, llama-quantize and their libllama*/libggml*.so, flat, RUNPATH
# $ORIGIN. They need libcudart, libcublas, libcublasLt .so.13 (the toolkit's)
# and the driver's libcuda.so.1; if they do not start, the source build runs.
# Made on any x86-64 machine with CUDA 13.0, no GPU, by bench/llama_prebuilt.sh.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# The table: best value per (tool, model, format, metric) across all lines of
# the files given (several calls' peer.jsonl may be merged), lmx / llama.cpp.
table() {
    python3 - "$@" <<'PY'
import json, sys
best = {}
for path in sys.argv[1:]:
    for line in open(path):
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r["tool"] == "llama.cpp":  # llama-bench's own fields
            d = r["n_depth"]
            metric = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else "tg"
            metric += f"@{d}" if d else ""
            v = r["avg_ts"]
        else:
            metric, v = r["metric"], r["tok_s"]
        k = (r["tool"], r["model"], r["format"], metric)
        best[k] = max(best.get(k, 0.0), v)
metrics = ["pp512", "pp4096", "tg", "tg@4096"]
names = {"pp512": "prefill 512", "pp4096": "prefill 4096", "tg": "decode ctx 0", "tg@4096": "decode depth 4096"}
gguf = {"bf16": "BF16", "q8": "Q8_0", "q4": "Q4_0"}
rows = sorted({(m, f) for (_, m, f, _) in best}, key=lambda x: (x[0], list(gguf).index(x[1]) if x[1] in gguf else 9))
def cell(v): return (f"{v:,.0f}" if v >= 1000 else f"{v:.1f}").replace(",", " ") if v else "-"
def ratio(a, b): return f"{a / b:.2f}" if a and b else "-"
def head(other):
    print("| model | format | " + " | ".join(f"{names[x]} lmx | {other} | x" for x in metrics) + " |")
    print("| --- | --- |" + " --- | --- | --- |" * len(metrics))
def row(m, f, other, label):
    L = [best.get(("lmx", m, f, x), 0) for x in metrics]
    O = [best.get((other, m, f, x), 0) for x in metrics]
    if any(O):
        print(f"| {m} | {label} | " + " | ".join(f"{cell(a)} | {cell(b)} | {ratio(a, b)}" for a, b in zip(L, O)) + " |")
print("tok/s, best of the runs; x = lmx / the other\n")
head("llama.cpp")
for m, f in rows:
    row(m, f, "llama.cpp", f"{f} / {gguf.get(f, f)}")
if any(k[0] == "transformers" for k in best):
    print()
    head("transformers")
    for m, f in rows:
        row(m, f, "transformers", f)
PY
}

if [ "${1:-}" = table ]; then
    shift
    table "$@"
    exit
fi

[ $# -gt 0 ] || { sed -n '2,41p' "$0"; exit 2; }
out=${OUT:-/tmp/lmx-out}
LLAMA_DIR=${LLAMA_DIR:-/tmp/llama-gpu}
MODELS=${MODELS:-/tmp/lmx-peer}
LMX_FORMATS=${LMX_FORMATS:-bf16}
LLAMA_FORMATS=${LLAMA_FORMATS:-bf16 q8 q4}
LMX_QUANT_ARG=${LMX_QUANT_ARG:---quant}
HF=${HF:-0}
BENCH_ARGS=${BENCH_ARGS:---chunk 4096 --gen 128}
REPS=${REPS:-3}
LLAMA_ARGS=${LLAMA_ARGS:-}
mkdir -p "$out" "$MODELS"
log=$out/run.log
jsonl=$out/peer.jsonl
bin=$LLAMA_DIR/build/bin
lmx_cmake_pc=()
# shellcheck source=bench/gpu_env.sh
. bench/gpu_env.sh
# shellcheck source=bench/llama_build.sh
. bench/llama_build.sh

say() { echo "[$(date -u +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$log"; }

# lmx: always rebuilt incrementally (the source may have changed since the
# last call on a warm machine; a no-op otherwise), then bench/gpu_bench.
build_lmx() {
    { cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release "${lmx_cmake_pc[@]}" &&
        cmake --build build-gpu -j16 --target lmx gpu_bench; } >"$out/lmx-build.log" 2>&1
}

# llama.cpp: built once per machine (about 4.5 minutes with 16 jobs);
# an interrupted build resumes where it stopped. The prebuilt tools, when
# carried, replace the build; the sources are unpacked anyway (gguf-py).
build_llama() {
    [ -x "$bin/llama-bench" ] && [ -x "$bin/llama-quantize" ] && return 0
    if [ ! -f "$LLAMA_DIR/CMakeLists.txt" ]; then
        mkdir -p "$LLAMA_DIR"
        tar -C "$LLAMA_DIR" --strip-components=1 -xJf .peer/llama.cpp.tar.xz || return 1
    fi
    local pre=.peer/llama-gpu-bin.tar.xz
    if [ -f "$pre" ] && [ ! -e "$bin/llama-bench" ]; then
        mkdir -p "$bin"
        # --help loads every library, so a missing one shows here, not later
        if tar -C "$bin" -xJf "$pre" && "$bin/llama-bench" --help >/dev/null 2>&1; then
            echo "llama.cpp: prebuilt, from $pre" >>"$out/llama-build.log"
            return 0
        fi
        echo "llama.cpp: $pre does not run here, building from source" >>"$out/llama-build.log"
        # its files would pass for build outputs: ninja must not skip them
        tar -tJf "$pre" | while read -r f; do rm -f "$bin/$f"; done
    fi
    { llama_configure "$LLAMA_DIR" -DCMAKE_CUDA_ARCHITECTURES=90 &&
        cmake --build "$LLAMA_DIR/build" -j16 --target llama-bench llama-quantize; } >>"$out/llama-build.log" 2>&1
}

build() {
    say "build: lmx (background) and llama.cpp"
    build_lmx &
    local lmx_pid=$!
    build_llama || { tail -30 "$out/llama-build.log"; say "llama.cpp build failed"; wait "$lmx_pid"; return 1; }
    wait "$lmx_pid" || { grep -E "error|Error" "$out/lmx-build.log" | head -30; say "lmx build failed"; return 1; }
    say "build: done"
}

free_bytes() { df -B1 --output=avail "$MODELS" | tail -1; }

# the synthetic checkpoint (written under a temporary name: a cut-short call
# leaves no half checkpoint behind that looks complete)
ensure_st() {
    [ -f "$dir/config.json" ] && return 0
    rm -rf "$dir.tmp"
    ./build-gpu/lmx synth --like "$model" "$dir.tmp" >>"$log" 2>&1 && mv "$dir.tmp" "$dir" &&
        say "$model: synthesized, $(du -sh "$dir" | cut -f1)"
}

ensure_gguf() { # FORMAT (bf16, q8_0, q4_0)
    local f=$g-$1.gguf
    [ -f "$f" ] && return 0
    if [ "$1" = bf16 ]; then
        # bench/st_to_gguf.py, with Gemma3 4B/12B's multimodal tensor names
        # (language_model.model.*, as `lmx synth` and the hub write them)
        # read as the text model's (model.*), which it maps
        PYTHONPATH=$LLAMA_DIR/gguf-py:bench python3 - "$dir" "$f.tmp" >>"$log" 2>&1 <<'PY'
import st_to_gguf as s
read = s.read_safetensors
s.read_safetensors = lambda p: ((n.replace("language_model.model.", "model.", 1), t) for n, t in read(p))
s.main()
PY
    else
        "$bin/llama-quantize" --pure "$g-bf16.gguf" "$f.tmp" "${1^^}" >>"$log" 2>&1
    fi && mv "$f.tmp" "$f" && say "$model: $(basename "$f") $(du -sh "$f" | cut -f1)"
}

in_list() { case " $2 " in *" $1 "*) return 0 ;; esac; return 1; } # WORD LIST

run_llama() { # FORMAT GGUF_FILE
    in_list "$1" "$LLAMA_FORMATS" || return 0
    say "$model $1: llama-bench"
    # shellcheck disable=SC2086 # LLAMA_ARGS is a list of options
    # prompts at depth 0, generation at depth 0 and 4096 (-d would also run
    # both prompts at depth 4096, which the table does not use)
    { "$bin/llama-bench" -m "$2" -ngl 99 -fa 1 -p 512,4096 -n 0 -r "$REPS" -o jsonl $LLAMA_ARGS &&
        "$bin/llama-bench" -m "$2" -ngl 99 -fa 1 -p 0 -n 128 -d 0,4096 -r "$REPS" -o jsonl $LLAMA_ARGS; } 2>>"$log" |
        sed "s/^{/{\"tool\": \"llama.cpp\", \"model\": \"$model\", \"format\": \"$1\", /" >>"$jsonl"
}

# gpu_bench prints a markdown row: prefill 512 | prefill 4096 | decode ctx 0 |
# decode depth 4096 | decode GB/s (%) | ...; turned into one JSON line each
run_lmx() { # FORMAT
    local q=()
    in_list "$1" "$LMX_FORMATS" || return 0
    if [ "$1" != bf16 ]; then
        if ! grep -qF -- "\"$LMX_QUANT_ARG\"" bench/gpu_bench.c; then
            say "$model $1: skipped, bench/gpu_bench takes no $LMX_QUANT_ARG (it would run bf16)"
            return 0
        fi
        q=("$LMX_QUANT_ARG" "$1")
    fi
    ensure_st || return 1
    say "$model $1: lmx gpu_bench"
    local res
    # shellcheck disable=SC2086 # BENCH_ARGS is a list of options
    res=$(./build-gpu/gpu_bench "$dir" $BENCH_ARGS "${q[@]}" 2>&1)
    echo "$res" >>"$log"
    echo "$res" | awk -v m="$model" -v f="$1" '
        / GB weights as stored, / { for (i = 1; i < NF; i++) {
            if ($(i + 1) == "GB" && $(i + 2) == "weights") w = $i
            if ($i == "in" && $(i + 2) == "s;") ld = $(i + 1)
            if ($i == "bandwidth") bw = $(i + 1) } }
        /^\| [0-9]/ { split($0, c, "|")
            gsub(/^ +| +$/, "", c[6]); gsub(/^ +| +$/, "", c[7])
            split("pp512 pp4096 tg tg@4096", k, " ")
            for (j = 1; j <= 4; j++)
                printf "{\"tool\": \"lmx\", \"model\": \"%s\", \"format\": \"%s\", \"metric\": \"%s\", \"tok_s\": %s, \"weights_gb\": %s, \"load_s\": %s, \"copy_gbs\": %s, \"decode_gbs\": \"%s|%s\"}\n",
                    m, f, k[j], c[j + 1] + 0, w + 0, ld + 0, bw + 0, c[6], c[7]
            found = 1 }
        END { exit !found }' >>"$jsonl" || { say "$model $1: gpu_bench failed"; echo "$res" | tail -5; }
}

run_hf() {
    [ "$HF" = 1 ] || return 0
    ensure_st || return 1
    say "$model bf16: transformers"
    python3 bench/hf_generate.py "$dir" --name "$model" 2>>"$log" >>"$jsonl" || say "$model: hf_generate failed"
}

run_model() {
    model=$1 dir=$MODELS/$1 g=$MODELS/$1
    local t0=$SECONDS
    say "$model: start, $(($(free_bytes) / 1000000000)) GB free"
    ensure_st || return 1
    # the BF16 GGUF is as large as the checkpoint: a short disk (other
    # files under /tmp, say) fails here, saying so, not inside gguf-py
    local st need
    st=$(du -sb "$dir" | cut -f1)
    need=$((st + 2000000000))
    if [ ! -f "$g-bf16.gguf" ] && [ "$(free_bytes)" -lt "$need" ]; then
        say "$model: disk short for the BF16 GGUF: $(($(free_bytes) / 1000000000)) GB free under $MODELS, $((need / 1000000000)) GB needed"
        return 1
    fi
    ensure_gguf bf16 || return 1
    run_llama bf16 "$g-bf16.gguf"
    run_lmx bf16
    run_hf
    # Q8_0 + Q4_0 take ~0.8x the checkpoint; when the disk is short, the
    # checkpoint goes meanwhile and is synthesized again (same seed) for lmx
    if [ "$(free_bytes)" -lt $((st * 85 / 100 + 8000000000)) ]; then
        say "$model: disk short, checkpoint dropped while quantizing"
        rm -rf "$dir"
    fi
    for f in q8 q4; do
        in_list "$f" "$LLAMA_FORMATS" || continue
        ensure_gguf "${f}_0" || return 1
    done
    rm -f "$g-bf16.gguf"
    for f in q8 q4; do
        run_llama "$f" "$g-${f}_0.gguf"
        run_lmx "$f"
    done
    say "$model: done in $((SECONDS - t0)) s"
}

nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader | tee -a "$log"
python3 -c "import numpy, yaml" 2>/dev/null || say "warning: python3 lacks numpy or yaml (gguf-py needs both)"
rc=0
if [ "$1" = build ]; then
    shift
    build || exit 1
elif ! build; then # a fresh machine: MODEL calls build first (no-op when built)
    exit 1
fi
for m in "$@"; do
    run_model "$m" || { say "$m: failed (see run.log)"; rc=1; }
    rm -rf "${MODELS:?}/$m" "${MODELS:?}/$m.tmp" "${MODELS:?}/$m"-*.gguf*
done
if [ -s "$jsonl" ]; then
    table "$jsonl" | tee "$out/table.md"
fi
exit $rc
