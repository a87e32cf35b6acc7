// The table of kernels of one ISA level, indexed [DataType][ReduceOp], and
// the one place that says which element operation each entry applies.
//
// Each ISA level supplies a class template K with a static member
// `void run(void* dst, const void* a, const void* b, size_t count)` for
// every element operation Op in elementwise.h (K<Op>::run); the generic K
// runs elementwise<Op>, and a level may specialize K for the operations it
// writes by hand. makeKernelTable<K>() lays them out.
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>

#include "reduce/elementwise.h"
#include "reduce/reduce.h"

namespace braid::reduce::detail {

using KernelRow = std::array<Kernel, kNumReduceOps>;
using KernelTable = std::array<KernelRow, kNumDataTypes>;

// The kernel tables of each level (reduce.cc, kernels_avx2.cc and
// kernels_avx512.cc). Taking one is safe on any CPU; calling its kernels
// needs the ISA (dispatch.h checks).
const KernelTable& scalarKernels();
#if defined(__x86_64__)
const KernelTable& avx2Kernels();
const KernelTable& avx512Kernels();
#endif

static_assert(static_cast<int>(ReduceOp::Sum) == 0 && static_cast<int>(ReduceOp::Prod) == 1 &&
                  static_cast<int>(ReduceOp::Max) == 2 && static_cast<int>(ReduceOp::Min) == 3 &&
                  static_cast<int>(ReduceOp::Avg) == 4 && kNumReduceOps == 5,
              "KernelRow's column order follows ReduceOp");

template <template <typename> class K, typename Sum, typename Prod, typename Max, typename Min>
constexpr KernelRow row() {
  return {&K<Sum>::run, &K<Prod>::run, &K<Max>::run, &K<Min>::run,
          &K<Sum>::run /* Avg: finalize() divides */};
}

template <template <typename> class K, typename T>
constexpr KernelRow integerRow() {
  using U = std::make_unsigned_t<T>;
  return row<K, WrapSum<U>, WrapProd<U>, IntMax<T>, IntMin<T>>();
}

template <template <typename> class K, typename F>
constexpr KernelRow floatRow() {
  return row<K, FloatSum<F>, FloatProd<F>, FloatMax<F>, FloatMin<F>>();
}

template <template <typename> class K, typename Format>
constexpr KernelRow narrowRow() {
  return row<K, Narrowed<Format, FloatSum>, Narrowed<Format, FloatProd>, Narrowed<Format, FloatMax>,
             Narrowed<Format, FloatMin>>();
}

static_assert(
    static_cast<int>(DataType::Int8) == 0 && static_cast<int>(DataType::Uint8) == 1 &&
        static_cast<int>(DataType::Int32) == 2 && static_cast<int>(DataType::Uint32) == 3 &&
        static_cast<int>(DataType::Int64) == 4 && static_cast<int>(DataType::Uint64) == 5 &&
        static_cast<int>(DataType::Float16) == 6 && static_cast<int>(DataType::Float32) == 7 &&
        static_cast<int>(DataType::Float64) == 8 && static_cast<int>(DataType::BFloat16) == 9 &&
        static_cast<int>(DataType::Float8E4M3) == 10 &&
        static_cast<int>(DataType::Float8E5M2) == 11 && kNumDataTypes == 12,
    "KernelTable's row order follows DataType");

template <template <typename> class K>
constexpr KernelTable makeKernelTable() {
  return {
      integerRow<K, int8_t>(),   integerRow<K, uint8_t>(), integerRow<K, int32_t>(),
      integerRow<K, uint32_t>(), integerRow<K, int64_t>(), integerRow<K, uint64_t>(),
      narrowRow<K, Half>(),      floatRow<K, float>(),     floatRow<K, double>(),
      narrowRow<K, BFloat16>(),  narrowRow<K, E4M3>(),     narrowRow<K, E5M2>(),
  };
}

}  // namespace braid::reduce::detail
