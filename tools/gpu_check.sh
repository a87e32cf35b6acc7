#!/usr/bin/env bash
# tools/gpu_check.sh: the one script for a machine with a GPU (written for an
# H200, sm_90). Run it from the repository root, with no arguments; it takes
# a few minutes (well under 5 on 16 cores):
#
#   1. configures build-gpu/ afresh (Release, BRAID_CUDA=ON, tests on) and
#      builds only what it runs;
#   2. the CUDA instances (--gtest_filter='*/cuda') of device_test,
#      device_one_process_test (initAll, nvlink_p2p), device_windows_test
#      (registered windows, one-shot and two-shot), device_nccl_test and
#      device_graphs_test (collectives captured into CUDA graphs),
#      which must all run and pass: an instance that skips (no GPU or
#      driver) fails the script; and nccl_device_program (built against
#      NCCL's own nccl.h) at 4 ranks on the GPU. Those tests already put several ranks on
#      the one GPU (1 to 5 ranks, several per process too, plus the fault
#      tests), so nothing here repeats that;
#   3. braid-perf all-reduce on device buffers (-G 1), bfloat16 at 2 and 4
#      ranks and float at 2, 8 B to 256 MiB (every #wrong must be 0), and
#      bfloat16 at 256 MiB alone (-f 4 from 8 B stops at 128 MiB); then the
#      same bfloat16 runs on buffers in registered windows (-R 2: one-shot
#      up to 256 KiB, two-shot above); and 256 MiB bfloat16 with one process
#      driving two ranks on the GPU (-g 2), on FIFOs and in windows;
#      then device buffers staged through host memory over tcp
#      (BRAID_TRANSPORT=tcp: stream waits on flags in page-locked host
#      memory that tcp's proxy writes), 8 B to 64 MiB at 2 ranks; the same
#      over the ibverbs engine on the fake fabric (the GPU's dma-buf export
#      runs, then the slots are staged, which the info line says); and
#      benchmarks/gpu_compare.sh: braid and NVIDIA's NCCL (the toolkit's
#      libnccl.so.2) running the same NCCL-API program on every collective,
#      1 rank, a rank per GPU where there are several, and braid alone with
#      2 ranks on one GPU (NCCL refuses them);
#   4. braid-bench-device-kernels at 1 GiB per buffer: Device::copy and the
#      2-input Sum reduce for float32, bfloat16 and float16; then, where
#      CMake found torch for the python3 on PATH, braid_torch is built and
#      torch.distributed's calls on CUDA tensors run at 2 ranks on the GPU
#      (integrations/torch/tests/test_cuda.py);
#   5. prints a summary table against the targets: 8 B all-reduce at 2 ranks
#      <= 15 us (<= 10 us in windows), <= 4 us a call replayed from a CUDA
#      graph (braid-perf -C, on FIFOs and in windows); 256 MiB bfloat16 busbw at 2 ranks >=
#      0.6 * copy_bw * (n-1)/n^2, slot FIFOs and two-shot alike; one-shot
#      faster than the slot-FIFO algorithms at 256 KiB at 2 and 4 ranks; the
#      reduce kernels' bandwidth >= 0.9 of the copy kernel's.
#      copy_bw is the copy kernel's bytes read + written per second (2 x size
#      per copy), and a reduce's bandwidth counts 3 x size, as the benchmark
#      reports them.
#
# Everything is also written under $OUT if it is set, else build-gpu/gpu-check/
# (gpu_check.log, one log per step, the braid-perf JSON, the kernel CSV).
# Exit status: 0 when every step passed and every target was met, 3 when the
# steps passed but a target was missed, 1 when a step failed.
set -euo pipefail

if [ $# -ne 0 ]; then
  echo "usage: tools/gpu_check.sh   (no arguments; run it on a machine with a GPU)" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
build="build-gpu"
bin=$build/bin

rm -rf "$build"
logs=${OUT:-$build/gpu-check}
mkdir -p "$logs"

fail() {
  echo "gpu_check: FAILED: $*"
  echo "gpu_check: logs in $logs"
  exit 1
}

# step NAME SECONDS COMMAND...: runs COMMAND under a time limit, its output
# shown and kept in $logs/NAME.log; stops the script when it fails.
step() {
  local name=$1 limit=$2
  shift 2
  echo
  echo "== $name: $*"
  local start=$SECONDS status
  set +e
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$logs/$name.log"
  status=${PIPESTATUS[0]}
  set -e
  echo "== $name: exit $status after $((SECONDS - start)) s"
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    fail "$name timed out after $limit s"
  elif [ "$status" -ne 0 ]; then
    fail "$name exited with status $status"
  fi
}

# perf NAME RANKS ARGS...: braid-perf all-reduce on device buffers under braid-run.
perf() {
  local name=$1 ranks=$2
  shift 2
  step "$name" 240 "$bin/braid-run" -n "$ranks" "$bin/braid-perf" allreduce -G 1 "$@" \
    -J "$logs/$name.json"
}

# A braid-perf row's column (6: out-of-place time, 8: its busbw, 12: the
# in-place busbw) at a size in bytes.
perfValue() {  # perfValue LOG SIZE COLUMN
  awk -v size="$2" -v col="$3" '!/^#/ && $1 == size { print $col; exit }' "$logs/$1.log"
}
# A kernel benchmark's bytes (read + written) per second, in GB/s.
kernel() {  # kernel NAME
  awk -F, -v name="\"$1/real_time\"" '$1 == name { printf "%.1f", $6 / 1e9; exit }' \
    "$logs/kernels.csv"
}

main() {
  echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores"
  echo "gpu_check: source $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv || true
  else
    echo "gpu_check: nvidia-smi not found"
  fi

  generator=()
  if command -v ninja > /dev/null; then generator=(-G Ninja); fi
  step configure 180 cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DBRAID_CUDA=ON -DBRAID_BUILD_TESTS=ON -DBRAID_BUILD_BENCHMARKS=ON
  if grep -q "Google Benchmark not found" "$logs/configure.log"; then
    fail "Google Benchmark is not installed (libbenchmark-dev): braid-bench-device-kernels cannot be built"
  fi
  suites=(device_test device_one_process_test device_windows_test device_nccl_test
    device_graphs_test)
  programs=()  # built against NCCL's own nccl.h, where the toolkit has one
  if grep -q "NCCL ABI checked against" "$logs/configure.log"; then
    programs=(nccl_device_program peer-nccl-device)
  fi
  # The fake fabric the ibverbs step runs over: a library libbraid loads at
  # run time, which no target links, so it is named here.
  equipment=()
  if grep -q "building the ibverbs transport" "$logs/configure.log"; then
    equipment=(braid_fake_fabric)
  fi
  step build 300 cmake --build "$build" -j "$(nproc)" \
    --target "${suites[@]}" "${programs[@]}" "${equipment[@]}" braid-run braid-perf \
    braid-bench-device-kernels

  # The CUDA instances only; gtest reports a skipped one (no GPU or driver)
  # with status 0, so the output decides.
  for suite in "${suites[@]}"; do
    step "cuda-$suite" 240 "$bin/$suite" --gtest_filter='*/cuda'
    if grep -q '^\[  SKIPPED \]' "$logs/cuda-$suite.log"; then
      reason=$(grep -m1 -o 'no cuda device here: .*' "$logs/cuda-$suite.log" || true)
      skipped=$(grep -m1 '^\[  SKIPPED \] ' "$logs/cuda-$suite.log" || true)
      case "$reason" in
        "") fail "$suite skipped a CUDA test: ${skipped:-see the log}" ;;
        *) fail "the CUDA device tests were skipped, so there is no usable GPU here: $reason" ;;
      esac
    fi
    passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\?\..*/\1/p' "$logs/cuda-$suite.log" | tail -1)
    if [ -z "$passed" ] || [ "$passed" -eq 0 ]; then
      fail "no CUDA test of $suite ran (did the filter '*/cuda' match nothing?)"
    fi
  done

  export BRAID_DEVICE=cuda  # never fall back to host memory silently
  # A program built against NCCL's own nccl.h, single-process model, 4 ranks on the GPU.
  if [ ${#programs[@]} -gt 0 ]; then
    step nccl-device-program 120 "$bin/nccl_device_program" 4 1
  else
    echo "gpu_check: the toolkit has no nccl.h: nccl_device_program not built"
  fi
  perf perf-n2-bfloat16 2 -d bfloat16 -b 8 -e 256M -f 4
  perf perf-n2-float 2 -d float -b 8 -e 256M -f 4
  perf perf-n4-bfloat16 4 -d bfloat16 -b 8 -e 256M -f 4
  perf perf-n2-bfloat16-256M 2 -d bfloat16 -b 256M -e 256M -n 40 -w 10
  perf windows-n2-bfloat16 2 -d bfloat16 -b 8 -e 128M -f 4 -R 2
  perf windows-n4-bfloat16 4 -d bfloat16 -b 8 -e 128M -f 4 -R 2
  perf windows-n2-bfloat16-256M 2 -d bfloat16 -b 256M -e 256M -n 40 -w 10 -R 2
  # One process, two "GPUs" that are the same one (braid-perf -g 2, no braid-run).
  step one-process-fifo 240 "$bin/braid-perf" allreduce -g 2 -G 1 -d bfloat16 -b 256M -e 256M \
    -n 40 -w 10 -J "$logs/one-process-fifo.json"
  step one-process-windows 240 "$bin/braid-perf" allreduce -g 2 -G 1 -R 2 -d bfloat16 -b 256M \
    -e 256M -n 40 -w 10 -J "$logs/one-process-windows.json"
  # 8 B all-reduces replayed from CUDA graphs (-C: 100 calls a graph, 20 launches).
  perf graph-n2-bfloat16-8 2 -d bfloat16 -b 8 -e 8 -n 100 -w 10 -C 20
  perf graph-windows-n2-bfloat16-8 2 -d bfloat16 -b 8 -e 8 -n 100 -w 10 -C 20 -R 2
  for ranks in 2 4; do  # one-shot against the slot FIFOs at 256 KiB
    perf "fifo-n$ranks-256K" "$ranks" -d bfloat16 -b 256K -e 256K -n 200 -w 20
    perf "windows-n$ranks-256K" "$ranks" -d bfloat16 -b 256K -e 256K -n 200 -w 20 -R 2
  done

  # Device buffers staged through host memory over tcp, as between hosts.
  step tcp-staged-n2-bfloat16 240 env BRAID_TRANSPORT=tcp "$bin/braid-run" -n 2 \
    "$bin/braid-perf" allreduce -G 1 -d bfloat16 -b 8 -e 64M -f 8 -J "$logs/tcp-staged.json"
  # Device buffers over the ibverbs engine on the fake fabric (no RDMA NIC
  # needed): the GPU's dma-buf export runs (Device::exportDmabuf); the fake
  # cannot map a real dma-buf, so the slots are staged through page-locked
  # host memory, and the info line says so.
  step ibverbs-fake-n2-bfloat16 240 env BRAID_TRANSPORT=ibverbs BRAID_IB_FAKE=gpucheck \
    BRAID_LOG_LEVEL=info BRAID_LOG_SUBSYS=init "$bin/braid-run" -n 2 "$bin/braid-perf" allreduce \
    -G 1 -d bfloat16 -b 8 -e 64M -f 8 -J "$logs/ibverbs-fake.json"
  if [ ${#programs[@]} -gt 0 ]; then
    step gpu-compare 300 env SIZES="-b 8 -e 128M -f 64" ITERS="-n 20 -w 5" TYPE=bfloat16 \
      benchmarks/gpu_compare.sh "$build"
  fi

  step kernels 240 "$bin/braid-bench-device-kernels" --min_bytes=1G --max_bytes=1G \
    --benchmark_min_time=0.5 --benchmark_out="$logs/kernels.csv" --benchmark_out_format=csv
  if grep -q ',true,' "$logs/kernels.csv"; then
    fail "a kernel benchmark could not run: $(grep -m1 ',true,' "$logs/kernels.csv")"
  fi

  # The torch.distributed backend, where CMake found torch for the python3
  # on PATH (built last: the steps above do not wait for it): its calls on
  # CUDA tensors, two ranks on the GPU (test_cuda.py exits 77 where torch
  # sees no GPU, which fails the step).
  if grep -q "braid_torch: built for torch .*with CUDA tensors" "$logs/configure.log"; then
    step torch-build 300 cmake --build "$build" -j "$(nproc)" --target braid_torch_ext
    step torch-cuda 300 env PYTHONPATH="$build/python" \
      "$(scripts/torch-python)" integrations/torch/tests/test_cuda.py 2
  elif grep -q "braid_torch: built for torch" "$logs/configure.log"; then
    fail "braid_torch was configured without CUDA tensors (is torch here a CPU build?): see $logs/configure.log"
  else
    echo "gpu_check: braid_torch not configured (no torch for $(scripts/torch-python)): torch-cuda not run"
  fi

  # ---- Summary.
  time8=$(perfValue perf-n2-bfloat16 8 6)
  busbw=$(perfValue perf-n2-bfloat16-256M 268435456 8)
  busbwInPlace=$(perfValue perf-n2-bfloat16-256M 268435456 12)
  wtime8=$(perfValue windows-n2-bfloat16 8 6)
  gtime8=$(perfValue graph-n2-bfloat16-8 8 6)
  gwtime8=$(perfValue graph-windows-n2-bfloat16-8 8 6)
  wbusbw=$(perfValue windows-n2-bfloat16-256M 268435456 8)
  pbusbw=$(perfValue one-process-fifo 268435456 8)
  pwbusbw=$(perfValue one-process-windows 268435456 8)
  fifo256k2=$(perfValue fifo-n2-256K 262144 6)
  oneshot256k2=$(perfValue windows-n2-256K 262144 6)
  fifo256k4=$(perfValue fifo-n4-256K 262144 6)
  oneshot256k4=$(perfValue windows-n4-256K 262144 6)
  copy=$(kernel copy/1GiB)
  fp32=$(kernel reduce2/float32/sum/1GiB)
  bf16=$(kernel reduce2/bfloat16/sum/1GiB)
  fp16=$(kernel reduce2/float16/sum/1GiB)
  for value in time8 busbw busbwInPlace wtime8 gtime8 gwtime8 wbusbw pbusbw pwbusbw fifo256k2 oneshot256k2 fifo256k4 \
    oneshot256k4 copy fp32 bf16 fp16; do
    [ -n "${!value}" ] || fail "the summary could not find '$value' in the logs"
  done

  awk -v time8="$time8" -v busbw="$busbw" -v busbwInPlace="$busbwInPlace" -v copy="$copy" \
    -v wtime8="$wtime8" -v gtime8="$gtime8" -v gwtime8="$gwtime8" -v wbusbw="$wbusbw" -v pbusbw="$pbusbw" -v pwbusbw="$pwbusbw" \
    -v fifo256k2="$fifo256k2" \
    -v oneshot256k2="$oneshot256k2" -v fifo256k4="$fifo256k4" -v oneshot256k4="$oneshot256k4" \
    -v fp32="$fp32" -v bf16="$bf16" -v fp16="$fp16" -v missedFile="$logs/missed" '
    function row(what, value, target, met) {
      printf "%-52s %12s  %-28s %s\n", what, value, target, met == "" ? "" : (met ? "met" : "MISSED")
      if (met == 0 && met != "") missed++
    }
    BEGIN {
      n = 2
      bound = 0.6 * copy * (n - 1) / (n * n)
      print ""
      print "gpu_check summary"
      printf "%-52s %12s  %-28s %s\n", "measure", "value", "target", ""
      row("8 B bfloat16 all-reduce time, 2 ranks (us)", time8, "<= 15", time8 <= 15)
      row("256 MiB bfloat16 all-reduce busbw, 2 ranks (GB/s)", busbw,
          sprintf(">= 0.6*copy*(n-1)/n^2 = %.1f", bound), busbw >= bound)
      row("  the same, in place (GB/s)", busbwInPlace, "", "")
      row("8 B bfloat16 all-reduce in windows, 2 ranks (us)", wtime8, "<= 10", wtime8 <= 10)
      row("8 B bfloat16 all-reduce from a CUDA graph, 2 ranks (us)", gtime8, "<= 4", gtime8 <= 4)
      row("  the same in windows (us)", gwtime8, "<= 4", gwtime8 <= 4)
      row("256 MiB bfloat16 two-shot busbw, 2 ranks (GB/s)", wbusbw,
          sprintf(">= %.1f", bound), wbusbw >= bound)
      row("256 MiB bfloat16, one process -g 2, FIFOs (GB/s)", pbusbw, sprintf(">= %.1f", bound),
          pbusbw >= bound)
      row("256 MiB bfloat16, one process -g 2, two-shot (GB/s)", pwbusbw,
          sprintf(">= %.1f", bound), pwbusbw >= bound)
      row("256 KiB one-shot / slot-FIFO time, 2 ranks", sprintf("%.3f", oneshot256k2 / fifo256k2),
          "< 1", oneshot256k2 < fifo256k2)
      row("256 KiB one-shot / slot-FIFO time, 4 ranks", sprintf("%.3f", oneshot256k4 / fifo256k4),
          "< 1", oneshot256k4 < fifo256k4)
      row("copy kernel, 1 GiB, read + written (GB/s)", copy, "", "")
      row("float32 sum reduce / copy bandwidth, 1 GiB", sprintf("%.3f", fp32 / copy), ">= 0.9",
          fp32 / copy >= 0.9)
      row("bfloat16 sum reduce / copy bandwidth, 1 GiB", sprintf("%.3f", bf16 / copy), ">= 0.9",
          bf16 / copy >= 0.9)
      row("float16 sum reduce / copy bandwidth, 1 GiB", sprintf("%.3f", fp16 / copy), "", "")
      print missed + 0 > missedFile
    }'
  missed=$(cat "$logs/missed")
  rm -f "$logs/missed"
  echo
  if [ "$missed" -ne 0 ]; then
    echo "gpu_check: every step passed; $missed target(s) missed. Logs in $logs"
    exit 3
  fi
  echo "gpu_check: every step passed and every target was met. Logs in $logs"
}

# Everything the steps print also goes to gpu_check.log; the exit status is
# main's (pipefail).
main 2>&1 | tee "$logs/gpu_check.log"
