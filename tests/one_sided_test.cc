// One-sided calls on host windows: put, signal and waitSignals, over each
// way a put reaches a peer (mapped memAlloc memory, process_vm_writev, and
// a socket: the tcp.* instances put every pair there), the target taking no
// part, the order per pair, deregistration behind puts in flight, and the
// refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "multirank.h"

namespace braid {
namespace {

using testing::require;
using testing::requireError;
using testing::RunOptions;
using testing::runRanks;
using namespace std::chrono_literals;

// The byte rank `from` writes at index i of a put of round `round`.
uint8_t pattern(int from, int round, size_t i) {
  return static_cast<uint8_t>(from * 31 + round * 7 + i * 13 + (i >> 9));
}

// Every rank puts a block into every rank's window (its own included), each
// with a signal, then waits for every rank's signal and checks each block.
void everyRankPutsEverywhere(Communicator& comm, std::byte* window, size_t block, int round,
                             Window handle) {
  const int n = comm.size(), r = comm.rank();
  std::vector<uint8_t> mine(block);
  for (size_t i = 0; i < block; ++i) mine[i] = pattern(r, round, i);
  for (int k = 0; k < n; ++k) {
    const int peer = (r + k) % n;
    comm.put(mine.data(), block, DataType::Uint8, peer, handle, static_cast<size_t>(r) * block,
             round % kSignals);
  }
  std::vector<SignalWait> waits;
  for (int from = 0; from < n; ++from) waits.push_back({from, round % kSignals, 1});
  comm.waitSignals(waits.data(), waits.size());
  for (int from = 0; from < n; ++from) {
    const std::byte* got = window + static_cast<size_t>(from) * block;
    for (size_t i = 0; i < block; ++i)
      if (std::to_integer<uint8_t>(got[i]) != pattern(from, round, i))
        require(false, format("round %d: byte %zu of rank %d's %zu-byte put is wrong", round, i,
                              from, block));
  }
}

TEST(OneSided, EveryRankPutsIntoEveryRanksWindowAndWaitsForTheirSignalsAt4Ranks) {
  runRanks(4, [](Communicator& comm) {
    const size_t most = size_t{1} << 20;
    const size_t bytes = most * static_cast<size_t>(comm.size());
    // Ordinary memory (process_vm_writev from this host) and memAlloc
    // memory (mapped by this host's peers).
    std::vector<std::byte> plain(bytes);
    void* shared = memAlloc(bytes);
    const Window plainWindow = comm.registerWindow(plain.data(), plain.size());
    const Window sharedWindow = comm.registerWindow(shared, bytes);
    int round = 0;
    for (size_t block : {size_t{8}, size_t{4097}, size_t{65536}, most}) {
      everyRankPutsEverywhere(comm, plain.data(), block, round++, plainWindow);
      everyRankPutsEverywhere(comm, static_cast<std::byte*>(shared), block, round++, sharedWindow);
      comm.barrier();  // nobody puts the next round into a block still being checked
    }
    comm.deregisterWindow(sharedWindow);
    comm.deregisterWindow(plainWindow);
    memFree(shared);
  });
}

// Puts and signals from one rank to another land in issue order; a wait
// consumes exactly the count it asked for; signals count independently.
TEST(OneSided, PutsAndSignalsLandInIssueOrderAndWaitsConsumeTheirCounts) {
  testing::SharedWithRanks<std::atomic<bool>> checked;
  runRanks(3, [&](Communicator& comm) {
    std::vector<uint64_t> slot(1, 0);
    const Window window = comm.registerWindow(slot.data(), sizeof(uint64_t));
    const int r = comm.rank();
    constexpr uint64_t kPuts = 2000;
    if (r == 0) {
      for (uint64_t i = 1; i <= kPuts; ++i) comm.put(&i, 1, DataType::Uint64, 1, window, 0, -1);
      comm.signal(1, 3);
      for (int i = 0; i < 10; ++i) comm.signal(1, 5);
    } else if (r == 1) {
      const SignalWait ordered{0, 3, 1};
      comm.waitSignals(&ordered, 1);
      require(slot[0] == kPuts, format("signal 3 came before the last put: slot holds %llu",
                                       static_cast<unsigned long long>(slot[0])));
      const SignalWait four{0, 5, 4}, six{0, 5, 6};
      comm.waitSignals(&four, 1);
      comm.waitSignals(&six, 1);
    }
    comm.barrier();
    comm.deregisterWindow(window);
    if (r == 1) {  // all ten are consumed: one more is not there (a sticky timeout, so last)
      comm.setTimeout(300ms);
      const SignalWait more{0, 5, 1};
      requireError([&] { comm.waitSignals(&more, 1); }, ErrorCode::Timeout,
                   "0 of 1 signals 5 from rank 0");
      checked->store(true);
    }
    // (Rank 0 leaving first would end the wait with RemoteError.)
    while (!checked->load()) std::this_thread::sleep_for(1ms);
  });
}

// The target takes no part in a put: it is busy in a collective with a
// third rank that waits for the putter, and the put still completes.
TEST(OneSided, APutCompletesWhileItsTargetIsBusyElsewhere) {
  runRanks(3, [](Communicator& comm) {
    const size_t bytes = size_t{16} << 20;
    std::vector<std::byte> window(bytes);
    const Window handle = comm.registerWindow(window.data(), window.size());
    const int r = comm.rank();
    std::vector<std::byte> data(bytes, std::byte{0x5a});
    float x = 1;
    if (r == 0) {
      comm.put(data.data(), bytes, DataType::Uint8, 1, handle, 0, 0);
      comm.put(data.data(), bytes, DataType::Uint8, 1, handle, 0, 0);  // more than a socket holds
      comm.allReduce(&x, &x, 1, DataType::Float32, ReduceOp::Sum);
    } else if (r == 1) {
      comm.allReduce(&x, &x, 1, DataType::Float32, ReduceOp::Sum);
      const SignalWait two{0, 0, 2};
      comm.waitSignals(&two, 1);
      require(std::all_of(window.begin(), window.end(),
                          [](std::byte b) { return b == std::byte{0x5a}; }),
              "the put's bytes are not all in the window");
    } else {
      comm.allReduce(&x, &x, 1, DataType::Float32, ReduceOp::Sum);
    }
    require(x == 3, "wrong all-reduce");
    comm.deregisterWindow(handle);
  });
}

// Deregistration waits for the puts issued before it, on every rank: the
// last bytes are in the window when it returns, with no signal waited for.
TEST(OneSided, DeregisteringAWindowWaitsForThePutsIssuedBefore) {
  runRanks(2, [](Communicator& comm) {
    const size_t bytes = size_t{4} << 20;
    std::vector<uint32_t> window(bytes / 4, 0);
    const Window handle = comm.registerWindow(window.data(), bytes);
    std::vector<uint32_t> data(bytes / 4);
    for (int round = 1; round <= 3; ++round) {
      std::fill(data.begin(), data.end(), static_cast<uint32_t>(round * 10 + comm.rank()));
      comm.put(data.data(), data.size(), DataType::Uint32, 1 - comm.rank(), handle, 0, -1);
    }
    comm.deregisterWindow(handle);
    const uint32_t want = static_cast<uint32_t>(30 + (1 - comm.rank()));
    require(std::all_of(window.begin(), window.end(), [&](uint32_t v) { return v == want; }),
            "the window does not hold the last put after deregistration");
  });
}

// Parts may differ in size; a put is checked against its target's part.
// Bad arguments are refused naming them, nothing is written, and the
// communicator stays usable.
TEST(OneSided, BadArgumentsAreRefusedNamingThemAndTheCommunicatorStaysUsable) {
  runRanks(2, [](Communicator& comm) {
    const int r = comm.rank(), peer = 1 - r;
    uint32_t value = 7;
    requireError([&] { comm.signal(peer, 0); }, ErrorCode::InvalidUsage,
                 "need a host window registered first");
    std::vector<uint32_t> part(r == 0 ? 16 : 4, 0);
    const Window window = comm.registerWindow(part.data(), part.size() * sizeof(uint32_t));
    requireError([&] { comm.put(&value, 1, DataType::Uint32, 2, window, 0, 0); },
                 ErrorCode::InvalidArgument, "argument 'peer' is 2");
    requireError([&] { comm.put(&value, 1, DataType::Uint32, peer, Window{999}, 0, 0); },
                 ErrorCode::InvalidArgument, "argument 'window' (999)");
    const size_t end = peer == 0 ? 64 : 16;
    requireError([&] { comm.put(&value, 1, DataType::Uint32, peer, window, end - 2, 0); },
                 ErrorCode::InvalidArgument, "argument 'offset'");
    requireError([&] { comm.put(&value, 1, DataType::Uint32, peer, window, 0, kSignals); },
                 ErrorCode::InvalidArgument, "argument 'signal'");
    requireError([&] { comm.put(nullptr, 1, DataType::Uint32, peer, window, 0, 0); },
                 ErrorCode::InvalidArgument, "argument 'source'");
    const SignalWait twice[] = {{peer, 1, 1}, {peer, 1, 2}};
    requireError([&] { comm.waitSignals(twice, 2); }, ErrorCode::InvalidArgument,
                 "both wait for signal 1");
    const SignalWait nobody{5, 0, 1};
    requireError([&] { comm.waitSignals(&nobody, 1); }, ErrorCode::InvalidArgument,
                 "waits[0].peer is 5");
    comm.groupStart();
    requireError([&] { comm.signal(peer, 0); }, ErrorCode::InvalidUsage, "part of a group");
    comm.groupEnd();
    // Nothing was written; the last byte of each part takes a put.
    comm.put(&value, 1, DataType::Uint32, peer, window, end - 4, 2);
    const SignalWait one{peer, 2, 1};
    comm.waitSignals(&one, 1);
    require(part.back() == 7 && std::count(part.begin(), part.end(), 0u) == long(part.size() - 1),
            "the window holds more than the one good put");
    comm.deregisterWindow(window);
    requireError([&] { comm.deregisterWindow(window); }, ErrorCode::InvalidArgument,
                 "was not registered");
    float x = 1;
    comm.allReduce(&x, &x, 1, DataType::Float32, ReduceOp::Sum);
    require(x == 2, "the communicator is not usable after the refusals");
  });
}

}  // namespace
}  // namespace braid
