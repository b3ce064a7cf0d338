#!/usr/bin/env bash
# check-unit.sh SYSTEMD_ANALYZE UNIT: fails when systemd finds anything to
# say about the unit (verify exits 0 on an unknown key or a bad value, and
# only prints them), or when its exposure score is above 2.0.
set -euo pipefail
analyze=$1 unit=$2
said=$("$analyze" verify --man=no "$unit" 2>&1) || { echo "$said"; exit 1; }
if [[ -n $said ]]; then
  echo "systemd-analyze verify $unit:"
  echo "$said"
  exit 1
fi
"$analyze" security --offline=yes --threshold=20 "$unit" | tail -1
