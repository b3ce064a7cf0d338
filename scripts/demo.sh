#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job:
#   1. NEXMark on the engine: throughput, checked row for row against
#      hand-written references;
#   2. two domains on loopback, linked by mutually authenticated TLS with
#      certificates made by `entente certs`: acme, three broker nodes n1, n2,
#      n3 sharing their own etcd, and beta, one node. acme's stream `bids` is
#      led by n1 and copied by a follower (replication factor 2). The two
#      admins negotiate a stream contract over their own brokers' REST APIs
#      (propose, counter, accept; both sign it); under it beta imports
#      acme/bids and runs the hot-items query (NEXMark q5) on it;
#   3. acme runs the same query on its own bids, cut across its nodes: the
#      stateful sliding-window count (`counts`) on n1 next to `bids`, the
#      rest (`hot`) on n2, its output read over WebSocket through n3. The
#      NEXMark bids are published to acme over HTTP; once a third of them
#      are in, n1 is killed with SIGKILL (it leads `bids`, runs `counts`, and
#      is usually the controller): its follower takes `bids` over and runs
#      `counts` from its replicated checkpoint and journal. The demo prints
#      how long the publisher and the subscriber waited: for the first
#      acknowledgement, and for the first row that needed bids sent after the
#      kill. In the end the subscriber's rows are checked: numbered without a
#      gap or a duplicate, and equal to beta's (the same query, away from the
#      fault) and to the engine's own q5 over the same bids. The demo exits 1
#      when they are not;
#   4. (within part 3) the admins also negotiate a hosting contract over
#      REST; two thirds of the way through the bids, acme moves its `hot`
#      fragment to beta/n1 under it (the pause printed), the fragment's
#      results coming back into acme's hot_items; once the bids are in, the
#      demo shows its load-seconds and their cost, beta revokes the contract,
#      and acme takes the fragment back to n2. The subscriber's check above
#      covers the rows written while it was hosted. acme also runs NEXMark
#      q8 (new users: persons joined with the auctions they open in the same
#      10 s window) on its persons and auctions, published along with the
#      bids, cut across n2 and n3; its stateful join `new-users` moves to
#      beta/n1 too, with its state, and comes back on the revocation; its
#      output is checked row for row, in order, against the engine's q8.
# At the end, a summary table: what went in and came out on each domain, each
# contract's usage, and what the checks found lost or duplicated.
# Environment: EVENTS (NEXMark events, default 1000000; 92 % are bids),
# FAILOVER (0: no kill in part 3; default 1), HOSTING (0: no move to beta;
# default 1), BUILD_DIR (an existing build directory, configured already:
# the demo only brings its two targets up to date there; default: configure
# and build a Release build in build/).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$EPOCHREALTIME
# since: seconds since the demo started, for the timings it prints.
since() { awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f s", b - a }'; }
scripts/install-deps.sh
build=${BUILD_DIR:-build}
if [[ -n ${BUILD_DIR:-} ]]; then
  [[ -f $build/CMakeCache.txt ]] || { echo "BUILD_DIR=$build is not a configured build directory" >&2; exit 2; }
  grep -q '^CMAKE_BUILD_TYPE:STRING=Release' "$build/CMakeCache.txt" ||
    echo "note: $build is not a Release build; the throughput figures will be low" >&2
else
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" -j"$(nproc)" --target nexmark entente
echo "(built at $(since))"

events=${EVENTS:-1000000}
failover=${FAILOVER:-1}
hosting_move=${HOSTING:-1}
out=out/demo
entente=$build/broker/entente
rm -rf "$out"
mkdir -p "$out"

echo "== 1. NEXMark on the engine ($events events)"
"$build/bench/nexmark" --events "$events" --dump "$out/nexmark"

echo
echo "== 2. Two domains: acme (three nodes) owns the bids, beta (one node) runs the query on them ($(since))"
token=demo-admin-token
# api [curl options] URL: one call to a node's API, failing the demo on an error.
api() { curl -sS -f --max-time 30 -H "Authorization: Bearer $token" "$@"; }

echo "-- certificates: a CA per domain, a node certificate per node (entente certs)"
"$entente" certs init-domain acme --out "$out/certs/acme-ca" >/dev/null
"$entente" certs init-domain beta --out "$out/certs/beta-ca" >/dev/null
for dn in acme-n1 acme-n2 acme-n3 beta-n1; do
  "$entente" certs issue-node "${dn%-*}" "${dn#*-}" --ca "$out/certs/${dn%-*}-ca" --san 127.0.0.1,localhost \
    --out "$out/certs/$dn" >/dev/null
  "$entente" certs show "$out/certs/$dn/node.crt" | grep -E '^(identity|issuer)' | tr '\n' ' ' | sed 's/^/   /'
  echo
done

pids=()  # every process started, in order: stopped in reverse order on exit
stop_all() {
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  for _ in $(seq 100); do kill -0 "${pids[@]}" 2>/dev/null || break; sleep 0.1; done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap stop_all EXIT

# The peer-link listeners need known ports, since each domain's
# configuration names the other's nodes. A port below the ephemeral range,
# so that no outgoing connection takes it meanwhile.
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((10000 + RANDOM % 22000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
  echo "no free port" >&2
  return 1
}

echo "-- acme's etcd: where its nodes keep their membership, controller, catalog and contracts"
# --election-timeout 500 lets etcd grant the 1 s leases the nodes ask for
# (cluster.lease_ttl: how soon a dead node is declared down).
etcd_client=127.0.0.1:$(free_port)
etcd_peer=127.0.0.1:$(free_port)
/usr/bin/etcd --name=acme --data-dir="$out/etcd" \
  --listen-client-urls="http://$etcd_client" --advertise-client-urls="http://$etcd_client" \
  --listen-peer-urls="http://$etcd_peer" --initial-advertise-peer-urls="http://$etcd_peer" \
  --initial-cluster="acme=http://$etcd_peer" --initial-cluster-state=new \
  --heartbeat-interval=50 --election-timeout=500 >"$out/etcd.log" 2>&1 &
pids+=($!)
etcd_up() { curl -sf "http://$etcd_client/health" 2>/dev/null | grep -q '"health":"true"'; }
for _ in $(seq 150); do etcd_up && break; sleep 0.1; done
etcd_up || { echo "etcd did not start; the end of $out/etcd.log:" >&2; tail -5 "$out/etcd.log" >&2; exit 1; }
echo "   etcd on $etcd_client"

declare -A link
for dn in acme-n1 acme-n2 acme-n3 beta-n1; do link[$dn]=127.0.0.1:$(free_port); done

# node_config DOMAIN NODE EXTRA PEER_DOMAIN PEER_NODES: each node pins the
# other domain's CA (no CA is shared between them) and lists its nodes'
# addresses. Nothing is exported by configuration: the stream crosses under
# a contract. acme's nodes find each other through etcd (EXTRA, their
# `cluster` section), not through `peers`.
node_config() {
  local nodes="" n
  for n in $5; do nodes+="${nodes:+, }{\"node\": \"$n\", \"address\": \"${link[$4-$n]}\"}"; done
  cat <<JSON
{
  "domain": "$1", "node": "$2",$3
  "api": {"listen": "127.0.0.1:0", "tls": false},
  "data_dir": "$1-$2-data",
  "tokens": [{"name": "demo", "role": "admin", "sha256": "$("$entente" token-hash $token)"}],
  "checkpoint_interval": "1s",
  "federation": {
    "listen": "${link[$1-$2]}",
    "cert_file": "certs/$1-$2/node.crt", "key_file": "certs/$1-$2/node.key", "ca_file": "certs/$1-ca/ca.crt",
    "peers": [{"domain": "$4", "ca_file": "certs/$4-ca/ca.crt", "nodes": [$nodes]}]
  }
}
JSON
}
cluster="
  \"cluster\": {\"etcd\": [\"http://$etcd_client\"], \"lease_ttl\": \"1s\", \"etcd_timeout\": \"500ms\"},"
for n in n1 n2 n3; do node_config acme $n "$cluster" beta n1 >"$out/acme-$n.json"; done
node_config beta n1 "" acme "n1 n2 n3" >"$out/beta-n1.json"
echo "-- acme/n1's configuration: its etcd, its certificate, and beta's pinned CA and address"
sed -n '/"cluster"/p; /"federation"/,/^  }/p' "$out/acme-n1.json"
echo "-- beta's peers: acme's CA and its three nodes (any of them tells beta which node leads a stream)"
grep '"peers"' "$out/beta-n1.json"

declare -A pid port url
start_node() {
  "$entente" broker --config "$out/$1.json" >"$out/$1.out" 2>"$out/$1.err" &
  pids+=($!)
  pid[$1]=$!
  for _ in $(seq 100); do grep -q 'listening on' "$out/$1.out" 2>/dev/null && break; sleep 0.1; done
  sed 's/^/   /' "$out/$1.out"
  port[$1]=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$out/$1.out")
  [[ -n ${port[$1]} ]] || { echo "$1 did not start:" >&2; cat "$out/$1.err" >&2; exit 1; }
  url[$1]=http://127.0.0.1:${port[$1]}
}
echo "-- start acme's three nodes and beta's"
for dn in acme-n1 acme-n2 acme-n3 beta-n1; do start_node $dn; done
beta=${url[beta-n1]}
# acme's admin talks to n3 (any node answers for the whole domain): n3 stays
# up when n1 is killed.
acme=${url[acme-n3]}

echo "-- GET /v1/nodes on acme, once each node lists three nodes up"
up3() { [[ $(api "${url[$1]}/v1/nodes" 2>/dev/null | grep -o '"state":"up"' | wc -l) -eq 3 ]]; }
all_up() { up3 acme-n1 && up3 acme-n2 && up3 acme-n3; }
for _ in $(seq 200); do all_up && break; sleep 0.1; done
all_up || { echo "acme's nodes do not all see three nodes up; see $out/acme-n*.err" >&2; exit 1; }
api "$acme/v1/nodes" | jq -r '"   controller: \(.controller)", (.nodes[] |
  "   \(.node): \(.state), \(.role), api \(.api), peer link \(.peer)")'

echo "-- acme: register the stream 'bids' on n1, copied by one follower (replication 2)"
api -H 'Content-Type: application/json' "$acme/v1/streams" --data '{
  "name": "bids", "event_time": "date_time", "node": "n1", "replication": 2,
  "schema": [{"name": "auction", "type": "int64"}, {"name": "bidder", "type": "int64"},
             {"name": "price", "type": "int64"}, {"name": "channel", "type": "string"},
             {"name": "url", "type": "string"}, {"name": "date_time", "type": "timestamp"},
             {"name": "extra", "type": "string"}]}' | jq -c '{name, node, durability, replication}' | sed 's/^/   /'
# show_bids: who leads acme's bids, who copies it, and how far.
show_bids() {
  api "$acme/v1/streams/bids" | jq -r '"   bids: led by \(.node), next_seq \(.next_seq), \(.tuples) tuples; followers: " +
    ([.replication.replicas[]? | "\(.node) (acked \(.acked), in sync: \(.in_sync))"] | join(", "))'
}
for _ in $(seq 100); do api "$acme/v1/streams/bids" | grep -q '"in_sync":true' && break; sleep 0.1; done
show_bids

echo "-- acme: register the streams 'persons' and 'auctions' on n2 (NEXMark q8 joins them), replication 2"
for s in persons auctions; do
  jq --arg s "$s" '{name: $s, event_time: "date_time", node: "n2", replication: 2,
                    schema: (.inputs[] | select(.name == $s) | .schema)}' bench/nexmark/queries/q8.json |
    api -H 'Content-Type: application/json' "$acme/v1/streams" --data @- | jq -c '{name, node, replication}' | sed 's/^/   /'
done

echo "-- wait for the peer links (mutual TLS 1.3, each side checks the other against the CA it pinned)"
for _ in $(seq 200); do
  [[ $(api "$beta/v1/peers" | grep -o '"state":"up"' | wc -l) -ge 3 ]] && break
  sleep 0.1
done
api "$beta/v1/peers" | jq -r '.peers[] | "   beta - \(.identity): \(.state)"'

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
echo "-- acme's admin accepts (signs with acme/n3's node key); beta countersigns on receipt"
api -H 'Content-Type: application/json' "$acme/v1/contracts/$id/accept" --data '{"version": 2}' | show_contract
wait_version "$beta" "$id" 4
for side in acme-n1 acme-n2 acme-n3 beta-n1; do wait_version "${url[$side]}" "$id" 4; done
for side in acme-n1 acme-n2 acme-n3 beta-n1; do
  c=$(api "${url[$side]}/v1/contracts/$id")
  echo "   on $side: $(echo "$c" | show_contract | sed 's/^ *//'), $(echo "$c" | grep -o '"in_force":[a-z]*'), signed by: $(echo "$c" | grep -o '"domain":"[a-z0-9-]*"' | sort -u | sed 's/"domain":"\(.*\)"/\1/' | tr '\n' ' ')"
done

echo "-- beta: import acme/bids (acme's n1, which leads it, checks the contract; beta keeps a mirror with acme's sequence numbers)"
api -H 'Content-Type: application/json' "$beta/v1/imports" --data '{"stream": "acme/bids"}' \
  | jq -c 'del(.schema)' | sed 's/^/   /'
echo "-- beta: deploy the hot-items query (NEXMark q5) on it: its input says \"stream\": \"acme/bids\""
jq '.name = "hot-items" | .outputs[0].name = "hot_items" | .inputs[0].stream = "acme/bids"' \
  bench/nexmark/queries/q5.json >"$out/beta-hot-items.json"
api -H 'Content-Type: application/json' "$beta/v1/queries" --data @"$out/beta-hot-items.json" \
  | jq -c '{name, state, inputs, outputs}' | sed 's/^/   /'

echo
echo "-- acme's admin proposes a hosting contract: beta may run acme's map, aggregate and join boxes, up to 500 CPU ms/s, at 10 credits per CPU-second"
hosting_terms() {
  echo '{"kind": "hosting", "host": "beta", "owner": "acme", "box_kinds": ["aggregate", "join", "map"], "max_load": 500,
         "price_min": 10, "price_max": 20, "notice_seconds": 60, "host_may_subscribe": false, "host_may_export": false,
         "valid_from": "'"$from"'", "valid_until": "'"$until"'"}'
}
hosting=$(api -H 'Content-Type: application/json' "$acme/v1/contracts" --data "{\"terms\": $(hosting_terms)}")
hid=$(echo "$hosting" | sed -n 's/.*"id":"\(c-[0-9a-f]*\)".*/\1/p')
echo "$hosting" | show_contract
wait_version "$beta" "$hid" 1
echo "-- beta's admin accepts it; acme countersigns on receipt"
api -H 'Content-Type: application/json' "$beta/v1/contracts/$hid/accept" --data '{"version": 1}' | show_contract
for side in acme-n1 acme-n2 acme-n3 beta-n1; do wait_version "${url[$side]}" "$hid" 3; done

echo "== 3. acme runs the query cut across its nodes; FAILOVER=$failover ($(since))"
echo "-- acme: deploy the same query on its own bids, cut in two fragments: counts on n1 (next to bids), hot on n2"
jq '.name = "hot-items" | .outputs[0].name = "hot_items" | .placement = {"fragments": [
      {"name": "counts", "node": "n1", "boxes": ["counts"]},
      {"name": "hot", "node": "n2", "boxes": ["hot"]}]}' \
  bench/nexmark/queries/q5.json >"$out/acme-hot-items.json"
api -H 'Content-Type: application/json' "$acme/v1/queries" --data @"$out/acme-hot-items.json" \
  | jq -r '"   \(.name): \(.state)", (.fragments[] |
    "   fragment \(.name) on \(.node): reads \(.runner.inputs), writes \(.runner.outputs)")'

echo "-- acme: deploy NEXMark q8 on its persons and auctions, cut: people and sellers on n2 (next to them), the join new-users on n3"
jq '.name = "new-users" | .outputs[0].name = "new_users" | .placement = {"fragments": [
      {"name": "people", "node": "n2", "boxes": ["people"]}, {"name": "sellers", "node": "n2", "boxes": ["sellers"]},
      {"name": "new-users", "node": "n3", "boxes": ["new_users"]}]}' \
  bench/nexmark/queries/q8.json >"$out/acme-new-users.json"
api -H 'Content-Type: application/json' "$acme/v1/queries" --data @"$out/acme-new-users.json" \
  | jq -r '"   \(.name): \(.state)", (.fragments[] | "   fragment \(.name) on \(.node)")'

# The generator's dump is engine output: each row starts with its own _seq
# and _time, which a publisher may not send (the node numbers tuples, and
# bids' event time is date_time): drop them. One request per 20000 bids.
sed -E 's/^\{"_seq":[0-9]+,"_time":-?[0-9]+,/{/' "$out/nexmark/bids.ndjson" | split -d -a 4 -l 20000 - "$out/chunk-"
chunks=("$out"/chunk-*)
n=$(wc -l <"$out/nexmark/bids.ndjson")
time_of() { sed -n 's/.*"date_time":\([0-9]*\).*/\1/p' "$1" | tail -1; }  # of the last bid in file $1
last_time=$(time_of "${chunks[-1]}")
# The rows q5 emits once it has read every bid: the engine's own q5 output,
# up to the windows the last bid's event time closes.
expected=$(scripts/lib/demo_check.py expected "$out/nexmark/q5.ndjson" "$last_time")
# Persons and auctions in as many requests as the bids, chunk k sent once k
# bid requests are acknowledged. q8 emits a pair once both inputs'
# watermarks (their latest event times) have passed it.
for s in persons auctions; do
  sed -E 's/^\{"_seq":[0-9]+,"_time":-?[0-9]+,/{/' "$out/nexmark/$s.ndjson" >"$out/$s.ndjson"
  split -d -a 4 -n "l/${#chunks[@]}" "$out/$s.ndjson" "$out/$s-"
done
side_chunks=("$out"/persons-* "$out"/auctions-*)
last_person=$(time_of "$(ls "$out"/persons-* | tail -1)")
last_auction=$(time_of "$(ls "$out"/auctions-* | tail -1)")
before8=$((last_person < last_auction ? last_person : last_auction))
expected8=$(scripts/lib/demo_check.py expected-before "$out/nexmark/q8.ndjson" "$before8")

echo "-- subscribers (entente subscribe, WebSocket): acme's hot_items through n3 (n2 writes it), each row stamped on arrival; beta's hot_items; beta's acme/bids"
stamp() { local line; while IFS= read -r line; do printf '%s\t%s\n' "$EPOCHREALTIME" "$line"; done; }
# Each stops after the rows expected, or 30 s without a row.
ENTENTE_TOKEN=$token "$entente" subscribe --port "${port[acme-n3]}" --from 1 --count "$expected" --timeout-ms 30000 \
  hot_items | stamp >"$out/acme-hot-items.tsv" &
sub_acme=$!
ENTENTE_TOKEN=$token "$entente" subscribe --port "${port[beta-n1]}" --from 1 --count "$expected" --timeout-ms 30000 \
  hot_items >"$out/beta-hot-items.ndjson" &
sub_beta=$!
ENTENTE_TOKEN=$token "$entente" subscribe --port "${port[beta-n1]}" --from 1 --count 3 --timeout-ms 30000 acme/bids \
  >"$out/acme-bids-on-beta.ndjson" &
sub_bids=$!
ENTENTE_TOKEN=$token "$entente" subscribe --port "${port[acme-n3]}" --from 1 --count "$expected8" --timeout-ms 30000 \
  new_users | stamp >"$out/acme-new-users.tsv" &
sub_q8=$!

# publish_one STREAM FILE BATCH [FIRST]: sends one request (first through
# acme's node number FIRST, default 1), naming its batch
# (producer id and number) so that a request sent again after a lost answer
# is stored once (docs/api.md, "Publishing exactly once"). A request that
# fails (the node died: no connection; or it cannot reach the leader:
# 502/503) goes again to the next node of acme, since any node forwards to
# whichever node leads the stream now. Each failure goes to
# $out/publish-retries; prints the node that stored it.
publish_one() {
  local code tries=0 i=$((${4:-1} - 1)) nodes=(acme-n1 acme-n2 acme-n3)
  [[ -s $2 ]] || { echo none; return 0; }
  while :; do
    code=$(curl -sS -o "$out/publish-answer-$1" -w '%{http_code}' --max-time 30 -H "Authorization: Bearer $token" \
      -H 'Content-Type: application/x-ndjson' -H "Entente-Producer-Id: demo-$1-$$" \
      -H "Entente-Producer-Seq: $3" --data-binary @"$2" \
      "${url[${nodes[i]}]}/v1/streams/$1/tuples" 2>"$out/publish-error-$1") || true
    [[ $code == 200 ]] && break
    echo "$1 batch $3 through ${nodes[i]}: $([[ $code == 000 ]] && cat "$out/publish-error-$1" ||
      { echo -n "$code "; jq -r .detail "$out/publish-answer-$1" 2>/dev/null; })" >>"$out/publish-retries"
    tries=$((tries + 1))
    ((tries < 600)) || { echo "$1 batch $3 was not stored after $tries tries" >&2; return 1; }
    i=$(((i + 1) % 3))
    sleep 0.1
  done
  echo "${nodes[i]}"
}
# publish: the bids' chunks in order, appending "BATCH TIME NODE" to
# $out/published per acknowledged request.
publish() {
  local batch=0 node
  for f in "${chunks[@]}"; do
    batch=$((batch + 1))
    node=$(publish_one bids "$f" $batch) || return 1
    echo "$batch $EPOCHREALTIME $node" >>"$out/published"
  done
}
# publish_side: persons and auctions chunk k once k bid requests are in,
# through n2, which leads them.
publish_side() {
  local k n=$((${#side_chunks[@]} / 2))
  for ((k = 0; k < n; k++)); do
    while (($(wc -l <"$out/published") < k)); do sleep 0.01; done
    publish_one persons "${side_chunks[k]}" $((k + 1)) 2 >/dev/null || return 1
    publish_one auctions "${side_chunks[n + k]}" $((k + 1)) 2 >/dev/null || return 1
  done
}
touch "$out/published" "$out/publish-retries"
echo "-- acme: publish the $n NEXMark bids over HTTP in ${#chunks[@]} requests, through n1 first ($(since))"
start=$EPOCHREALTIME
publish &
publisher=$!
publish_side &
side_publisher=$!
pids+=($publisher $side_publisher $sub_acme $sub_beta $sub_bids $sub_q8)

if [[ $failover == 1 ]]; then
  controller=$(api "$acme/v1/nodes" | jq -r .controller)
  third=$((${#chunks[@]} / 3))
  while (($(wc -l <"$out/published") < third)) && kill -0 $publisher 2>/dev/null; do sleep 0.01; done
  kill -KILL "${pid[acme-n1]}"
  kill_at=$EPOCHREALTIME
  wait "${pid[acme-n1]}" 2>/dev/null || true
  acked=$(wc -l <"$out/published")
  # No request sent before the kill holds a bid later than those of the
  # chunk after the last acknowledged one: a row of a window ending later
  # is new.
  closed_by=$(time_of "${chunks[$((acked < ${#chunks[@]} ? acked : acked - 1))]}")
  echo "-- killed n1 with SIGKILL after $acked of ${#chunks[@]} requests were acknowledged: it leads bids and runs counts$([[ $controller == n1 ]] && echo ", and is acme's controller")"
fi
if [[ $hosting_move == 1 ]]; then
  # Two thirds in: acme's hot fragment moves to beta/n1 under the hosting
  # contract while bids flow; its results come back into hot_items.
  while (($(wc -l <"$out/published") < 2 * ${#chunks[@]} / 3)) && kill -0 $publisher 2>/dev/null; do sleep 0.01; done
  # (After the failover: the host reads counts' output where it is led now.)
  for _ in $(seq 300); do
    api "$acme/v1/queries/hot-items" | jq -e '.state == "running"' >/dev/null && break
    sleep 0.1
  done
  # A standby on beta rebuilds the state before the pause ("warm"), else it
  # goes in the pause.
  moved='"   \(.state) on \(.to) under \(.contract): paused \(.pause_ms | floor) ms (the state, \(.state_bytes) bytes, \(if .warm then "rebuilt there before the pause" else "sent during it" end)), \(.total_ms | floor) ms in all"'
  echo "-- acme: move fragment hot to beta/n1 under hosting contract $hid, while bids flow ($(since))"
  api -H 'Content-Type: application/json' "$acme/v1/queries/hot-items/fragments/hot/move" --data '{"node": "beta/n1"}' \
    | jq -r "$moved"
  echo "-- acme: move q8's join new-users, with its state, to beta/n1 under the same contract ($(since))"
  api -H 'Content-Type: application/json' "$acme/v1/queries/new-users/fragments/new-users/move" --data '{"node": "beta/n1"}' \
    | jq -r "$moved"
fi
status=0
wait $publisher || status=$?
wait $side_publisher || status=$?
end=$EPOCHREALTIME
secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
echo "   published $n bids to acme in $secs s: $(awk "BEGIN { printf \"%.0f\", $n / $secs }") bids/s (durable on the leader and its in-sync follower, acknowledged); $(wc -l <"$out/publish-retries") requests sent again"
[[ $status == 0 ]] || { echo "FAIL: the publisher gave up" >&2; exit 1; }
if [[ $failover == 1 ]]; then
  awk -v k="$kill_at" '$2 > k { printf "   first acknowledgement after the kill: %.2f s after it, through %s\n", $2 - k, $3; exit }' \
    "$out/published"
  sed 's/^/   retried: /' "$out/publish-retries" | head -5
fi

if [[ $hosting_move == 1 ]]; then
  sleep 1.5  # a usage report or two
  for qf in hot-items/hot new-users/new-users; do
    api "$acme/v1/queries/${qf%/*}" | jq -r --arg f "${qf#*/}" '.fragments[] | select(.name == $f) |
      "   fragment \($f): \(.runner.state), hosted by \(.runner.hosted.domain)/\(.runner.hosted.node) under \(.runner.hosted.contract): \(.runner.hosted.load_seconds) CPU s so far, \(.runner.hosted.cost) credits at \(.runner.hosted.price) per CPU-second"'
  done
  echo "   the hosting contract's usage in each ledger: beta (counts what it ran) $(api "$beta/v1/contracts/$hid/usage" | jq -c '{load_seconds, cost_credits}'); acme, where each node counts what beta reports for the fragment it relays: n2 (hot) $(api "${url[acme-n2]}/v1/contracts/$hid/usage" | jq -c '{load_seconds, cost_credits}'), n3 (new-users) $(api "${url[acme-n3]}/v1/contracts/$hid/usage" | jq -c '{load_seconds, cost_credits}')"
  echo "-- beta's admin revokes the hosting contract; acme takes the fragment back to n2 from the host's last results ($(since))"
  api -H 'Content-Type: application/json' "$beta/v1/contracts/$hid/revoke" \
    --data '{"version": 3, "reason": "capacity needed at home"}' | show_contract
  for _ in $(seq 300); do
    api "$acme/v1/queries/hot-items" | jq -e '.fragments[] | select(.name == "hot") | .runner.hosted == null and .runner.state == "running"' >/dev/null && break
    sleep 0.1
  done
  api "$acme/v1/queries/hot-items" | jq -r '.fragments[] | select(.name == "hot") | "   fragment hot: \(.runner.state) on \(.node)" + (if .runner.hosted then " (still hosted)" else "" end)'
  for _ in $(seq 300); do
    api "$acme/v1/queries/new-users" | jq -e '.fragments[] | select(.name == "new-users") | .runner.hosted == null and .runner.state == "running"' >/dev/null && break
    sleep 0.1
  done
  api "$acme/v1/queries/new-users" | jq -r '.fragments[] | select(.name == "new-users") | "   fragment new-users: \(.runner.state) on \(.node)" + (if .runner.hosted then " (still hosted)" else "" end)'
  api "${url[acme-n2]}/metrics" | grep '^entente_fragment_hosted_moves_total' | sed 's/^/   /'
fi

echo "-- wait until acme's bids and beta's mirror of it hold every bid once ($(since))"
for _ in $(seq 600); do
  api "$acme/v1/streams/bids" | grep -q "\"next_seq\":$((n + 1))[,}]" &&
    api "$beta/v1/imports/acme/bids" | grep -q "\"next_seq\":$((n + 1))[,}]" && break
  sleep 0.1
done
show_bids
api "$beta/v1/imports/acme/bids" | jq -r '"   beta'"'"'s mirror of acme/bids: served by \(.owner), next_seq \(.next_seq), \(.tuples) tuples"'
on_acme=$(api "$acme/v1/streams/bids" | jq -r '"\(.next_seq - 1) \(.tuples)"')
on_beta=$(api "$beta/v1/imports/acme/bids" | jq -r '"\(.next_seq - 1) \(.tuples)"')

echo "-- wait for the subscribers: $expected rows each, the query's rows once it has read every bid ($(since))"
wait $sub_acme || true
wait $sub_beta || true
wait $sub_bids || true
wait $sub_q8 || true
echo "   done ($(since))"
echo "-- the first bids as beta's subscriber saw them (acme's sequence numbers):"
cut -c1-150 "$out/acme-bids-on-beta.ndjson" | sed 's/$/.../'
echo "-- beta's hot_items: $(wc -l <"$out/beta-hot-items.ndjson") rows; acme's hot_items through n3: $(wc -l <"$out/acme-hot-items.tsv") rows; the first three:"
head -n 3 "$out/acme-hot-items.tsv" | cut -f2
echo "-- acme's query, as n3 reports it:"
api "$acme/v1/queries/hot-items" | jq -r '"   state \(.state)", (.fragments[] |
  "   fragment \(.name) on \(.node): " + (if .runner then "\([.runner.boxes[] | "\(.id) \(.tuples_in) in, \(.tuples_out) out"] | join("; "))" else "not running: \(.error)" end))'
echo "-- GET /v1/nodes on acme through n3:"
api "$acme/v1/nodes" | jq -r '"   controller: \(.controller)", (.nodes[] |
  "   \(.node): \(.state), \(.role), leads \(.streams_led), runs \(.fragments)")'
echo "-- GET /v1/peers on beta:"
api "$beta/v1/peers" | jq -r '.peers[] | "   \(.identity): \(.state), \(.tuples_in) tuples in, \(.connects) connects"'
echo "-- acme's metering of the contract (each node counts what it sent; a dead node is not asked):"
for node in acme-n1 acme-n2 acme-n3; do
  kill -0 "${pid[$node]}" 2>/dev/null || continue
  echo "   $node: $(api "${url[$node]}/v1/contracts/$id/usage")"
done
echo

# summary: the table the demo ends with. Each row: a domain, what, tuples
# in, tuples or rows out, lost, duplicated (from the checks above).
summary() {
  local dead=""
  row() { printf '   %-6s %-44s %10s %10s %6s %10s\n' "$@"; }
  of() { jq -r ".$2" "$out/summary-$1.json" 2>/dev/null || echo "?"; }
  # The stream holds tuples numbered 1..next_seq-1: a count short of n is
  # lost, beyond it duplicated.
  count_row() {
    local stored=${2#* } last=${2% *}
    row "$1" "$3" "$n" "$stored" $((n > stored ? n - stored : 0)) $((stored > n ? stored - n : 0))
  }
  echo
  echo "== summary"
  row domain what in out lost duplicated
  count_row acme "$on_acme" "bids: published, stored (across the kill)"
  count_row beta "$on_beta" "acme/bids: mirrored under contract"
  row acme "hot_items (q5 cut over n1, n2; failover, move)" "$n" "$(of acme-hot-items rows)" \
    "$(of acme-hot-items lost)" "$(of acme-hot-items duplicated)"
  row beta "hot_items (q5 on the mirror)" "$n" "$(of beta-hot-items rows)" \
    "$(of beta-hot-items lost)" "$(of beta-hot-items duplicated)"
  row acme "new_users (q8; join hosted by beta a while)" "$(cat "$out"/persons.ndjson "$out"/auctions.ndjson | wc -l)" \
    "$(of acme-new-users rows)" "$(of acme-new-users lost)" "$(of acme-new-users duplicated)"
  echo "   contract usage, from each side's own ledger:"
  [[ $failover == 1 ]] && dead=" (its live nodes: n1 keeps its own count in its store, down with it)"
  echo "   $id stream:  acme$dead: $(acme_usage "$id" .tuples) tuples delivered, $(acme_usage "$id" .cost_credits) credits"
  if [[ $hosting_move == 1 ]]; then
    echo "   $hid hosting: beta (the host): $(api "$beta/v1/contracts/$hid/usage" |
      jq -r '"\(.load_seconds * 1000 | round / 1000) CPU s, \(.cost_credits * 1000 | round / 1000) credits"');" \
      "acme (from beta's reports): $(acme_usage "$hid" .load_seconds) CPU s, $(acme_usage "$hid" .cost_credits) credits"
  fi
}
# acme_usage ID FIELD: a contract's usage figure summed over acme's live
# nodes (each node counts what it sent or relayed).
acme_usage() {
  local node
  for node in acme-n1 acme-n2 acme-n3; do
    kill -0 "${pid[$node]}" 2>/dev/null || continue
    api "${url[$node]}/v1/contracts/$1/usage" | jq "$2"
  done | jq -s 'add * 1000 | round / 1000'
}

echo "== check ($(since))"
# A stream holding N tuples numbered 1..N holds each named batch once.
if [[ $on_acme == "$n $n" && $on_beta == "$n $n" ]]; then
  echo "bids: acme's stream and beta's mirror hold $n tuples each, numbered 1..$n: every bid once"
else
  echo "FAIL: bids: $n published; acme's stream holds ${on_acme#* } numbered up to ${on_acme% *}, beta's mirror ${on_beta#* } numbered up to ${on_beta% *}"
  status=1
fi
check=(scripts/lib/demo_check.py check "$out/acme-hot-items.tsv" --reference "$out/beta-hot-items.ndjson"
  --engine "$out/nexmark/q5.ndjson" --until "$last_time" --summary "$out/summary-acme-hot-items.json")
[[ $failover == 1 ]] && check+=(--kill-at "$kill_at" --closed-by "$closed_by")
echo "acme's hot_items, cut across n1 and n2, as the subscriber on n3 received them:"
"${check[@]}" || status=1
echo "acme's new_users (NEXMark q8), its join hosted by beta for a while, as the subscriber on n3 received it:"
scripts/lib/demo_check.py check "$out/acme-new-users.tsv" --engine-before "$out/nexmark/q8.ndjson" --before "$before8" \
  --in-order --summary "$out/summary-acme-new-users.json" || status=1
echo "beta's hot_items, the same query on its mirror of acme/bids, away from the faults:"
scripts/lib/demo_check.py check "$out/beta-hot-items.ndjson" --engine "$out/nexmark/q5.ndjson" --until "$last_time" \
  --summary "$out/summary-beta-hot-items.json" || status=1
summary
echo "-- rows in $out/acme-hot-items.tsv and $out/beta-hot-items.ndjson; the nodes' data and logs in $out (total $(since))"
exit $status
