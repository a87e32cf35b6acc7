// Which algorithm runs a call: BRAID_ALGO's preference, else the default
// choice by size.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "algorithms/catalog.h"
#include "algorithms/simulate.h"

namespace braid::tuning {

// BRAID_ALGO, parsed. The text is a comma-separated list of algorithm
// names, each optionally prefixed by a collective ("allreduce:tree"). For a
// collective named in some prefix, its prefixed entries are its allowed
// algorithms; for any other, the unprefixed entries that it has. An empty
// list leaves the choice to braid.
class AlgoPreference {
 public:
  AlgoPreference() = default;
  // Throws Error(InvalidArgument) naming BRAID_ALGO for an unknown name, an
  // algorithm the named collective does not have, or an unprefixed name no
  // collective has.
  static AlgoPreference parse(const std::string& text);

  const std::vector<algo::Algorithm>& allowed(algo::Collective collective) const {
    return allowed_[static_cast<size_t>(collective)];
  }
  // A canonical text, e.g. "allreduce:tree,ring broadcast:binomial" ("" when empty).
  std::string describe() const;

 private:
  std::array<std::vector<algo::Algorithm>, 7> allowed_;
};

// NCCL_ALGO's text as a BRAID_ALGO list: "Ring,Tree", "^Tree" (all but
// those), or per collective "allreduce:tree,ring;broadcast:ring"; names are
// not case-sensitive. Each NCCL algorithm stands for braid's nearest on a
// host: Ring for ring all-reduce / all-gather / reduce-scatter and chain
// broadcast / reduce, Tree for the double binary tree all-reduce, PAT for
// Bruck all-gather and recursive-halving reduce-scatter; CollnetDirect,
// CollnetChain, NVLS and NVLSTree need hardware a host lacks and add
// nothing (a collective left with no algorithm is braid's to choose).
// Throws Error(InvalidArgument) naming NCCL_ALGO for an unknown name.
std::string fromNcclAlgo(const std::string& text);

// Mapped all-reduces up to this size run one-shot, larger ones two-shot.
inline constexpr size_t kMappedOneShotBytes = size_t{256} << 10;

// The algorithm for one call: the first allowed one that applies at this
// shape; else, on mapped buffers (Shape::mapped, at most kMaxDirectRanks
// ranks), the direct algorithms: one-shot all-reduce up to
// kMappedOneShotBytes and two-shot above, one-shot all-gather and
// broadcast; else, with a `model`, the one the simulator predicts fastest over
// links of that model (up to kModelRanks ranks); else braid's fixed choice
// (one-shot for all-reduces of at most `oneShotBytes` on more than one rank;
// for ranks numbered host by host over several hosts the hierarchical
// algorithms for the other all-reduces, all-gathers, reduce-scatters and
// broadcasts; else ring for those, and chain for broadcast and reduce). Depends on nothing but its
// arguments, so ranks that agree on them agree on the algorithm.
algo::Algorithm choose(algo::Collective collective, const algo::Shape& shape,
                       const AlgoPreference& preference, size_t oneShotBytes,
                       const algo::LinkModel* model = nullptr);

// Whether `preference` decides this call; if so, *algorithm is its pick.
bool preferred(algo::Collective collective, const algo::Shape& shape,
               const AlgoPreference& preference, algo::Algorithm* algorithm);

// The algorithms worth timing for one call: those that apply, predicted
// over `model` to take at most `factor` times the fastest one's time,
// fastest first (ties in the catalog's order). Empty for a single rank, for
// more than kModelRanks ranks and for point-to-point.
// With `seconds`, also each one's predicted time, in the same order.
std::vector<algo::Algorithm> contenders(algo::Collective collective, const algo::Shape& shape,
                                        const algo::LinkModel& model, double factor,
                                        std::vector<double>* seconds = nullptr);

// The most ranks the model choice simulates; larger communicators use the
// fixed choice (simulating them would make a first call slow).
inline constexpr int kModelRanks = 256;

}  // namespace braid::tuning
