# Sourced on the GPU machine: build dependencies from .debs/ (carried; made
# with `apt-get download`, see docs/cuda.md) when the machine lacks them.
if ! pkg-config --exists libcjson libpcre2-8 libutf8proc 2>/dev/null; then
    deps=/tmp/lmx-deps
    mkdir -p "$deps"
    for f in .debs/*.deb; do dpkg -x "$f" "$deps"; done
    lib=$deps/usr/lib/x86_64-linux-gnu
    export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PKG_CONFIG_PATH=$lib/pkgconfig:$deps/usr/share/pkgconfig
    export PKG_CONFIG_SYSROOT_DIR=$deps
    if ! command -v pkg-config >/dev/null; then
        export PKG_CONFIG=$deps/usr/bin/pkgconf
        lmx_cmake_pc=(-DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG")
    fi
fi
export PATH=/usr/local/cuda/bin:$PATH

# For loops over models and formats: synth_model MODEL sets d to its
# synthetic checkpoint (`lmx synth --like MODEL` by ./build-gpu/lmx, made
# once); quant_args FORMAT sets qa to gpu_bench's option for it (none: as
# stored).
synth_model() {
    d=/tmp/lmx-synth/$1
    mkdir -p /tmp/lmx-synth
    [ -d "$d" ] || ./build-gpu/lmx synth --like "$1" "$d" >/dev/null
}
quant_args() {
    qa=()
    [ "$1" = none ] || qa=(--quant "$1")
}
