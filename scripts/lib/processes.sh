# Sourced by scripts/demo.sh and scripts/ui-test.sh: the processes a script
# starts, stopped on exit, and free loopback ports for the listeners other
# configurations must name.

pids=()  # every process started, in order: stopped in reverse order on exit
stop_all() {
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  for _ in $(seq 100); do kill -0 "${pids[@]}" 2>/dev/null || break; sleep 0.1; done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap stop_all EXIT

# A port below the ephemeral range, so that no outgoing connection takes it
# before the listener does.
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((10000 + RANDOM % 22000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
  echo "no free port" >&2
  return 1
}
