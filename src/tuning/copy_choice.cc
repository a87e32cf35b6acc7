#include "tuning/copy_choice.h"

namespace braid::tuning {

const char* copyPathName(CopyPath path) {
  switch (path) {
    case CopyPath::Slots:
      return "through slots";
    case CopyPath::StreamedSlots:
      return "through slots with streaming stores";
    case CopyPath::Address:
      return "by address";
  }
  return "?";
}

CopyChoice::CopyChoice(bool addresses, size_t addressFrom)
    : addresses_(addresses), addressFrom_(addresses ? addressFrom : 0) {
  for (auto& kind : classes_)
    for (size_t c = 0; c < kind.size(); ++c) kind[c].path = firstGuess(size_t{1} << c);
}

CopyPath CopyChoice::firstGuess(size_t bytes) const {
  return addressFrom_ != 0 && sizeClass(bytes) >= sizeClass(addressFrom_) ? CopyPath::Address
                                                                          : CopyPath::Slots;
}

size_t CopyChoice::sizeClass(size_t bytes) {
  size_t c = 0;
  while (bytes >>= 1) ++c;
  return c;
}

CopyPath CopyChoice::chosen(unsigned kind, size_t bytes) const {
  return bytes >= kSmallestOp ? classes_[kind % kKinds][sizeClass(bytes)].path : CopyPath::Slots;
}

CopyPath CopyChoice::trialPath(CopyPath path, uint64_t trial) const {
  CopyPath others[kCopyPaths - 1];
  size_t count = 0;
  for (size_t p = 0; p < kCopyPaths; ++p)
    if (static_cast<CopyPath>(p) != path &&
        (addresses_ || static_cast<CopyPath>(p) != CopyPath::Address))
      others[count++] = static_cast<CopyPath>(p);
  return others[trial % count];
}

CopyPath CopyChoice::next(unsigned kind, size_t bytes) {
  if (bytes < kSmallestOp) return CopyPath::Slots;
  Class& c = classOf(kind, bytes);
  const uint64_t op = c.ops++;
  // Trials: the third and fourth ops (each path but the first guess once,
  // where there are two), then every kTrialPeriod-th.
  if (op == kFirstTrial || op == kFirstTrial + 1)
    return trialPath(firstGuess(bytes), op - kFirstTrial);
  if (op > kFirstTrial && (op - kFirstTrial) % kTrialPeriod == 0)
    return trialPath(c.path, (op - kFirstTrial) / kTrialPeriod + 1);
  return c.path;
}

bool CopyChoice::record(unsigned kind, size_t bytes, CopyPath path, double seconds) {
  if (bytes < kSmallestOp || !(seconds > 0)) return false;
  Class& c = classOf(kind, bytes);
  if (c.ops <= 1) return false;  // the class's first op: cold caches, tuner trials
  const double sample = seconds / static_cast<double>(bytes);
  double& mine = c.secondsPerByte[static_cast<size_t>(path)];
  // The path in use moves its average a quarter of the way; a trial of
  // another is that path's only news, so it replaces what was known.
  mine = mine == 0 || path != c.path ? sample : (3 * mine + sample) / 4;
  const double current = c.secondsPerByte[static_cast<size_t>(c.path)];
  if (current == 0) return false;
  CopyPath best = c.path;
  for (size_t p = 0; p < kCopyPaths; ++p) {
    const double known = c.secondsPerByte[p];
    if (known != 0 && known < kSwitchRatio * current &&
        known < c.secondsPerByte[static_cast<size_t>(best)])
      best = static_cast<CopyPath>(p);
  }
  if (best == c.path) return false;
  c.path = best;
  return true;
}

}  // namespace braid::tuning
