#!/usr/bin/env bash
# braid and NVIDIA's NCCL side by side on device buffers, one table:
#   benchmarks/gpu_compare.sh [BUILD_DIR]        (default: build)
#
# Both libraries run the same binary, peer-nccl-device (the NCCL API,
# built against the toolkit's nccl.h, timed as braid-perf times): once with
# braid's libnccl.so.2 from BUILD_DIR/lib, once with NVIDIA's, which
# LD_LIBRARY_PATH puts first. Configurations:
#   1 rank                 -g 1                          both libraries
#   N ranks, a GPU each    -g N (N = the GPUs here)      both, where N >= 2
#   2 ranks on one GPU     -g 2 -D 1, one process        braid; NCCL refuses
#                          (its refusal is printed), and braid-perf -G 1 with
#                          a process per rank under braid-run
# Columns: time (us) and busbw (GB/s) of each, and NCCL's time over braid's
# (> 1: braid is faster). Without a GPU, BRAID_DEVICE=emulated runs braid's
# columns on the emulated device ("2 GPUs") and NCCL's say why they cannot.
#
# Environment: SIZES (default "-b 8 -e 256M -f 4"), ITERS ("-n 20 -w 5"),
# COLLS ("allreduce allgather reducescatter broadcast reduce"), TYPE
# (float32 or bfloat16), NCCL_LIB (the directory of NVIDIA's libnccl.so.2;
# default: the one ldconfig knows, or the CUDA toolkit's).
set -uo pipefail
build=${1:-build}
bin=$build/bin
sizes=${SIZES:--b 8 -e 256M -f 4}
iters=${ITERS:--n 20 -w 5}
colls=${COLLS:-allreduce allgather reducescatter broadcast reduce}
type=${TYPE:-float32}
perf=$bin/peer-nccl-device
[ -x "$perf" ] || { echo "gpu_compare: $perf is not built (it needs the CUDA toolkit's nccl.h)" >&2; exit 2; }

nccl_lib=${NCCL_LIB:-}
if [ -z "$nccl_lib" ]; then
  found=$(ldconfig -p 2>/dev/null | awk '$1 == "libnccl.so.2" {print $NF; exit}')
  [ -n "$found" ] && nccl_lib=$(dirname "$(readlink -f "$found")")
fi
[ -z "$nccl_lib" ] && for d in /usr/local/cuda/lib /usr/local/cuda/lib64; do
  [ -e "$d/libnccl.so.2" ] && nccl_lib=$d && break
done
braid_lib=$(readlink -f "$build/lib")
if [ -n "$nccl_lib" ] && [ "$(readlink -f "$nccl_lib")" = "$braid_lib" ]; then nccl_lib=""; fi

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); fi
where="$gpus GPU(s)"
if [ "$gpus" -eq 0 ]; then
  if [ "${BRAID_DEVICE:-}" = emulated ]; then
    gpus=2
    where="no GPU: braid on the emulated device (2 devices)"
  else
    echo "gpu_compare: no GPU here (nvidia-smi lists none); BRAID_DEVICE=emulated runs braid's half" >&2
    exit 2
  fi
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run NAME LIBDIR ARGS...: the rows (size time busbw) of one run into
# $tmp/NAME, or its first error line into $tmp/NAME.why.
run() {
  local name=$1 lib=$2
  shift 2
  if [ -z "$lib" ]; then
    echo "NVIDIA's libnccl.so.2 not found (set NCCL_LIB)" >"$tmp/$name.why"
    : >"$tmp/$name"
    return
  fi
  LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 600 "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  local rc=$?
  awk '!/^#/ && NF >= 8 { print $1, $6, $8, $9 }' "$tmp/$name.out" >"$tmp/$name"
  if [ $rc -ne 0 ] || [ ! -s "$tmp/$name" ]; then
    { grep -v '^#' "$tmp/$name.err"; echo "exit status $rc"; } | head -1 >"$tmp/$name.why"
  fi
}

printf '# gpu_compare: braid (%s) and NVIDIA NCCL (%s) on %s, %s\n' "$braid_lib" \
  "${nccl_lib:-not found}" "$where" "$type"
printf '# %-13s %-22s %11s %9s %8s %9s %8s %7s\n' collective configuration size "nccl us" \
  "GB/s" "braid us" "GB/s" "nccl/braid"
status=0
configs=("1-rank:-g 1")
[ "$gpus" -ge 2 ] && configs+=("$gpus-ranks-a-GPU-each:-g $gpus")
configs+=("2-ranks-one-GPU:-g 2 -D 1" "2-processes-one-GPU:braid-perf")
for coll in $colls; do
  for config in "${configs[@]}"; do
    label=${config%%:*} args=${config#*:}
    if [ "$args" = braid-perf ]; then
      : >"$tmp/nccl"
      echo "one process per rank on one GPU: NCCL refuses it; braid-perf -G 1" >"$tmp/nccl.why"
      # shellcheck disable=SC2086
      run braid "$braid_lib" "$bin/braid-run" -n 2 "$bin/braid-perf" "$coll" -G 1 -d "$type" $sizes $iters
    else
      # shellcheck disable=SC2086
      run nccl "$nccl_lib" "$perf" "$coll" $args -d "$type" $sizes $iters
      # shellcheck disable=SC2086
      run braid "$braid_lib" "$perf" "$coll" $args -d "$type" $sizes $iters
    fi
    [ -s "$tmp/nccl.why" ] && printf '# %-13s %-22s NCCL: %s\n' "$coll" "$label" "$(cat "$tmp/nccl.why")"
    [ -s "$tmp/braid.why" ] && { printf '# %-13s %-22s braid: %s\n' "$coll" "$label" "$(cat "$tmp/braid.why")"; status=1; }
    # Any wrong element is a failure of that library's run.
    awk '$4 != 0 { bad = 1 } END { exit !bad }' "$tmp/braid" && status=1
    awk -v coll="$coll" -v label="$label" '
      FILENAME == ARGV[1] { t[$1] = $2; b[$1] = $3; next }
      { nt = ($1 in t) ? t[$1] : "-"; nb = ($1 in b) ? b[$1] : "-"
        ratio = (nt == "-" || $2 == 0) ? "-" : sprintf("%.2f", nt / $2)
        printf "  %-13s %-22s %11s %9s %8s %9s %8s %7s\n", coll, label, $1, nt, nb, $2, $3, ratio }
    ' "$tmp/nccl" "$tmp/braid"
    rm -f "$tmp"/*.why
  done
done
exit $status
