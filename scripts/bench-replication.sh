#!/usr/bin/env bash
# Replicated stream logs (docs/cluster.md, "Replicated stream logs"): the
# broker's figures on a stream kept on 1, 2 and 3 nodes, in the same run.
# Per durability mode (MODES, default "fsync replicated process": each
# figure's stream's "durability", docs/cluster.md "Durability per stream";
# the nodes' ingest_durability is fsync, process for a process run) and
# factor, starts a fresh domain of three nodes
# n1..n3 on this machine: its own etcd (ETCD, default /usr/bin/etcd, free
# loopback ports, temporary data directory), the domain's CA and each node's certificate from
# `entente certs`, and each node with a `cluster` section and a `federation`
# section (mutual-TLS peer listener on an ephemeral loopback port, announced
# in etcd; no peers: the nodes find each other through the membership).
# Once every node lists three nodes up, runs broker_bench against n1 with
# --replication N and --stream-node n1 (each figure's stream led by n1,
# published to and read from n1; its followers chosen by n1), then stops
# the domain.
#   scripts/bench-replication.sh [broker_bench options, e.g. --seconds 5 --only http --only latency]
# The throughput figures run with broker_bench's own load (batches of
# 5,000 tuples, 16 WebSocket messages or 4 HTTP requests in flight); an
# append is answered once every follower of the in-sync set holds it, so
# the publisher's window is what keeps the followers close. Each line says
# whether every follower stayed in the set ("in_sync_throughout", from a
# look every 20 ms, and "max_lag_tuples"); `--in-flight T` caps the tuples
# unanswered.
# Environment: BUILD_DIR (default build), NETWORK_THREADS (default 2),
# MODES (default "fsync replicated process").
#
# Prints broker_bench's JSON lines (each with "replication": N, its
# followers' acked against the head, "followers_caught_up"), after each
# factor one line {"bench":"replication_cpu",...} with the CPU seconds each
# node spent during that factor's figures (where the time goes: n1 leads,
# n2 and n3 follow), and per mode and throughput figure one
# line {"bench":"replication_ratio",...}: factor 2's and 3's tuples/s over
# factor 1's (target 0.6 for factor 2). Exit status 1 when broker_bench
# fails (a stream's followers not in sync before a figure, or not caught up
# after it), 77 (skipped) when etcd is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
etcd_bin=${ETCD:-/usr/bin/etcd}
if [[ ! -x $etcd_bin ]]; then
  echo "etcd is not installed ($etcd_bin): apt-get install etcd-server (scripts/install-deps.sh)" >&2
  exit 77
fi
build=${BUILD_DIR:-build}
[[ -x $build/broker/entente && -x $build/bench/broker_bench ]] || {
  echo "build first: cmake -S . -B $build && cmake --build $build --target entente broker_bench" >&2
  exit 2
}
dir=$(mktemp -d /tmp/entente-bench-replication-XXXXXX)
token=bench-admin-token
pids=()
# Also stops everything and removes $dir on exit, and sets $hash.
# shellcheck source=lib/bench-domain.sh
source scripts/lib/bench-domain.sh

# start_node NAME MODE NODE CLUSTER_JSON FEDERATION_JSON: starts node NODE in
# $dir/NAME and sets $port and $node_pid.
start_node() {
  local name=$1 mode=$2 node=$3
  mkdir -p "$dir/$name"
  cat >"$dir/$name/node.json" <<JSON
{
  "domain": "bench", "node": "$node", "cluster": $4, "federation": $5,
  "api": {"listen": "127.0.0.1:0", "tls": false},
  "data_dir": "$dir/$name/data",
  "tokens": [{"name": "bench", "role": "admin", "sha256": "$hash"}],
  "ingest_durability": "$mode",
  "threads": {"network": ${NETWORK_THREADS:-2}, "engine": 1}
}
JSON
  "$build/broker/entente" broker --config "$dir/$name/node.json" >"$dir/$name/out" 2>"$dir/$name/err" &
  pids+=($!)
  node_pid=$!
  for _ in $(seq 100); do
    grep -q 'listening on' "$dir/$name/out" 2>/dev/null && break
    sleep 0.1
  done
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$dir/$name/out")
  [[ -n $port ]] || { echo "node $name ($mode) did not start:" >&2; cat "$dir/$name/err" >&2; exit 1; }
}

# cpu_seconds PID: user + system CPU seconds of process PID so far.
clk_tck=$(getconf CLK_TCK)
cpu_seconds() {
  awk -v t="$clk_tck" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / t }' "/proc/$1/stat"
}

# The tuples_per_s of figure $2 in file $1 ("" if none).
rate_of() {
  { grep "\"bench\":\"$2\"" "$1" || true; } | sed -n 's/.*"tuples_per_s":\([0-9.]*\).*/\1/p' | tail -1
}

make_certs

status=0
for mode in ${MODES:-fsync replicated process}; do
  # The nodes' ingest_durability: fsync, except for a process run; each
  # figure's stream is created with "durability": $mode.
  node_mode=fsync
  [[ $mode == process ]] && node_mode=process
  for r in 1 2 3; do
    # A fresh domain per factor: RocksDB compacting what the previous
    # factor's figures wrote would otherwise run under the next one.
    start_etcd
    cluster="{\"etcd\": [\"$etcd_endpoint\"], \"prefix\": \"/entente-bench/$mode/\", \"lease_ttl\": \"5s\"}"
    ports=() node_pids=()
    for n in n1 n2 n3; do
      rm -rf "$dir/$mode-$n"
      start_node "$mode-$n" "$node_mode" "$n" "$cluster" "$(federation_of $n)"
      ports+=("$port")
      node_pids+=("$node_pid")
    done
    up=0
    for _ in $(seq 200); do
      nodes_up "${ports[0]}" && nodes_up "${ports[1]}" && nodes_up "${ports[2]}" && { up=1; break; }
      sleep 0.1
    done
    if [[ $up == 0 ]]; then
      echo "the three nodes ($mode) did not all list three nodes up within 20 s:" >&2
      for n in n1 n2 n3; do tail -5 "$dir/$mode-$n/err" >&2; done
      exit 1
    fi
    out=$dir/r$r.$mode
    before=()
    for p in "${node_pids[@]}"; do before+=("$(cpu_seconds "$p")"); done
    t0=$(date +%s.%N)
    "$build/bench/broker_bench" --port "${ports[0]}" --replication $r --stream-node n1 --durability "$mode" \
      --token "$token" --fsync-dir "$dir" "$@" | tee "$out" || status=1
    t1=$(date +%s.%N)
    after=()
    for p in "${node_pids[@]}"; do after+=("$(cpu_seconds "$p")"); done
    awk -v m="$mode" -v r="$r" -v w="$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b - a}')" \
      -v b1="${before[0]}" -v b2="${before[1]}" -v b3="${before[2]}" \
      -v a1="${after[0]}" -v a2="${after[1]}" -v a3="${after[2]}" 'BEGIN {
      printf "{\"bench\":\"replication_cpu\",\"ingest_durability\":\"%s\",\"replication\":%d,\"wall_s\":%s,", m, r, w
      printf "\"cpu_s\":{\"n1\":%.2f,\"n2\":%.2f,\"n3\":%.2f}}\n", a1 - b1, a2 - b2, a3 - b3 }'
    stop_all
  done
  # Factor 2's and 3's tuples/s over factor 1's, per throughput figure run.
  for fig in http_ndjson_ingest ws_publish_subscribe; do
    r1=$(rate_of "$dir/r1.$mode" $fig) r2=$(rate_of "$dir/r2.$mode" $fig) r3=$(rate_of "$dir/r3.$mode" $fig)
    [[ -n $r1 && -n $r2 && -n $r3 ]] || continue
    awk -v f="$fig" -v m="$mode" -v a="$r1" -v b="$r2" -v c="$r3" 'BEGIN {
      printf "{\"bench\":\"replication_ratio\",\"figure\":\"%s\",\"ingest_durability\":\"%s\",", f, m
      printf "\"factor1_tuples_per_s\":%.0f,\"factor2_tuples_per_s\":%.0f,\"factor3_tuples_per_s\":%.0f,", a, b, c
      printf "\"two_over_one\":%.3f,\"three_over_one\":%.3f,\"target_ratio\":0.6}\n", (a > 0 ? b / a : 0), (a > 0 ? c / a : 0) }'
  done
done
exit $status