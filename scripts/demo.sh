#!/usr/bin/env bash
# Sets up, builds, and generates text end to end: a Qwen3-0.6B-shaped
# checkpoint (random weights, real shapes, the real Qwen3 tokenizer), then
# `lmx run` with stats. Pass a checkpoint directory to use it instead:
#   scripts/demo.sh [MODEL_DIR] [PROMPT]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh >/dev/null
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
model=${1:-}
if [ -z "$model" ]; then
    model=build/demo-qwen3-0.6b
    if [ ! -f "$model/model.safetensors" ]; then
        ./build/lmx synth --like qwen3-0.6b "$model" >/dev/null
        cp tests/data/tokenizers/qwen3/tokenizer.json tests/data/tokenizers/qwen3/tokenizer_config.json "$model/"
    fi
    echo "(random weights with Qwen3-0.6B's shapes: the text is noise, the speed is real)" >&2
fi
prompt=${2:-"Why is the sky blue?"}
exec ./build/lmx run "$model" --chat -p "$prompt" -n 48 --temp 0.7 --seed 1 --verbose
