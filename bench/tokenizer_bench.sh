#!/usr/bin/env bash
# Tokenizer benchmark: builds lmx (release), a deterministic ~2 MB mixed
# corpus, and runs bench/tokenizer_bench on the Qwen3 and Gemma3 tokenizers
# (one thread). With python `tokenizers` installed, runs it on the same
# corpus too. Usage: bench/tokenizer_bench.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-bench}
cd "$root"
[ -f tests/data/tokenizers/gemma3/tokenizer.json ] || scripts/fetch-tokenizers.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target lmxcore >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 bench/tokenizer_corpus.py "$work/corpus.txt" "$root"
echo "corpus sha256: $(sha256sum "$work/corpus.txt" | cut -d' ' -f1)"
cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc bench/tokenizer_bench.c \
    "$build/liblmx.a" $(pkg-config --libs libcjson libpcre2-8 libutf8proc) -lm -lpthread \
    -o "$work/tokenizer_bench"
echo "machine: $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
echo "== lmx"
taskset -c 0 "$work/tokenizer_bench" "$work/corpus.txt" tests/data/tokenizers/qwen3 tests/data/tokenizers/gemma3
if python3 -c 'import tokenizers' 2>/dev/null; then
    echo "== Hugging Face tokenizers $(python3 -c 'import tokenizers; print(tokenizers.__version__)')"
    RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false taskset -c 0 python3 bench/tokenizer_hf.py \
        "$work/corpus.txt" tests/data/tokenizers/qwen3 tests/data/tokenizers/gemma3
fi
