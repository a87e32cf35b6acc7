// A program written against the NCCL API alone, as a user's would be: it
// forks N ranks that share a unique id, runs every collective with several
// datatypes and operators in place and out of place, an all-to-all of
// grouped send/recv, ncclAlltoAll, ncclGather, ncclScatter, a PreMulSum
// operator, a split, a shrink and a revoke in one process, a nonblocking
// communicator and bad input, checks every
// result and destroys its communicators. Built against whichever nccl.h
// comes first on the include path and linked with the libnccl.so.2 under
// test.
//   nccl_program N      exit status 0 when every rank passed
#include <nccl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "nccl_call.h"

namespace {

int gRank = 0, gRanks = 0;
int gFailures = 0;

void failed(const std::string& what) {
  if (++gFailures <= 20) fprintf(stderr, "rank %d: %s\n", gRank, what.c_str());
}

#define CHECK(call) NCCL_CALL_OR(call, return )

// ---- element values as doubles, in every datatype the test uses

uint16_t floatToHalf(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  int exponent = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = x & 0x7fffffu;
  if (exponent <= 0) return static_cast<uint16_t>(sign);  // the test's values never underflow
  uint32_t half = (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // to nearest even
  return static_cast<uint16_t>(sign | half);
}

double halfToDouble(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

uint16_t floatToBf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint32_t rest = x & 0xffffu;
  uint32_t top = x >> 16;
  if (rest > 0x8000u || (rest == 0x8000u && (top & 1u))) ++top;
  return static_cast<uint16_t>(top);
}

double bf16ToDouble(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

size_t sizeOf(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

bool isFloat(ncclDataType_t type) {
  return type == ncclFloat16 || type == ncclFloat32 || type == ncclFloat64 || type == ncclBfloat16;
}

// Stores `v` (exactly representable, or wrapped for integers) at element i.
void put(ncclDataType_t type, void* buffer, size_t i, double v) {
  auto* b = static_cast<char*>(buffer) + i * sizeOf(type);
  auto store = [&](auto x) { memcpy(b, &x, sizeof(x)); };
  const auto wide = static_cast<int64_t>(v);
  switch (type) {
    case ncclInt8:
      return store(static_cast<int8_t>(wide));
    case ncclUint8:
      return store(static_cast<uint8_t>(wide));
    case ncclInt32:
      return store(static_cast<int32_t>(wide));
    case ncclUint32:
      return store(static_cast<uint32_t>(wide));
    case ncclInt64:
      return store(wide);
    case ncclUint64:
      return store(static_cast<uint64_t>(wide));
    case ncclFloat16:
      return store(floatToHalf(static_cast<float>(v)));
    case ncclBfloat16:
      return store(floatToBf16(static_cast<float>(v)));
    case ncclFloat32:
      return store(static_cast<float>(v));
    default:
      return store(v);
  }
}

double get(ncclDataType_t type, const void* buffer, size_t i) {
  const auto* b = static_cast<const char*>(buffer) + i * sizeOf(type);
  auto load = [&](auto x) {
    memcpy(&x, b, sizeof(x));
    return x;
  };
  switch (type) {
    case ncclInt8:
      return load(int8_t{});
    case ncclUint8:
      return load(uint8_t{});
    case ncclInt32:
      return load(int32_t{});
    case ncclUint32:
      return load(uint32_t{});
    case ncclInt64:
      return static_cast<double>(load(int64_t{}));
    case ncclUint64:
      return static_cast<double>(load(uint64_t{}));
    case ncclFloat16:
      return halfToDouble(load(uint16_t{}));
    case ncclBfloat16:
      return bf16ToDouble(load(uint16_t{}));
    case ncclFloat32:
      return load(float{});
    default:
      return load(double{});
  }
}

// Rank r's input element i: a small integer, so that sums and products stay
// exact in every type.
double input(int r, size_t i) { return static_cast<double>((r + static_cast<int>(i)) % 4 + 1); }

// The expected result of reducing element i over every rank, as stored in `type`.
double reduced(ncclRedOp_t op, ncclDataType_t type, size_t i) {
  double acc = input(0, i);
  for (int r = 1; r < gRanks; ++r) {
    const double v = input(r, i);
    if (op == ncclSum || op == ncclAvg) acc += v;
    if (op == ncclProd) acc *= v;
    if (op == ncclMax) acc = std::fmax(acc, v);
    if (op == ncclMin) acc = std::fmin(acc, v);
  }
  if (op == ncclAvg) acc = isFloat(type) ? acc / gRanks : std::trunc(acc / gRanks);
  std::vector<char> one(8);
  put(type, one.data(), 0, acc);  // wraps as the type does
  return get(type, one.data(), 0);
}

bool close(ncclDataType_t type, double got, double want) {
  if (!isFloat(type)) return got == want;
  const double tolerance = type == ncclFloat16 || type == ncclBfloat16 ? 1e-2 : 1e-6;
  return std::fabs(got - want) <= tolerance * std::fmax(1.0, std::fabs(want));
}

std::string label(const char* what, ncclDataType_t type, int op, bool inPlace, size_t count) {
  char text[160];
  snprintf(text, sizeof(text), "%s type %d op %d %s count %zu", what, static_cast<int>(type), op,
           inPlace ? "in place" : "out of place", count);
  return text;
}

const ncclDataType_t kTypes[] = {ncclInt8,   ncclUint8,   ncclInt32,   ncclUint32,  ncclInt64,
                                 ncclUint64, ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
const ncclRedOp_t kOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
const size_t kCounts[] = {1, 7, 1000, 70001};

void collectives(ncclComm_t comm) {
  const int n = gRanks, me = gRank;
  for (ncclDataType_t type : kTypes)
    for (size_t count : kCounts)
      for (bool inPlace : {false, true}) {
        const size_t bytes = count * sizeOf(type);
        std::vector<char> send(bytes * n), recv(bytes * n);
        auto fill = [&](std::vector<char>& into, size_t elements, int rank) {
          for (size_t i = 0; i < elements; ++i) put(type, into.data(), i, input(rank, i));
        };
        // All-reduce and reduce with every operator.
        for (ncclRedOp_t op : kOps) {
          fill(send, count, me);
          void* out = inPlace ? send.data() : recv.data();
          CHECK(ncclAllReduce(send.data(), out, count, type, op, comm, nullptr));
          for (size_t i = 0; i < count; ++i)
            if (!close(type, get(type, out, i), reduced(op, type, i))) {
              failed(label("allreduce", type, op, inPlace, count));
              break;
            }
          const int root = static_cast<int>(count % static_cast<size_t>(n));
          fill(send, count, me);
          CHECK(ncclReduce(send.data(), out, count, type, op, root, comm, nullptr));
          if (me == root)
            for (size_t i = 0; i < count; ++i)
              if (!close(type, get(type, out, i), reduced(op, type, i))) {
                failed(label("reduce", type, op, inPlace, count));
                break;
              }
        }
        // Broadcast, and ncclBcast.
        const int root = n - 1;
        fill(send, count, me);
        void* out = inPlace ? send.data() : recv.data();
        CHECK(ncclBroadcast(send.data(), out, count, type, root, comm, nullptr));
        for (size_t i = 0; i < count; ++i)
          if (!close(type, get(type, out, i), input(root, i))) {
            failed(label("broadcast", type, -1, inPlace, count));
            break;
          }
        fill(send, count, me);
        CHECK(ncclBcast(send.data(), count, type, 0, comm, nullptr));
        for (size_t i = 0; i < count; ++i)
          if (!close(type, get(type, send.data(), i), input(0, i))) {
            failed(label("bcast", type, -1, true, count));
            break;
          }
        // All-gather: in place, each rank's part sits at its offset.
        fill(send, count, me);
        if (inPlace) {
          memcpy(recv.data() + me * bytes, send.data(), bytes);
          CHECK(ncclAllGather(recv.data() + me * bytes, recv.data(), count, type, comm, nullptr));
        } else {
          CHECK(ncclAllGather(send.data(), recv.data(), count, type, comm, nullptr));
        }
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i)
            if (!close(type, get(type, recv.data() + r * bytes, i), input(r, i))) {
              failed(label("allgather", type, -1, inPlace, count));
              r = n;
              break;
            }
        // Reduce-scatter (sum and max): rank r gets block r of the reduction of
        // every rank's n blocks; in place, the result lands at its offset.
        for (ncclRedOp_t op : {ncclSum, ncclMax}) {
          fill(send, count * n, me);
          void* result = inPlace ? send.data() + me * bytes : recv.data();
          CHECK(ncclReduceScatter(send.data(), result, count, type, op, comm, nullptr));
          for (size_t i = 0; i < count; ++i)
            if (!close(type, get(type, result, i), reduced(op, type, me * count + i))) {
              failed(label("reducescatter", type, op, inPlace, count));
              break;
            }
        }
      }
}

// Every rank sends block p of its buffer to rank p, by grouped send/recv
// (which must not deadlock whatever the order) and by ncclAlltoAll.
void allToAll(ncclComm_t comm) {
  const int n = gRanks, me = gRank;
  const size_t count = 50000;
  std::vector<int32_t> send(count * n), recv(count * n, -1), viaApi(count * n, -1);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < count; ++i)
      send[p * count + i] = me * 1000000 + p * 100000 + int(i % 1000);
  CHECK(ncclGroupStart());
  for (int p = 0; p < n; ++p) {
    CHECK(ncclSend(send.data() + p * count, count, ncclInt32, p, comm, nullptr));
    CHECK(ncclRecv(recv.data() + p * count, count, ncclInt32, p, comm, nullptr));
  }
  CHECK(ncclGroupEnd());
  CHECK(ncclAlltoAll(send.data(), viaApi.data(), count, ncclInt32, comm, nullptr));
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < count; ++i) {
      const int32_t want = p * 1000000 + me * 100000 + int(i % 1000);
      if (recv[p * count + i] != want || viaApi[p * count + i] != want) {
        failed("all-to-all: wrong block from rank " + std::to_string(p));
        return;
      }
    }
  // Gather to the last rank, then scatter from it.
  const int root = n - 1;
  std::vector<double> mine(1000, me + 0.5), gathered(1000 * n, -1), back(1000, -1);
  CHECK(ncclGather(mine.data(), gathered.data(), mine.size(), ncclDouble, root, comm, nullptr));
  if (me == root)
    for (int r = 0; r < n; ++r)
      if (gathered[r * 1000 + 999] != r + 0.5) failed("gather: wrong block " + std::to_string(r));
  for (int r = 0; r < n; ++r) gathered[r * 1000 + 3] = r * 7.0;
  CHECK(ncclScatter(gathered.data(), back.data(), back.size(), ncclDouble, root, comm, nullptr));
  if (back[3] != me * 7.0) failed("scatter: wrong block");
}

// A PreMulSum operator multiplies each input before the sum.
void preMulSum(ncclComm_t comm) {
  const size_t count = 3000;
  float factor = 0.5f;
  ncclRedOp_t halfSum;
  CHECK(ncclRedOpCreatePreMulSum(&halfSum, &factor, ncclFloat, ncclScalarHostImmediate, comm));
  factor = 100.0f;  // read already: no effect
  std::vector<float> in(count), out(count);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(input(gRank, i));
  CHECK(ncclAllReduce(in.data(), out.data(), count, ncclFloat, halfSum, comm, nullptr));
  for (size_t i = 0; i < count; ++i)
    if (out[i] != 0.5f * static_cast<float>(reduced(ncclSum, ncclFloat, i))) {
      failed("PreMulSum all-reduce: element " + std::to_string(i));
      break;
    }
  CHECK(ncclRedOpDestroy(halfSum, comm));
  // Read at each collective: an int32 scalar that changes between calls.
  int32_t scale = 3;
  ncclRedOp_t scaled;
  CHECK(ncclRedOpCreatePreMulSum(&scaled, &scale, ncclInt32, ncclScalarDevice, comm));
  std::vector<int32_t> ints(count, gRank + 1), result(count);
  for (int32_t s : {3, -2}) {
    scale = s;
    CHECK(ncclReduceScatter(ints.data(), result.data(), count / gRanks, ncclInt32, scaled, comm,
                            nullptr));
    const int32_t want = s * gRanks * (gRanks + 1) / 2;
    if (result[0] != want) failed("PreMulSum reduce-scatter: " + std::to_string(result[0]));
  }
  CHECK(ncclRedOpDestroy(scaled, comm));
}

// Even and odd ranks in two communicators, the last rank in none.
void split(ncclComm_t comm) {
  const int color = gRank == gRanks - 1 && gRanks > 2 ? NCCL_SPLIT_NOCOLOR : gRank % 2;
  ncclComm_t half = nullptr;
  CHECK(ncclCommSplit(comm, color, -gRank, &half, nullptr));
  if (color == NCCL_SPLIT_NOCOLOR) {
    if (half != nullptr) failed("split: a rank without a color got a communicator");
    return;
  }
  int size = 0, rank = -1;
  CHECK(ncclCommCount(half, &size));
  CHECK(ncclCommUserRank(half, &rank));
  int expected = 0;
  for (int r = 0; r < gRanks; ++r) expected += (r % 2 == color) && !(r == gRanks - 1 && gRanks > 2);
  if (size != expected) failed("split: size " + std::to_string(size));
  // Keys are -rank: the highest old rank comes first.
  int64_t value = gRank, sum = 0;
  CHECK(ncclAllReduce(&value, &sum, 1, ncclInt64, ncclSum, half, nullptr));
  int64_t want = 0;
  for (int r = 0; r < gRanks; ++r)
    if (r % 2 == color && !(r == gRanks - 1 && gRanks > 2)) want += r;
  if (sum != want) failed("split: sum " + std::to_string(sum));
  CHECK(ncclCommDestroy(half));
}

// Bad arguments fail with ncclInvalidArgument and a message; the
// communicator then still works.
void badInput(ncclComm_t comm) {
  float x = 1, y = 0;
  struct Case {
    const char* what;
    ncclResult_t result;
  };
  const Case cases[] = {
      {"datatype",
       ncclAllReduce(&x, &y, 1, static_cast<ncclDataType_t>(99), ncclSum, comm, nullptr)},
      {"op", ncclAllReduce(&x, &y, 1, ncclFloat, static_cast<ncclRedOp_t>(42), comm, nullptr)},
      {"negative op",
       ncclAllReduce(&x, &y, 1, ncclFloat, static_cast<ncclRedOp_t>(-3), comm, nullptr)},
      {"negative datatype",
       ncclReduce(&x, &y, 1, static_cast<ncclDataType_t>(-1), ncclSum, 0, comm, nullptr)},
      {"root", ncclBroadcast(&x, &y, 1, ncclFloat, gRanks + 3, comm, nullptr)},
      {"peer", ncclSend(&x, 1, ncclFloat, -1, comm, nullptr)},
      {"recv", ncclAllReduce(&x, nullptr, 1, ncclFloat, ncclSum, comm, nullptr)},
  };
  for (const Case& c : cases) {
    const std::string message = ncclGetLastError(comm);
    if (c.result != ncclInvalidArgument)
      failed(std::string("bad ") + c.what + " returned " + ncclGetErrorString(c.result));
    (void)message;
  }
  ncclAllReduce(&x, &y, 1, ncclFloat, static_cast<ncclRedOp_t>(42), comm, nullptr);
  if (std::string(ncclGetLastError(comm)).find("op") == std::string::npos)
    failed(std::string("the message does not name the argument: ") + ncclGetLastError(comm));
  CHECK(ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, comm, nullptr));
  if (y != static_cast<float>(gRanks))
    failed("after bad input: all-reduce gave " + std::to_string(y));
}

// A nonblocking communicator: calls return ncclInProgress (or ncclSuccess)
// and ncclCommGetAsyncError says when the work is done.
void nonblocking(const ncclUniqueId& id) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  auto settle = [&](ncclResult_t started, const char* what) {
    if (started != ncclSuccess && started != ncclInProgress) {
      failed(std::string(what) + " returned " + ncclGetErrorString(started));
      return false;
    }
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress)
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return false;
    if (state != ncclSuccess) failed(std::string(what) + ": " + ncclGetErrorString(state));
    return state == ncclSuccess;
  };
  if (!settle(ncclCommInitRankConfig(&comm, gRanks, id, gRank, &config), "nonblocking init"))
    return;
  std::vector<float> data(1 << 18, 1.0f);
  if (!settle(
          ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclSum, comm, nullptr),
          "nonblocking all-reduce"))
    return;
  if (data.back() != static_cast<float>(gRanks)) failed("nonblocking all-reduce: wrong sum");
  // A watchdog thread polls the communicator while this one issues work.
  std::atomic<bool> stop{false};
  std::thread watchdog([&] {
    ncclResult_t state;
    while (!stop)
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess ||
          (state != ncclSuccess && state != ncclInProgress))
        failed("the watchdog saw an error");
  });
  for (int i = 0; i < 20; ++i) {
    const ncclResult_t started =
        ncclAllReduce(data.data(), data.data(), 1024, ncclFloat, ncclMax, comm, nullptr);
    if (started != ncclSuccess && started != ncclInProgress)
      failed("nonblocking all-reduce failed");
  }
  settle(ncclSuccess, "nonblocking all-reduces under a watchdog");
  stop = true;
  watchdog.join();
  settle(ncclCommFinalize(comm), "finalize");
  CHECK(ncclCommDestroy(comm));
}

void runRank(const ncclUniqueId& id, const ncclUniqueId& second) {
  int version = 0;
  CHECK(ncclGetVersion(&version));
  // The library is at least as new as the header the program was built with.
  if (version < NCCL_VERSION_CODE) failed("ncclGetVersion: " + std::to_string(version));
  ncclComm_t comm = nullptr;
  CHECK(ncclCommInitRank(&comm, gRanks, id, gRank));
  int size = 0, rank = -1;
  CHECK(ncclCommCount(comm, &size));
  CHECK(ncclCommUserRank(comm, &rank));
  if (size != gRanks || rank != gRank) failed("count/rank");
  collectives(comm);
  allToAll(comm);
  preMulSum(comm);
  split(comm);
  badInput(comm);
  void* registered = nullptr;
  void* handle = nullptr;
  CHECK(ncclMemAlloc(&registered, 1 << 20));
  CHECK(ncclCommRegister(comm, registered, 1 << 20, &handle));
  memset(registered, 1, 1 << 20);
  CHECK(ncclAllReduce(registered, registered, 1 << 18, ncclInt32, ncclSum, comm, nullptr));
  if (static_cast<int32_t*>(registered)[12345] != 0x01010101 * gRanks)
    failed("all-reduce on ncclMemAlloc memory");
  CHECK(ncclCommDeregister(comm, handle));
  CHECK(ncclMemFree(registered));
  CHECK(ncclCommFinalize(comm));
  CHECK(ncclCommDestroy(comm));
  nonblocking(second);
}

// One process drives several ranks: ncclCommInitAll, communicators made in
// a group, and groups that span communicators (each rank's call waits for
// the others, so they must run together). Also calls this library may not support:
// ncclInvalidUsage with a message, nothing else.
void singleProcess() {
  constexpr int kRanks = 3;
  gRanks = kRanks;
  ncclComm_t comms[kRanks];
  const int devices[kRanks] = {7, 8, 9};
  CHECK(ncclCommInitAll(comms, kRanks, devices));
  std::vector<std::vector<int64_t>> data(kRanks, std::vector<int64_t>(10000));
  for (int r = 0; r < kRanks; ++r) {
    int device = -1;
    CHECK(ncclCommCuDevice(comms[r], &device));
    if (device != devices[r]) failed("ncclCommCuDevice: " + std::to_string(device));
    for (size_t i = 0; i < data[r].size(); ++i) data[r][i] = static_cast<int64_t>(input(r, i));
  }
  CHECK(ncclGroupStart());
  for (int r = 0; r < kRanks; ++r)
    CHECK(ncclAllReduce(data[r].data(), data[r].data(), data[r].size(), ncclInt64, ncclMax,
                        comms[r], nullptr));
  CHECK(ncclGroupEnd());
  for (int r = 0; r < kRanks; ++r)
    if (data[r][5] != static_cast<int64_t>(reduced(ncclMax, ncclInt64, 5)))
      failed("grouped all-reduce across communicators");
  for (ncclComm_t comm : comms) CHECK(ncclCommDestroy(comm));

  // Communicators made in a group, then a grouped all-gather on them.
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclGroupStart());
  for (int r = 0; r < kRanks; ++r) CHECK(ncclCommInitRank(&comms[r], kRanks, id, r));
  CHECK(ncclGroupEnd());
  std::vector<std::vector<float>> gathered(kRanks, std::vector<float>(kRanks * 100));
  std::vector<float> parts[kRanks];
  CHECK(ncclGroupStart());
  for (int r = 0; r < kRanks; ++r) {
    parts[r].assign(100, static_cast<float>(r));
    CHECK(ncclAllGather(parts[r].data(), gathered[r].data(), 100, ncclFloat, comms[r], nullptr));
  }
  CHECK(ncclGroupEnd());
  for (int r = 0; r < kRanks; ++r)
    if (gathered[r][250] != 2.0f) failed("grouped all-gather on communicators made in a group");

  // Not supported: a clear ncclInvalidUsage.
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  const ncclResult_t unsupported[] = {
      ncclGroupSimulateEnd(&sim),
      ncclGroupEnd(),  // no group is open
  };
  for (ncclResult_t result : unsupported)
    if (result != ncclInvalidUsage)
      failed(std::string("expected ncclInvalidUsage, got ") + ncclGetErrorString(result));
  if (std::string(ncclGetLastError(nullptr)).empty()) failed("no message for ncclInvalidUsage");
  // A communicator whose init in a group fails: ncclGroupEnd says so, and
  // the handle reports the error (not ncclInProgress forever).
  ncclUniqueId bogus;
  memset(&bogus, 0, sizeof(bogus));
  ncclComm_t broken = nullptr;
  CHECK(ncclGroupStart());
  CHECK(ncclCommInitRank(&broken, 2, bogus, 0));
  const ncclResult_t ended = ncclGroupEnd();
  ncclResult_t state = ncclSuccess;
  CHECK(ncclCommGetAsyncError(broken, &state));
  if (ended != ncclInvalidArgument || state != ncclInvalidArgument)
    failed(std::string("a failed init in a group: ncclGroupEnd gave ") + ncclGetErrorString(ended) +
           ", the handle " + ncclGetErrorString(state));
  CHECK(ncclCommDestroy(broken));
  // Split in a group, with a query in the same group; the rank without a
  // color gets NULL at once.
  ncclComm_t halves[kRanks];
  CHECK(ncclGroupStart());
  for (int r = 0; r < kRanks; ++r) {
    int rank = -1;
    CHECK(ncclCommUserRank(comms[r], &rank));
    CHECK(ncclCommSplit(comms[r], rank == 2 ? NCCL_SPLIT_NOCOLOR : 0, rank, &halves[r], nullptr));
  }
  if (halves[2] != nullptr) failed("NCCL_SPLIT_NOCOLOR did not give NULL at once");
  CHECK(ncclGroupEnd());
  for (int r = 0; r < 2; ++r) {
    int size = 0;
    CHECK(ncclCommCount(halves[r], &size));
    if (size != 2) failed("grouped split: size " + std::to_string(size));
    CHECK(ncclCommDestroy(halves[r]));
  }
  // A shrink in one process: the ranks that stay call it in a group.
  ncclComm_t kept[kRanks] = {};
  int leaving = kRanks - 1;
  CHECK(ncclGroupStart());
  for (int r = 0; r + 1 < kRanks; ++r)
    CHECK(ncclCommShrink(comms[r], &leaving, 1, &kept[r], nullptr, NCCL_SHRINK_DEFAULT));
  CHECK(ncclGroupEnd());
  std::vector<std::vector<float>> sums(kRanks - 1, std::vector<float>(64, 1.0f));
  CHECK(ncclGroupStart());
  for (int r = 0; r + 1 < kRanks; ++r)
    CHECK(ncclAllReduce(sums[r].data(), sums[r].data(), 64, ncclFloat, ncclSum, kept[r], nullptr));
  CHECK(ncclGroupEnd());
  for (int r = 0; r + 1 < kRanks; ++r) {
    if (sums[r][63] != kRanks - 1) failed("grouped all-reduce after a grouped shrink");
    CHECK(ncclCommDestroy(kept[r]));
  }
  // ncclCommAbort from another thread while a call waits inside the
  // communicator (the other ranks never join it): the call fails, the
  // communicator is freed once the call has left.
  ncclResult_t blocked = ncclSuccess;
  std::thread waiter([&] {
    float one = 1, out = 0;
    blocked = ncclAllReduce(&one, &out, 1, ncclFloat, ncclSum, comms[0], nullptr);
  });
  usleep(200000);
  CHECK(ncclCommAbort(comms[0]));
  waiter.join();
  if (blocked == ncclSuccess) failed("a call waiting in an aborted communicator succeeded");
  // Revoked: a second revoke and later collectives are refused.
  CHECK(ncclCommRevoke(comms[1], NCCL_REVOKE_DEFAULT));
  float one = 1;
  if (ncclCommRevoke(comms[1], NCCL_REVOKE_DEFAULT) != ncclInvalidArgument)
    failed("a second ncclCommRevoke was not refused");
  if (ncclAllReduce(&one, &one, 1, ncclFloat, ncclSum, comms[1], nullptr) != ncclInvalidUsage)
    failed("a collective on a revoked communicator was not ncclInvalidUsage");
  for (int r = 1; r < kRanks; ++r) CHECK(ncclCommDestroy(comms[r]));
}

// What the ranks share: the ids, made by rank 0.
struct Shared {
  std::atomic<int> ready;
  ncclUniqueId id, second;
};

}  // namespace

int main(int argc, char** argv) {
  gRanks = argc > 1 ? atoi(argv[1]) : 2;
  if (gRanks < 1) {
    fprintf(stderr, "usage: nccl_program RANKS\n");
    return 2;
  }
  auto* shared = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (shared) Shared{};
  std::vector<pid_t> pids;
  for (int r = 0; r < gRanks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      gRank = r;
      alarm(240);  // a hang fails the test instead of stalling it
      if (r == 0) {
        if (ncclGetUniqueId(&shared->id) != ncclSuccess ||
            ncclGetUniqueId(&shared->second) != ncclSuccess) {
          fprintf(stderr, "ncclGetUniqueId failed: %s\n", ncclGetLastError(nullptr));
          shared->ready = -1;
          _exit(1);
        }
        shared->ready = 1;
      }
      while (shared->ready == 0) usleep(1000);
      if (shared->ready < 0) _exit(1);
      runRank(shared->id, shared->second);
      if (gFailures == 0) printf("rank %d of %d: every check passed\n", gRank, gRanks);
      fflush(stdout);
      _exit(gFailures == 0 ? 0 : 1);
    }
    pids.push_back(pid);
  }
  // And one more process that drives several ranks itself.
  const pid_t single = fork();
  if (single == 0) {
    alarm(240);
    gRank = -1;
    singleProcess();
    if (gFailures == 0) printf("one process driving %d ranks: every check passed\n", gRanks);
    fflush(stdout);
    _exit(gFailures == 0 ? 0 : 1);
  }
  pids.push_back(single);
  int failedRanks = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failedRanks += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  return failedRanks == 0 ? 0 : 1;
}
