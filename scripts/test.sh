#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test:
#   1. the unit tests (optimised build, warnings as errors);
#   2. the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer;
#   3. NEXMark: every query's engine output checked row for row against its
#      hand-written reference on a small event set.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)

echo "== build (Release, -Werror)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DENTENTE_WERROR=ON >/dev/null
cmake --build build -j"$jobs"

echo "== NEXMark results check"
build/bench/nexmark --events 300000 --json

echo "== unit tests"
ctest --test-dir build --output-on-failure -j"$jobs"

echo "== unit tests under ASan + UBSan"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DENTENTE_SANITIZE=ON -DENTENTE_BENCH=OFF -DENTENTE_WERROR=ON >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -L unit
