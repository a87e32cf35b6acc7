#!/usr/bin/env bash
# Builds braid with sanitizers and runs the unit and multi-rank tests under
# them: `asan` (AddressSanitizer + UndefinedBehaviorSanitizer, build-asan/)
# and `tsan` (ThreadSanitizer, build-tsan/), both by default. Any report
# fails the test it occurs in. The presets are in CMakePresets.json.
#   scripts/sanitize.sh                       both
#   scripts/sanitize.sh tsan -R AllReduce     one, with more ctest arguments
# The CUDA binding is not built here (it cannot run without a GPU; the
# device tests run on the emulated device). Left out under both: the soak
# test (its memory check would measure the sanitizer's allocator), the
# install and command-line checks (packaging, no code path the rest lacks)
# and the ibverbs_fake.*
# and ibverbs_gdr.* repeats of the collectives, communicator and device
# suites (the engines, the device proxy and the fake fabric run under both
# in Ibverbs.* and ibverbs.*), and the Python clients of the NCCL API (an
# uninstrumented interpreter cannot load a sanitized library; the C
# programs of Nccl.* run the same calls). Left out under
# AddressSanitizer, to keep CI short: the tcp.* repeats (tcp's code runs
# under it in tcp4.*, the multi-host and the staged.* tests), the ucx.*
# repeats of the collectives (ucx_multihost_test runs every collective over
# ucx) and of the elastic suite (it runs over ucx's shared memory in
# ucx_shm.*), and the simulator at a thousand ranks and more (the same
# planners run at up to 64). Of the tls.* repeats, both keep the
# bootstrap, one-sided, collective and peer-failure ones, where the TLS
# tunnel's thread meets every kind of caller, and leave out the elastic and
# staged-device ones (their callers are those of the tcp.* and staged.*
# runs); ThreadSanitizer also leaves out the collectives' (the tunnel's
# thread meets the executor's there as in the peer-failure ones it keeps).
# Left out under ThreadSanitizer: the tcp.*, tcp4.* and ucx.* repeats
# (each communicator's transports run on its executor's thread, so their
# threads are the ones the shm runs have; libucp itself is not
# instrumented; ucx_shm.* stays, so ucx's code runs under it, with its
# faults over shared memory, but not its repeat of the elastic suite, whose
# threads are the shm run's), Algorithms.*, MemAllocBuffers.* and the NCCL
# programs that fork their ranks after ncclGetUniqueId started its thread
# (ThreadSanitizer refuses threads after such a fork; plans and buffers on the same threads as the collectives
# suite; the NCCL API's own threads run in the rest of Nccl.*) and the
# simulator's Plans.* tests
# (one thread, no shared state), AllReduce at 8 ranks (the same threads
# and code as at 2, 3 and 5) and the elastic example (elastic_test runs
# its shrink and grow under it). The staged.* repeat of the device suite
# stays: tcp's device proxy is a thread of its own.
# The stream.* repeat stays out of both (the streaming stores run on the
# executor's thread, and reduce_test checks their bounds under AddressSanitizer
# at every alignment); the cma.* repeat stays under AddressSanitizer only
# (the pieces read by address and their staging run on the threads the shm
# runs have, and ThreadSanitizer does not see process_vm_readv).
# The elastic suite's Cycles test runs 20 cycles after its warm ones here
# (BRAID_ELASTIC_CYCLES): its memory check is off under a sanitizer, and a
# leak of one fd, mapping or thread per cycle shows in 20 as well.
set -euo pipefail
cd "$(dirname "$0")/.."
export BRAID_ELASTIC_CYCLES="${BRAID_ELASTIC_CYCLES:-20}"
presets=()
while [ $# -gt 0 ] && { [ "$1" = asan ] || [ "$1" = tsan ]; }; do
  presets+=("$1")
  shift
done
[ ${#presets[@]} -gt 0 ] || presets=(asan tsan)

for preset in "${presets[@]}"; do
  exclude='Soak\.|^Install\.|^Tools\.|^Torch\.|^Nccl\.PythonClients|^ibverbs_fake\.|^ibverbs_gdr\.|^stream\.'
  [ "$preset" = asan ] && exclude="$exclude|^tls\.(Device|Shrink|Grow)|^tcp\.|^Plans\..*Thousand|^ucx\.(AllReduce|Broadcast|Reduce|AllGather|ReduceScatter|Revoke|Shrink|Grow|Cycles)\."
  [ "$preset" = tsan ] && exclude="$exclude|^cma\.|^tls\.(Device|Shrink|Grow|AllReduce|AllGather|ReduceScatter)|^tcp\.|^tcp4\.|^Plans\.|^Algorithms\.|^MemAllocBuffers\.|^Nccl\.ProgramWrittenForNccl|^Nccl\.OneSidedCalls|^ucx\.|^ucx_shm\.(Revoke|Shrink|Grow|Cycles)\.|^AllReduce\.MatchesReferenceAt8Ranks|^Examples\.ElasticTrain"
  echo "sanitize: ${preset}: building"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "${BRAID_BUILD_JOBS:-2}"
  echo "sanitize: ${preset}: testing"
  ctest --preset "$preset" -j "${BRAID_TEST_JOBS:-2}" -E "$exclude" "$@"
done
