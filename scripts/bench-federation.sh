#!/usr/bin/env bash
# Starts two nodes of two domains (temporary directories, plain HTTP API on
# loopback, default durable ingest), acme/n1 exporting `bids` to beta and
# beta/n1 importing it, each pinning the other's CA made with the real
# `entente certs init-domain` / `issue-node`; runs bench/federation's figures
# (a stream from acme to a subscriber on beta over the peer link, with a
# local subscriber on acme as the same-run baseline) and stops them.
#   scripts/bench-federation.sh [federation_bench options, e.g. --seconds 5 --only latency]
# Environment: BUILD_DIR (default build), NETWORK_THREADS (default 2),
# PERF_DIR: when set, `perf record` follows each node during the bench and
# writes PERF_DIR/acme.perf.data and PERF_DIR/beta.perf.data (PERF_OPTS,
# default -g; e.g. "--call-graph dwarf -F 499" for a build without frame
# pointers). CONTRACT=1: the stream crosses under a negotiated stream
# contract instead of a configured export. IMPORT_WINDOW (e.g. 32MiB): beta's federation.import_window
# (the byte credit its import grants acme), default the node's 8MiB.
# INTERNAL=1: two nodes of ONE domain instead, acme/n1 and acme/n2, each
# listing the other among its own domain's peers (no export), and the
# internal-arc figure (federation_bench --internal: n2 reads n1's `bids`
# into its mirror "@n1/bids"); "acme" below is then n1 and "beta" n2.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
entente=$build/broker/entente
[[ -x $entente && -x $build/bench/federation_bench ]] || {
  echo "build first: cmake -S . -B $build && cmake --build $build --target entente federation_bench" >&2
  exit 2
}
dir=$(mktemp -d /tmp/entente-fedbench-XXXXXX)
token=bench-admin-token
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
hash=$("$entente" token-hash $token)

# Two free loopback ports for the federation listeners (each node's config
# names the other's address, so they cannot be ephemeral).
read -r acme_fed beta_fed < <(python3 - <<'PY'
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])
PY
)

if [[ -n ${INTERNAL:-} ]]; then
  # One domain: the CA of acme signs both nodes; beta's files name n2.
  "$entente" certs init-domain acme --out "$dir/acme-ca" >/dev/null
  "$entente" certs issue-node acme n1 --ca "$dir/acme-ca" --san 127.0.0.1,localhost --out "$dir/acme-n1" >/dev/null
  "$entente" certs issue-node acme n2 --ca "$dir/acme-ca" --san 127.0.0.1,localhost --out "$dir/beta-n1" >/dev/null
  cp -r "$dir/acme-ca" "$dir/beta-ca"
else
  for d in acme beta; do
    "$entente" certs init-domain $d --out "$dir/$d-ca" >/dev/null
    "$entente" certs issue-node $d n1 --ca "$dir/$d-ca" --san 127.0.0.1,localhost --out "$dir/$d-n1" >/dev/null
  done
fi

# write_config DOMAIN FED_PORT PEER PEER_FED_PORT EXPORTS
write_config() {
  local d=$1 fport=$2 peer=$3 pport=$4 exports=$5 window="" domain=$1 node=n1 peer_domain=$3 peer_node=n1
  [[ -n ${IMPORT_WINDOW:-} ]] && window=" \"import_window\": \"$IMPORT_WINDOW\","
  if [[ -n ${INTERNAL:-} ]]; then
    domain=acme peer_domain=acme
    [[ $d == beta ]] && node=n2 || peer_node=n2
  fi
  mkdir -p "$dir/$d"
  cat >"$dir/$d/node.json" <<JSON
{
  "domain": "$domain", "node": "$node",
  "api": {"listen": "127.0.0.1:0", "tls": false},
  "data_dir": "$dir/$d/data",
  "tokens": [{"name": "bench", "role": "admin", "sha256": "$hash"}],
  "threads": {"network": ${NETWORK_THREADS:-2}, "engine": 1},
  "federation": {
    "listen": "127.0.0.1:$fport",
    "cert_file": "$dir/$d-n1/node.crt",
    "key_file": "$dir/$d-n1/node.key",
    "ca_file": "$dir/$d-ca/ca.crt",$window
    "peers": [{"domain": "$peer_domain", "ca_file": "$dir/$peer-ca/ca.crt",
               "nodes": [{"node": "$peer_node", "address": "127.0.0.1:$pport"}]}],
    "exports": $exports
  }
}
JSON
}
# CONTRACT=1: no configured export; the bench negotiates a stream contract
# (enforced and metered on the wire) before beta imports acme/bids.
bench_args=()
if [[ -n ${INTERNAL:-} ]]; then
  write_config acme "$acme_fed" beta "$beta_fed" '[]'
  bench_args+=(--internal)
elif [[ -n ${CONTRACT:-} ]]; then
  write_config acme "$acme_fed" beta "$beta_fed" '[]'
  bench_args+=(--contract)
else
  write_config acme "$acme_fed" beta "$beta_fed" '[{"stream": "bids", "to": ["beta"]}]'
fi
write_config beta "$beta_fed" acme "$acme_fed" '[]'

# start_node DOMAIN: starts the node of $dir/DOMAIN and sets $port.
start_node() {
  local d=$1
  "$entente" broker --config "$dir/$d/node.json" >"$dir/$d/out" 2>"$dir/$d/err" &
  pids+=($!)
  for _ in $(seq 100); do
    grep -q 'listening on' "$dir/$d/out" 2>/dev/null && break
    sleep 0.1
  done
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$dir/$d/out")
  [[ -n $port ]] || { echo "node $d did not start:" >&2; cat "$dir/$d/err" >&2; exit 1; }
}

start_node acme
acme_port=$port
acme_pid=${pids[-1]}
start_node beta
beta_port=$port
beta_pid=${pids[-1]}
perfs=()
if [[ -n ${PERF_DIR:-} ]]; then
  mkdir -p "$PERF_DIR"
  for d in acme beta; do
    pid_var=${d}_pid
    perf record ${PERF_OPTS:--g} -o "$PERF_DIR/$d.perf.data" -p "${!pid_var}" 2>"$dir/$d/perf.err" &
    perfs+=($!)
  done
fi
stop_perf() {
  for p in "${perfs[@]}"; do kill -INT "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  perfs=()
}
"$build/bench/federation_bench" --owner-port "$acme_port" --importer-port "$beta_port" --token "$token" \
  "${bench_args[@]}" "$@" || {
  status=$?
  stop_perf
  for d in acme beta; do echo "--- $d log:" >&2; tail -20 "$dir/$d/out" "$dir/$d/err" >&2; done
  exit $status
}
stop_perf
