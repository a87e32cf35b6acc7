/* NCCL's parameter API (2.30) and ncclResetDebugInit, from C, against
 * braid's libnccl.so.2: values set in the environment read back typed, as
 * text and as raw bytes; NCCL's names read the knob they stand for; bad
 * keys, types and sizes are refused; the dump goes to the log file that a
 * reload of the logging variables names.
 *   nccl_params_program SCRATCH_DIR */
#define _GNU_SOURCE
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_check.h"

static int fileHas(const char* path, const char* text) {
  char line[4096];
  int found = 0;
  FILE* file = fopen(path, "r");
  if (!file) return 0;
  while (!found && fgets(line, sizeof(line), file)) found = strstr(line, text) != NULL;
  fclose(file);
  return found;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: nccl_params_program SCRATCH_DIR\n");
    return 2;
  }
  setenv("BRAID_SLOT_BYTES", "128K", 1);
  setenv("BRAID_TIMEOUT", "2m", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  unsetenv("BRAID_SOCKET_IFNAME");

  ncclParamHandle_t slot = NULL, timeout = NULL, ifname = NULL;
  EXPECT(ncclParamBind(&slot, "BRAID_SLOT_BYTES") == ncclSuccess, "bind BRAID_SLOT_BYTES");
  EXPECT(ncclParamBind(&timeout, "BRAID_TIMEOUT") == ncclSuccess, "bind BRAID_TIMEOUT");
  EXPECT(ncclParamBind(&ifname, "NCCL_SOCKET_IFNAME") == ncclSuccess, "bind NCCL_SOCKET_IFNAME");
  ncclParamHandle_t untouched = (ncclParamHandle_t)&failures;
  EXPECT(ncclParamBind(&untouched, "NCCL_NO_SUCH_PARAMETER") == ncclInvalidArgument,
         "an unknown key bound");
  EXPECT(untouched == (ncclParamHandle_t)&failures, "a refused bind changed *out");
  if (!slot || !timeout || !ifname) return 1;

  uint32_t u32 = 0;
  int64_t i64 = 0;
  int8_t i8 = 0;
  uint16_t u16 = 0;
  EXPECT(ncclParamGetU32(slot, &u32) == ncclSuccess && u32 == 131072, "128K read as %u", u32);
  EXPECT(ncclParamGetI64(timeout, &i64) == ncclSuccess && i64 == 120000, "2m read as %lld ms",
         (long long)i64);
  EXPECT(ncclParamGetI8(slot, &i8) == ncclInvalidArgument, "131072 fit an int8_t");
  EXPECT(ncclParamGetU16(slot, &u16) == ncclInvalidArgument, "131072 fit a uint16_t");
  EXPECT(ncclParamGetI32(ifname, (int32_t*)&u32) == ncclInvalidArgument, "\"lo\" read as a number");
  EXPECT(ncclParamGetI32(NULL, (int32_t*)&u32) == ncclInvalidArgument, "a NULL handle read");
  EXPECT(ncclParamGetU64(slot, NULL) == ncclInvalidArgument, "a NULL out written");

  const char* text = NULL;
  EXPECT(ncclParamGetStr(ifname, &text) == ncclSuccess && text && strcmp(text, "lo") == 0,
         "NCCL_SOCKET_IFNAME as text: %s", text ? text : "(null)");
  EXPECT(ncclParamGetStr(slot, &text) == ncclSuccess && strcmp(text, "128K") == 0,
         "BRAID_SLOT_BYTES as text: %s", text);
  /* The NCCL name reads the braid knob: set under braid's name, both agree. */
  setenv("BRAID_SOCKET_IFNAME", "eth9", 1);
  EXPECT(ncclParamGetStr(ifname, &text) == ncclSuccess && strcmp(text, "eth9") == 0,
         "NCCL_SOCKET_IFNAME after BRAID_SOCKET_IFNAME=eth9: %s", text);

  int len = 0;
  int valueLen = 0;
  char raw[16];
  EXPECT(ncclParamGet(slot, raw, sizeof(raw), &len) == ncclSuccess && len == 8,
         "raw BRAID_SLOT_BYTES took %d bytes", len);
  memcpy(&i64, raw, sizeof(i64));
  EXPECT(i64 == 131072, "raw BRAID_SLOT_BYTES is %lld", (long long)i64);
  EXPECT(ncclParamGet(ifname, raw, 2, &len) == ncclInvalidArgument && len == 5,
         "\"eth9\" fit 2 bytes (len %d)", len);
  EXPECT(ncclParamGet(ifname, raw, sizeof(raw), &len) == ncclSuccess && strcmp(raw, "eth9") == 0,
         "raw NCCL_SOCKET_IFNAME");
  EXPECT(ncclParamGetParameter("BRAID_TIMEOUT", &text, &valueLen) == ncclSuccess &&
             strcmp(text, "2m") == 0 && valueLen == 2,
         "BRAID_TIMEOUT by key: %s (%d)", text, valueLen);
  EXPECT(ncclParamGetParameter("NCCL_NO_SUCH_PARAMETER", &text, &valueLen) == ncclInvalidArgument,
         "an unknown key read");

  const char** keys = NULL;
  int count = 0, sawBraid = 0, sawNccl = 0;
  EXPECT(ncclParamGetAllParameterKeys(&keys, &count) == ncclSuccess && count > 20, "%d keys",
         count);
  for (int i = 0; i < count; ++i) {
    sawBraid |= strcmp(keys[i], "BRAID_SLOT_BYTES") == 0;
    sawNccl |= strcmp(keys[i], "NCCL_SOCKET_IFNAME") == 0;
    ncclParamHandle_t each = NULL;
    EXPECT(ncclParamBind(&each, keys[i]) == ncclSuccess, "listed key %s does not bind", keys[i]);
  }
  EXPECT(sawBraid && sawNccl, "the keys lack BRAID_SLOT_BYTES or NCCL_SOCKET_IFNAME");

  /* The dump goes to the log file a reload of the logging variables names. */
  char path[4096];
  snprintf(path, sizeof(path), "%s/params.log", argv[1]);
  remove(path);
  setenv("BRAID_LOG_FILE", path, 1);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* deprecated, and still NCCL's */
  ncclResetDebugInit();
#pragma GCC diagnostic pop
  ncclParamDumpAll();
  EXPECT(fileHas(path, "BRAID_SLOT_BYTES (bytes) = \"128K\""), "%s lacks BRAID_SLOT_BYTES's line",
         path);
  EXPECT(fileHas(path, "NCCL_SOCKET_IFNAME"), "%s lacks NCCL_SOCKET_IFNAME", path);
  remove(path);

  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("parameters: %d keys; typed, text, raw and dumped values as set\n", count);
  return 0;
}
