#!/usr/bin/env bash
# Starts a node (durable ingest, temporary data directory, plain HTTP on
# loopback), runs bench/broker's figures against it, and stops it.
#   scripts/bench-broker.sh [broker_bench options, e.g. --seconds 5 --only ws]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
[[ -x $build/broker/entente && -x $build/bench/broker_bench ]] || {
  echo "build first: cmake -S . -B $build && cmake --build $build" >&2
  exit 2
}
dir=$(mktemp -d /tmp/entente-bench-XXXXXX)
token=bench-admin-token
cleanup() {
  [[ -n ${pid:-} ]] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
cat >"$dir/node.json" <<JSON
{
  "domain": "bench", "node": "n1",
  "api": {"listen": "127.0.0.1:0", "tls": false},
  "data_dir": "$dir/data",
  "tokens": [{"name": "bench", "role": "admin", "sha256": "$($build/broker/entente token-hash $token)"}],
  "threads": {"network": ${NETWORK_THREADS:-2}, "engine": 1}
}
JSON
"$build/broker/entente" broker --config "$dir/node.json" >"$dir/out" 2>"$dir/err" &
pid=$!
for _ in $(seq 100); do
  grep -q 'listening on' "$dir/out" 2>/dev/null && break
  sleep 0.1
done
port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$dir/out")
[[ -n $port ]] || { echo "the node did not start:" >&2; cat "$dir/err" >&2; exit 1; }
"$build/bench/broker_bench" --port "$port" --token "$token" --fsync-dir "$dir" "$@"
