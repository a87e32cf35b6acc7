/* ncclSetEncryption (NCCL 2.32), from C, against braid's libnccl.so.2: bad
 * configs are refused naming what is wrong; with a pre-shared key, three
 * processes (every pair on tcp) all-reduce over encrypted sockets; a
 * process that holds another key never joins, so its job fails rather than
 * run in the clear; and once sockets carry the choice, it stays.
 *
 * The ranks are this program run again ("rank ID RANK NRANKS KEY"), each
 * a fresh process that makes its own choice before its first socket. */
#define _GNU_SOURCE
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "c_check.h"

#define COUNT (256 * 1024)

static const char kKey[] = "0123456789abcdef0123456789abcdef-job-key";
static const char kOtherKey[] = "fedcba9876543210fedcba9876543210-not-this-job";

static int lastErrorHas(const char* text) { return strstr(ncclGetLastError(NULL), text) != NULL; }

static ncclResult_t setKey(const char* key) {
  ncclEncryptionConfig_t config = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  config.mode = key ? NCCL_ENCRYPTION_MODE_PSK : NCCL_ENCRYPTION_MODE_NONE;
  config.psk = key;
  return ncclSetEncryption(&config);
}

static void toHex(const ncclUniqueId* id, char* hex) {
  for (size_t i = 0; i < sizeof(id->internal); ++i)
    sprintf(hex + 2 * i, "%02x", (unsigned char)id->internal[i]);
}

static void fromHex(const char* hex, ncclUniqueId* id) {
  for (size_t i = 0; i < sizeof(id->internal); ++i) {
    unsigned byte = 0;
    sscanf(hex + 2 * i, "%2x", &byte);
    id->internal[i] = (char)byte;
  }
}

/* One rank: its key, then init, a checked all-reduce, destroy. Exits 0 on
 * success, 2 when init failed, 1 on a wrong result. */
static int runRank(const char* hex, int rank, int nranks, const char* key) {
  ncclUniqueId id;
  fromHex(hex, &id);
  if (setKey(key) != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclSetEncryption: %s\n", rank, ncclGetLastError(NULL));
    return 1;
  }
  ncclComm_t comm = NULL;
  if (ncclCommInitRank(&comm, nranks, id, rank) != ncclSuccess) {
    fprintf(stderr, "rank %d: init failed as it should: %s\n", rank, ncclGetLastError(NULL));
    return 2;
  }
  float* values = malloc(COUNT * sizeof(float));
  for (int i = 0; i < COUNT; ++i) values[i] = (float)(rank + 1 + i % 7);
  int bad = ncclAllReduce(values, values, COUNT, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess;
  const float ranks = (float)(nranks * (nranks + 1) / 2);
  for (int i = 0; i < COUNT && !bad; ++i) bad = values[i] != ranks + (float)(nranks * (i % 7));
  free(values);
  if (bad) fprintf(stderr, "rank %d: the all-reduce was wrong: %s\n", rank, ncclGetLastError(comm));
  ncclCommDestroy(comm);
  return bad;
}

/* Runs a job of `nranks` processes, rank r holding keys[r]; puts each
 * one's exit status in status[r]. */
static void runJob(const char* self, int nranks, const char* const* keys, int* status) {
  ncclUniqueId id;
  EXPECT(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
  char hex[2 * sizeof(id.internal) + 1];
  toHex(&id, hex);
  pid_t pids[8];
  for (int r = 0; r < nranks; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      char rank[16], size[16];
      snprintf(rank, sizeof(rank), "%d", r);
      snprintf(size, sizeof(size), "%d", nranks);
      execl(self, self, "rank", hex, rank, size, keys[r], (char*)NULL);
      _exit(127);
    }
  }
  for (int r = 0; r < nranks; ++r) {
    int wstatus = 0;
    waitpid(pids[r], &wstatus, 0);
    status[r] = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  }
}

int main(int argc, char** argv) {
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("BRAID_TRANSPORT", "tcp", 1); /* every pair on tcp, so the data is encrypted too */
  if (argc == 6 && strcmp(argv[1], "rank") == 0)
    return runRank(argv[2], atoi(argv[3]), atoi(argv[4]), argv[5]);

  EXPECT(ncclSetEncryption(NULL) == ncclInvalidArgument && lastErrorHas("'config'"),
         "a NULL config was not refused naming it");
  ncclEncryptionConfig_t config = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  EXPECT(config.mode == NCCL_ENCRYPTION_MODE_NONE && config.psk == NULL,
         "the initializer is not plaintext without a key");
  EXPECT(ncclSetEncryption(&config) == ncclSuccess, "plaintext was refused");
  ncclEncryptionConfig_t hand;
  memset(&hand, 0, sizeof(hand));
  hand.size = sizeof(hand);
  EXPECT(ncclSetEncryption(&hand) == ncclInvalidArgument && lastErrorHas("INITIALIZER"),
         "a config not made by the initializer was accepted");
  config.mode = 7;
  EXPECT(ncclSetEncryption(&config) == ncclInvalidArgument && lastErrorHas("config->mode is 7"),
         "mode 7 was accepted");
  config.mode = NCCL_ENCRYPTION_MODE_PSK;
  EXPECT(ncclSetEncryption(&config) == ncclInvalidArgument && lastErrorHas("config->psk is NULL"),
         "a PSK mode without a key was accepted");
  config.psk = "too-short";
  EXPECT(ncclSetEncryption(&config) == ncclInvalidArgument && lastErrorHas("at least 32"),
         "a 9-byte key was accepted");

  /* The key, before the unique id (its root takes the ranks' connections). */
  EXPECT(setKey(kKey) == ncclSuccess, "a 40-byte key was refused");
  int status[3];
  const char* const sameKeys[3] = {kKey, kKey, kKey};
  runJob(argv[0], 3, sameKeys, status);
  for (int r = 0; r < 3; ++r)
    EXPECT(status[r] == 0, "rank %d of the encrypted job exited with %d", r, status[r]);

  /* Rank 1 holds another key: nobody gets a byte from it, and the job
   * fails (BRAID_TIMEOUT bounds the wait of rank 0, which it never joins). */
  setenv("BRAID_TIMEOUT", "5s", 1);
  const time_t start = time(NULL);
  const char* const mixedKeys[2] = {kKey, kOtherKey};
  runJob(argv[0], 2, mixedKeys, status);
  EXPECT(status[0] == 2 && status[1] == 2,
         "a job whose rank 1 holds another key: the ranks exited with %d and %d, not 2 (init "
         "failed)",
         status[0], status[1]);
  EXPECT(time(NULL) - start < 30, "the failing job took %ld s", (long)(time(NULL) - start));

  /* This process's root carried encrypted connections: plaintext is now
   * refused, and the same key again accepted. */
  EXPECT(setKey(NULL) == ncclInvalidUsage && lastErrorHas("already made encrypted"),
         "a change to plaintext after encrypted sockets was accepted");
  EXPECT(setKey(kKey) == ncclSuccess, "the same key again was refused");

  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf(
      "encryption: 5 bad configs refused, 3 ranks all-reduced over TLS, a rank with another "
      "key kept out, the choice kept\n");
  return 0;
}
