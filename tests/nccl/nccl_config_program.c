/* The per-collective configs (ncclAllReduceConfig and the like, NCCL
 * 2.32), from C, against braid's libnccl.so.2: three ranks driven by one
 * thread in groups run every config call with NCCL's algorithm names and
 * braid's, an older (shorter) config and no config, each result checked;
 * a config not made by the initializer, and a forced selection for a call
 * made of sends and receives, are refused at the call. */
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "c_check.h"

#define RANKS 3
#define COUNT 3000

static ncclComm_t comms[RANKS];
static float in[RANKS][RANKS * COUNT], out[RANKS][RANKS * COUNT];

static void fill(void) {
  for (int r = 0; r < RANKS; ++r)
    for (int i = 0; i < RANKS * COUNT; ++i) {
      in[r][i] = (float)(r + 1 + i % 7);
      out[r][i] = -1.0f;
    }
}

/* Every rank's all-reduce with `config`, grouped; then the sums checked. */
static void allReduce(const ncclCollConfig_t* config, const char* what) {
  fill();
  ncclResult_t result = ncclGroupStart();
  for (int r = 0; r < RANKS && result == ncclSuccess; ++r)
    result =
        ncclAllReduceConfig(in[r], out[r], COUNT, ncclFloat32, ncclSum, comms[r], NULL, config);
  ncclResult_t ended = ncclGroupEnd();
  EXPECT(result == ncclSuccess && ended == ncclSuccess, "all-reduce with %s", what);
  for (int r = 0; r < RANKS; ++r)
    for (int i = 0; i < COUNT; i += 101)
      EXPECT(out[r][i] == (float)(6 + 3 * (i % 7)), "all-reduce with %s: rank %d element %d is %g",
             what, r, i, out[r][i]);
}

int main(void) {
  EXPECT(ncclCommInitAll(comms, RANKS, NULL) == ncclSuccess, "ncclCommInitAll");
  if (failures) return 1;

  ncclCollConfig_t config = NCCL_COLLCONFIG_INITIALIZER;
  allReduce(NULL, "no config");
  allReduce(&config, "the initializer's config");
  config.algSelection = "Tree";
  allReduce(&config, "NCCL's Tree");
  config.algSelection = "allreduce:recdoubling";
  allReduce(&config, "braid's allreduce:recdoubling");
  config.algSelection = "NVLS"; /* nothing for a host: braid chooses */
  config.forceAlgSelection = 0;
  allReduce(&config, "NVLS unforced");
  config.minCTAs = 4; /* accepted, named under NCCL_DEBUG=INFO */
  config.userProfilerTag = 7;
  allReduce(&config, "kernel settings");

  /* A config of an earlier, shorter version: the rest takes the defaults. */
  ncclCollConfig_t older = NCCL_COLLCONFIG_INITIALIZER;
  older.size = offsetof(ncclCollConfig_t, algSelection);
  older.algSelection = "no such algorithm"; /* beyond its size: never read */
  allReduce(&older, "a shorter config");

  /* The other collectives, each with a selection it has. */
  config = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
  config.algSelection = "Ring";
  fill();
  EXPECT(ncclGroupStart() == ncclSuccess, "group");
  for (int r = 0; r < RANKS; ++r) {
    EXPECT(ncclBroadcastConfig(in[r], out[r], COUNT, ncclFloat32, 1, comms[r], NULL, &config) ==
               ncclSuccess,
           "ncclBroadcastConfig");
  }
  EXPECT(ncclGroupEnd() == ncclSuccess, "broadcast group");
  for (int r = 0; r < RANKS; ++r) EXPECT(out[r][10] == in[1][10], "broadcast at rank %d", r);
  fill();
  EXPECT(ncclGroupStart() == ncclSuccess, "group");
  for (int r = 0; r < RANKS; ++r)
    EXPECT(ncclReduceConfig(in[r], out[r], COUNT, ncclFloat32, ncclMax, 2, comms[r], NULL,
                            &config) == ncclSuccess,
           "ncclReduceConfig");
  EXPECT(ncclGroupEnd() == ncclSuccess, "reduce group");
  EXPECT(out[2][10] == in[2][10], "reduce's max at the root is %g", out[2][10]);
  fill();
  EXPECT(ncclGroupStart() == ncclSuccess, "group");
  for (int r = 0; r < RANKS; ++r)
    EXPECT(ncclAllGatherConfig(in[r], out[r], COUNT, ncclFloat32, comms[r], NULL, &config) ==
               ncclSuccess,
           "ncclAllGatherConfig");
  EXPECT(ncclGroupEnd() == ncclSuccess, "all-gather group");
  EXPECT(out[0][2 * COUNT + 5] == in[2][5], "all-gather's third part");
  fill();
  EXPECT(ncclGroupStart() == ncclSuccess, "group");
  for (int r = 0; r < RANKS; ++r)
    EXPECT(ncclReduceScatterConfig(in[r], out[r], COUNT, ncclFloat32, ncclSum, comms[r], NULL,
                                   &config) == ncclSuccess,
           "ncclReduceScatterConfig");
  EXPECT(ncclGroupEnd() == ncclSuccess, "reduce-scatter group");
  EXPECT(out[1][0] == in[0][COUNT] + in[1][COUNT] + in[2][COUNT], "reduce-scatter's part");

  /* Calls made of sends and receives: an unforced selection, or none. */
  config.forceAlgSelection = 0;
  fill();
  EXPECT(ncclGroupStart() == ncclSuccess, "group");
  for (int r = 0; r < RANKS; ++r)
    EXPECT(ncclAlltoAllConfig(in[r], out[r], COUNT, ncclFloat32, comms[r], NULL, &config) ==
               ncclSuccess,
           "ncclAlltoAllConfig");
  EXPECT(ncclGroupEnd() == ncclSuccess, "all-to-all group");
  EXPECT(out[1][5] == in[0][COUNT + 5], "all-to-all's part from rank 0 at rank 1 is %g", out[1][5]);
  fill();
  EXPECT(ncclGroupStart() == ncclSuccess, "group");
  for (int r = 0; r < RANKS; ++r)
    EXPECT(
        ncclGatherConfig(in[r], out[r], COUNT, ncclFloat32, 0, comms[r], NULL, NULL) == ncclSuccess,
        "ncclGatherConfig");
  EXPECT(ncclGroupEnd() == ncclSuccess, "gather group");
  EXPECT(out[0][2 * COUNT + 5] == in[2][5], "gather's part from rank 2 is %g",
         out[0][2 * COUNT + 5]);
  fill();
  EXPECT(ncclGroupStart() == ncclSuccess, "group");
  for (int r = 0; r < RANKS; ++r)
    EXPECT(ncclScatterConfig(in[r], out[r], COUNT, ncclFloat32, 0, comms[r], NULL, &config) ==
               ncclSuccess,
           "ncclScatterConfig");
  EXPECT(ncclGroupEnd() == ncclSuccess, "scatter group");
  EXPECT(out[1][5] == in[0][COUNT + 5], "the scatter's part at rank 1 is %g", out[1][5]);

  /* Refused at the call, before anything is issued. */
  config.forceAlgSelection = 1;
  EXPECT(ncclAlltoAllConfig(in[0], out[0], COUNT, ncclFloat32, comms[0], NULL, &config) ==
             ncclInvalidArgument,
         "a forced selection for all-to-all was taken");
  ncclCollConfig_t raw;
  memset(&raw, 0, sizeof(raw));
  EXPECT(ncclAllReduceConfig(in[0], out[0], COUNT, ncclFloat32, ncclSum, comms[0], NULL, &raw) ==
             ncclInvalidArgument,
         "a config not made by the initializer was taken");
  config.algSelection = "Ring,Fastest";
  EXPECT(ncclAllReduceConfig(in[0], out[0], COUNT, ncclFloat32, ncclSum, comms[0], NULL, &config) ==
             ncclInvalidArgument,
         "an unknown algorithm was taken");
  /* ... and the communicators still work. */
  allReduce(NULL, "no config, after the refusals");

  for (int r = 0; r < RANKS; ++r) ncclCommDestroy(comms[r]);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("per-collective configs: every call right, bad configs refused\n");
  return 0;
}
