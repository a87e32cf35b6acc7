/* braid's NCCL-compatible C API.
 *
 * A program written against NCCL compiles against this header unchanged and
 * runs against braid's libnccl.so.2 (build/lib). The types, values and
 * struct layouts are those of NCCL 2.32, so a binary built against NCCL's
 * own header runs on braid too; configs of earlier versions are read as far
 * as their size goes. Buffers may be host memory: braid then runs the
 * operation on the CPU, and the stream argument is not used.
 *
 * What braid cannot do returns ncclInvalidUsage, with the reason in
 * ncclGetLastError(). */
#ifndef NCCL_H_
#define NCCL_H_

/* cudaStream_t comes from CUDA's runtime header where it can be found; a
 * build without CUDA declares the same type itself. */
#if !defined(CUDART_VERSION) && !defined(BRAID_NCCL_NO_CUDA) && defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#include <cuda_runtime.h>
#endif
#endif
#ifndef CUDART_VERSION
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
#elif !defined(BRAID_NCCL_NO_CUDA)
/* With CUDA, its narrow float types too, as NCCL's own header has them
 * (programs written against it use half without including it). */
#include <cuda_fp16.h>
#if CUDART_VERSION >= 11000
#include <cuda_bf16.h>
#endif
#if defined(__cplusplus) && CUDART_VERSION >= 11080
#include <cuda_fp8.h>
#endif
#endif

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 32
#define NCCL_PATCH 6
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE 23206
/* Version numbers up to 2.8 had two digits for the minor number. */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))

/* Set by braid's header only: lets a program tell which library it built against. */
#define BRAID_NCCL 1

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm* ncclComm_t;
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_COMM_NULL NULL

/* Names a job; made by ncclGetUniqueId on one rank and shipped to the others
 * as 128 raw bytes. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6, /* a peer failed, closed or stopped answering */
  ncclInProgress = 7,  /* a nonblocking communicator is still working */
  ncclTimeout = 8,     /* a wait passed the communicator's timeout */
  ncclNumResults = 9
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
/* Accepted; braid's windows keep issue order and serve every use anyway. */
#define NCCL_WIN_STRICT_ORDERING 0x02
#define NCCL_WIN_GIN_ONLY 0x04
#define NCCL_WIN_CFT_COUNTED 0x08
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

#define NCCL_REVOKE_DEFAULT 0x00

/* Values of ncclConfig_t's hostCftMode and nvlsHostMode (NVLink SHARP and
 * fabric settings of NVIDIA's kernels: accepted, not used). */
typedef enum {
  ncclHostCftDefault = NCCL_CONFIG_UNDEF_INT,
  ncclHostCftEnable = 1,
  ncclHostCftDisable = 2,
  ncclHostCftFallback = 3
} ncclHostCftMode_t;

typedef enum {
  ncclNvlsHostModeDefault = NCCL_CONFIG_UNDEF_INT,
  ncclNvlsHostModeEnable = 0,
  ncclNvlsHostModeDisableTransport = 1 << 0,
  ncclNvlsHostModeDisableSymmetricMultimem = 1 << 1,
  ncclNvlsHostModeDisable = INT_MAX
} ncclNvlsHostMode_t;

/* Options for a new communicator; start from NCCL_CONFIG_INITIALIZER. braid
 * reads `blocking` (0: calls return ncclInProgress and finish in the
 * background), `commName` (shown in braid's logs), and `numRmaCtx` and
 * `numRmaSig` (how many contexts and signal indices ncclPutSignal may use,
 * 1 each by default; 0 contexts turns one-sided calls off). The GPU kernel,
 * graph and NVLS settings (CTAs, cluster size, graphUsageMode, ...) are
 * accepted and, under NCCL_DEBUG=INFO, named as not used. */
typedef struct ncclConfig_v23100 {
  size_t size; /* these three are set by the initializer */
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  int graphUsageMode;
  int numRmaCtx;
  int maxP2pPeers;
  int graphStreamOrdering;
  int launchOrderImplicit;
  int numRmaSig;
  int rmaEagerInit;
  int hostCftMode;
  int nvlsHostMode;
} ncclConfig_t;

/* Checked in the versioned structs. */
#define NCCL_API_MAGIC 0xcafebeef

#define NCCL_CONFIG_INITIALIZER                                                                    \
  {                                                                                                \
    sizeof(ncclConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE, NCCL_CONFIG_UNDEF_INT,                \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                       \
        NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                       \
        NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                       \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                       \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                       \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                       \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT \
  }

/* A vendor's option for one call, in a list hung from ncclCollConfig_t's
 * `ext`. braid has none of its own and reads none. */
typedef struct ncclConfigExt {
  struct ncclConfigExt* next;
  struct {
    int vendorId;
    int optionId;
  } key;
  union {
    int i;
    const char* s;
    void* raw;
  } val;
} ncclConfigExt_t;

/* Options for one collective (the nccl*Config calls, NCCL 2.32); start
 * from NCCL_COLLCONFIG_INITIALIZER. braid reads `algSelection` (NCCL_ALGO's
 * names, "Ring", "^Tree", "allreduce:tree;broadcast:ring", or braid's own,
 * as BRAID_ALGO takes them) and `forceAlgSelection` (1: a call the
 * selection has no algorithm for is ncclInvalidArgument; 0: braid chooses
 * then). The kernel settings (CTAs, cluster size, CTA policy), the profiler
 * tag and the launch completion event are accepted and, under
 * NCCL_DEBUG=INFO, named as not used. */
typedef struct ncclCollConfig_v23200 {
  size_t size; /* these three are set by the initializer */
  unsigned int magic;
  unsigned int version;
  ncclConfigExt_t* ext;
  int minCTAs;
  int maxCTAs;
  int nvlsCTAs;
  int cgaClusterSize;
  const char* algSelection;
  int forceAlgSelection;
  int CTAPolicy;
  uint64_t userProfilerTag;
  cudaEvent_t launchCompletionEvent;
} ncclCollConfig_t;

#define NCCL_COLLCONFIG_INITIALIZER                                                     \
  {                                                                                     \
    sizeof(ncclCollConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE, NCCL_CONFIG_UNDEF_PTR, \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, 1, NCCL_CONFIG_UNDEF_INT, 0,      \
        NCCL_CONFIG_UNDEF_PTR                                                           \
  }

/* What ncclGroupSimulateEnd reports. */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER                                                        \
  {                                                                                      \
    sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), \
        NCCL_UNDEF_FLOAT                                                                 \
  }

/* Built-in reductions; ncclRedOpCreatePreMulSum makes more, from ncclNumOps up. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives: read at every
 * collective (Device), or once, when the op is made (HostImmediate). */
typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

/* Every function has a second name with a leading 'p', for profilers that
 * interpose the first. */
#define BRAID_NCCL_API(ret, name, args) \
  ret nccl##name args;                  \
  ret pnccl##name args

/* Memory that peers on this host can read in place (braid::memAlloc). */
BRAID_NCCL_API(ncclResult_t, MemAlloc, (void** ptr, size_t size));
BRAID_NCCL_API(ncclResult_t, MemFree, (void* ptr));

BRAID_NCCL_API(ncclResult_t, GetVersion, (int* version));
BRAID_NCCL_API(ncclResult_t, GetUniqueId, (ncclUniqueId * uniqueId));

/* Encryption of the library's TCP sockets, process-wide (2.32). braid does
 * not encrypt its sockets: a pre-shared key is refused with
 * ncclInvalidUsage, as by an NCCL built without TLS; mode NONE (plaintext)
 * is accepted. */
typedef enum {
  NCCL_ENCRYPTION_MODE_NONE = 0, /* plaintext */
  NCCL_ENCRYPTION_MODE_PSK = 1   /* TLS with a pre-shared key */
} ncclEncryptionMode_t;
typedef struct ncclEncryptionConfig_v23200 {
  size_t size; /* set by NCCL_ENCRYPTION_CONFIG_INITIALIZER */
  unsigned int magic;
  unsigned int version;
  int mode;        /* an ncclEncryptionMode_t */
  const char* psk; /* the key, for NCCL_ENCRYPTION_MODE_PSK */
} ncclEncryptionConfig_t;
#define NCCL_ENCRYPTION_CONFIG_INITIALIZER                                                        \
  {                                                                                               \
    sizeof(ncclEncryptionConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE, NCCL_ENCRYPTION_MODE_NONE, \
        NCCL_CONFIG_UNDEF_PTR                                                                     \
  }
BRAID_NCCL_API(ncclResult_t, SetEncryption, (const ncclEncryptionConfig_t* config));

/* Communicators. Every rank calls an init with the same id and nranks and
 * its own rank; inside ncclGroupStart/End, several inits of one process run
 * together (one process driving several ranks). */
BRAID_NCCL_API(ncclResult_t, CommInitRankConfig,
               (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank,
                ncclConfig_t* config));
BRAID_NCCL_API(ncclResult_t, CommInitRank,
               (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank));
/* ndev ranks in this process, rank i labelled with devlist[i] (or i). */
BRAID_NCCL_API(ncclResult_t, CommInitAll, (ncclComm_t * comm, int ndev, const int* devlist));
/* Waits for the communicator's outstanding work. */
BRAID_NCCL_API(ncclResult_t, CommFinalize, (ncclComm_t comm));
BRAID_NCCL_API(ncclResult_t, CommDestroy, (ncclComm_t comm));
/* Stops the communicator's work at once and frees it; the peers' ops fail. */
BRAID_NCCL_API(ncclResult_t, CommAbort, (ncclComm_t comm));
BRAID_NCCL_API(ncclResult_t, CommRevoke, (ncclComm_t comm, int revokeFlags));
/* Ranks with the same color form a new communicator, ordered by key; a rank
 * with NCCL_SPLIT_NOCOLOR gets NULL. Every rank calls it. */
BRAID_NCCL_API(ncclResult_t, CommSplit,
               (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config));
BRAID_NCCL_API(ncclResult_t, CommShrink,
               (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                ncclConfig_t* config, int shrinkFlags));
/* Growing (NCCL 2.29): one member makes the id the new ranks join with;
 * every member calls ncclCommGrow(comm, nRanks, id or NULL, -1, ...) and
 * keeps its rank, each new rank ncclCommGrow(NULL, nRanks, id, rank, ...). */
BRAID_NCCL_API(ncclResult_t, CommGetUniqueId, (ncclComm_t comm, ncclUniqueId* uniqueId));
BRAID_NCCL_API(ncclResult_t, CommGrow,
               (ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                ncclComm_t* newcomm, ncclConfig_t* config));
/* As ncclCommInitRankConfig; braid's bootstrap uses the first of the ids. */
BRAID_NCCL_API(ncclResult_t, CommInitRankScalable,
               (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                ncclConfig_t* config));

/* Reads the logging variables again (NCCL_DEBUG, NCCL_DEBUG_SUBSYS and
 * braid's BRAID_LOG_*). NCCL marks it deprecated; so does this header. */
__attribute__((deprecated("ncclResetDebugInit is deprecated in NCCL's API"))) void
ncclResetDebugInit(void);
__attribute__((deprecated("pncclResetDebugInit is deprecated in NCCL's API"))) void
pncclResetDebugInit(void);

BRAID_NCCL_API(const char*, GetErrorString, (ncclResult_t result));
/* The message of this thread's last failed call (comm may be NULL). */
BRAID_NCCL_API(const char*, GetLastError, (ncclComm_t comm));
/* ncclInProgress while a nonblocking communicator still works; then
 * ncclSuccess, or the error that stopped it. */
BRAID_NCCL_API(ncclResult_t, CommGetAsyncError, (ncclComm_t comm, ncclResult_t* asyncError));

BRAID_NCCL_API(ncclResult_t, CommCount, (const ncclComm_t comm, int* count));
/* The device the communicator was made for; -1 for a host communicator. */
BRAID_NCCL_API(ncclResult_t, CommCuDevice, (const ncclComm_t comm, int* device));
BRAID_NCCL_API(ncclResult_t, CommUserRank, (const ncclComm_t comm, int* rank));

/* Buffer registration: accepted and tracked; braid's zero-copy path on a
 * host uses memory from ncclMemAlloc, registered or not. */
BRAID_NCCL_API(ncclResult_t, CommRegister,
               (const ncclComm_t comm, void* buff, size_t size, void** handle));
BRAID_NCCL_API(ncclResult_t, CommDeregister, (const ncclComm_t comm, void* handle));

/* Suspending (NCCL 2.29; collective): with NCCL_SUSPEND_MEM, once every
 * call issued before has finished, the device memory the communicator
 * makes again as it needs (its scratch) is freed, and every call but
 * ncclCommResume, ncclCommMemStats, ncclCommAbort and ncclCommDestroy is
 * ncclInvalidUsage until ncclCommResume. Its FIFOs stay (they are the
 * peers' too). ncclCommMemStats counts the communicator's device memory in
 * bytes (0 for one of host buffers only); ncclStatGpuMemSuspended is 1
 * while suspended. */
#define NCCL_SUSPEND_MEM 0x01
BRAID_NCCL_API(ncclResult_t, CommSuspend, (ncclComm_t comm, int flags));
BRAID_NCCL_API(ncclResult_t, CommResume, (ncclComm_t comm));
typedef enum {
  ncclStatGpuMemSuspend = 0,   /* device memory suspending frees */
  ncclStatGpuMemSuspended = 1, /* 1 while suspended, else 0 */
  ncclStatGpuMemPersist = 2,   /* device memory it keeps */
  ncclStatGpuMemTotal = 3      /* the two together */
} ncclCommMemStat_t;
BRAID_NCCL_API(ncclResult_t, CommMemStats,
               (ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value));
/* Windows (collective; inside a group, registered at ncclGroupEnd). Device
 * memory: every rank of the host maps it, and collectives whose buffers
 * lie in windows at the same offsets on every rank move their data by
 * direct loads and stores. Host memory: the target of one-sided puts
 * (ncclPutSignal), from every rank of the communicator. */
BRAID_NCCL_API(ncclResult_t, CommWindowRegister,
               (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags));
BRAID_NCCL_API(ncclResult_t, CommWindowDeregister, (ncclComm_t comm, ncclWindow_t win));
/* The buffer `win` was registered with (NCCL 2.29). */
BRAID_NCCL_API(ncclResult_t, WinGetUserPtr, (ncclComm_t comm, ncclWindow_t win, void** outUserPtr));

/* One-sided calls (NCCL 2.29), on host windows. ncclPutSignal writes count
 * elements from localbuff into rank peer's part of window peerWin,
 * peerWinOffset bytes in, then raises signal (ctx, sigIdx) there;
 * ncclSignal raises one with no data; ncclWaitSignal waits until each
 * descriptor's peer raised its signal opCnt more times, and consumes them.
 * Per pair of ranks, puts and signals land in issue order. They run in the
 * calling thread, after the communicator's earlier calls, outside groups.
 * ctx is below config numRmaCtx and sigIdx below numRmaSig (1 each by
 * default); flags must be 0. */
BRAID_NCCL_API(ncclResult_t, PutSignal,
               (const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags,
                ncclComm_t comm, cudaStream_t stream));
BRAID_NCCL_API(ncclResult_t, Signal,
               (int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                cudaStream_t stream));
typedef struct {
  int opCnt;  /* how many signals to wait for */
  int peer;   /* from which rank */
  int sigIdx; /* which signal index */
  int ctx;    /* of which context */
} ncclWaitSignalDesc_t;
BRAID_NCCL_API(ncclResult_t, WaitSignal,
               (int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm,
                cudaStream_t stream));

/* A sum whose inputs are first multiplied by *scalar (of `datatype`), for
 * collectives of that datatype on `comm`. */
BRAID_NCCL_API(ncclResult_t, RedOpCreatePreMulSum,
               (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype,
                ncclScalarResidence_t residence, ncclComm_t comm));
BRAID_NCCL_API(ncclResult_t, RedOpDestroy, (ncclRedOp_t op, ncclComm_t comm));

/* Collectives. sendbuff == recvbuff runs in place. Counts are elements. */
BRAID_NCCL_API(ncclResult_t, Reduce,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream));
BRAID_NCCL_API(ncclResult_t, Bcast,
               (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                cudaStream_t stream));
BRAID_NCCL_API(ncclResult_t, Broadcast,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, cudaStream_t stream));
BRAID_NCCL_API(ncclResult_t, AllReduce,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));
/* recvcount elements per rank; sendbuff holds nranks * recvcount. */
BRAID_NCCL_API(ncclResult_t, ReduceScatter,
               (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));
/* sendcount elements per rank; recvbuff holds nranks * sendcount. */
BRAID_NCCL_API(ncclResult_t, AllGather,
               (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                ncclComm_t comm, cudaStream_t stream));
/* count elements to and from each rank. */
BRAID_NCCL_API(ncclResult_t, AlltoAll,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                ncclComm_t comm, cudaStream_t stream));
BRAID_NCCL_API(ncclResult_t, Gather,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, cudaStream_t stream));
BRAID_NCCL_API(ncclResult_t, Scatter,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, cudaStream_t stream));

/* Each collective with a per-call config (NCCL 2.32); a NULL config is the
 * plain call. ncclAlltoAll, ncclGather and ncclScatter run over sends and
 * receives: a selection with force has no algorithm for them. */
BRAID_NCCL_API(ncclResult_t, AllReduceConfig,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
                const ncclCollConfig_t* config));
BRAID_NCCL_API(ncclResult_t, BroadcastConfig,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
BRAID_NCCL_API(ncclResult_t, ReduceConfig,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
                const ncclCollConfig_t* config));
BRAID_NCCL_API(ncclResult_t, AllGatherConfig,
               (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
BRAID_NCCL_API(ncclResult_t, ReduceScatterConfig,
               (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
                const ncclCollConfig_t* config));
BRAID_NCCL_API(ncclResult_t, AlltoAllConfig,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
BRAID_NCCL_API(ncclResult_t, GatherConfig,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
BRAID_NCCL_API(ncclResult_t, ScatterConfig,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));

/* Point to point: the k-th send from A to B meets the k-th recv at B from A.
 * Group them (ncclGroupStart/End) to exchange with several peers at once. */
BRAID_NCCL_API(ncclResult_t, Send,
               (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                ncclComm_t comm, cudaStream_t stream));
BRAID_NCCL_API(ncclResult_t, Recv,
               (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                cudaStream_t stream));

/* Parameters (NCCL 2.30): braid's knobs, each by its own name and by the
 * NCCL name it also reads (braid-info --config lists them), with the value
 * a communicator made now without a Config would take. As integers, sizes
 * read in bytes and durations in milliseconds; as raw bytes (ncclParamGet),
 * a number is an int64_t and text its characters and a NUL. Strings and
 * tables returned stay valid until the same call on the same thread. */
typedef struct ncclParamHandle* ncclParamHandle_t;
BRAID_NCCL_API(ncclResult_t, ParamBind, (ncclParamHandle_t * out, const char* key));
BRAID_NCCL_API(ncclResult_t, ParamGetI8, (ncclParamHandle_t h, int8_t* out));
BRAID_NCCL_API(ncclResult_t, ParamGetI16, (ncclParamHandle_t h, int16_t* out));
BRAID_NCCL_API(ncclResult_t, ParamGetI32, (ncclParamHandle_t h, int32_t* out));
BRAID_NCCL_API(ncclResult_t, ParamGetI64, (ncclParamHandle_t h, int64_t* out));
BRAID_NCCL_API(ncclResult_t, ParamGetU8, (ncclParamHandle_t h, uint8_t* out));
BRAID_NCCL_API(ncclResult_t, ParamGetU16, (ncclParamHandle_t h, uint16_t* out));
BRAID_NCCL_API(ncclResult_t, ParamGetU32, (ncclParamHandle_t h, uint32_t* out));
BRAID_NCCL_API(ncclResult_t, ParamGetU64, (ncclParamHandle_t h, uint64_t* out));
BRAID_NCCL_API(ncclResult_t, ParamGetStr, (ncclParamHandle_t h, const char** out));
BRAID_NCCL_API(ncclResult_t, ParamGet, (ncclParamHandle_t h, void* out, int maxLen, int* len));
BRAID_NCCL_API(ncclResult_t, ParamGetParameter,
               (const char* key, const char** value, int* valueLen));
BRAID_NCCL_API(ncclResult_t, ParamGetAllParameterKeys, (const char*** table, int* tableLen));
/* Every parameter with its value and where it came from, to the log. */
BRAID_NCCL_API(void, ParamDumpAll, (void));

/* Calls between ncclGroupStart and the matching ncclGroupEnd, on one or
 * several communicators of this thread, run together at ncclGroupEnd. */
BRAID_NCCL_API(ncclResult_t, GroupStart, (void));
BRAID_NCCL_API(ncclResult_t, GroupEnd, (void));
BRAID_NCCL_API(ncclResult_t, GroupSimulateEnd, (ncclSimInfo_t * simInfo));

#undef BRAID_NCCL_API

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
