#!/usr/bin/env bash
# Installs what dtensor needs on Debian 12 (skips apt entirely when all is present).
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config libopenblas-dev libdnnl-dev libblis-dev
          libopenmpi-dev openmpi-bin libgtest-dev libbenchmark-dev
          nlohmann-json3-dev libcli11-dev   # JSON (configs, traces) and train_gpt's flags
          clang-format                      # scripts/check-format.sh
          clang libclang-rt-14-dev  # the sanitizer and fuzzing jobs (scripts/run-sanitizers.sh)
          iproute2)                 # the two-host test (tests/mpi/two_hosts.sh)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "dtensor: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
