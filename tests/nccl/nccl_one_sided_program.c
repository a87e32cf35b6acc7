/* NCCL's one-sided calls (ncclPutSignal, ncclSignal, ncclWaitSignal), from
 * C, against braid's libnccl.so.2: three forked ranks register two host
 * windows (one from ncclMemAlloc, one from malloc), put into their ring
 * neighbour's with a signal and wait for their other neighbour's, over
 * two contexts (config numRmaCtx); then the refusals, and ncclTimeout from
 * a wait nobody answers (BRAID_TIMEOUT is 4 s here). */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "c_check.h"

#define RANKS 3
#define COUNT 100000

/* Rank 0 writes a byte for each other rank here once it timed out. */
static int timedOut[2];

static int rank_(ncclUniqueId id, int rank) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.numRmaCtx = 2;
  ncclComm_t comm;
  EXPECT(ncclCommInitRankConfig(&comm, RANKS, id, rank, &config) == ncclSuccess, "init");
  if (failures) return 1;
  const int next = (rank + 1) % RANKS, prev = (rank + RANKS - 1) % RANKS;
  const size_t bytes = COUNT * sizeof(int);
  int* mapped = NULL;
  int* plain = malloc(bytes);
  int* data = malloc(bytes);
  EXPECT(ncclMemAlloc((void**)&mapped, bytes) == ncclSuccess, "ncclMemAlloc");
  ncclWindow_t windows[2];
  EXPECT(ncclCommWindowRegister(comm, mapped, bytes, &windows[0], NCCL_WIN_COLL_SYMMETRIC) ==
             ncclSuccess,
         "register the ncclMemAlloc window");
  EXPECT(ncclCommWindowRegister(comm, plain, bytes, &windows[1], NCCL_WIN_DEFAULT) == ncclSuccess,
         "register the malloc window");
  void* user = NULL;
  EXPECT(ncclWinGetUserPtr(comm, windows[1], &user) == ncclSuccess && user == plain,
         "ncclWinGetUserPtr");

  for (int w = 0; w < 2; ++w) {
    int* window = w == 0 ? mapped : plain;
    for (int i = 0; i < COUNT; ++i) data[i] = rank * 1000000 + w * 100000 + i;
    /* The first half with context w's signal, the second half after it,
     * then a bare signal on the other context. */
    EXPECT(ncclPutSignal(data, COUNT / 2, ncclInt32, next, windows[w], 0, 0, w, 0, comm, NULL) ==
               ncclSuccess,
           "ncclPutSignal");
    EXPECT(ncclPutSignal(data + COUNT / 2, COUNT / 2, ncclInt32, next, windows[w],
                         COUNT / 2 * sizeof(int), 0, w, 0, comm, NULL) == ncclSuccess,
           "ncclPutSignal");
    EXPECT(ncclSignal(next, 0, 1 - w, 0, comm, NULL) == ncclSuccess, "ncclSignal");
    ncclWaitSignalDesc_t descs[2] = {{2, prev, 0, w}, {1, prev, 0, 1 - w}};
    EXPECT(ncclWaitSignal(2, descs, comm, NULL) == ncclSuccess, "ncclWaitSignal");
    for (int i = 0; i < COUNT; i += 997)
      EXPECT(window[i] == prev * 1000000 + w * 100000 + i, "window %d element %d is %d", w, i,
             window[i]);
  }

  /* The refusals: each names what is wrong; nothing changes. */
  int one = 1;
  ncclWaitSignalDesc_t bad = {0, prev, 0, 0};
  const struct {
    ncclResult_t got, want;
    const char* needle;
  } refusals[] = {
      {ncclPutSignal(&one, 1, ncclInt32, next, windows[0], 0, 0, 2, 0, comm, NULL),
       ncclInvalidArgument, "ctx is 2"},
      {ncclPutSignal(&one, 1, ncclInt32, next, windows[0], 0, 1, 0, 0, comm, NULL),
       ncclInvalidArgument, "sigIdx is 1"},
      {ncclPutSignal(&one, 1, ncclInt32, next, NULL, 0, 0, 0, 0, comm, NULL), ncclInvalidArgument,
       "peerWin"},
      {ncclPutSignal(&one, 1, ncclInt32, next, windows[0], bytes, 0, 0, 0, comm, NULL),
       ncclInvalidArgument, "offset"},
      {ncclSignal(next, 0, 0, 4, comm, NULL), ncclInvalidArgument, "flags"},
      {ncclWaitSignal(1, &bad, comm, NULL), ncclInvalidArgument, "opCnt is 0"},
      {ncclWaitSignal(0, &bad, comm, NULL), ncclInvalidArgument, "nDesc"},
  };
  for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; ++i) {
    EXPECT(refusals[i].got == refusals[i].want, "refusal %zu returned %s", i,
           ncclGetErrorString(refusals[i].got));
  }
  EXPECT(strstr(ncclGetLastError(comm), "nDesc") != NULL, "the last refusal's message");

  EXPECT(ncclCommWindowDeregister(comm, windows[1]) == ncclSuccess, "deregister");
  EXPECT(ncclCommWindowDeregister(comm, windows[0]) == ncclSuccess, "deregister");
  int sum = 1;
  EXPECT(
      ncclAllReduce(&sum, &sum, 1, ncclInt32, ncclSum, comm, NULL) == ncclSuccess && sum == RANKS,
      "all-reduce after the one-sided calls");

  /* A wait nobody answers passes the timeout: ncclTimeout. */
  if (rank == 0) {
    ncclWaitSignalDesc_t never = {1, 1, 0, 0};
    ncclResult_t result = ncclWaitSignal(1, &never, comm, NULL);
    EXPECT(result == ncclTimeout, "a wait past the timeout returned %s",
           ncclGetErrorString(result));
    EXPECT(strstr(ncclGetErrorString(ncclTimeout), "timeout") != NULL, "ncclTimeout's string");
  }
  /* The others stay until rank 0 timed out (a peer leaving ends its wait
   * with ncclRemoteError). */
  char byte = 0;
  if (rank == 0) {
    for (int r = 1; r < RANKS; ++r) EXPECT(write(timedOut[1], &byte, 1) == 1, "write");
  } else {
    EXPECT(read(timedOut[0], &byte, 1) == 1, "read");
  }
  ncclCommDestroy(comm);
  ncclMemFree(mapped);
  free(plain);
  free(data);
  return failures != 0;
}

/* The job's id, which rank 0 makes and the others wait for: the parent
 * starts no thread before it forks (ncclGetUniqueId starts the bootstrap
 * root's), since a child of a threaded process inherits the locks other
 * threads held, an allocator's among them, and may hang on one. */
struct SharedId {
  volatile int ready; /* 0: not yet; 1: made; -1: failed */
  ncclUniqueId id;
};

static int idOf(struct SharedId* shared, int rank, ncclUniqueId* id) {
  if (rank == 0) {
    const int made = ncclGetUniqueId(&shared->id) == ncclSuccess;
    EXPECT(made, "ncclGetUniqueId");
    __atomic_store_n(&shared->ready, made ? 1 : -1, __ATOMIC_RELEASE);
  }
  while (__atomic_load_n(&shared->ready, __ATOMIC_ACQUIRE) == 0) usleep(1000);
  *id = shared->id;
  return shared->ready == 1;
}

int main(void) {
  setenv("BRAID_TIMEOUT", "4s", 1);
  EXPECT(pipe(timedOut) == 0, "pipe");
  struct SharedId* shared =
      mmap(NULL, sizeof(*shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT(shared != MAP_FAILED, "mmap");
  if (failures) return 1;
  memset(shared, 0, sizeof(*shared));
  pid_t pids[RANKS];
  for (int r = 0; r < RANKS; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      alarm(120); /* a hang fails the test instead of stalling it */
      ncclUniqueId id;
      _exit(idOf(shared, r, &id) ? rank_(id, r) : 1);
    }
  }
  int failed = 0;
  for (int r = 0; r < RANKS; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "rank %d failed (status %d)\n", r, status);
      failed = 1;
    }
  }
  if (!failed) printf("one-sided calls: %d ranks passed\n", RANKS);
  return failed;
}
