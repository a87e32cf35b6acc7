#!/usr/bin/env bash
# Every algorithm of one collective, forced through BRAID_ALGO, next to
# braid's own choice, at each rank count (DESIGN.md §8 units).
#
#   benchmarks/algorithms.sh OUTDIR
#
# For each N in NRANKS and each size it runs `braid-run -n N braid-perf COLL`
# once per algorithm with BRAID_ALGO=COLL:ALGO and once with braid's choice,
# in REPEAT rounds (each result keeps its best round), and writes
# OUTDIR/results.md:
# per size, each algorithm's time ("n/a" where it does not apply and braid
# ran its default), the fastest, braid's pick and how much slower than the
# fastest it is. Every run checks its results.
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

# The algorithms each collective has (algorithms/catalog.cc).
case "$COLL" in
  allreduce) algos="ring tree rabenseifner recdoubling oneshot" ;;
  broadcast) algos="chain binomial scatter" ;;
  reduce) algos="chain binomial" ;;
  allgather) algos="ring bruck" ;;
  reducescatter) algos="ring rechalving" ;;
  *)
    echo "algorithms: unknown collective '$COLL'" >&2
    exit 2
    ;;
esac

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

python3 - "$out" "$COLL" "$NRANKS" "$algos" "$REPEAT" "$(uname -r)" <<'PY'
import glob, json, sys
out, coll, nranks, algos, repeat, kernel = sys.argv[1:7]
algos = algos.split()
def human(b):
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if b < 1024 or unit == "GiB":
            return f"{b:g} {unit}"
        b /= 1024
lines = [f"# {coll}: every algorithm forced, and braid's choice\n",
         "Out-of-place float32 sum; time = mean µs per call, the slowest rank's; each size "
         f"keeps its best of {repeat} interleaved rounds; every run checked its results. "
         f"Kernel {kernel}.\n"]
for n in nranks.split():
    best = {}   # (algo, size) -> time
    picked = {} # size -> (algorithm, time)
    wrong = 0
    for algo in algos + ["choice"]:
        for path in glob.glob(f"{out}/{coll}-n{n}-{algo}-s*.r*.json"):
            doc = json.load(open(path))
            wrong += doc.get("out_of_bounds", 0)
            for row in doc["results"]:
                m = row["out_of_place"]
                if algo != "choice" and m.get("algorithm") != algo:
                    continue  # it does not apply there: braid ran its default instead
                key = (algo, row["size"])
                if key not in best or m["time_us"] < best[key]:
                    best[key] = m["time_us"]
                    if algo == "choice":
                        picked[row["size"]] = (m["algorithm"], m["time_us"])
    sizes = sorted({s for (_, s) in best})
    lines.append(f"\n## {n} ranks\n")
    lines.append("| size | " + " | ".join(f"{a} µs" for a in algos) +
                 " | fastest | braid's pick | pick µs | pick / fastest |")
    lines.append("|---:|" + "---:|" * len(algos) + ":---|:---|---:|---:|")
    worst = 0
    for s in sizes:
        times = {a: best.get((a, s)) for a in algos}
        known = {a: t for a, t in times.items() if t is not None}
        fastest = min(known, key=known.get)
        algo, t = picked.get(s, ("?", float("nan")))
        ratio = t / known[fastest]
        worst = max(worst, ratio)
        cells = ["n/a" if times[a] is None else
                 f"**{times[a]:.2f}**" if a == fastest else f"{times[a]:.2f}" for a in algos]
        lines.append(f"| {human(s)} | " + " | ".join(cells) +
                     f" | {fastest} | {algo} | {t:.2f} | {ratio:.2f} |")
    lines.append(f"\nbraid's pick is at most {worst:.2f}× the fastest forced algorithm at {n} ranks"
                 f"{'' if wrong == 0 else f'; {wrong} WRONG ELEMENTS'}.")
open(f"{out}/results.md", "w").write("\n".join(lines) + "\n")
print(f"algorithms: wrote {out}/results.md")
PY
