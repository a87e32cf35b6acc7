#include "tuning/address_choice.h"

namespace braid::tuning {

AddressChoice::AddressChoice(size_t from) : from_(from) {
  for (auto& kind : classes_)
    for (size_t c = 0; c < kind.size(); ++c) kind[c].byAddress = from != 0 && c >= sizeClass(from);
}

size_t AddressChoice::sizeClass(size_t bytes) {
  size_t c = 0;
  while (bytes >>= 1) ++c;
  return c;
}

bool AddressChoice::chosen(unsigned kind, size_t bytes) const {
  return bytes >= kSmallestOp && classes_[kind % kKinds][sizeClass(bytes)].byAddress;
}

bool AddressChoice::next(unsigned kind, size_t bytes) {
  if (bytes < kSmallestOp) return false;
  Class& c = classOf(kind, bytes);
  const uint64_t op = c.ops++;
  const bool trial = op >= kFirstTrial && (op - kFirstTrial) % kTrialPeriod == 0;
  return trial ? !c.byAddress : c.byAddress;
}

bool AddressChoice::record(unsigned kind, size_t bytes, bool byAddress, double seconds) {
  if (bytes < kSmallestOp || !(seconds > 0)) return false;
  Class& c = classOf(kind, bytes);
  if (c.ops <= 1) return false;  // the class's first op: cold caches, tuner trials
  const double sample = seconds / static_cast<double>(bytes);
  double& mine = c.secondsPerByte[byAddress];
  // The path in use moves its average a quarter of the way; a trial of the
  // other is that path's only news, so it replaces what was known.
  mine = mine == 0 || byAddress != c.byAddress ? sample : (3 * mine + sample) / 4;
  const double other = c.secondsPerByte[!c.byAddress];
  if (other == 0 || c.secondsPerByte[c.byAddress] == 0 ||
      other >= kSwitchRatio * c.secondsPerByte[c.byAddress])
    return false;
  c.byAddress = !c.byAddress;
  return true;
}

}  // namespace braid::tuning
