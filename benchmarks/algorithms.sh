#!/usr/bin/env bash
# Every algorithm of one collective that runs on host buffers of ranks on
# one host (braid-info --algorithms COLL --names), forced through BRAID_ALGO,
# next to braid's own choice, at each rank count (units as in docs/getting-started.md).
#
#   benchmarks/algorithms.sh OUTDIR
#
# For each N in NRANKS and each size it runs `braid-run -n N braid-perf COLL`
# once per algorithm with BRAID_ALGO=COLL:ALGO and once with braid's choice,
# in REPEAT rounds (each result keeps its best round), and writes
# OUTDIR/results.md:
# per size, each algorithm's time ("n/a" where it does not apply and braid
# ran its own choice), the fastest, braid's pick, what braid picked in each
# round and how much slower than the fastest it is (algorithms_table.py).
# Every run checks its results.
#
# Settings (environment):
#   BUILD      build folder (default: build, beside this folder)
#   COLL       collective (default allreduce)
#   NRANKS     rank counts (default "2 4")
#   MINBYTES MAXBYTES FACTOR   sizes (default 8, 64M, 4)
#   ITERS WARMUP   timed and warm-up calls per size (default 20, 5)
#   REPEAT     rounds (default 2)
set -euo pipefail

if [ $# -ne 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
  [ $# -eq 1 ] && exit 0
  exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
BUILD=${BUILD:-$repo/build}
bin=$BUILD/bin
COLL=${COLL:-allreduce}
NRANKS=${NRANKS:-2 4}
REPEAT=${REPEAT:-2}
minbytes=$(numfmt --from=iec "${MINBYTES:-8}")
maxbytes=$(numfmt --from=iec "${MAXBYTES:-64M}")
factor=${FACTOR:-4}
timing=(-n "${ITERS:-20}" -w "${WARMUP:-5}")

# The collective's algorithms that run on host buffers of ranks on one host,
# as braid-perf runs them, from the catalog (braid-info --algorithms).
if ! algos=$("$bin/braid-info" --algorithms "$COLL" --names); then
  echo "algorithms: unknown collective '$COLL'" >&2
  exit 2
fi

# Each round takes every rank count and size once, and at each size runs
# every algorithm back to back in a new order: the runs compared at one size
# lie seconds apart, and a cell's rounds minutes apart (this machine's speed
# drifts over spans of seconds to minutes; each cell keeps its best round).
for round in $(seq 1 "$REPEAT"); do
  for n in $NRANKS; do
    for ((size = minbytes; size <= maxbytes; size *= factor)); do
      for algo in $(printf '%s\n' $algos choice | shuf --random-source=<(yes "$round$n$size")); do
        json=$out/$COLL-n$n-$algo-s$size.r$round.json
        run=("$bin/braid-run" -n "$n" "$bin/braid-perf" "$COLL" -b "$size" -e "$size" "${timing[@]}"
          -J "$json")
        if [ "$algo" = choice ]; then
          env -u BRAID_ALGO "${run[@]}" >"${json%.json}.log" 2>&1
        else
          BRAID_ALGO="$COLL:$algo" "${run[@]}" >"${json%.json}.log" 2>&1
        fi
      done
    done
    echo "algorithms: $COLL at $n ranks, round $round"
  done
done

python3 "$repo/benchmarks/algorithms_table.py" "$out" "$COLL" "$NRANKS" "$algos" "$REPEAT" "$(uname -r)"
