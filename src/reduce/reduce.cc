// The scalar kernels (portable C++, the semantics every ISA level must
// reproduce; elementwise.h states them) and finalize() for Avg. Hot path: no
// allocation, no lock, and no per-element branch on type or op; the only
// per-call branch picks the loop variant for the caller's aliasing.
// dispatch.cc hands out these kernels or a faster level's.
#include "reduce/reduce.h"

#include <type_traits>

#include "reduce/elementwise.h"
#include "reduce/kernel_table.h"

namespace braid::reduce {
namespace detail {
namespace {

template <typename Op>
struct ScalarKernel {
  static void run(void* dst, const void* a, const void* b, size_t count) {
    elementwise<Op>(dst, a, b, count);
  }
};

constexpr KernelTable kScalarKernels = makeKernelTable<ScalarKernel>();

}  // namespace

const KernelTable& scalarKernels() { return kScalarKernels; }

}  // namespace detail

namespace {

using detail::BFloat16;
using detail::E4M3;
using detail::E5M2;
using detail::Half;

// ---- finalize() for Avg ----

// C++ `/` on the element's own type (after the usual promotions), which
// truncates toward zero. The divisor is at least 2 here.
template <typename T>
void divideIntegers(void* dst, size_t count, int divisor) {
  T* d = static_cast<T*>(dst);
  const auto div = static_cast<std::common_type_t<T, int>>(divisor);
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(d[i] / div);
}

template <typename F>
void divideFloats(void* dst, size_t count, int divisor) {
  F* d = static_cast<F*>(dst);
  const F div = static_cast<F>(divisor);
  for (size_t i = 0; i < count; ++i) d[i] = d[i] / div;
}

template <typename Format>
void divideNarrow(void* dst, size_t count, int divisor) {
  using T = typename Format::Storage;
  T* d = static_cast<T*>(dst);
  const float div = static_cast<float>(divisor);
  for (size_t i = 0; i < count; ++i) d[i] = Format::narrow(Format::widen(d[i]) / div);
}

}  // namespace

void finalize(void* dst, size_t count, DataType type, ReduceOp op, int divisor) {
  // Dividing by 1 changes nothing; a divisor below 1 is a caller bug that we
  // refuse to turn into a division by zero.
  if (op != ReduceOp::Avg || divisor <= 1) return;
  switch (type) {
    case DataType::Int8:
      return divideIntegers<int8_t>(dst, count, divisor);
    case DataType::Uint8:
      return divideIntegers<uint8_t>(dst, count, divisor);
    case DataType::Int32:
      return divideIntegers<int32_t>(dst, count, divisor);
    case DataType::Uint32:
      return divideIntegers<uint32_t>(dst, count, divisor);
    case DataType::Int64:
      return divideIntegers<int64_t>(dst, count, divisor);
    case DataType::Uint64:
      return divideIntegers<uint64_t>(dst, count, divisor);
    case DataType::Float16:
      return divideNarrow<Half>(dst, count, divisor);
    case DataType::Float32:
      return divideFloats<float>(dst, count, divisor);
    case DataType::Float64:
      return divideFloats<double>(dst, count, divisor);
    case DataType::BFloat16:
      return divideNarrow<BFloat16>(dst, count, divisor);
    case DataType::Float8E4M3:
      return divideNarrow<E4M3>(dst, count, divisor);
    case DataType::Float8E5M2:
      return divideNarrow<E5M2>(dst, count, divisor);
  }
}

}  // namespace braid::reduce
