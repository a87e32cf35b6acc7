#!/usr/bin/env bash
# Installs what braid needs to build and test: Debian 12's packages, then
# torch from pip (pinned) for the python3 on PATH, and NVIDIA's nccl.h from
# its wheel. Does nothing when all is present already.
set -euo pipefail
cd "$(dirname "$0")/.."
torch_version=2.15.0
torchft_version=0.2.0
venv=$PWD/.venv

packages=(build-essential cmake ninja-build pkg-config libgtest-dev libgmock-dev libbenchmark-dev
  libucx-dev  # the ucx transport (BRAID_UCX)
  libibverbs-dev  # the ibverbs transport's headers (BRAID_IBVERBS; libibverbs is loaded at run time)
  libssl-dev  # TLS on braid's TCP sockets (BRAID_TLS, ncclSetEncryption)
  iproute2 openmpi-bin  # namespace hosts (ip, tc), and mpirun in the launch check across them
  clang libclang-rt-14-dev  # clang and its libFuzzer runtime: scripts/fuzz.sh
  python3-dev python3-pip python3-venv python3-setuptools)  # integrations/torch: its build, its pip install

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# torch for integrations/torch, with what torch's test utilities import.
python=$(scripts/torch-python)
if ! "$python" -c "import torch, numpy, expecttest, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  if [ "$python" = "$venv/bin/python3" ] && [ ! -x "$python" ]; then
    echo "install-deps: $(command -v python3) is the system's (externally managed): torch goes into $venv"
    python3 -m venv "$venv"
  fi
  echo "install-deps: installing torch==$torch_version for $python"
  "$python" -m pip install --quiet --disable-pip-version-check "torch==$torch_version" numpy expecttest
fi
# torchft, whose Manager reconfigures braid_torch.torchft's group, with the
# lighthouse program its wheel puts beside the interpreter.
if ! "$python" -c "import importlib.metadata as m, sys; sys.exit(m.version('torchft') != '$torchft_version')" 2>/dev/null; then
  echo "install-deps: installing torchft==$torchft_version for $python"
  "$python" -m pip install --quiet --disable-pip-version-check "torchft==$torchft_version"
fi
# NVIDIA's own nccl.h of the NCCL version braid's header follows, from its
# pip wheel (the header only, kept in .deps/): the ABI tests compare
# braid's header and library against it (tests/nccl).
nccl_version=2.32.6
nccl_header=.deps/nvidia-nccl-$nccl_version/nccl.h
if [ ! -f "$nccl_header" ]; then
  echo "install-deps: fetching nccl.h from nvidia-nccl-cu13==$nccl_version"
  wheels=$(mktemp -d)
  "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
    "nvidia-nccl-cu13==$nccl_version" -d "$wheels"
  "$python" - "$wheels"/nvidia_nccl_cu13-*.whl "$nccl_header" <<'PY'
import os, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(out), exist_ok=True)
with zipfile.ZipFile(wheel) as z, open(out + ".part", "wb") as f:
    f.write(z.read("nvidia/nccl/include/nccl.h"))
os.replace(out + ".part", out)
PY
  rm -rf "$wheels"
fi
# Python clients of NCCL, pinned, in a venv of their own under .deps/
# (apart from torch's, which brings NVIDIA's libnccl): NVIDIA's bindings
# (nccl4py) and CuPy's NCCL module. Nccl.PythonClientsRunOnBraidsLibrary
# runs them on braid's library.
clients=(nccl4py==0.6.0 cupy-cuda13x==14.2.0 numpy==2.4.6)
clients_venv=.deps/nccl-clients
if [ "$(cat "$clients_venv/installed" 2>/dev/null)" != "${clients[*]}" ]; then
  echo "install-deps: installing ${clients[*]} into $clients_venv"
  rm -rf "$clients_venv"
  python3 -m venv "$clients_venv"
  "$clients_venv/bin/python" -m pip install --quiet --disable-pip-version-check "${clients[@]}"
  echo "${clients[*]}" >"$clients_venv/installed"
fi
