#!/usr/bin/env bash
# Fuzzes the peer-link frame decoder and message decoders
# (tests/fuzz/frame_fuzz.cpp) with libFuzzer under ASan and UBSan.
#
#   scripts/fuzz.sh [SECONDS]   build build-fuzz/frame_fuzz, run it for
#                               SECONDS (default 60) on a corpus seeded
#                               from tests/fuzz/corpus/; exit 1 on a finding
#   scripts/fuzz.sh --seed      rewrite the seeds in tests/fuzz/corpus/
#
# Needs Debian's clang and libclang-rt-14-dev (scripts/install-deps.sh).
# The target is compiled from the few sources it needs, not through CMake,
# so that the rest of the tree keeps its gcc build.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/build-fuzz"
seeds="$root/tests/fuzz/corpus"
cxx=${CXX_FUZZ:-clang++}

mode=run
seconds=60
case "${1:-}" in
  --seed) mode=seed ;;
  "") ;;
  *[!0-9]* | 0) echo "usage: scripts/fuzz.sh [SECONDS] | --seed" >&2; exit 2 ;;
  *) seconds=$1 ;;
esac

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz: $cxx not found; run scripts/install-deps.sh" >&2
  exit 2
fi

sources=(
  "$root/tests/fuzz/frame_fuzz.cpp"
  "$root/federation/frame.cpp"
  "$root/federation/messages.cpp"
  "$root/certs/identity.cpp"
  "$root/base/result.cpp"
)
flags=(-std=c++20 -O1 -g -Wall -Wextra -I"$root")
mkdir -p "$out"

if [[ $mode == seed ]]; then
  "$cxx" "${flags[@]}" -DENTENTE_FUZZ_SEED_MAIN "${sources[@]}" -o "$out/frame_fuzz_seed"
  mkdir -p "$seeds"
  "$out/frame_fuzz_seed" "$seeds"
  echo "fuzz: seeds written to $seeds: $(ls "$seeds" | wc -l) files"
  exit 0
fi

echo "fuzz: building $out/frame_fuzz"
"$cxx" "${flags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -fno-omit-frame-pointer "${sources[@]}" -o "$out/frame_fuzz"

# The corpus grows across runs in build-fuzz/; the committed seeds are
# copied in each time so that a fresh checkout starts from them.
corpus="$out/corpus"
artifacts="$out/artifacts"
mkdir -p "$corpus" "$artifacts"
cp "$seeds"/* "$corpus"/

echo "fuzz: running for ${seconds}s"
# libFuzzer exits non-zero on a crash, a sanitizer report, an abort from an
# invariant check, a leak, a timeout or running out of memory; the input
# that did it is left in build-fuzz/artifacts/.
# Its progress lines go to a log; the summary (or the whole report on a
# finding) is printed.
log="$out/fuzz.log"
status=0
"$out/frame_fuzz" -max_total_time="$seconds" -max_len=70000 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$artifacts/" -print_final_stats=1 "$corpus" >"$log" 2>&1 || status=$?
if [[ $status -ne 0 ]]; then
  tail -n 80 "$log" >&2
  echo "fuzz: FAILED (exit $status); reproduce with: $out/frame_fuzz $artifacts/<file>; log in $log" >&2
  exit 1
fi
grep -E '^(stat::|Done )' "$log" || true
echo "fuzz: no findings in ${seconds}s (log in $log)"
