#include "core/plan_cache.h"

namespace braid {

algo::Algorithm PlanCache::choose(Collective collective, const algo::Shape& shape) {
  algo::Algorithm algorithm;
  const size_t bytes = algo::bufferBytes(collective, shape);
  if (!timer_ || !haveModel_ || bytes == 0 || bytes > kTimedBytes || shape.mapped ||
      tuning::preferred(collective, shape, preference_, &algorithm))
    return tuning::choose(collective, shape, preference_, oneShotBytes_,
                          haveModel_ ? &model_ : nullptr);
  const uint64_t sizeClass = static_cast<uint64_t>(collective) << 48 |
                             static_cast<uint64_t>(shape.elemSize) << 8 |
                             static_cast<uint64_t>(63 - __builtin_clzll(bytes));
  auto found = timed_.find(sizeClass);
  if (found != timed_.end() && algo::applies(collective, found->second, shape))
    return found->second;
  std::vector<double> predicted;
  const std::vector<algo::Algorithm> contenders =
      tuning::contenders(collective, shape, model_, kContenderFactor, &predicted);
  double trials = 0;
  for (double seconds : predicted) trials += seconds * kTrialCalls;
  // On a slow link the trials would cost more than any choice could save
  // (seconds per call): the model decides, as where it sees one contender.
  if (contenders.size() < 2 || trials > kTrialSeconds)
    return tuning::choose(collective, shape, preference_, oneShotBytes_, &model_);
  algorithm = timer_(collective, shape, contenders);
  timed_[sizeClass] = algorithm;
  return algorithm;
}

const std::shared_ptr<const algo::Plan>& PlanCache::get(Collective collective,
                                                        const algo::Shape& shape) {
  const Key key{collective,       shape.root,       shape.peer,     shape.count,
                shape.chunkElems, shape.alignElems, shape.elemSize, shape.mapped};
  // A loop that repeats one op costs a comparison.
  if (last_ && key == lastKey_) return last_;
  auto found = plans_.find(key);
  if (found == plans_.end()) {
    // Only a new shape is planned (and, with a model, simulated).
    if (plans_.size() >= kMaxEntries) plans_.clear();
    const algo::Algorithm algorithm = choose(collective, shape);
    found = plans_
                .emplace(key, Entry{algorithm, std::make_shared<const algo::Plan>(
                                                   algo::makePlan(collective, algorithm, shape))})
                .first;
  }
  lastKey_ = key;
  lastAlgorithm_ = found->second.algorithm;
  return last_ = found->second.plan;
}

}  // namespace braid
