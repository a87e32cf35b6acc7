// Registered windows and the direct algorithms on them: one-shot and
// two-shot all-reduce, one-shot all-gather and broadcast, against the
// reference and one-shot against two-shot bit for bit; ranks in processes
// of their own (windows mapped through cuda_ipc) and in one process
// (nvlink_p2p); registration while other ops run; bad windows; one-sided
// puts, signals and waits on the stream. On the
// emulated device everywhere, and on CUDA where a GPU is present (an
// instance whose device is missing skips, saying why).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "core/introspect.h"
#include "device_cases.h"
#include "device_support.h"
#include "multirank.h"
#include "reference.h"

namespace braid::testing {
namespace {

// A registered window of braid's device memory, carved front to back
// into the buffers of a case (every rank carves alike, so their offsets
// match: the symmetric contract).
class TestWindow {
 public:
  TestWindow(Communicator& comm, size_t bytes)
      : comm_(comm),
        bytes_(bytes),
        base_(static_cast<std::byte*>(device::current()->allocate(comm.device(), bytes))),
        window_(comm.registerWindow(base_, bytes)) {}
  ~TestWindow() {
    try {
      comm_.deregisterWindow(window_);
    } catch (const Error&) {
      if (!communicatorFails_) throw;  // (terminates: the test fails loudly)
      // A failed communicator: its mappings go with it.
    }
    device::current()->free(base_);
  }
  // The test fails the communicator: deregistration may throw.
  void expectFailure() { communicatorFails_ = true; }
  TestWindow(const TestWindow&) = delete;
  TestWindow& operator=(const TestWindow&) = delete;

  std::byte* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  Window handle() const { return window_; }

 private:
  Communicator& comm_;
  size_t bytes_;
  std::byte* base_;
  Window window_;
  bool communicatorFails_ = false;
};

// The case on buffers at the window's start (send, then recv 4 KiB on).
std::string runInWindow(Communicator& comm, TestStream& stream, TestWindow& window, const Case& c,
                        uint64_t seed) {
  const size_t sendBytes = IssuedCase::sendBytes(c, comm.size());
  const size_t recvAt = (sendBytes + 4095) / 4096 * 4096;
  require(recvAt + IssuedCase::recvBytes(c, comm.size()) <= window.bytes(),
          "the test window is too small for " + label(c, comm.size()));
  IssuedCase issued(comm, stream, c, seed, window.base(), window.base() + recvAt);
  stream.synchronize();
  return issued.check();
}

constexpr size_t kWindowBytes = size_t{8} << 20;

class Windows : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string why = unavailable(GetParam());
    if (!why.empty()) GTEST_SKIP() << "no " << GetParam() << " device here: " << why;
    ::setenv("BRAID_DEVICE_SLOT_BYTES", "64K", 1);
  }
  void TearDown() override {
    ::unsetenv("BRAID_DEVICE_SLOT_BYTES");
    ::unsetenv("BRAID_ALGO");
  }
  RunOptions options() const {
    RunOptions options;
    const std::string backend = GetParam();
    options.enter = [backend](int rank) {
      device::select(backend);
      device::Device* device = device::current();
      if (device && device->count() > 1) device->setCurrent(rank % device->count());
    };
    return options;
  }
};

// The sweep of one algorithm setting: every direct collective, in and out
// of place, on window buffers; the algorithm that ran is checked too.
void sweepInWindow(Communicator& comm, const char* expectSmall, const char* expectLarge) {
  TestStream stream(comm.device());
  TestWindow window(comm, kWindowBytes);
  uint64_t seed = 100;
  const size_t large = (size_t{1} << 18) + 37;  // past one-shot's 256 KiB in float32
  for (DataType type : {DataType::Float32, DataType::BFloat16, DataType::Int32})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max})
      for (size_t count : {size_t{1}, size_t{7}, size_t{1023}, large})
        for (bool inPlace : {false, true}) {
          const Case c{Coll::AllReduce, type, op, count, inPlace, 0};
          const std::string problem = runInWindow(comm, stream, window, c, ++seed);
          require(problem.empty(), problem);
          const bool big = count * dataTypeSize(type) > (size_t{256} << 10);
          const std::string ran = braid::detail::lastDeviceAlgorithm(comm);
          const char* want = big ? expectLarge : expectSmall;
          require(ran == want, label(c, comm.size()) + "ran " + ran + ", not " + want);
        }
  for (Coll coll : {Coll::AllGather, Coll::Broadcast})
    for (size_t count : {size_t{1}, size_t{1023}, size_t{100003}})
      for (bool inPlace : {false, true}) {
        const Case c{coll, DataType::Float32, ReduceOp::Sum, count, inPlace, comm.size() - 1};
        const std::string problem = runInWindow(comm, stream, window, c, ++seed);
        require(problem.empty(), problem);
        const std::string ran = braid::detail::lastDeviceAlgorithm(comm);
        require(ran == "oneshot", label(c, comm.size()) + "ran " + ran + ", not oneshot");
      }
  // The collectives without direct plans still work on window buffers.
  for (Coll coll : {Coll::Reduce, Coll::ReduceScatter}) {
    const Case c{coll, DataType::Float32, ReduceOp::Sum, 4099, false, 0};
    const std::string problem = runInWindow(comm, stream, window, c, ++seed);
    require(problem.empty(), problem);
  }
}

TEST_P(Windows, DirectCollectivesInWindowsMatchTheReferenceAt2To4Ranks) {
  for (int nranks : {2, 3, 4})
    runRanks(
        nranks, [](Communicator& comm) { sweepInWindow(comm, "oneshot", "twoshot"); }, options());
}

TEST_P(Windows, BraidAlgoForcesOneShotOrTwoShotAtEverySize) {
  for (const char* algo : {"oneshot", "twoshot"}) {
    ::setenv("BRAID_ALGO", algo, 1);
    runRanks(
        3, [algo](Communicator& comm) { sweepInWindow(comm, algo, algo); }, options());
  }
}

TEST_P(Windows, RanksOfOneProcessUseTheirWindowsDirectly) {
  RunOptions run = options();
  runProcesses(
      1,
      [](int, const UniqueId&, const Config& config) {
        const int devices = device::current()->count();
        std::vector<Communicator> comms = Communicator::initAll({0, 1 % devices, 0}, config);
        // One thread per rank: registration and each op's check block.
        std::vector<std::thread> threads;
        std::vector<std::string> failures(comms.size());
        for (size_t r = 0; r < comms.size(); ++r)
          threads.emplace_back([&, r] {
            try {
              device::current()->setCurrent(comms[r].device());
              sweepInWindow(comms[r], "oneshot", "twoshot");
            } catch (const RankFailure& failure) {
              failures[r] = failure.message;
            } catch (const std::exception& error) {
              failures[r] = error.what();
            }
          });
        for (std::thread& thread : threads) thread.join();
        for (size_t r = 0; r < comms.size(); ++r)
          require(failures[r].empty(), format("rank %zu: %s", r, failures[r].c_str()));
      },
      run);
}

// One-shot and two-shot combine every element's inputs in rank order: the
// same bits, and the same on every rank.
TEST_P(Windows, OneShotAndTwoShotGiveTheSameBitsOnEveryRank) {
  constexpr int kRanks = 4;
  const DataType kTypes[] = {DataType::Float32, DataType::BFloat16, DataType::Float16};
  struct Hashes {
    uint64_t of[2][3][kRanks];  // algorithm, type, rank
  };
  SharedWithRanks<Hashes> hashes;
  const char* const kAlgos[] = {"oneshot", "twoshot"};
  for (int a = 0; a < 2; ++a) {
    ::setenv("BRAID_ALGO", kAlgos[a], 1);
    runRanks(
        kRanks,
        [&](Communicator& comm) {
          TestStream stream(comm.device());
          TestWindow window(comm, kWindowBytes);
          const size_t count = 50021;
          std::byte* in = window.base();
          std::byte* out = window.base() + (size_t{4} << 20);
          for (int t = 0; t < 3; ++t) {
            const DataType type = kTypes[t];
            const size_t size = dataTypeSize(type);
            std::vector<std::byte> input(count * size), result(count * size);
            fillInput(type, ReduceOp::Sum, 77, comm.rank(), 0, count, input.data());
            device::current()->copyNow(in, input.data(), input.size());
            comm.allReduce(in, out, count, type, ReduceOp::Sum, stream.stream()).wait();
            stream.synchronize();
            require(braid::detail::lastDeviceAlgorithm(comm) == kAlgos[a],
                    std::string("BRAID_ALGO=") + kAlgos[a] + " ran " +
                        braid::detail::lastDeviceAlgorithm(comm));
            device::current()->copyNow(result.data(), out, result.size());
            const std::string problem =
                checkReduced(type, ReduceOp::Sum, 77, comm.size(), 0, count, result.data());
            require(problem.empty(), std::string(kAlgos[a]) + ": " + problem);
            uint64_t h = 0xcbf29ce484222325ull;
            for (std::byte b : result) h = (h ^ static_cast<uint8_t>(b)) * 0x100000001b3ull;
            hashes->of[a][t][comm.rank()] = h;
          }
        },
        options());
  }
  for (int t = 0; t < 3; ++t)
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(hashes->of[0][t][r], hashes->of[0][t][0])
          << dataTypeName(kTypes[t]) << ": rank " << r
          << "'s one-shot result differs from rank 0's";
      EXPECT_EQ(hashes->of[1][t][r], hashes->of[0][t][r])
          << dataTypeName(kTypes[t]) << ": rank " << r
          << "'s two-shot result differs from one-shot's";
    }
}

// Windows come and go while ring ops on other buffers are still queued on
// the stream; deregistration waits for the ops that may use the window.
TEST_P(Windows, RegistrationAndDeregistrationWhileOtherOpsRun) {
  runRanks(
      3,
      [](Communicator& comm) {
        TestStream busy(comm.device()), stream(comm.device());
        std::vector<std::unique_ptr<IssuedCase>> queued;
        uint64_t seed = 500;
        for (int i = 0; i < 4; ++i)  // not waited for until the end
          queued.push_back(std::make_unique<IssuedCase>(
              comm, busy, Case{Coll::AllReduce, DataType::Float32, ReduceOp::Sum, 200003, false, 0},
              ++seed));
        for (int round = 0; round < 3; ++round) {
          auto first = std::make_unique<TestWindow>(comm, kWindowBytes);
          TestWindow second(comm, kWindowBytes);
          for (TestWindow* window : {first.get(), &second}) {
            const Case c{Coll::AllReduce, DataType::Int32, ReduceOp::Sum, 4097, round % 2 == 1, 0};
            const std::string problem = runInWindow(comm, stream, *window, c, ++seed);
            require(problem.empty(), problem);
          }
          first.reset();  // deregistered while `second` stays
          const std::string problem =
              runInWindow(comm, stream, second,
                          {Coll::AllGather, DataType::Int8, ReduceOp::Sum, 333, false, 0}, ++seed);
          require(problem.empty(), problem);
        }
        busy.synchronize();
        for (auto& issued : queued) {
          const std::string problem = issued->check();
          require(problem.empty(), problem);
        }
      },
      options());
}

// A group of direct collectives, a slot-FIFO one and sends and receives:
// lowered in turns, the direct plans' Signals one step at a time.
TEST_P(Windows, DirectCollectivesInAGroupWithOtherOps) {
  runRanks(
      3,
      [](Communicator& comm) {
        TestStream stream(comm.device());
        TestWindow window(comm, kWindowBytes);
        const int n = comm.size(), r = comm.rank();
        const size_t count = 20011;
        const size_t size = sizeof(float);
        std::byte* reduceIn = window.base();
        std::byte* reduceOut = reduceIn + (size_t{1} << 20);
        std::byte* gathered = reduceOut + (size_t{1} << 20);
        DeviceBuffer plain(comm.device(), count * size), sent(comm.device(), count * size),
            received(comm.device(), count * size);
        std::vector<float> mine(count), ones(count, 1.0f + r), tagged(count);
        for (size_t i = 0; i < count; ++i) {
          mine[i] = static_cast<float>((r + 1) * (i % 61));
          tagged[i] = static_cast<float>(r * 100000 + i % 1000);
        }
        device::Device& dev = *device::current();
        dev.copyNow(reduceIn, mine.data(), count * size);
        dev.copyNow(gathered + r * count * size, mine.data(), count * size);
        plain.upload(ones.data());
        sent.upload(tagged.data());
        const Stream on = stream.stream();
        comm.groupStart();
        comm.send(sent.data(), count, DataType::Float32, (r + 1) % n, on);
        comm.allReduce(reduceIn, reduceOut, count, DataType::Float32, ReduceOp::Sum, on);
        comm.recv(received.data(), count, DataType::Float32, (r + n - 1) % n, on);
        comm.allReduce(plain.data(), plain.data(), count, DataType::Float32, ReduceOp::Max, on);
        comm.allGather(gathered + r * count * size, gathered, count, DataType::Float32, on);
        comm.groupEnd();
        stream.synchronize();
        std::vector<float> out(count), all(count * n);
        dev.copyNow(out.data(), reduceOut, count * size);
        for (size_t i = 0; i < count; ++i)
          require(out[i] == static_cast<float>(6 * (i % 61)),
                  format("the grouped window all-reduce's element %zu is %g", i, out[i]));
        dev.copyNow(all.data(), gathered, all.size() * size);
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < count; i += 97)
            require(all[q * count + i] == static_cast<float>((q + 1) * (i % 61)),
                    format("the grouped all-gather's element %zu of rank %d is %g", i, q,
                           all[q * count + i]));
        dev.copyNow(out.data(), plain.data(), count * size);
        require(out[0] == static_cast<float>(n) && out[count - 1] == static_cast<float>(n),
                format("the grouped slot-FIFO all-reduce gave %g", out[0]));
        dev.copyNow(out.data(), received.data(), count * size);
        const int from = (r + n - 1) % n;
        for (size_t i = 0; i < count; ++i)
          require(out[i] == static_cast<float>(from * 100000 + i % 1000),
                  format("element %zu received from rank %d is %g", i, from, out[i]));
      },
      options());
}

TEST_P(Windows, BadWindowsAreRefusedNamingTheArgumentAndTheCommunicatorGoesOn) {
  runRanks(
      2,
      [](Communicator& comm) {
        auto refused = [&](const std::function<void()>& call, const std::string& naming) {
          try {
            call();
          } catch (const Error& error) {
            require(error.code() == ErrorCode::InvalidArgument &&
                        std::string(error.what()).find(naming) != std::string::npos,
                    format("refused with: %s", error.what()));
            return;
          }
          require(false, "accepted a bad window (" + naming + ")");
        };
        std::vector<std::byte> host(4096);
        DeviceBuffer memory(comm.device(), 1 << 20);
        refused([&] { comm.registerWindow(memory.data(), 0); }, "argument 'bytes'");
        refused([&] { comm.registerWindow(nullptr, 64); }, "argument 'buffer'");
        // Sizes that differ between the ranks: refused on every rank.
        refused([&] { comm.registerWindow(memory.data(), comm.rank() == 0 ? 4096 : 8192); },
                "every rank registers the same size");
        refused([&] { comm.deregisterWindow(Window{12345}); }, "window 12345");
        // Host memory on one rank, device memory on another: every rank
        // refuses at once, naming both.
        refused([&] { comm.registerWindow(comm.rank() == 0 ? host.data() : memory.data(), 4096); },
                "argument 'buffer' is host memory on rank 0 but device memory on rank 1");
        {
          TestWindow kept(comm, 1 << 20);
          refused([&] { comm.deregisterWindow(Window{comm.rank() == 1 ? 777u : 1u}); },
                  "window 777 was not registered");
        }
        // Nothing half done: a window registers, works and goes.
        TestStream stream(comm.device());
        TestWindow window(comm, kWindowBytes);
        const std::string problem =
            runInWindow(comm, stream, window,
                        {Coll::AllReduce, DataType::Float32, ReduceOp::Max, 99, true, 0}, 9);
        require(problem.empty(), problem);
      },
      options());
}

// The byte rank `from` puts at index i in round `round`.
uint8_t pattern(int from, int round, size_t i) {
  return static_cast<uint8_t>(from * 37 + round * 11 + i * 7 + (i >> 10));
}

// Every rank puts a block into every rank's window (its own included) on
// its stream, raising a signal with each, then waits on the stream for
// every rank's signal: the blocks are in its window once the stream passed
// the wait. Later rounds overwrite the blocks: a rank's puts land after
// its earlier ones, and a wait consumes only its count.
TEST_P(Windows, PutsWithSignalsLandInThePeersWindowsInStreamOrderAt3Ranks) {
  runRanks(
      3,
      [](Communicator& comm) {
        const int n = comm.size(), r = comm.rank();
        const size_t most = size_t{1} << 20;
        TestWindow window(comm, most * static_cast<size_t>(n));
        TestStream stream(comm.device());
        DeviceBuffer source(comm.device(), most), decoy(comm.device(), most);
        std::vector<uint8_t> mine(most);
        int round = 0;
        for (size_t block : {size_t{8}, size_t{4097}, most}) {
          ++round;
          for (size_t i = 0; i < block; ++i) mine[i] = pattern(r, round, i);
          device::current()->copyNow(source.data(), mine.data(), block);
          const int signal = round % 2;
          // First a decoy into every block, then the pattern over it: the
          // second put of a pair lands last.
          for (size_t i = 0; i < block; ++i) mine[i] = static_cast<uint8_t>(~pattern(r, round, i));
          device::current()->copyNow(decoy.data(), mine.data(), block);
          for (int k = 0; k < n; ++k) {
            const int peer = (r + k) % n;
            comm.put(decoy.data(), block, DataType::Uint8, peer, window.handle(),
                     static_cast<size_t>(r) * block, signal, stream.stream());
            comm.put(source.data(), block, DataType::Uint8, peer, window.handle(),
                     static_cast<size_t>(r) * block, signal, stream.stream());
          }
          std::vector<SignalWait> waits;
          for (int from = 0; from < n; ++from) waits.push_back({from, signal, 2});
          comm.waitSignals(waits.data(), waits.size(), stream.stream()).wait();
          stream.synchronize();
          std::vector<uint8_t> got(block * static_cast<size_t>(n));
          device::current()->copyNow(got.data(), window.base(), got.size());
          for (int from = 0; from < n; ++from)
            for (size_t i = 0; i < block; ++i)
              if (got[static_cast<size_t>(from) * block + i] != pattern(from, round, i))
                require(false, format("round %d: byte %zu of rank %d's %zu-byte put is wrong",
                                      round, i, from, block));
          comm.barrier();  // nobody puts the next round into a block still being read
        }
      },
      options());
}

// A wait holds the stream, not the host: it is issued before the signal it
// waits for is raised, and signals alone (no data) release it; a wait
// consumes exactly its count.
TEST_P(Windows, AWaitHoldsTheStreamUntilThePeerSignals) {
  runRanks(
      2,
      [](Communicator& comm) {
        TestWindow window(comm, 4096);
        TestStream stream(comm.device());
        if (comm.rank() == 0) {
          const SignalWait wait{1, 5, 2};
          Work waited = comm.waitSignals(&wait, 1, stream.stream());
          comm.barrier();  // rank 1 signals once
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          require(!waited.test(), "a wait for 2 raises passed after 1");
          comm.barrier();  // and twice more
          waited.wait();
          const SignalWait last{1, 5, 1};  // the third raise is still there
          comm.waitSignals(&last, 1, stream.stream()).wait();
        } else {
          comm.signal(0, 5, stream.stream()).wait();
          comm.barrier();
          comm.barrier();
          comm.signal(0, 5, stream.stream());
          comm.signal(0, 5, stream.stream()).wait();
        }
        stream.synchronize();
      },
      options());
}

// A wait nobody answers fails past the communicator's timeout, naming the
// signal and the rank it waits for, and releases the stream. (Rank 0, with
// a long timeout of its own, waits too, until rank 1 gives up.)
TEST_P(Windows, AnUnansweredWaitTimesOutNamingTheSignal) {
  RunOptions run = options();
  run.config.timeout = std::chrono::milliseconds(1500);
  runRanks(
      2,
      [](Communicator& comm) {
        TestWindow window(comm, 4096);
        window.expectFailure();
        TestStream stream(comm.device());
        if (comm.rank() == 1) {
          const SignalWait wait{0, 3, 1};
          Work waited = comm.waitSignals(&wait, 1, stream.stream());
          requireError([&] { waited.wait(); }, ErrorCode::Timeout,
                       "waiting for signal 3 from rank 0");
        } else {
          comm.setTimeout(std::chrono::seconds(60));
          const SignalWait wait{1, 3, 1};
          Work waited = comm.waitSignals(&wait, 1, stream.stream());
          requireError([&] { waited.wait(); }, ErrorCode::Timeout, "peer 1 gave up");
        }
        stream.synchronize();  // released
      },
      run);
}

// A peer that dies fails a wait on the stream for its signal, naming it,
// and releases the stream; the communicator stays failed.
TEST_P(Windows, APeerThatDiesFailsAWaitForItsSignalNamingIt) {
  RunOptions run = options();
  run.killed = {1};
  run.deadline = std::chrono::seconds(60);
  runRanks(
      2,
      [](Communicator& comm) {
        TestWindow window(comm, 4096);
        window.expectFailure();
        TestStream stream(comm.device());
        DeviceBuffer source(comm.device(), 64);
        comm.barrier();
        if (comm.rank() == 1) ::kill(::getpid(), SIGKILL);
        const SignalWait wait{1, 0, 1};
        Work waited = comm.waitSignals(&wait, 1, stream.stream());
        requireError([&] { waited.wait(); }, ErrorCode::RemoteError, "peer 1");
        stream.synchronize();  // released
        try {
          comm.put(source.data(), 8, DataType::Uint8, 1, window.handle(), 0, 0, stream.stream())
              .wait();
          require(false, "a put to a dead rank on a failed communicator succeeded");
        } catch (const Error&) {
        }
      },
      run);
}

// Bad one-sided calls on device windows are refused naming the argument,
// with nothing enqueued or counted; the communicator goes on.
TEST_P(Windows, BadDeviceOneSidedCallsAreRefusedAndTheCommunicatorGoesOn) {
  runRanks(
      2,
      [](Communicator& comm) {
        TestStream stream(comm.device());
        DeviceBuffer source(comm.device(), 64);
        const int peer = 1 - comm.rank();
        requireError([&] { comm.signal(peer, 0, stream.stream()); }, ErrorCode::InvalidUsage,
                     "need a device window registered first");
        TestWindow window(comm, 4096);
        const Window handle = window.handle();
        requireError([&] { comm.put(source.data(), 8, DataType::Uint8, peer, handle, 0, 0); },
                     ErrorCode::InvalidArgument, "argument 'stream'");
        requireError(
            [&] {
              comm.put(source.data(), 64, DataType::Uint8, peer, handle, 4090, 0, stream.stream());
            },
            ErrorCode::InvalidArgument, "argument 'offset' (4090)");
        requireError(
            [&] {
              comm.put(source.data(), 8, DataType::Uint8, peer, handle, 0, kSignals,
                       stream.stream());
            },
            ErrorCode::InvalidArgument, "argument 'signal'");
        const SignalWait tooMany{peer, 0, (uint64_t{1} << 31) + 1};
        requireError([&] { comm.waitSignals(&tooMany, 1, stream.stream()); },
                     ErrorCode::InvalidArgument, "waits[0].count");
        comm.groupStart();
        requireError([&] { comm.signal(peer, 0, stream.stream()); }, ErrorCode::InvalidUsage,
                     "cannot be part of a group");
        comm.groupEnd();
        device::Device& device = *device::current();
        device.beginCapture(stream.handle());
        requireError([&] { comm.signal(peer, 0, stream.stream()); }, ErrorCode::InvalidUsage,
                     "captured into a CUDA graph");
        device.destroyGraph(device.endCapture(stream.handle()));
        // Nothing was raised or counted: one put and one wait pair up, and
        // a second wait finds nothing left until the peer signals again.
        comm.put(source.data(), 8, DataType::Uint8, peer, handle, 0, 0, stream.stream());
        const SignalWait one{peer, 0, 1};
        comm.waitSignals(&one, 1, stream.stream()).wait();
        if (comm.rank() == 0) {
          Work second = comm.waitSignals(&one, 1, stream.stream());
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          require(!second.test(), "a signal was counted twice, or a refused call counted one");
          comm.barrier();
          second.wait();
        } else {  // (its signal after a wait of its own would queue behind it)
          comm.barrier();
          comm.signal(peer, 0, stream.stream());
        }
        stream.synchronize();
      },
      options());
}

INSTANTIATE_TEST_SUITE_P(Device, Windows, ::testing::Values("emulated", "cuda"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace braid::testing
