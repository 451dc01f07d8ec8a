# shellcheck shell=bash
# Sourced by bench/llama_cpp_gpu.sh and bench/llama_prebuilt.sh.
# llama_configure SRC [OPTION...]: configures llama.cpp's CUDA build in
# SRC/build (Ninja when there) for the tools the benchmarks use,
# llama-bench and llama-quantize, nothing else; OPTIONs are added.
llama_configure() {
    local src=$1 gen=()
    shift
    command -v ninja >/dev/null && gen=(-G Ninja)
    cmake -S "$src" -B "$src/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF "$@"
}
