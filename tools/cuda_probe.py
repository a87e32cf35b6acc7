#!/usr/bin/env python3
"""Asks the CUDA driver what braid relies on, before anything is built:
libcuda.so.1 through ctypes, no toolkit, no compiler, no braid.

    python3 tools/cuda_probe.py [--lib PATH]

Prints the driver's version, the device count and, for each device, its
name, UUID, PCI bus id, memory, compute capability, multiprocessor count and
the attributes the CUDA device (src/device/cuda) depends on: virtual memory
management with POSIX file-descriptor handles (connections and windows are
cuMemCreate'd and passed to peers as fds), dma-buf export and GPUDirect RDMA
with VMM (ibverbs), the v2 stream memory operations (flag waits and writes),
unified addressing and pageable memory access. The last line is a one-line
summary.

Every driver call is checked: the first that fails is printed with its name
and the driver's name and description of the error, and the exit status is 1.
Where libcuda cannot be loaded (no driver here) it says why and exits 77.
--lib names another library (e.g. the toolkit's stub, to see a failing call).
The enumerators' values are those of CUDA 13.0's cuda.h.
"""
import argparse
import ctypes
import sys

SKIP = 77

# CUdevice_attribute values from /usr/local/cuda/include/cuda.h (CUDA 13.0).
ATTRIBUTES = [
    ("COMPUTE_CAPABILITY_MAJOR", 75),
    ("COMPUTE_CAPABILITY_MINOR", 76),
    ("MULTIPROCESSOR_COUNT", 16),
    ("UNIFIED_ADDRESSING", 41),
    ("VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", 102),
    ("HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", 103),
    ("DMA_BUF_SUPPORTED", 124),
    ("GPU_DIRECT_RDMA_SUPPORTED", 116),
    ("GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED", 110),
    ("CAN_USE_64_BIT_STREAM_MEM_OPS", 122),
    ("CAN_USE_STREAM_WAIT_VALUE_NOR", 123),
    ("PAGEABLE_MEMORY_ACCESS", 88),
    ("HOST_NATIVE_ATOMIC_SUPPORTED", 86),
    ("PCI_DOMAIN_ID", 50),
]
# Without this braid's CUDA device cannot tell its pointers apart.
REQUIRED = ("UNIFIED_ADDRESSING",)
# Without these it falls back (cudaMalloc'd memory, FIFOs to other processes
# staged through host memory) and logs why.
FALLBACK = ("VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED")


# Names of the CUresults a probe meets most, for a driver (the toolkit's stub)
# whose cuGetErrorName fails too.
KNOWN_ERRORS = {1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
                3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED",
                34: "CUDA_ERROR_STUB_LIBRARY", 36: "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
                46: "CUDA_ERROR_DEVICE_UNAVAILABLE", 100: "CUDA_ERROR_NO_DEVICE",
                101: "CUDA_ERROR_INVALID_DEVICE", 304: "CUDA_ERROR_OPERATING_SYSTEM",
                801: "CUDA_ERROR_NOT_SUPPORTED", 802: "CUDA_ERROR_SYSTEM_NOT_READY",
                803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
                804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", 999: "CUDA_ERROR_UNKNOWN"}


class DriverError(Exception):
    pass


class Driver:
    """libcuda's entry points; call() checks each CUresult."""

    def __init__(self, lib):
        self.lib = lib

    def has(self, name):
        return hasattr(self.lib, name)

    def error(self, rc):
        """The driver's name and description of a CUresult, or why not."""
        text = []
        for fn in ("cuGetErrorName", "cuGetErrorString"):
            s = ctypes.c_char_p()
            got = getattr(self.lib, fn)(rc, ctypes.byref(s)) if self.has(fn) else None
            if got == 0 and s.value:
                text.append(s.value.decode(errors="replace"))
            else:
                text.append(f"{fn} failed too ({got})")
        if not text[0].startswith("CUDA_"):
            text[0] = KNOWN_ERRORS.get(rc, "CUresult")
        return f"{text[0]} ({rc}): {text[1]}"

    def call(self, name, *args, what=""):
        """name(*args), raising DriverError naming it (and `what` it asked
        for) with the error where it fails."""
        fn = getattr(self.lib, name)
        fn.restype = ctypes.c_int
        rc = fn(*args)
        if rc != 0:
            raise DriverError(f"{name}{f'({what})' if what else ''} failed: {self.error(rc)}")


def probe(driver):
    version = ctypes.c_int()
    driver.call("cuDriverGetVersion", ctypes.byref(version))
    v = version.value
    print(f"driver API version: {v // 1000}.{v % 1000 // 10} ({v})")
    driver.call("cuInit", 0)
    count = ctypes.c_int()
    driver.call("cuDeviceGetCount", ctypes.byref(count))
    print(f"devices: {count.value}")
    summary = []
    for ordinal in range(count.value):
        dev = ctypes.c_int()
        driver.call("cuDeviceGet", ctypes.byref(dev), ordinal)
        name = ctypes.create_string_buffer(256)
        driver.call("cuDeviceGetName", name, len(name), dev)
        uuid = ctypes.create_string_buffer(16)
        uuid_fn = "cuDeviceGetUuid_v2" if driver.has("cuDeviceGetUuid_v2") else "cuDeviceGetUuid"
        driver.call(uuid_fn, uuid, dev)
        h = uuid.raw.hex()
        bus = ctypes.create_string_buffer(64)
        driver.call("cuDeviceGetPCIBusId", bus, len(bus), dev)
        memory = ctypes.c_size_t()
        driver.call("cuDeviceTotalMem_v2", ctypes.byref(memory), dev)
        print(f"device {ordinal}: {name.value.decode()}")
        print(f"  uuid: GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
        print(f"  pci bus id: {bus.value.decode()}")
        print(f"  memory: {memory.value / 2**30:.1f} GiB")
        values = {}
        for attr, number in ATTRIBUTES:
            value = ctypes.c_int()
            driver.call("cuDeviceGetAttribute", ctypes.byref(value), number, dev,
                        what=f"CU_DEVICE_ATTRIBUTE_{attr} = {number}, device {ordinal}")
            values[attr] = value.value
            print(f"  CU_DEVICE_ATTRIBUTE_{attr} ({number}): {value.value}")
        missing = [a for a in REQUIRED if not values[a]]
        if missing:
            raise DriverError(f"device {ordinal} lacks what braid's CUDA device needs: "
                              + ", ".join(missing))
        lacking = [a for a in FALLBACK if not values[a]]
        if lacking:
            print(f"  note: without {', '.join(lacking)}, braid's memory on device {ordinal} is "
                  "not shared between processes: their FIFOs are staged through host memory")
        summary.append(f"{name.value.decode()} sm_{values['COMPUTE_CAPABILITY_MAJOR']}"
                       f"{values['COMPUTE_CAPABILITY_MINOR']} {values['MULTIPROCESSOR_COUNT']} SMs"
                       f" vmm={values['VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED']}"
                       f" fd={values['HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED']}"
                       f" dmabuf={values['DMA_BUF_SUPPORTED']}"
                       f" rdma-vmm={values['GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED']}"
                       f" wait-nor={values['CAN_USE_STREAM_WAIT_VALUE_NOR']}")
    print(f"probe: driver {v // 1000}.{v % 1000 // 10}, {count.value} device(s)"
          + "".join(f"; {s}" for s in summary))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", default="libcuda.so.1", help="the driver library to load")
    args = parser.parse_args()
    try:
        lib = ctypes.CDLL(args.lib)
    except OSError as e:
        print(f"skip: {args.lib} cannot be loaded (no NVIDIA driver here?): {e}")
        return SKIP
    try:
        probe(Driver(lib))
    except DriverError as e:
        print(f"error: {e}")
        return 1
    except AttributeError as e:  # an entry point this driver does not export
        print(f"error: {args.lib} lacks an entry point: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
