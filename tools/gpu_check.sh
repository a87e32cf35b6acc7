#!/usr/bin/env bash
# tools/gpu_check.sh: the one script for a machine with a GPU (written for an
# H200, sm_90, 16 cores, CUDA 13), and its rehearsal on any machine:
#
#   tools/gpu_check.sh                                the GPU run, in build-gpu/
#   tools/gpu_check.sh --rehearse [--build-dir DIR]   the same steps here, on the
#                                                     emulated device (DIR: build)
#
# A GPU may come once, for one command of at most 10 minutes, so every step
# counts: each runs under its own time limit (timeout -k), a failed step
# never stops the ones after it, and all of them stay inside one deadline
# (GPU_CHECK_BUDGET seconds, default 540 on the GPU, 110 in rehearsal): a
# step's limit is the smaller of its own and what is left less a reserve for
# the summary and the archive (GPU_CHECK_RESERVE, default 10), and a step
# with under 5 s left is skipped, "out of time".
#
# What comes back, under $OUT (where the machine sets it; else
# BUILD/gpu-check): at most these four files.
#   summary.txt           one line per step, written as the step ends (so a
#                         run cut short still has it): name, pass / fail /
#                         skip, seconds, the step's key figure or the reason
#                         (for a failure, the first line of its log naming
#                         an error); then the result
#   targets.txt           the table of measures against the targets
#   gpu_check.log         what the script printed (each step's command and
#                         line, the last lines of a failed step's log)
#   gpu-check-logs.tar.gz every step's whole log (and braid-perf's JSON, the
#                         kernel CSV), refreshed after each step; a log over
#                         1 MiB keeps its head and tail, so the archive
#                         stays under 16 MiB
# The logs themselves are in BUILD/gpu-check-logs.
#
# The steps, and what each should take on the GPU machine (16 cores):
#   nvidia-smi, nvcc, torch   host facts: the GPU and driver, the toolkit,
#                         torch and the CUDA it sees                     ~5 s
#   cuda-probe            tools/cuda_probe.py: the driver through ctypes,
#                         before any build: version, devices, the
#                         attributes braid relies on; the first failing
#                         call named                                     ~1 s
#   configure             build-gpu/ afresh: Release, BRAID_CUDA=ON, tests
#                         and benchmarks (Ninja where present): CUDA's
#                         compiler checks and torch's CMake package     ~20 s
#   build                 only what runs, with every core, -k 0 (a target
#                         that fails does not stop the others): ~550
#                         CPU-seconds, of which the longest chain is the
#                         CUDA kernels' file (~80 s) then the links;
#                         braid_torch's two big files (~60 s each) build
#                         beside it                                     ~120 s
#   braid-info            braid-info --device: each device-seam call
#                         once, the first that fails named               ~2 s
#   cuda-device_test ...  the CUDA instances (--gtest_filter='*/cuda') of
#                         device_test, device_one_process_test,
#                         device_windows_test, device_nccl_test and
#                         device_graphs_test, which must run (one that
#                         skips fails); they put 1 to 5 ranks, several per
#                         process, on the one GPU; the fault tests wait out
#                         their deadlines (~25 s of device_test's time)  ~75 s
#   nccl-device-program   a program built against NCCL's own nccl.h, 4
#                         ranks on the GPU                               ~3 s
#   perf-*, windows-*     braid-perf all-reduce on device buffers (-G 1),
#                         bfloat16 at 2 and 4 ranks and float at 2, 8 B to
#                         256 MiB (every #wrong must be 0), 256 MiB alone;
#                         the same in registered windows (-R 2: one-shot
#                         up to 256 KiB, two-shot above); 13 runs, each
#                         ~1 s of contexts and ~1 s of sizes            ~30 s
#   one-process-*         256 MiB, one process driving 2 ranks (-g 2), on
#                         FIFOs and in windows                           ~5 s
#   graph-*               8 B calls replayed from CUDA graphs (-C)       ~4 s
#   fifo-*-256K,          one-shot against the slot FIFOs at 256 KiB, 2
#   windows-*-256K        and 4 ranks                                    ~8 s
#   tcp-staged            device buffers staged through host memory over
#                         tcp, 8 B to 64 MiB at 2 ranks (~3 GB/s)       ~10 s
#   ibverbs-fake          the same over the ibverbs engine on the fake
#                         fabric (the GPU's dma-buf export runs)        ~10 s
#   kernels               braid-bench-device-kernels at 1 GiB: copy and
#                         2-input sum reduce (float32, bfloat16, float16) ~5 s
#   torch-build           braid_torch_ext (built with the rest: up to date) ~1 s
#   torch-cuda            integrations/torch/tests/test_cuda.py 2: braid's
#                         torch backend on CUDA tensors, 2 ranks        ~20 s
#   torch-nccl            tools/torch_nccl_check.py: PyTorch's own NCCL
#                         backend on braid's libnccl.so.2 (LD_PRELOAD), 2
#                         processes on cuda:0: all_reduce exact, a DDP
#                         step, the library mapped                      ~15 s
#   gpu-compare           benchmarks/gpu_compare.sh: braid and NVIDIA's
#                         NCCL on one NCCL-API program, 5 collectives x
#                         4 configurations, 8 B to 128 MiB (35 runs)    ~60 s
#   nccl-tests-build,     NVIDIA's nccl-tests built against braid's
#   nccl-tests-allreduce  nccl.h and libnccl.so.2 (sm_90 only), where its
#                         sources lie beside the tree; all_reduce_perf 8 B
#                         to 128 MiB, 1 rank, #wrong 0                  ~40 s
# In all ~440 s, under 8 minutes; the steps run in this order, most
# telling first, so a short run loses the least.
#
# The targets (targets.txt): 8 B all-reduce at 2 ranks <= 15 us (<= 10 us
# in windows), <= 4 us a call replayed from a CUDA graph (FIFOs and
# windows); 256 MiB bfloat16 busbw at 2 ranks >= 0.6 * copy_bw * (n-1)/n^2,
# slot FIFOs, two-shot and one process alike; one-shot faster than the
# slot-FIFO algorithms at 256 KiB at 2 and 4 ranks; the reduce kernels'
# bandwidth >= 0.9 of the copy kernel's. copy_bw is the copy kernel's bytes
# read + written per second (2 x size per copy); a reduce counts 3 x size.
#
# The rehearsal runs every step here, so that the script itself (paths, flags,
# how it reads results, the summary, the archive) is tested before any GPU:
# BRAID_DEVICE=emulated for cuda, the '*/emulated' instances of the device
# suites (a third of them, less their slowest: CI's ctest has just run them
# all), 1 MiB for 256 MiB and fewer iterations; tools/torch_nccl_check.py on
# gloo and the CPU, braid's libnccl.so.2 preloaded, for PyTorch's NCCL
# backend; a stub driver for the probe's failure path. It takes the build
# directory as CI left it (configure and build then find nothing to do) and
# under 2 minutes. What needs a real GPU (nvidia-smi, the probe, torch on
# CUDA, nccl-tests' run) skips, saying why; any other step that skips fails
# the rehearsal. Targets are not judged.
#
# Exit status: 0 when every step passed or skipped for a stated reason and
# every target was met; 3 when targets were missed (or not measured); 1 when
# a step failed; 2 on a bad command line.

# (The judges and the signal handler are called indirectly.)
# shellcheck disable=SC2317
set -uo pipefail

usage() {
  echo "usage: tools/gpu_check.sh                                 (on a machine with a GPU)"
  echo "       tools/gpu_check.sh --rehearse [--build-dir DIR]    (the same steps, emulated)"
}

mode=gpu
build=""
while [ $# -gt 0 ]; do
  case $1 in
    --rehearse) mode=rehearse ;;
    --build-dir)
      [ $# -ge 2 ] || { usage >&2; exit 2; }
      build=$2
      shift
      ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
  shift
done
if [ "$mode" = gpu ] && [ -n "$build" ]; then
  echo "gpu_check: --build-dir goes with --rehearse (the GPU run builds build-gpu/ afresh)" >&2
  exit 2
fi
cd "$(dirname "$0")/.." || exit 2

# ---- What differs between the GPU run and its rehearsal.
if [ "$mode" = gpu ]; then
  build="build-gpu"
  device=cuda
  budget=${GPU_CHECK_BUDGET:-540}
  suite_filter='*/cuda'
  suite_shard=()                   # every test
  big=256M bigBytes=268435456      # the size of the bandwidth runs
  sweep=(-b 8 -e 256M -f 4)        # braid-perf's sweeps (-f 4 from 8 B stops at 128 MiB)
  windows_sweep=(-b 8 -e 128M -f 4)
  big_iters=(-n 40 -w 10)
  sweep_iters=()                   # braid-perf's default: -n 20 -w 5
  test_deadline=45                 # s: a device test's ranks that still run hung
  graph_iters=(-n 100 -w 10 -C 20)
  small_iters=(-n 200 -w 20)
  staged_sweep=(-b 8 -e 64M -f 8)
  compare_env=(SIZES="-b 8 -e 128M -f 64" ITERS="-n 20 -w 5" TYPE=bfloat16)
  kernel_size=1G kernel_name=1GiB kernel_time=0.5 kernel_label="1 GiB"
else
  build=${build:-build}
  device=emulated
  budget=${GPU_CHECK_BUDGET:-110}
  # CI's ctest has just run every emulated instance; these take 2 to 25 s
  # each here and add nothing to a rehearsal of this script.
  suite_filter='*/emulated:-*AMissingRankMakesTheOthersTimeOut*:*EveryCollectiveTypeAndOpMatches*'
  suite_filter+=':*LargeBuffersMatchTheReference*:*EveryCollectiveMatchesTheReferenceAt1And2And5*'
  suite_filter+=':*AFailureOnTheDevicePathReachesPeers*'
  # And a third of the rest (gtest's sharding): enough to rehearse the step.
  suite_shard=(GTEST_TOTAL_SHARDS=3 GTEST_SHARD_INDEX=0)
  big=1M bigBytes=1048576
  sweep=(-b 8 -e 1M -f 4)
  windows_sweep=(-b 8 -e 512K -f 4)
  big_iters=(-n 5 -w 1)
  sweep_iters=(-n 5 -w 1)
  graph_iters=(-n 10 -w 2 -C 2)
  small_iters=(-n 20 -w 2)
  staged_sweep=(-b 8 -e 1M -f 8)
  compare_env=(SIZES="-b 8 -e 1M -f 64" ITERS="-n 5 -w 1" TYPE=bfloat16)
  test_deadline=120
  kernel_size=1M kernel_name=1MiB kernel_time=0.05 kernel_label="1 MiB"
fi
bin=$build/bin
reserve=${GPU_CHECK_RESERVE:-10}
min_step=5
log_cap=$((1024 * 1024))          # a log's bytes in the archive, head + tail
archive_max=$((15 * 1024 * 1024))
start_time=$SECONDS
deadline=$((start_time + budget))

if [ "$mode" = gpu ]; then rm -rf "$build"; fi
out=${OUT:-$build/gpu-check}
work=$build/gpu-check-logs        # the steps' logs
stage=$build/gpu-check-archive/gpu-check-logs  # what the archive holds
if [ -z "${OUT:-}" ]; then rm -rf "$out"; fi
rm -rf "$work" "${stage%/*}"
mkdir -p "$out" "$work" "$stage" || exit 2
rm -f "$out/summary.txt" "$out/targets.txt" "$out/gpu-check-logs.tar.gz"
summary=$out/summary.txt
archive=$out/gpu-check-logs.tar.gz

passed=0 failed=0 skipped=0
step_verdict="" step_figure="" step_pid="" step_name="" braid_lib=""

# ---- Recording.

# record NAME VERDICT SECONDS FIGURE: one line of summary.txt, now.
record() {
  local line
  line=$(printf '%-34s %-4s %4s s  %s' "$1" "$2" "$3" "$4")
  echo "$line" >> "$summary"
  echo "$line"
  case $2 in
    pass) passed=$((passed + 1)) ;;
    fail) failed=$((failed + 1)) ;;
    skip) skipped=$((skipped + 1)) ;;
  esac
}

# stage_file FILE: FILE's copy in the archive's folder, its head and tail
# where it is over log_cap.
stage_file() {
  local file=$1 staged=$stage/${1##*/} size
  size=$(stat -c %s "$file")
  if [ "$size" -gt "$log_cap" ]; then
    {
      head -c $((log_cap / 2)) "$file"
      printf '\n[... gpu_check: %d bytes of %d cut here ...]\n' $((size - log_cap)) "$size"
      tail -c $((log_cap / 2)) "$file"
    } > "$staged"
  else
    cp "$file" "$staged"
  fi
}

# refresh_archive: gpu-check-logs.tar.gz again, with every log as it is now
# (replaced in one rename, so there is always a whole one).
refresh_archive() {
  local file staged
  for file in "$work"/*; do
    [ -f "$file" ] || continue
    staged=$stage/${file##*/}
    if [ ! -e "$staged" ] || [ "$file" -nt "$staged" ]; then stage_file "$file"; fi
  done
  tar -czf "$archive.part" -C "${stage%/*}" "${stage##*/}" && mv -f "$archive.part" "$archive"
  [ -e "$archive" ] || return 0
  if [ "$(stat -c %s "$archive")" -gt "$archive_max" ] && [ "$log_cap" -gt 65536 ]; then
    log_cap=$((log_cap / 4))  # (never on a sane run: 1 MiB x every log, compressed)
    rm -f "$stage"/*
    refresh_archive
  fi
}

# error_line LOG: the first line of LOG that names an error: braid's CUDA
# device's first, then Python's exception (the last line of a traceback),
# then the compiler's or a test's, then any; else the log's first line.
error_line() {
  local line pattern
  line=$(grep -m1 'braid: cuda device:' "$1" 2>/dev/null)
  [ -n "$line" ] ||
    line=$(grep -E '^[A-Za-z_.]*(Error|Exception|Interrupt): ' "$1" 2>/dev/null | tail -1)
  for pattern in 'error:|Error:|ERROR|FAILED|fatal' \
    '[Ee]rror|unknown option|not found|No such file|cannot|Segmentation fault|Aborted|Killed' \
    'undefined symbol'; do
    [ -n "$line" ] && break
    line=$(grep -m1 -E "$pattern" "$1" 2>/dev/null)
  done
  [ -n "$line" ] || line=$(grep -m1 -v '^[[:space:]]*$' "$1" 2>/dev/null)
  echo "${line:-no output}" | cut -c1-240
}

# skip_reason LOG: the line where a program said why it skipped.
skip_reason() {
  local line
  line=$(grep -m1 -iE '^(skip|skipped)\b' "$1")
  [ -n "$line" ] || line=$(grep -v '^[[:space:]]*$' "$1" | tail -1)
  echo "${line:-no reason printed}" | cut -c1-240
}

# ---- Judges: judge_X NAME STATUS LOG sets step_verdict and step_figure.

# A program's own exit status: 0 passes (its last line is the figure), 77
# skips (with the reason it printed), anything else fails.
judge_status() {
  local status=$2 log=$3
  case $status in
    0) step_verdict=pass step_figure=$(grep -v '^[[:space:]]*$' "$log" | tail -1 | cut -c1-240) ;;
    77) step_verdict=skip step_figure=$(skip_reason "$log") ;;
    *) step_verdict=fail step_figure="$(error_line "$log") (exit $status)" ;;
  esac
}

# nvidia-smi's CSV: how many GPUs, and the first.
judge_smi() {
  judge_status "$@"
  [ "$step_verdict" = pass ] &&
    step_figure="$(grep -c . "$3") GPU(s): $(head -1 "$3" | cut -c1-200)"
}

judge_nvcc() {
  judge_status "$@"
  [ "$step_verdict" = pass ] && step_figure=$(grep -m1 -o 'release .*' "$3")
}

# A GoogleTest suite: how many passed. A test that skipped because it found
# no device fails it, and so does a filter that matched nothing; a test
# that skips for a reason of its own (one the emulated device alone can
# pose) is counted.
judge_gtest() {
  local status=$2 log=$3 count skipped noDevice first
  count=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\?\..*/\1/p' "$log" | tail -1)
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\?, listed below.*/\1/p' "$log" | tail -1)
  skipped=${skipped:-0}
  noDevice=$(grep -m1 -o 'no [a-z]* device here: .*' "$log")
  if [ "$status" -ne 0 ]; then
    first=$(grep -m1 '^\[  FAILED  \] [A-Za-z]' "$log" | sed 's/^\[  FAILED  \] //; s/ (.*//')
    step_verdict=fail
    step_figure="${count:-0} passed; failed: ${first:-$(error_line "$log")} (exit $status)"
  elif [ -n "$noDevice" ]; then
    step_verdict=fail step_figure="$skipped skipped (a device instance must run): $noDevice"
  elif [ -z "$count" ] || [ "$count" -eq 0 ]; then
    step_verdict=fail step_figure="no test ran: did the filter match nothing?"
  else
    step_verdict=pass step_figure="$count passed"
    [ "$skipped" -eq 0 ] || step_figure+=", $skipped skipped for reasons of their own"
  fi
}

# human SIZE_IN_BYTES: 8 B, 256 KiB, 1 MiB.
human() {
  awk -v b="$1" 'BEGIN { split("B KiB MiB GiB", u); i = 1
    while (b >= 1024 && b % 1024 == 0 && i < 4) { b /= 1024; i++ }
    printf "%d %s", b, u[i] }'
}

# braid-perf and nccl-tests tables: every #wrong 0 and "Out of bounds
# values : 0 OK"; the figure is the first size's time and the last's busbw.
judge_perf() {
  local status=$2 log=$3 rows
  rows=$(awk '!/^#/ && $1 ~ /^[0-9]+$/ && NF >= 13 {
      n++; wrong += $9 + $13; if (n == 1) { first = $1; time = $6 } last = $1; busbw = $8 }
    END { if (n) printf "%d %s %s %s %s %d", n, first, time, last, busbw, wrong }' "$log")
  if [ "$status" -ne 0 ]; then
    step_verdict=fail step_figure="$(error_line "$log") (exit $status)"
  elif [ -z "$rows" ]; then
    step_verdict=fail step_figure="no result rows: $(error_line "$log")"
  else
    local n first time last busbw wrong
    read -r n first time last busbw wrong <<< "$rows"
    step_figure="$(human "$first") $time us"
    [ "$n" -gt 1 ] && step_figure+="; $(human "$last") $busbw GB/s"
    [ "$n" -eq 1 ] && step_figure+=", $busbw GB/s"
    if [ "$wrong" -ne 0 ] || ! grep -q 'Out of bounds values : 0 OK' "$log"; then
      step_verdict=fail step_figure="wrong results ($wrong wrong elements); $step_figure"
    else
      step_verdict=pass
    fi
  fi
}

# nccl-tests' all_reduce_perf: the same, and which library it ran on
# (it links with -L CUDA's lib64 first, so LD_LIBRARY_PATH must put
# braid's libnccl.so.2 in front).
judge_nccl_tests() {
  judge_perf "$@"
  local versions loaded
  versions=$(grep -m1 -o 'nccl-headers=[0-9]* nccl-library=[0-9]*' "$3")
  [ -n "$versions" ] && step_figure+="; $versions"
  loaded=$(LD_LIBRARY_PATH="$braid_lib" ldd "$build/nccl-tests/all_reduce_perf" |
    awk '$1 == "libnccl.so.2" { print $3 }')
  if [ "$(dirname "$(readlink -f "$loaded")")" != "$braid_lib" ]; then
    step_verdict=fail
    step_figure="it loads libnccl.so.2 from '$loaded', not $braid_lib; $step_figure"
  fi
}

# The same, plus where the ibverbs engine put the device buffers.
judge_ibverbs() {
  judge_perf "$@"
  local path
  path=$(grep -m1 -o 'device buffers go [^:(]*' "$3")
  [ -n "$path" ] && step_figure+="; ${path% }"
}

# gpu_compare.sh: its exit status is braid's; the figure counts the rows.
judge_compare() {
  local status=$2 log=$3 rows ncclRows why
  rows=$(grep -c '^  [a-z]' "$log")
  ncclRows=$(awk '/^  [a-z]/ && $4 != "-"' "$log" | wc -l)
  if [ "$status" -ne 0 ]; then
    why=$(grep -m1 ' braid: ' "$log" | sed 's/^# *//')
    step_verdict=fail step_figure="${why:-$(error_line "$log")} (exit $status)"
  else
    step_verdict=pass
    step_figure="$rows rows, NVIDIA's NCCL ran in $ncclRows"
    [ "$ncclRows" -eq 0 ] && step_figure+=" ($(grep -m1 -o 'NCCL: .*' "$log" | cut -c1-120))"
  fi
}

# The kernel benchmark's CSV: no benchmark in error; the bandwidths.
judge_kernels() {
  local status=$2 log=$3 csv=$work/kernels.csv
  if [ "$status" -ne 0 ] || [ ! -s "$csv" ]; then
    step_verdict=fail step_figure="$(error_line "$log") (exit $status)"
  elif grep -q ',true,' "$csv"; then
    step_verdict=fail
    step_figure="a benchmark could not run: $(grep -m1 ',true,' "$csv" | cut -c1-200)"
  else
    step_verdict=pass
    step_figure="copy $(kernel copy) GB/s; sum reduce float32 $(kernel reduce2/float32/sum)"
    step_figure+=", bfloat16 $(kernel reduce2/bfloat16/sum), float16 $(kernel reduce2/float16/sum)"
  fi
}

# A build: the figure says how many targets; a failure names the first
# compiler error.
judge_build() {
  local name=$1 status=$2 log=$3
  if [ "$status" -eq 0 ] && [ "$name" != build ]; then
    step_verdict=pass step_figure="built"
  elif [ "$status" -eq 0 ]; then
    step_verdict=pass step_figure="${#build_targets[@]} targets up to date"
    [ -n "$not_configured" ] && step_figure+="; not configured: $not_configured"
  else
    step_verdict=fail step_figure="$(error_line "$log") (exit $status)"
  fi
}

judge_configure() {
  local status=$2 log=$3
  if [ "$status" -ne 0 ]; then
    step_verdict=fail step_figure="$(error_line "$log") (exit $status)"
    return
  fi
  step_verdict=pass
  step_figure="$(grep -m1 -o 'CMAKE_BUILD_TYPE[^ ]*' "$build/CMakeCache.txt" | cut -d= -f2)"
  step_figure+="; cuda: $(grep -m1 'braid: BRAID_CUDA=' "$log" | sed 's/.*: //')"
  step_figure+="; $(grep -m1 -o 'braid_torch: .*' "$log" || echo 'braid_torch: not configured')"
}

# The probe against the toolkit's stub driver must fail at its first call,
# naming it and the error.
judge_probe_stub() {
  local status=$2 log=$3
  if [ "$status" -eq 1 ] && grep -q '^error: cu[A-Za-z_0-9]* failed: CUDA_ERROR_' "$log"; then
    step_verdict=pass step_figure="twin: the stub's first call named: $(grep -m1 '^error:' "$log")"
  else
    step_verdict=fail
    step_figure="the stub driver did not fail as expected: $(error_line "$log") (exit $status)"
  fi
}

# The gloo twin of torch-nccl: its result and the symbol comparison.
judge_torch_twin() {
  judge_status "$@"
  local symbols
  symbols=$(grep -m1 '^symbols: ' "$3" | sed 's/^symbols: //')
  step_figure="twin (gloo, cpu): $step_figure${symbols:+; $symbols}"
}

# ---- Running a step.

# step [--skip-ok] [--needs FILE]... [--judge FN] NAME LIMIT COMMAND...:
# runs COMMAND under min(LIMIT, what the deadline leaves), its output in
# $work/NAME.log, and records its line. --skip-ok: its skipping is no
# failure of a rehearsal (a GPU-only step, or one that needs what a
# machine may lack). --needs: files the command needs (a step whose
# program was not built skips, naming it, in a rehearsal too: either its
# target was not configured here, or the build step failed).
step() {
  local skip_ok=0 judge=judge_status needs=()
  while [ $# -gt 0 ]; do
    case $1 in
      --skip-ok) skip_ok=1 ;;
      --needs) needs+=("$2"); shift ;;
      --judge) judge=$2; shift ;;
      *) break ;;
    esac
    shift
  done
  local name=$1 limit=$2
  shift 2
  local log=$work/$name.log left=$((deadline - reserve - SECONDS)) file
  echo
  echo "== $name: $*"
  step_verdict="" step_figure=""
  for file in "${needs[@]}"; do
    if [ ! -e "$file" ]; then
      step_verdict=skip step_figure="not built: $file (see the build step)" skip_ok=1
      break
    fi
  done
  local start=$SECONDS status="" cut=""
  if [ -z "$step_verdict" ] && [ "$left" -lt "$min_step" ]; then
    [ "$left" -lt 0 ] && left=0
    step_verdict=skip step_figure="out of time (${left} s left of the ${budget} s budget)"
  elif [ -z "$step_verdict" ]; then
    [ "$limit" -gt "$left" ] && limit=$left cut=" (its limit cut to what the budget left)"
    timeout -k 5 "$limit" "$@" > "$log" 2>&1 < /dev/null &
    step_pid=$! step_name=$name
    wait "$step_pid"
    status=$?
    step_pid="" step_name=""
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
      step_verdict=fail
      step_figure="timed out after $limit s$cut; last line: "
      step_figure+=$(grep -v '^[[:space:]]*$' "$log" | tail -1 | cut -c1-160)
    else
      "$judge" "$name" "$status" "$log"
    fi
  fi
  if [ "$mode" = rehearse ] && [ "$step_verdict" = skip ] && [ "$skip_ok" -eq 0 ]; then
    step_verdict=fail step_figure="a rehearsal step may not skip: $step_figure"
  fi
  record "$name" "$step_verdict" $((SECONDS - start)) "$step_figure"
  if [ "$step_verdict" = fail ] && [ -s "$log" ]; then
    echo "-- the end of $log:"
    tail -15 "$log" | cut -c1-300
  fi
  refresh_archive
}

# skip_step NAME WHY: a step that cannot run here, recorded as skipped.
skip_step() {
  echo
  echo "== $1: (not run)"
  record "$1" skip 0 "$2"
  refresh_archive
}

# perf NAME RANKS ARGS...: braid-perf all-reduce on device buffers under
# braid-run (RANKS 0: one process, its ranks in ARGS' -g).
perf() {
  local name=$1 ranks=$2
  shift 2
  local launcher=()
  [ "$ranks" -gt 0 ] && launcher=("$bin/braid-run" -n "$ranks")
  step --needs "$bin/braid-perf" --needs "$bin/braid-run" --judge judge_perf "$name" 240 \
    "${launcher[@]}" "$bin/braid-perf" allreduce -G 1 "$@" -J "$work/$name.json"
}

# A braid-perf row's column (6: out-of-place time, 8: its busbw, 12: the
# in-place busbw) at a size in bytes.
perfValue() {  # perfValue NAME SIZE COLUMN
  awk -v size="$2" -v col="$3" '!/^#/ && $1 == size { print $col; exit }' "$work/$1.log" 2>/dev/null
}
# A kernel benchmark's bytes (read + written) per second, in GB/s.
kernel() {  # kernel NAME (without the size)
  awk -F, -v name="\"$1/$kernel_name/real_time\"" '$1 == name { printf "%.1f", $6 / 1e9; exit }' \
    "$work/kernels.csv" 2>/dev/null
}

# failed_tests LOG: the tests a GoogleTest run in LOG failed, and the one it
# was running when it was stopped, as a --gtest_filter ('' for none).
failed_tests() {
  [ -f "$1" ] || return 0
  {
    sed -n 's/^\[  FAILED  \] \([A-Za-z_][A-Za-z0-9_/.]*\).*/\1/p' "$1"
    awk '/^\[ RUN      \]/ {running = $4} /^\[       OK \]|^\[  FAILED  \]|^\[  SKIPPED \]/ {
      if ($0 ~ running) running = ""} END {if (running != "") print running}' "$1"
  } | sort -u | paste -sd: -
}

# has_target NAME: whether the build system in $build has the target.
has_target() {
  printf '%s\n' "$targets_here" | grep -qxF "$1"
}

# nccl_tests_dir: where NVIDIA's nccl-tests sources are, if anywhere.
nccl_tests_dir() {
  local dir
  for dir in ${NCCL_TESTS_DIR:+"$NCCL_TESTS_DIR"} ../nccl-tests ./nccl-tests; do
    if [ -f "$dir/src/all_reduce.cu" ]; then
      (cd "$dir" && pwd)
      return 0
    fi
  done
  return 1
}

# gpu_machine_hints: configure's hints (in hints) for a GPU machine that has
# CUDA and torch but not Debian's development packages: GoogleTest and Google
# Benchmark from .gpu-deps/ (tools/gpu_bundle.sh) where the machine has none
# of its own; NVIDIA's nccl.h and libnccl.so.2 from the nvidia-nccl wheel
# torch came with where the toolkit has none (NCCL_LIB for gpu_compare.sh).
hints=()
gpu_machine_hints() {
  local cmake_dir=.gpu-deps/usr/lib/x86_64-linux-gnu/cmake
  if [ ! -e /usr/include/gtest/gtest.h ] && [ -d "$cmake_dir/GTest" ]; then
    hints+=("-DGTest_DIR=$PWD/$cmake_dir/GTest")
  fi
  if [ ! -e /usr/include/benchmark/benchmark.h ] && [ -d "$cmake_dir/benchmark" ]; then
    hints+=("-Dbenchmark_DIR=$PWD/$cmake_dir/benchmark")
  fi
  local nvcc toolkit wheel
  # CMake looks for nvcc on PATH.
  if ! command -v nvcc > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
  fi
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  toolkit=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
  if [ ! -e "$toolkit/include/nccl.h" ] && [ ! -e "$toolkit/targets/x86_64-linux/include/nccl.h" ]; then
    wheel=$("$python" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2> /dev/null)
    [ -n "$wheel" ] && [ -e "$wheel/include/nccl.h" ] &&
      hints+=("-DBRAID_TOOLKIT_NCCL_H=$wheel/include/nccl.h")
    if [ -z "${NCCL_LIB:-}" ] && [ -n "$wheel" ] && [ -e "$wheel/lib/libnccl.so.2" ]; then
      export NCCL_LIB=$wheel/lib
    fi
  fi
  echo "gpu_check: configure hints: ${hints[*]:-none}${NCCL_LIB:+; NCCL_LIB=$NCCL_LIB}"
}

# ---- The table of targets.
targets() {
  local time8 busbw busbwInPlace wtime8 gtime8 gwtime8 wbusbw pbusbw pwbusbw
  local fifo256k2 oneshot256k2 fifo256k4 oneshot256k4 copy fp32 bf16 fp16
  time8=$(perfValue perf-n2-bfloat16 8 6)
  busbw=$(perfValue "perf-n2-bfloat16-$big" "$bigBytes" 8)
  busbwInPlace=$(perfValue "perf-n2-bfloat16-$big" "$bigBytes" 12)
  wtime8=$(perfValue windows-n2-bfloat16 8 6)
  gtime8=$(perfValue graph-n2-bfloat16-8 8 6)
  gwtime8=$(perfValue graph-windows-n2-bfloat16-8 8 6)
  wbusbw=$(perfValue "windows-n2-bfloat16-$big" "$bigBytes" 8)
  pbusbw=$(perfValue one-process-fifo "$bigBytes" 8)
  pwbusbw=$(perfValue one-process-windows "$bigBytes" 8)
  fifo256k2=$(perfValue fifo-n2-256K 262144 6)
  oneshot256k2=$(perfValue windows-n2-256K 262144 6)
  fifo256k4=$(perfValue fifo-n4-256K 262144 6)
  oneshot256k4=$(perfValue windows-n4-256K 262144 6)
  copy=$(kernel copy)
  fp32=$(kernel reduce2/float32/sum)
  bf16=$(kernel reduce2/bfloat16/sum)
  fp16=$(kernel reduce2/float16/sum)
  awk -v time8="$time8" -v busbw="$busbw" -v busbwInPlace="$busbwInPlace" -v copy="$copy" \
    -v wtime8="$wtime8" -v gtime8="$gtime8" -v gwtime8="$gwtime8" -v wbusbw="$wbusbw" \
    -v pbusbw="$pbusbw" -v pwbusbw="$pwbusbw" -v fifo256k2="$fifo256k2" \
    -v oneshot256k2="$oneshot256k2" -v fifo256k4="$fifo256k4" -v oneshot256k4="$oneshot256k4" \
    -v fp32="$fp32" -v bf16="$bf16" -v fp16="$fp16" -v big="$(human "$bigBytes")" \
    -v kbig="$(human "$((bigBytes * 4))")" -v judged="$([ "$mode" = gpu ] && echo 1 || echo 0)" \
    -v sizes="$kernel_label" '
    function ratio(a, b) { return (a == "" || b == "" || b == 0) ? "" : sprintf("%.3f", a / b) }
    function atLeast(value, bound) { return bound == "" ? "?" : (value + 0 >= bound + 0) }
    # row(what, value, target, met): met is 1 or 0, or "?" where the bound
    # itself is unknown; a missing value is "not measured", which misses
    # its target, as does an unknown bound.
    function row(what, value, target, met,    verdict) {
      if (target == "") verdict = ""
      else if (!judged) verdict = "not judged (rehearsal)"
      else if (value == "" || met == "?") { verdict = "NOT MEASURED"; missed++ }
      else if (met) verdict = "met"
      else { verdict = "MISSED"; missed++ }
      printf "%-56s %12s  %-28s %s\n", what, value == "" ? "-" : value, target, verdict
    }
    BEGIN {
      n = 2
      bound = copy == "" ? "" : sprintf("%.1f", 0.6 * copy * (n - 1) / (n * n))
      boundText = ">= 0.6*copy*(n-1)/n^2" (bound == "" ? "" : " = " bound)
      printf "%-56s %12s  %-28s %s\n", "measure", "value", "target", ""
      row("8 B bfloat16 all-reduce time, 2 ranks (us)", time8, "<= 15", time8 <= 15)
      row(big " bfloat16 all-reduce busbw, 2 ranks (GB/s)", busbw, boundText, atLeast(busbw, bound))
      row("  the same, in place (GB/s)", busbwInPlace, "", "")
      row("8 B bfloat16 all-reduce in windows, 2 ranks (us)", wtime8, "<= 10", wtime8 <= 10)
      row("8 B bfloat16 all-reduce from a CUDA graph, 2 ranks (us)", gtime8, "<= 4", gtime8 <= 4)
      row("  the same in windows (us)", gwtime8, "<= 4", gwtime8 <= 4)
      row(big " bfloat16 two-shot busbw, 2 ranks (GB/s)", wbusbw, boundText, atLeast(wbusbw, bound))
      row(big " bfloat16, one process -g 2, FIFOs (GB/s)", pbusbw, boundText,
          atLeast(pbusbw, bound))
      row(big " bfloat16, one process -g 2, two-shot (GB/s)", pwbusbw, boundText,
          atLeast(pwbusbw, bound))
      row("256 KiB one-shot / slot-FIFO time, 2 ranks", ratio(oneshot256k2, fifo256k2), "< 1",
          oneshot256k2 < fifo256k2)
      row("256 KiB one-shot / slot-FIFO time, 4 ranks", ratio(oneshot256k4, fifo256k4), "< 1",
          oneshot256k4 < fifo256k4)
      row("copy kernel, " sizes ", read + written (GB/s)", copy, "", "")
      row("float32 sum reduce / copy bandwidth, " sizes, ratio(fp32, copy), ">= 0.9",
          atLeast(ratio(fp32, copy), 0.9))
      row("bfloat16 sum reduce / copy bandwidth, " sizes, ratio(bf16, copy), ">= 0.9",
          atLeast(ratio(bf16, copy), 0.9))
      row("float16 sum reduce / copy bandwidth, " sizes, ratio(fp16, copy), "", "")
      printf "targets missed or not measured: %d\n", missed
    }'
}

# ---- On a signal (the machine's limit, ^C): the step in flight is
# stopped and recorded, the archive refreshed.
interrupted() {
  local during=""
  if [ -n "$step_pid" ]; then
    kill -TERM "$step_pid" 2>/dev/null
    during=" during $step_name (its log is in the archive)"
  fi
  record interrupted fail $((SECONDS - start_time)) "gpu_check stopped by a signal$during"
  refresh_archive
  exit 1
}

main() {
  trap interrupted TERM INT HUP
  local where
  where="$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores, source"
  where+=" $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')"
  [ -n "$(git status --porcelain 2>/dev/null | head -1)" ] && where+=" (with changes)"
  echo "# gpu_check $mode: $where; build $build, budget $budget s" | tee "$summary"
  echo "gpu_check: logs in $work, results in $out"

  # Which Python: the one braid_torch is built for (scripts/torch-python),
  # or, where that names a .venv this machine lacks, the python3 on PATH.
  local python
  python=$(scripts/torch-python 2>/dev/null)
  if [ ! -x "$python" ]; then
    export BRAID_PYTHON
    BRAID_PYTHON=$(command -v python3)
    python=$BRAID_PYTHON
  fi

  # ---- Host facts and the driver, before any build.
  if command -v nvidia-smi > /dev/null; then
    step --skip-ok --judge judge_smi nvidia-smi 30 nvidia-smi \
      --query-gpu=name,driver_version,memory.total,compute_cap,pci.bus_id --format=csv,noheader
  else
    skip_step nvidia-smi "nvidia-smi not found on PATH (no NVIDIA driver installed here)"
  fi
  if command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
    step --skip-ok --judge judge_nvcc nvcc 30 \
      sh -c 'nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version'
  else
    skip_step nvcc "nvcc not found (no CUDA toolkit on PATH or in /usr/local/cuda)"
  fi
  step --skip-ok torch 60 "$python" -c 'import sys
try:
    import torch
except ImportError as e:
    print(f"skip: {sys.executable} cannot import torch: {e}")
    sys.exit(77)
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"{torch.cuda.device_count()} GPU(s) seen, {sys.executable}")'
  step --skip-ok cuda-probe 60 python3 tools/cuda_probe.py
  if [ "$mode" = rehearse ]; then
    if [ -e /usr/local/cuda/lib64/stubs/libcuda.so ]; then
      step --judge judge_probe_stub cuda-probe-twin 60 python3 tools/cuda_probe.py \
        --lib /usr/local/cuda/lib64/stubs/libcuda.so
    else
      skip_step cuda-probe-twin "no stub driver at /usr/local/cuda/lib64/stubs/libcuda.so"
    fi
  fi

  # ---- Configure and build only what runs.
  local configure=(cmake -S . -B "$build")
  if [ "$mode" = gpu ]; then
    command -v ninja > /dev/null && configure+=(-G Ninja)
    configure+=(-DCMAKE_BUILD_TYPE=Release -DBRAID_CUDA=ON -DBRAID_BUILD_TESTS=ON
      -DBRAID_BUILD_BENCHMARKS=ON)
    gpu_machine_hints
    configure+=("${hints[@]}")
  fi
  local configure_step=configure
  step --judge judge_configure configure 180 "${configure[@]}"
  # A configure that fails is tried again without the torch backend, then
  # without the tests too, so that what can be built and run still is.
  if [ "$step_verdict" = fail ] && [ "$mode" = gpu ]; then
    configure+=(-DBRAID_TORCH=OFF)
    rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
    configure_step="configure-without-torch"
    step --judge judge_configure "$configure_step" 120 "${configure[@]}"
    if [ "$step_verdict" = fail ]; then
      configure+=(-DBRAID_BUILD_TESTS=OFF)
      rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
      configure_step="configure-without-tests"
      step --judge judge_configure "$configure_step" 120 "${configure[@]}"
    fi
  fi
  local configure_log=$work/$configure_step.log
  targets_here=$(cmake --build "$build" --target help 2>/dev/null |
    sed -n 's/^\.\.\. //; s/^\([A-Za-z0-9_.+-]*\):.*/\1/p; s/^\([A-Za-z0-9_.+-]*\)$/\1/p')
  local suites=(device_test device_one_process_test device_windows_test device_nccl_test
    device_graphs_test)
  # braid_fake_fabric: the fake verbs fabric of the ibverbs step, which
  # libbraid loads at run time; braid_nccl: libnccl.so.2.
  local wanted=("${suites[@]}" nccl_device_program peer-nccl-device braid_fake_fabric braid-run
    braid-perf braid-bench-device-kernels braid-info braid_nccl braid_torch_ext)
  build_targets=() not_configured=""
  local target
  for target in "${wanted[@]}"; do
    if has_target "$target"; then build_targets+=("$target"); else not_configured+=" $target"; fi
  done
  not_configured=${not_configured# }
  if grep -q "Google Benchmark not found" "$configure_log" 2>/dev/null; then
    not_configured+=" (Google Benchmark, libbenchmark-dev, is not installed)"
  fi
  local keep_going=(-- -k 0)
  grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja' "$build/CMakeCache.txt" 2>/dev/null ||
    keep_going=(-- -k)  # make's
  if [ ${#build_targets[@]} -gt 0 ]; then
    step --judge judge_build build 420 cmake --build "$build" -j "$(nproc)" \
      --target "${build_targets[@]}" "${keep_going[@]}"
  else
    step build 1 sh -c "echo 'error: no target to build: configure failed?'; exit 1"
  fi

  export BRAID_DEVICE=$device  # never fall back to host memory silently
  step --needs "$bin/braid-info" braid-info 60 "$bin/braid-info" --device

  # ---- The device suites' instances for this device. A test whose ranks
  # hang is given up after BRAID_TEST_DEADLINE seconds (tests/multirank.h),
  # not the 120 s of CI, so that one hang leaves time for the rest.
  local suite
  for suite in "${suites[@]}"; do
    step --needs "$bin/$suite" --judge judge_gtest "$device-$suite" 240 \
      env "${suite_shard[@]}" BRAID_TEST_DEADLINE="$test_deadline" "$bin/$suite" \
      --gtest_filter="$suite_filter"
  done
  # The tests that failed on the GPU, once more with 32 hardware queues
  # (CUDA_DEVICE_MAX_CONNECTIONS, 8 unless set): where they pass then, a
  # stream waited behind another's blocked wait on a shared queue.
  if [ "$mode" = gpu ]; then
    local failing
    for suite in "${suites[@]}"; do
      failing=$(failed_tests "$work/$device-$suite.log")
      [ -n "$failing" ] || continue
      step --judge judge_gtest "$device-$suite-32-queues" 150 \
        env CUDA_DEVICE_MAX_CONNECTIONS=32 BRAID_TEST_DEADLINE="$test_deadline" \
        "$bin/$suite" --gtest_filter="$failing"
    done
  fi

  # A program built against NCCL's own nccl.h, single-process model, 4 ranks on the device.
  step --needs "$bin/nccl_device_program" nccl-device-program 120 "$bin/nccl_device_program" 4 1

  # ---- braid-perf on device buffers.
  perf perf-n2-bfloat16 2 -d bfloat16 "${sweep[@]}" "${sweep_iters[@]}"
  perf perf-n2-float 2 -d float "${sweep[@]}" "${sweep_iters[@]}"
  perf perf-n4-bfloat16 4 -d bfloat16 "${sweep[@]}" "${sweep_iters[@]}"
  perf "perf-n2-bfloat16-$big" 2 -d bfloat16 -b "$big" -e "$big" "${big_iters[@]}"
  perf windows-n2-bfloat16 2 -d bfloat16 "${windows_sweep[@]}" "${sweep_iters[@]}" -R 2
  perf windows-n4-bfloat16 4 -d bfloat16 "${windows_sweep[@]}" "${sweep_iters[@]}" -R 2
  perf "windows-n2-bfloat16-$big" 2 -d bfloat16 -b "$big" -e "$big" "${big_iters[@]}" -R 2
  # One process, two "GPUs" that are the same one (braid-perf -g 2, no braid-run).
  perf one-process-fifo 0 -g 2 -d bfloat16 -b "$big" -e "$big" "${big_iters[@]}"
  perf one-process-windows 0 -g 2 -R 2 -d bfloat16 -b "$big" -e "$big" "${big_iters[@]}"
  # 8 B all-reduces replayed from CUDA graphs (-C: the -n calls a graph).
  perf graph-n2-bfloat16-8 2 -d bfloat16 -b 8 -e 8 "${graph_iters[@]}"
  perf graph-windows-n2-bfloat16-8 2 -d bfloat16 -b 8 -e 8 "${graph_iters[@]}" -R 2
  local ranks
  for ranks in 2 4; do  # one-shot against the slot FIFOs at 256 KiB
    perf "fifo-n$ranks-256K" "$ranks" -d bfloat16 -b 256K -e 256K "${small_iters[@]}"
    perf "windows-n$ranks-256K" "$ranks" -d bfloat16 -b 256K -e 256K "${small_iters[@]}" -R 2
  done
  # Device buffers staged through host memory over tcp, as between hosts.
  step --needs "$bin/braid-perf" --judge judge_perf tcp-staged-n2-bfloat16 240 \
    env BRAID_TRANSPORT=tcp "$bin/braid-run" -n 2 "$bin/braid-perf" allreduce -G 1 -d bfloat16 \
    "${staged_sweep[@]}" "${sweep_iters[@]}" -J "$work/tcp-staged.json"
  # Device buffers over the ibverbs engine on the fake fabric (no RDMA NIC
  # needed): the GPU's dma-buf export runs (Device::exportDmabuf); where
  # the fake cannot map it, the slots are staged through page-locked host
  # memory. The info line says which.
  step --needs "$build/lib/libbraid_fake_fabric.so" --judge judge_ibverbs \
    ibverbs-fake-n2-bfloat16 240 env BRAID_TRANSPORT=ibverbs BRAID_IB_FAKE=gpucheck \
    BRAID_LOG_LEVEL=info BRAID_LOG_SUBSYS=init "$bin/braid-run" -n 2 "$bin/braid-perf" allreduce \
    -G 1 -d bfloat16 "${staged_sweep[@]}" "${sweep_iters[@]}" -J "$work/ibverbs-fake.json"

  step --needs "$bin/braid-bench-device-kernels" --judge judge_kernels kernels 240 \
    "$bin/braid-bench-device-kernels" --min_bytes="$kernel_size" --max_bytes="$kernel_size" \
    --benchmark_min_time="$kernel_time" --benchmark_out="$work/kernels.csv" \
    --benchmark_out_format=csv

  # ---- torch: braid's backend on CUDA tensors, then PyTorch's own NCCL
  # backend on braid's libnccl.so.2.
  if grep -q "braid_torch: built for torch .*with CUDA tensors" "$configure_log"; then
    step --judge judge_build torch-build 300 cmake --build "$build" -j "$(nproc)" \
      --target braid_torch_ext
    if [ "$step_verdict" = pass ]; then
      step --skip-ok torch-cuda 300 env PYTHONPATH="$build/python" \
        "$python" integrations/torch/tests/test_cuda.py 2
    else
      skip_step torch-cuda "torch-build did not pass: $step_figure"
    fi
  else
    local why
    why=$(grep -m1 -o 'braid_torch: .*' "$configure_log" || echo "braid_torch not configured")
    skip_step torch-build "$why"
    skip_step torch-cuda "$why"
  fi
  local lib
  lib=$(cd "$build/lib" 2>/dev/null && pwd -P)
  braid_lib=$lib
  if [ "$mode" = gpu ]; then
    step --needs "$build/lib/libnccl.so.2" torch-nccl 180 env LD_PRELOAD="$lib/libnccl.so.2" \
      LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      "$python" tools/torch_nccl_check.py --braid-lib "$lib" --expect-braid
  else
    skip_step torch-nccl "GPU only: PyTorch's NCCL backend needs a GPU; its twin follows"
    # The twin preloads braid's library too: torch must import with it (every
    # NCCL function torch links is there), and its calls must reach it.
    step --skip-ok --needs "$build/lib/libnccl.so.2" --judge judge_torch_twin torch-nccl-twin 120 \
      env LD_PRELOAD="$lib/libnccl.so.2" "$python" tools/torch_nccl_check.py --backend gloo \
      --device cpu --braid-lib "$lib" --expect-braid
  fi

  # ---- braid next to NVIDIA's NCCL, and NVIDIA's nccl-tests on braid.
  step --needs "$bin/peer-nccl-device" --judge judge_compare gpu-compare 300 \
    env "${compare_env[@]}" benchmarks/gpu_compare.sh "$build"

  local tests_dir
  if tests_dir=$(nccl_tests_dir); then
    # NCCL_HOME as nccl-tests wants it: braid's nccl.h in include/, its
    # libnccl.so in lib/.
    local home=$build/nccl-home gencode
    rm -rf "$home" "$build/nccl-tests"
    mkdir -p "$home/include"
    ln -s "$PWD/include/braid/nccl/nccl.h" "$home/include/nccl.h"
    ln -s "$lib" "$home/lib"
    gencode=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
      head -1 | tr -d .)
    gencode="-gencode=arch=compute_${gencode:-90},code=sm_${gencode:-90}"
    step --needs "$build/lib/libnccl.so.2" nccl-tests-build 240 make -C "$tests_dir" \
      -j "$(nproc)" NCCL_HOME="$PWD/$home" CUDA_HOME=/usr/local/cuda NVCC_GENCODE="$gencode" \
      BUILDDIR="$PWD/$build/nccl-tests"
    if [ "$mode" = gpu ]; then
      step --needs "$build/nccl-tests/all_reduce_perf" --judge judge_nccl_tests \
        nccl-tests-allreduce 120 \
        env LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "$build/nccl-tests/all_reduce_perf" -b 8 -e 128M -f 4 -g 1 -c 1
    else
      skip_step nccl-tests-allreduce "GPU only: all_reduce_perf calls CUDA itself"
    fi
  else
    local looked="${NCCL_TESTS_DIR:+$NCCL_TESTS_DIR, }../nccl-tests, ./nccl-tests"
    skip_step nccl-tests-build "no nccl-tests sources (src/all_reduce.cu) in $looked"
    skip_step nccl-tests-allreduce "no nccl-tests sources"
  fi

  # ---- The targets, and the result.
  echo
  targets > "$out/targets.txt"
  local missed status result
  missed=$(sed -n 's/^targets missed or not measured: //p' "$out/targets.txt")
  if [ "$mode" = rehearse ]; then
    sed -i 's/^targets missed or not measured: .*/targets: not judged in a rehearsal/' \
      "$out/targets.txt"
    missed=0
  fi
  if [ "$failed" -gt 0 ]; then
    status=1 result="$failed step(s) failed"
  elif [ "$missed" -gt 0 ]; then
    status=3 result="every step passed or skipped; $missed target(s) missed or not measured"
  else
    status=0 result="every step passed or skipped for its reason"
    [ "$mode" = gpu ] && result+=", every target met"
  fi
  {
    echo "# result: $passed passed, $failed failed, $skipped skipped" \
      "in $((SECONDS - start_time)) s:"
    echo "# $result (exit $status)"
  } >> "$summary"
  refresh_archive
  # The summary and the table again, last, where a console's tail shows them.
  echo
  echo "---- $summary"
  cat "$summary"
  echo
  echo "---- $out/targets.txt"
  cat "$out/targets.txt"
  echo
  echo "gpu_check: logs in $work and $archive"
  return "$status"
}

# Everything printed also goes to gpu_check.log.
exec > >(tee "$out/gpu_check.log") 2>&1
tee_pid=$!
main
status=$?
exec > /dev/null 2>&1
wait "$tee_pid"
exit "$status"
