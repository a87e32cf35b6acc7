#!/usr/bin/env bash
# Runs the whole test suite (installing and building first when needed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd build
ctest --output-on-failure -j "${BRAID_TEST_JOBS:-2}" "$@"
