// A program written against NCCL's own nccl.h for device buffers in NCCL's
// single-process model, as a user's multi-GPU program would be: one
// process, one thread, ncclCommInitAll over N devices (a device may repeat),
// ncclMemAlloc buffers, an all-gather and an all-reduce issued on every
// communicator inside one ncclGroupStart/ncclGroupEnd, a ring of
// ncclSend/ncclRecv,
// symmetric windows (ncclCommWindowRegister) carrying an all-reduce, and
// every result checked. Streams and copies go through
// benchmarks/peers/nccl_device_calls.h: braid's device functions where
// libnccl.so.2 is braid's, else the CUDA runtime's, so the same binary
// runs on NVIDIA's NCCL unchanged.
//   nccl_device_program N DEVICES   exit status 0 when every check passed
//   (DEVICES: how many distinct devices to spread the N ranks over)
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "benchmarks/peers/nccl_device_calls.h"
#include "nccl_call.h"

namespace {

int gFailures = 0;

void failed(const std::string& what) {
  if (++gFailures <= 20) fprintf(stderr, "nccl_device_program: %s\n", what.c_str());
}

#define CHECK(call) NCCL_CALL_OR(call, exit(1))

void deviceCall(int status, const char* what) {
  braid::peers::NcclDeviceCalls::check(status, "nccl_device_program", what);
}

struct Rank {
  ncclComm_t comm = nullptr;
  int device = 0;
  void* stream = nullptr;
  float* in = nullptr;      // count
  float* out = nullptr;     // count * n (all-gather)
  float* ring = nullptr;    // count: the ring's receive
  float* window = nullptr;  // 2 * count, registered
  ncclWindow_t handle = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 3;
  const int distinct = argc > 2 ? atoi(argv[2]) : 2;
  if (n < 1 || distinct < 1) {
    fprintf(stderr, "usage: nccl_device_program N DEVICES\n");
    return 2;
  }
  braid::peers::NcclDeviceCalls device("nccl_device_program");
  const size_t count = 40009;
  std::vector<int> devices(n);
  for (int r = 0; r < n; ++r) devices[r] = r % distinct;
  std::vector<Rank> ranks(n);
  std::vector<ncclComm_t> comms(n);
  CHECK(ncclCommInitAll(comms.data(), n, devices.data()));
  for (int r = 0; r < n; ++r) {
    Rank& rank = ranks[r];
    rank.comm = comms[r];
    rank.device = devices[r];
    deviceCall(device.setCurrent(rank.device), "setting the device");
    deviceCall(device.streamCreate(&rank.stream), "making a stream");
    void* memory = nullptr;
    CHECK(ncclMemAlloc(&memory, count * sizeof(float)));
    rank.in = static_cast<float*>(memory);
    CHECK(ncclMemAlloc(&memory, count * n * sizeof(float)));
    rank.out = static_cast<float*>(memory);
    CHECK(ncclMemAlloc(&memory, count * sizeof(float)));
    rank.ring = static_cast<float*>(memory);
    CHECK(ncclMemAlloc(&memory, 2 * count * sizeof(float)));
    rank.window = static_cast<float*>(memory);
    std::vector<float> mine(count);
    for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>((r + 1) * (i % 89));
    deviceCall(device.copy(rank.in, mine.data(), count * sizeof(float)), "copying in");
    deviceCall(device.copy(rank.window, mine.data(), count * sizeof(float)), "copying in");
  }
  auto streamOf = [](const Rank& rank) { return static_cast<cudaStream_t>(rank.stream); };
  auto synchronizeAll = [&] {
    for (Rank& rank : ranks) deviceCall(device.streamSynchronize(rank.stream), "synchronizing");
  };
  auto fetch = [&](const float* from, size_t elements) {
    std::vector<float> values(elements);
    deviceCall(device.copy(values.data(), from, elements * sizeof(float)), "copying out");
    return values;
  };
  const float total = static_cast<float>(n * (n + 1) / 2);

  // 1. An all-gather and an all-reduce on every communicator, in one group.
  CHECK(ncclGroupStart());
  for (Rank& rank : ranks) {
    CHECK(ncclAllGather(rank.in, rank.out, count, ncclFloat32, rank.comm, streamOf(rank)));
    CHECK(ncclAllReduce(rank.in, rank.in, count, ncclFloat32, ncclSum, rank.comm, streamOf(rank)));
  }
  CHECK(ncclGroupEnd());
  synchronizeAll();
  for (int r = 0; r < n; ++r) {
    const std::vector<float> sum = fetch(ranks[r].in, count);
    const std::vector<float> all = fetch(ranks[r].out, count * n);
    for (size_t i = 0; i < count; ++i)
      if (sum[i] != total * static_cast<float>(i % 89)) {
        failed("rank " + std::to_string(r) + ": all-reduce element " + std::to_string(i) + " is " +
               std::to_string(sum[i]));
        break;
      }
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; i += 101)
        if (all[q * count + i] != static_cast<float>((q + 1) * (i % 89))) {
          failed("rank " + std::to_string(r) + ": all-gather element " + std::to_string(i) +
                 " of rank " + std::to_string(q) + " is " + std::to_string(all[q * count + i]));
          q = n;
          break;
        }
  }

  // 2. A ring of sends and receives, in one group.
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; ++r) {
    Rank& rank = ranks[r];
    CHECK(
        ncclSend(rank.out + r * count, count, ncclFloat32, (r + 1) % n, rank.comm, streamOf(rank)));
    CHECK(ncclRecv(rank.ring, count, ncclFloat32, (r + n - 1) % n, rank.comm, streamOf(rank)));
  }
  CHECK(ncclGroupEnd());
  synchronizeAll();
  for (int r = 0; r < n; ++r) {
    const int from = (r + n - 1) % n;
    const std::vector<float> got = fetch(ranks[r].ring, count);
    for (size_t i = 0; i < count; ++i)
      if (got[i] != static_cast<float>((from + 1) * (i % 89))) {
        failed("rank " + std::to_string(r) + ": element " + std::to_string(i) + " from rank " +
               std::to_string(from) + " is " + std::to_string(got[i]));
        break;
      }
  }

  // 3. Symmetric windows, registered in a group, carrying an all-reduce.
  CHECK(ncclGroupStart());
  for (Rank& rank : ranks)
    CHECK(ncclCommWindowRegister(rank.comm, rank.window, 2 * count * sizeof(float), &rank.handle,
                                 NCCL_WIN_COLL_SYMMETRIC));
  CHECK(ncclGroupEnd());
  CHECK(ncclGroupStart());
  for (Rank& rank : ranks)
    CHECK(ncclAllReduce(rank.window, rank.window + count, count, ncclFloat32, ncclMax, rank.comm,
                        streamOf(rank)));
  CHECK(ncclGroupEnd());
  synchronizeAll();
  for (int r = 0; r < n; ++r) {
    const std::vector<float> max = fetch(ranks[r].window + count, count);
    for (size_t i = 0; i < count; ++i)
      if (max[i] != static_cast<float>(n * (i % 89))) {
        failed("rank " + std::to_string(r) + ": window all-reduce element " + std::to_string(i) +
               " is " + std::to_string(max[i]));
        break;
      }
  }
  CHECK(ncclGroupStart());
  for (Rank& rank : ranks) CHECK(ncclCommWindowDeregister(rank.comm, rank.handle));
  CHECK(ncclGroupEnd());

  for (Rank& rank : ranks) {
    for (void* memory : {static_cast<void*>(rank.in), static_cast<void*>(rank.out),
                         static_cast<void*>(rank.ring), static_cast<void*>(rank.window)})
      CHECK(ncclMemFree(memory));
    deviceCall(device.streamDestroy(rank.stream), "destroying a stream");
    CHECK(ncclCommDestroy(rank.comm));
  }
  if (gFailures == 0)
    printf("nccl_device_program: %d ranks on %d devices: every check passed\n", n, distinct);
  return gFailures == 0 ? 0 : 1;
}
