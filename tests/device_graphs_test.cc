// Collectives captured into graphs: captured once, replayed many times with
// the inputs changed in between, every result checked; mixed with ordinary
// ops; ops that cannot be captured refused at capture time; a peer that dies
// between replays. On the emulated device (whose streams capture their own
// work) everywhere, and with CUDA graphs where a GPU is present.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "device/device.h"
#include "device_support.h"
#include "multirank.h"

namespace braid::testing {
namespace {

int currentDevice() { return device::current()->current(); }

// A graph of the device seam, destroyed at the end of the scope.
class Graph {
 public:
  explicit Graph(device::GraphHandle handle) : handle_(handle) {}
  ~Graph() { device::current()->destroyGraph(handle_); }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void launch(TestStream& stream) { device::current()->launchGraph(handle_, stream.handle()); }

 private:
  device::GraphHandle handle_;
};

std::vector<float> download(const DeviceBuffer& buffer) {
  std::vector<std::byte> bytes = buffer.download();
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

class Graphs : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string why = unavailable(GetParam());
    if (!why.empty()) GTEST_SKIP() << "no " << GetParam() << " device here: " << why;
    ::setenv("BRAID_DEVICE_SLOT_BYTES", "64K", 1);  // ops of many pieces
  }
  void TearDown() override { ::unsetenv("BRAID_DEVICE_SLOT_BYTES"); }
  RunOptions options() const {
    RunOptions options;
    options.deadline = std::chrono::seconds(60);  // a broken replay hangs: fail sooner
    const std::string backend = GetParam();
    options.enter = [backend](int) { device::select(backend); };
    return options;
  }
};

// Rank r's input element i in replay k: small integers, exact in float.
float input(int r, size_t i, int k) { return static_cast<float>((r + 1) * (i % 13) + k); }

// Every collective, captured once into one graph, then replayed 100 times
// with new inputs each time (and an ordinary all-reduce every tenth time,
// on the ordinary FIFOs): every output of every replay is checked.
TEST_P(Graphs, EveryCollectiveReplays100TimesWithChangingInputs) {
  constexpr int kRanks = 3;
  runRanks(
      kRanks,
      [](Communicator& comm) {
        const int n = comm.size(), r = comm.rank(), dev = currentDevice();
        const size_t count = 40009;  // about 160 KB: several 64 KiB pieces per step
        TestStream stream(dev);
        DeviceBuffer in(dev, count * 4), sum(dev, count * 4), bcast(dev, count * 4),
            reduced(dev, count * 4), gathered(dev, count * n * 4), scattered(dev, count * 4),
            scatterIn(dev, count * n * 4), maxed(dev, count * 4);
        device::Device& device = *device::current();

        device.beginCapture(stream.handle());
        std::vector<Work> works;
        works.push_back(comm.allReduce(in.data(), sum.data(), count, DataType::Float32,
                                       ReduceOp::Sum, stream.stream()));
        works.push_back(
            comm.broadcast(in.data(), bcast.data(), count, DataType::Float32, 1, stream.stream()));
        works.push_back(comm.reduce(in.data(), reduced.data(), count, DataType::Float32,
                                    ReduceOp::Sum, 2, stream.stream()));
        works.push_back(
            comm.allGather(in.data(), gathered.data(), count, DataType::Float32, stream.stream()));
        works.push_back(comm.reduceScatter(scatterIn.data(), scattered.data(), count,
                                           DataType::Float32, ReduceOp::Sum, stream.stream()));
        comm.groupStart();  // a group of two collectives, captured too
        works.push_back(comm.allReduce(in.data(), maxed.data(), count, DataType::Float32,
                                       ReduceOp::Max, stream.stream()));
        works.push_back(comm.allReduce(sum.data(), sum.data(), 0, DataType::Float32, ReduceOp::Sum,
                                       stream.stream()));
        comm.groupEnd();
        Graph graph(device.endCapture(stream.handle()));
        for (const Work& work : works)
          require(work.captured() && work.test(), "a captured op's Work says it was captured");

        std::vector<float> mine(count), scatterMine(count * n);
        DeviceBuffer plain(dev, count * 4);
        for (int k = 0; k < 100; ++k) {
          for (size_t i = 0; i < count; ++i) mine[i] = input(r, i, k);
          for (size_t i = 0; i < count * n; ++i) scatterMine[i] = input(r, i, k);
          in.upload(mine.data());
          scatterIn.upload(scatterMine.data());
          graph.launch(stream);
          stream.synchronize();
          const std::vector<float> s = download(sum), b = download(bcast), red = download(reduced),
                                   g = download(gathered), sc = download(scattered),
                                   mx = download(maxed);
          auto total = [&](size_t i) {
            float t = 0;
            for (int q = 0; q < n; ++q) t += input(q, i, k);
            return t;
          };
          for (size_t i = 0; i < count; ++i) {
            auto check = [&](bool ok, const char* what, float got) {
              if (!ok)
                throw RankFailure{format("replay %d: %s element %zu is %g", k, what, i, got)};
            };
            check(s[i] == total(i), "all-reduce", s[i]);
            check(b[i] == input(1, i, k), "broadcast", b[i]);
            if (r == 2) check(red[i] == total(i), "reduce", red[i]);
            check(sc[i] == total(r * count + i), "reduce-scatter", sc[i]);
            check(mx[i] == input(n - 1, i, k), "max all-reduce", mx[i]);
            for (int q = 0; q < n; ++q)
              check(g[q * count + i] == input(q, i, k), "all-gather", g[q * count + i]);
          }
          if (k % 10 == 9) {  // an ordinary op between replays
            comm.allReduce(in.data(), plain.data(), count, DataType::Float32, ReduceOp::Sum,
                           stream.stream())
                .wait();
            const std::vector<float> p = download(plain);
            for (size_t i = 0; i < count; i += 97)
              require(p[i] == total(i), format("ordinary all-reduce after replay %d", k));
          }
        }
      },
      options());
}

// Two graphs of one communicator, replayed in turns (in the same order on
// every rank), each with a send to the next rank or a receive: point to
// point alone in a graph is fine.
TEST_P(Graphs, TwoGraphsReplayInTurnsWithSendsAndReceives) {
  runRanks(
      2,
      [](Communicator& comm) {
        const int r = comm.rank(), dev = currentDevice();
        const size_t count = 70001;
        TestStream stream(dev);
        device::Device& device = *device::current();
        DeviceBuffer a(dev, count * 4), b(dev, count * 4);
        device.beginCapture(stream.handle());
        if (r == 0)
          comm.send(a.data(), count, DataType::Float32, 1, stream.stream());
        else
          comm.recv(b.data(), count, DataType::Float32, 0, stream.stream());
        Graph first(device.endCapture(stream.handle()));
        device.beginCapture(stream.handle());
        comm.allReduce(a.data(), b.data(), count, DataType::Float32, ReduceOp::Sum,
                       stream.stream());
        Graph second(device.endCapture(stream.handle()));
        std::vector<float> mine(count);
        for (int k = 0; k < 30; ++k) {
          for (size_t i = 0; i < count; ++i) mine[i] = input(r, i, k);
          a.upload(mine.data());
          (k % 2 ? second : first).launch(stream);
          stream.synchronize();
          const std::vector<float> got = download(b);
          for (size_t i = 0; i < count; i += 7) {
            const float want = k % 2    ? input(0, i, k) + input(1, i, k)
                               : r == 1 ? input(0, i, k)
                                        : got[i];
            require(got[i] == want,
                    format("replay %d element %zu: %g, not %g", k, i, got[i], want));
          }
        }
      },
      options());
}

// What cannot be captured is refused while capturing, naming why, and the
// communicator goes on: grouped sends and receives (braid runs the sends on
// a second stream), peers staged over tcp, and BRAID_DEVICE_GRAPHS=0.
TEST_P(Graphs, OpsThatCannotBeCapturedAreRefusedAtCaptureTime) {
  runRanks(
      2,
      [](Communicator& comm) {
        const int r = comm.rank(), dev = currentDevice();
        TestStream stream(dev);
        device::Device& device = *device::current();
        DeviceBuffer a(dev, 4096), b(dev, 4096);
        device.beginCapture(stream.handle());
        try {
          comm.groupStart();
          comm.send(a.data(), 1024, DataType::Float32, 1 - r, stream.stream());
          comm.recv(b.data(), 1024, DataType::Float32, 1 - r, stream.stream());
          comm.groupEnd();
          throw RankFailure{"grouped sends and receives were captured"};
        } catch (const Error& error) {
          require(error.code() == ErrorCode::InvalidUsage &&
                      std::string(error.what()).find("sends and receives cannot be captured") !=
                          std::string::npos,
                  std::string("the refusal says why: ") + error.what());
        }
        device.destroyGraph(device.endCapture(stream.handle()));
        std::vector<float> ones(1024, 1.0f);
        a.upload(ones.data());
        comm.allReduce(a.data(), b.data(), 1024, DataType::Float32, ReduceOp::Sum, stream.stream())
            .wait();
        require(download(b)[1000] == 2.0f, "an ordinary op after the refusal");
      },
      options());

  // A captured all-reduce refused, the refusal naming `why`; then the same
  // all-reduce, not captured, runs.
  auto refused = [&](const char* knob, const char* value, const std::string& why) {
    ::setenv(knob, value, 1);
    runRanks(
        2,
        [&](Communicator& comm) {
          const int dev = currentDevice();
          TestStream stream(dev);
          device::Device& device = *device::current();
          DeviceBuffer a(dev, 4096), b(dev, 4096);
          device.beginCapture(stream.handle());
          try {
            comm.allReduce(a.data(), b.data(), 1024, DataType::Float32, ReduceOp::Sum,
                           stream.stream());
            throw RankFailure{format("an all-reduce was captured under %s=%s", knob, value)};
          } catch (const Error& error) {
            require(error.code() == ErrorCode::InvalidUsage &&
                        std::string(error.what()).find(why) != std::string::npos,
                    "the refusal says '" + why + "': " + error.what());
          }
          device.destroyGraph(device.endCapture(stream.handle()));
          comm.allReduce(a.data(), b.data(), 1024, DataType::Float32, ReduceOp::Sum,
                         stream.stream())
              .wait();
        },
        options());
    ::unsetenv(knob);
  };
  refused("BRAID_TRANSPORT", "tcp", "tcp: staged");
  refused("BRAID_DEVICE_GRAPHS", "0", "BRAID_DEVICE_GRAPHS is 0");
}

// A peer killed between replays: the survivors' next replay does not stay
// blocked (its waits are released), and their next ordinary op names the
// dead rank.
TEST_P(Graphs, APeerKilledBetweenReplaysLeavesNoReplayBlocked) {
  constexpr int kRanks = 3, kVictim = 2;
  RunOptions run = options();
  run.killed = {kVictim};
  run.deadline = std::chrono::seconds(60);
  runRanks(
      kRanks,
      [](Communicator& comm) {
        const int dev = currentDevice();
        const size_t count = 20000;
        TestStream stream(dev);
        device::Device& device = *device::current();
        DeviceBuffer a(dev, count * 4), b(dev, count * 4);
        device.beginCapture(stream.handle());
        comm.allReduce(a.data(), b.data(), count, DataType::Float32, ReduceOp::Sum,
                       stream.stream());
        Graph graph(device.endCapture(stream.handle()));
        for (int k = 0; k < 5; ++k) {
          graph.launch(stream);
          stream.synchronize();
        }
        comm.barrier();
        if (comm.rank() == kVictim) ::kill(::getpid(), SIGKILL);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        const auto before = std::chrono::steady_clock::now();
        graph.launch(stream);
        stream.synchronize();
        require(std::chrono::steady_clock::now() - before < std::chrono::seconds(5),
                "a replay after the peer died stayed blocked");
        try {
          comm.allReduce(a.data(), b.data(), count, DataType::Float32, ReduceOp::Sum,
                         stream.stream())
              .wait();
          throw RankFailure{"an op after the peer died succeeded"};
        } catch (const Error& error) {
          require(
              std::string(error.what()).find(format("peer %d", kVictim)) != std::string::npos ||
                  std::string(error.what()).find(format("rank %d", kVictim)) != std::string::npos,
              std::string("the error names the dead rank: ") + error.what());
        }
      },
      run);
}

INSTANTIATE_TEST_SUITE_P(Device, Graphs, ::testing::Values("emulated", "cuda"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace braid::testing
