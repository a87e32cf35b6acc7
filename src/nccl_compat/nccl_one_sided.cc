// The C API's one-sided calls (NCCL 2.29): ncclPutSignal, ncclSignal and
// ncclWaitSignal over braid's windows (Communicator::put, signal and
// waitSignals): ordered on the stream for device windows, run by the
// calling thread for host windows. Once a communicator registered a device
// window, ncclSignal and ncclWaitSignal act on the device windows' signals. A context and a signal
// index name one of braid's signals: context c's index s is signal c * numRmaSig + s
// (ncclConfig_t's numRmaCtx and numRmaSig, 1 each by default).
#include "nccl_compat/nccl_internal.h"

namespace braid::nccl {
namespace {

// braid's signal for (`sigIdx`, `ctx`) on `comm`, or InvalidArgument naming
// what is out of range.
int signalOf(const ncclComm& comm, int sigIdx, int ctx, const char* fn, const char* where) {
  if (comm.rmaContexts == 0)
    throw Error(
        ErrorCode::InvalidUsage,
        format("%s: one-sided calls are off on this communicator (config numRmaCtx 0)", fn));
  if (ctx < 0 || ctx >= comm.rmaContexts)
    throw Error(ErrorCode::InvalidArgument,
                format("%s: %sctx is %d, not in [0, %d) (config numRmaCtx)", fn, where, ctx,
                       comm.rmaContexts));
  if (sigIdx < 0 || sigIdx >= comm.rmaSignals)
    throw Error(ErrorCode::InvalidArgument,
                format("%s: %ssigIdx is %d, not in [0, %d) (config numRmaSig)", fn, where, sigIdx,
                       comm.rmaSignals));
  return ctx * comm.rmaSignals + sigIdx;
}

void noFlags(unsigned int flags, const char* fn) {
  if (flags != 0)
    throw Error(ErrorCode::InvalidArgument,
                format("%s: argument 'flags' is %u; none are defined, it must be 0", fn, flags));
}

// Where ncclSignal and ncclWaitSignal run: on `stream` once the
// communicator has device windows, else in the calling thread.
Stream signalStream(const ncclComm& comm, cudaStream_t stream) {
  return comm.deviceWindows ? Stream::cuda(static_cast<void*>(stream)) : Stream();
}

}  // namespace
}  // namespace braid::nccl

using namespace braid::nccl;

extern "C" {

NCCL_EXPORT ncclResult_t pncclPutSignal(const void* localbuff, size_t count,
                                        ncclDataType_t datatype, int peer, ncclWindow_t peerWin,
                                        size_t peerWinOffset, int sigIdx, int ctx,
                                        unsigned int flags, ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclPutSignal";
  return guarded(fn, [&] {
    InCall call(comm);
    ncclComm& c = usable(comm, fn, false);
    if (!peerWin || peerWin->comm != comm)
      return badArgument(fn, "argument 'peerWin' is not a window registered on this communicator");
    const DataType type = typeOf(datatype, fn);
    const int signal = signalOf(c, sigIdx, ctx, fn, "argument ");
    noFlags(flags, fn);
    return issued(c, c.comm.put(localbuff, count, type, peer, peerWin->window, peerWinOffset,
                                signal, streamFor(&c, stream, {peerWin->user})));
  });
}

NCCL_EXPORT ncclResult_t pncclSignal(int peer, int sigIdx, int ctx, unsigned int flags,
                                     ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclSignal";
  return guarded(fn, [&] {
    InCall call(comm);
    ncclComm& c = usable(comm, fn, false);
    const int signal = signalOf(c, sigIdx, ctx, fn, "argument ");
    noFlags(flags, fn);
    return issued(c, c.comm.signal(peer, signal, signalStream(c, stream)));
  });
}

NCCL_EXPORT ncclResult_t pncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs,
                                         ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclWaitSignal";
  return guarded(fn, [&] {
    InCall call(comm);
    ncclComm& c = usable(comm, fn, false);
    if (nDesc <= 0)
      return badArgument(fn, format("argument 'nDesc' is %d, must be above 0", nDesc));
    if (!signalDescs) return badArgument(fn, "argument 'signalDescs' is NULL");
    std::vector<braid::SignalWait> waits(static_cast<size_t>(nDesc));
    for (int i = 0; i < nDesc; ++i) {
      const ncclWaitSignalDesc_t& desc = signalDescs[i];
      const std::string where = format("signalDescs[%d].", i);
      if (desc.opCnt <= 0)
        return badArgument(fn, format("%sopCnt is %d, must be above 0", where.c_str(), desc.opCnt));
      waits[static_cast<size_t>(i)] = {desc.peer,
                                       signalOf(c, desc.sigIdx, desc.ctx, fn, where.c_str()),
                                       static_cast<uint64_t>(desc.opCnt)};
    }
    return issued(c, c.comm.waitSignals(waits.data(), waits.size(), signalStream(c, stream)));
  });
}

}  // extern "C"

NCCL_ALIAS(ncclResult_t, PutSignal,
           (const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
            ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags,
            ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, Signal,
           (int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
            cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, WaitSignal,
           (int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm, cudaStream_t stream));
