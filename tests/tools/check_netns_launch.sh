#!/usr/bin/env bash
# Ranks started inside namespace hosts the way a launcher on each host would
# start them: `ip netns exec HOST env BRAID_RANK=.. BRAID_WORLD_SIZE=..
# BRAID_ROOT=host0:port PROGRAM`, two hosts (network namespaces on a
# bridge, loopback-range addresses) of two ranks each. Checks that braid-info
# --peers sees shm within a host and tcp between hosts, and that braid-perf
# runs every collective with no wrong element; then braid-perf started by
# the launchers themselves across the hosts: Open MPI's mpirun (where
# installed), torchrun (where scripts/torch-python's interpreter has torch),
# and Slurm's variables. Exit 77 (skipped) where the namespaces cannot be made.
#   check_netns_launch.sh BIN_DIR
set -uo pipefail
bin=$1
prefix="braidl$$"
hosts=2
ranksPerHost=2
nranks=$((hosts * ranksPerHost))

if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: needs root to create network namespaces"
  exit 77
fi
hosts_sh="$(cd "$(dirname "$0")/../.." && pwd)/tools/netns_hosts.sh"
trap '"$hosts_sh" down "$prefix" $hosts' EXIT
if ! "$hosts_sh" up "$prefix" $hosts >/dev/null 2>&1; then
  echo "skipped: could not set up network namespaces here"
  exit 77
fi

failures=0
# launch NAME PROGRAM ARGS...: every rank in its host (rank r on host r /
# ranksPerHost, as tools/netns_hosts.sh run starts them), the root in rank
# 0; rank r's output in $out/NAME.r.
out=$(mktemp -d)
launch() {
  local name=$1
  shift
  mkdir -p "$out/$name"
  NETNS_LOGS="$out/$name" BRAID_TIMEOUT=30 \
    "$hosts_sh" run "$prefix" $ranksPerHost $nranks timeout 120 "$@" >"$out/$name.0" 2>&1
  local status=$?
  for ((r = 1; r < nranks; ++r)); do mv "$out/$name/rank.$r" "$out/$name.$r"; done
  return $status
}

if launch peers "$bin/braid-info" --peers; then
  # Row r of the matrix: "  r  self  shm  tcp  tcp" (rank 0, hosts of two).
  bad=$(awk -v per=$ranksPerHost -v n=$nranks '
    /^transport from rank/ { table = 1; next }
    table && $1 ~ /^[0-9]+$/ && $2 !~ /^[0-9]+$/ {
      r = $1
      for (p = 0; p < NF - 1; ++p) {
        want = p == r ? "self" : int(p / per) == int(r / per) ? "shm" : "tcp"
        if ($(p + 2) != want) { print "rank " r " reaches " p " by " $(p + 2) ", not " want; exit }
      }
      if (++rows == n) exit
    }' "$out/peers.0")
  # And the hosts with their ranks.
  if [ -z "$bad" ] && ! grep -q '^2 hosts:' "$out/peers.0"; then bad="no '2 hosts:' line"; fi
  if [ -z "$bad" ] && ! grep -q '^  host 1: ranks 2 3$' "$out/peers.0"; then
    bad="host 1 does not hold ranks 2 and 3"
  fi
  if [ -n "$bad" ]; then
    echo "FAIL braid-info --peers across namespace hosts: $bad"
    cat "$out/peers.0"
    failures=$((failures + 1))
  else
    echo "ok   braid-info --peers: shm within a namespace host, tcp between them"
  fi
else
  echo "FAIL braid-info --peers under ip netns exec"
  tail -n 5 "$out"/peers.*
  failures=$((failures + 1))
fi

if launch perf "$bin/braid-perf" -a -b 8 -e 4M -f 16 -n 3 -w 1 &&
  grep -q 'Out of bounds values : 0 OK' "$out/perf.0"; then
  echo "ok   braid-perf -a, 2 hosts x 2 ranks started with ip netns exec"
else
  echo "FAIL braid-perf -a across namespace hosts"
  tail -n 5 "$out"/perf.*
  failures=$((failures + 1))
fi
# The launchers people run on each host, across the namespace hosts, each
# starting braid-perf -a, which must find its rank and the root in what that
# launcher sets. Slurm's srun is not here: its variables (SLURM_PROCID,
# SLURM_NTASKS), as srun sets them, with the root in BRAID_ROOT.
perf_args=(-a -b 8 -e 1M -f 32 -n 2 -w 1)
check_perf() {  # NAME: its rank 0 output in $out/NAME.0 says all ranks met, all right
  if grep -q "nranks $nranks," "$out/$1.0" && grep -q 'Out of bounds values : 0 OK' "$out/$1.0"; then
    echo "ok   braid-perf -a across namespace hosts, started by $2"
  else
    echo "FAIL braid-perf -a across namespace hosts, started by $2"
    tail -n 8 "$out/$1".* 2>/dev/null
    failures=$((failures + 1))
  fi
}
NETNS_LAUNCHER=slurm launch slurm "$bin/braid-perf" "${perf_args[@]}"
check_perf slurm "Slurm's variables (SLURM_PROCID, SLURM_NTASKS) and BRAID_ROOT"

# Open MPI's mpirun in host 0, its daemon on host 1 started through the
# netns rsh agent; braid reads OMPI_COMM_WORLD_RANK/SIZE and the root from
# BRAID_ROOT (-x passes it on).
if command -v mpirun.openmpi >/dev/null 2>&1; then
  root_flag=()
  [ "$(id -u)" -eq 0 ] && root_flag=(--allow-run-as-root)
  NETNS_PREFIX=$prefix timeout 120 ip netns exec "${prefix}h0" mpirun.openmpi "${root_flag[@]}" \
    -np $nranks --host 127.77.0.1:$ranksPerHost,127.77.0.2:$ranksPerHost --bind-to none \
    --mca plm_rsh_agent "$hosts_sh" --mca plm_rsh_args rsh --mca oob_tcp_if_include eth0 \
    -x BRAID_ROOT=127.77.0.1:$((20000 + RANDOM % 20000)) -x BRAID_SOCKET_IFNAME=eth0 \
    -x BRAID_TIMEOUT=30 "$bin/braid-perf" "${perf_args[@]}" >"$out/mpirun.0" 2>&1
  check_perf mpirun "mpirun.openmpi --host (one daemon per namespace host)"
else
  echo "skip mpirun: no mpirun.openmpi (openmpi-bin)"
fi

# torchrun, one per host (--nnodes 2, its static rendezvous on host 0):
# braid reads RANK/WORLD_SIZE and meets at MASTER_ADDR, one port above
# MASTER_PORT (torchrun's store holds that one).
python=$("$(dirname "$0")/../../scripts/torch-python" 2>/dev/null || true)
if [ -n "$python" ] && "$python" -c 'import torch.distributed.run' >/dev/null 2>&1; then
  port=$((20000 + RANDOM % 20000))
  pids=()
  for ((h = 0; h < hosts; ++h)); do
    ip netns exec "${prefix}h$h" env BRAID_SOCKET_IFNAME=eth0 BRAID_TIMEOUT=30 timeout 120 \
      "$python" -m torch.distributed.run --nnodes $hosts --node_rank $h \
      --nproc_per_node $ranksPerHost --master_addr 127.77.0.1 --master_port $port \
      --no_python "$bin/braid-perf" "${perf_args[@]}" >"$out/torchrun.$h" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  # Rank 0's output is in host 0's agent's.
  check_perf torchrun "torchrun --nnodes 2 ($python -m torch.distributed.run)"
else
  echo "skip torchrun: ${python:-python3} has no torch (scripts/install-deps.sh installs it)"
fi

rm -rf "$out"
[ "$failures" -eq 0 ]
