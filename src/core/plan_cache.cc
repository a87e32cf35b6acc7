#include "core/plan_cache.h"

namespace braid {

const std::shared_ptr<const algo::Plan>& PlanCache::get(Collective collective,
                                                        const algo::Shape& shape) {
  // The last plan's key is checked before any choice is made: a loop that
  // repeats one op costs a comparison.
  if (last_ && collective == lastKey_.collective && shape.root == lastKey_.root &&
      shape.peer == lastKey_.peer && shape.count == lastKey_.count &&
      shape.chunkElems == lastKey_.chunkElems && shape.alignElems == lastKey_.alignElems &&
      shape.elemSize == lastKey_.elemSize)
    return last_;
  const algo::Algorithm algorithm =
      tuning::choose(collective, shape, preference_, oneShotBytes_, haveModel_ ? &model_ : nullptr);
  Key key{collective,  algorithm,        shape.root,       shape.peer,
          shape.count, shape.chunkElems, shape.alignElems, shape.elemSize};
  auto found = plans_.find(key);
  if (found != plans_.end()) {
    lastKey_ = key;
    return last_ = found->second;
  }
  if (plans_.size() >= kMaxEntries) plans_.clear();
  auto shared = std::make_shared<const algo::Plan>(algo::makePlan(collective, algorithm, shape));
  plans_.emplace(key, shared);
  lastKey_ = key;
  return last_ = shared;
}

}  // namespace braid
