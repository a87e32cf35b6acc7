#!/usr/bin/env bash
# Compares braid's all-reduce with its peers on this machine (docs/performance.md).
#
#   benchmarks/compare.sh [--hosts H] OUTDIR
#
# With --hosts H the ranks run on H namespace hosts (tools/netns_hosts.sh:
# network namespaces on a bridge, which braid tells apart as hosts; needs
# root), NRANKS / H per host numbered host by host (NRANKS defaults to H):
#   braid     each rank started in its host by tools/netns_hosts.sh run
#             (braid's own choice: shm within a host, tcp across), and again
#             with BRAID_ALGO=A for each A in BRAID_ALGOS (e.g. "ring hier")
#   Open MPI  mpirun.openmpi in host 0, --host naming each host's address,
#             its ranks started in the other hosts through the netns rsh
#             agent (each under its own hostname), --bind-to none, over btl
#             tcp,self with pml ob1 (plus vader with several ranks per
#             host; idle ranks yield when there are more ranks than CPUs)
#   Gloo      as below, its tcp device on each host's eth0
#   (MPICH is not run across namespace hosts.)
# On one host:
# Runs, each under `timeout`, at NRANKS ranks (default 2) and the same sizes:
#   braid     braid-run -n N braid-perf allreduce (braid's own transport choice,
#             and again with BRAID_TRANSPORT=T for each T in BRAID_ALSO)
#   Open MPI  mpirun.openmpi --oversubscribe --bind-to none peer-ompi-allreduce,
#             once with its default transports and once with --mca btl self,vader
#             (shared memory only)
#   MPICH     mpiexec.mpich peer-mpich-allreduce
#   Gloo      braid-run -n N peer-gloo-allreduce -A ALGO for each of GLOO_ALGOS
#   memcpy    braid-memcpy-bw -p N, the machine's copy bandwidth
# and writes OUTDIR/results.md (one row per size: each implementation's time
# and busbw, the best peer, braid's ratios; the memcpy bound; the machine; the
# exact commands) and OUTDIR/compare.png (busbw and time vs size, log-log).
# Every program's own output and JSON stay in OUTDIR too. A peer whose
# program or launcher is missing, or whose run fails or times out, is skipped
# and named on stdout; braid itself failing is an error.
#
# Settings (environment):
#   BUILD        build folder (default: build, beside this folder)
#   BRAID_BIN    where braid-run and braid-perf are (default: $BUILD/bin)
#   PEERS_BIN    where the peer programs and braid-memcpy-bw are (default: $BUILD/bin)
#   NRANKS       ranks (default 2)
#   MINBYTES MAXBYTES FACTOR   sizes (default 8, 64M, 2)
#   ITERS WARMUP timed and warm-up calls per size (default 20, 5)
#   SMALL_ITERS  timed calls per size up to 64 KiB (default 2000): a mean
#                over 20 calls of well under a microsecond is mostly the
#                noise of the moment. Every program but Gloo then runs twice
#                per round, its sizes up to 64 KiB with SMALL_ITERS and the
#                larger ones with ITERS; SMALL_ITERS=$ITERS runs once. (Gloo
#                takes 80 us and more per call here, and milliseconds at
#                some sizes: it keeps ITERS.)
#   BRAID_MEMALLOC  1: also braid with buffers from braid::memAlloc (braid-perf
#                -R 1), which same-host peers read in place, as an extra
#                column (default 0)
#   BRAID_ALSO   braid transports to run too, as extra columns (e.g. "tcp";
#                default none; across namespace hosts "ucx" runs shm,ucx, and
#                UCX_TLS=tcp,self: UCX would take shared memory between
#                namespaces); braid's ratios are those of its own choice
#   BRAID_ALGOS  braid algorithms (BRAID_ALGO) to run too, as extra columns
#                (e.g. "ring hier"; default none)
#   GLOO_ALGOS   Gloo variants, best per size is shown (default
#                "default ring ring-legacy halving-doubling")
#   RUN_TIMEOUT  seconds for each run (default 600)
#   REPEAT       rounds of all the runs, interleaved: round 1 runs every job
#                once, then round 2, ...; each size shows the median of its
#                rounds and their spread (default 3)
#   MEMCPY_BYTES buffer each memcpy process copies (default 256M)
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
}
HOSTS=0
if [ $# -ge 2 ] && [ "$1" = "--hosts" ]; then
  HOSTS=$2
  shift 2
  if ! [[ "$HOSTS" =~ ^[1-9][0-9]*$ ]]; then
    echo "compare: --hosts takes a number of namespace hosts, not '$HOSTS'" >&2
    exit 2
  fi
fi
if [ $# -ne 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  usage
  [ $# -eq 1 ] && exit 0
  exit 2
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
BUILD=${BUILD:-$repo/build}
BRAID_BIN=${BRAID_BIN:-$BUILD/bin}
PEERS_BIN=${PEERS_BIN:-$BUILD/bin}
# Absolute, so the recorded commands run from anywhere.
[ -d "$BRAID_BIN" ] && BRAID_BIN=$(cd "$BRAID_BIN" && pwd)
[ -d "$PEERS_BIN" ] && PEERS_BIN=$(cd "$PEERS_BIN" && pwd)
BRAID_ALSO=${BRAID_ALSO:-}
BRAID_ALGOS=${BRAID_ALGOS:-}
if [ "$HOSTS" -gt 0 ]; then NRANKS=${NRANKS:-$HOSTS}; else NRANKS=${NRANKS:-2}; fi
MINBYTES=${MINBYTES:-8}
MAXBYTES=${MAXBYTES:-64M}
FACTOR=${FACTOR:-2}
ITERS=${ITERS:-20}
SMALL_ITERS=${SMALL_ITERS:-2000}
WARMUP=${WARMUP:-5}
GLOO_ALGOS=${GLOO_ALGOS:-default ring ring-legacy halving-doubling}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
REPEAT=${REPEAT:-3}
MEMCPY_BYTES=${MEMCPY_BYTES:-256M}

python=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null 2>&1; then
    python=$(command -v "$p")
    break
  fi
done
if [ -z "$python" ]; then
  echo "compare: python3 is needed to read the JSON results (apt-get install python3)" >&2
  exit 1
fi
for tool in braid-run braid-perf; do
  if [ ! -x "$BRAID_BIN/$tool" ]; then
    echo "compare: no $BRAID_BIN/$tool: build braid first (scripts/build.sh) or set BRAID_BIN" >&2
    exit 1
  fi
done

# Across namespace hosts: make them, and remove them however this ends.
netns=()  # the launcher of braid-run's place: tools/netns_hosts.sh run
if [ "$HOSTS" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "compare: --hosts needs root, to make network namespaces" >&2
    exit 1
  fi
  if [ $((NRANKS % HOSTS)) -ne 0 ]; then
    echo "compare: NRANKS=$NRANKS is not a multiple of --hosts $HOSTS" >&2
    exit 2
  fi
  PER_HOST=$((NRANKS / HOSTS))
  hosts_sh=$repo/tools/netns_hosts.sh
  export NETNS_PREFIX="cmp$$"
  trap '"$hosts_sh" down "$NETNS_PREFIX" "$HOSTS"' EXIT
  if ! "$hosts_sh" up "$NETNS_PREFIX" "$HOSTS"; then
    echo "compare: could not make $HOSTS namespace hosts" >&2
    exit 1
  fi
  netns=("$hosts_sh" run "$NETNS_PREFIX" "$PER_HOST" "$NRANKS")
  # UCX tells shared memory's reach by IPC namespace, which the namespace
  # hosts share: between them it must use tcp.
  export UCX_TLS=tcp,self
fi
# launch PROGRAM ARGS...: NRANKS ranks of a program that reads braid-run's
# variables, on this host or across the namespace hosts.
launch=("$BRAID_BIN/braid-run" -n "$NRANKS")
[ "$HOSTS" -gt 0 ] && launch=("${netns[@]}")

# bytes SIZE: SIZE (4096, 64K, 16M, 1G, as the programs read it) in bytes.
bytes() {
  local text=${1^^}
  text=${text%IB}
  text=${text%B}
  case $text in
    *K) echo $((${text%K} << 10)) ;;
    *M) echo $((${text%M} << 20)) ;;
    *G) echo $((${text%G} << 30)) ;;
    *) echo $((text)) ;;
  esac
}
# The sizes, split where the small ones end (64 KiB, the latency range).
sizes=(-b "$MINBYTES" -e "$MAXBYTES" -f "$FACTOR" -n "$ITERS" -w "$WARMUP")
small_sizes=() large_sizes=()
if [ "$SMALL_ITERS" != "$ITERS" ]; then
  last_small=0 size=$(bytes "$MINBYTES") max=$(bytes "$MAXBYTES")
  while [ "$size" -le "$max" ] && [ "$size" -le 65536 ]; do
    last_small=$size
    size=$((size * FACTOR))
  done
  if [ "$last_small" -gt 0 ]; then
    small_sizes=(-b "$MINBYTES" -e "$last_small" -f "$FACTOR" -n "$SMALL_ITERS" -w "$WARMUP")
    [ "$size" -le "$max" ] &&
      large_sizes=(-b "$size" -e "$MAXBYTES" -f "$FACTOR" -n "$ITERS" -w "$WARMUP")
  else
    large_sizes=("${sizes[@]}")
  fi
fi
manifest=$out/runs.tsv    # label, json, status, command: one line per run
: >"$manifest"
skipped=()

# record LABEL NAME STATUS COMMAND...: a manifest line, without running.
record() {
  local label=$1 name=$2 status=$3
  shift 3
  local line=""
  [ $# -gt 0 ] && line=$(printf '%q ' "$@")
  printf '%s\t%s\t%s\t%s\n' "$label" "$name" "$status" "${line% }" >>"$manifest"
}

# run LABEL NAME COMMAND...: runs COMMAND under timeout, its output in
# OUT/NAME.log; a measuring COMMAND is given -J OUT/NAME.json. Returns 0
# when it succeeded.
run() {
  local label=$1 name=$2
  shift 2
  local line status rc=0
  line=$(printf '%q ' "$@")
  echo "compare: $label: ${line% }"
  timeout --kill-after=10 "$RUN_TIMEOUT" "$@" >"$out/$name.log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    status=ok
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    status="timed out after ${RUN_TIMEOUT}s (see $name.log)"
  else
    status="failed with exit code $rc (see $name.log)"
  fi
  record "$label" "$name" "$status" "$@"
  if [ "$status" != ok ]; then
    echo "compare: $label $status" >&2
    tail -n 5 "$out/$name.log" | sed 's/^/    /' >&2
    return 1
  fi
}

skip() {
  skipped+=("$1: $2")
  echo "compare: skipped $1: $2"
  record "$1" "" "skipped: $2"
}

# cpu_busy: the share of CPU time (percent) not idle over the next second:
# what else runs on the machine, which skews every number here.
cpu_busy() {
  local a b
  read -r -a a < <(head -n 1 /proc/stat)
  sleep 1
  read -r -a b < <(head -n 1 /proc/stat)
  local total=0 i
  for i in 1 2 3 4 5 6 7 8; do
    total=$((total + ${b[i]:-0} - ${a[i]:-0}))
  done
  local idle=$((b[4] - a[4] + b[5] - a[5]))
  [ "$total" -gt 0 ] || total=1
  echo $((100 * (total - idle) / total))
}

# The all-reduce jobs: a label, a file name, and the command (shell-quoted)
# without its sizes and -J. Each round runs every job once, in this order,
# so that a passing load falls on all alike; the tables show each size's
# median round. A job whose sizes are split runs as two, NAME-small first;
# with JOB_SPLIT=0, one run takes every size with ITERS.
job_labels=()
job_names=()
job_commands=()
job() {
  local label=$1 name=$2
  shift 2
  if [ "${JOB_SPLIT:-1}" = 0 ] || { [ ${#small_sizes[@]} -eq 0 ] && [ ${#large_sizes[@]} -eq 0 ]; }; then
    job_labels+=("$label")
    job_names+=("$name")
    job_commands+=("$(printf '%q ' "$@" "${sizes[@]}")")
    return
  fi
  if [ ${#small_sizes[@]} -gt 0 ]; then
    job_labels+=("$label")
    job_names+=("$name-small")
    job_commands+=("$(printf '%q ' "$@" "${small_sizes[@]}")")
  fi
  if [ ${#large_sizes[@]} -gt 0 ]; then
    job_labels+=("$label")
    job_names+=("$name")
    job_commands+=("$(printf '%q ' "$@" "${large_sizes[@]}")")
  fi
}

job braid braid "${launch[@]}" "$BRAID_BIN/braid-perf" allreduce
if [ "${BRAID_MEMALLOC:-0}" = 1 ]; then
  job "braid memAlloc" braid-memalloc "${launch[@]}" "$BRAID_BIN/braid-perf" \
    allreduce -R 1
fi
for transport in $BRAID_ALSO; do
  # Across namespace hosts shm stays within each host.
  chosen=$transport
  [ "$HOSTS" -gt 0 ] && [ "$transport" != shm ] && chosen="shm,$transport"
  job "braid $transport" "braid-$transport" env BRAID_TRANSPORT="$chosen" \
    "${launch[@]}" "$BRAID_BIN/braid-perf" allreduce
done
for algo in $BRAID_ALGOS; do
  job "braid $algo" "braid-$algo" env BRAID_ALGO="$algo" \
    "${launch[@]}" "$BRAID_BIN/braid-perf" allreduce
done

# Open MPI: its default transports, then shared memory only (across
# namespace hosts: tcp between them, and vader within when they hold
# several ranks).
ompi_root=()
[ "$(id -u)" -eq 0 ] && ompi_root=(--allow-run-as-root)
if [ ! -x "$PEERS_BIN/peer-ompi-allreduce" ]; then
  skip "Open MPI" "no $PEERS_BIN/peer-ompi-allreduce (libopenmpi-dev missing at configure time?)"
elif ! command -v mpirun.openmpi >/dev/null 2>&1; then
  skip "Open MPI" "no mpirun.openmpi (openmpi-bin)"
elif [ "$HOSTS" -gt 0 ]; then
  ompi_hosts=""
  for ((h = 0; h < HOSTS; ++h)); do ompi_hosts+="${ompi_hosts:+,}127.77.0.$((h + 1)):$PER_HOST"; done
  ompi_btl=tcp,self
  [ "$PER_HOST" -gt 1 ] && ompi_btl=tcp,vader,self
  # More ranks than CPUs: idle ranks yield, as --oversubscribe makes them
  # on one host (spinning, each op waits for time slices: ms per call).
  ompi_yield=()
  [ "$NRANKS" -gt "$(nproc)" ] && ompi_yield=(--mca mpi_yield_when_idle 1)
  job "Open MPI tcp" ompi-tcp ip netns exec "${NETNS_PREFIX}h0" mpirun.openmpi "${ompi_root[@]}" \
    -np "$NRANKS" --host "$ompi_hosts" --bind-to none "${ompi_yield[@]}" \
    --mca plm_rsh_agent "$hosts_sh" \
    --mca plm_rsh_args rsh --mca pml ob1 --mca btl "$ompi_btl" --mca btl_tcp_if_include eth0 \
    --mca oob_tcp_if_include eth0 "$PEERS_BIN/peer-ompi-allreduce"
else
  ompi=(mpirun.openmpi "${ompi_root[@]}" -np "$NRANKS" --oversubscribe --bind-to none)
  job "Open MPI" ompi "${ompi[@]}" "$PEERS_BIN/peer-ompi-allreduce"
  job "Open MPI vader" ompi-vader "${ompi[@]}" --mca btl self,vader \
    "$PEERS_BIN/peer-ompi-allreduce"
fi

# MPICH, through its Hydra launcher.
if [ "$HOSTS" -gt 0 ]; then
  skip MPICH "not run across namespace hosts"
elif [ ! -x "$PEERS_BIN/peer-mpich-allreduce" ]; then
  skip MPICH "no $PEERS_BIN/peer-mpich-allreduce (libmpich-dev missing at configure time?)"
elif ! command -v mpiexec.mpich >/dev/null 2>&1; then
  skip MPICH "no mpiexec.mpich (mpich)"
else
  job MPICH mpich mpiexec.mpich -n "$NRANKS" "$PEERS_BIN/peer-mpich-allreduce"
fi

# Gloo, started by braid-run (which hands out the ranks), one job per variant.
if [ ! -x "$PEERS_BIN/peer-gloo-allreduce" ]; then
  skip Gloo "no $PEERS_BIN/peer-gloo-allreduce (libgloo-dev missing at configure time?)"
else
  for algo in $GLOO_ALGOS; do
    JOB_SPLIT=0 job "Gloo $algo" "gloo-$algo" env BRAID_UNIQUE_ID="gloo-$algo-$$" "${launch[@]}" \
      "$PEERS_BIN/peer-gloo-allreduce" -A "$algo"
  done
fi

busy_before=$(cpu_busy)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
if [ "$busy_before" -gt 10 ]; then
  echo "compare: warning: the CPUs are ${busy_before}% busy before the runs; the numbers will be skewed"
fi

failed=()  # indices of jobs that failed once: not run again
for round in $(seq 1 "$REPEAT"); do
  suffix=""
  [ "$round" -gt 1 ] && suffix=".r$round"
  for i in "${!job_labels[@]}"; do
    [[ " ${failed[*]} " == *" $i "* ]] && continue
    label=${job_labels[$i]}
    file=${job_names[$i]}$suffix
    cmd=()
    eval "cmd=(${job_commands[$i]})"
    if ! run "$label" "$file" "${cmd[@]}" -J "$out/$file.json"; then
      if [ "$label" = braid ]; then
        echo "compare: braid itself failed; see $out/$file.log" >&2
        exit 1
      fi
      failed+=("$i")
      skipped+=("$label: its run failed ($file.log)")
    fi
  done
done

# The memory-copy bound.
if [ ! -x "$PEERS_BIN/braid-memcpy-bw" ]; then
  skip memcpy "no $PEERS_BIN/braid-memcpy-bw"
else
  run memcpy memcpy "$PEERS_BIN/braid-memcpy-bw" -p "$NRANKS" -s "$MEMCPY_BYTES" \
    -J "$out/memcpy.json" || skipped+=("memcpy: its run failed (memcpy.log)")
fi

load_after=$(cut -d' ' -f1-3 /proc/loadavg)
busy_after=$(cpu_busy)

# The machine.
cpu_model=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
cpus=$(nproc --all)
threads_per_core=$(lscpu 2>/dev/null | sed -n 's/^Thread(s) per core: *//p' | head -n 1)
mem_kib=$(sed -n 's/^MemTotal: *\([0-9]*\) kB/\1/p' /proc/meminfo)
os=$(sed -n 's/^PRETTY_NAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release 2>/dev/null || true)
commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$repo" status --porcelain 2>/dev/null)" ]; then
  commit="$commit (work tree has uncommitted changes)"
fi
{
  echo "cpu=${cpu_model:-unknown}"
  echo "cpus=$cpus"
  echo "threads_per_core=${threads_per_core:-unknown}"
  echo "memory_gib=$(awk -v k="${mem_kib:-0}" 'BEGIN { printf "%.1f", k / 1048576 }')"
  echo "kernel=$(uname -r)"
  echo "os=${os:-unknown}"
  echo "commit=$commit"
  echo "braid_bin=$BRAID_BIN"
  echo "packages=$(dpkg-query -W -f='${Package} ${Version}, ' libopenmpi-dev libmpich-dev \
    libgloo-dev 2>/dev/null | sed 's/, $//')"
  echo "load_before=$load_before"
  echo "load_after=$load_after"
  echo "busy_before=$busy_before"
  echo "busy_after=$busy_after"
  echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "nranks=$NRANKS"
  echo "iters=$ITERS"
  echo "small_iters=${small_sizes[*]:+$SMALL_ITERS}"
  echo "hosts=$HOSTS"
} >"$out/machine.txt"

# gnuplot's PNG terminal: cairo's when it has it, else libgd's; none: no plot.
terminal=""
if command -v gnuplot >/dev/null 2>&1; then
  for t in pngcairo png; do
    if gnuplot -e "set terminal $t" >/dev/null 2>&1; then
      terminal=$t
      break
    fi
  done
fi

"$python" - "$out" "$terminal" <<'PYTHON'
"""Reads OUT/runs.tsv and the JSON files it names; writes results.md,
plot.dat and plot.gp."""
import json
import os
import sys

out, terminal = sys.argv[1], sys.argv[2]
have_gnuplot = terminal != ""
SMALL = 64 * 1024  # sizes up to this also get a latency ratio


def human(size):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def fmt(value, digits=3):
    if value is None:
        return "–"
    if value == 0:
        return "0"
    text = f"{value:.{digits}g}"
    return text if "e" not in text else f"{value:.1e}"


def fmt_time(us):
    return "–" if us is None else (f"{us:.2f}" if us < 1e4 else f"{us:.0f}")


runs = []
with open(os.path.join(out, "runs.tsv")) as f:
    for line in f:
        label, name, status, command = line.rstrip("\n").split("\t", 3)
        runs.append({"label": label, "name": name, "status": status, "command": command})

machine = {}
with open(os.path.join(out, "machine.txt")) as f:
    for line in f:
        key, _, value = line.rstrip("\n").partition("=")
        machine[key] = value


def load(name):
    path = os.path.join(out, name + ".json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# Per implementation: {size: (time_us, busbw)} from the out-of-place results,
# busbw recomputed from the time at full precision.
def series(doc):
    n = doc["nranks"]
    factor = 2 * (n - 1) / n
    points = {}
    for r in doc["results"]:
        m = r["out_of_place"]
        if m.get("wrong") not in (0, None):
            continue
        t = m["time_us"]
        points[r["size"]] = (t, r["size"] / (t * 1e3) * factor if t > 0 else None)
    return points


# Per implementation and size, one time per round (the run's file name
# ends in .rK from round 2 on); every Gloo variant counts as one
# implementation, "Gloo", whose time in a round is its fastest variant's.
impls = []  # (label, points, library): points = {size: (median time, busbw, spread)}
notes = []
samples = {}  # group -> {size: {round: (time, variant)}}
libraries = {}
rounds = {}
for run in runs:
    label = run["label"]
    if run["status"] != "ok" or label == "memcpy":
        continue
    doc = load(run["name"])
    if doc is None:
        notes.append(f"{label}: no readable {run['name']}.json")
        continue
    group, variant = ("Gloo", label.split(" ", 1)[1]) if label.startswith("Gloo ") else (label, "")
    name = run["name"]
    round_no = int(name.rsplit(".r", 1)[1]) if ".r" in name else 1
    rounds.setdefault(label, set()).add(round_no)
    libraries.setdefault(group, doc.get("library", "").split(" (")[0])
    by_size = samples.setdefault(group, {})
    for size, (t, _) in series(doc).items():
        per_round = by_size.setdefault(size, {})
        if round_no not in per_round or t < per_round[round_no][0]:
            per_round[round_no] = (t, variant)


def median(values):
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


factor_all = 2 * (int(machine.get("nranks", 2)) - 1) / int(machine.get("nranks", 2))
gloo_wins = {}
gloo_choice = {}
for group, by_size in samples.items():
    points = {}
    for size, per_round in by_size.items():
        times = [t for t, _ in per_round.values()]
        t = median(times)
        spread = (max(times) - min(times)) / 2 / t if t > 0 else 0
        points[size] = (t, size / (t * 1e3) * factor_all if t > 0 else None, spread)
        if group == "Gloo":  # the variant of the median round (of the faster middle one)
            variant = min(per_round.values(), key=lambda tv: abs(tv[0] - t))[1]
            gloo_choice[size] = variant
            gloo_wins[variant] = gloo_wins.get(variant, 0) + 1
    impls.append((group, points, libraries[group]))
impls.sort(key=lambda impl: impl[0] == "Gloo")  # Gloo last, as its jobs run

braid = next((points for label, points, _ in impls if label == "braid"), {})
peers = [(label, points) for label, points, _ in impls if not label.startswith("braid")]
sizes = sorted(braid)

calls = f" over {machine.get('iters', '?')} calls"
if machine.get("small_iters"):
    calls = f" over {machine['small_iters']} calls up to {human(SMALL)} and {machine['iters']} above"
    if "Gloo" in samples:
        calls += f" (Gloo: {machine['iters']} at every size)"
lines = []
hosts = int(machine.get("hosts", "0") or 0)
where = (f"{hosts} namespace hosts of {int(machine.get('nranks', 0)) // hosts} ranks"
         if hosts else "one host")
lines.append(f"# braid vs peers: all-reduce, float32 sum, {machine.get('nranks')} ranks, {where}\n")
lines.append(
    f"Out-of-place; time = mean µs per call after warm-up{calls}, the slowest rank's; "
    "busbw = size / time × 2(n−1)/n in GB/s (1 GB = 1e9 B), as braid-perf and nccl-tests. "
    "Every run verified its results (any wrong element fails the run). "
    f"Each size shows the median of {max(map(len, rounds.values()), default=0)} round(s), run "
    "interleaved (every implementation once per round); ±: half the range of the "
    "rounds' times, as a share of the median.\n")
head = ["size"]
for label, _, _ in impls:
    head += [f"{label} µs", f"{label} busbw"]
head += ["best peer", "braid/best busbw", "braid/best time"]
lines.append("| " + " | ".join(head) + " |")
lines.append("|" + "|".join(["---:"] * (len(head) - 3) + [":---", "---:", "---:"]) + "|")
for size in sizes:
    row = [human(size)]
    for _, points, _ in impls:
        t, bw, spread = points.get(size, (None, None, None))
        cell = fmt_time(t)
        if t is not None and max(map(len, rounds.values()), default=0) > 1:
            cell += f" ±{100 * spread:.0f}%"
        row += [cell, fmt(bw)]
    candidates = [(points[size][0], label) for label, points in peers if size in points]
    if candidates:
        best_time, best_label = min(candidates)
        if best_label == "Gloo":
            best_label = f"Gloo {gloo_choice[size]}"
        braid_time = braid[size][0]
        bw_ratio = best_time / braid_time  # busbw ratio braid/best = inverse time ratio
        row += [best_label, f"{bw_ratio:.2f}",
                f"{braid_time / best_time:.2f}×" if size <= SMALL else "–"]
    else:
        row += ["–", "–", "–"]
    lines.append("| " + " | ".join(row) + " |")
lines.append("")
# The issue-style summary: the ratios over the bandwidth and the latency ranges.
bw_ratios, time_ratios = [], []
for size in sizes:
    candidates = [points[size][0] for _, points in peers if size in points]
    if not candidates:
        continue
    ratio = min(candidates) / braid[size][0]
    if (128 << 10) <= size <= (32 << 20):
        bw_ratios.append(ratio)
    if size <= 4096:
        time_ratios.append(1 / ratio)
if bw_ratios:
    lines.append(f"braid/best busbw from 128 KiB to 32 MiB: lowest {min(bw_ratios):.2f}, median "
                 f"{median(bw_ratios):.2f} ({len(bw_ratios)} sizes).")
if time_ratios:
    lines.append(f"braid/best time up to 4 KiB: highest {max(time_ratios):.2f}, median "
                 f"{median(time_ratios):.2f} ({len(time_ratios)} sizes).")
lines.append("")
lines.append("braid/best busbw > 1: braid moves more bytes per second than the best peer; "
             f"braid/best time (sizes ≤ {human(SMALL)}) > 1: braid's call takes that many "
             "times longer.")
if gloo_wins:
    wins = ", ".join(f"{a} at {n} size{'s' if n > 1 else ''}" for a, n in sorted(gloo_wins.items(), key=lambda x: -x[1]))
    lines.append(f"Gloo column: the fastest of its variants at each size ({wins}); "
                 "each variant's own table is in gloo-*.log.")
lines.append("")

memcpy = None
memcpy_run = next((r for r in runs if r["label"] == "memcpy"), None)
if memcpy_run and memcpy_run["status"] == "ok":
    memcpy = load("memcpy")
if memcpy:
    # The bound: the fastest copy kernel's rate per process while every
    # process runs it (bytes copied per second: half its traffic).
    kernels = {k["name"]: k for k in memcpy.get("kernels", [])}
    copies = [(memcpy["per_process_gbps"], "memcpy")]
    if "copy-stream" in kernels:
        copies.append((kernels["copy-stream"]["per_process_gbps"] / 2, "braid's streaming copy"))
    per, bound_kernel = max(copies)
    lines.append(
        f"**Memory bound** (braid-memcpy-bw, {memcpy['procs']} processes each running a kernel "
        f"over its own {human(memcpy['bytes'])} buffers at once, best of {memcpy['reps']}): "
        f"memcpy copies {memcpy['per_process_gbps']:.2f} GB/s per process while all copy (one "
        f"copy alone at best {memcpy['solo_best_gbps']:.2f} GB/s).")
    if kernels:
        lines.append("")
        lines.append("| kernel | per process, bytes read + written per second (GB/s) |")
        lines.append("|:---|---:|")
        for k in memcpy["kernels"]:
            lines.append(f"| {k['name']} | {k['per_process_gbps']:.2f} |")
    lines.append("")
    lines.append(
        f"The bound is the fastest copy, {bound_kernel}: {per:.2f} GB/s copied per process. An "
        "all-reduce rank must at least read its input and write its output, as a copy does, so "
        "its algbw cannot beat that; ring all-reduce reads and writes each of those bytes once "
        "in memory (the pieces it sends and receives in between pass through FIFOs that stay "
        "in the cache), so its algbw over the bound is the share of the memory bandwidth it "
        "uses.")
    big = [s for s in sizes if s >= 32 << 20]
    factor = 2 * (int(machine.get("nranks", 2)) - 1) / int(machine.get("nranks", 2))
    parts = []
    for s in big:
        algbw = braid[s][1] / factor
        parts.append(f"{human(s)}: {algbw:.3f} GB/s = {100 * algbw / per:.1f}%")
    if parts:
        lines.append("")
        lines.append("braid algbw at ≥ 32 MiB (out of place), as a share of the bound: "
                     + "; ".join(parts) + ".")
        best_parts = []
        for s in big:
            candidates = [(points[s][0], label) for label, points in peers if s in points]
            if candidates:
                t, label = min(candidates)
                algbw = s / (t * 1e3)
                best_parts.append(f"{human(s)}: {label} {algbw:.3f} GB/s = {100 * algbw / per:.1f}%")
        if best_parts:
            lines.append("The best peer there: " + "; ".join(best_parts) + ".")
else:
    lines.append("**Memory bound**: not measured (braid-memcpy-bw missing or failed).")
lines.append("")

lines.append("## Machine\n")
lines.append(f"- CPU: {machine.get('cpu')}, {machine.get('cpus')} logical CPUs "
             f"({machine.get('threads_per_core')} thread(s) per core)")
lines.append(f"- memory: {machine.get('memory_gib')} GiB; kernel {machine.get('kernel')}; "
             f"{machine.get('os')}")
lines.append(f"- other load: CPUs {machine.get('busy_before')}% busy in the second before the "
             f"runs, {machine.get('busy_after')}% in the second after; load average "
             f"(1, 5, 15 min) before {machine.get('load_before')}, after "
             f"{machine.get('load_after')}")
if int(machine.get("busy_before") or 0) > 10:
    lines.append("- **warning**: the machine was busy before the runs; these numbers are skewed")
lines.append(f"- braid: {machine.get('braid_bin')}; this tree's commit {machine.get('commit')}; "
             f"measured {machine.get('date')}")
if machine.get("packages"):
    lines.append(f"- Debian packages: {machine.get('packages')}")
libraries = [f"{label}: {lib}" for label, _, lib in impls if lib and not label.startswith("braid")]
if libraries:
    lines.append("- peers: " + "; ".join(libraries))
lines.append("")

lines.append("## Runs\n")
skipped = [r for r in runs if r["status"] != "ok"]
if skipped:
    for r in skipped:
        lines.append(f"- {r['label']}: {r['status']}")
else:
    lines.append("- every run succeeded")
for note in notes:
    lines.append(f"- {note}")
if not have_gnuplot:
    lines.append("- no plot: gnuplot (with a PNG terminal) is not installed "
                 "(scripts/install-peers.sh)")
lines.append("")
lines.append("```sh")
for r in runs:
    if r["command"]:
        lines.append(r["command"])
lines.append("```")

with open(os.path.join(out, "results.md"), "w") as f:
    f.write("\n".join(lines) + "\n")

# The plot's data: size, then time and busbw per implementation ("?" = none).
with open(os.path.join(out, "plot.dat"), "w") as f:
    f.write("# size " + " ".join(f'"{label}_us" "{label}_busbw"' for label, _, _ in impls) + "\n")
    all_sizes = sorted({s for _, points, _ in impls for s in points})
    for s in all_sizes:
        cols = [str(s)]
        for _, points, _ in impls:
            t, bw = points.get(s, (None, None, None))[:2]
            cols += [f"{t:.6g}" if t else "?", f"{bw:.6g}" if bw else "?"]
        f.write(" ".join(cols) + "\n")

with open(os.path.join(out, "plot.gp"), "w") as f:
    title = f"all-reduce float32 sum, {machine.get('nranks')} ranks, {machine.get('cpu')}"
    title = title.replace('"', "'")
    all_sizes = sorted({s for _, points, _ in impls for s in points}) or [1]
    tics = []
    s = all_sizes[0]
    while s <= all_sizes[-1]:
        tics.append(f'"{human(s).replace(" ", "")}" {s}')
        s *= 8
    f.write(f"""set terminal {terminal} size 1500,600 noenhanced

set output "{os.path.join(out, 'compare.png')}"
set datafile missing "?"
set multiplot layout 1,2 title "{title}"
set logscale xy
set grid
set key top left
set xtics ({", ".join(tics)})
set xlabel "size"
set format y "%g"
set ylabel "busbw (GB/s)"
set title "bus bandwidth (higher is better)"
plot """ + ", \\\n     ".join(
        f'"plot.dat" using 1:{3 + 2 * i} with linespoints title "{label}"'
        for i, (label, _, _) in enumerate(impls)) + """
set ylabel "time per call (us)"
set title "time (lower is better)"
set key top left
plot """ + ", \\\n     ".join(
        f'"plot.dat" using 1:{2 + 2 * i} with linespoints title "{label}"'
        for i, (label, _, _) in enumerate(impls)) + """
unset multiplot
""")
PYTHON

if [ -n "$terminal" ]; then
  if ! (cd "$out" && gnuplot plot.gp >"$out/gnuplot.log" 2>&1); then
    echo "compare: gnuplot failed (see $out/gnuplot.log); no compare.png" >&2
  fi
else
  echo "compare: gnuplot is not installed: no compare.png (scripts/install-peers.sh installs it)"
fi

if [ ${#skipped[@]} -gt 0 ]; then
  echo "compare: skipped or failed:"
  printf '  %s\n' "${skipped[@]}"
fi
echo "compare: wrote $out/results.md$([ -f "$out/compare.png" ] && echo " and $out/compare.png")"
