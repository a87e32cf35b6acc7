// Send and receive: one step each of S bytes, streamed in slot-sized pieces.
#include "algorithms/planners.h"
#include "algorithms/steps.h"

namespace braid::algo {

Plan sendTo(const Shape& shape) {
  Plan plan;
  Step step;
  step.kind = StepKind::Send;
  step.sendPeer = shape.peer;
  step.count = shape.count;
  addStep(plan, step);
  return plan;
}

Plan recvFrom(const Shape& shape) {
  Plan plan;
  Step step;
  step.kind = StepKind::Recv;
  step.recvPeer = shape.peer;
  step.dst = Buffer::Output;
  step.count = shape.count;
  addStep(plan, step);
  return plan;
}

}  // namespace braid::algo
