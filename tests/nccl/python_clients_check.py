"""Python clients of NCCL on braid's libnccl.so.2: NVIDIA's bindings
(nccl4py's nccl.bindings) and CuPy's NCCL module (cupy.cuda.nccl).

    python_clients_check.py LIBDIR

Run with LD_LIBRARY_PATH=LIBDIR by a Python that has nccl4py, CuPy and
numpy. Checks that the library loaded is braid's, then, with three ranks of
this process on host buffers: through nccl4py the version, a grouped
all-reduce, the memory statistics and a ring of one-sided puts with
signals into host windows; through CuPy the version, a unique id and a
grouped all-reduce. What needs a GPU (nccl4py's nccl.core, which imports
cuda.bindings; device buffers; CuPy's arrays) is not run here.
"""
import os
import sys

import numpy as np
import nccl.bindings.nccl as b
from cupy.cuda import nccl as cupy_nccl

RANKS = 3


def main():
    libdir = os.path.realpath(sys.argv[1])
    version = b.get_version()  # loads the library
    with open("/proc/self/maps") as maps:
        loaded = {line.split()[-1] for line in maps if "libnccl.so" in line}
    if not loaded or any(os.path.dirname(os.path.realpath(p)) != libdir for p in loaded):
        sys.exit(f"libnccl loaded from {sorted(loaded)}, not {libdir}")
    if version < 23206:
        sys.exit(f"get_version: {version}")

    comms = b.comm_init_all(RANKS, 0)
    buffers = [np.full(1000, r + 1, dtype=np.float32) for r in range(RANKS)]
    b.group_start()
    for r, comm in enumerate(comms):
        pointer = buffers[r].ctypes.data
        b.all_reduce(pointer, pointer, 1000, b.DataType.Float32, b.RedOp.Sum, comm, 0)
    b.group_end()
    if any((buffer != 6).any() for buffer in buffers):
        sys.exit(f"all_reduce: {[float(buffer[0]) for buffer in buffers]}, not 6")
    if b.comm_mem_stats(comms[0], b.CommMemStat.GpuMemTotal) != 0:
        sys.exit("comm_mem_stats: device memory counted on host buffers")

    inbox = [np.zeros(100, dtype=np.int32) for _ in range(RANKS)]
    b.group_start()
    windows = [b.comm_window_register(comm, inbox[r].ctypes.data, inbox[r].nbytes, 0)
               for r, comm in enumerate(comms)]
    b.group_end()
    data = [np.arange(100, dtype=np.int32) + 1000 * r for r in range(RANKS)]
    for r, comm in enumerate(comms):
        b.put_signal(data[r].ctypes.data, 100, b.DataType.Int32, (r + 1) % RANKS, windows[r], 0,
                     0, 0, 0, comm, 0)
    for r, comm in enumerate(comms):
        wait = np.array([(1, (r - 1) % RANKS, 0, 0)], dtype=b.wait_signal_desc_dtype)
        b.wait_signal(1, wait.ctypes.data, comm, 0)
        if (inbox[r] != data[(r - 1) % RANKS]).any():
            sys.exit(f"rank {r}'s window does not hold rank {(r - 1) % RANKS}'s put")
    b.group_start()
    for comm, window in zip(comms, windows):
        b.comm_window_deregister(comm, window)
    b.group_end()
    for comm in comms:
        b.comm_destroy(comm)
    print(f"nccl4py on braid's library ({version}): all-reduce, memory statistics and "
          f"one-sided puts at {RANKS} ranks passed")

    if cupy_nccl.get_version() != version:
        sys.exit(f"cupy: get_version: {cupy_nccl.get_version()}, not {version}")
    if len(cupy_nccl.get_unique_id()) != 128:
        sys.exit("cupy: get_unique_id is not 128 bytes")
    comms = cupy_nccl.NcclCommunicator.initAll(RANKS)
    buffers = [np.full(1000, r + 1, dtype=np.float32) for r in range(RANKS)]
    cupy_nccl.groupStart()
    for r, comm in enumerate(comms):
        pointer = buffers[r].ctypes.data
        comm.allReduce(pointer, pointer, 1000, cupy_nccl.NCCL_FLOAT32, cupy_nccl.NCCL_SUM, 0)
    cupy_nccl.groupEnd()
    if any((buffer != 6).any() for buffer in buffers) or comms[2].rank_id() != 2:
        sys.exit(f"cupy: all-reduce: {[float(buffer[0]) for buffer in buffers]}, not 6")
    for comm in comms:
        comm.destroy()
    print(f"CuPy's NCCL module on braid's library: a grouped all-reduce at {RANKS} ranks passed")


if __name__ == "__main__":
    main()
