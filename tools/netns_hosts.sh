#!/usr/bin/env bash
# Namespace hosts from the shell: network namespaces that braid tells apart
# as hosts, joined through a bridge namespace, host h at 127.77.0.(h+1) on
# its eth0 (loopback-range addresses; route_localnet lets them leave the
# namespace). The same layout as tests/netns_hosts.h. Needs root.
#
#   netns_hosts.sh up PREFIX HOSTS        make PREFIXbr and PREFIXh0 .. PREFIXh(HOSTS-1)
#   netns_hosts.sh down PREFIX HOSTS      remove them (no error if absent)
#   netns_hosts.sh run PREFIX PER_HOST NRANKS PROGRAM ARGS...
#       starts NRANKS ranks of PROGRAM as a launcher on each host would,
#       rank r on host r / PER_HOST with BRAID_ROOT (rank 0's host),
#       BRAID_SOCKET_IFNAME=eth0 and its rank and the world size as braid-run
#       names them (BRAID_RANK, BRAID_WORLD_SIZE), or with NETNS_LAUNCHER=slurm
#       as srun does (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID); rank 0's
#       output goes to stdout, rank r's to $NETNS_LOGS/rank.r when NETNS_LOGS
#       is set (else nowhere). Exits non-zero if any rank did.
#   netns_hosts.sh rsh HOST_ADDRESS COMMAND...
#       runs the shell COMMAND in the namespace host of that address, under
#       that namespace's name as hostname: an rsh agent for mpirun (--mca
#       plm_rsh_agent), with NETNS_PREFIX set.
set -uo pipefail

address() { echo "127.77.0.$(($1 + 1))"; }

up() {
  local prefix=$1 hosts=$2 h ns
  ip netns add "${prefix}br" &&
    ip netns exec "${prefix}br" ip link add br0 type bridge &&
    ip netns exec "${prefix}br" ip link set br0 up || return 1
  for ((h = 0; h < hosts; ++h)); do
    ns="${prefix}h$h"
    ip netns add "$ns" &&
      ip link add eth0 netns "$ns" type veth peer name "p$h" netns "${prefix}br" &&
      ip netns exec "${prefix}br" ip link set "p$h" master br0 &&
      ip netns exec "${prefix}br" ip link set "p$h" up &&
      ip netns exec "$ns" ip link set lo up &&
      ip netns exec "$ns" sysctl -qw net.ipv4.conf.all.route_localnet=1 &&
      ip netns exec "$ns" sysctl -qw net.ipv4.conf.eth0.route_localnet=1 &&
      ip netns exec "$ns" ip addr add "$(address "$h")/24" dev eth0 &&
      ip netns exec "$ns" ip link set eth0 up || return 1
  done
}

down() {
  local prefix=$1 hosts=$2 h
  for ((h = 0; h < hosts; ++h)); do ip netns del "${prefix}h$h" 2>/dev/null; done
  ip netns del "${prefix}br" 2>/dev/null
  return 0
}

run() {
  local prefix=$1 per=$2 nranks=$3
  shift 3
  local port=$((20000 + RANDOM % 20000)) pids=() r log status=0
  for ((r = 0; r < nranks; ++r)); do
    log=/dev/null
    [ -n "${NETNS_LOGS:-}" ] && log="$NETNS_LOGS/rank.$r"
    local env=(env BRAID_ROOT="$(address 0):$port" BRAID_SOCKET_IFNAME=eth0)
    case "${NETNS_LAUNCHER:-braid}" in
      braid) env+=(BRAID_RANK=$r BRAID_WORLD_SIZE="$nranks") ;;
      slurm) env+=(SLURM_PROCID=$r SLURM_NTASKS="$nranks" SLURM_LOCALID=$((r % per))) ;;
      *)
        echo "netns_hosts.sh: NETNS_LAUNCHER is braid or slurm, not '$NETNS_LAUNCHER'" >&2
        return 2
        ;;
    esac
    if [ "$r" -eq 0 ]; then
      ip netns exec "${prefix}h$((r / per))" "${env[@]}" "$@" &
    else
      ip netns exec "${prefix}h$((r / per))" "${env[@]}" "$@" >"$log" 2>&1 &
    fi
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || status=1; done
  return $status
}

rsh() {
  local host=$1
  shift
  local h=$((${host##*.} - 1))
  local ns="${NETNS_PREFIX:?NETNS_PREFIX names the namespace hosts}h$h"
  # Its own hostname too (a UTS namespace): programs that name shared
  # memory after the hostname (Open MPI's vader) must not meet the other
  # hosts' segments.
  exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns && $*"
}

case "${1:-}" in
  up | down) [ $# -eq 3 ] || exit 2; "$@" ;;
  run) [ $# -ge 5 ] || exit 2; "$@" ;;
  rsh) [ $# -ge 3 ] || exit 2; "$@" ;;
  *)
    sed -n '2,/^set -uo/p' "$0" | sed -e '/^set -uo/d' -e 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
