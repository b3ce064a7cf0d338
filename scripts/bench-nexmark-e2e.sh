#!/usr/bin/env bash
# NEXMark end to end through the broker (docs/nexmark.md, "End to end
# through the broker"). Starts two nodes (temporary data directories, plain
# HTTP on loopback), one with ingest_durability "fsync" (the default) and one
# with "process", runs nexmark_e2e against each (each JSON line names its
# node's mode), and stops them.
#   scripts/bench-nexmark-e2e.sh [nexmark_e2e options, e.g. --events 5000000 --queries q5,q8]
# Environment: BUILD_DIR (default build), NETWORK_THREADS (default 2),
# MODES (default "fsync process"), PERF=1: record each node with
# `perf record -g` into $PERF_OUT.MODE (default /tmp/nexmark-e2e.perf.data.MODE;
# a cluster's nodes into $PERF_OUT.MODE.n1 .. .n3).
#
# NODES=3: per mode, first the one-node run above (the baseline; BASELINE=0
# leaves it out), then a domain of three nodes n1..n3: its own etcd
# (ETCD, default /usr/bin/etcd, on free loopback ports with a temporary data
# directory) and three nodes with a `cluster` section, the same tokens, plain
# HTTP on loopback. Once GET /v1/nodes on each lists three nodes up,
# nexmark_e2e runs with the three ports: the inputs led by n1 (so the query
# runs there), the query deployed through n2, persons published through n1,
# auctions through n2, bids through n3, the output read through n3 (every
# call not made to n1 is forwarded by its node to n1). After each pair of
# lines one line {"bench":"nexmark_e2e_nodes_ratio",...} gives three nodes'
# events/s over one node's. Exit status 77 (skipped) when etcd is not installed.
#
# NODES=3 CUT=1: the domain's three nodes run each query cut into fragments
# (nexmark_e2e --cut; docs/nexmark.md): persons led by n1, auctions by n2,
# bids by n3, each published through its leader; q5's `counts` on n3 and
# `hot` on n1, q8's `people` on n1, `sellers` on n2, `new_users` on n3, the
# arcs between them internal streams over the nodes' mutual-TLS peer links.
# For those the script makes the domain's CA and each node's certificate
# with `entente certs` (init-domain, issue-node) and gives each node a
# `federation` section (listener on an ephemeral loopback port, which the
# node announces in etcd; its certificate and key; ca_file the domain's CA;
# no peers: the nodes find each other through the membership). The ratio
# line then says "cut":true.
#
# CHECKPOINTS=1 (one node): per mode, the one-node run (queries checkpointed
# every second, the default) and then the same on a fresh node whose
# checkpoint_interval is 1h (no checkpoint during the run); one line
# {"bench":"nexmark_e2e_checkpoint_overhead",...} per query gives the
# throughput lost to checkpoints, 1 - with / without (target below 0.05).
# With NODES=3 (CUT=1 or not): the same for the three-node domain, run a
# second time on fresh nodes with checkpoint_interval 1h; the line then says
# "nodes":3 (and "cut":true: each fragment's checkpoints are appended to its
# replicated state stream, so the figure includes copying them to the
# followers).
#
# The nodes accept a query falling behind by any number of tuples
# (limits.query_max_lag_tuples 2^40) and 1 GiB of ingest queue: the bench
# keeps 16 batches in flight per stream, and a batch refused by back-pressure
# (429/503) could only be sent again after the ones behind it were stored,
# out of its stream's event-time order. The figure is then the query's pace,
# not the ingest's.
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=${NODES:-1}
[[ $nodes == 1 || $nodes == 3 ]] || { echo "NODES is 1 or 3" >&2; exit 2; }
cut=${CUT:-0}
[[ $cut == 0 || $nodes == 3 ]] || { echo "CUT=1 needs NODES=3" >&2; exit 2; }
etcd_bin=${ETCD:-/usr/bin/etcd}
if [[ $nodes == 3 && ! -x $etcd_bin ]]; then
  echo "etcd is not installed ($etcd_bin): apt-get install etcd-server (scripts/install-deps.sh)" >&2
  exit 77
fi
build=${BUILD_DIR:-build}
[[ -x $build/broker/entente && -x $build/bench/nexmark_e2e ]] || {
  echo "build first: cmake -S . -B $build && cmake --build $build --target entente nexmark_e2e" >&2
  exit 2
}
dir=$(mktemp -d /tmp/entente-nexmark-e2e-XXXXXX)
token=bench-admin-token
pids=()
# Also stops everything and removes $dir on exit, and sets $hash.
# shellcheck source=lib/bench-domain.sh
source scripts/lib/bench-domain.sh

# start_node NAME MODE [NODE CLUSTER_JSON [FEDERATION_JSON]]: starts a node
# in $dir/NAME (named NODE, default NAME, with `"cluster": CLUSTER_JSON` and
# `"federation": FEDERATION_JSON` when given) and sets $port and $node_pid.
start_node() {
  local name=$1 mode=$2 node=${3:-$1} cluster=""
  [[ -z ${4:-} ]] || cluster=" \"cluster\": $4,"
  [[ -z ${5:-} ]] || cluster="$cluster \"federation\": $5,"
  mkdir -p "$dir/$name"
  cat >"$dir/$name/node.json" <<JSON
{
  "domain": "bench", "node": "$node",$cluster
  "api": {"listen": "127.0.0.1:0", "tls": false},
  "data_dir": "$dir/$name/data",
  "tokens": [{"name": "bench", "role": "admin", "sha256": "$hash"}],
  "ingest_durability": "$mode",
  "checkpoint_interval": "${CHECKPOINT_INTERVAL:-1s}",
  "threads": {"network": ${NETWORK_THREADS:-2}, "engine": 1},
  "limits": {"query_max_lag_tuples": 1099511627776, "ingest_queue_bytes": "1GiB"}
}
JSON
  local run=()
  if [[ ${PERF:-0} == 1 ]]; then
    run=(perf record -g -o "${PERF_OUT:-/tmp/nexmark-e2e.perf.data}.$mode${3:+.$node}" --)
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

# The e2e_events_per_s of the line of query $2 in file $1 ("null" if none).
rate_of() {
  grep "\"query\":\"$2\"" "$1" | sed -n 's/.*"e2e_events_per_s":\([0-9.]*\|null\).*/\1/p' | tail -1
}

# The node_cpu_us_per_event of the line of query $2 in file $1.
cpu_of() {
  grep "\"query\":\"$2\"" "$1" | sed -n 's/.*"node_cpu_us_per_event":\([0-9.]*\).*/\1/p' | tail -1
}

# checkpoint_overhead WITH WITHOUT MODE NODES CUT: one line per query in
# both files, the throughput (and node CPU) lost to checkpoints.
checkpoint_overhead() {
  local with=$1 without=$2 q r1 r0 c1 c0
  for q in $(sed -n 's/.*"query":"\([a-z0-9]*\)".*/\1/p' "$without"); do
    r1=$(rate_of "$with" "$q") r0=$(rate_of "$without" "$q")
    [[ -n $r1 && $r1 != null && -n $r0 && $r0 != null ]] || continue
    c1=$(cpu_of "$with" "$q") c0=$(cpu_of "$without" "$q")
    awk -v q="$q" -v m="$3" -v n="$4" -v k="$5" -v a="$r1" -v b="$r0" -v c="${c1:-0}" -v d="${c0:-0}" 'BEGIN {
      printf "{\"bench\":\"nexmark_e2e_checkpoint_overhead\",\"query\":\"%s\",\"nodes\":%s,\"cut\":%s,", q, n, k
      printf "\"ingest_durability\":\"%s\",\"checkpoint_interval\":\"1s\",", m
      printf "\"events_per_s_with\":%.0f,\"events_per_s_without\":%.0f,", a, b
      printf "\"overhead\":%.3f,\"node_cpu_us_per_event_with\":%s,\"node_cpu_us_per_event_without\":%s,", 1 - a / b, c, d
      printf "\"cpu_overhead\":%.3f,\"target_overhead\":0.05}\n", (d > 0 ? c / d - 1 : 0) }'
  done
}

# run_three MODE OUT: a domain of three nodes (its own etcd), nexmark_e2e
# against it (its lines into OUT), then everything stopped.
run_three() {
  local mode=$1 out=$2 n federation up cluster name
  start_etcd
  cluster="{\"etcd\": [\"$etcd_endpoint\"], \"prefix\": \"/entente-bench/$mode/\", \"lease_ttl\": \"5s\"}"
  ports=() node_pids=()
  for n in n1 n2 n3; do
    federation=""
    [[ $cut == 0 ]] || federation=$(federation_of $n)
    name=$mode-$n-$(basename "$out")
    start_node "$name" "$mode" "$n" "$cluster" "$federation"
    ports+=(--port "$port")
    node_pids+=(--node-pid "$node_pid")
  done
  up=0
  for _ in $(seq 200); do
    nodes_up "${ports[1]}" && nodes_up "${ports[3]}" && nodes_up "${ports[5]}" && { up=1; break; }
    sleep 0.1
  done
  if [[ $up == 0 ]]; then
    echo "the three nodes ($mode) did not all list three nodes up within 20 s:" >&2
    for n in n1 n2 n3; do tail -5 "$dir/$mode-$n-$(basename "$out")/err" >&2; done
    exit 1
  fi
  local cut_flag=()
  [[ $cut == 0 ]] || cut_flag=(--cut)
  "$build/bench/nexmark_e2e" "${ports[@]}" "${node_pids[@]}" "${cut_flag[@]}" --token "$token" "${args[@]}" |
    tee "$out" || status=$?
  stop_all
}

[[ $cut == 0 ]] || make_certs  # with CUT=1, the nodes' certificates

args=("$@")
status=0
for mode in ${MODES:-fsync process}; do
  one=$dir/one.$mode three=$dir/three.$mode
  : >"$one"
  if [[ $nodes == 1 || ${BASELINE:-1} == 1 ]]; then
    start_node "$mode" "$mode"
    "$build/bench/nexmark_e2e" --port "$port" --node-pid "$node_pid" --token "$token" "$@" | tee "$one" || status=$?
    stop_all
  fi
  if [[ ${CHECKPOINTS:-0} == 1 && $nodes == 1 ]]; then
    none=$dir/none.$mode
    CHECKPOINT_INTERVAL=1h start_node "$mode-nocp" "$mode"
    "$build/bench/nexmark_e2e" --port "$port" --node-pid "$node_pid" --token "$token" "$@" | tee "$none" || status=$?
    stop_all
    checkpoint_overhead "$one" "$none" "$mode" 1 false
  fi
  [[ $nodes == 3 ]] || continue
  run_three "$mode" "$three"
  if [[ ${CHECKPOINTS:-0} == 1 ]]; then
    CHECKPOINT_INTERVAL=1h run_three "$mode" "$three.nocp"
    checkpoint_overhead "$three" "$three.nocp" "$mode" 3 "$([[ $cut == 1 ]] && echo true || echo false)"
  fi
  # Three nodes' events/s over one node's, per query in both files.
  for q in $(sed -n 's/.*"query":"\([a-z0-9]*\)".*/\1/p' "$three"); do
    r1=$(rate_of "$one" "$q") r3=$(rate_of "$three" "$q")
    [[ -n $r1 && $r1 != null && -n $r3 && $r3 != null ]] || continue
    awk -v q="$q" -v m="$mode" -v a="$r1" -v b="$r3" -v c="$([[ $cut == 1 ]] && echo true || echo false)" 'BEGIN {
      printf "{\"bench\":\"nexmark_e2e_nodes_ratio\",\"query\":\"%s\",\"cut\":%s,\"ingest_durability\":\"%s\",", q, c, m
      printf "\"one_node_events_per_s\":%.0f,\"three_nodes_events_per_s\":%.0f,\"three_over_one\":%.3f,", a, b, b / a
      printf "\"target_three_over_one\":0.7}\n" }'
  done
done
exit $status
