#!/usr/bin/env bash
# Installs the Debian 12 packages Entente builds with, if any is missing.
# Idempotent: does nothing (and needs no network) when all are present.
set -euo pipefail

packages=(
  g++ cmake make pkg-config
  libboost1.81-dev   # Asio and Beast (broker and federation)
  librocksdb-dev     # the state store
  rapidjson-dev      # JSON
  libssl-dev         # TLS, certificates
  libgtest-dev       # unit tests
  curl               # smoke tests against the API
  jq                 # docs/contracts.md: the guide reads JSON answers with it
  python3 python3-yaml  # docs/api/openapi.yaml → the JSON the node serves
  clang libclang-rt-14-dev  # scripts/fuzz.sh: libFuzzer with ASan/UBSan
  etcd-server        # the shared metadata of a domain of several nodes (tests start their own)
  systemd            # systemd-analyze: the packaged unit is checked by systemd itself (not started)
  chromium           # scripts/ui-test.sh: the dashboard in a headless browser
  fonts-liberation   # a font for its screenshot (installed without recommends, chromium has none)
)

missing=()
for p in "${packages[@]}"; do
  [[ "$p" == \#* ]] && continue
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then sudo_cmd=(sudo); else
    echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
