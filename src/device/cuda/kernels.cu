// The reduce and copy kernels of kernels.h.
//
// Both are grid-stride loops over blocks of kThreadsPerBlock threads, at
// most as many blocks as fit on the device at once (one wave, so that no
// block waits for another to finish). Where the operands allow it
// they move 16-byte words: the elements before the first 16-byte boundary
// (the head) and after the last (the tail) are done one at a time by the
// same threads once the words are done. Every element is read and written
// by one thread, reads first, so dst may equal a source.
//
// The reduce kernels are templates over the element functions of
// element_ops.h (a Reduction: format and operator); visitReduction picks
// the instantiation for the (type, op) at launch. The n sources travel by
// value in the kernel parameters, and every loop over them is unrolled to
// kMaxReduceInputs with a uniform `k < inputs` guard, so they stay in
// registers and parameter space.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "device/cuda/element_ops.h"
#include "device/cuda/kernels.h"

namespace braid::device::cuda {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr size_t kVectorBytes = 16;

// How many blocks of kKernel fit on one multiprocessor at once, asked of
// the runtime at the first launch of kKernel and kept (so a process whose
// GPUs differ in architecture uses the first one's answer); 1 if the
// runtime cannot say.
template <auto kKernel>
int residentBlocksPerSm() {
  static const int blocks = [] {
    int n = 0;
    const cudaError_t error =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, kThreadsPerBlock, 0);
    return error == cudaSuccess && n > 0 ? n : 1;
  }();
  return blocks;
}

// Blocks of kKernel for `work` units of one thread each (work >= 1): enough
// to give every unit a thread, at most one wave (what fits on the device
// at once); the loops stride over the rest.
template <auto kKernel>
unsigned gridFor(size_t work, int smCount) {
  const size_t wave =
      static_cast<size_t>(smCount < 1 ? 1 : smCount) * residentBlocksPerSm<kKernel>();
  const size_t needed = (work + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned>(needed < wave ? needed : wave);
}

__device__ __forceinline__ size_t threadIndex() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ size_t threadCount() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

// ---- Reduce ----

// A reduce as the kernels take it. The vector kernel's split: `head`
// elements up to the first 16-byte boundary, then `vectors` 16-byte words,
// then the tail up to `count`.
struct ReduceParams {
  void* dst;
  const void* srcs[kMaxReduceInputs];
  int inputs;
  int divisor;  // Avg's finalize divisor; 0 or 1 divides nothing
  size_t count;
  size_t head;
  size_t vectors;
};

// Element i of the array at `base`. kBytewise: base may be misaligned for
// T, so the bytes are read one by one.
template <typename T, bool kBytewise>
__device__ __forceinline__ T loadElement(const void* base, size_t i) {
  if constexpr (kBytewise) {
    T v;
    memcpy(&v, static_cast<const unsigned char*>(base) + i * sizeof(T), sizeof(T));
    return v;
  } else {
    return static_cast<const T*>(base)[i];
  }
}

template <typename T, bool kBytewise>
__device__ __forceinline__ void storeElement(void* base, size_t i, T v) {
  if constexpr (kBytewise) {
    memcpy(static_cast<unsigned char*>(base) + i * sizeof(T), &v, sizeof(T));
  } else {
    static_cast<T*>(base)[i] = v;
  }
}

// dst[i] = the fold of srcs[0..inputs)[i], finalized.
template <typename R, bool kBytewise>
__device__ __forceinline__ void reduceElement(const ReduceParams& p, size_t i) {
  using T = typename R::Storage;
  T values[kMaxReduceInputs];
  BRAID_UNROLL
  for (int k = 0; k < kMaxReduceInputs; ++k) {
    if (k < p.inputs) values[k] = loadElement<T, kBytewise>(p.srcs[k], i);
  }
  storeElement<T, kBytewise>(p.dst, i, R::finalize(R::fold(values, p.inputs), p.divisor));
}

// One element at a time: for operands with different offsets modulo 16
// (kBytewise when some operand is not even aligned for its element type).
template <typename R, bool kBytewise>
__global__ void __launch_bounds__(kThreadsPerBlock) reduceElementsKernel(const ReduceParams p) {
  for (size_t i = threadIndex(); i < p.count; i += threadCount()) {
    reduceElement<R, kBytewise>(p, i);
  }
}

// 16-byte words, then the head and the tail. REQUIRES: dst and every source
// have the same address modulo 16, a multiple of the element size.
// At least two blocks fit per multiprocessor (at most 128 registers a
// thread); the compiler's own choice spills for fp8, whose 16 lanes of 8
// inputs need many registers.
template <typename R>
__global__ void __launch_bounds__(kThreadsPerBlock, 2) reduceVectorsKernel(const ReduceParams p) {
  using T = typename R::Storage;
  constexpr int kLanes = kVectorBytes / sizeof(T);
  union Vector {
    uint4 word;
    T lanes[kLanes];
  };
  const size_t first = threadIndex();
  const size_t stride = threadCount();
  const size_t headBytes = p.head * sizeof(T);

  for (size_t v = first; v < p.vectors; v += stride) {
    const size_t offset = headBytes + v * kVectorBytes;
    Vector in[kMaxReduceInputs];
    BRAID_UNROLL
    for (int k = 0; k < kMaxReduceInputs; ++k) {
      if (k < p.inputs) {
        in[k].word = *reinterpret_cast<const uint4*>(static_cast<const char*>(p.srcs[k]) + offset);
      }
    }
    Vector out;
    BRAID_UNROLL
    for (int lane = 0; lane < kLanes; ++lane) {
      T values[kMaxReduceInputs];
      BRAID_UNROLL
      for (int k = 0; k < kMaxReduceInputs; ++k) {
        if (k < p.inputs) values[k] = in[k].lanes[lane];
      }
      out.lanes[lane] = R::finalize(R::fold(values, p.inputs), p.divisor);
    }
    *reinterpret_cast<uint4*>(static_cast<char*>(p.dst) + offset) = out.word;
  }

  // Edge element e < p.head is element e; the others are the tail's.
  const size_t tailStart = p.head + p.vectors * kLanes;
  const size_t edges = p.head + (p.count - tailStart);
  for (size_t e = first; e < edges; e += stride) {
    reduceElement<R, false>(p, e < p.head ? e : tailStart + (e - p.head));
  }
}

bool alignedTo(const void* pointer, size_t alignment) {
  return reinterpret_cast<uintptr_t>(pointer) % alignment == 0;
}

template <typename R>
cudaError_t launchReduction(cudaStream_t stream, ReduceParams p, int smCount) {
  using T = typename R::Storage;
  constexpr size_t kLanes = kVectorBytes / sizeof(T);
  const uintptr_t offset = reinterpret_cast<uintptr_t>(p.dst) % kVectorBytes;
  bool sameOffset = true;
  bool elementAligned = alignedTo(p.dst, sizeof(T));
  for (int k = 0; k < p.inputs; ++k) {
    sameOffset = sameOffset && reinterpret_cast<uintptr_t>(p.srcs[k]) % kVectorBytes == offset;
    elementAligned = elementAligned && alignedTo(p.srcs[k], sizeof(T));
  }

  if (sameOffset && elementAligned) {
    const size_t toBoundary = ((kVectorBytes - offset) % kVectorBytes) / sizeof(T);
    p.head = toBoundary < p.count ? toBoundary : p.count;
    p.vectors = (p.count - p.head) / kLanes;
    const size_t edges = p.count - p.vectors * kLanes;
    const size_t work = p.vectors > edges ? p.vectors : edges;
    constexpr auto kKernel = reduceVectorsKernel<R>;
    kKernel<<<gridFor<kKernel>(work, smCount), kThreadsPerBlock, 0, stream>>>(p);
  } else if (elementAligned) {
    constexpr auto kKernel = reduceElementsKernel<R, false>;
    kKernel<<<gridFor<kKernel>(p.count, smCount), kThreadsPerBlock, 0, stream>>>(p);
  } else if constexpr (sizeof(T) > 1) {  // a one-byte element is always aligned
    constexpr auto kKernel = reduceElementsKernel<R, true>;
    kKernel<<<gridFor<kKernel>(p.count, smCount), kThreadsPerBlock, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

// ---- Copy ----

// Copies `words` Words from src + head to dst + head, and bytewise the
// `head` bytes before them and the tail after them, up to `bytes`.
// REQUIRES: dst + head and src + head aligned for Word.
template <typename Word>
__global__ void __launch_bounds__(kThreadsPerBlock)
    copyKernel(unsigned char* dst, const unsigned char* src, size_t bytes, size_t head,
               size_t words) {
  const size_t first = threadIndex();
  const size_t stride = threadCount();
  Word* dstWords = reinterpret_cast<Word*>(dst + head);
  const Word* srcWords = reinterpret_cast<const Word*>(src + head);
  for (size_t w = first; w < words; w += stride) dstWords[w] = srcWords[w];

  const size_t tailStart = head + words * sizeof(Word);
  const size_t edges = head + (bytes - tailStart);
  for (size_t e = first; e < edges; e += stride) {
    const size_t i = e < head ? e : tailStart + (e - head);
    dst[i] = src[i];
  }
}

template <typename Word>
cudaError_t launchCopyOf(cudaStream_t stream, unsigned char* dst, const unsigned char* src,
                         size_t bytes, int smCount) {
  const uintptr_t offset = reinterpret_cast<uintptr_t>(dst) % sizeof(Word);
  const size_t toBoundary = (sizeof(Word) - offset) % sizeof(Word);
  const size_t head = toBoundary < bytes ? toBoundary : bytes;
  const size_t words = (bytes - head) / sizeof(Word);
  const size_t edges = bytes - words * sizeof(Word);
  const size_t work = words > edges ? words : edges;
  constexpr auto kKernel = copyKernel<Word>;
  kKernel<<<gridFor<kKernel>(work, smCount), kThreadsPerBlock, 0, stream>>>(dst, src, bytes, head,
                                                                            words);
  return cudaGetLastError();
}

// Whether a and b have the same address modulo `alignment`.
bool sameOffset(const void* a, const void* b, size_t alignment) {
  return (reinterpret_cast<uintptr_t>(a) - reinterpret_cast<uintptr_t>(b)) % alignment == 0;
}

// ---- Polled flag operations: one thread runs a batch in order.

struct PolledOp {
  uint32_t* flag;
  const uint32_t* base;   // null: absolute
  const uint32_t* abort;  // null: none
  uint32_t value;
  uint8_t kind;  // FlagOp::Kind
  uint8_t equal;
};
struct PolledBatch {
  PolledOp ops[kPolledOps];
  uint32_t count;
};

__device__ __forceinline__ uint32_t loadSystem(const uint32_t* word) {
  return *static_cast<const volatile uint32_t*>(word);
}

__global__ void polledFlags(PolledBatch batch) {
  for (uint32_t i = 0; i < batch.count; ++i) {
    const PolledOp& op = batch.ops[i];
    const uint32_t value = op.base ? loadSystem(op.base) + op.value : op.value;
    switch (static_cast<FlagOp::Kind>(op.kind)) {
      case FlagOp::Kind::Write:
        // What the stream wrote before (the kernels before this one ended
        // before it began) lands for every process before the flag.
        __threadfence_system();
        *static_cast<volatile uint32_t*>(op.flag) = value;
        __threadfence_system();
        break;
      case FlagOp::Kind::Add:
        *static_cast<volatile uint32_t*>(op.flag) = loadSystem(op.flag) + op.value;
        __threadfence_system();
        break;
      case FlagOp::Kind::Wait:
        for (;;) {
          const uint32_t seen = loadSystem(op.flag);
          if (op.equal ? seen == value : static_cast<int32_t>(seen - value) >= 0) break;
          if (op.abort && loadSystem(op.abort) != 0) break;
          __nanosleep(200);
        }
        __threadfence_system();
        break;
    }
  }
}

}  // namespace

int launchPolledFlags(void* stream, const FlagOp* ops, size_t count) {
  for (size_t done = 0; done < count;) {
    PolledBatch batch{};
    batch.count = static_cast<uint32_t>(count - done < kPolledOps ? count - done : kPolledOps);
    for (uint32_t i = 0; i < batch.count; ++i) {
      const FlagOp& op = ops[done + i];
      batch.ops[i] = {op.flag,
                      op.base,
                      op.abort,
                      op.value,
                      static_cast<uint8_t>(op.kind),
                      static_cast<uint8_t>(op.compare == Compare::Equal ? 1 : 0)};
    }
    polledFlags<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(batch);
    if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess)
      return static_cast<int>(error);
    done += batch.count;
  }
  return static_cast<int>(cudaSuccess);
}

int launchReduce(void* stream, const ReduceArgs& args, int smCount) {
  if (args.inputs < 1 || args.inputs > kMaxReduceInputs || args.finalizeDivisor < 0 ||
      !isValid(args.type) || !isValid(args.op)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (args.count == 0) return static_cast<int>(cudaSuccess);
  if (args.dst == nullptr) return static_cast<int>(cudaErrorInvalidValue);

  ReduceParams p{};
  p.dst = args.dst;
  for (int k = 0; k < args.inputs; ++k) {
    if (args.srcs[k] == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    p.srcs[k] = args.srcs[k];
  }
  p.inputs = args.inputs;
  p.divisor = args.op == ReduceOp::Avg ? args.finalizeDivisor : 0;
  p.count = args.count;

  cudaError_t error = cudaErrorInvalidValue;
  visitReduction(args.type, args.op, [&](auto reduction) {
    error = launchReduction<decltype(reduction)>(static_cast<cudaStream_t>(stream), p, smCount);
  });
  return static_cast<int>(error);
}

int launchCopy(void* stream, void* dst, const void* src, size_t bytes, int smCount) {
  if (bytes == 0) return static_cast<int>(cudaSuccess);
  if (dst == nullptr || src == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  const auto s = static_cast<cudaStream_t>(stream);
  auto* d = static_cast<unsigned char*>(dst);
  const auto* from = static_cast<const unsigned char*>(src);
  cudaError_t error;
  if (sameOffset(dst, src, 16)) {
    error = launchCopyOf<uint4>(s, d, from, bytes, smCount);
  } else if (sameOffset(dst, src, 8)) {
    error = launchCopyOf<uint2>(s, d, from, bytes, smCount);
  } else if (sameOffset(dst, src, 4)) {
    error = launchCopyOf<uint32_t>(s, d, from, bytes, smCount);
  } else {
    error = launchCopyOf<unsigned char>(s, d, from, bytes, smCount);
  }
  return static_cast<int>(error);
}

}  // namespace braid::device::cuda
