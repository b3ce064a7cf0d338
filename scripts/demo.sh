#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job:
#   1. NEXMark on the engine: throughput, checked row for row against
#      hand-written references;
#   2. two domains on loopback, acme and beta, one broker node each, linked
#      by mutually authenticated TLS with certificates made by `entente
#      certs`: acme ingests the NEXMark bids into its stream `bids` and
#      exports it to beta; beta runs the hot-items query (NEXMark q5) on
#      `acme/bids`, fed across the link, and its results arrive on beta over
#      a WebSocket subscription.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target nexmark entente

events=${EVENTS:-1000000}
out=out/demo
entente=build/broker/entente
rm -rf "$out"
mkdir -p "$out"

echo "== 1. NEXMark on the engine ($events events)"
build/bench/nexmark --events "$events" --dump "$out/nexmark"

echo
echo "== 2. Two domains: acme owns the bids, beta runs the query on them"
token=demo-admin-token
# api [curl options] URL: one call to a node's API, failing the demo on an error.
api() { curl -sS -f --max-time 30 -H "Authorization: Bearer $token" "$@"; }

echo "-- certificates: a CA per domain, a node certificate per node (entente certs)"
for d in acme beta; do
  "$entente" certs init-domain "$d" --out "$out/certs/$d-ca" >/dev/null
  "$entente" certs issue-node "$d" n1 --ca "$out/certs/$d-ca" --san 127.0.0.1,localhost \
    --out "$out/certs/$d-n1" >/dev/null
  "$entente" certs show "$out/certs/$d-n1/node.crt" | grep -E '^(identity|issuer|sha256)' | sed 's/^/   /'
done

# The federation listeners need known ports, since each node's configuration
# names the other's address.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
acme_link=127.0.0.1:$(free_port)
beta_link=127.0.0.1:$(free_port)

# node_config DOMAIN LISTEN PEER PEER_LISTEN EXPORTS: each node pins the other
# domain's CA (no CA is shared between them) and lists its address.
node_config() {
  cat <<JSON
{
  "domain": "$1", "node": "n1",
  "api": {"listen": "127.0.0.1:0", "tls": false},
  "data_dir": "$1-data",
  "tokens": [{"name": "demo", "role": "admin", "sha256": "$("$entente" token-hash $token)"}],
  "checkpoint_interval": "1s",
  "federation": {
    "listen": "$2",
    "cert_file": "certs/$1-n1/node.crt", "key_file": "certs/$1-n1/node.key", "ca_file": "certs/$1-ca/ca.crt",
    "peers": [{"domain": "$3", "ca_file": "certs/$3-ca/ca.crt", "nodes": [{"node": "n1", "address": "$4"}]}],
    "exports": [$5]
  }
}
JSON
}
node_config acme "$acme_link" beta "$beta_link" '{"stream": "bids", "to": ["beta"]}' >"$out/acme.json"
node_config beta "$beta_link" acme "$acme_link" '' >"$out/beta.json"
echo "-- acme's federation section: it pins beta's CA and exports 'bids' to beta"
sed -n '/"federation"/,/^  }/p' "$out/acme.json"

pids=()
stop_nodes() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for _ in $(seq 100); do kill -0 "${pids[@]}" 2>/dev/null || break; sleep 0.1; done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap stop_nodes EXIT
start_node() {
  "$entente" broker --config "$out/$1.json" >"$out/$1.out" 2>"$out/$1.err" &
  pids+=($!)
  for _ in $(seq 100); do grep -q 'listening on' "$out/$1.out" 2>/dev/null && break; sleep 0.1; done
  sed 's/^/   /' "$out/$1.out"
}
api_port() { sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$out/$1.out"; }
echo "-- start both nodes"
start_node acme
start_node beta
acme_port=$(api_port acme)
beta_port=$(api_port beta)
acme=http://127.0.0.1:$acme_port
beta=http://127.0.0.1:$beta_port

echo "-- acme: register the stream 'bids'"
api -H 'Content-Type: application/json' "$acme/v1/streams" --data '{
  "name": "bids", "event_time": "date_time",
  "schema": [{"name": "auction", "type": "int64"}, {"name": "bidder", "type": "int64"},
             {"name": "price", "type": "int64"}, {"name": "channel", "type": "string"},
             {"name": "url", "type": "string"}, {"name": "date_time", "type": "timestamp"},
             {"name": "extra", "type": "string"}]}'
echo

echo "-- wait for the peer link (mutual TLS 1.3, each side checks the other against the CA it pinned)"
for _ in $(seq 100); do
  api "$beta/v1/peers" | grep -q '"state":"up"' && break
  sleep 0.1
done

echo "-- beta: import acme/bids (acme checks its exports; beta keeps a mirror with acme's sequence numbers)"
api -H 'Content-Type: application/json' "$beta/v1/imports" --data '{"stream": "acme/bids"}' \
  | sed -e 's/"schema":\[[^]]*\]/"schema":[...]/'
echo
echo "-- beta: deploy the hot-items query (NEXMark q5) on it: its input says \"stream\": \"acme/bids\""
sed -e 's/"name": "nexmark-q5"/"name": "hot-items"/' -e 's/"name": "out"/"name": "hot_items"/' \
  -e 's/{"name": "bids", "event_time"/{"name": "bids", "stream": "acme\/bids", "event_time"/' \
  bench/nexmark/queries/q5.json >"$out/hot-items.json"
api -H 'Content-Type: application/json' "$beta/v1/queries" --data @"$out/hot-items.json" | head -c 300
echo " ..."

echo "-- beta: subscribe to 'hot_items' over WebSocket, and to the imported 'acme/bids' itself"
ENTENTE_TOKEN=$token "$entente" subscribe --port "$beta_port" --from 1 --timeout-ms 4000 hot_items \
  >"$out/hot_items.ndjson" &
sub=$!
ENTENTE_TOKEN=$token "$entente" subscribe --port "$beta_port" --from 1 --count 3 --timeout-ms 10000 acme/bids \
  >"$out/acme-bids-on-beta.ndjson" &
sub_bids=$!

echo "-- acme: publish the NEXMark bids over HTTP, 20000 per request"
split -l 20000 "$out/nexmark/bids.ndjson" "$out/chunk-"
start=$(date +%s.%N)
n=0
for f in "$out"/chunk-*; do
  api -H 'Content-Type: application/x-ndjson' --data-binary @"$f" "$acme/v1/streams/bids/tuples" >/dev/null
  n=$((n + $(wc -l <"$f")))
done
end=$(date +%s.%N)
rm -f "$out"/chunk-*
secs=$(awk "BEGIN { printf \"%.2f\", $end - $start }")
echo "published $n bids to acme in $secs s: $(awk "BEGIN { printf \"%.0f\", $n / $secs }") bids/s (durable, acknowledged)"

echo "-- wait until beta's mirror of acme/bids holds them all"
for _ in $(seq 600); do
  api "$beta/v1/imports/acme/bids" | grep -q "\"next_seq\":$((n + 1))[,}]" && break
  sleep 0.1
done
api "$beta/v1/imports/acme/bids" | sed -e 's/"schema":\[[^]]*\]/"schema":[...]/'
echo

wait $sub_bids || true
wait $sub || true
echo
echo "-- the first bids as beta's subscriber saw them (acme's sequence numbers):"
cat "$out/acme-bids-on-beta.ndjson"
echo "-- results on beta that arrived over the subscription: $(wc -l <"$out/hot_items.ndjson") rows; the first five:"
head -n 5 "$out/hot_items.ndjson"
echo "-- the query's boxes, as beta reports them:"
api "$beta/v1/queries/hot-items" | grep -o '"boxes":\[[^]]*\]' | head -c 600
echo
for node in acme beta; do
  base=$acme
  [[ $node == beta ]] && base=$beta
  echo "-- GET /v1/peers on $node:"
  api "$base/v1/peers" | python3 -m json.tool
done
echo "-- all rows in $out/hot_items.ndjson; the nodes' data in $out/acme-data and $out/beta-data"
