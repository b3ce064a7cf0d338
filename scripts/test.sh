#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test:
#   0. the include check: no #include (nor CMake link) points against the
#      module direction of docs/architecture.md, no #include reaches another
#      module's detail/ (scripts/check-includes.py, a second);
#   1. the integration tests (real broker processes, real HTTP/WebSocket
#      clients, curl) and the benchmarks' smoke runs in an optimised build,
#      warnings as errors (the unit tests are built and run in step 5, under
#      ASan + UBSan: building them here too cost about four minutes);
#   1b. the dashboard in headless Chromium against two federated domains
#      (scripts/ui-test.sh, about 10 s); its screenshot,
#      out/ui-screenshot.png, is the run's artefact;
#   2. NEXMark: every query's engine output checked row for row against its
#      hand-written reference on a small event set;
#   3. the federation frame decoder fuzzed for 30 s (libFuzzer, clang; scripts/fuzz.sh 600 for a long run);
#   4. the concurrent parts' tests (group commit, HTTP transport, streams,
#      peer links, certificate checks, the etcd client's pool and watches)
#      under ThreadSanitizer;
#   5. every unit test under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# One job more than cores: a job linking or writing its objects leaves a
# core to the others.
jobs=$(( $(nproc) + 1 ))
tests=$(nproc)

echo "== include direction between modules"
scripts/check-includes.py

echo "== build (Release, -Werror; the unit tests are step 5's)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DENTENTE_WERROR=ON -DENTENTE_UNIT_TESTS=OFF >/dev/null
cmake --build build -j"$jobs"

echo "== integration tests"
ctest --test-dir build --output-on-failure -j"$tests"

echo "== the dashboard in headless Chromium (screenshot: out/ui-screenshot.png)"
BUILD_DIR=build scripts/ui-test.sh

echo "== NEXMark results check"
build/bench/nexmark --events 300000 --json

echo "== the peer-link frame decoder under libFuzzer (30 s)"
scripts/fuzz.sh 30

echo "== concurrent parts under ThreadSanitizer"
tsan_tests=(group_commit_test http_websocket_test http_upstream_test link_test trust_test streams_test query_state_test etcd_test membership_test)
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DENTENTE_TSAN=ON -DENTENTE_BENCH=OFF -DENTENTE_WERROR=ON \
  -DENTENTE_TSAN_TESTS="$(IFS=';'; echo "${tsan_tests[*]}")" >/dev/null
cmake --build build-tsan -j"$jobs" --target tsan_tests
for t in "${tsan_tests[@]}"; do
  TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tests/tsan.supp" "build-tsan/tests/$t"
done

echo "== unit tests under ASan + UBSan"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DENTENTE_SANITIZE=ON -DENTENTE_BENCH=OFF -DENTENTE_WERROR=ON >/dev/null
cmake --build build-asan -j"$jobs" --target unit_tests
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$tests" -L unit
