// Picks the kernel level once per process (the first kernelFor() call) from
// the CPU's feature bits; after that kernelFor(type, op) is a table lookup.
#include "reduce/dispatch.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "reduce/kernel_table.h"

namespace braid::reduce {
namespace {

#if defined(__x86_64__)
// F16C, from CPUID leaf 1 (not every compiler's __builtin_cpu_supports knows
// it). It needs the AVX state, which the AVX2 check below covers.
bool cpuHasF16c() {
  unsigned eax = 0;
  unsigned ebx = 0;
  unsigned ecx = 0;
  unsigned edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

// __builtin_cpu_supports also checks that the OS saves the vector state
// (XCR0), so a "yes" means the instructions can run.
bool cpuHas(Isa isa) {
  __builtin_cpu_init();  // may run before libgcc's constructor: static init
  switch (isa) {
    case Isa::Scalar:
      return true;
    case Isa::Avx2:
      return __builtin_cpu_supports("avx2") && cpuHasF16c();
    case Isa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && cpuHasF16c();
  }
  return false;
}
#else
bool cpuHas(Isa isa) { return isa == Isa::Scalar; }
#endif

const detail::KernelTable* tableFor(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return &detail::scalarKernels();
#if defined(__x86_64__)
    case Isa::Avx2:
      return &detail::avx2Kernels();
    case Isa::Avx512:
      return &detail::avx512Kernels();
#endif
    default:
      return nullptr;
  }
}

bool validIsa(Isa isa) { return static_cast<int>(isa) >= 0 && static_cast<int>(isa) < kNumIsas; }

Isa detectBestIsa() {
  for (Isa isa : {Isa::Avx512, Isa::Avx2}) {
    if (cpuHas(isa) && tableFor(isa) != nullptr) return isa;
  }
  return Isa::Scalar;
}

Kernel lookup(const detail::KernelTable& table, DataType type, ReduceOp op) {
  const int t = static_cast<int>(type);
  const int o = static_cast<int>(op);
  if (t < 0 || t >= kNumDataTypes || o < 0 || o >= kNumReduceOps) return nullptr;
  return table[t][o];
}

}  // namespace

const char* isaName(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return "scalar";
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512";
  }
  return "invalid";
}

bool isaSupported(Isa isa) { return validIsa(isa) && cpuHas(isa) && tableFor(isa) != nullptr; }

Isa bestIsa() {
  static const Isa best = detectBestIsa();  // once; thread-safe initialization
  return best;
}

Kernel kernelFor(DataType type, ReduceOp op, Isa isa) {
  if (!isaSupported(isa)) return nullptr;
  return lookup(*tableFor(isa), type, op);
}

Kernel kernelFor(DataType type, ReduceOp op) {
  static const detail::KernelTable& active = *tableFor(bestIsa());
  return lookup(active, type, op);
}

}  // namespace braid::reduce
