#include "algorithms/simulate.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/errors.h"

namespace braid::algo {
namespace {

using Values = std::vector<int64_t>;

struct Message {
  Values data;     // empty unless the data is checked
  size_t count;    // elements
  double arrival;  // seconds
};

struct SimRank {
  Plan plan;
  Values input, output, scratch;
  size_t step = 0;
  double clock = 0;
  bool signalled = false;  // the current Signal step posted its message

  Values& buffer(Buffer b) {
    return b == Buffer::Input ? input : b == Buffer::Output ? output : scratch;
  }
};

// Whether a step writes this rank's dst (CopyTo writes a peer's).
bool writes(StepKind kind) {
  return kind != StepKind::Send && kind != StepKind::RecvReduceSend && kind != StepKind::Signal &&
         kind != StepKind::CopyTo;
}
bool reduces(StepKind kind) {
  return kind == StepKind::RecvReduceSend || kind == StepKind::RecvReduceCopy ||
         kind == StepKind::RecvReduceCopySend || kind == StepKind::Reduce ||
         kind == StepKind::ReduceFrom;
}

int64_t valueOf(int rank, size_t index) {
  return static_cast<int64_t>(rank) * 1000003 + static_cast<int64_t>(index) * 7 + 1;
}

bool inBounds(const Values& buffer, size_t offset, size_t count, bool checked) {
  return !checked || (offset <= buffer.size() && count <= buffer.size() - offset);
}

// A step marked settled sends Output elements that no later step writes.
// Walks the plan backwards keeping the union of the output ranges written
// after the current step (disjoint [begin, end) by begin).
std::string checkSettled(const Plan& plan) {
  std::map<size_t, size_t> written;
  auto overlaps = [&](size_t begin, size_t end) {
    auto next = written.lower_bound(end);  // first range starting at or after end
    return next != written.begin() && std::prev(next)->second > begin;
  };
  auto add = [&](size_t begin, size_t end) {
    auto it = written.lower_bound(begin);
    if (it != written.begin() && std::prev(it)->second >= begin) --it;
    while (it != written.end() && it->first <= end) {
      begin = std::min(begin, it->first);
      end = std::max(end, it->second);
      it = written.erase(it);
    }
    written.emplace(begin, end);
  };
  for (size_t i = plan.steps.size(); i-- > 0;) {
    const Step& s = plan.steps[i];
    if (s.settled) {
      const bool fromSrc = s.kind == StepKind::Send;
      if (!sends(s.kind) || (fromSrc ? s.src : s.dst) != Buffer::Output ||
          s.kind == StepKind::RecvReduceSend)
        return format("step %zu is marked settled but sends nothing from the output", i);
      const size_t begin = fromSrc ? s.srcOffset : s.dstOffset;
      if (overlaps(begin, begin + s.count))
        return format("step %zu is marked settled but a later step writes what it sent", i);
    }
    if (writes(s.kind) && s.dst == Buffer::Output) add(s.dstOffset, s.dstOffset + s.count);
  }
  return "";
}

}  // namespace

SimResult simulate(Collective collective, Algorithm algorithm, int n, size_t count, int root,
                   const SimOptions& options) {
  SimResult result;
  const bool check = options.checkData;
  const size_t elem = options.elemSize;
  std::vector<SimRank> ranks(n);
  size_t inCount = count, outCount = count;
  if (collective == Collective::AllGather) outCount = count * n;
  if (collective == Collective::ReduceScatter) inCount = count * n;
  for (int r = 0; r < n; ++r) {
    Shape shape;
    shape.nranks = n;
    shape.rank = r;
    shape.count = count;
    shape.root = root;
    shape.elemSize = elem;
    shape.alignElems = std::max<size_t>(1, options.alignBytes / elem);
    shape.chunkElems =
        std::max(shape.alignElems, options.chunkBytes / elem / shape.alignElems * shape.alignElems);
    shape.mapped = options.mapped;
    shape.localRanks = options.localRanks;
    SimRank& rank = ranks[r];
    rank.plan = makePlan(collective, algorithm, shape);
    if (check) {
      rank.input.resize(inCount);
      for (size_t i = 0; i < inCount; ++i) rank.input[i] = valueOf(r, i);
      rank.output.assign(outCount, -1);
      // As much scratch as the steps touch (it must fit what the executor gives).
      size_t scratchEnd = 0;
      for (const Step& step : rank.plan.steps) {
        if (step.src == Buffer::Scratch)
          scratchEnd = std::max(scratchEnd, step.srcOffset + step.count);
        if (step.dst == Buffer::Scratch)
          scratchEnd = std::max(scratchEnd, step.dstOffset + step.count);
      }
      if (scratchEnd * elem > std::max(kScratchBytes, rank.plan.scratchBytes)) {
        result.problem =
            format("rank %d uses %zu bytes of scratch, more than it has", r, scratchEnd * elem);
        return result;
      }
      rank.scratch.assign(scratchEnd, -7);
    }
  }

  for (int r = 0; r < n; ++r)
    if (std::string problem = checkSettled(ranks[r].plan); !problem.empty()) {
      result.problem = format("rank %d: %s", r, problem.c_str());
      return result;
    }
  // One queue per ordered pair that ever talks, keyed by from * n + to.
  struct Link {
    std::vector<Message> messages;
    size_t head = 0;  // the next unread message
    double free = 0;  // when the link can take the next message
  };
  std::unordered_map<uint64_t, Link> links;
  auto linkOf = [&](int from, int to) -> Link& {
    return links[static_cast<uint64_t>(from) * static_cast<uint64_t>(n) +
                 static_cast<uint64_t>(to)];
  };
  const bool reducing = collective == Collective::AllReduce || collective == Collective::Reduce ||
                        collective == Collective::ReduceScatter;
  // The link from one rank to another: within a host or across.
  const int perHost = options.localRanks;
  auto sameHost = [&](int a, int b) { return perHost > 1 && a / perHost == b / perHost; };
  auto latencyTo = [&](int from, int to) {
    return sameHost(from, to) && options.link.hostLatency > 0 ? options.link.hostLatency
                                                              : options.link.latency;
  };
  auto bandwidthTo = [&](int from, int to) {
    return sameHost(from, to) && options.link.hostBandwidth > 0 ? options.link.hostBandwidth
                                                                : options.link.bandwidth;
  };
  auto fail = [&](int r, const std::string& what) {
    result.problem = format("rank %d step %zu: %s", r, ranks[r].step, what.c_str());
    return result;
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < n; ++r) {
      SimRank& rank = ranks[r];
      while (rank.step < rank.plan.steps.size()) {
        const Step& s = rank.plan.steps[rank.step];
        if (s.count == 0 && s.kind != StepKind::Signal) return fail(r, "an empty step");
        if (s.finalize && !reducing)
          return fail(r, "finalizes, in a collective that reduces nothing");
        if (direct(s.kind) || s.kind == StepKind::Signal) {
          if (!options.mapped) return fail(r, "a direct step on buffers nobody mapped");
          const int peer = s.kind == StepKind::CopyTo ? s.sendPeer : s.recvPeer;
          if (s.kind != StepKind::ReduceFrom && (peer < 0 || peer >= n || peer == r))
            return fail(r, format("reaches into rank %d", peer));
        }
        if (s.kind == StepKind::Signal && !rank.signalled) {
          // A Signal posts its message before it waits for the peer's.
          if (s.sendPeer < 0 || s.sendPeer >= n || s.sendPeer == r)
            return fail(r, format("signals rank %d", s.sendPeer));
          Link& link = linkOf(r, s.sendPeer);
          link.messages.push_back(
              {{}, 0, std::max(rank.clock, link.free) + latencyTo(r, s.sendPeer)});
          ++result.messages;
          rank.signalled = true;
        }
        Message received{{}, 0, 0};
        if (receives(s.kind)) {
          if (s.recvPeer < 0 || s.recvPeer >= n || s.recvPeer == r)
            return fail(r, format("receives from rank %d", s.recvPeer));
          Link& link = linkOf(s.recvPeer, r);
          if (link.head == link.messages.size()) break;
          received = std::move(link.messages[link.head++]);
          if (link.head == link.messages.size()) link.messages.clear(), link.head = 0;
          if (received.count != s.count)
            return fail(r, format("expected %zu elements from rank %d, got %zu", s.count,
                                  s.recvPeer, received.count));
          rank.clock = std::max(rank.clock, received.arrival);
        }
        const bool readsSrc = s.kind != StepKind::Recv && s.kind != StepKind::RecvCopySend &&
                              s.kind != StepKind::Signal && s.kind != StepKind::CopyFrom;
        Values result_;
        if (check && (direct(s.kind) || s.kind == StepKind::Signal)) {
          // The peers' buffers, as they are now: the Signals before this
          // step are what make that the right moment.
          auto span = [&](SimRank& owner, Buffer b, size_t offset) -> Values* {
            Values& buffer = owner.buffer(b);
            return inBounds(buffer, offset, s.count, true) ? &buffer : nullptr;
          };
          if (s.kind == StepKind::ReduceFrom) {
            Values sum(s.count, 0);
            for (int q = 0; q < n; ++q) {
              const Values* from = span(ranks[q], s.src, s.srcOffset);
              if (!from) return fail(r, format("reads past the end of rank %d's buffer", q));
              for (size_t i = 0; i < s.count; ++i) sum[i] += (*from)[s.srcOffset + i];
            }
            if (s.finalize)
              for (int64_t& v : sum) v = -v;
            if (!span(rank, s.dst, s.dstOffset)) return fail(r, "writes past the end of a buffer");
            std::copy(sum.begin(), sum.end(), rank.buffer(s.dst).begin() + s.dstOffset);
          } else if (s.kind != StepKind::Signal) {
            SimRank& from = s.kind == StepKind::CopyTo ? rank : ranks[s.recvPeer];
            SimRank& to = s.kind == StepKind::CopyTo ? ranks[s.sendPeer] : rank;
            const Values* source = span(from, s.src, s.srcOffset);
            if (!source || !span(to, s.dst, s.dstOffset))
              return fail(r, "a direct copy past the end of a buffer");
            std::copy(source->begin() + s.srcOffset, source->begin() + s.srcOffset + s.count,
                      to.buffer(s.dst).begin() + s.dstOffset);
          }
        } else if (check) {
          if (readsSrc && !inBounds(rank.buffer(s.src), s.srcOffset, s.count, true))
            return fail(r, "reads past the end of a buffer");
          if (writes(s.kind) && !inBounds(rank.buffer(s.dst), s.dstOffset, s.count, true))
            return fail(r, "writes past the end of a buffer");
          Values mine;
          if (readsSrc)
            mine.assign(rank.buffer(s.src).begin() + s.srcOffset,
                        rank.buffer(s.src).begin() + s.srcOffset + s.count);
          switch (s.kind) {
            case StepKind::Send:
            case StepKind::Copy:
              result_ = mine;
              break;
            case StepKind::Reduce:
              result_.assign(rank.buffer(s.dst).begin() + s.dstOffset,
                             rank.buffer(s.dst).begin() + s.dstOffset + s.count);
              for (size_t i = 0; i < s.count; ++i) result_[i] += mine[i];
              break;
            case StepKind::Recv:
            case StepKind::RecvCopySend:
              result_ = std::move(received.data);
              break;
            default:
              result_ = std::move(received.data);
              for (size_t i = 0; i < s.count; ++i) result_[i] += mine[i];
          }
          if (s.finalize)
            for (int64_t& v : result_) v = -v;
          if (writes(s.kind))
            std::copy(result_.begin(), result_.end(), rank.buffer(s.dst).begin() + s.dstOffset);
        }
        const double bytes = static_cast<double>(s.count * elem);
        const LinkModel& model = options.link;
        const double reduceTime = model.reduceBandwidth > 0 ? bytes / model.reduceBandwidth : 0;
        const double copyTime = model.copyBandwidth > 0 ? bytes / model.copyBandwidth : 0;
        const int linkPeer = sends(s.kind) ? s.sendPeer : s.recvPeer;
        const double linkTime =
            bytes / (linkPeer >= 0 && linkPeer < n ? bandwidthTo(r, linkPeer) : model.bandwidth);
        const bool inPlace =
            s.kind == StepKind::Copy && s.src == s.dst && s.srcOffset == s.dstOffset;
        if (s.kind == StepKind::Recv || s.kind == StepKind::RecvCopySend ||
            (s.kind == StepKind::Copy && !inPlace))
          rank.clock += copyTime;
        if (reduces(s.kind) && s.kind != StepKind::RecvReduceSend) rank.clock += reduceTime;
        if (s.kind == StepKind::ReduceFrom)  // the peers' parts come over their links
          rank.clock += (n - 1) * std::max(linkTime, reduceTime);
        if (s.kind == StepKind::CopyTo || s.kind == StepKind::CopyFrom) rank.clock += linkTime;
        if (sends(s.kind) && s.kind != StepKind::Signal) {
          if (s.sendPeer < 0 || s.sendPeer >= n || s.sendPeer == r)
            return fail(r, format("sends to rank %d", s.sendPeer));
          Link& link = linkOf(r, s.sendPeer);
          const double leave = std::max(rank.clock, link.free);
          link.free = leave + (s.kind == StepKind::RecvReduceSend ? std::max(linkTime, reduceTime)
                                                                  : linkTime);
          rank.clock = link.free;  // the sender is busy putting it on the link
          link.messages.push_back({check ? std::move(result_) : Values{}, s.count,
                                   link.free + latencyTo(r, s.sendPeer)});
          ++result.messages;
          result.bytes += static_cast<uint64_t>(bytes);
        }
        ++rank.step;
        rank.signalled = false;
        moved = true;
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    if (ranks[r].step < ranks[r].plan.steps.size()) return fail(r, "deadlock: stuck waiting");
    result.seconds = std::max(result.seconds, ranks[r].clock);
  }
  for (const auto& [key, link] : links)
    if (link.head < link.messages.size()) {
      result.problem = format("rank %d sent rank %d a message nobody received",
                              static_cast<int>(key / n), static_cast<int>(key % n));
      return result;
    }
  if (!check) return result;

  // The expected outputs, computed here independently of any plan.
  auto sumAt = [&](size_t index) {  // finalized: negated (see above)
    int64_t sum = 0;
    for (int q = 0; q < n; ++q) sum += valueOf(q, index);
    return -sum;
  };
  for (int r = 0; r < n; ++r) {
    const Values& out = ranks[r].output;
    for (size_t i = 0; i < outCount; ++i) {
      int64_t want = 0;
      switch (collective) {
        case Collective::AllReduce:
          want = sumAt(i);
          break;
        case Collective::Broadcast:
          want = valueOf(root, i);
          break;
        case Collective::Reduce:
          if (r != root) continue;
          want = sumAt(i);
          break;
        case Collective::AllGather:
          want = valueOf(static_cast<int>(i / count), i % count);
          break;
        case Collective::ReduceScatter:
          want = sumAt(r * count + i);
          break;
        default:
          continue;
      }
      if (out[i] != want) {
        result.problem = format("rank %d output element %zu is %lld, expected %lld", r, i,
                                static_cast<long long>(out[i]), static_cast<long long>(want));
        return result;
      }
    }
  }
  return result;
}

}  // namespace braid::algo
