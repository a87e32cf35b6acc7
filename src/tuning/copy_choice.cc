#include "tuning/copy_choice.h"

#include <algorithm>
#include <iterator>

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
  return addressFrom_ != 0 && bytes >= kSmallestAddressOp &&
                 sizeClass(bytes) >= sizeClass(addressFrom_)
             ? CopyPath::Address
             : CopyPath::Slots;
}

CopyPath CopyChoice::chosen(unsigned kind, size_t bytes) const {
  return bytes >= kSmallestOp ? classes_[kind % kKinds][sizeClass(bytes)].path : CopyPath::Slots;
}

CopyPath CopyChoice::trialPath(CopyPath path, uint64_t trial, size_t bytes) const {
  const bool addresses = addresses_ && bytes >= kSmallestAddressOp;
  CopyPath others[kCopyPaths - 1];
  size_t count = 0;
  for (size_t p = 0; p < kCopyPaths; ++p)
    if (static_cast<CopyPath>(p) != path &&
        (addresses || static_cast<CopyPath>(p) != CopyPath::Address))
      others[count++] = static_cast<CopyPath>(p);
  return others[trial % count];
}

CopyPath CopyChoice::next(unsigned kind, size_t bytes) {
  if (bytes < kSmallestOp) return CopyPath::Slots;
  Class& c = classOf(kind, bytes);
  const uint64_t op = c.ops++;
  c.timed = op > 0;  // (the class's first op: cold caches)
  if (op < kFirstTrial) return c.path;
  // Rounds of trialPeriod() ops from kFirstTrial. A round starts with its
  // trials, two ops each, of which only the second is timed: an op leaves
  // the caches (the lines it lent or streamed) as its path does, and the
  // next op pays for that. The first round has two trials from
  // kSmallestAddressOp (each path but the first guess; a rank without
  // addresses streams twice) and one below, the later rounds one other path
  // each, in turn. How many depends on the size alone: every rank has its
  // trials in the same ops. The op that comes back to the class's path is
  // not timed either, and below kSparseBelow only one op in kSampleEvery
  // after it is.
  const uint64_t period = trialPeriod(bytes);
  const uint64_t round = (op - kFirstTrial) / period;
  const uint64_t into = (op - kFirstTrial) % period;
  const uint64_t trials = round == 0 && bytes >= kSmallestAddressOp ? 2 : 1;
  if (into < 2 * trials) {
    c.timed = into % 2 == 1;
    return round == 0 ? trialPath(firstGuess(bytes), into / 2, bytes)
                      : trialPath(c.path, round + 1, bytes);
  }
  c.timed =
      into > 2 * trials && (bytes >= kSparseBelow || (into - 2 * trials - 1) % kSampleEvery == 0);
  return c.path;
}

bool CopyChoice::record(unsigned kind, size_t bytes, CopyPath path, double seconds) {
  if (bytes < kSmallestOp || !(seconds > 0)) return false;
  Class& c = classOf(kind, bytes);
  if (!c.timed) return false;
  c.timed = false;  // (one time per op counted)
  const double sample = seconds / static_cast<double>(bytes);
  double& mine = c.secondsPerByte[static_cast<size_t>(path)];
  if (path != c.path) {
    mine = sample;  // a trial: the path's only news
  } else {
    if (mine == 0) std::fill(std::begin(c.recent), std::end(c.recent), sample);
    c.newest = static_cast<uint8_t>((c.newest + 1) % 3);
    c.recent[c.newest] = sample;
    const double a = c.recent[0], b = c.recent[1], d = c.recent[2];
    mine = std::max(std::min(a, b), std::min(std::max(a, b), d));  // their median
  }
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
  std::fill(std::begin(c.recent), std::end(c.recent), c.secondsPerByte[static_cast<size_t>(best)]);
  return true;
}

}  // namespace braid::tuning
