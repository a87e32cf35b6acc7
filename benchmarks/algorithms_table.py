#!/usr/bin/env python3
"""The table of benchmarks/algorithms.sh, from the JSON its runs wrote.

    algorithms_table.py OUTDIR COLL "NRANKS" "ALGOS" ROUNDS KERNEL

Writes OUTDIR/results.md: per rank count and size, each forced algorithm's
best time over the rounds (n/a where it does not apply), the fastest in
bold, braid's pick marked with a check, the algorithms braid picked over
the rounds, and how its best time compares with the fastest forced one.
"""
import collections
import glob
import json
import sys


def human(size):
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if size < 1024 or unit == "GiB":
            return f"{size:g} {unit}"
        size /= 1024


def main():
    out, coll, nranks, algos, rounds, kernel = sys.argv[1:7]
    algos = algos.split()
    lines = [
        f"# {coll}: every algorithm forced, and braid's choice\n",
        "Out-of-place float32 sum; time = mean µs per call, the slowest rank's; each cell "
        f"keeps its best of {rounds} rounds; every run checked its results. **Bold**: the "
        "fastest forced algorithm; ✓: braid's pick in its best round; *picks*: what braid "
        f"chose in each round. Kernel {kernel}.\n",
    ]
    for n in nranks.split():
        best = {}  # (algorithm, size) -> µs
        picked = {}  # size -> (algorithm, µs) of braid's best round
        picks = collections.defaultdict(collections.Counter)  # size -> algorithm -> rounds
        wrong = 0
        for algo in algos + ["choice"]:
            for path in glob.glob(f"{out}/{coll}-n{n}-{algo}-s*.r*.json"):
                with open(path) as f:
                    doc = json.load(f)
                wrong += doc.get("out_of_bounds", 0)
                for row in doc["results"]:
                    m = row["out_of_place"]
                    if algo == "choice":
                        picks[row["size"]][m["algorithm"]] += 1
                    elif m.get("algorithm") != algo:
                        continue  # it does not apply there: braid ran its own choice
                    key = (algo, row["size"])
                    if key not in best or m["time_us"] < best[key]:
                        best[key] = m["time_us"]
                        if algo == "choice":
                            picked[row["size"]] = (m["algorithm"], m["time_us"])
        sizes = sorted({s for (_, s) in best})
        lines.append(f"\n## {n} ranks\n")
        lines.append("| size | " + " | ".join(f"{a} µs" for a in algos) +
                     " | braid µs | braid / fastest | picks |")
        lines.append("|---:|" + "---:|" * len(algos) + "---:|---:|:---|")
        worst = 0
        for s in sizes:
            times = {a: best.get((a, s)) for a in algos}
            known = {a: t for a, t in times.items() if t is not None}
            fastest = min(known, key=known.get)
            algo, t = picked.get(s, ("?", float("nan")))
            ratio = t / known[fastest]
            worst = max(worst, ratio)
            cells = []
            for a in algos:
                if times[a] is None:
                    cells.append("n/a")
                    continue
                cell = f"{times[a]:.2f}"
                if a == fastest:
                    cell = f"**{cell}**"
                if a == algo:
                    cell += " ✓"
                cells.append(cell)
            chosen = ", ".join(f"{a} ×{k}" for a, k in picks[s].most_common())
            lines.append(f"| {human(s)} | " + " | ".join(cells) +
                         f" | {t:.2f} | {ratio:.2f} | {chosen} |")
        lines.append(f"\nbraid's pick is at most {worst:.2f}× the fastest forced algorithm "
                     f"at {n} ranks{'' if wrong == 0 else f'; {wrong} WRONG ELEMENTS'}.")
    with open(f"{out}/results.md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"algorithms: wrote {out}/results.md")


if __name__ == "__main__":
    main()
