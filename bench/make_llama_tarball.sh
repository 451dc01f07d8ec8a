#!/usr/bin/env bash
# Makes .peer/llama.cpp.tar.xz: llama.cpp's sources trimmed to what a CUDA
# (or CPU) build of llama-bench and llama-quantize needs, plus gguf-py (for
# bench/st_to_gguf.py). The device tool carries at most 64 MiB of working
# tree, and the GPU machine has no network, so the sources travel this way
# (bench/llama_cpp_gpu.sh build unpacks them there).
#
#   bench/make_llama_tarball.sh [LLAMA_SRC]     (default /tmp/llama.cpp)
#
# LLAMA_SRC: an unpacked unslothai/llama.cpp snapshot (/work/shared/ANCHORS.md).
# It is only read. The fetched mirror lacks a blob (docs/ops/SYCL.csv), which
# stops `git archive HEAD` of the whole tree; archive only what is copied
# below, e.g. from the mirror's git directory G:
#   git -C G archive HEAD CMakeLists.txt LICENSE licenses cmake include src \
#       common vendor gguf-py tools/llama-bench tools/quantize ggml | tar -C /tmp/llama.cpp -xf -
# /.peer/ is listed in .git/info/exclude: nothing of
# llama.cpp is ever committed here.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-/tmp/llama.cpp}
[ -f "$src/tools/llama-bench/llama-bench.cpp" ] || { echo "no llama.cpp source at $src" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
d=$stage/llama.cpp
mkdir -p "$d/tools" "$d/vendor" "$d/ggml/src"

# top level: the CMake project, the library, the common utils, the headers
cp -a "$src"/{CMakeLists.txt,LICENSE,licenses,cmake,include,src,common} "$d/"
# vendored code common/ includes (JSON, HTTP client it links, subprocess)
cp -a "$src"/vendor/{nlohmann,cpp-httplib,sheredom} "$d/vendor/"
# gguf-py without its tests and examples
mkdir -p "$d/gguf-py"
cp -a "$src"/gguf-py/{gguf,pyproject.toml,LICENSE} "$d/gguf-py/"
# the two tools; tools/CMakeLists.txt is replaced below so CMake does not
# look for the dropped ones (server, mtmd, ui, ...)
cp -a "$src"/tools/{llama-bench,quantize} "$d/tools/"
cat >"$d/tools/CMakeLists.txt" <<'EOF'
# trimmed by lmx bench/make_llama_tarball.sh: only llama-bench and llama-quantize
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(quantize)
EOF
# ggml: core, CPU backend (x86 only) and CUDA backend; the other GPU and
# accelerator backends are added only when their GGML_<NAME> option is on
cp -a "$src"/ggml/{CMakeLists.txt,cmake,include} "$d/ggml/"
find "$src/ggml/src" -maxdepth 1 -type f -exec cp -a {} "$d/ggml/src/" \;
cp -a "$src"/ggml/src/{ggml-cpu,ggml-cuda} "$d/ggml/src/"
rm -rf "$d"/ggml/src/ggml-cpu/{kleidiai,spacemit}
find "$d/ggml/src/ggml-cpu/arch" -mindepth 1 -maxdepth 1 ! -name x86 -exec rm -rf {} +
# no caches, no build trees
find "$d" \( -name __pycache__ -o -name '*.pyc' -o -name README.md \) -prune -exec rm -rf {} +

mkdir -p .peer
tar -C "$stage" -cf - llama.cpp | xz -T2 -9 >.peer/llama.cpp.tar.xz.tmp
mv .peer/llama.cpp.tar.xz.tmp .peer/llama.cpp.tar.xz
ls -l .peer/llama.cpp.tar.xz
