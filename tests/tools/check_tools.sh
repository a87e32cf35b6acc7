#!/usr/bin/env bash
# The command-line tools as a user runs them: braid-perf for every collective
# under braid-run (exits non-zero on any wrong element), braid-run's failure
# propagation, and braid-info.
set -uo pipefail
bin=$1
failures=0
passes=0
check() {  # check NAME EXPECTED-STATUS COMMAND...
  local name=$1 want=$2
  shift 2
  local out
  out=$(timeout 120 "$@" 2>&1)
  local got=$?
  if [ "$got" -ne "$want" ]; then
    echo "FAIL $name: exit $got, expected $want"
    echo "$out" | tail -20
    failures=$((failures + 1))
  else
    echo "ok   $name"
    passes=$((passes + 1))
  fi
}

for c in allreduce allgather reducescatter broadcast reduce sendrecv; do
  check "braid-perf $c at 3 ranks" 0 "$bin/braid-run" -n 3 "$bin/braid-perf" "$c" -b 8 -e 4M -f 8 -n 3 -w 1 -c 1
done
check "braid-perf bfloat16 max at 5 ranks" 0 \
  "$bin/braid-run" -n 5 "$bin/braid-perf" allreduce -b 1K -e 1M -f 32 -d bfloat16 -o max -n 2 -w 1
check "braid-run returns the failing rank's status" 3 \
  "$bin/braid-run" -n 3 sh -c 'if [ "$BRAID_RANK" = 1 ]; then exit 3; fi; exec sleep 30'
check "braid-run reports a rank killed by a signal" 137 \
  "$bin/braid-run" -n 2 sh -c 'if [ "$BRAID_RANK" = 0 ]; then kill -9 $$; fi; exec sleep 30'
check "braid-run rejects a missing -n" 2 "$bin/braid-run" true
check "braid-perf -a runs every collective at 4 ranks" 0 "$bin/braid-run" -n 4 "$bin/braid-perf" -a -b 8 -e 256K -f 64 -n 2 -w 1
check "braid-perf rejects an unknown collective" 2 "$bin/braid-perf" alltoallv
check "braid-perf -R 1 (memAlloc buffers) at 3 ranks" 0 \
  "$bin/braid-run" -n 3 "$bin/braid-perf" allgather -b 1K -e 4M -f 16 -n 2 -w 1 -R 1
# -G 1: device buffers (the emulated device) and a device stream; 8 B to 256 KiB
# is 6 rows, each with #wrong 0 in place and out of place.
check "braid-perf -G 1 on the emulated device at 2 ranks: 6 rows, 0 wrong" 0 bash -c \
  "set -o pipefail; BRAID_DEVICE=emulated '$bin/braid-run' -n 2 '$bin/braid-perf' allreduce -G 1 \
   -b 8 -e 1M -f 8 -n 5 -w 2 | awk '!/^#/ { rows++; if (\$9 != 0 || \$13 != 0) bad++ }
   END { exit !(rows == 6 && bad == 0) }'"
check "braid-perf -G 1 -a over tcp (device buffers staged through host memory) at 3 ranks: 0 wrong" 0 bash -c \
  "set -o pipefail; BRAID_DEVICE=emulated BRAID_TRANSPORT=tcp '$bin/braid-run' -n 3 '$bin/braid-perf' -a \
   -G 1 -b 8 -e 4M -f 64 -n 3 -w 1 | grep -q 'Out of bounds values : 0 OK'"
check "braid-info --peers names the staged path over tcp" 0 sh -c \
  "BRAID_DEVICE=emulated BRAID_TRANSPORT=tcp '$bin/braid-run' -n 2 '$bin/braid-info' --peers |
   grep -q '0 -> 1  tcp: staged through host memory'"
# gpu_compare.sh without a GPU: braid's columns on the emulated device, a row
# per size and configuration, NCCL's marked as unable to run.
check "gpu_compare.sh on the emulated device: braid's rows for every configuration" 0 bash -c \
  "set -o pipefail; BRAID_DEVICE=emulated SIZES='-b 8 -e 64K -f 64' ITERS='-n 2 -w 1' \
   COLLS='allreduce reducescatter' '$(dirname "$0")/../../benchmarks/gpu_compare.sh' '$bin/..' |
   awk '!/^#/ && \$4 == \"-\" && \$6 > 0 { rows++ } END { exit !(rows == 2 * 4 * 3) }'"
check "braid-perf -G 1 with no device exits 2" 2 \
  env BRAID_DEVICE=none "$bin/braid-run" -n 2 "$bin/braid-perf" allreduce -G 1 -b 8 -e 8
# -R 2: the same in registered windows (one-shot, then two-shot past 256 KiB);
# -g 3: three ranks in one process on three emulated devices.
check "braid-perf -G 1 -R 2 (windows) at 3 ranks: 6 rows, 0 wrong" 0 bash -c \
  "set -o pipefail; BRAID_DEVICE=emulated '$bin/braid-run' -n 3 '$bin/braid-perf' allreduce -G 1 \
   -R 2 -b 8 -e 1M -f 8 -n 5 -w 2 | awk '!/^#/ { rows++; if (\$9 != 0 || \$13 != 0) bad++ }
   END { exit !(rows == 6 && bad == 0) }'"
check "braid-perf -g 3 -G 1 (one process, three devices) -a: 0 wrong" 0 bash -c \
  "set -o pipefail; BRAID_DEVICE=emulated '$bin/braid-perf' -a -g 3 -G 1 -b 8 -e 64K -f 64 \
   -n 3 -w 1 | grep -q 'Out of bounds values : 0 OK'"
check "braid-perf -G 1 -C 3 (calls replayed from graphs) at 3 ranks: 6 rows, 0 wrong" 0 bash -c \
  "set -o pipefail; BRAID_DEVICE=emulated '$bin/braid-run' -n 3 '$bin/braid-perf' allreduce -G 1 \
   -C 3 -b 8 -e 1M -f 8 -n 5 -w 2 | awk '!/^#/ { rows++; if (\$9 != 0 || \$13 != 0) bad++ }
   END { exit !(rows == 6 && bad == 0) }'"
check "braid-perf -O 4 (rank r's buffers 4r bytes past a page) -a at 3 ranks, checked" 0 \
  "$bin/braid-run" -n 3 "$bin/braid-perf" -a -b 1K -e 4M -f 64 -n 2 -w 1 -O 4
check "braid-perf -O 4096 exits 2" 2 "$bin/braid-perf" allreduce -O 4096
check "braid-perf -O with -G 1 exits 2" 2 "$bin/braid-perf" allreduce -G 1 -O 4
check "braid-perf -C without -G 1 exits 2" 2 "$bin/braid-perf" allreduce -C 3
check "braid-perf -R 2 without -G 1 exits 2" 2 "$bin/braid-perf" allreduce -R 2
check "braid-perf -g 2 under braid-run exits 2" 2 \
  "$bin/braid-run" -n 2 "$bin/braid-perf" allreduce -g 2 -b 8 -e 8
for c in allreduce broadcast reduce allgather reducescatter; do
  check "braid-sim $c at 100 ranks, every algorithm, checked" 0 \
    "$bin/braid-sim" "$c" --ranks 100 -b 8 -e 1M -f 64 --check
done
check "braid-sim 1024 ranks, ring and tree" 0 "$bin/braid-sim" allreduce --ranks 1024 --algo ring,tree -e 64M
check "braid-sim rejects an algorithm the collective lacks" 2 "$bin/braid-sim" broadcast --ranks 4 --algo ring
check "braid-sim rejects a bad rate" 2 "$bin/braid-sim" allreduce --ranks 4 --bw fast
check "braid-info --tuning at 1024 ranks over tcp" 0 "$bin/braid-info" --tuning --ranks 1024 --transport tcp
check "braid-info --tuning follows BRAID_ALGO" 0 sh -c \
  "BRAID_ALGO=allreduce:tree '$bin/braid-info' --tuning --ranks 8 | grep -q '^allreduce  *1073741824  tree'"
check "braid-info --tuning rejects a bad rank count" 2 "$bin/braid-info" --tuning --ranks 0
check "braid-info --tuning --measure prints the model 3 ranks measured at creation" 0 sh -c \
  "'$bin/braid-run' -n 3 '$bin/braid-info' --tuning --measure | grep -q '^braid-info --tuning: 3 ranks, costs measured at creation'"
check "braid-info --tuning --measure under BRAID_TUNING=fixed says why it cannot" 0 sh -c \
  "BRAID_TUNING=fixed '$bin/braid-run' -n 2 '$bin/braid-info' --tuning --measure 2>&1 | grep -q 'BRAID_TUNING is fixed'"
check "braid-info --config" 0 "$bin/braid-info" --config
check "braid-info --peers at 3 ranks" 0 "$bin/braid-run" -n 3 "$bin/braid-info" --peers

echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]
