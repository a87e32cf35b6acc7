#include "core/plan_cache.h"

namespace braid {

const std::shared_ptr<const algo::Plan>& PlanCache::get(Collective collective,
                                                        const algo::Shape& shape) {
  const Key key{collective,       shape.root,       shape.peer,    shape.count,
                shape.chunkElems, shape.alignElems, shape.elemSize};
  // A loop that repeats one op costs a comparison.
  if (last_ && key == lastKey_) return last_;
  auto found = plans_.find(key);
  if (found == plans_.end()) {
    // Only a new shape is planned (and, with a model, simulated).
    if (plans_.size() >= kMaxEntries) plans_.clear();
    const algo::Algorithm algorithm = tuning::choose(collective, shape, preference_, oneShotBytes_,
                                                     haveModel_ ? &model_ : nullptr);
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
