/* NCCL's suspending calls (ncclCommSuspend, ncclCommResume,
 * ncclCommMemStats), from C, against braid's libnccl.so.2: three ranks of
 * one thread (ncclCommInitAll, host buffers) suspend together, are refused
 * calls while suspended, resume and run on; the statistics read back, and
 * bad arguments are refused. */
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "c_check.h"

#define RANKS 3

static ncclComm_t comms[RANKS];

static int allReduce(float expect) {
  float values[RANKS];
  ncclResult_t result = ncclGroupStart();
  for (int r = 0; r < RANKS && result == ncclSuccess; ++r) {
    values[r] = 1.0f;
    result = ncclAllReduce(&values[r], &values[r], 1, ncclFloat32, ncclSum, comms[r], NULL);
  }
  ncclResult_t ended = ncclGroupEnd();
  if (result != ncclSuccess) return result;
  if (ended != ncclSuccess) return ended;
  for (int r = 0; r < RANKS; ++r) EXPECT(values[r] == expect, "rank %d's sum is %g", r, values[r]);
  return ncclSuccess;
}

/* Each rank's call of `suspend` (1) or resume (0), grouped: every rank
 * takes part at once. */
static ncclResult_t everyRank(int suspend, int flags) {
  ncclResult_t result = ncclGroupStart();
  for (int r = 0; r < RANKS && result == ncclSuccess; ++r)
    result = suspend ? ncclCommSuspend(comms[r], flags) : ncclCommResume(comms[r]);
  ncclResult_t ended = ncclGroupEnd();
  return result != ncclSuccess ? result : ended;
}

int main(void) {
  EXPECT(ncclCommInitAll(comms, RANKS, NULL) == ncclSuccess, "ncclCommInitAll");
  if (failures) return 1;
  EXPECT(allReduce(3.0f) == ncclSuccess, "all-reduce before suspending");

  uint64_t value = 99;
  EXPECT(ncclCommMemStats(comms[0], ncclStatGpuMemTotal, &value) == ncclSuccess && value == 0,
         "host buffers only: %llu bytes of device memory", (unsigned long long)value);
  EXPECT(ncclCommMemStats(comms[0], ncclStatGpuMemSuspended, &value) == ncclSuccess && value == 0,
         "suspended before suspending");
  EXPECT(ncclCommMemStats(comms[0], (ncclCommMemStat_t)7, &value) == ncclInvalidArgument,
         "a stat that is none");
  EXPECT(strstr(ncclGetLastError(comms[0]), "'stat' is 7") != NULL, "names the stat");
  EXPECT(ncclCommMemStats(comms[0], ncclStatGpuMemTotal, NULL) == ncclInvalidArgument,
         "a NULL value");
  EXPECT(ncclCommSuspend(comms[0], 0x6) == ncclInvalidArgument, "unknown suspend flags");

  /* Flags 0: nothing is suspended. */
  EXPECT(everyRank(1, 0) == ncclSuccess, "suspend with no flags");
  EXPECT(allReduce(3.0f) == ncclSuccess, "all-reduce after a suspend with no flags");

  EXPECT(everyRank(1, NCCL_SUSPEND_MEM) == ncclSuccess, "ncclCommSuspend");
  for (int r = 0; r < RANKS; ++r)
    EXPECT(ncclCommMemStats(comms[r], ncclStatGpuMemSuspended, &value) == ncclSuccess && value == 1,
           "rank %d is not suspended", r);
  float x = 1.0f;
  EXPECT(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comms[0], NULL) == ncclInvalidUsage,
         "a call on a suspended communicator");
  EXPECT(strstr(ncclGetLastError(comms[0]), "suspended") != NULL, "says why");
  EXPECT(everyRank(0, 0) == ncclSuccess, "ncclCommResume");
  EXPECT(everyRank(0, 0) == ncclSuccess, "ncclCommResume when not suspended");
  EXPECT(ncclCommMemStats(comms[1], ncclStatGpuMemSuspended, &value) == ncclSuccess && value == 0,
         "still suspended after resuming");
  EXPECT(allReduce(3.0f) == ncclSuccess, "all-reduce after resuming");

  for (int r = 0; r < RANKS; ++r) EXPECT(ncclCommDestroy(comms[r]) == ncclSuccess, "destroy");
  if (!failures) printf("suspend, resume and memory statistics: every check passed\n");
  return failures != 0;
}
