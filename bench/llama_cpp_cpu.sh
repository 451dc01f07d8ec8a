#!/usr/bin/env bash
# lmx vs llama.cpp on the CPU, same machine, weights, threads, in one run.
#
#   bench/llama_cpp_cpu.sh MODEL...        (MODEL: a `lmx synth --like` name)
#
# Needs: llama.cpp's source at $LLAMA (default /tmp/llama.cpp; from the
# unslothai/llama.cpp snapshot, see /work/shared/ANCHORS.md), numpy for
# /usr/bin/python3. Builds llama.cpp there (CPU backend, native) when its
# binaries are missing. Nothing of llama.cpp lands in this repository;
# models and GGUF files go to $MODELS (default /tmp/lmx-bench-models).
#
# For each model and format pair (bf16/BF16, q8/Q8_0, q4/Q4_0) it runs,
# alternately, REPS times: llama-bench prefill (-p $PROMPT, with -n $GEN
# from an empty context for reference) and decode at the depth lmx decodes
# at (-n $GEN -d $PROMPT), then `lmx bench --device cpu --prompt $PROMPT --gen $GEN` (once
# per KV cache type in $KV; with PREFILL_BF16=1, bf16 weights once more with
# --prefill-bf16, x rounded to bf16 in prompts: an extra row against the same
# llama.cpp BF16 numbers); every line of results goes to $OUT (JSON lines) and a
# summary table (best of the runs, lmx / llama.cpp) to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA=${LLAMA:-/tmp/llama.cpp}
MODELS=${MODELS:-/tmp/lmx-bench-models}
LMX=${LMX:-build-cpu/lmx}
T=${T:-2}
PROMPT=${PROMPT:-512}
GEN=${GEN:-32}
REPS=${REPS:-3}
# the format pairs to run (lmx --quant : GGUF type); e.g. FORMATS="q8:q8_0 q4:q4_0"
# for a model whose bf16 GGUF and safetensors do not both fit in the page cache
FORMATS=${FORMATS:-none:bf16 q8:q8_0 q4:q4_0}
# lmx's KV cache types to run (--kv); llama.cpp keeps its cache in f16
KV=${KV:-f32}
# 1: bf16 weights also with lmx --prefill-bf16 (docs/cpu.md)
PREFILL_BF16=${PREFILL_BF16:-0}
OUT=${OUT:-$MODELS/results.jsonl}
mkdir -p "$MODELS"
: > "$OUT"

# AMX off: on the development machine this snapshot's AMX matmul (taken for
# Q8_0/Q4_0 under -march=native) dies with SIGILL at its first tilezero, so
# llama.cpp runs its AVX-512 (VNNI, BF16) kernels.
B=$LLAMA/build-noamx
if [ ! -x "$B/bin/llama-bench" ] || [ ! -x "$B/bin/llama-quantize" ]; then
    noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    cmake -S "$LLAMA" -B "$B" -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_APP=OFF -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx"
    cmake --build "$B" -j2 --target llama-bench llama-quantize
fi
BIN=$B/bin

for model in "$@"; do
    dir=$MODELS/$model
    [ -f "$dir/config.json" ] || "$LMX" synth --like "$model" "$dir" >/dev/null
    g=$MODELS/$model
    [ -f "$g-bf16.gguf" ] || PYTHONPATH=$LLAMA/gguf-py /usr/bin/python3 bench/st_to_gguf.py "$dir" "$g-bf16.gguf"
    # --pure: every matrix in the one format, as lmx's --quant does
    [ -f "$g-q8_0.gguf" ] || "$BIN/llama-quantize" --pure "$g-bf16.gguf" "$g-q8_0.gguf" Q8_0 >/dev/null 2>&1
    [ -f "$g-q4_0.gguf" ] || "$BIN/llama-quantize" --pure "$g-bf16.gguf" "$g-q4_0.gguf" Q4_0 >/dev/null 2>&1
    for rep in $(seq "$REPS"); do
        for pair in $FORMATS; do
            q=${pair%%:*} gf=$g-${pair##*:}.gguf
            # prefill, and decode from an empty context (for reference)
            "$BIN/llama-bench" -m "$gf" -t "$T" -p "$PROMPT" -n "$GEN" -r 1 -o jsonl 2>/dev/null |
                sed "s/^{/{\"tool\": \"llama.cpp\", \"model\": \"$model\", \"quant\": \"$q\", \"phase\": \"prefill\", /" >> "$OUT"
            "$BIN/llama-bench" -m "$gf" -t "$T" -p 0 -n "$GEN" -d "$PROMPT" -r 1 -o jsonl 2>/dev/null |
                sed "s/^{/{\"tool\": \"llama.cpp\", \"model\": \"$model\", \"quant\": \"$q\", \"phase\": \"decode\", /" >> "$OUT"
            xs=("")
            [ "$q" = none ] && [ "$PREFILL_BF16" = 1 ] && xs+=(--prefill-bf16)
            for kv in $KV; do
                for x in "${xs[@]}"; do
                    "$LMX" bench "$dir" --device cpu --prompt "$PROMPT" --gen "$GEN" --threads "$T" --quant "$q" --kv "$kv" $x --json |
                        sed "s/^{/{\"tool\": \"lmx\", \"model_name\": \"$model\", /" >> "$OUT"
                done
            done
        done
    done
done

/usr/bin/python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
# best of the runs: on a shared machine the fastest run is the one least
# disturbed by others; both tools are measured the same way
def best(xs): return max(xs) if xs else float("nan")
keys = sorted({(r.get("model_name") or r["model"], r["quant"], r["kv"], r.get("prefill_x", "f32"))
               for r in rows if r["tool"] == "lmx"}, key=lambda k: (*k[:3], k[3] == "bf16"))
print(f"| model | lmx / llama.cpp | prefill tok/s lmx | llama.cpp | ratio | decode tok/s lmx | llama.cpp | ratio | llama.cpp decode at depth 0 | lmx decode GB/s | % of probe |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
names = {"none": "bf16 / BF16", "q8": "q8 / Q8_0", "q4": "q4 / Q4_0"}
for m, q, kv, x in keys:
    L = [r for r in rows if r["tool"] == "lmx" and r["model_name"] == m and r["quant"] == q and r["kv"] == kv
         and r.get("prefill_x", "f32") == x]
    ll = [r for r in rows if r["tool"] == "llama.cpp" and r["model"] == m and r["quant"] == q]
    P = [r["avg_ts"] for r in ll if r["n_prompt"] > 0]
    D = [r["avg_ts"] for r in ll if r["n_gen"] > 0 and r["n_depth"] > 0]
    D0 = [r["avg_ts"] for r in ll if r["n_gen"] > 0 and r["n_depth"] == 0]
    lp, ld = best([r["prefill_tok_s"] for r in L]), best([r["decode_tok_s"] for r in L])
    bw = best([r["decode_bytes_s"] for r in L]) / 1e9
    probe = best([r["bandwidth_bytes_s"] for r in L]) / 1e9
    print(f"| {m} | {names[q]}{', lmx KV f16' if kv == 'f16' else ''}{', lmx --prefill-bf16' if x == 'bf16' else ''} | {lp:.1f} | {best(P):.1f} | {lp / best(P):.2f} | {ld:.2f} | {best(D):.2f} | {ld / best(D):.2f} | {best(D0):.2f} | {bw:.1f} | {100 * bw / probe:.0f}% of {probe:.1f} |")
PY
