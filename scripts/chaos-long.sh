#!/usr/bin/env bash
# The chaos test for longer than CI runs it (docs/cluster.md, "Tested under
# chaos"): ClusterChaos.EveryAcknowledgedTupleOnceInOrderAndTheCutQueryEqualsAFaultFreeRunUnderRandomFaults
# with FAULTS random faults per run instead of 20, RUNS times, each with
# its own seed (from SEED, default the time), the full mix of faults unless
# ENTENTE_CHAOS_KINDS says otherwise. Each run's own output goes to
# $OUT_DIR/chaos-SEED.log (default /tmp); after each run one JSON line:
#   {"bench":"chaos_long","seed":S,"faults":N,"pass":true|false,"batches":B,
#    "output_rows":R,"fragment_takeovers":T,"faults_s":F,"health_wait_s":H,"seconds":X}
# (a failed run names its log instead of the counts). Exit status 1 when a
# run failed, 77 when etcd is not installed.
#   scripts/chaos-long.sh [FAULTS (default 200)] [RUNS (default 1)]
# Environment: BUILD_DIR (default build), SEED, OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
faults=${1:-200}
runs=${2:-1}
build=${BUILD_DIR:-build}
out=${OUT_DIR:-/tmp}
test_bin=$build/tests/cluster_chaos_test
[[ -x $test_bin && -x $build/broker/entente ]] || {
  echo "build first: cmake --build $build --target entente cluster_chaos_test" >&2
  exit 2
}
[[ -x /usr/bin/etcd ]] || { echo "etcd is not installed: apt-get install etcd-server" >&2; exit 77; }
seed=${SEED:-$(date +%s)}
status=0
for ((r = 0; r < runs; r++)); do
  s=$((seed + r))
  log=$out/chaos-$s.log
  start=$(date +%s)
  # In its build directory, as ctest runs it (it runs the broker it was
  # built with).
  if (cd "$build/tests" && ENTENTE_CHAOS_SEED=$s ENTENTE_CHAOS_FAULTS=$faults \
      ./cluster_chaos_test --gtest_filter='ClusterChaos.Every*') >"$log" 2>&1; then
    pass=true
  else
    pass=false
    status=1
  fi
  secs=$(($(date +%s) - start))
  line=$(grep -m1 '^chaos: PASS' "$log" || true)
  if [[ $pass == true && -n $line ]]; then
    sed -n 's/^chaos: PASS seed \([0-9]*\): \([0-9]*\) faults.* \([0-9]*\) batches .* \([0-9]*\) output rows equal, \([0-9]*\) fragment takeovers;.* \([0-9]*\) s of faults (\([0-9]*\) s waiting for health).*/{"bench":"chaos_long","seed":\1,"faults":\2,"pass":true,"batches":\3,"output_rows":\4,"fragment_takeovers":\5,"faults_s":\6,"health_wait_s":\7,"seconds":'"$secs"'}/p' <<<"$line"
  else
    printf '{"bench":"chaos_long","seed":%s,"faults":%s,"pass":false,"log":"%s","seconds":%s}\n' "$s" "$((faults + 1))" "$log" "$secs"
  fi
done
exit $status
