#!/usr/bin/env bash
# Installs the Debian 12 packages that benchmarks/compare.sh measures braid
# against: Open MPI, MPICH and Gloo (headers, libraries, launchers), and
# gnuplot for the plot. Installs only what is missing; does nothing when all
# are present. Uses sudo when not root.
set -euo pipefail

packages=(libopenmpi-dev openmpi-bin libmpich-dev mpich libgloo-dev gnuplot-nox)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-peers: all present (${packages[*]})"
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-peers: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
