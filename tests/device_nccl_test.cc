// The NCCL drop-in with device buffers: ncclMemAlloc memory and a stream
// in every collective, send/recv in a group, ncclCommCuDevice, and a peer's
// failure reported by ncclCommGetAsyncError, on the emulated device (and
// on CUDA where a GPU is present).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "braid/nccl/nccl.h"
#include "core/errors.h"
#include "device_support.h"
#include "multirank.h"

// The host-side calls of NCCL's device API, which NVIDIA declares in
// nccl_device/core.h (braid ships no such header; programs that link them,
// PyTorch among them, declare them through NVIDIA's).
extern "C" {
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void** outPtr);
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void** outPtr);
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void* reqs, void* outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void* devComm);
}

namespace braid::testing {
namespace {

using std::chrono::milliseconds;

// NCCL's error, with ncclGetLastError's message, as a rank failure.
void check(ncclResult_t result, const char* what) {
  if (result != ncclSuccess)
    throw RankFailure{
        format("%s returned %d: %s", what, static_cast<int>(result), ncclGetLastError(nullptr))};
}

// ncclMemAlloc memory holding `values`, and back.
template <typename T>
T* deviceCopyOf(const std::vector<T>& values) {
  void* memory = nullptr;
  check(ncclMemAlloc(&memory, std::max<size_t>(values.size(), 1) * sizeof(T)), "ncclMemAlloc");
  device::current()->copyNow(memory, values.data(), values.size() * sizeof(T));
  return static_cast<T*>(memory);
}
template <typename T>
std::vector<T> hostCopyOf(const T* memory, size_t count) {
  std::vector<T> values(count);
  device::current()->copyNow(values.data(), memory, count * sizeof(T));
  return values;
}

class DeviceNccl : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string why = unavailable(GetParam());
    if (!why.empty()) GTEST_SKIP() << "no " << GetParam() << " device here: " << why;
    ::setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  }
  void TearDown() override { ::unsetenv("NCCL_SOCKET_IFNAME"); }
  RunOptions options() const {
    RunOptions options;
    const std::string backend = GetParam();
    options.enter = [backend](int) { device::select(backend); };
    return options;
  }
};

ncclComm_t initRank(int nranks, int rank, const UniqueId& id) {
  ncclUniqueId ncclId;
  std::memcpy(ncclId.internal, id.bytes.data(), sizeof(ncclId.internal));
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, nranks, ncclId, rank), "ncclCommInitRank");
  return comm;
}

TEST_P(DeviceNccl, EveryCollectiveAndGroupedSendRecvOnDeviceBuffersAt3Ranks) {
  constexpr int kRanks = 3;
  runProcesses(
      kRanks,
      [](int rank, const UniqueId& id, const Config&) {
        ncclComm_t comm = initRank(kRanks, rank, id);
        int device = -1;
        check(ncclCommCuDevice(comm, &device), "ncclCommCuDevice");
        require(device == device::current()->current(),
                format("ncclCommCuDevice says %d, the current device is %d", device,
                       device::current()->current()));
        TestStream stream(device);
        auto cudaStream = static_cast<cudaStream_t>(stream.handle());
        const size_t count = 100003;
        std::vector<float> mine(count);
        for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>((rank + 1) * (i % 1000));
        float* in = deviceCopyOf(mine);
        require(device::current()->deviceOf(in) == device, "ncclMemAlloc gave host memory");
        float* out = deviceCopyOf(std::vector<float>(count * kRanks, -1.0f));

        check(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, comm, cudaStream),
              "ncclAllReduce");
        stream.synchronize();
        std::vector<float> got = hostCopyOf(out, count);
        for (size_t i = 0; i < count; ++i)
          require(got[i] == static_cast<float>(6 * (i % 1000)),
                  format("allReduce element %zu is %g", i, got[i]));

        check(ncclAllGather(in, out, count, ncclFloat32, comm, cudaStream), "ncclAllGather");
        check(ncclBroadcast(in, in, count, ncclFloat32, 2, comm, cudaStream), "ncclBroadcast");
        stream.synchronize();
        got = hostCopyOf(out, count * kRanks);
        for (int r = 0; r < kRanks; ++r)
          for (size_t i = 0; i < count; i += 997)
            require(got[r * count + i] == static_cast<float>((r + 1) * (i % 1000)),
                    format("allGather element %zu of rank %d is %g", i, r, got[r * count + i]));
        got = hostCopyOf(in, count);
        require(got[count - 1] == static_cast<float>(3 * ((count - 1) % 1000)),
                "broadcast from rank 2 is wrong");

        // Grouped send/recv, every rank to every rank: (from, to, i) tagged.
        std::vector<int32_t> tagged(count * kRanks);
        for (int to = 0; to < kRanks; ++to)
          for (size_t i = 0; i < count; ++i)
            tagged[to * count + i] = static_cast<int32_t>(rank * 1000000 + to * 100000 + i % 1000);
        int32_t* sends = deviceCopyOf(tagged);
        int32_t* recvs = deviceCopyOf(std::vector<int32_t>(count * kRanks, -1));
        check(ncclGroupStart(), "ncclGroupStart");
        for (int peer = 0; peer < kRanks; ++peer) {
          check(ncclSend(sends + peer * count, count, ncclInt32, peer, comm, cudaStream),
                "ncclSend");
          check(ncclRecv(recvs + peer * count, count, ncclInt32, peer, comm, cudaStream),
                "ncclRecv");
        }
        check(ncclGroupEnd(), "ncclGroupEnd");
        stream.synchronize();
        const std::vector<int32_t> received = hostCopyOf(recvs, count * kRanks);
        for (int from = 0; from < kRanks; ++from)
          for (size_t i = 0; i < count; i += 991)
            require(received[from * count + i] ==
                        static_cast<int32_t>(from * 1000000 + rank * 100000 + i % 1000),
                    format("element %zu from rank %d is %d", i, from, received[from * count + i]));

        ncclResult_t state = ncclInternalError;
        check(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError");
        require(state == ncclSuccess, format("async error %d after good ops", state));
        for (void* memory : {static_cast<void*>(in), static_cast<void*>(out),
                             static_cast<void*>(sends), static_cast<void*>(recvs)})
          check(ncclMemFree(memory), "ncclMemFree");
        check(ncclCommDestroy(comm), "ncclCommDestroy");
      },
      options());
}

// NCCL's single-process model: one thread makes a communicator per device
// with ncclCommInitAll (a device may repeat), allocates on each device
// after choosing it (as cudaSetDevice would), and issues an all-reduce and
// a ring of sends and receives on every communicator inside one
// ncclGroupStart/End; nothing waits until the streams are synchronized.
TEST_P(DeviceNccl, CommInitAllAndGroupsAcrossCommunicatorsFromOneThread) {
  runProcesses(
      1,
      [](int, const UniqueId&, const Config&) {
        device::Device& dev = *device::current();
        const int kDevices[] = {0, 1 % dev.count(), 1 % dev.count()};
        constexpr int kRanks = 3;
        ncclComm_t comms[kRanks] = {};
        check(ncclCommInitAll(comms, kRanks, kDevices), "ncclCommInitAll");
        const size_t count = 70001;
        std::vector<std::unique_ptr<TestStream>> streams;
        std::vector<float*> sums;
        std::vector<int32_t*> sends, recvs;
        for (int r = 0; r < kRanks; ++r) {
          int device = -1, rank = -1, size = -1;
          check(ncclCommCuDevice(comms[r], &device), "ncclCommCuDevice");
          check(ncclCommUserRank(comms[r], &rank), "ncclCommUserRank");
          check(ncclCommCount(comms[r], &size), "ncclCommCount");
          require(device == kDevices[r] && rank == r && size == kRanks,
                  format("communicator %d: device %d, rank %d of %d", r, device, rank, size));
          dev.setCurrent(device);
          streams.push_back(std::make_unique<TestStream>(device));
          std::vector<float> mine(count);
          for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>((r + 1) * (i % 977));
          sums.push_back(deviceCopyOf(mine));
          require(dev.deviceOf(sums.back()) == device,
                  format("ncclMemAlloc after choosing device %d gave memory of %d", device,
                         dev.deviceOf(sums.back())));
          std::vector<int32_t> tagged(count);
          for (size_t i = 0; i < count; ++i) tagged[i] = static_cast<int32_t>(r * 1000003 + i);
          sends.push_back(deviceCopyOf(tagged));
          recvs.push_back(deviceCopyOf(std::vector<int32_t>(count, -1)));
        }
        check(ncclGroupStart(), "ncclGroupStart");
        for (int r = 0; r < kRanks; ++r) {
          auto stream = static_cast<cudaStream_t>(streams[r]->handle());
          check(ncclAllReduce(sums[r], sums[r], count, ncclFloat32, ncclSum, comms[r], stream),
                "ncclAllReduce");
          check(ncclSend(sends[r], count, ncclInt32, (r + 1) % kRanks, comms[r], stream),
                "ncclSend");
          check(ncclRecv(recvs[r], count, ncclInt32, (r + kRanks - 1) % kRanks, comms[r], stream),
                "ncclRecv");
        }
        check(ncclGroupEnd(), "ncclGroupEnd");
        for (auto& stream : streams) stream->synchronize();
        for (int r = 0; r < kRanks; ++r) {
          const std::vector<float> sum = hostCopyOf(sums[r], count);
          for (size_t i = 0; i < count; ++i)
            require(sum[i] == static_cast<float>(6 * (i % 977)),
                    format("rank %d's all-reduce element %zu is %g", r, i, sum[i]));
          const int from = (r + kRanks - 1) % kRanks;
          const std::vector<int32_t> got = hostCopyOf(recvs[r], count);
          for (size_t i = 0; i < count; ++i)
            require(got[i] == static_cast<int32_t>(from * 1000003 + i),
                    format("rank %d's element %zu from rank %d is %d", r, i, from, got[i]));
          for (void* memory : {static_cast<void*>(sums[r]), static_cast<void*>(sends[r]),
                               static_cast<void*>(recvs[r])})
            check(ncclMemFree(memory), "ncclMemFree");
        }
        for (ncclComm_t comm : comms) check(ncclCommDestroy(comm), "ncclCommDestroy");

        // A device this process does not have: refused, naming the entry.
        const int bad[] = {0, dev.count()};
        ncclComm_t never[2] = {};
        require(ncclCommInitAll(never, 2, bad) == ncclInvalidArgument,
                "ncclCommInitAll accepted a missing device");
        require(std::string(ncclGetLastError(nullptr)).find("devlist[1]") != std::string::npos,
                std::string("the message does not name devlist[1]: ") + ncclGetLastError(nullptr));
      },
      options());
}

// NCCL's single-process model captured into graphs: one thread captures an
// all-reduce and an all-gather on every communicator's stream inside one
// ncclGroupStart/ncclGroupEnd, then replays the graphs 20 times with new
// inputs, checking every result.
TEST_P(DeviceNccl, CollectivesCapturedInAGroupAcrossCommunicatorsReplay) {
  runProcesses(
      1,
      [](int, const UniqueId&, const Config&) {
        device::Device& dev = *device::current();
        constexpr int kRanks = 3;
        const int kDevices[] = {0, 1 % dev.count(), 0};
        ncclComm_t comms[kRanks] = {};
        check(ncclCommInitAll(comms, kRanks, kDevices), "ncclCommInitAll");
        const size_t count = 30011;
        std::vector<std::unique_ptr<TestStream>> streams;
        std::vector<float*> ins, sums, alls;
        for (int r = 0; r < kRanks; ++r) {
          dev.setCurrent(kDevices[r]);
          streams.push_back(std::make_unique<TestStream>(kDevices[r]));
          ins.push_back(deviceCopyOf(std::vector<float>(count, 0.0f)));
          sums.push_back(deviceCopyOf(std::vector<float>(count, -1.0f)));
          alls.push_back(deviceCopyOf(std::vector<float>(count * kRanks, -1.0f)));
        }
        for (auto& stream : streams) dev.beginCapture(stream->handle());
        check(ncclGroupStart(), "ncclGroupStart");
        for (int r = 0; r < kRanks; ++r) {
          auto stream = static_cast<cudaStream_t>(streams[r]->handle());
          check(ncclAllReduce(ins[r], sums[r], count, ncclFloat32, ncclSum, comms[r], stream),
                "ncclAllReduce");
          check(ncclAllGather(ins[r], alls[r], count, ncclFloat32, comms[r], stream),
                "ncclAllGather");
        }
        check(ncclGroupEnd(), "ncclGroupEnd");
        std::vector<device::GraphHandle> graphs;
        for (auto& stream : streams) graphs.push_back(dev.endCapture(stream->handle()));
        for (int k = 0; k < 20; ++k) {
          for (int r = 0; r < kRanks; ++r) {
            std::vector<float> mine(count);
            for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>((r + 1) * (i % 31) + k);
            dev.copyNow(ins[r], mine.data(), count * sizeof(float));
          }
          for (int r = 0; r < kRanks; ++r) dev.launchGraph(graphs[r], streams[r]->handle());
          for (auto& stream : streams) stream->synchronize();
          for (int r = 0; r < kRanks; ++r) {
            const std::vector<float> sum = hostCopyOf(sums[r], count);
            const std::vector<float> all = hostCopyOf(alls[r], count * kRanks);
            for (size_t i = 0; i < count; ++i) {
              require(sum[i] == static_cast<float>(6 * (i % 31) + 3 * k),
                      format("replay %d: rank %d's all-reduce element %zu is %g", k, r, i, sum[i]));
              for (int q = 0; q < kRanks; ++q)
                require(
                    all[q * count + i] == static_cast<float>((q + 1) * (i % 31) + k),
                    format("replay %d: rank %d's all-gather element %zu of rank %d", k, r, i, q));
            }
          }
        }
        for (device::GraphHandle graph : graphs) dev.destroyGraph(graph);
        for (int r = 0; r < kRanks; ++r)
          for (float* memory : {ins[r], sums[r], alls[r]})
            check(ncclMemFree(memory), "ncclMemFree");
        for (ncclComm_t comm : comms) check(ncclCommDestroy(comm), "ncclCommDestroy");
      },
      options());
}

// Symmetric windows through NCCL's API, in the single-process model: one
// thread registers a window on every communicator inside a group, runs an
// all-reduce on window buffers (braid takes its direct path) and one on
// ordinary ncclMemAlloc buffers, and deregisters in a group.
TEST_P(DeviceNccl, SymmetricWindowsRegisteredInAGroupCarryDirectAllReduces) {
  runProcesses(
      1,
      [](int, const UniqueId&, const Config&) {
        device::Device& dev = *device::current();
        constexpr int kRanks = 3;
        const int kDevices[] = {0, 1 % dev.count(), 2 % dev.count()};
        ncclComm_t comms[kRanks] = {};
        check(ncclCommInitAll(comms, kRanks, kDevices), "ncclCommInitAll");
        const size_t count = 30011, bytes = 2 * count * sizeof(float) + 4096;
        std::vector<std::unique_ptr<TestStream>> streams;
        std::vector<float*> windows, plain;
        ncclWindow_t handles[kRanks] = {};
        for (int r = 0; r < kRanks; ++r) {
          dev.setCurrent(kDevices[r]);
          streams.push_back(std::make_unique<TestStream>(kDevices[r]));
          void* memory = nullptr;
          check(ncclMemAlloc(&memory, bytes), "ncclMemAlloc");
          windows.push_back(static_cast<float*>(memory));
          plain.push_back(deviceCopyOf(std::vector<float>(count, 1.0f + r)));
          std::vector<float> mine(count);
          for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>((r + 1) * (i % 101));
          dev.copyNow(windows[r], mine.data(), count * sizeof(float));
        }
        check(ncclGroupStart(), "ncclGroupStart");
        for (int r = 0; r < kRanks; ++r)
          check(ncclCommWindowRegister(comms[r], windows[r], bytes, &handles[r],
                                       NCCL_WIN_COLL_SYMMETRIC),
                "ncclCommWindowRegister");
        check(ncclGroupEnd(), "ncclGroupEnd");
        for (int r = 0; r < kRanks; ++r) {
          void* user = nullptr;
          check(ncclWinGetUserPtr(comms[r], handles[r], &user), "ncclWinGetUserPtr");
          require(user == windows[r], format("rank %d's window gives back %p, not %p", r, user,
                                             static_cast<void*>(windows[r])));
        }
        require(ncclWinGetUserPtr(comms[1], handles[0], nullptr) == ncclInvalidArgument,
                "ncclWinGetUserPtr accepted a NULL outUserPtr");
        void* user = nullptr;
        require(ncclWinGetUserPtr(comms[1], handles[0], &user) == ncclInvalidArgument,
                "ncclWinGetUserPtr accepted another communicator's window");
        // NCCL's device-API pointers: in one process every rank maps every
        // window, at the pointer its owner registered.
        for (int r = 0; r < kRanks; ++r)
          for (int p = 0; p < kRanks; ++p) {
            void* at = nullptr;
            check(ncclGetPeerDevicePointer(handles[r], 64, p, &at), "ncclGetPeerDevicePointer");
            void* want = reinterpret_cast<std::byte*>(windows[p]) + 64;
            require(at == want,
                    format("rank %d reaches rank %d's window + 64 at %p, not %p", r, p, at, want));
          }
        void* at = nullptr;
        require(ncclGetPeerDevicePointer(handles[0], 0, kRanks, &at) == ncclInvalidArgument &&
                    std::strstr(ncclGetLastError(comms[0]), "'peer'"),
                "ncclGetPeerDevicePointer took a peer out of range");
        require(ncclGetPeerDevicePointer(handles[0], bytes, 1, &at) == ncclInvalidArgument &&
                    std::strstr(ncclGetLastError(comms[0]), "'offset'"),
                "ncclGetPeerDevicePointer took an offset past the window");
        require(ncclGetPeerDevicePointer(handles[0], 0, 1, nullptr) == ncclInvalidArgument,
                "ncclGetPeerDevicePointer took a NULL outPtr");
        void* multimem = &at;
        check(ncclGetLsaMultimemDevicePointer(handles[0], 0, &multimem),
              "ncclGetLsaMultimemDevicePointer");
        require(multimem == nullptr, "a multimem address where braid makes none");
        char requirements[512] = {}, devComm[512] = {};
        require(ncclDevCommCreate(comms[0], requirements, devComm) == ncclInvalidUsage &&
                    std::strstr(ncclGetLastError(comms[0]), "no NCCL device API"),
                "ncclDevCommCreate did not refuse naming the device API");
        require(ncclDevCommDestroy(comms[0], devComm) == ncclInvalidArgument,
                "ncclDevCommDestroy took a device communicator never made");
        check(ncclGroupStart(), "ncclGroupStart");
        for (int r = 0; r < kRanks; ++r) {
          auto stream = static_cast<cudaStream_t>(streams[r]->handle());
          check(ncclAllReduce(windows[r], windows[r] + count, count, ncclFloat32, ncclSum, comms[r],
                              stream),
                "ncclAllReduce in a window");
          check(ncclAllReduce(plain[r], plain[r], count, ncclFloat32, ncclMax, comms[r], stream),
                "ncclAllReduce");
        }
        check(ncclGroupEnd(), "ncclGroupEnd");
        for (auto& stream : streams) stream->synchronize();
        for (int r = 0; r < kRanks; ++r) {
          const std::vector<float> sum = hostCopyOf(windows[r] + count, count);
          for (size_t i = 0; i < count; ++i)
            require(sum[i] == static_cast<float>(6 * (i % 101)),
                    format("rank %d's window all-reduce element %zu is %g", r, i, sum[i]));
          const std::vector<float> max = hostCopyOf(plain[r], count);
          require(max[0] == 3.0f && max[count - 1] == 3.0f,
                  format("rank %d's plain all-reduce gave %g", r, max[0]));
        }
        require(ncclCommWindowDeregister(comms[0], nullptr) == ncclInvalidArgument,
                "ncclCommWindowDeregister accepted a NULL window");
        check(ncclGroupStart(), "ncclGroupStart");
        for (int r = 0; r < kRanks; ++r)
          check(ncclCommWindowDeregister(comms[r], handles[r]), "ncclCommWindowDeregister");
        check(ncclGroupEnd(), "ncclGroupEnd");
        for (int r = 0; r < kRanks; ++r) {
          check(ncclMemFree(windows[r]), "ncclMemFree");
          check(ncclMemFree(plain[r]), "ncclMemFree");
          check(ncclCommDestroy(comms[r]), "ncclCommDestroy");
        }
      },
      options());
}

// One-sided calls into ncclMemAlloc windows, ordered on the stream: each
// rank puts a block into the next rank's window with a signal, raises the
// signal once more with no data, and waits on its stream for both raises
// from the previous rank; the block is there once the stream passed the
// wait.
TEST_P(DeviceNccl, PutSignalAndWaitSignalOnDeviceWindowsAt3Ranks) {
  constexpr int kRanks = 3;
  runProcesses(
      kRanks,
      [](int rank, const UniqueId& id, const Config&) {
        ncclComm_t comm = initRank(kRanks, rank, id);
        int device = -1;
        check(ncclCommCuDevice(comm, &device), "ncclCommCuDevice");
        TestStream stream(device);
        auto cudaStream = static_cast<cudaStream_t>(stream.handle());
        const size_t count = 65537;
        void* window = nullptr;
        check(ncclMemAlloc(&window, count * sizeof(float)), "ncclMemAlloc");
        ncclWindow_t handle = nullptr;
        check(ncclCommWindowRegister(comm, window, count * sizeof(float), &handle, 0),
              "ncclCommWindowRegister");
        std::vector<float> mine(count);
        for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(rank * 1000003 + i);
        float* source = deviceCopyOf(mine);
        const int next = (rank + 1) % kRanks, previous = (rank + kRanks - 1) % kRanks;
        check(ncclPutSignal(source, count, ncclFloat32, next, handle, 0, 0, 0, 0, comm, cudaStream),
              "ncclPutSignal");
        check(ncclSignal(next, 0, 0, 0, comm, cudaStream), "ncclSignal");
        ncclWaitSignalDesc_t bad = {1, previous, 1, 0};
        require(ncclWaitSignal(1, &bad, comm, cudaStream) == ncclInvalidArgument,
                "ncclWaitSignal accepted sigIdx 1 with numRmaSig 1");
        ncclWaitSignalDesc_t both = {2, previous, 0, 0};
        check(ncclWaitSignal(1, &both, comm, cudaStream), "ncclWaitSignal");
        stream.synchronize();
        const std::vector<float> got = hostCopyOf(static_cast<float*>(window), count);
        for (size_t i = 0; i < count; ++i)
          require(got[i] == static_cast<float>(previous * 1000003 + i),
                  format("element %zu put by rank %d is %g", i, previous, got[i]));
        check(ncclCommWindowDeregister(comm, handle), "ncclCommWindowDeregister");
        check(ncclMemFree(source), "ncclMemFree");
        check(ncclMemFree(window), "ncclMemFree");
        check(ncclCommDestroy(comm), "ncclCommDestroy");
      },
      options());
}

// A peer that aborts while this rank's device op waits for it: the op
// fails on the stream's behalf, ncclCommGetAsyncError says so (a remote
// error), ncclCommAbort returns, and the stream runs on.
TEST_P(DeviceNccl, APeersAbortIsReportedByGetAsyncErrorAndTheStreamRunsOn) {
  runProcesses(
      2,
      [](int rank, const UniqueId& id, const Config&) {
        ncclComm_t comm = initRank(2, rank, id);
        int device = -1;
        check(ncclCommCuDevice(comm, &device), "ncclCommCuDevice");
        TestStream stream(device);
        float* buffer = deviceCopyOf(std::vector<float>(4096, 1.0f));
        if (rank == 1) {
          std::this_thread::sleep_for(milliseconds(300));
          check(ncclCommAbort(comm), "ncclCommAbort");
        } else {
          check(ncclAllReduce(buffer, buffer, 4096, ncclFloat32, ncclSum, comm,
                              static_cast<cudaStream_t>(stream.handle())),
                "ncclAllReduce");
          ncclResult_t state = ncclSuccess;
          const auto start = std::chrono::steady_clock::now();
          while (state == ncclSuccess &&
                 std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
            check(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError");
            std::this_thread::sleep_for(milliseconds(10));
          }
          require(state == ncclRemoteError,
                  format("ncclCommGetAsyncError says %d, not ncclRemoteError", state));
          require(std::string(ncclGetLastError(comm)).find("peer 1") != std::string::npos,
                  std::string("the message does not name rank 1: ") + ncclGetLastError(comm));
          stream.synchronize();
          check(ncclCommAbort(comm), "ncclCommAbort");
        }
        check(ncclMemFree(buffer), "ncclMemFree");
      },
      options());
}

INSTANTIATE_TEST_SUITE_P(Device, DeviceNccl, ::testing::Values("emulated", "cuda"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace braid::testing
