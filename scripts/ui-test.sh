#!/usr/bin/env bash
# The dashboard (docs/dashboard.md) in a real browser: two domains on
# loopback, acme and beta, one node each, linked by mutually authenticated
# TLS with certificates made by `entente certs`. acme owns the stream
# `bids`; the admins agree a stream contract (acme proposes, beta accepts),
# beta imports acme/bids and runs the hot-items query (NEXMark q5) on it,
# and acme proposes a hosting contract that beta has not answered (so it
# waits on beta's admin). Bids are published to acme meanwhile.
#
# Headless Chromium then loads beta's dashboard with its token in the URL
# fragment and a live tail of acme/bids, and the page's DOM must show: the
# peer link to acme up, the query drawn as an SVG graph of boxes and arcs,
# both contracts with the hosting one first and marked as beta's turn, the
# import, usage, and tuples received over the tail's WebSocket (the token in
# a subprotocol). A screenshot is saved to out/ui-screenshot.png (CI keeps
# it; docs/images/dashboard.png is one).
#
# Environment: BUILD_DIR (default build; needs build/broker/entente),
# CHROMIUM (default chromium). Takes about 15 s.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
entente=$build/broker/entente
chromium=${CHROMIUM:-chromium}
out=out/ui-test
shot=out/ui-screenshot.png
[[ -x $entente ]] || { echo "ui-test: no $entente; build the 'entente' target first" >&2; exit 1; }
command -v "$chromium" >/dev/null || { echo "ui-test: no $chromium (scripts/install-deps.sh installs it)" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out"

token=ui-test-admin-token
api() { curl -sS -f --max-time 10 -H "Authorization: Bearer $token" "$@"; }
post() { local u=$1; shift; api -H 'Content-Type: application/json' "$u" --data "$@"; }

pids=()
stop_all() {
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  for _ in $(seq 50); do kill -0 "${pids[@]}" 2>/dev/null || break; sleep 0.1; done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap stop_all EXIT

free_port() {
  local p
  for _ in $(seq 50); do
    p=$((10000 + RANDOM % 22000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
  echo "no free port" >&2
  return 1
}

for d in acme beta; do
  "$entente" certs init-domain $d --out "$out/certs/$d-ca" >/dev/null
  "$entente" certs issue-node $d n1 --ca "$out/certs/$d-ca" --san 127.0.0.1,localhost --out "$out/certs/$d-n1" >/dev/null
done
declare -A link url
link[acme]=127.0.0.1:$(free_port)
link[beta]=127.0.0.1:$(free_port)
hash=$("$entente" token-hash $token)
config() {  # DOMAIN PEER
  cat <<JSON
{
  "domain": "$1", "node": "n1",
  "api": {"listen": "127.0.0.1:0", "tls": false},
  "data_dir": "$1-data",
  "tokens": [{"name": "ui-test", "role": "admin", "sha256": "$hash"}],
  "federation": {
    "listen": "${link[$1]}",
    "cert_file": "certs/$1-n1/node.crt", "key_file": "certs/$1-n1/node.key", "ca_file": "certs/$1-ca/ca.crt",
    "peers": [{"domain": "$2", "ca_file": "certs/$2-ca/ca.crt", "nodes": [{"node": "n1", "address": "${link[$2]}"}]}]
  }
}
JSON
}
for d in acme beta; do
  peer=$([[ $d == acme ]] && echo beta || echo acme)
  config $d $peer >"$out/$d.json"
  "$entente" broker --config "$out/$d.json" >"$out/$d.out" 2>"$out/$d.err" &
  pids+=($!)
done
for d in acme beta; do
  for _ in $(seq 100); do grep -q 'listening on' "$out/$d.out" 2>/dev/null && break; sleep 0.1; done
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$out/$d.out")
  [[ -n $port ]] || { echo "ui-test: $d did not start:" >&2; cat "$out/$d.err" >&2; exit 1; }
  url[$d]=http://127.0.0.1:$port
done
acme=${url[acme]}
beta=${url[beta]}

for _ in $(seq 100); do api "$beta/v1/peers" 2>/dev/null | grep -q '"state":"up"' && break; sleep 0.1; done
api "$beta/v1/peers" | grep -q '"state":"up"' || { echo "ui-test: the peer link never came up" >&2; exit 1; }

post "$acme/v1/streams" '{"name": "bids", "event_time": "date_time",
  "schema": [{"name": "auction", "type": "int64"}, {"name": "bidder", "type": "int64"},
             {"name": "price", "type": "int64"}, {"name": "channel", "type": "string"},
             {"name": "url", "type": "string"}, {"name": "date_time", "type": "timestamp"},
             {"name": "extra", "type": "string"}]}' >/dev/null

from=$(date -u -d '-1 min' +%Y-%m-%dT%H:%M:%SZ)
until=$(date -u -d '+1 day' +%Y-%m-%dT%H:%M:%SZ)
contract_id() { sed -n 's/.*"id":"\(c-[0-9a-f]*\)".*/\1/p'; }
wait_contract() {  # NODE ID PATTERN
  for _ in $(seq 100); do api "$1/v1/contracts/$2" 2>/dev/null | grep -q "$3" && return 0; sleep 0.1; done
  echo "ui-test: contract $2 never matched $3 on $1" >&2
  return 1
}
sid=$(post "$acme/v1/contracts" '{"terms": {"kind": "stream", "provider": "acme", "consumer": "beta",
  "streams": ["bids"], "price_per_million": 5, "valid_from": "'"$from"'", "valid_until": "'"$until"'"}}' | contract_id)
wait_contract "$beta" "$sid" '"version":1'
post "$beta/v1/contracts/$sid/accept" '{"version": 1}' >/dev/null
wait_contract "$beta" "$sid" '"in_force":true'

post "$beta/v1/imports" '{"stream": "acme/bids"}' >/dev/null
python3 - "$out/q5.json" <<'PY'
import json, sys
q = json.load(open("bench/nexmark/queries/q5.json"))
q["name"] = "hot-items"
q["outputs"][0]["name"] = "hot_items"
q["inputs"][0]["stream"] = "acme/bids"
json.dump(q, open(sys.argv[1], "w"))
PY
api -H 'Content-Type: application/json' "$beta/v1/queries" --data @"$out/q5.json" >/dev/null

# Left unanswered: on beta's page it is beta's turn.
hid=$(post "$acme/v1/contracts" '{"terms": {"kind": "hosting", "host": "beta", "owner": "acme",
  "box_kinds": ["aggregate", "map"], "max_load": 500, "price_min": 10, "price_max": 20, "notice_seconds": 60,
  "host_may_subscribe": false, "host_may_export": false, "valid_from": "'"$from"'", "valid_until": "'"$until"'"}}' |
  contract_id)
wait_contract "$beta" "$hid" '"version":1'

# Bids, a batch every 0.2 s until the end, with the current time.
publish() {
  local n=0 b i now
  while :; do
    now=$(date +%s%3N)
    b=""
    for i in $(seq 50); do
      n=$((n + 1))
      b+="{\"auction\": $((n % 7)), \"bidder\": $n, \"price\": $((n % 100)), \"channel\": \"web\", \"url\": \"u\", \"date_time\": $now, \"extra\": \"\"}"$'\n'
    done
    printf '%s' "$b" | curl -sS -f --max-time 5 -H "Authorization: Bearer $token" \
      -H 'Content-Type: application/x-ndjson' --data-binary @- "$acme/v1/streams/bids/tuples" >/dev/null 2>&1 || true
    sleep 0.2
  done
}
publish &
pids+=($!)
for _ in $(seq 100); do api "$beta/v1/imports/acme/bids" | grep -q '"tuples":[1-9]' && break; sleep 0.1; done

page="$beta/ui/#token=$token&tail=acme%2Fbids&poll=1000"
browse() {
  timeout 60 "$chromium" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars \
    --user-data-dir="$out/chromium" "$@" 2>>"$out/chromium.err"
}
browse --virtual-time-budget=6000 --dump-dom "$page" >"$out/dom.html"
python3 - "$out/dom.html" "$sid" "$hid" <<'PY'
import re, sys
dom = open(sys.argv[1], encoding="utf-8").read()
sid, hid = sys.argv[2], sys.argv[3]
problems = []
def need(cond, what):
    if not cond:
        problems.append(what)
need(re.search(r'<tr data-peer="[^"]*acme[^"]*"><td>[^<]*</td><td class="state-up">up</td>', dom),
     "the peer link to acme, up")
graph = re.search(r'<svg class="query-graph".*?</svg>', dom, re.S)
need(graph, "the query's SVG graph")
if graph:
    g = graph.group(0)
    need(len(re.findall(r'<g class="box[^"]*" data-id="(counts|hot)"', g)) == 2, "the boxes counts and hot")
    need(len(re.findall(r'<path class="arc"', g)) >= 3, "the arcs between input, boxes and output")
    need(re.search(r'class="meta where">beta/n1<', g), "a box's node (beta/n1)")
    need(re.search(r'class="rate">[0-9.,]+ in/s', g), "a box's rate")
rows = re.findall(r'<tr data-contract="(c-[0-9a-f]+)"( class="awaiting")?', dom)
need([r[0] for r in rows] == [hid, sid], f"the contracts, the one awaiting beta first (saw {rows})")
need(rows and rows[0][1], "the hosting contract marked as awaiting beta")
need(re.search(r'<tr data-import="acme/bids">', dom), "the import of acme/bids")
need(re.search(rf'<tr data-usage="{sid}">', dom), "the stream contract's usage")
need(re.search(r'<pre id="tail">\{"_seq":', dom), "tuples received over the live tail's WebSocket")
need('live (WebSocket)' in dom, "the page updated by the node's snapshots over /v1/ui/live")
need('subscribed (entente.v1)' in dom, "the tail's WebSocket answered with the subprotocol entente.v1")
if problems:
    print("ui-test: the dashboard does not show: " + "; ".join(problems), file=sys.stderr)
    print(f"ui-test: see {sys.argv[1]}", file=sys.stderr)
    sys.exit(1)
PY
mkdir -p out
browse --virtual-time-budget=6000 --window-size=1400,1250 --screenshot="$PWD/$shot" "$page" >/dev/null
[[ -s $shot ]] || { echo "ui-test: no screenshot" >&2; exit 1; }
echo "ui-test: the dashboard shows peers, the query graph, contracts, imports, usage and the live tail; screenshot $shot"
