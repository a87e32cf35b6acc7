// peer-gloo-allreduce: Gloo's float32 sum all-reduce over its TCP transport on
// loopback, timed like braid-perf allreduce (see peer_bench.h).
//
//   braid-run -n 2 peer-gloo-allreduce -b 8 -e 64M -A ring
//
// Each process reads its rank and the world size from BRAID_RANK and
// BRAID_WORLD_SIZE (braid-run sets them), and the ranks meet through a
// gloo::rendezvous::FileStore in $TMPDIR (default /tmp), in a folder named
// after BRAID_UNIQUE_ID when it is set (else after the parent process), which
// rank 0 removes at the end. Then gloo::rendezvous::Context::connectFullMesh
// over a gloo::transport::tcp device bound to 127.0.0.1, or to the interface
// BRAID_SOCKET_IFNAME names when it is set (across hosts).
//
// -A chooses the algorithm:
//   default           gloo::allreduce(), AllreduceOptions' own choice
//   ring              gloo::allreduce(), Algorithm RING
//   bcube             gloo::allreduce(), Algorithm BCUBE
//   ring-legacy       gloo::AllreduceRing<float>
//   ring-chunked      gloo::AllreduceRingChunked<float>
//   halving-doubling  gloo::AllreduceHalvingDoubling<float>
// gloo::allreduce() takes separate input and output buffers (in place: the
// output alone). The legacy algorithm classes reduce in place into the
// buffers they were built on, once per size; out of place they are given the
// output buffer, and each call first copies the input into it, as a caller
// of those classes would.
//
// Every variant reduces with the same plain loop (sumFloats), the function a
// caller hands Gloo, so the variants differ only in their communication.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "benchmarks/peers/peer_bench.h"
#include "gloo/algorithm.h"
#include "gloo/allreduce.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/allreduce_ring.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/barrier.h"
#include "gloo/config.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"

namespace braid::peers {
namespace {

constexpr const char* kProgram = "peer-gloo-allreduce";

// a[i] += b[i]: the reduction every variant runs (gloo::ReductionFunction's
// signature).
void sumFloats(float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] += b[i];
}

// c[i] = a[i] + b[i]: the same for gloo::allreduce (AllreduceOptions::Func).
void sumFloatsInto(void* c, const void* a, const void* b, size_t n) {
  float* out = static_cast<float*>(c);
  const float* x = static_cast<const float*>(a);
  const float* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

void maxDoubles(void* c, const void* a, const void* b, size_t n) {
  double* out = static_cast<double*>(c);
  const double* x = static_cast<const double*>(a);
  const double* y = static_cast<const double*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] > y[i] ? x[i] : y[i];
}

void sumUint64s(void* c, const void* a, const void* b, size_t n) {
  uint64_t* out = static_cast<uint64_t*>(c);
  const uint64_t* x = static_cast<const uint64_t*>(a);
  const uint64_t* y = static_cast<const uint64_t*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

int envInt(const char* name) {
  const char* text = std::getenv(name);
  if (!text || !*text)
    throw std::runtime_error(std::string(name) + " is not set (start it with braid-run -n N)");
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 0 || value > 1 << 20)
    throw std::runtime_error(std::string(name) + "='" + text + "' is not a rank count");
  return static_cast<int>(value);
}

// The rendezvous folder both ranks compute alike.
std::filesystem::path storePath() {
  const char* tmp = std::getenv("TMPDIR");
  std::filesystem::path base = tmp && *tmp ? tmp : "/tmp";
  const char* id = std::getenv("BRAID_UNIQUE_ID");
  std::string job = id && *id ? id : "ppid" + std::to_string(getppid());
  char name[64];
  std::snprintf(name, sizeof(name), "peer-gloo-%016zx", std::hash<std::string>{}(job));
  return base / name;
}

class GlooCollectives : public Collectives {
 public:
  GlooCollectives(int rank, int size, std::string algorithm)
      : rank_(rank), size_(size), algorithm_(std::move(algorithm)) {
    store_ = storePath();
    std::filesystem::create_directories(store_);
    gloo::transport::tcp::attr attr;
    if (const char* ifname = std::getenv("BRAID_SOCKET_IFNAME"); ifname && *ifname)
      attr.iface = ifname;  // across (namespace) hosts
    else
      attr.hostname = "127.0.0.1";
    device_ = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    gloo::rendezvous::FileStore fileStore(store_.string());
    context->connectFullMesh(fileStore, device_);
    context_ = context;
  }

  ~GlooCollectives() override {
    try {
      barrier();  // nobody still reads the store
      if (rank_ == 0) std::filesystem::remove_all(store_);
    } catch (const std::exception&) {
      // Leaves the folder behind; the run's result stands.
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::string library() const override {
    return "Gloo " + std::to_string(GLOO_VERSION_MAJOR) + "." + std::to_string(GLOO_VERSION_MINOR) +
           "." + std::to_string(GLOO_VERSION_PATCH) + " (tcp on 127.0.0.1), algorithm " +
           algorithm_;
  }

  void prepare(const float*, float* recv, size_t count) override {
    legacy_.reset();
    if (count > static_cast<size_t>(INT32_MAX))
      throw std::runtime_error("Gloo's algorithm classes take at most 2^31-1 elements");
    std::vector<float*> ptrs{recv};
    int n = static_cast<int>(count);
    if (algorithm_ == "ring-legacy") {
      legacy_ = std::make_unique<gloo::AllreduceRing<float>>(context_, ptrs, n, &kSum);
    } else if (algorithm_ == "ring-chunked") {
      legacy_ = std::make_unique<gloo::AllreduceRingChunked<float>>(context_, ptrs, n, &kSum);
    } else if (algorithm_ == "halving-doubling") {
      legacy_ = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(context_, ptrs, n, &kSum);
    }
  }

  void allReduce(const float* send, float* recv, size_t count) override {
    if (legacy_) {
      if (send != recv) std::memcpy(recv, send, count * sizeof(float));
      legacy_->run();
      return;
    }
    gloo::AllreduceOptions options(context_);
    if (send != recv) options.setInput(const_cast<float*>(send), count);  // only read
    options.setOutput(recv, count);
    if (algorithm_ == "ring") {
      options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    } else if (algorithm_ == "bcube") {
      options.setAlgorithm(gloo::AllreduceOptions::Algorithm::BCUBE);
    }
    options.setReduceFunction(&sumFloatsInto);
    options.setTag(nextTag());
    gloo::allreduce(options);
  }

  double maxOverRanks(double value) override {
    double out = value;
    gloo::AllreduceOptions options(context_);
    options.setOutput(&out, 1);
    options.setReduceFunction(&maxDoubles);
    options.setTag(nextTag());
    gloo::allreduce(options);
    return out;
  }

  uint64_t sumOverRanks(uint64_t value) override {
    uint64_t out = value;
    gloo::AllreduceOptions options(context_);
    options.setOutput(&out, 1);
    options.setReduceFunction(&sumUint64s);
    options.setTag(nextTag());
    gloo::allreduce(options);
    return out;
  }

  void barrier() override {
    gloo::BarrierOptions options(context_);
    options.setTag(nextTag());
    gloo::barrier(options);
  }

 private:
  static inline const gloo::ReductionFunction<float> kSum{gloo::SUM, &sumFloats};

  // Each call gets its own tag, so no message of one can match another.
  uint32_t nextTag() { return tag_++; }

  int rank_;
  int size_;
  std::string algorithm_;
  std::filesystem::path store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<gloo::Algorithm> legacy_;  // the legacy classes' instance for this size
  uint32_t tag_ = 0;
};

}  // namespace
}  // namespace braid::peers

int main(int argc, char** argv) {
  using braid::peers::kProgram;
  braid::peers::Program program{
      kProgram,
      "run it under braid-run -n N",
      {"default", "ring", "bcube", "ring-legacy", "ring-chunked", "halving-doubling"}};
  braid::peers::Options options;
  try {
    if (!braid::peers::parseOptions(argc, argv, program, &options)) return 0;
  } catch (const braid::peers::UsageError& e) {
    std::fprintf(stderr, "%s: %s (try %s -h)\n", kProgram, e.what(), kProgram);
    return 2;
  }
  int rank = -1;
  try {
    rank = braid::peers::envInt("BRAID_RANK");
    int size = braid::peers::envInt("BRAID_WORLD_SIZE");
    if (size < 1 || rank >= size)
      throw std::runtime_error("BRAID_RANK " + std::to_string(rank) + " is not a rank of " +
                               std::to_string(size));
    braid::peers::GlooCollectives gloo(rank, size, options.algorithm);
    return braid::peers::runAllReduce(gloo, options, program);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", kProgram, rank, e.what());
    return 1;
  }
}
