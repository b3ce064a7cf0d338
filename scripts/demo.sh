#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job: NEXMark query
# networks on the Entente engine, checked against hand-written references,
# with their throughput and a sample of each query's results.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target nexmark

out=out/nexmark
rm -rf "$out"
build/bench/nexmark --events "${EVENTS:-5000000}" --dump "$out"
echo
echo "Sample results (first 3 rows of each query; all rows in $out/q*.ndjson):"
for f in "$out"/q*.ndjson; do
  echo "-- $(basename "$f" .ndjson): $(wc -l <"$f") rows"
  head -n 3 "$f"
done
