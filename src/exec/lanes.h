// What both executors share about lanes: the buffers a step touches, each
// lane's scratch area, and the turns lanes take on connection directions.
//
// In the executors a lane is one op's plan bound to its buffers, advancing
// through its steps inside a batch of ops run together (a group; an op
// issued alone is a batch of one). The host executor's lane is Lane
// (cpu_executor.h), the device executor's DeviceLane (device_executor.h);
// the templates below take either. They read `plan`, `step`, `input`,
// `output` and `scratch`.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <utility>
#include <vector>

#include "algorithms/plan.h"

namespace braid::exec {

// Whether a step of `kind` reads its src buffer (every step but those that
// only pass on what they received), and whether it writes its dst buffer
// (every step but those whose result goes only to the peer). The executors
// take a pointer only into the buffers a step uses, so a rank may pass null
// for one it never uses (a non-root's input to broadcast).
inline bool readsSrc(algo::StepKind kind) {
  return kind != algo::StepKind::Recv && kind != algo::StepKind::RecvCopySend;
}
inline bool writesDst(algo::StepKind kind) {
  return kind != algo::StepKind::Send && kind != algo::StepKind::RecvReduceSend;
}

// The peers a step exchanges messages with: {sendPeer, recvPeer}, -1 for
// a direction the step does not use.
inline std::array<int, 2> peersOf(const algo::Step& step) {
  return {algo::sends(step.kind) ? step.sendPeer : -1,
          algo::receives(step.kind) ? step.recvPeer : -1};
}

// The memory a step names: the lane's input, output or scratch area.
template <typename AnyLane>
std::byte* bufferOf(const AnyLane& lane, algo::Buffer buffer) {
  switch (buffer) {
    case algo::Buffer::Input:
      return const_cast<std::byte*>(lane.input);
    case algo::Buffer::Output:
      return lane.output;
    case algo::Buffer::Scratch:
      return lane.scratch;
  }
  return nullptr;
}

// The bytes of scratch a lane gets: kScratchBytes, or what its plan asks
// for if more, rounded up to `alignment` so that the next lane's area,
// carved from the same block, starts aligned.
template <typename AnyLane>
size_t scratchOf(const AnyLane& lane, size_t alignment) {
  return (std::max(algo::kScratchBytes, lane.plan->scratchBytes) + alignment - 1) / alignment *
         alignment;
}

// Turns on connection directions (one peer, one way), for the lanes of a
// group. A lane holds a direction from the first to the last of its steps
// that use it; lanes hold it one at a time, in issue order: a lane may use
// a direction once every earlier lane that uses it is past its last step
// on it. This guarantees that on every direction each lane's messages come
// all together, lane after lane in issue order: the messages of two ops
// never interleave on a connection, and since every rank issues its ops in
// the same order, a rank's k-th message on a direction belongs to the same
// op as its peer's k-th.
//
// Rounds, for an executor that moves one piece of a lane at a time through
// a loop over the lanes (the device executor lowering a group's sends and
// receives): between nextRound() calls, mayRunThisRound() lets each
// direction carry one piece at most, which ran() records. Where each lane
// uses one direction, as a send or a receive does, that keeps every rank's
// k-th message on a direction in round k, so a send's credit never waits
// for a receive of its own round. (Not so for collectives, whose steps may
// use two directions: one rank may have to hold a piece back a round where
// its peer need not; the device executor lowers them one at a time.) The
// host executor, which runs each lane as far as its connections let it,
// asks mayRun() alone.
//
// `lanes` (in issue order) outlives this; their `step` is read, never
// written. Building one allocates; asking does not.
template <typename AnyLane>
class Turns {
 public:
  // Every peer a step names is below `nranks`.
  Turns(const AnyLane* lanes, size_t count, int nranks)
      : lanes_(lanes), queues_(2 * static_cast<size_t>(nranks)), lastUse_(count) {
    for (size_t i = 0; i < count; ++i) {
      const auto& steps = lanes[i].plan->steps;
      for (size_t s = 0; s < steps.size(); ++s) {
        if (algo::sends(steps[s].kind)) note(i, sendKey(steps[s].sendPeer), s);
        if (algo::receives(steps[s].kind)) note(i, recvKey(steps[s].recvPeer), s);
      }
    }
  }

  // Whether it is `lane`'s turn on every direction `step` (its current
  // step) uses.
  bool mayRun(size_t lane, const algo::Step& step) const {
    return (!algo::sends(step.kind) || isHead(lane, sendKey(step.sendPeer))) &&
           (!algo::receives(step.kind) || isHead(lane, recvKey(step.recvPeer)));
  }
  // mayRun(), and no piece used those directions yet in this round.
  bool mayRunThisRound(size_t lane, const algo::Step& step) const {
    return mayRun(lane, step) && !(algo::sends(step.kind) && taken(sendKey(step.sendPeer))) &&
           !(algo::receives(step.kind) && taken(recvKey(step.recvPeer)));
  }
  // A piece of `step` used its directions in this round.
  void ran(const algo::Step& step) {
    if (algo::sends(step.kind)) used_.push_back(sendKey(step.sendPeer));
    if (algo::receives(step.kind)) used_.push_back(recvKey(step.recvPeer));
  }
  void nextRound() { used_.clear(); }

 private:
  static size_t sendKey(int peer) { return 2 * static_cast<size_t>(peer); }
  static size_t recvKey(int peer) { return 2 * static_cast<size_t>(peer) + 1; }

  void note(size_t lane, size_t key, size_t step) {
    auto& queue = queues_[key];
    if (queue.empty() || queue.back() != lane) queue.push_back(lane);
    for (auto& [k, last] : lastUse_[lane])
      if (k == key) {
        last = step;
        return;
      }
    lastUse_[lane].push_back({key, step});
  }

  // One entry per direction the lane uses (at most two per peer), not per step.
  size_t lastStep(size_t lane, size_t key) const {
    for (const auto& [k, last] : lastUse_[lane])
      if (k == key) return last;
    return 0;
  }

  // Whether `lane` is the first in issue order that still has steps on `key`.
  bool isHead(size_t lane, size_t key) const {
    for (size_t other : queues_[key]) {
      if (other == lane) return true;
      if (lanes_[other].step <= lastStep(other, key)) return false;
    }
    return false;
  }

  bool taken(size_t key) const { return std::find(used_.begin(), used_.end(), key) != used_.end(); }

  const AnyLane* lanes_;
  std::vector<std::vector<size_t>> queues_;  // per direction: the lanes that use it, in issue order
  std::vector<std::vector<std::pair<size_t, size_t>>> lastUse_;  // per lane: (direction, last step)
  std::vector<size_t> used_;                                     // directions used in this round
};

}  // namespace braid::exec
