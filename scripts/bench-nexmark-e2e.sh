#!/usr/bin/env bash
# NEXMark end to end through the broker (docs/nexmark.md, "End to end
# through the broker"). Starts two nodes (temporary data directories, plain
# HTTP on loopback), one with ingest_durability "fsync" (the default) and one
# with "process", runs nexmark_e2e against each (each JSON line names its
# node's mode), and stops them.
#   scripts/bench-nexmark-e2e.sh [nexmark_e2e options, e.g. --events 5000000 --queries q5,q8]
# Environment: BUILD_DIR (default build), NETWORK_THREADS (default 2),
# MODES (default "fsync process"), PERF=1: record each node with
# `perf record -g` into $PERF_OUT.MODE (default /tmp/nexmark-e2e.perf.data.MODE).
#
# The nodes accept a query falling behind by any number of tuples
# (limits.query_max_lag_tuples 2^40) and 1 GiB of ingest queue: the bench
# keeps 16 batches in flight per stream, and a batch refused by back-pressure
# (429/503) could only be sent again after the ones behind it were stored,
# out of its stream's event-time order. The figure is then the query's pace,
# not the ingest's.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
[[ -x $build/broker/entente && -x $build/bench/nexmark_e2e ]] || {
  echo "build first: cmake -S . -B $build && cmake --build $build --target entente nexmark_e2e" >&2
  exit 2
}
dir=$(mktemp -d /tmp/entente-nexmark-e2e-XXXXXX)
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
  "threads": {"network": ${NETWORK_THREADS:-2}, "engine": 1},
  "limits": {"query_max_lag_tuples": 1099511627776, "ingest_queue_bytes": "1GiB"}
}
JSON
  local run=()
  if [[ ${PERF:-0} == 1 ]]; then
    run=(perf record -g -o "${PERF_OUT:-/tmp/nexmark-e2e.perf.data}.$mode" --)
  fi
  "${run[@]}" "$build/broker/entente" broker --config "$dir/$name/node.json" >"$dir/$name/out" 2>"$dir/$name/err" &
  pids+=($!)
  for _ in $(seq 100); do
    grep -q 'listening on' "$dir/$name/out" 2>/dev/null && break
    sleep 0.1
  done
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$dir/$name/out")
  [[ -n $port ]] || { echo "node $name ($mode) did not start:" >&2; cat "$dir/$name/err" >&2; exit 1; }
  # The node's own process (under perf, perf's child), for its CPU time.
  node_pid=${pids[-1]}
  if [[ ${#run[@]} -gt 0 ]]; then node_pid=$(pgrep -P "$node_pid" -x entente || echo "$node_pid"); fi
}

status=0
for mode in ${MODES:-fsync process}; do
  start_node "$mode" "$mode"
  "$build/bench/nexmark_e2e" --port "$port" --node-pid "$node_pid" --token "$token" "$@" || status=$?
done
exit $status
