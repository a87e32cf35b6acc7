/* Prints the ABI facts of whichever nccl.h it was compiled against: the
 * version macros, every enum value, sizeof(ncclUniqueId) and the size and
 * field offsets of ncclConfig_t. Built against braid's header and against
 * NCCL's own; the outputs must be identical (tests/nccl/check_abi.sh). */
#include <nccl.h>
#include <stddef.h>
#include <stdio.h>

#define SHOW(x) printf("%s = %lld\n", #x, (long long)(x))
#define FIELD(f) printf("offsetof(ncclConfig_t, %s) = %zu\n", #f, offsetof(ncclConfig_t, f))

int main(void) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  SHOW(NCCL_MAJOR);
  SHOW(NCCL_MINOR);
  SHOW(NCCL_PATCH);
  SHOW(NCCL_VERSION_CODE);
  SHOW(NCCL_VERSION(2, 8, 4));
  SHOW(NCCL_VERSION(2, 28, 9));
  SHOW(NCCL_VERSION(2, 32, 6));
  SHOW(NCCL_UNIQUE_ID_BYTES);
  SHOW(sizeof(ncclUniqueId));
  SHOW(sizeof(ncclComm_t));
  SHOW(sizeof(ncclResult_t));
  SHOW(sizeof(ncclDataType_t));
  SHOW(sizeof(ncclRedOp_t));
  SHOW(ncclSuccess);
  SHOW(ncclUnhandledCudaError);
  SHOW(ncclSystemError);
  SHOW(ncclInternalError);
  SHOW(ncclInvalidArgument);
  SHOW(ncclInvalidUsage);
  SHOW(ncclRemoteError);
  SHOW(ncclInProgress);
  SHOW(ncclTimeout);
  SHOW(ncclNumResults);
  SHOW(ncclInt8);
  SHOW(ncclChar);
  SHOW(ncclUint8);
  SHOW(ncclInt32);
  SHOW(ncclInt);
  SHOW(ncclUint32);
  SHOW(ncclInt64);
  SHOW(ncclUint64);
  SHOW(ncclFloat16);
  SHOW(ncclHalf);
  SHOW(ncclFloat32);
  SHOW(ncclFloat);
  SHOW(ncclFloat64);
  SHOW(ncclDouble);
  SHOW(ncclBfloat16);
  SHOW(ncclFloat8e4m3);
  SHOW(ncclFloat8e5m2);
  SHOW(ncclNumTypes);
  SHOW(ncclSum);
  SHOW(ncclProd);
  SHOW(ncclMax);
  SHOW(ncclMin);
  SHOW(ncclAvg);
  SHOW(ncclNumOps);
  SHOW(ncclMaxRedOp);
  SHOW(ncclScalarDevice);
  SHOW(ncclScalarHostImmediate);
  SHOW(NCCL_CONFIG_UNDEF_INT);
  SHOW(NCCL_SPLIT_NOCOLOR);
  SHOW(NCCL_WIN_COLL_SYMMETRIC);
  SHOW(NCCL_WIN_REQUIRED_ALIGNMENT);
  SHOW(NCCL_CTA_POLICY_ZERO);
  SHOW(NCCL_SHRINK_ABORT);
  SHOW(sizeof(ncclConfig_t));
  FIELD(size);
  FIELD(magic);
  FIELD(version);
  FIELD(blocking);
  FIELD(cgaClusterSize);
  FIELD(minCTAs);
  FIELD(maxCTAs);
  FIELD(netName);
  FIELD(splitShare);
  FIELD(trafficClass);
  FIELD(commName);
  FIELD(collnetEnable);
  FIELD(CTAPolicy);
  FIELD(shrinkShare);
  FIELD(nvlsCTAs);
  FIELD(nChannelsPerNetPeer);
  FIELD(nvlinkCentricSched);
  FIELD(graphUsageMode);
  FIELD(numRmaCtx);
  FIELD(maxP2pPeers);
  FIELD(graphStreamOrdering);
  FIELD(launchOrderImplicit);
  FIELD(numRmaSig);
  FIELD(rmaEagerInit);
  FIELD(hostCftMode);
  FIELD(nvlsHostMode);
  SHOW(config.size);
  SHOW(config.magic);
  SHOW(config.version);
  SHOW(config.blocking);
  SHOW(config.nvlinkCentricSched);
  SHOW(config.nvlsHostMode);
  SHOW(sizeof(ncclWaitSignalDesc_t));
  SHOW(config.netName == NULL);
  SHOW(sizeof(ncclSimInfo_t));
  SHOW(sim.magic);
  SHOW(sim.version);
  return 0;
}
