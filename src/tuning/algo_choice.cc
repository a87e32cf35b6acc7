#include "tuning/algo_choice.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "braid/error.h"
#include "core/errors.h"

namespace braid::tuning {
namespace {

using algo::Algorithm;
using algo::Collective;

constexpr Collective kCollectives[] = {Collective::AllReduce, Collective::Broadcast,
                                       Collective::Reduce, Collective::AllGather,
                                       Collective::ReduceScatter};

[[noreturn]] void reject(const std::string& why) {
  throw Error(ErrorCode::InvalidArgument, "braid: BRAID_ALGO: " + why);
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

bool has(Collective collective, Algorithm algorithm) {
  const auto& known = algo::algorithmsFor(collective);
  return std::find(known.begin(), known.end(), algorithm) != known.end();
}

// The collectives BRAID_ALGO names: "allreduce, broadcast, ...".
std::string collectiveNames() {
  std::string names;
  for (Collective c : kCollectives)
    names += (names.empty() ? "" : ", ") + std::string(algo::collectiveName(c));
  return names;
}

// Their algorithms, from the catalog: "allreduce: ring, tree, ...; broadcast: chain, ...".
std::string algorithmsByCollective() {
  std::string text;
  for (Collective c : kCollectives)
    text += (text.empty() ? "" : "; ") + std::string(algo::collectiveName(c)) + ": " +
            algo::algorithmNames(c);
  return text;
}

}  // namespace

std::string fromNcclAlgo(const std::string& text) {
  // NCCL's algorithms in its order, and what each means here per collective.
  struct Meaning {
    const char* nccl;
    std::vector<std::pair<const char*, const char*>> braid;  // (collective, algorithm)
  };
  static const Meaning kMeanings[] = {
      {"tree", {{"allreduce", "tree"}}},
      {"ring",
       {{"allreduce", "ring"},
        {"broadcast", "chain"},
        {"reduce", "chain"},
        {"allgather", "ring"},
        {"reducescatter", "ring"}}},
      {"collnetdirect", {}},
      {"collnetchain", {}},
      {"nvls", {}},
      {"nvlstree", {}},
      {"pat", {{"allgather", "bruck"}, {"reducescatter", "rechalving"}}},
  };
  constexpr size_t kCount = sizeof(kMeanings) / sizeof(kMeanings[0]);
  auto trim = [](std::string s) {
    s.erase(0, s.find_first_not_of(" \t"));
    s.erase(s.find_last_not_of(" \t") + 1);
    return s;
  };
  std::string out;
  std::stringstream clauses(lower(text));
  std::string clause;
  while (std::getline(clauses, clause, ';')) {
    clause = trim(clause);
    if (clause.empty()) continue;
    std::string only;  // the collective the clause is for; empty: every one
    if (const size_t colon = clause.find(':'); colon != std::string::npos) {
      only = trim(clause.substr(0, colon));
      clause = trim(clause.substr(colon + 1));
      Collective collective;
      if (!algo::parseCollective(only, &collective))
        throw Error(ErrorCode::InvalidArgument,
                    format("braid: NCCL_ALGO: unknown collective '%s'", only.c_str()));
    }
    const bool excluding = !clause.empty() && clause[0] == '^';
    if (excluding) clause.erase(0, 1);
    std::array<bool, kCount> listed{};
    std::stringstream names(clause);
    std::string name;
    while (std::getline(names, name, ',')) {
      name = trim(name);
      if (name.empty()) continue;
      size_t i = 0;
      while (i < kCount && name != kMeanings[i].nccl) ++i;
      if (i == kCount)
        throw Error(ErrorCode::InvalidArgument,
                    format("braid: NCCL_ALGO: unknown algorithm '%s' (NCCL's are Ring, Tree, "
                           "CollnetDirect, CollnetChain, NVLS, NVLSTree and PAT)",
                           name.c_str()));
      listed[i] = true;
    }
    for (size_t i = 0; i < kCount; ++i) {
      if (listed[i] == excluding) continue;
      for (const auto& [collective, algorithm] : kMeanings[i].braid) {
        if (!only.empty() && only != collective) continue;
        if (!out.empty()) out += ',';
        out += std::string(collective) + ":" + algorithm;
      }
    }
  }
  return out;
}

AlgoPreference AlgoPreference::parse(const std::string& text) {
  AlgoPreference preference;
  std::array<bool, 7> prefixed{};
  std::vector<Algorithm> general;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    item = lower(item);
    const size_t colon = item.find(':');
    Algorithm algorithm;
    const std::string name = colon == std::string::npos ? item : item.substr(colon + 1);
    if (!algo::parseAlgorithm(name, &algorithm))
      reject(
          format("'%s' is not an algorithm (%s)", name.c_str(), algorithmsByCollective().c_str()));
    if (colon == std::string::npos) {
      bool any = false;
      for (Collective c : kCollectives) any |= has(c, algorithm);
      if (!any) reject(format("no collective has the algorithm '%s'", name.c_str()));
      general.push_back(algorithm);
      continue;
    }
    Collective collective;
    const std::string which = item.substr(0, colon);
    if (!algo::parseCollective(which, &collective) || collective == Collective::Send ||
        collective == Collective::Recv)
      reject(format("'%s' is not a collective (%s)", which.c_str(), collectiveNames().c_str()));
    if (!has(collective, algorithm))
      reject(format("%s has no algorithm '%s' (it has %s)", which.c_str(), name.c_str(),
                    algo::algorithmNames(collective).c_str()));
    auto& list = preference.allowed_[static_cast<size_t>(collective)];
    prefixed[static_cast<size_t>(collective)] = true;
    if (std::find(list.begin(), list.end(), algorithm) == list.end()) list.push_back(algorithm);
  }
  for (Collective c : kCollectives) {
    auto& list = preference.allowed_[static_cast<size_t>(c)];
    if (prefixed[static_cast<size_t>(c)]) continue;
    for (Algorithm a : general)
      if (has(c, a) && std::find(list.begin(), list.end(), a) == list.end()) list.push_back(a);
  }
  return preference;
}

std::string AlgoPreference::describe() const {
  std::string text;
  for (Collective c : kCollectives) {
    const auto& list = allowed(c);
    if (list.empty()) continue;
    text += (text.empty() ? "" : " ") + std::string(algo::collectiveName(c)) + ":";
    for (size_t i = 0; i < list.size(); ++i)
      text += (i ? "," : "") + std::string(algo::algorithmName(list[i]));
  }
  return text;
}

bool preferred(Collective collective, const algo::Shape& shape, const AlgoPreference& preference,
               Algorithm* algorithm) {
  for (Algorithm a : preference.allowed(collective))
    if (algo::applies(collective, a, shape)) {
      *algorithm = a;
      return true;
    }
  return false;
}

std::vector<Algorithm> contenders(Collective collective, const algo::Shape& shape,
                                  const algo::LinkModel& model, double factor,
                                  std::vector<double>* seconds) {
  if (seconds) seconds->clear();
  if (shape.nranks <= 1 || shape.nranks > kModelRanks || collective == Collective::Send ||
      collective == Collective::Recv)
    return {};
  algo::SimOptions options;
  options.link = model;
  options.checkData = false;
  options.elemSize = shape.elemSize;
  options.chunkBytes = shape.chunkElems * shape.elemSize;
  options.alignBytes = shape.alignElems * shape.elemSize;
  options.mapped = shape.mapped;
  options.localRanks = shape.localRanks;
  std::vector<std::pair<double, Algorithm>> predicted;
  for (Algorithm a : algo::algorithmsFor(collective)) {
    if (!algo::applies(collective, a, shape)) continue;
    const algo::SimResult result =
        algo::simulate(collective, a, shape.nranks, shape.count, shape.root, options);
    if (result.problem.empty()) predicted.emplace_back(result.seconds, a);
  }
  // Stable: algorithms predicted alike keep the catalog's order.
  std::stable_sort(predicted.begin(), predicted.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<Algorithm> out;
  for (const auto& [time, a] : predicted)
    if (time <= predicted.front().first * factor) {
      out.push_back(a);
      if (seconds) seconds->push_back(time);
    }
  return out;
}

Algorithm choose(Collective collective, const algo::Shape& shape, const AlgoPreference& preference,
                 size_t oneShotBytes, const algo::LinkModel* model) {
  Algorithm algorithm;
  if (preferred(collective, shape, preference, &algorithm)) return algorithm;
  if (shape.mapped && shape.nranks > 1) {
    if (collective == Collective::AllReduce && algo::applies(collective, Algorithm::TwoShot, shape))
      return shape.count * shape.elemSize <= kMappedOneShotBytes ? Algorithm::OneShot
                                                                 : Algorithm::TwoShot;
    if (collective == Collective::AllGather || collective == Collective::Broadcast)
      return Algorithm::OneShot;
  }
  if (model) {
    // Predictions within 0.1% of each other are a tie: the catalog's order
    // decides, so rounding never flips a choice.
    const std::vector<Algorithm> fastest = contenders(collective, shape, *model, 1.001);
    const auto& order = algo::algorithmsFor(collective);
    auto position = [&](Algorithm a) { return std::find(order.begin(), order.end(), a); };
    if (!fastest.empty())
      return *std::min_element(fastest.begin(), fastest.end(),
                               [&](Algorithm x, Algorithm y) { return position(x) < position(y); });
  }
  const bool acrossHosts = algo::applies(collective, Algorithm::Hierarchical, shape);
  switch (collective) {
    case Collective::AllReduce:
      if (shape.nranks > 1 && shape.count * shape.elemSize <= oneShotBytes &&
          algo::applies(collective, Algorithm::OneShot, shape))
        return Algorithm::OneShot;
      return acrossHosts ? Algorithm::Hierarchical : Algorithm::Ring;
    case Collective::Broadcast:
      return acrossHosts ? Algorithm::Hierarchical : Algorithm::Chain;
    case Collective::Reduce:
      return Algorithm::Chain;
    case Collective::AllGather:
    case Collective::ReduceScatter:
      return acrossHosts ? Algorithm::Hierarchical : Algorithm::Ring;
    case Collective::Send:
    case Collective::Recv:
      break;
  }
  return Algorithm::Direct;
}

}  // namespace braid::tuning
