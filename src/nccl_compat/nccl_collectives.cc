// The C API's operators and collectives: PreMulSum operators, the five
// collectives and ncclBcast, send/recv, and ncclAlltoAll, ncclGather and
// ncclScatter built from grouped send/recv.
#include <type_traits>

#include "nccl_compat/nccl_internal.h"
#include "reduce/float_convert.h"

static_assert(static_cast<int>(ncclNumTypes) == braid::kNumDataTypes, "types must match");

namespace braid::nccl {
namespace {

// Multiplies `count` elements of `type` at `in` by the scalar at `scalar`
// (of the same type) into `out`, in the type's own arithmetic: integers wrap,
// narrow floats are multiplied in float and rounded once.
void scale(void* out, const void* in, size_t count, ncclDataType_t type, const void* scalar) {
  namespace fc = braid::reduce::detail;
  auto each = [&](auto tag, auto widen, auto narrow) {
    using T = decltype(tag);
    T factor;
    std::memcpy(&factor, scalar, sizeof(T));
    const auto f = widen(factor);
    const T* from = static_cast<const T*>(in);
    T* to = static_cast<T*>(out);
    for (size_t i = 0; i < count; ++i) to[i] = narrow(widen(from[i]) * f);
  };
  auto same = [](auto v) { return v; };
  auto wrap = [](auto tag) {  // integer multiply modulo 2^bits
    using T = decltype(tag);
    using U = std::make_unsigned_t<T>;
    using Wide = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return [](T a, T b) { return static_cast<T>(static_cast<U>(Wide(U(a)) * Wide(U(b)))); };
  };
  auto integers = [&](auto tag) {
    using T = decltype(tag);
    T factor;
    std::memcpy(&factor, scalar, sizeof(T));
    const auto mul = wrap(tag);
    const T* from = static_cast<const T*>(in);
    T* to = static_cast<T*>(out);
    for (size_t i = 0; i < count; ++i) to[i] = mul(from[i], factor);
  };
  switch (type) {
    case ncclInt8:
      return integers(int8_t{});
    case ncclUint8:
      return integers(uint8_t{});
    case ncclInt32:
      return integers(int32_t{});
    case ncclUint32:
      return integers(uint32_t{});
    case ncclInt64:
      return integers(int64_t{});
    case ncclUint64:
      return integers(uint64_t{});
    case ncclFloat32:
      return each(float{}, same, same);
    case ncclFloat64:
      return each(double{}, same, same);
    case ncclFloat16:
      return each(uint16_t{}, fc::halfToFloatInline, fc::floatToHalfInline);
    case ncclBfloat16:
      return each(uint16_t{}, fc::bf16ToFloatInline, fc::floatToBf16Inline);
    case ncclFloat8e4m3:
      return each(uint8_t{}, fc::fp8e4m3ToFloatInline, fc::floatToFp8e4m3Inline);
    case ncclFloat8e5m2:
      return each(uint8_t{}, fc::fp8e5m2ToFloatInline, fc::floatToFp8e5m2Inline);
    case ncclNumTypes:
      break;
  }
}

// A reduction operator resolved for one call: braid's op, and for a
// PreMulSum the scalar that multiplies the inputs first (null otherwise).
struct Reduction {
  ReduceOp op = ReduceOp::Sum;
  const void* scalar = nullptr;
};

Reduction reductionOf(const ncclComm& comm, const ncclRedOp_t& op, ncclDataType_t type,
                      const char* fn) {
  const int value = rawValue(op);
  if (value >= 0 && value < ncclNumOps) return {static_cast<ReduceOp>(value), nullptr};
  const size_t index = static_cast<size_t>(value - ncclNumOps);
  if (value < ncclNumOps || index >= comm.redOps.size() || !comm.redOps[index].live)
    throw Error(ErrorCode::InvalidArgument,
                format("%s: argument 'op' is %d, neither a built-in operator nor one made by "
                       "ncclRedOpCreatePreMulSum on this communicator",
                       fn, value));
  const ncclComm::PreMulSum& custom = comm.redOps[index];
  if (custom.type != type)
    throw Error(ErrorCode::InvalidArgument,
                format("%s: argument 'op' %d was made for datatype %d, not %d", fn, value,
                       static_cast<int>(custom.type), static_cast<int>(type)));
  return {ReduceOp::Sum, custom.immediate ? custom.value.data() : custom.scalar};
}

// The input of a reducing call under `reduction`: `send` itself, or a copy
// multiplied by the PreMulSum scalar (kept in *scratch until the op is done).
const void* reductionInput(const Reduction& reduction, const void* send, size_t count,
                           ncclDataType_t type, std::shared_ptr<std::vector<std::byte>>* scratch) {
  if (!reduction.scalar || count == 0 || !send) return send;
  if (braid::device::Device* device = braid::device::current())
    if (device->deviceOf(send) >= 0)
      throw Error(ErrorCode::InvalidUsage,
                  "ncclRedOpCreatePreMulSum operators on device buffers are not supported by "
                  "braid yet (on host buffers they are)");
  const size_t bytes = count * braid::dataTypeSize(static_cast<DataType>(type));
  *scratch = std::make_shared<std::vector<std::byte>>(bytes);
  scale((*scratch)->data(), send, count, type, reduction.scalar);
  return (*scratch)->data();
}
// An exchange of point-to-point pieces run as one group: AlltoAll, Gather
// and Scatter. `sendTo(p)` and `recvFrom(p)` give each peer's piece (null:
// none).
ncclResult_t exchange(const char* fn, ncclComm_t comm, ncclDataType_t datatype, size_t count,
                      cudaStream_t stream, const std::function<const void*(int)>& sendTo,
                      const std::function<void*(int)>& recvFrom) {
  return guarded(fn, [&] {
    InCall call(comm);
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    const int n = c.comm.size();
    const bool ownGroup = openGroup().depth == 0;
    if (ownGroup) c.comm.groupStart();
    std::vector<Work> works;
    try {
      for (int p = 0; p < n; ++p) {
        if (const void* piece = sendTo(p))
          works.push_back(c.comm.send(piece, count, type, p, streamFor(&c, stream, {piece})));
        if (void* piece = recvFrom(p))
          works.push_back(c.comm.recv(piece, count, type, p, streamFor(&c, stream, {piece})));
      }
    } catch (...) {
      if (ownGroup) c.comm.groupEnd();  // runs the pieces already issued: peers expect them
      throw;
    }
    if (ownGroup) c.comm.groupEnd();
    ncclResult_t result = ncclSuccess;
    for (Work& work : works) result = issued(c, std::move(work));
    return result;
  });
}

// Element `index * count` of `base` in `type`.
template <typename Pointer>
Pointer pieceOf(Pointer base, int index, size_t count, ncclDataType_t type) {
  const size_t bytes = count * braid::dataTypeSize(static_cast<DataType>(type));
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<Pointer>>, const std::byte,
                                  std::byte>;
  return reinterpret_cast<Pointer>(reinterpret_cast<Byte*>(base) +
                                   static_cast<size_t>(index) * bytes);
}

// Gather (every rank's `count` elements to `root`, in rank order) or scatter
// (the reverse) as one group of point-to-point pieces.
ncclResult_t rooted(const char* fn, bool gathering, const void* sendbuff, void* recvbuff,
                    size_t count, const ncclDataType_t& datatype, int root, ncclComm_t comm,
                    cudaStream_t stream) {
  if (!comm) return badArgument(fn, "argument 'comm' is NULL");
  return guarded(fn, [&] {
    InCall call(comm);
    const int rank = usable(comm, fn).comm.rank(), n = comm->comm.size();
    if (root < 0 || root >= n)
      return badArgument(fn, format("argument 'root' is %d, not in [0, %d)", root, n));
    // The root's side is the whole buffer, every other rank's one piece.
    const bool sendsAll = !gathering && rank == root, receivesAll = gathering && rank == root;
    if (!sendbuff && count > 0 && (gathering || sendsAll))
      return badArgument(fn, "argument 'sendbuff' is NULL");
    if (!recvbuff && count > 0 && (!gathering || receivesAll))
      return badArgument(fn, "argument 'recvbuff' is NULL");
    return exchange(
        fn, comm, datatype, count, stream,
        [&](int p) -> const void* {
          if (gathering) return p == root ? sendbuff : nullptr;
          return sendsAll ? pieceOf(sendbuff, p, count, datatype) : nullptr;
        },
        [&](int p) -> void* {
          if (!gathering) return p == root ? recvbuff : nullptr;
          return receivesAll ? pieceOf(recvbuff, p, count, datatype) : nullptr;
        });
  });
}

}  // namespace
}  // namespace braid::nccl

using namespace braid::nccl;

extern "C" {

NCCL_EXPORT ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                                   ncclDataType_t datatype,
                                                   ncclScalarResidence_t residence,
                                                   ncclComm_t comm) {
  const char* fn = "ncclRedOpCreatePreMulSum";
  return guarded(fn, [&] {
    if (!comm) return badArgument(fn, "argument 'comm' is NULL");
    if (ncclResult_t bad = need(op, fn, "op")) return bad;
    if (ncclResult_t bad = need(scalar, fn, "scalar")) return bad;
    typeOf(datatype, fn);
    const int where = rawValue(residence);
    if (where != ncclScalarDevice && where != ncclScalarHostImmediate)
      return badArgument(fn, format("argument 'residence' is %d", where));
    ncclComm::PreMulSum custom;
    custom.live = true;
    custom.type = datatype;
    custom.immediate = residence == ncclScalarHostImmediate;
    if (custom.immediate)
      std::memcpy(custom.value.data(), scalar,
                  braid::dataTypeSize(static_cast<DataType>(datatype)));
    else
      custom.scalar = scalar;  // host memory here: read at each collective
    size_t index = 0;
    while (index < comm->redOps.size() && comm->redOps[index].live) ++index;
    if (index == comm->redOps.size()) comm->redOps.emplace_back();
    if (index > static_cast<size_t>(ncclMaxRedOp - ncclNumOps))
      return failWith(ncclInvalidUsage, format("%s: too many operators", fn));
    comm->redOps[index] = custom;
    *op = static_cast<ncclRedOp_t>(ncclNumOps + static_cast<int>(index));
    return ncclSuccess;
  });
}

NCCL_EXPORT ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  const char* fn = "ncclRedOpDestroy";
  if (!comm) return badArgument(fn, "argument 'comm' is NULL");
  const int value = rawValue(op);
  const size_t index = static_cast<size_t>(value - ncclNumOps);
  if (value < ncclNumOps || index >= comm->redOps.size() || !comm->redOps[index].live)
    return badArgument(fn, format("argument 'op' is %d, not an operator made by "
                                  "ncclRedOpCreatePreMulSum on this communicator",
                                  value));
  comm->redOps[index].live = false;
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream) {
  const char* fn = "ncclAllReduce";
  return guarded(fn, [&] {
    InCall call(comm);
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    const Reduction reduction = reductionOf(c, op, datatype, fn);
    std::shared_ptr<std::vector<std::byte>> scratch;
    const void* input = reductionInput(reduction, sendbuff, count, datatype, &scratch);
    Work work = c.comm.allReduce(input, recvbuff, count, type, reduction.op,
                                 streamFor(&c, stream, {sendbuff, recvbuff}));
    return issued(c, std::move(work), std::move(scratch));
  });
}

NCCL_EXPORT ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclRedOp_t op, int root,
                                     ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclReduce";
  return guarded(fn, [&] {
    InCall call(comm);
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    const Reduction reduction = reductionOf(c, op, datatype, fn);
    std::shared_ptr<std::vector<std::byte>> scratch;
    const void* input = reductionInput(reduction, sendbuff, count, datatype, &scratch);
    Work work = c.comm.reduce(input, recvbuff, count, type, reduction.op, root,
                              streamFor(&c, stream, {sendbuff, recvbuff}));
    return issued(c, std::move(work), std::move(scratch));
  });
}

NCCL_EXPORT ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, int root, ncclComm_t comm,
                                        cudaStream_t stream) {
  const char* fn = "ncclBroadcast";
  return guarded(fn, [&] {
    InCall call(comm);
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    return issued(c, c.comm.broadcast(sendbuff, recvbuff, count, type, root,
                                      streamFor(&c, stream, {recvbuff})));
  });
}

NCCL_EXPORT ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                    ncclComm_t comm, cudaStream_t stream) {
  return pncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

NCCL_EXPORT ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                            ncclDataType_t datatype, ncclRedOp_t op,
                                            ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclReduceScatter";
  return guarded(fn, [&] {
    InCall call(comm);
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    const Reduction reduction = reductionOf(c, op, datatype, fn);
    std::shared_ptr<std::vector<std::byte>> scratch;
    const size_t total = recvcount * static_cast<size_t>(c.comm.size());
    const void* input = reductionInput(reduction, sendbuff, total, datatype, &scratch);
    Work work = c.comm.reduceScatter(input, recvbuff, recvcount, type, reduction.op,
                                     streamFor(&c, stream, {sendbuff, recvbuff}));
    return issued(c, std::move(work), std::move(scratch));
  });
}

NCCL_EXPORT ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        ncclDataType_t datatype, ncclComm_t comm,
                                        cudaStream_t stream) {
  const char* fn = "ncclAllGather";
  return guarded(fn, [&] {
    InCall call(comm);
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    return issued(c, c.comm.allGather(sendbuff, recvbuff, sendcount, type,
                                      streamFor(&c, stream, {sendbuff, recvbuff})));
  });
}

NCCL_EXPORT ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                   int peer, ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclSend";
  return guarded(fn, [&] {
    InCall call(comm);
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    return issued(c, c.comm.send(sendbuff, count, type, peer, streamFor(&c, stream, {sendbuff})));
  });
}

NCCL_EXPORT ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                   ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclRecv";
  return guarded(fn, [&] {
    InCall call(comm);
    ncclComm& c = usable(comm, fn);
    const DataType type = typeOf(datatype, fn);
    return issued(c, c.comm.recv(recvbuff, count, type, peer, streamFor(&c, stream, {recvbuff})));
  });
}

NCCL_EXPORT ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclComm_t comm,
                                       cudaStream_t stream) {
  const char* fn = "ncclAlltoAll";
  if (!sendbuff && count > 0) return badArgument(fn, "argument 'sendbuff' is NULL");
  if (!recvbuff && count > 0) return badArgument(fn, "argument 'recvbuff' is NULL");
  return exchange(
      fn, comm, datatype, count, stream,
      [&](int p) { return pieceOf(sendbuff, p, count, datatype); },
      [&](int p) { return pieceOf(recvbuff, p, count, datatype); });
}

NCCL_EXPORT ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  return rooted("ncclGather", true, sendbuff, recvbuff, count, datatype, root, comm, stream);
}

NCCL_EXPORT ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                      ncclDataType_t datatype, int root, ncclComm_t comm,
                                      cudaStream_t stream) {
  return rooted("ncclScatter", false, sendbuff, recvbuff, count, datatype, root, comm, stream);
}

}  // extern "C"

// (GCC finds some targets cannot throw and would like the aliases to say so.)
#pragma GCC diagnostic ignored "-Wmissing-attributes"
NCCL_ALIAS(ncclResult_t, RedOpCreatePreMulSum,
           (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype,
            ncclScalarResidence_t residence, ncclComm_t comm));
NCCL_ALIAS(ncclResult_t, RedOpDestroy, (ncclRedOp_t op, ncclComm_t comm));
NCCL_ALIAS(ncclResult_t, AllReduce,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, Reduce,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
            ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, Broadcast,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
            ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, Bcast,
           (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
            cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, ReduceScatter,
           (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, AllGather,
           (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
            ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, AlltoAll,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
            ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, Gather,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
            ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, Scatter,
           (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
            ncclComm_t comm, cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, Send,
           (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
            cudaStream_t stream));
NCCL_ALIAS(ncclResult_t, Recv,
           (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
            cudaStream_t stream));
