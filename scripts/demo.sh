#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job:
#   1. NEXMark on the engine: throughput, checked row for row against
#      hand-written references;
#   2. a broker node: NEXMark bids published to it over HTTP, the hot-items
#      query (NEXMark q5) deployed on it, and its results arriving over a
#      WebSocket subscription.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target nexmark entente

events=${EVENTS:-1000000}
out=out/demo
rm -rf "$out"
mkdir -p "$out"

echo "== 1. NEXMark on the engine ($events events)"
build/bench/nexmark --events "$events" --dump "$out/nexmark"

echo
echo "== 2. A broker node"
token=demo-admin-token
cat >"$out/node.json" <<JSON
{
  "domain": "acme", "node": "n1",
  "api": {"listen": "127.0.0.1:0", "tls": false},
  "data_dir": "data",
  "tokens": [{"name": "demo", "role": "admin", "sha256": "$(build/broker/entente token-hash $token)"}],
  "checkpoint_interval": "1s"
}
JSON
build/broker/entente broker --config "$out/node.json" >"$out/node.out" 2>"$out/node.err" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q 'listening on' "$out/node.out" 2>/dev/null && break; sleep 0.1; done
cat "$out/node.out"
port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$out/node.out")
base=http://127.0.0.1:$port
auth=(-H "Authorization: Bearer $token")

echo "-- register the stream 'bids'"
curl -sS -f "${auth[@]}" -H 'Content-Type: application/json' "$base/v1/streams" --data '{
  "name": "bids", "event_time": "date_time",
  "schema": [{"name": "auction", "type": "int64"}, {"name": "bidder", "type": "int64"},
             {"name": "price", "type": "int64"}, {"name": "channel", "type": "string"},
             {"name": "url", "type": "string"}, {"name": "date_time", "type": "timestamp"},
             {"name": "extra", "type": "string"}]}'
echo
echo "-- deploy the hot-items query (NEXMark q5: auctions with the most bids per sliding window)"
sed -e 's/"name": "nexmark-q5"/"name": "hot-items"/' -e 's/"name": "out"/"name": "hot_items"/' \
  bench/nexmark/queries/q5.json >"$out/hot-items.json"
curl -sS -f "${auth[@]}" -H 'Content-Type: application/json' "$base/v1/queries" --data @"$out/hot-items.json" \
  | head -c 300
echo " ..."

echo "-- subscribe to 'hot_items' over WebSocket"
ENTENTE_TOKEN=$token build/broker/entente subscribe --port "$port" --from 1 --timeout-ms 4000 hot_items \
  >"$out/hot_items.ndjson" &
sub=$!

echo "-- publish the NEXMark bids over HTTP, 20000 per request"
split -l 20000 "$out/nexmark/bids.ndjson" "$out/chunk-"
start=$(date +%s.%N)
n=0
for f in "$out"/chunk-*; do
  curl -sS -f "${auth[@]}" -H 'Content-Type: application/x-ndjson' --data-binary @"$f" \
    "$base/v1/streams/bids/tuples" >/dev/null
  n=$((n + $(wc -l <"$f")))
done
end=$(date +%s.%N)
rm -f "$out"/chunk-*
secs=$(awk "BEGIN { printf \"%.2f\", $end - $start }")
echo "published $n bids in $secs s: $(awk "BEGIN { printf \"%.0f\", $n / $secs }") bids/s (durable, acknowledged)"

wait $sub || true
echo
echo "-- results that arrived over the subscription: $(wc -l <"$out/hot_items.ndjson") rows; the first five:"
head -n 5 "$out/hot_items.ndjson"
echo "-- the query's boxes, as the node reports them:"
curl -sS -f "${auth[@]}" "$base/v1/queries/hot-items" | grep -o '"boxes":\[[^]]*\]' | head -c 600
echo
echo "-- all rows in $out/hot_items.ndjson; the node's data in $out/data"
