// abi_check.c compiled as C++ (with CUDA's headers where the toolkit is found).
#include "abi_check.c"

// With CUDA, nccl.h brings its narrow float types, as NCCL's own header
// does: programs written against it (nccl-tests) use half without including
// cuda_fp16.h.
#ifdef CUDART_VERSION
static_assert(sizeof(half) == 2 && sizeof(__nv_bfloat16) == 2 && sizeof(__nv_fp8_e4m3) == 1,
              "nccl.h does not declare CUDA's half, __nv_bfloat16 and __nv_fp8_e4m3");
#endif
