#!/usr/bin/env bash
# Sets up (packages, tokenizer files), then builds and runs every test:
# a -Werror release build, the same tests under ASan+UBSan, and a short
# run of every fuzz target over its corpus.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
jobs=$(nproc)

echo "== release build (-Werror)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLMX_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")

echo "== valgrind: streams, sessions and models close without leaks or invalid accesses"
vg=(valgrind --quiet --suppressions=scripts/valgrind.supp --leak-check=full --errors-for-leak-kinds=definite,indirect --error-exitcode=9)
"${vg[@]}" ./build/lmx run tests/data/qwen3-tiny --chat -p "Hi" -n 6 --temp 0.7 --seed 1 --stop "xyz" >/dev/null
printf 'Hello!\nAnd then?\n' | "${vg[@]}" ./build/lmx chat tests/data/gemma3-tiny -n 4 --temp 0 >/dev/null
echo "valgrind: clean"

echo "== ASan + UBSan build"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLMX_WERROR=ON -DLMX_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --output-on-failure -j"$jobs")

if ls fuzz/fuzz_*.c >/dev/null 2>&1; then
    echo "== fuzz smoke run (clang libFuzzer)"
    CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLMX_FUZZ=ON >/dev/null
    cmake --build build-fuzz -j"$jobs"
    scripts/fuzz.sh 20
fi
echo "all tests passed"
