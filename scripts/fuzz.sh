#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (in build-fuzz/) and
# runs each for FUZZ_SECONDS seconds (default 20) from its seed corpus in
# tests/fuzz/corpus/. New inputs go to a scratch folder; a crashing input is
# saved as build-fuzz/crashes/TARGET-crash-* and fails the script.
#   scripts/fuzz.sh                  every target
#   FUZZ_SECONDS=600 scripts/fuzz.sh wire    one target, longer
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-20}
targets=("$@")

cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DBRAID_FUZZ=ON -DBRAID_BUILD_TESTS=OFF -DBRAID_BUILD_BENCHMARKS=OFF >/dev/null
if [ ${#targets[@]} -eq 0 ]; then
  targets=(wire unique_id knobs)
  # The ibverbs connection record, where the ibverbs transport is built.
  cmake --build build-fuzz --target help | grep -q braid-fuzz-ib-wire && targets+=(ib_wire)
fi
names=()
for t in "${targets[@]}"; do names+=("braid-fuzz-${t//_/-}"); done
cmake --build build-fuzz -j "${BRAID_BUILD_JOBS:-2}" --target "${names[@]}"

mkdir -p build-fuzz/crashes
for t in "${targets[@]}"; do
  scratch=$(mktemp -d)
  echo "fuzz: ${t} for ${seconds} s"
  if ! "build-fuzz/bin/braid-fuzz-${t//_/-}" -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix="build-fuzz/crashes/${t}-" "$scratch" "tests/fuzz/corpus/$t" \
    >"build-fuzz/${t}.log" 2>&1; then
    rm -rf "$scratch"
    tail -30 "build-fuzz/${t}.log"
    echo "fuzz: ${t} failed; the input is in build-fuzz/crashes/" >&2
    exit 1
  fi
  grep -E '^stat::number_of_executed_units' "build-fuzz/${t}.log" | sed "s/^/fuzz: ${t}: /"
  rm -rf "$scratch"
done
