#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job:
#   1. NEXMark on the engine: throughput, checked row for row against
#      hand-written references;
#   2. two domains on loopback, acme and beta, one broker node each, linked
#      by mutually authenticated TLS with certificates made by `entente
#      certs`: the two admins negotiate a stream contract over their own
#      brokers' REST APIs (propose, counter, accept; both sign it); acme
#      ingests the NEXMark bids into its stream `bids`; beta runs the
#      hot-items query (NEXMark q5) on `acme/bids`, fed across the link under
#      the contract, and its results arrive on beta over a WebSocket
#      subscription; acme meters what crossed.
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

# node_config DOMAIN LISTEN PEER PEER_LISTEN: each node pins the other
# domain's CA (no CA is shared between them) and lists its address. Nothing
# is exported by configuration: the stream crosses under a contract.
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
    "peers": [{"domain": "$3", "ca_file": "certs/$3-ca/ca.crt", "nodes": [{"node": "n1", "address": "$4"}]}]
  }
}
JSON
}
node_config acme "$acme_link" beta "$beta_link" >"$out/acme.json"
node_config beta "$beta_link" acme "$acme_link" >"$out/beta.json"
echo "-- acme's federation section: its certificate, and beta's pinned CA and address"
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

# show_contract: one line with a contract's id, version and state, from a
# node's JSON answer.
show_contract() {
  { cat; echo; } | sed -n 's/.*"id":"\(c-[0-9a-f]*\)".*"state":"\([a-z]*\)".*"version":\([0-9]*\).*/   \1 version \3: \2/p'
}
version_of() { api "$1/v1/contracts/$2" | sed -n 's/.*"version":\([0-9]*\).*/\1/p'; }
wait_version() {
  for _ in $(seq 100); do
    [ "$(version_of "$1" "$2" 2>/dev/null)" = "$3" ] && return 0
    sleep 0.1
  done
  echo "contract $2 never reached version $3 on $1" >&2
  return 1
}

echo "-- acme's admin proposes a stream contract to beta: bids, 5 credits per million tuples, for a day"
from=$(date -u -d '-1 min' +%Y-%m-%dT%H:%M:%SZ)
until=$(date -u -d '+1 day' +%Y-%m-%dT%H:%M:%SZ)
terms() {
  echo '{"kind": "stream", "provider": "acme", "consumer": "beta", "streams": ["bids"],
         "price_per_million": '"$1"', "valid_from": "'"$from"'", "valid_until": "'"$until"'"}'
}
proposed=$(api -H 'Content-Type: application/json' "$acme/v1/contracts" --data "{\"terms\": $(terms 5)}")
id=$(echo "$proposed" | sed -n 's/.*"id":"\(c-[0-9a-f]*\)".*/\1/p')
echo "$proposed" | show_contract
wait_version "$beta" "$id" 1
echo "-- beta's admin sees the proposal on its own broker, and counters at 3 credits"
api "$beta/v1/contracts?state=proposed" | grep -o "\"$id\"" | sed 's/^/   received /'
api -H 'Content-Type: application/json' "$beta/v1/contracts/$id/counter" \
  --data "{\"version\": 1, \"terms\": $(terms 3)}" | show_contract
wait_version "$acme" "$id" 2
echo "-- acme's admin accepts (signs with acme's node key); beta countersigns on receipt"
api -H 'Content-Type: application/json' "$acme/v1/contracts/$id/accept" --data '{"version": 2}' | show_contract
wait_version "$beta" "$id" 4
wait_version "$acme" "$id" 4
for side in acme beta; do
  url=$acme; [ $side = beta ] && url=$beta
  c=$(api "$url/v1/contracts/$id")
  echo "   on $side: $(echo "$c" | show_contract | sed 's/^ *//'), $(echo "$c" | grep -o '"in_force":[a-z]*'), signed by: $(echo "$c" | grep -o '"domain":"[a-z0-9-]*"' | sort -u | sed 's/"domain":"\(.*\)"/\1/' | tr '\n' ' ')"
done
echo

echo "-- beta: import acme/bids (acme checks the contract; beta keeps a mirror with acme's sequence numbers)"
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
# Each request names its batch (producer id and number), so that a retry
# after a lost answer is stored once (docs/api.md, "Publishing exactly once").
# The generator's dump is engine output: each row starts with its own _seq
# and _time, which a publisher may not send (the node numbers tuples, and
# bids' event time is date_time): drop them.
sed -E 's/^\{"_seq":[0-9]+,"_time":-?[0-9]+,/{/' "$out/nexmark/bids.ndjson" | split -l 20000 - "$out/chunk-"
start=$(date +%s.%N)
n=0
batch=0
for f in "$out"/chunk-*; do
  batch=$((batch + 1))
  api --retry 5 --retry-all-errors --retry-delay 1 -H 'Content-Type: application/x-ndjson' \
    -H "Entente-Producer-Id: demo-bids-$$" -H "Entente-Producer-Seq: $batch" \
    --data-binary @"$f" "$acme/v1/streams/bids/tuples" >/dev/null
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
echo "-- acme's metering of the contract:"
api "$acme/v1/contracts/$id/usage" | sed 's/^/   /'
echo
echo "-- all rows in $out/hot_items.ndjson; the nodes' data in $out/acme-data and $out/beta-data"
