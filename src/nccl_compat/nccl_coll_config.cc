// The per-collective configs (ncclAllReduceConfig and the like, NCCL
// 2.32): the plain call, with the config's algorithm selection as the
// call's own (detail::CallAlgorithmScope). The kernel settings, the
// profiler tag and the launch completion event have nothing to act on
// here: NCCL_DEBUG=INFO names each one a call sets.
#include <cstddef>
#include <optional>
#include <string>

#include "core/call_algorithm.h"
#include "core/log.h"
#include "nccl_compat/nccl_internal.h"
#include "tuning/algo_choice.h"

namespace braid::nccl {
namespace {

using detail::CallAlgorithm;

// The config's algorithm selection, checked; none where `config` is NULL or
// selects nothing. `runsAlgorithms`: the call is a collective braid picks an
// algorithm for (not one made of sends and receives).
ncclResult_t readConfig(const ncclCollConfig_t* given, const char* fn, bool runsAlgorithms,
                        std::optional<CallAlgorithm>* selection) {
  if (!given) return ncclSuccess;
  if (given->size < offsetof(ncclCollConfig_t, ext) || given->magic != NCCL_API_MAGIC)
    return badArgument(fn, format("argument 'config' was not made by NCCL_COLLCONFIG_INITIALIZER "
                                  "(size %zu, magic 0x%x)",
                                  given->size, given->magic));
  // A struct of an earlier version holds a prefix of the fields; the rest
  // take their defaults.
  ncclCollConfig_t config = NCCL_COLLCONFIG_INITIALIZER;
  std::memcpy(&config, given, std::min(given->size, sizeof(config)));
  auto unused = [fn](bool set, const char* field) {
    if (set)
      BRAID_INFO(Coll, "%s: config->%s is set and has no meaning for braid's collectives", fn,
                 field);
  };
  unused(config.ext != nullptr, "ext (no vendor option is braid's)");
  unused(config.minCTAs != NCCL_CONFIG_UNDEF_INT, "minCTAs");
  unused(config.maxCTAs != NCCL_CONFIG_UNDEF_INT, "maxCTAs");
  unused(config.nvlsCTAs != NCCL_CONFIG_UNDEF_INT, "nvlsCTAs");
  unused(config.cgaClusterSize != NCCL_CONFIG_UNDEF_INT, "cgaClusterSize");
  unused(config.CTAPolicy != NCCL_CONFIG_UNDEF_INT, "CTAPolicy");
  unused(config.userProfilerTag != 0, "userProfilerTag");
  unused(config.launchCompletionEvent != nullptr, "launchCompletionEvent (it is not recorded)");
  if (!config.algSelection || !*config.algSelection) return ncclSuccess;
  const std::string text = config.algSelection;
  const bool force = config.forceAlgSelection != 0;
  if (!runsAlgorithms) {
    if (force)
      return badArgument(fn, format("config->algSelection is \"%s\" with forceAlgSelection, and "
                                    "this call runs over sends and receives, with no algorithm "
                                    "to select",
                                    text.c_str()));
    BRAID_INFO(Coll, "%s: config->algSelection (\"%s\") has no algorithm to select here", fn,
               text.c_str());
    return ncclSuccess;
  }
  // NCCL's names, as NCCL_ALGO takes them; else braid's, as BRAID_ALGO does.
  tuning::AlgoPreference preference;
  try {
    preference = tuning::AlgoPreference::parse(tuning::fromNcclAlgo(text));
  } catch (const Error&) {
    try {
      preference = tuning::AlgoPreference::parse(text);
    } catch (const Error& error) {
      return badArgument(fn, format("config->algSelection \"%s\" is neither NCCL_ALGO's form nor "
                                    "BRAID_ALGO's: %s",
                                    text.c_str(), error.what()));
    }
  }
  *selection = CallAlgorithm{std::make_shared<const tuning::AlgoPreference>(preference), force};
  return ncclSuccess;
}

// Runs `call` (the plain function) with the config's selection in force.
template <typename Call>
ncclResult_t withConfig(const ncclCollConfig_t* config, const char* fn, bool runsAlgorithms,
                        Call&& call) {
  return guarded(fn, [&] {
    std::optional<CallAlgorithm> selection;
    if (ncclResult_t bad = readConfig(config, fn, runsAlgorithms, &selection)) return bad;
    if (!selection) return call();
    detail::CallAlgorithmScope scope(std::move(*selection));
    return call();
  });
}

}  // namespace
}  // namespace braid::nccl

using braid::nccl::withConfig;

extern "C" {

NCCL_EXPORT ncclResult_t pncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count,
                                              ncclDataType_t datatype, ncclRedOp_t op,
                                              ncclComm_t comm, cudaStream_t stream,
                                              const ncclCollConfig_t* config) {
  return withConfig(config, "ncclAllReduceConfig", true, [&] {
    return pncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
  });
}

NCCL_EXPORT ncclResult_t pncclBroadcastConfig(const void* sendbuff, void* recvbuff, size_t count,
                                              ncclDataType_t datatype, int root, ncclComm_t comm,
                                              cudaStream_t stream, const ncclCollConfig_t* config) {
  return withConfig(config, "ncclBroadcastConfig", true, [&] {
    return pncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream);
  });
}

NCCL_EXPORT ncclResult_t pncclReduceConfig(const void* sendbuff, void* recvbuff, size_t count,
                                           ncclDataType_t datatype, ncclRedOp_t op, int root,
                                           ncclComm_t comm, cudaStream_t stream,
                                           const ncclCollConfig_t* config) {
  return withConfig(config, "ncclReduceConfig", true, [&] {
    return pncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  });
}

NCCL_EXPORT ncclResult_t pncclAllGatherConfig(const void* sendbuff, void* recvbuff,
                                              size_t sendcount, ncclDataType_t datatype,
                                              ncclComm_t comm, cudaStream_t stream,
                                              const ncclCollConfig_t* config) {
  return withConfig(config, "ncclAllGatherConfig", true, [&] {
    return pncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
  });
}

NCCL_EXPORT ncclResult_t pncclReduceScatterConfig(const void* sendbuff, void* recvbuff,
                                                  size_t recvcount, ncclDataType_t datatype,
                                                  ncclRedOp_t op, ncclComm_t comm,
                                                  cudaStream_t stream,
                                                  const ncclCollConfig_t* config) {
  return withConfig(config, "ncclReduceScatterConfig", true, [&] {
    return pncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
  });
}

NCCL_EXPORT ncclResult_t pncclAlltoAllConfig(const void* sendbuff, void* recvbuff, size_t count,
                                             ncclDataType_t datatype, ncclComm_t comm,
                                             cudaStream_t stream, const ncclCollConfig_t* config) {
  return withConfig(config, "ncclAlltoAllConfig", false, [&] {
    return pncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream);
  });
}

NCCL_EXPORT ncclResult_t pncclGatherConfig(const void* sendbuff, void* recvbuff, size_t count,
                                           ncclDataType_t datatype, int root, ncclComm_t comm,
                                           cudaStream_t stream, const ncclCollConfig_t* config) {
  return withConfig(config, "ncclGatherConfig", false, [&] {
    return pncclGather(sendbuff, recvbuff, count, datatype, root, comm, stream);
  });
}

NCCL_EXPORT ncclResult_t pncclScatterConfig(const void* sendbuff, void* recvbuff, size_t count,
                                            ncclDataType_t datatype, int root, ncclComm_t comm,
                                            cudaStream_t stream, const ncclCollConfig_t* config) {
  return withConfig(config, "ncclScatterConfig", false, [&] {
    return pncclScatter(sendbuff, recvbuff, count, datatype, root, comm, stream);
  });
}

}  // extern "C"

#pragma GCC diagnostic ignored "-Wmissing-attributes"
NCCL_ALIAS(ncclResult_t, AllReduceConfig,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
NCCL_ALIAS(ncclResult_t, BroadcastConfig,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
            ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
NCCL_ALIAS(ncclResult_t, ReduceConfig,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
            ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
            const ncclCollConfig_t* config));
NCCL_ALIAS(ncclResult_t, AllGatherConfig,
           (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
            ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
NCCL_ALIAS(ncclResult_t, ReduceScatterConfig,
           (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
NCCL_ALIAS(ncclResult_t, AlltoAllConfig,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
            ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
NCCL_ALIAS(ncclResult_t, GatherConfig,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
            ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
NCCL_ALIAS(ncclResult_t, ScatterConfig,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
            ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config));
