#!/usr/bin/env bash
# Installs what lmx needs to build and test on Debian 12, then the real
# tokenizer files the tests use. Safe to run again.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
need=(build-essential cmake pkg-config clang libclang-rt-dev valgrind libcjson-dev libpcre2-dev libutf8proc-dev nodejs npm)
missing=()
for p in "${need[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
# npm may come with nodejs from elsewhere; only ask apt for it when absent.
if command -v npm >/dev/null 2>&1; then
    missing=("${missing[@]/npm/}"); missing=("${missing[@]/nodejs/}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if [ ${#missing[@]} -gt 0 ]; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
"$root/scripts/fetch-tokenizers.sh"
