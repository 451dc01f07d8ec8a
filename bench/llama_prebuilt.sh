#!/usr/bin/env bash
# Makes .peer/llama-gpu-bin.tar.xz (bench/llama_cpp_gpu.sh unpacks it on the
# GPU machine instead of compiling there): llama-bench, llama-quantize and
# their shared libraries, built for sm_90 on this machine, which needs the
# CUDA 13 toolkit but no GPU (about 30 minutes on 2 cores).
#
#   bench/llama_prebuilt.sh [BUILD_DIR]     (default /tmp/llama-prebuilt)
#
# Needs .peer/llama.cpp.tar.xz (bench/make_llama_tarball.sh). A build cut
# short resumes in BUILD_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .peer/llama.cpp.tar.xz ] || { echo "no .peer/llama.cpp.tar.xz: run bench/make_llama_tarball.sh" >&2; exit 1; }
dir=${1:-/tmp/llama-prebuilt}
if [ ! -f "$dir/CMakeLists.txt" ]; then
    mkdir -p "$dir"
    tar -C "$dir" --strip-components=1 -xJf .peer/llama.cpp.tar.xz
fi
# the executables link against libcuda.so.1, which only a driver installs:
# the toolkit's stub stands in for it at link time
stub=$dir/cuda-stub
mkdir -p "$stub"
ln -sf /usr/local/cuda/lib64/stubs/libcuda.so "$stub/libcuda.so.1"
export PATH=/usr/local/cuda/bin:$PATH LD_LIBRARY_PATH=$stub
# shellcheck source=bench/llama_build.sh
. bench/llama_build.sh
# no PTX (half the size), generic x86-64 code (any host CPU), no NCCL (one
# GPU); RUNPATH $ORIGIN beside the toolkit's libraries: the archive is flat
# shellcheck disable=SC2016 # $ORIGIN is for the loader
llama_configure "$dir" -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON \
    -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_CUDA_NCCL=OFF \
    -DCMAKE_INSTALL_RPATH='$ORIGIN;/usr/local/cuda/lib64' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON >/dev/null
nice -n 19 cmake --build "$dir/build" -j"$(nproc)" --target llama-bench llama-quantize
(cd "$dir/build/bin" && tar -cf - llama-bench llama-quantize lib*.so*) | xz -T2 -9 >.peer/llama-gpu-bin.tar.xz.tmp
mv .peer/llama-gpu-bin.tar.xz.tmp .peer/llama-gpu-bin.tar.xz
ls -l .peer/llama-gpu-bin.tar.xz
