#!/usr/bin/env bash
# Configures and builds braid into build/ (build/bin, build/lib).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${BRAID_BUILD_JOBS:-2}
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build build -j "$jobs"
