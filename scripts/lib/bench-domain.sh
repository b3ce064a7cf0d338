# What the bench scripts that start a domain of several nodes share
# (scripts/bench-nexmark-e2e.sh, scripts/bench-replication.sh): sourced
# after they set $build, $dir, $token, $etcd_bin and pids=(). Sourcing it
# also arranges for every process to be stopped and $dir removed on exit,
# and sets $hash, the token's hash for the nodes' configurations.

# Stops every process started so far (nodes first, etcd last).
stop_all() {
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[$i]}" 2>/dev/null && wait "${pids[$i]}" 2>/dev/null || true
  done
  pids=()
}

# A port nothing listens on now, picked at random among 20000..59999.
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((10000 + RANDOM % 22000))  # below the ephemeral range: no source port takes it
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
  echo "no free port" >&2
  return 1
}

# start_etcd: a one-member etcd in $dir/etcd (the flags of
# tests/support/etcd_process.h); sets $etcd_endpoint once /health says so.
start_etcd() {
  local attempt client peer
  for attempt in 1 2 3; do
    client=$(free_port) peer=$(free_port)
    etcd_endpoint=http://127.0.0.1:$client
    rm -rf "$dir/etcd"
    mkdir -p "$dir/etcd"
    "$etcd_bin" --name=bench --data-dir="$dir/etcd/data" \
      --listen-client-urls="$etcd_endpoint" --advertise-client-urls="$etcd_endpoint" \
      --listen-peer-urls="http://127.0.0.1:$peer" --initial-advertise-peer-urls="http://127.0.0.1:$peer" \
      --initial-cluster="bench=http://127.0.0.1:$peer" --initial-cluster-state=new >"$dir/etcd/log" 2>&1 &
    pids+=($!)
    for _ in $(seq 150); do
      kill -0 "${pids[-1]}" 2>/dev/null || break
      curl -sf "$etcd_endpoint/health" 2>/dev/null | grep -q '"health":"true"' && return 0
      sleep 0.1
    done
    kill -TERM "${pids[-1]}" 2>/dev/null && wait "${pids[-1]}" 2>/dev/null || true
    unset 'pids[-1]'
  done
  echo "etcd did not start; its log:" >&2
  tail -20 "$dir/etcd/log" >&2
  exit 1
}

# nodes_up PORT: true when GET /v1/nodes on PORT lists three nodes, all up.
nodes_up() {
  local body
  body=$(curl -sf -H "Authorization: Bearer $token" "http://127.0.0.1:$1/v1/nodes") || return 1
  [[ $(grep -o '"state":"up"' <<<"$body" | wc -l) -eq 3 && $(grep -o '"state":"' <<<"$body" | wc -l) -eq 3 ]]
}

# make_certs: the domain's CA and n1..n3's certificates in $dir/certs (the
# commands of tests/integration/support/federation.cpp).
make_certs() {
  local n
  certs init-domain bench --out "$dir/certs/ca"
  for n in n1 n2 n3; do
    certs issue-node bench $n --ca "$dir/certs/ca" --san 127.0.0.1,localhost --out "$dir/certs/$n"
  done
}
certs() {
  "$build/broker/entente" certs "$@" >>"$dir/certs.log" 2>&1 ||
    { echo "entente certs $1 failed:" >&2; cat "$dir/certs.log" >&2; exit 1; }
}
# federation_of NODE: NODE's federation section (listener on an ephemeral
# loopback port, announced in etcd; no peers).
federation_of() {
  echo "{\"listen\": \"127.0.0.1:0\", \"cert_file\": \"$dir/certs/$1/node.crt\", \"key_file\": \"$dir/certs/$1/node.key\", \"ca_file\": \"$dir/certs/ca/ca.crt\"}"
}

cleanup() {
  stop_all
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
hash=$("$build/broker/entente" token-hash "$token")
