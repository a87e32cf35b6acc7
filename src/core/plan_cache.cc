#include "core/plan_cache.h"

namespace braid {

const std::shared_ptr<const algo::Plan>& PlanCache::get(Collective collective,
                                                        const algo::Shape& shape) {
  Key key{collective,       shape.root,       shape.peer,    shape.count,
          shape.chunkElems, shape.alignElems, shape.elemSize};
  if (last_ && key == lastKey_) return last_;
  auto found = plans_.find(key);
  if (found != plans_.end()) {
    lastKey_ = key;
    return last_ = found->second;
  }
  algo::Plan plan;
  switch (collective) {
    case Collective::AllReduce:
      plan = shape.nranks > 1 && shape.count * shape.elemSize <= oneShotBytes_
                 ? algo::oneShotAllReduce(shape)
                 : algo::ringAllReduce(shape);
      break;
    case Collective::Broadcast:
      plan = algo::chainBroadcast(shape);
      break;
    case Collective::Reduce:
      plan = algo::chainReduce(shape);
      break;
    case Collective::AllGather:
      plan = algo::ringAllGather(shape);
      break;
    case Collective::ReduceScatter:
      plan = algo::ringReduceScatter(shape);
      break;
    case Collective::Send:
      plan = algo::sendTo(shape);
      break;
    case Collective::Recv:
      plan = algo::recvFrom(shape);
      break;
  }
  if (plans_.size() >= kMaxEntries) plans_.clear();
  auto shared = std::make_shared<const algo::Plan>(std::move(plan));
  plans_.emplace(key, shared);
  lastKey_ = key;
  return last_ = shared;
}

}  // namespace braid
