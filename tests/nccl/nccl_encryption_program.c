/* ncclSetEncryption (NCCL 2.32), from C, against braid's libnccl.so.2:
 * plaintext is accepted; a pre-shared key is refused with ncclInvalidUsage
 * saying braid does not encrypt (no silent plaintext); bad configs are
 * refused naming what is wrong; a communicator works afterwards. */
#define _GNU_SOURCE
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_check.h"

static int lastErrorHas(const char* text) { return strstr(ncclGetLastError(NULL), text) != NULL; }

int main(void) {
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
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
  config.psk = "0123456789abcdef0123456789abcdef-job-key";
  EXPECT(ncclSetEncryption(&config) == ncclInvalidUsage && lastErrorHas("does not encrypt"),
         "a key was not refused as one braid cannot honour");

  /* Nothing changed: a communicator of one rank all-reduces. */
  ncclComm_t comm = NULL;
  int device = 0;
  EXPECT(ncclCommInitAll(&comm, 1, &device) == ncclSuccess, "ncclCommInitAll");
  float value = 3.0f;
  EXPECT(ncclAllReduce(&value, &value, 1, ncclFloat32, ncclSum, comm, NULL) == ncclSuccess &&
             value == 3.0f,
         "the all-reduce after the refusals gave %g", value);
  EXPECT(ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy");

  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("encryption: plaintext accepted, a key and 4 bad configs refused\n");
  return 0;
}
