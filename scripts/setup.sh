#!/usr/bin/env bash
# One command on a fresh Debian 12 machine: installs what braid needs, builds
# it, and runs the main job, a 2-rank all-reduce bandwidth run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build/bin/braid-run -n 2 build/bin/braid-perf allreduce -b 8 -e 64M -f 4
