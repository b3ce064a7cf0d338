#!/usr/bin/env bash
# Starts two nodes (temporary data directories, plain HTTP on loopback), one
# with ingest_durability "fsync" (the default) and one with "process", runs
# bench/broker's figures against the fsync node and the end-to-end latency
# against both (each JSON line names its node's mode), and stops them.
#   scripts/bench-broker.sh [broker_bench options, e.g. --seconds 5 --only latency]
# Environment: BUILD_DIR (default build), NETWORK_THREADS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
[[ -x $build/broker/entente && -x $build/bench/broker_bench ]] || {
  echo "build first: cmake -S . -B $build && cmake --build $build" >&2
  exit 2
}
dir=$(mktemp -d /tmp/entente-bench-XXXXXX)
token=bench-admin-token
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
hash=$("$build/broker/entente" token-hash $token)

# start_node NAME MODE: starts a node in $dir/NAME and sets $port.
start_node() {
  local name=$1 mode=$2
  mkdir -p "$dir/$name"
  cat >"$dir/$name/node.json" <<JSON
{
  "domain": "bench", "node": "$name",
  "api": {"listen": "127.0.0.1:0", "tls": false},
  "data_dir": "$dir/$name/data",
  "tokens": [{"name": "bench", "role": "admin", "sha256": "$hash"}],
  "ingest_durability": "$mode",
  "threads": {"network": ${NETWORK_THREADS:-2}, "engine": 1}
}
JSON
  "$build/broker/entente" broker --config "$dir/$name/node.json" >"$dir/$name/out" 2>"$dir/$name/err" &
  pids+=($!)
  for _ in $(seq 100); do
    grep -q 'listening on' "$dir/$name/out" 2>/dev/null && break
    sleep 0.1
  done
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$dir/$name/out")
  [[ -n $port ]] || { echo "node $name ($mode) did not start:" >&2; cat "$dir/$name/err" >&2; exit 1; }
}

start_node n1 fsync
fsync_port=$port
start_node n2 process
process_port=$port
"$build/bench/broker_bench" --port "$fsync_port" --process-port "$process_port" --token "$token" \
  --fsync-dir "$dir" "$@"
