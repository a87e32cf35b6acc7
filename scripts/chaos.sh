#!/usr/bin/env bash
# A long chaos campaign: braid_chaos (tests/chaos/chaos.cc) for
# BRAID_CHAOS_TRIALS trials (default 1000) from seed BRAID_CHAOS_FIRST
# (default: a fresh one each run, printed first), printing a line per trial
# and the table per transport and fault. Not run by CI: CTest runs a short
# campaign of fixed seeds (Chaos.ShortCampaignOfFixedSeeds). Run as root
# for the multi-host trials (network namespaces). Extra arguments go to
# braid_chaos (e.g. --transport ucx, --fault stop, --cover).
#   scripts/chaos.sh                          1000 trials, build/
#   BRAID_CHAOS_TRIALS=50 BRAID_BUILD_DIR=build-chaos scripts/chaos.sh
# Exits non-zero when a trial violated anything; each such trial printed
# its replay command (braid_chaos --seed S ...).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BRAID_BUILD_DIR:-build}
trials=${BRAID_CHAOS_TRIALS:-1000}
first=${BRAID_CHAOS_FIRST:-$(( ($(date +%s) % 100000) * 1000 + RANDOM % 1000 ))}

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$build" -j "${BRAID_BUILD_JOBS:-2}" --target braid_chaos
echo "chaos: $trials trials from seed $first ($build/bin/braid_chaos)"
exec "$build/bin/braid_chaos" --trials "$trials" --first "$first" "$@"
