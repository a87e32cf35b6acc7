// Planners checked in one process, without transports: a small simulator
// runs every rank's plan over unbounded per-link queues, checks that every
// receive is matched by a send of the same size (no deadlock, no leftover
// message) and that every rank ends with the right integers.
#include "algorithms/plan.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace braid::algo {
namespace {

using Values = std::vector<int64_t>;

struct SimRank {
  Plan plan;
  Values input, output;
  Values scratch = Values(1 << 12, -7);
  size_t step = 0;

  Values& buffer(Buffer b) {
    return b == Buffer::Input ? input : b == Buffer::Output ? output : scratch;
  }
};

bool writes(StepKind kind) { return kind != StepKind::Send && kind != StepKind::RecvReduceSend; }

// A step marked settled sends Output elements that no later step writes.
std::string checkSettled(const Plan& plan) {
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    if (!s.settled) continue;
    const bool fromSrc = s.kind == StepKind::Send;
    if ((fromSrc ? s.src : s.dst) != Buffer::Output || s.kind == StepKind::RecvReduceSend ||
        s.kind == StepKind::Recv || s.kind == StepKind::RecvReduceCopy ||
        s.kind == StepKind::Copy || s.kind == StepKind::Reduce)
      return "step " + std::to_string(i) + " is marked settled but sends nothing from Output";
    const size_t begin = fromSrc ? s.srcOffset : s.dstOffset, end = begin + s.count;
    for (size_t j = i + 1; j < plan.steps.size(); ++j) {
      const Step& later = plan.steps[j];
      if (writes(later.kind) && later.dst == Buffer::Output && later.dstOffset < end &&
          begin < later.dstOffset + later.count)
        return "step " + std::to_string(i) + " is marked settled but step " + std::to_string(j) +
               " writes what it sent";
    }
  }
  return "";
}

// Runs all plans to completion (sum reduction). Returns "" or what went wrong.
std::string simulate(std::vector<SimRank>& ranks) {
  const int n = static_cast<int>(ranks.size());
  for (int r = 0; r < n; ++r)
    if (std::string problem = checkSettled(ranks[r].plan); !problem.empty())
      return "rank " + std::to_string(r) + ": " + problem;
  std::map<std::pair<int, int>, std::deque<Values>> links;  // (from, to) -> messages
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < n; ++r) {
      SimRank& rank = ranks[r];
      while (rank.step < rank.plan.steps.size()) {
        const Step& s = rank.plan.steps[rank.step];
        if (s.count == 0) return "rank " + std::to_string(r) + " has an empty step";
        Values received;
        bool receives =
            s.kind != StepKind::Send && s.kind != StepKind::Copy && s.kind != StepKind::Reduce;
        if (receives) {
          auto& queue = links[{s.recvPeer, r}];
          if (queue.empty()) break;
          received = std::move(queue.front());
          queue.pop_front();
          if (received.size() != s.count)
            return "rank " + std::to_string(r) + " step " + std::to_string(rank.step) +
                   " expected " + std::to_string(s.count) + " elements, got " +
                   std::to_string(received.size());
        }
        const Values& srcBuffer = rank.buffer(s.src);
        Values mine(srcBuffer.begin() + s.srcOffset, srcBuffer.begin() + s.srcOffset + s.count);
        Values result;
        switch (s.kind) {
          case StepKind::Send:
          case StepKind::Copy:
            result = mine;
            break;
          case StepKind::Reduce:
            result.assign(rank.buffer(s.dst).begin() + s.dstOffset,
                          rank.buffer(s.dst).begin() + s.dstOffset + s.count);
            for (size_t i = 0; i < s.count; ++i) result[i] += mine[i];
            break;
          case StepKind::Recv:
          case StepKind::RecvCopySend:
            result = received;
            break;
          default:
            result = received;
            for (size_t i = 0; i < s.count; ++i) result[i] += mine[i];
        }
        bool writes = s.kind == StepKind::Recv || s.kind == StepKind::RecvReduceCopy ||
                      s.kind == StepKind::RecvReduceCopySend || s.kind == StepKind::RecvCopySend ||
                      s.kind == StepKind::Copy || s.kind == StepKind::Reduce;
        if (writes)
          std::copy(result.begin(), result.end(), rank.buffer(s.dst).begin() + s.dstOffset);
        bool sends = s.kind == StepKind::Send || s.kind == StepKind::RecvReduceSend ||
                     s.kind == StepKind::RecvReduceCopySend || s.kind == StepKind::RecvCopySend;
        if (sends) links[{r, s.sendPeer}].push_back(result);
        ++rank.step;
        moved = true;
      }
    }
  }
  for (int r = 0; r < n; ++r)
    if (ranks[r].step < ranks[r].plan.steps.size())
      return "deadlock: rank " + std::to_string(r) + " stuck at step " +
             std::to_string(ranks[r].step);
  for (auto& [link, queue] : links)
    if (!queue.empty())
      return "unreceived message from " + std::to_string(link.first) + " to " +
             std::to_string(link.second);
  return "";
}

int64_t valueOf(int rank, size_t index) {
  return rank * 1000003 + static_cast<int64_t>(index) * 7 + 1;
}

Shape shapeOf(int n, int r, size_t count, size_t chunk) {
  Shape s;
  s.nranks = n;
  s.rank = r;
  s.count = count;
  s.chunkElems = chunk;
  s.alignElems = chunk >= 4 ? 4 : 1;
  return s;
}

const std::vector<int> kRankCounts = {1, 2, 3, 4, 5, 7, 8, 13, 16, 31};
const std::vector<size_t> kCounts = {0, 1, 2, 5, 17, 64, 1000};
const std::vector<size_t> kChunks = {1, 4, 16, 1024};

TEST(Plans, RingAllReduceSumsEverywhere) {
  for (int n : kRankCounts)
    for (size_t count : kCounts)
      for (size_t chunk : kChunks) {
        std::vector<SimRank> ranks(n);
        for (int r = 0; r < n; ++r) {
          ranks[r].plan = ringAllReduce(shapeOf(n, r, count, chunk));
          for (size_t i = 0; i < count; ++i) ranks[r].input.push_back(valueOf(r, i));
          ranks[r].output.assign(count, -1);
        }
        ASSERT_EQ(simulate(ranks), "") << n << " ranks, count " << count << ", chunk " << chunk;
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i) {
            int64_t want = 0;
            for (int q = 0; q < n; ++q) want += valueOf(q, i);
            ASSERT_EQ(ranks[r].output[i], want) << "rank " << r << " element " << i;
          }
      }
}

TEST(Plans, OneShotAllReduceSumsEverywhereInPlaceToo) {
  for (int n : kRankCounts)
    for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{1000}})
      for (bool inPlace : {false, true}) {
        std::vector<SimRank> ranks(n);
        for (int r = 0; r < n; ++r) {
          ranks[r].plan = oneShotAllReduce(shapeOf(n, r, count, 16));
          for (size_t i = 0; i < count; ++i) ranks[r].input.push_back(valueOf(r, i));
          ranks[r].output = inPlace ? ranks[r].input : Values(count, -1);
          if (inPlace)  // the same buffer: steps that read input read output
            for (Step& s : ranks[r].plan.steps) {
              if (s.src == Buffer::Input) s.src = Buffer::Output;
            }
        }
        ASSERT_EQ(simulate(ranks), "") << n << " ranks, count " << count;
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i) {
            int64_t want = 0;
            for (int q = 0; q < n; ++q) want += valueOf(q, i);
            ASSERT_EQ(ranks[r].output[i], want) << "rank " << r << " element " << i;
          }
      }
}

TEST(Plans, RingAllReduceSendsTwiceTheBufferTimesNMinusOneOverN) {
  const int n = 5;
  const size_t count = 1000;
  Plan plan = ringAllReduce(shapeOf(n, 2, count, 1000));
  size_t sent = 0;
  for (const Step& s : plan.steps)
    if (s.kind != StepKind::Recv && s.kind != StepKind::RecvReduceCopy) sent += s.count;
  EXPECT_EQ(sent, 2 * (n - 1) * count / n);
}

TEST(Plans, RingAllGatherAndReduceScatterAreExact) {
  for (int n : kRankCounts)
    for (size_t count : kCounts)
      for (size_t chunk : kChunks) {
        std::vector<SimRank> gather(n), scatter(n);
        for (int r = 0; r < n; ++r) {
          gather[r].plan = ringAllGather(shapeOf(n, r, count, chunk));
          for (size_t i = 0; i < count; ++i) gather[r].input.push_back(valueOf(r, i));
          gather[r].output.assign(count * n, -1);
          scatter[r].plan = ringReduceScatter(shapeOf(n, r, count, chunk));
          for (size_t i = 0; i < count * n; ++i) scatter[r].input.push_back(valueOf(r, i));
          scatter[r].output.assign(count, -1);
        }
        ASSERT_EQ(simulate(gather), "") << "all-gather at " << n << " ranks, count " << count;
        ASSERT_EQ(simulate(scatter), "") << "reduce-scatter at " << n << " ranks, count " << count;
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i) {
            for (int b = 0; b < n; ++b) ASSERT_EQ(gather[r].output[b * count + i], valueOf(b, i));
            int64_t want = 0;
            for (int q = 0; q < n; ++q) want += valueOf(q, r * count + i);
            ASSERT_EQ(scatter[r].output[i], want) << "rank " << r << " element " << i;
          }
      }
}

TEST(Plans, ChainBroadcastAndReduceFromEveryRoot) {
  for (int n : kRankCounts)
    for (int root = 0; root < n; root += (n > 4 ? 3 : 1))
      for (size_t count : kCounts) {
        std::vector<SimRank> bcast(n), red(n);
        for (int r = 0; r < n; ++r) {
          Shape shape = shapeOf(n, r, count, 16);
          shape.root = root;
          bcast[r].plan = chainBroadcast(shape);
          red[r].plan = chainReduce(shape);
          for (size_t i = 0; i < count; ++i) {
            bcast[r].input.push_back(valueOf(r, i));
            red[r].input.push_back(valueOf(r, i));
          }
          bcast[r].output.assign(count, -1);
          red[r].output.assign(count, -1);
        }
        ASSERT_EQ(simulate(bcast), "") << "broadcast at " << n << " ranks from " << root;
        ASSERT_EQ(simulate(red), "") << "reduce at " << n << " ranks to " << root;
        for (size_t i = 0; i < count; ++i) {
          int64_t want = 0;
          for (int q = 0; q < n; ++q) want += valueOf(q, i);
          ASSERT_EQ(red[root].output[i], want);
          for (int r = 0; r < n; ++r) ASSERT_EQ(bcast[r].output[i], valueOf(root, i));
        }
      }
}

TEST(Plans, NoStepMovesMoreThanOneChunk) {
  for (size_t chunk : {size_t{16}, size_t{1024}}) {
    Shape shape = shapeOf(7, 3, 100000, chunk);
    for (const Plan& plan : {ringAllReduce(shape), ringAllGather(shape), ringReduceScatter(shape),
                             chainBroadcast(shape), chainReduce(shape)})
      for (const Step& s : plan.steps)
        if (s.kind != StepKind::Copy) {
          ASSERT_LE(s.count, chunk);
        }
  }
}

}  // namespace
}  // namespace braid::algo
