#!/usr/bin/env bash
# `pip install ./integrations/torch` for the interpreter given (braid's
# sources compiled into the extension, no CMake, no libbraid.so), into a
# scratch directory; the package it makes passes the 2-rank collectives test.
#   BRAID_TEST_PIP=1 test_pip_install.sh /usr/bin/python3
# It compiles all of braid once more (about 85 s on 2 cores, alone), so it
# runs only where BRAID_TEST_PIP=1 asks; CI leaves it out to stay in time.
set -euo pipefail
python=$1
here=$(cd "$(dirname "$0")" && pwd)
if [ "${BRAID_TEST_PIP:-0}" != 1 ]; then
  echo "skipped: set BRAID_TEST_PIP=1 to build the pip package and test it"
  exit 77
fi
if ! "$python" -c "import setuptools, pip, torch" 2>/dev/null; then
  echo "skipped: $python lacks torch, pip or setuptools"
  exit 77
fi
target=$(mktemp -d /tmp/braid-torch-pip.XXXXXX)
trap 'rm -rf "$target"' EXIT
# No build isolation and no dependencies: torch is the interpreter's own,
# and nothing may be fetched.
MAX_JOBS=${BRAID_BUILD_JOBS:-2} "$python" -m pip install --quiet --no-build-isolation --no-deps \
  --target "$target" "$here/.."
if ldd "$target"/braid_torch/_C*.so | grep -q libbraid; then
  echo "the pip-built module links libbraid.so; it should hold braid itself"
  exit 1
fi
PYTHONPATH=$target "$python" "$here/test_collectives.py" 2
