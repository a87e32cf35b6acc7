#include "algorithms/catalog.h"

#include <algorithm>
#include <utility>

#include "algorithms/partition.h"
#include "algorithms/planners.h"

namespace braid::algo {
namespace {

constexpr std::pair<const char*, Collective> kCollectives[] = {
    {"allreduce", Collective::AllReduce},
    {"broadcast", Collective::Broadcast},
    {"reduce", Collective::Reduce},
    {"allgather", Collective::AllGather},
    {"reducescatter", Collective::ReduceScatter},
    {"send", Collective::Send},
    {"recv", Collective::Recv},
};

constexpr std::pair<const char*, Algorithm> kAlgorithms[] = {
    {"ring", Algorithm::Ring},
    {"oneshot", Algorithm::OneShot},
    {"recdoubling", Algorithm::RecursiveDoubling},
    {"rabenseifner", Algorithm::Rabenseifner},
    {"tree", Algorithm::Tree},
    {"chain", Algorithm::Chain},
    {"binomial", Algorithm::Binomial},
    {"scatter", Algorithm::ScatterAllGather},
    {"bruck", Algorithm::Bruck},
    {"rechalving", Algorithm::RecursiveHalving},
    {"direct", Algorithm::Direct},
    {"twoshot", Algorithm::TwoShot},
    {"hier", Algorithm::Hierarchical},
};

}  // namespace

const char* collectiveName(Collective collective) {
  for (const auto& [name, c] : kCollectives)
    if (c == collective) return name;
  return "invalid";
}

bool parseCollective(const std::string& name, Collective* collective) {
  for (const auto& [known, c] : kCollectives)
    if (name == known) {
      *collective = c;
      return true;
    }
  return false;
}

const char* algorithmName(Algorithm algorithm) {
  for (const auto& [name, a] : kAlgorithms)
    if (a == algorithm) return name;
  return "invalid";
}

bool parseAlgorithm(const std::string& name, Algorithm* algorithm) {
  for (const auto& [known, a] : kAlgorithms)
    if (name == known) {
      *algorithm = a;
      return true;
    }
  return false;
}

const std::vector<Algorithm>& algorithmsFor(Collective collective) {
  static const std::vector<Algorithm> kAllReduce = {
      Algorithm::Ring,    Algorithm::Tree,    Algorithm::Rabenseifner, Algorithm::RecursiveDoubling,
      Algorithm::OneShot, Algorithm::TwoShot, Algorithm::Hierarchical};
  static const std::vector<Algorithm> kBroadcast = {Algorithm::Chain, Algorithm::Binomial,
                                                    Algorithm::ScatterAllGather, Algorithm::OneShot,
                                                    Algorithm::Hierarchical};
  static const std::vector<Algorithm> kReduce = {Algorithm::Chain, Algorithm::Binomial};
  static const std::vector<Algorithm> kAllGather = {Algorithm::Ring, Algorithm::Bruck,
                                                    Algorithm::OneShot, Algorithm::Hierarchical};
  static const std::vector<Algorithm> kReduceScatter = {
      Algorithm::Ring, Algorithm::RecursiveHalving, Algorithm::Hierarchical};
  static const std::vector<Algorithm> kPointToPoint = {Algorithm::Direct};
  switch (collective) {
    case Collective::AllReduce:
      return kAllReduce;
    case Collective::Broadcast:
      return kBroadcast;
    case Collective::Reduce:
      return kReduce;
    case Collective::AllGather:
      return kAllGather;
    case Collective::ReduceScatter:
      return kReduceScatter;
    case Collective::Send:
    case Collective::Recv:
      break;
  }
  return kPointToPoint;
}

bool applies(Collective collective, Algorithm algorithm, const Shape& shape) {
  const auto& known = algorithmsFor(collective);
  if (std::find(known.begin(), known.end(), algorithm) == known.end()) return false;
  const bool direct = shape.mapped && shape.nranks <= kMaxDirectRanks;
  if (algorithm == Algorithm::TwoShot) return direct;
  if (algorithm == Algorithm::Hierarchical)
    return !shape.mapped && shape.localRanks >= 2 && shape.nranks % shape.localRanks == 0 &&
           shape.nranks / shape.localRanks >= 2;
  if (algorithm == Algorithm::OneShot && collective != Collective::AllReduce) return shape.mapped;
  if (algorithm == Algorithm::OneShot)
    return direct || shape.count * shape.elemSize <= kScratchBytes;
  if (algorithm == Algorithm::RecursiveHalving) return isPowerOfTwo(shape.nranks);
  return true;
}

size_t bufferBytes(Collective collective, const Shape& shape) {
  const bool gathered =
      collective == Collective::AllGather || collective == Collective::ReduceScatter;
  return shape.count * shape.elemSize * (gathered ? static_cast<size_t>(shape.nranks) : 1);
}

Plan makePlan(Collective collective, Algorithm algorithm, const Shape& shape) {
  switch (collective) {
    case Collective::AllReduce:
      switch (algorithm) {
        case Algorithm::OneShot:
          if (shape.mapped && shape.nranks <= kMaxDirectRanks) return oneShotMappedAllReduce(shape);
          return shape.nranks > 1 ? oneShotAllReduce(shape) : ringAllReduce(shape);
        case Algorithm::TwoShot:
          return twoShotAllReduce(shape);
        case Algorithm::RecursiveDoubling:
          return recursiveDoublingAllReduce(shape);
        case Algorithm::Rabenseifner:
          return rabenseifnerAllReduce(shape);
        case Algorithm::Tree:
          return treeAllReduce(shape);
        case Algorithm::Hierarchical:
          return hierarchicalAllReduce(shape);
        default:
          return ringAllReduce(shape);
      }
    case Collective::Broadcast:
      return algorithm == Algorithm::Binomial           ? binomialBroadcast(shape)
             : algorithm == Algorithm::ScatterAllGather ? scatterAllGatherBroadcast(shape)
             : algorithm == Algorithm::OneShot          ? oneShotBroadcast(shape)
             : algorithm == Algorithm::Hierarchical     ? hierarchicalBroadcast(shape)
                                                        : chainBroadcast(shape);
    case Collective::Reduce:
      return algorithm == Algorithm::Binomial ? binomialReduce(shape) : chainReduce(shape);
    case Collective::AllGather:
      return algorithm == Algorithm::Bruck          ? bruckAllGather(shape)
             : algorithm == Algorithm::OneShot      ? oneShotAllGather(shape)
             : algorithm == Algorithm::Hierarchical ? hierarchicalAllGather(shape)
                                                    : ringAllGather(shape);
    case Collective::ReduceScatter:
      return algorithm == Algorithm::RecursiveHalving ? recursiveHalvingReduceScatter(shape)
             : algorithm == Algorithm::Hierarchical   ? hierarchicalReduceScatter(shape)
                                                      : ringReduceScatter(shape);
    case Collective::Send:
      return sendTo(shape);
    case Collective::Recv:
      return recvFrom(shape);
  }
  return Plan{};
}

}  // namespace braid::algo
