#!/usr/bin/env bash
# Runs the whole test suite (installing and building first when needed), then
# the GPU check's rehearsal on the emulated device (tools/gpu_check.sh
# --rehearse), then each fuzz target for 20 s (scripts/fuzz.sh), then the unit
# and multi-rank tests under AddressSanitizer+UBSan and ThreadSanitizer
# (scripts/sanitize.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
(cd build && ctest --output-on-failure -j "${BRAID_TEST_JOBS:-2}" "$@")
# The script a GPU machine runs, every step on the emulated device in build/,
# under 2 minutes: its paths, flags, parsing and summary are tested before a
# GPU comes (BRAID_SKIP_GPU_REHEARSAL=1 skips).
[ "${BRAID_SKIP_GPU_REHEARSAL:-0}" = 1 ] || tools/gpu_check.sh --rehearse
# The parsers of untrusted input under libFuzzer, briefly (BRAID_SKIP_FUZZ=1 skips).
[ "${BRAID_SKIP_FUZZ:-0}" = 1 ] || scripts/fuzz.sh
# The same tests built with sanitizers (BRAID_SKIP_SANITIZE=1 skips).
[ "${BRAID_SKIP_SANITIZE:-0}" = 1 ] || scripts/sanitize.sh
