// Plans cached by shape, so the latency path does no planning and no
// allocation after the first call of a given shape.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>

#include "algorithms/catalog.h"
#include "tuning/algo_choice.h"

namespace braid {

using Collective = algo::Collective;

class PlanCache {
 public:
  // The plan for `collective` at `shape`, made on first use. Plans are
  // immutable and shared: an op that runs later (in a group, or async)
  // keeps a copy of the pointer, as the cache may evict the plan meanwhile.
  // The reference stays valid until the next get().
  const std::shared_ptr<const algo::Plan>& get(Collective collective, const algo::Shape& shape);

  // Notes a plan made for one call outside the cache's choice (a call's
  // own algorithm selection): its algorithm is the last one handed out
  // (lastAlgorithm()), and the next get() looks its plan up again. Returns
  // the plan, shared.
  std::shared_ptr<const algo::Plan> remember(algo::Algorithm algorithm, algo::Plan plan) {
    lastAlgorithm_ = algorithm;
    last_.reset();
    return std::make_shared<const algo::Plan>(std::move(plan));
  }

  // The plan the last get() returned, and its algorithm.
  const std::shared_ptr<const algo::Plan>& last() const { return last_; }
  algo::Algorithm lastAlgorithm() const { return lastAlgorithm_; }

  // Algorithms as tuning::choose() picks them with these settings.
  PlanCache(size_t oneShotBytes, tuning::AlgoPreference preference)
      : oneShotBytes_(oneShotBytes), preference_(std::move(preference)) {}

  // The link model the choice uses; null for the fixed rules.
  const algo::LinkModel* model() const { return haveModel_ ? &model_ : nullptr; }

  // Times `contenders` (at least two) for a call of this shape and returns
  // the fastest; every rank must return the same one.
  using Timer = std::function<algo::Algorithm(Collective, const algo::Shape&,
                                              const std::vector<algo::Algorithm>&)>;
  // From now on, where the model finds several algorithms within
  // kContenderFactor of the fastest prediction for a call of at most
  // kTimedBytes (and whose trials the model predicts to take at most
  // kTrialSeconds), let `timer` pick among them (BRAID_TUNING=measured). Once
  // per collective, element size and power-of-two size class: the pick
  // holds for every size of the class. REQUIRES: a model.
  void timeWith(Timer timer) { timer_ = std::move(timer); }
  // How many size classes the timer has picked for (for tests).
  size_t timedClasses() const { return timed_.size(); }
  static constexpr size_t kTimedBytes = size_t{4} << 20;
  static constexpr double kContenderFactor = 2.0;
  // The timer runs each contender at least kTrialCalls times (see
  // Impl::timeContenders); where the model predicts that all of them
  // together take more than kTrialSeconds, the model's choice stands.
  static constexpr int kTrialCalls = 16;
  static constexpr double kTrialSeconds = 1.0;

  // From now on, choose by this link model (BRAID_TUNING=measured, model).
  void useModel(const algo::LinkModel& model) {
    model_ = model;
    haveModel_ = true;
    plans_.clear();
    timed_.clear();
    last_.reset();
  }

 private:
  struct Key {
    Collective collective;
    int root;
    int peer;
    size_t count;
    size_t chunkElems;
    size_t alignElems;
    size_t elemSize;
    bool mapped;
    // Without branches: a repeated op compares every field anyway.
    bool operator==(const Key& other) const {
      return ((static_cast<uint64_t>(collective) ^ static_cast<uint64_t>(other.collective)) |
              static_cast<uint32_t>(root ^ other.root) | static_cast<uint32_t>(peer ^ other.peer) |
              (count ^ other.count) | (chunkElems ^ other.chunkElems) |
              (alignElems ^ other.alignElems) | (elemSize ^ other.elemSize) |
              static_cast<uint64_t>(mapped != other.mapped)) == 0;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      uint64_t h = static_cast<uint64_t>(k.collective) * 0x9E3779B97F4A7C15ull;
      for (uint64_t v : {static_cast<uint64_t>(k.root), static_cast<uint64_t>(k.peer),
                         static_cast<uint64_t>(k.count), static_cast<uint64_t>(k.chunkElems),
                         static_cast<uint64_t>(k.alignElems), static_cast<uint64_t>(k.elemSize),
                         static_cast<uint64_t>(k.mapped)})
        h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
      return static_cast<size_t>(h ^ (h >> 31));
    }
  };
  static constexpr size_t kMaxEntries = 512;
  algo::Algorithm choose(Collective collective, const algo::Shape& shape);
  Timer timer_;
  // Timed picks by (collective, element size, floor(log2(bytes))).
  std::unordered_map<uint64_t, algo::Algorithm> timed_;
  size_t oneShotBytes_;
  tuning::AlgoPreference preference_;
  algo::LinkModel model_;
  bool haveModel_ = false;
  // The algorithm is a function of the key (with these settings), so it is
  // chosen once per key, like the plan.
  struct Entry {
    algo::Algorithm algorithm;
    std::shared_ptr<const algo::Plan> plan;
  };
  std::unordered_map<Key, Entry, KeyHash> plans_;
  // The last plan handed out: loops that repeat one op skip the hash map.
  Key lastKey_{};
  algo::Algorithm lastAlgorithm_ = algo::Algorithm::Ring;
  std::shared_ptr<const algo::Plan> last_;
};

}  // namespace braid
