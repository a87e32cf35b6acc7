// The NCCL API's fault-tolerance calls, as a program written for NCCL uses
// them: 4 ranks; the last one is killed; the survivors see the failure,
// shrink it away with NCCL_SHRINK_ABORT, abort the parent (which must not
// wait for anyone) and run on the new communicator; then one of them
// revokes it, each sees its next collective refused, and the two that stay
// shrink it once more, nonblocking, polling ncclCommGetAsyncError; last, a
// new process joins those two (ncclCommGetUniqueId, ncclCommGrow).
//   nccl_elastic_program      exit status 0 when every survivor passed
#include <nccl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 29, 0)  // NCCL 2.29's, for an older nccl.h
extern "C" ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);
extern "C" ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId,
                                     int rank, ncclComm_t* newcomm, ncclConfig_t* config);
#endif

#include "nccl_call.h"

namespace {

constexpr int kRanks = 4;
int gRank = 0;
int gFailures = 0;

void failed(const std::string& what) {
  ++gFailures;
  fprintf(stderr, "rank %d: %s\n", gRank, what.c_str());
}

#define CHECK(call) NCCL_CALL_OR(call, return )

struct Shared {
  ncclUniqueId id;
  volatile int ready;
  ncclUniqueId growId;
  volatile int growReady;
};
Shared* gShared = nullptr;

// One sum all-reduce of `count` floats, each rank giving rank + 1; the
// result is checked against `size` ranks.
ncclResult_t sumOnce(ncclComm_t comm, int rank, int size, bool check) {
  std::vector<float> data(1024, static_cast<float>(rank + 1));
  const ncclResult_t result =
      ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat32, ncclSum, comm, nullptr);
  if (result == ncclSuccess && check && data[0] != size * (size + 1) / 2.0f)
    failed("all-reduce sum is " + std::to_string(data[0]));
  return result;
}

void runRank(const ncclUniqueId& id) {
  ncclComm_t comm = nullptr;
  CHECK(ncclCommInitRank(&comm, kRanks, id, gRank));
  CHECK(sumOnce(comm, gRank, kRanks, true));
  if (gRank == kRanks - 1) raise(SIGKILL);

  // The survivors: collectives until the death shows.
  ncclResult_t result = ncclSuccess;
  for (int i = 0; i < 100000 && result == ncclSuccess; ++i)
    result = sumOnce(comm, gRank, kRanks, false);
  if (result != ncclRemoteError)
    return failed(std::string("after the kill: ") + ncclGetErrorString(result));

  int excluded[] = {kRanks - 1};
  ncclComm_t survivors = nullptr;
  const auto start = std::chrono::steady_clock::now();
  CHECK(ncclCommShrink(comm, excluded, 1, &survivors, nullptr, NCCL_SHRINK_ABORT));
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  CHECK(ncclCommAbort(comm));  // the parent: at once, waiting for nobody
  int count = 0, rank = -1;
  CHECK(ncclCommCount(survivors, &count));
  CHECK(ncclCommUserRank(survivors, &rank));
  if (count != kRanks - 1 || rank != gRank)
    return failed("shrunk: rank " + std::to_string(rank) + " of " + std::to_string(count));
  CHECK(sumOnce(survivors, rank, count, true));
  printf("rank %d: shrunk to %d ranks in %lld ms\n", gRank, count,
         static_cast<long long>(took.count()));

  // Revoked by rank 1: every rank's next collective is refused.
  if (rank == 1) {
    CHECK(ncclCommRevoke(survivors, NCCL_REVOKE_DEFAULT));
    if (ncclCommRevoke(survivors, NCCL_REVOKE_DEFAULT) != ncclInvalidArgument)
      failed("a second ncclCommRevoke was not refused");
  }
  result = ncclSuccess;
  for (int i = 0; i < 100000 && result == ncclSuccess; ++i)
    result = sumOnce(survivors, rank, count, false);
  if (result != ncclInvalidUsage)
    return failed(std::string("on the revoked communicator: ") + ncclGetErrorString(result));

  // Rank 0 leaves; ranks 1 and 2 shrink the revoked communicator,
  // nonblocking.
  if (rank == 0) {
    CHECK(ncclCommDestroy(survivors));
    return;
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  int leaving[] = {0};
  ncclComm_t pair = nullptr;
  result = ncclCommShrink(survivors, leaving, 1, &pair, &config, NCCL_SHRINK_DEFAULT);
  if (result != ncclSuccess && result != ncclInProgress)
    return failed(std::string("nonblocking shrink: ") + ncclGetErrorString(result));
  // Until it is done, every call but ncclCommGetAsyncError waits.
  auto settle = [](ncclComm_t comm, ncclResult_t* state) {
    *state = ncclInProgress;
    while (*state == ncclInProgress)
      if (ncclCommGetAsyncError(comm, state) != ncclSuccess) *state = ncclInternalError;
  };
  ncclResult_t state;
  settle(pair, &state);
  CHECK(state);
  CHECK(ncclCommCount(pair, &count));
  CHECK(ncclCommUserRank(pair, &rank));
  if (count != 2 || rank != gRank - 1)
    return failed("second shrink: rank " + std::to_string(rank) + " of " + std::to_string(count));
  std::vector<float> data(1024, static_cast<float>(rank + 1));
  result =
      ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat32, ncclSum, pair, nullptr);
  if (result != ncclSuccess && result != ncclInProgress) CHECK(result);
  settle(pair, &state);
  CHECK(state);
  if (data[0] != 3.0f) failed("all-reduce sum on the pair is " + std::to_string(data[0]));

  // A new process joins the pair.
  ncclUniqueId growId;
  if (rank == 0) {
    CHECK(ncclCommGetUniqueId(pair, &growId));
    gShared->growId = growId;
    gShared->growReady = 1;
  }
  ncclComm_t grown = nullptr;
  result = ncclCommGrow(pair, 3, rank == 0 ? &growId : nullptr, -1, &grown, nullptr);
  if (result != ncclSuccess && result != ncclInProgress) CHECK(result);
  settle(grown, &state);
  CHECK(state);
  CHECK(ncclCommCount(grown, &count));
  if (count != 3) failed("grown to " + std::to_string(count));
  std::vector<float> all(1024, static_cast<float>(rank + 1));
  result = ncclAllReduce(all.data(), all.data(), all.size(), ncclFloat32, ncclSum, grown, nullptr);
  if (result != ncclSuccess && result != ncclInProgress) CHECK(result);
  settle(grown, &state);
  CHECK(state);
  if (all[0] != 6.0f) failed("all-reduce sum after the grow is " + std::to_string(all[0]));
  CHECK(ncclCommDestroy(grown));
  CHECK(ncclCommDestroy(survivors));
  CHECK(ncclCommDestroy(pair));
}

// The process that joins the last two survivors.
void runNewRank() {
  while (gShared->growReady == 0) usleep(1000);
  ncclComm_t grown = nullptr;
  CHECK(ncclCommGrow(nullptr, 3, &gShared->growId, 2, &grown, nullptr));
  int rank = -1;
  CHECK(ncclCommUserRank(grown, &rank));
  if (rank != 2) failed("the new rank is " + std::to_string(rank));
  CHECK(sumOnce(grown, rank, 3, true));
  CHECK(ncclCommDestroy(grown));
}

}  // namespace

int main() {
  auto* shared = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (shared) Shared{};
  gShared = shared;
  std::vector<pid_t> pids;
  for (int r = 0; r < kRanks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      gRank = r;
      alarm(120);  // a hang fails the test instead of stalling it
      if (r == 0) {
        shared->ready = ncclGetUniqueId(&shared->id) == ncclSuccess ? 1 : -1;
      }
      while (shared->ready == 0) usleep(1000);
      if (shared->ready < 0) _exit(1);
      runRank(shared->id);
      if (gFailures == 0) printf("rank %d: every check passed\n", gRank);
      fflush(stdout);
      _exit(gFailures == 0 ? 0 : 1);
    }
    pids.push_back(pid);
  }
  const pid_t newcomer = fork();
  if (newcomer == 0) {
    gRank = kRanks;
    alarm(120);
    runNewRank();
    if (gFailures == 0) printf("the new rank: every check passed\n");
    fflush(stdout);
    _exit(gFailures == 0 ? 0 : 1);
  }
  int failedRanks = 0;
  int status = 0;
  waitpid(newcomer, &status, 0);
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    fprintf(stderr, "the new rank failed\n");
    ++failedRanks;
  }
  for (int r = 0; r < kRanks; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    const bool passed = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (r == kRanks - 1 ? !killed : !passed) {
      fprintf(stderr, "rank %d: %s\n", r, r == kRanks - 1 ? "was not killed" : "failed");
      ++failedRanks;
    }
  }
  return failedRanks == 0 ? 0 : 1;
}
