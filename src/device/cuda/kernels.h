// braid's own CUDA kernels: the n-input reduce, a copy, and polled flag
// operations, which the CUDA device (Device::reduce, Device::copy,
// Device::flagOps) enqueues on its streams. Free of
// CUDA headers so that any translation unit can declare them; kernels.cu
// defines them, element_ops.h holds the element functions they apply.
//
// Both return at once with the kernel enqueued (or not, on an error); they
// never synchronize. Hot path: no allocation, no lock, one launch.
#pragma once

#include <cstddef>

#include "device/device.h"

namespace braid::device::cuda {

// Enqueues on `stream` (a cudaStream_t; nullptr is the legacy default
// stream) dst = srcs[0] op srcs[1] op ... op srcs[n-1] over args.count
// elements of args.type, with n = args.inputs, as ReduceArgs states: folded
// left to right in the accumulation type (fp32 for fp16, bf16 and fp8) and
// rounded once, bit for bit the host kernels' result for n = 2; n = 1 is a
// bit copy. With op Avg and args.finalizeDivisor >= 1, each result is then
// divided as reduce::finalize does. Uses 16-byte loads and stores where dst
// and every source have the same address modulo 16, element accesses
// otherwise (any address and count are correct). dst may alias a source
// exactly. `smCount` (the device's multiprocessor count) sizes the grid.
// Returns the launch's cudaError_t as an int: 0 on success (a count of 0
// launches nothing and succeeds), cudaErrorInvalidValue for arguments that
// break the REQUIRES.
// REQUIRES: 1 <= args.inputs <= kMaxReduceInputs; isValid(args.type) and
// isValid(args.op); args.finalizeDivisor >= 0; dst and the sources in
// memory the current device can access (its own, or a peer's mapped with
// peer access); dst overlaps no source except by being equal to it;
// smCount >= 1 (a smaller value is taken as 1).
int launchReduce(void* stream, const ReduceArgs& args, int smCount);

// Enqueues on `stream` a kernel that copies `bytes` from src to dst, for
// copies within one device or into a peer's memory mapped with peer
// access. Moves 16-, 8- or 4-byte words, the widest that dst and src share
// an address offset for, bytes otherwise. Returns the launch's cudaError_t
// as an int (0 on success; 0 bytes launches nothing and succeeds).
// REQUIRES: dst and src in memory the current device can access; the two
// ranges do not overlap unless dst == src; smCount >= 1 (a smaller value
// is taken as 1).
int launchCopy(void* stream, void* dst, const void* src, size_t bytes, int smCount);

// Enqueues on `stream` one single-thread kernel per kPolledOps operations
// that runs them in order: writes after a system-scope fence, Adds, and
// waits that poll the flag (sleeping ~200 ns between looks) until it
// passes (or, with an abort word, until that is not 0), each value taken
// relative to *op.base where there is one. For
// the batches a stream memory operation cannot express (FlagOp::polled()).
// Returns the launch's cudaError_t as an int.
// REQUIRES: every flag and base in memory the current device can access.
inline constexpr size_t kPolledOps = 32;
int launchPolledFlags(void* stream, const FlagOp* ops, size_t count);

}  // namespace braid::device::cuda
