// The emulated device (BRAID_DEVICE=emulated): a Device made of host
// memory, so that everything above the CUDA binding runs and is tested on
// machines without a GPU.
//
// - Memory is memfd-backed and mapped shared, so it is exported to and
//   imported by other processes through the same file-descriptor passing
//   as cuMem memory. Every allocation and import is registered with the
//   device it belongs to; deviceOf() looks pointers up there.
// - A stream is an in-order worker thread; an event is a counter the worker
//   advances. A kernel is braid's host reduction (reduce::kernelFor), so
//   its results are the host path's, bit for bit.
// - A flag wait is an atomic wait on the flag's word (a futex, valid across
//   processes on shared memory); like a GPU's it never gives up. A flag
//   write stores and wakes the waiters. Destroying a stream returns at
//   once; what was queued on it still runs, as on a GPU.
//
// kDevices GPUs exist; a process sees them all, or those
// BRAID_EMULATED_VISIBLE_DEVICES names (as CUDA_VISIBLE_DEVICES: its device
// numbers are the list's order, and a GPU's UUID is the same everywhere).
// Each thread's current device starts at 0. Every device reaches every
// other one (as if all had peer access), unless BRAID_EMULATED_PEER_ACCESS=0
// says none does; BRAID_EMULATED_FD_HANDLES=0 makes device memory
// unexportable, as on GPUs without cuMem POSIX-fd handles.
#pragma once

#include <memory>

#include "device/device.h"

namespace braid::device::emulated {

inline constexpr int kDevices = 8;

// Throws Error(InvalidArgument) for a bad BRAID_EMULATED_VISIBLE_DEVICES.
std::unique_ptr<Device> create();

}  // namespace braid::device::emulated
