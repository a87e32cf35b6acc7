// braid-perf: bandwidth of braid's collectives, measured and printed the way
// nccl-tests measures NCCL, so the two tables compare column by column.
//
//   braid-run -n 4 braid-perf allreduce -b 8 -e 128M -f 2
//
// For each size it times `-n` host-synchronous calls after `-w` warm-up calls,
// out of place and then in place, and reports the slowest rank's time per
// call (-a chooses another aggregate), algbw = size / time and busbw = algbw *
// the collective's bus factor (see busBandwidthFactor). With -c 1 it then runs
// each placement once more on check data and counts the wrong elements over
// all ranks (see perf_check.h). Only rank 0 prints, except errors.
//
// With -G 1 the buffers are device memory of the communicator's device and
// every call is enqueued on one device stream (Stream::cuda): the time is
// the wall clock around `-n` enqueued calls and the stream synchronize after
// them, and the check data is written into host mirrors of the buffers,
// copied to the device, and copied back to be checked. With -R 2 those
// device buffers are registered windows (the direct algorithms).
//
// With -g N braid-perf runs alone and makes N ranks in its own process
// (Communicator::initAll, rank i on device i mod the device count), each
// driven by a thread of its own: the single-process, several-GPU model of
// nccl-tests' -g.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "benchmarks/bench_cli.h"
#include "benchmarks/perf_check.h"
#include "benchmarks/perf_options.h"
#include "braid/communicator.h"
#include "braid/error.h"
#include "braid/memory.h"
#include "braid/types.h"
#include "braid/version.h"
#include "core/introspect.h"
#include "device/device.h"

namespace braid::perf {

namespace {

constexpr size_t kAlignment = 4096;

// One host buffer, `shift` bytes (under a page) past a page: ordinary
// memory, or braid::memAlloc's.
class Buffer {
 public:
  Buffer(size_t bytes, bool registered, size_t shift = 0) : registered_(registered) {
    size_t rounded =
        (std::max<size_t>(bytes, 1) + shift + kAlignment - 1) / kAlignment * kAlignment;
    base_ = static_cast<unsigned char*>(registered ? braid::memAlloc(rounded)
                                                   : std::aligned_alloc(kAlignment, rounded));
    if (!base_) throw std::runtime_error("cannot allocate " + std::to_string(bytes) + " bytes");
    data_ = base_ + shift;
  }
  ~Buffer() {
    if (registered_)
      braid::memFree(base_);
    else
      std::free(base_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  unsigned char* data() const { return data_; }

 private:
  bool registered_;
  unsigned char* base_;
  unsigned char* data_;
};

// Device memory (-G 1), freed with the object. No enqueued call may still
// use it then.
class DeviceBuffer {
 public:
  DeviceBuffer(device::Device& device, int index, size_t bytes)
      : device_(device),
        data_(static_cast<unsigned char*>(device.allocate(index, std::max<size_t>(bytes, 1)))) {}
  ~DeviceBuffer() { device_.free(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* data() const { return data_; }

 private:
  device::Device& device_;
  unsigned char* data_;
};

// What -G 1 runs on: the communicator's device (the thread's current one,
// as it was at init) and the one stream every call is enqueued on.
class DeviceContext {
 public:
  explicit DeviceContext(device::Device& device)
      : device_(device), index_(device.current()), stream_(device.createStream(index_)) {}
  ~DeviceContext() { device_.destroyStream(stream_); }
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  device::Device& device() const { return device_; }
  int index() const { return index_; }
  device::StreamHandle stream() const { return stream_; }
  void synchronize() const { device_.synchronize(stream_); }

 private:
  device::Device& device_;
  int index_;
  device::StreamHandle stream_;
};

struct Measurement {
  double timeUs = 0;
  double algbw = 0;  // GB/s, 1e9 bytes per second
  double busbw = 0;
  bool checked = false;
  uint64_t wrong = 0;     // over all ranks; meaningful when checked
  std::string algorithm;  // the one braid ran ("ring", "oneshot", ...)
};

struct Row {
  size_t bytes;
  size_t count;
  DataType type;
  const char* op;
  int root;
  Measurement outOfPlace, inPlace;
};

// What one collective's table adds up to.
struct Result {
  uint64_t wrong = 0;   // elements that differed from the expected values
  double busbwSum = 0;  // over every measurement
  size_t measurements = 0;
  std::string json;  // the collective's results as one JSON object
};

class Runner {
 public:
  // `device` null: host buffers and host-synchronous calls (-G 0).
  Runner(Communicator& comm, const Options& options, Collective collective,
         const DeviceContext* device)
      : comm_(comm),
        options_(options),
        collective_(collective),
        rank_(comm.rank()),
        nranks_(comm.size()),
        device_(device) {}
  // Lets the device buffers go only once nothing enqueued uses them (after
  // an error, calls may still be queued).
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // Measures every size and prints the table (rank 0).
  Result run();

 private:
  struct Placement {
    void* send;
    void* recv;
  };
  // Bytes from the start of the send and the receive allocation that a call
  // reads or writes.
  struct Extents {
    size_t send = 0;
    size_t recv = 0;
  };

  Placement placement(unsigned char* send, unsigned char* recv, DataType type, size_t count,
                      bool inPlace) const;
  Extents extents(const Placement& host, DataType type, size_t count) const;
  // Writes the check case's inputs and poison (into the host mirrors, then
  // onto the device, with -G 1).
  void prepare(const CheckCase& check, const Extents& used);
  // Issues one call: host-synchronous (finished on return), or enqueued on
  // the device stream. Returns its Work (sendrecv: the receive's).
  Work issue(DataType type, ReduceOp op, size_t count, const Placement& p);
  class CapturedCalls;
  Measurement measure(DataType type, ReduceOp op, size_t count, bool inPlace);
  double aggregateTime(double us);
  uint64_t sumOverRanks(uint64_t value);

  void printHeader(const std::vector<size_t>& sizes) const;
  void printRow(const Row& row) const;
  std::string json(const std::vector<Row>& rows, uint64_t wrong, double avgBusbw) const;

  Communicator& comm_;
  const Options& options_;
  Collective collective_;
  int rank_;
  int nranks_;
  const DeviceContext* device_;
  // The calls' buffers (-G 0), or the host mirrors of the device ones.
  std::unique_ptr<Buffer> send_, recv_;
  size_t sendBytes_ = 0, recvBytes_ = 0;                   // their sizes
  std::unique_ptr<DeviceBuffer> deviceSend_, deviceRecv_;  // -G 1
  std::vector<Window> windows_;                            // -R 2: theirs
  Window putWindow_;                                       // putsignal: the receive buffer
};

Runner::~Runner() {
  if (!device_) return;
  try {
    device_->synchronize();
    for (Window window : windows_) comm_.deregisterWindow(window);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-perf: rank %d: %s\n", rank_, e.what());
  }
}

Runner::Placement Runner::placement(unsigned char* send, unsigned char* recv, DataType type,
                                    size_t count, bool inPlace) const {
  if (!inPlace) return {send, recv};
  // NCCL's in-place conventions: this rank's slice of the big buffer.
  size_t offset = static_cast<size_t>(rank_) * count * dataTypeSize(type);
  switch (collective_) {
    case Collective::AllGather:
      return {recv + offset, recv};
    case Collective::ReduceScatter:
      return {send, send + offset};
    default:
      return {recv, recv};
  }
}

Runner::Extents Runner::extents(const Placement& host, DataType type, size_t count) const {
  size_t element = dataTypeSize(type);
  size_t all = count * static_cast<size_t>(nranks_);
  Extents used;
  // In place, a pointer may lie inside the other allocation: find its own.
  auto cover = [&](const void* pointer, size_t bytes) {
    auto at = reinterpret_cast<uintptr_t>(pointer);
    auto recv = reinterpret_cast<uintptr_t>(recv_->data());
    if (at >= recv && at < recv + recvBytes_) {
      used.recv = std::max<size_t>(used.recv, at - recv + bytes);
    } else {
      used.send =
          std::max<size_t>(used.send, at - reinterpret_cast<uintptr_t>(send_->data()) + bytes);
    }
  };
  cover(host.send, (collective_ == Collective::ReduceScatter ? all : count) * element);
  cover(host.recv, (collective_ == Collective::AllGather ? all : count) * element);
  return used;
}

void Runner::prepare(const CheckCase& check, const Extents& used) {
  prepareCheck(check);
  if (!device_) return;
  device::Device& device = device_->device();
  if (used.send) device.copyNow(deviceSend_->data(), send_->data(), used.send);
  if (used.recv) device.copyNow(deviceRecv_->data(), recv_->data(), used.recv);
}

Work Runner::issue(DataType type, ReduceOp op, size_t count, const Placement& p) {
  int root = options_.root;
  // Host calls finish before the next is issued; device calls only enqueue.
  Stream stream = device_ ? Stream::cuda(device_->stream()) : Stream();
  auto finished = [&](Work work) {
    if (!device_) work.wait();
    return work;
  };
  switch (collective_) {
    case Collective::AllReduce:
      return finished(comm_.allReduce(p.send, p.recv, count, type, op, stream));
    case Collective::AllGather:
      return finished(comm_.allGather(p.send, p.recv, count, type, stream));
    case Collective::ReduceScatter:
      return finished(comm_.reduceScatter(p.send, p.recv, count, type, op, stream));
    case Collective::Broadcast:
      return finished(comm_.broadcast(p.send, p.recv, count, type, root, stream));
    case Collective::Reduce:
      return finished(comm_.reduce(p.send, p.recv, count, type, op, root, stream));
    case Collective::SendRecv: {
      // A ring shift: to the next rank, from the previous one.
      comm_.groupStart();
      Work sent = comm_.send(p.send, count, type, (rank_ + 1) % nranks_, stream);
      Work received = comm_.recv(p.recv, count, type, (rank_ - 1 + nranks_) % nranks_, stream);
      comm_.groupEnd();
      // (On the device a failed send fails the communicator, and so the
      // receive after it.)
      finished(sent);
      return finished(received);
    }
    case Collective::PutSignal: {
      // A ring shift by one-sided puts: into the next rank's window, at
      // the receive buffer's place, then the previous rank's signal.
      const auto* window = device_ ? deviceRecv_->data() : recv_->data();
      const size_t offset = static_cast<size_t>(static_cast<unsigned char*>(p.recv) -
                                                reinterpret_cast<const unsigned char*>(window));
      finished(
          comm_.put(p.send, count, type, (rank_ + 1) % nranks_, putWindow_, offset, 0, stream));
      const SignalWait previous{(rank_ - 1 + nranks_) % nranks_, 0, 1};
      return finished(comm_.waitSignals(&previous, 1, stream));
    }
  }
  return Work();
}

double Runner::aggregateTime(double us) {
  double out = 0;
  switch (options_.average) {
    case Average::Rank0:
      comm_.broadcast(&us, &out, 1, DataType::Float64, 0).wait();
      break;
    case Average::Mean:
      comm_.allReduce(&us, &out, 1, DataType::Float64, ReduceOp::Sum).wait();
      out /= nranks_;
      break;
    case Average::Min:
      comm_.allReduce(&us, &out, 1, DataType::Float64, ReduceOp::Min).wait();
      break;
    case Average::Max:
      comm_.allReduce(&us, &out, 1, DataType::Float64, ReduceOp::Max).wait();
      break;
  }
  return out;
}

uint64_t Runner::sumOverRanks(uint64_t value) {
  uint64_t total = 0;
  comm_.allReduce(&value, &total, 1, DataType::Uint64, ReduceOp::Sum).wait();
  return total;
}

// -C: the -n timed calls captured into one graph, and a single call into
// another (for the check), on the device stream; destroyed with it.
class Runner::CapturedCalls {
 public:
  CapturedCalls(Runner& runner, DataType type, ReduceOp op, size_t count, const Placement& p)
      : device_(runner.device_->device()), stream_(runner.device_->stream()) {
    device_.beginCapture(stream_);
    for (int i = 0; i < runner.options_.iters; ++i) runner.issue(type, op, count, p);
    timed_ = device_.endCapture(stream_);
    device_.beginCapture(stream_);
    runner.issue(type, op, count, p);
    once_ = device_.endCapture(stream_);
    launchTimed();  // the first launch uploads the graph (CUDA): untimed
    device_.synchronize(stream_);
  }
  ~CapturedCalls() {
    device_.destroyGraph(timed_);
    device_.destroyGraph(once_);
  }
  CapturedCalls(const CapturedCalls&) = delete;
  CapturedCalls& operator=(const CapturedCalls&) = delete;
  void launchTimed() { device_.launchGraph(timed_, stream_); }
  void launchOnce() { device_.launchGraph(once_, stream_); }

 private:
  device::Device& device_;
  device::StreamHandle stream_;
  device::GraphHandle timed_ = nullptr, once_ = nullptr;
};

Measurement Runner::measure(DataType type, ReduceOp op, size_t count, bool inPlace) {
  // The calls' buffers, and their host side (the same ones with -G 0).
  Placement host = placement(send_->data(), recv_->data(), type, count, inPlace);
  Placement p =
      device_ ? placement(deviceSend_->data(), deviceRecv_->data(), type, count, inPlace) : host;
  Extents used = extents(host, type, count);
  CheckCase check{collective_, type,    op,      options_.root, count,
                  rank_,       nranks_, inPlace, host.send,     host.recv};
  prepare(check, used);  // the timed calls run on ordinary numbers too

  Work last;
  for (int i = 0; i < options_.warmup; ++i) last = issue(type, op, count, p);
  if (device_) {
    device_->synchronize();
    last.wait();  // rethrows a failed call's error
  }
  // -C: the timed calls, and one more for the check, captured into graphs.
  std::optional<CapturedCalls> graphs;
  if (options_.graphLaunches > 0) graphs.emplace(*this, type, op, count, p);
  comm_.barrier().wait();
  auto start = std::chrono::steady_clock::now();
  if (graphs) {
    for (int j = 0; j < options_.graphLaunches; ++j) graphs->launchTimed();
  } else {
    for (int i = 0; i < options_.iters; ++i) last = issue(type, op, count, p);
  }
  if (device_) device_->synchronize();
  std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
  if (device_) last.wait();
  const int calls = options_.iters * (graphs ? options_.graphLaunches : 1);

  Measurement m;
  m.algorithm = collective_ == Collective::PutSignal ? "put"
                : device_                            ? detail::lastDeviceAlgorithm(comm_)
                                                     : detail::lastAlgorithm(comm_);
  m.timeUs = aggregateTime(elapsed.count() / calls);
  double bytes = static_cast<double>(reportedBytes(collective_, count, type, nranks_));
  m.algbw = m.timeUs > 0 ? bytes / (m.timeUs * 1e3) : 0;
  m.busbw = m.algbw * busBandwidthFactor(collective_, nranks_);
  if (options_.check) {
    prepare(check, used);
    // A put lands without its target taking part: none may land before
    // the target has written its poison.
    if (collective_ == Collective::PutSignal) comm_.barrier().wait();
    if (graphs)
      graphs->launchOnce();
    else
      last = issue(type, op, count, p);
    if (device_) {
      device_->synchronize();
      last.wait();
      device::Device& device = device_->device();
      if (used.send) device.copyNow(send_->data(), deviceSend_->data(), used.send);
      if (used.recv) device.copyNow(recv_->data(), deviceRecv_->data(), used.recv);
    }
    m.checked = true;
    m.wrong = sumOverRanks(countWrong(check));
  }
  return m;
}

void Runner::printHeader(const std::vector<size_t>& sizes) const {
  std::string types, ops;
  for (DataType t : options_.types)
    types += (types.empty() ? "" : ",") + std::string(dataTypeName(t));
  for (ReduceOp o : options_.ops) ops += (ops.empty() ? "" : ",") + std::string(reduceOpName(o));
  Collective c = collective_;
  std::printf("# braid-perf, braid %s\n", BRAID_VERSION_STRING);
  std::printf(
      "# nranks %d, collective %s, dtype %s, op %s, root %d, iters %d, warmup %d, check %d\n",
      nranks_, collectiveName(c), types.c_str(), reduces(c) ? ops.c_str() : "none",
      hasRoot(c) ? options_.root : -1, options_.iters, options_.warmup, options_.check ? 1 : 0);
  if (options_.stepBytes > 0) {
    std::printf("# sizes %zu to %zu bytes, step %zu bytes", sizes.front(), sizes.back(),
                options_.stepBytes);
  } else {
    std::printf("# sizes %zu to %zu bytes, step factor %zu", sizes.front(), sizes.back(),
                options_.stepFactor);
  }
  std::string buffers = options_.registration == 1 ? "braid::memAlloc" : "malloc";
  if (device_) {
    buffers = std::string("device memory of ") + device_->device().name() + " device " +
              std::to_string(device_->index()) +
              (options_.registration == 2 ? " in registered windows" : "") +
              ", calls on one device stream" +
              (options_.graphLaunches > 0 ? ", captured into a CUDA graph launched " +
                                                std::to_string(options_.graphLaunches) + " times"
                                          : std::string());
  }
  if (options_.offset > 0)
    buffers += ", rank r's r x " + std::to_string(options_.offset) + " bytes past a page";
  std::printf("; time per call: %s; buffers: %s\n#\n", averageName(options_.average),
              buffers.c_str());

  // The placement titles, centred over their four columns.
  std::string titles(116, ' ');
  titles[0] = '#';
  titles.replace(62, 12, "out-of-place");
  titles.replace(96, 8, "in-place");
  titles.erase(titles.find_last_not_of(' ') + 1);
  std::printf("%s\n", titles.c_str());
  std::printf(
      "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
      "time"
      "   algbw   busbw #wrong\n");
  std::printf(
      "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            "
      "(us)"
      "  (GB/s)  (GB/s)\n");
  std::fflush(stdout);
}

void Runner::printRow(const Row& row) const {
  std::printf("%12zu%14zu%10s%8s%8d", row.bytes, row.count, dataTypeName(row.type), row.op,
              row.root);
  for (const Measurement* m : {&row.outOfPlace, &row.inPlace}) {
    std::string wrong = m->checked ? std::to_string(m->wrong) : "N/A";
    std::printf("%9s%8.2f%8.2f%7s", bench::formatTime(m->timeUs).c_str(), m->algbw, m->busbw,
                wrong.c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

std::string Runner::json(const std::vector<Row>& rows, uint64_t wrong, double avgBusbw) const {
  std::string out;
  auto add = [&](const char* fmt, auto... args) {
    char buffer[512];
    std::snprintf(buffer, sizeof(buffer), fmt, args...);
    out += buffer;
  };
  std::string device = device_ ? std::string("\"") + device_->device().name() + "\"" : "null";
  add("{\n  \"collective\": \"%s\",\n  \"nranks\": %d,\n  \"iters\": %d,\n"
      "  \"warmup\": %d,\n  \"check\": %s,\n  \"time\": \"%s\",\n  \"memory\": \"%s\",\n"
      "  \"device\": %s,\n  \"graph_launches\": %d,\n  \"offset\": %zu,\n  \"results\": [",
      collectiveName(collective_), nranks_, options_.iters, options_.warmup,
      options_.check ? "true" : "false", averageName(options_.average), device_ ? "device" : "host",
      device.c_str(), options_.graphLaunches, options_.offset);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    add("%s\n    {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", "
        "\"root\": %d",
        i ? "," : "", r.bytes, r.count, dataTypeName(r.type), r.op, r.root);
    for (auto [name, m] :
         {std::make_pair("out_of_place", &r.outOfPlace), std::make_pair("in_place", &r.inPlace)}) {
      std::string wrongText = m->checked ? std::to_string(m->wrong) : "null";
      add(",\n     \"%s\": {\"time_us\": %.3f, \"algbw_gbps\": %.4f, "
          "\"busbw_gbps\": %.4f, \"wrong\": %s, \"algorithm\": \"%s\"}",
          name, m->timeUs, m->algbw, m->busbw, wrongText.c_str(), m->algorithm.c_str());
    }
    out += "}";
  }
  add("\n  ],\n  \"out_of_bounds\": %llu,\n  \"avg_busbw_gbps\": %.4f\n}",
      static_cast<unsigned long long>(wrong), avgBusbw);
  return out;
}

Result Runner::run() {
  Collective c = collective_;
  std::vector<size_t> sizes = sizeSteps(options_);
  size_t sendBytes = 0, recvBytes = 0;
  for (DataType type : options_.types) {
    for (size_t size : sizes) {
      size_t count = elementCount(c, size, type, nranks_);
      size_t part = count * dataTypeSize(type);
      size_t whole = part * static_cast<size_t>(nranks_);
      sendBytes = std::max(sendBytes, c == Collective::ReduceScatter ? whole : part);
      recvBytes = std::max(recvBytes, c == Collective::AllGather ? whole : part);
    }
  }
  const size_t shift = static_cast<size_t>(rank_) * options_.offset % kAlignment;
  send_ = std::make_unique<Buffer>(sendBytes, options_.registration == 1, shift);
  recv_ = std::make_unique<Buffer>(recvBytes, options_.registration == 1, shift);
  sendBytes_ = sendBytes;
  recvBytes_ = recvBytes;
  if (device_) {
    deviceSend_ = std::make_unique<DeviceBuffer>(device_->device(), device_->index(), sendBytes);
    deviceRecv_ = std::make_unique<DeviceBuffer>(device_->device(), device_->index(), recvBytes);
    if (options_.registration == 2) {  // the same sizes on every rank
      windows_.push_back(comm_.registerWindow(deviceSend_->data(), std::max<size_t>(sendBytes, 1)));
      windows_.push_back(comm_.registerWindow(deviceRecv_->data(), std::max<size_t>(recvBytes, 1)));
    }
  }

  if (c == Collective::PutSignal)  // (the same size on every rank)
    putWindow_ = device_ ? comm_.registerWindow(deviceRecv_->data(), std::max<size_t>(recvBytes, 1))
                         : comm_.registerWindow(recv_->data(), std::max<size_t>(recvBytes, 1));

  if (rank_ == 0) printHeader(sizes);
  std::vector<ReduceOp> ops = reduces(c) ? options_.ops : std::vector<ReduceOp>{ReduceOp::Sum};
  std::vector<Row> rows;
  uint64_t wrong = 0;
  double busbwSum = 0;
  for (DataType type : options_.types) {
    for (ReduceOp op : ops) {
      for (size_t size : sizes) {
        size_t count = elementCount(c, size, type, nranks_);
        Row row{reportedBytes(c, count, type, nranks_),
                count,
                type,
                reduces(c) ? reduceOpName(op) : "none",
                hasRoot(c) ? options_.root : -1,
                measure(type, op, count, false),
                measure(type, op, count, true)};
        wrong += row.outOfPlace.wrong + row.inPlace.wrong;
        busbwSum += row.outOfPlace.busbw + row.inPlace.busbw;
        if (rank_ == 0) printRow(row);
        rows.push_back(row);
      }
    }
  }

  if (putWindow_.id) comm_.deregisterWindow(putWindow_);

  Result result;
  result.wrong = wrong;
  result.busbwSum = busbwSum;
  result.measurements = 2 * rows.size();
  double avgBusbw = rows.empty() ? 0 : busbwSum / static_cast<double>(result.measurements);
  if (rank_ == 0) {
    if (options_.collectives.size() > 1)
      std::printf("# %s: out of bounds values %llu, avg bus bandwidth %g\n#\n",
                  collectiveName(collective_), static_cast<unsigned long long>(wrong), avgBusbw);
    if (!options_.jsonPath.empty()) result.json = json(rows, wrong, avgBusbw);
  }
  return result;
}

// Runs every collective asked for, prints nccl-tests' closing summary and
// writes the JSON file; returns the exit code.
int runAll(Communicator& comm, const Options& options) {
  std::unique_ptr<DeviceContext> device;
  if (options.onDevice) {
    device::Device* found = nullptr;
    std::string why;
    try {
      found = &device::require("braid-perf -G 1");
    } catch (const Error& e) {
      why = e.what();
    }
    // Every rank stops if any lacks the device; the first of those says why.
    int32_t lacking = found ? comm.size() : comm.rank(), first = 0;
    comm.allReduce(&lacking, &first, 1, DataType::Int32, ReduceOp::Min).wait();
    if (first < comm.size()) {
      if (comm.rank() == first) std::fprintf(stderr, "%s\n", why.c_str());
      return 2;
    }
    device = std::make_unique<DeviceContext>(*found);
  }

  uint64_t wrong = 0;
  double busbwSum = 0;
  size_t measurements = 0;
  std::vector<std::string> objects;
  for (Collective collective : options.collectives) {
    Result result = Runner(comm, options, collective, device.get()).run();
    wrong += result.wrong;
    busbwSum += result.busbwSum;
    measurements += result.measurements;
    objects.push_back(result.json);
  }
  if (comm.rank() != 0) return wrong ? 1 : 0;
  double avgBusbw = measurements ? busbwSum / static_cast<double>(measurements) : 0;
  std::printf("# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(wrong),
              wrong ? "FAILED" : "OK");
  std::printf("# Avg bus bandwidth    : %g\n#\n", avgBusbw);
  std::fflush(stdout);
  if (!options.jsonPath.empty()) {
    std::string text = objects.size() == 1 ? objects[0] : "{\n\"collectives\": [\n";
    if (objects.size() > 1) {
      for (size_t i = 0; i < objects.size(); ++i) text += (i ? ",\n" : "") + objects[i];
      text += "\n],\n\"out_of_bounds\": " + std::to_string(wrong) +
              ",\n\"avg_busbw_gbps\": " + std::to_string(avgBusbw) + "\n}";
    }
    std::FILE* file = std::fopen(options.jsonPath.c_str(), "w");
    if (!file || std::fprintf(file, "%s\n", text.c_str()) < 0 || std::fclose(file) != 0)
      throw std::runtime_error("cannot write " + options.jsonPath + ": " + std::strerror(errno));
  }
  return wrong ? 1 : 0;
}

// -g N: N ranks in this process (Communicator::initAll), one thread each,
// rank i on device i mod the devices there are. Returns the worst exit code.
int runOneProcess(const Options& options) {
  if (const char* size = std::getenv("BRAID_WORLD_SIZE"); size && std::atoi(size) > 1) {
    std::fprintf(stderr,
                 "braid-perf: -g %d makes its ranks in this one process: run it alone, not under "
                 "a launcher of %s ranks\n",
                 options.gpus, size);
    return 2;
  }
  device::Device* device = device::current();
  std::vector<int> devices;
  for (int i = 0; i < options.gpus; ++i) devices.push_back(device ? i % device->count() : 0);
  std::vector<Communicator> comms = Communicator::initAll(devices);
  if (std::any_of(options.collectives.begin(), options.collectives.end(), hasRoot) &&
      options.root >= options.gpus) {
    std::fprintf(stderr, "braid-perf: -r: root %d is not a rank of %d\n", options.root,
                 options.gpus);
    return 2;
  }
  std::vector<int> codes(comms.size(), 0);
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < comms.size(); ++r)
    ranks.emplace_back([&, r] {
      try {
        if (device) device->setCurrent(devices[r]);
        codes[r] = runAll(comms[r], options);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "braid-perf: rank %zu: %s\n", r, e.what());
        codes[r] = 1;
      }
    });
  for (std::thread& rank : ranks) rank.join();
  return *std::max_element(codes.begin(), codes.end());
}

}  // namespace

}  // namespace braid::perf

int main(int argc, char** argv) {
  using braid::perf::UsageError;
  braid::perf::Options options;
  try {
    if (!braid::perf::parseOptions(argc, argv, &options)) return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "braid-perf: %s (try braid-perf -h)\n", e.what());
    return 2;
  }

  int rank = -1;
  try {
    if (options.gpus > 1) return braid::perf::runOneProcess(options);
    braid::Communicator comm = braid::Communicator::fromEnvironment();
    rank = comm.rank();
    bool rooted =
        std::any_of(options.collectives.begin(), options.collectives.end(), braid::perf::hasRoot);
    if (rooted && options.root >= comm.size()) {
      std::fprintf(stderr, "braid-perf: -r: root %d is not a rank of %d\n", options.root,
                   comm.size());
      return 2;
    }
    return braid::perf::runAll(comm, options);
  } catch (const std::exception& e) {
    if (rank >= 0) {
      std::fprintf(stderr, "braid-perf: rank %d: %s\n", rank, e.what());
    } else {
      std::fprintf(stderr, "braid-perf: %s\n", e.what());
    }
    return 1;
  }
}
