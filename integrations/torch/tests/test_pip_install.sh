#!/usr/bin/env bash
# The pip package of integrations/torch, as a user makes it: `pip wheel`
# builds a wheel (braid's sources compiled into the extension, no CMake, no
# libbraid.so) for the torch of the interpreter given; the wheel installs
# into a fresh virtual environment that sees that interpreter's torch from
# pip; there it passes the 2-rank collectives test; and under a torch other
# than the one it was built for, importing it fails naming both versions.
#   BRAID_TEST_PIP=1 test_pip_install.sh PYTHON
# It compiles all of braid once more (about 85 s on 2 cores, alone), so it
# runs only where BRAID_TEST_PIP=1 asks; CI leaves it out to stay in time.
set -euo pipefail
python=$1
here=$(cd "$(dirname "$0")" && pwd)
if [ "${BRAID_TEST_PIP:-0}" != 1 ]; then
  echo "skipped: set BRAID_TEST_PIP=1 to build the pip package and test it"
  exit 77
fi
if ! "$python" -c "import setuptools, pip, venv, torch" 2>/dev/null; then
  echo "skipped: $python lacks torch, pip, venv or setuptools"
  exit 77
fi
scratch=$(mktemp -d /tmp/braid-torch-pip.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

# No build isolation and no dependencies: torch is the interpreter's own,
# and nothing may be fetched.
MAX_JOBS=${BRAID_BUILD_JOBS:-2} "$python" -m pip wheel --quiet --no-build-isolation --no-deps \
  --wheel-dir "$scratch/wheels" "$here/.."
wheel=$(ls "$scratch"/wheels/braid_torch-*.whl)
echo "built $(basename "$wheel")"

"$python" -m venv --system-site-packages "$scratch/venv"
venv_python=$scratch/venv/bin/python3
"$venv_python" -m pip install --quiet --no-deps --no-index "$wheel"
module=$("$venv_python" -c "import braid_torch._C as m; print(m.__file__)")
case "$module" in
  "$scratch/venv/"*) ;;
  *) echo "braid_torch came from $module, not from the virtual environment"; exit 1 ;;
esac
if ldd "$module" | grep -q libbraid; then
  echo "the pip-built module links libbraid.so; it should hold braid itself"
  exit 1
fi
(cd "$scratch" && "$venv_python" "$here/test_collectives.py" 2)

# Built for another torch: the import says so, naming both versions.
package=$(dirname "$module")
sed -i 's/^TORCH_VERSION = .*/TORCH_VERSION = "0.0.1"/' "$package/_built_for.py"
if message=$("$venv_python" -c "import braid_torch" 2>&1); then
  echo "braid_torch imported under a torch it was not built for"
  exit 1
fi
have=$("$venv_python" -c "import torch; print(torch.__version__)")
for needle in "built for torch 0.0.1" "has torch $have"; do
  if ! grep -qF "$needle" <<<"$message"; then
    echo "the import error does not say '$needle': $message"
    exit 1
  fi
done
echo "passed: the wheel installs into a fresh environment, passes the collectives, and names both torch versions when they differ"
