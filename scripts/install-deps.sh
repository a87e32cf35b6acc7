#!/usr/bin/env bash
# Installs the Debian 12 packages braid needs to build and test. Does nothing
# when they are all present already.
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config libgtest-dev libgmock-dev libbenchmark-dev
  libucx-dev  # the ucx transport (BRAID_UCX)
  libibverbs-dev  # the ibverbs transport's headers (BRAID_IBVERBS; libibverbs is loaded at run time)
  iproute2 openmpi-bin  # namespace hosts (ip, tc), and mpirun in the launch check across them
  clang libclang-rt-14-dev  # clang and its libFuzzer runtime: scripts/fuzz.sh
  python3-torch libtorch-dev pybind11-dev python3-dev  # integrations/torch, for /usr/bin/python3
  python3-pip python3-setuptools)  # its pip install, tested

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
