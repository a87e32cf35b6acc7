#include "chaos/trial.h"

#include <algorithm>
#include <random>
#include <stdexcept>

namespace braid::chaos {
namespace {

const char* const kTransportNames[kNumTransports] = {"shm",     "tcp",    "tcp4",  "ucx",
                                                     "ibverbs", "device", "staged"};
const char* const kFaultNames[kNumFaults] = {"none",     "kill",      "stop",    "abort",
                                             "linkdown", "partition", "torndown"};
const Fault kOneHostFaults[] = {Fault::None, Fault::Kill, Fault::Stop, Fault::Abort};

constexpr DataType kTypes[] = {DataType::Float32, DataType::Float64,    DataType::Int32,
                               DataType::Int64,   DataType::BFloat16,   DataType::Float16,
                               DataType::Int8,    DataType::Uint8,      DataType::Uint32,
                               DataType::Uint64,  DataType::Float8E4M3, DataType::Float8E5M2};
constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min,
                             ReduceOp::Avg};
constexpr size_t kMaxCount = 256 * 1024;

// Every draw takes exactly one value of the generator, whatever `n` is, so
// that restricting a choice (a list of one) leaves every later draw as it
// was: a trial replays with its transport and fault named on the command
// line. (The modulo's bias is far below anything a trial could notice.)
class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}
  uint64_t below(uint64_t n) { return rng_() % n; }
  uint64_t any() { return rng_(); }

 private:
  std::mt19937_64 rng_;
};

// Element counts skewed toward small: a few empty ops, most under 4 Ki,
// some up to 256 Ki.
size_t drawCount(Draw& draw) {
  const uint64_t bucket = draw.below(100), within = draw.any();
  if (bucket < 5) return 0;
  if (bucket < 50) return 1 + within % 64;
  if (bucket < 80) return 65 + within % (4096 - 64);
  if (bucket < 95) return 4097 + within % (65536 - 4096);
  return 65537 + within % (kMaxCount - 65536);
}

Op drawCollective(Draw& draw, OpKind kind, int nranks) {
  Op op;
  op.kind = kind;
  op.type = kTypes[draw.below(std::size(kTypes))];
  op.op = kOps[draw.below(std::size(kOps))];
  op.count = drawCount(draw);
  op.root = static_cast<int>(draw.below(nranks));
  op.inPlace = draw.below(2) == 0;
  op.from = static_cast<int>(draw.below(nranks));
  op.to = (op.from + 1 + static_cast<int>(draw.below(nranks - 1))) % nranks;
  op.seed = draw.any();
  op.async = draw.below(4) == 0;
  return op;
}

// A collective or a send/recv, each as likely as the five collectives
// together; groups hold two to four of them.
OpKind drawSingleKind(Draw& draw) {
  const uint64_t k = draw.below(100);
  if (k < 14) return OpKind::AllReduce;
  if (k < 24) return OpKind::Broadcast;
  if (k < 34) return OpKind::Reduce;
  if (k < 44) return OpKind::AllGather;
  if (k < 54) return OpKind::ReduceScatter;
  return OpKind::SendRecv;
}

Op drawOp(Draw& draw, int nranks) {
  const bool group = draw.below(5) == 0;
  Op op = drawCollective(draw, group ? OpKind::Group : drawSingleKind(draw), nranks);
  if (group) {
    const int members = 2 + static_cast<int>(draw.below(3));
    for (int m = 0; m < members; ++m)
      op.members.push_back(drawCollective(draw, drawSingleKind(draw), nranks));
  }
  return op;
}

}  // namespace

const char* transportName(Transport t) { return kTransportNames[static_cast<int>(t)]; }
const char* faultName(Fault f) { return kFaultNames[static_cast<int>(f)]; }

std::optional<Transport> parseTransport(const std::string& name) {
  for (int t = 0; t < kNumTransports; ++t)
    if (name == kTransportNames[t]) return static_cast<Transport>(t);
  return std::nullopt;
}

std::optional<Fault> parseFault(const std::string& name) {
  for (int f = 0; f < kNumFaults; ++f)
    if (name == kFaultNames[f]) return static_cast<Fault>(f);
  return std::nullopt;
}

bool multiHostOnly(Fault f) {
  return f == Fault::LinkDown || f == Fault::Partition || f == Fault::TornDown;
}

bool usesDevice(Transport t) { return t == Transport::Device || t == Transport::Staged; }

const char* opKindName(OpKind k) {
  static const char* const kNames[] = {"allReduce",     "broadcast", "reduce", "allGather",
                                       "reduceScatter", "sendRecv",  "group"};
  return kNames[static_cast<int>(k)];
}

std::string describe(const Op& op) {
  std::string text = opKindName(op.kind);
  if (op.kind == OpKind::Group) {
    text += " {";
    for (size_t m = 0; m < op.members.size(); ++m)
      text += (m ? "; " : "") + describe(op.members[m]);
    return text + "}";
  }
  text += std::string(" ") + dataTypeName(op.type);
  if (op.kind == OpKind::AllReduce || op.kind == OpKind::Reduce || op.kind == OpKind::ReduceScatter)
    text += std::string(" ") + reduceOpName(op.op);
  text += " count " + std::to_string(op.count);
  if (op.kind == OpKind::Broadcast || op.kind == OpKind::Reduce)
    text += " root " + std::to_string(op.root);
  if (op.kind == OpKind::SendRecv)
    text += " " + std::to_string(op.from) + "->" + std::to_string(op.to);
  else if (op.inPlace)
    text += " in place";
  if (op.async) text += " async";
  return text;
}

std::vector<int> Trial::victims() const {
  if (fault == Fault::Kill || fault == Fault::Stop || fault == Fault::Abort) return {victim};
  std::vector<int> ranks;
  if (fault == Fault::TornDown)
    for (int r = 0; r < nranks; ++r)
      if (hostOf[r] == victimHost) ranks.push_back(r);
  return ranks;
}

std::vector<int> Trial::culprits(int rank) const {
  if (fault == Fault::LinkDown || fault == Fault::Partition) {
    const bool cutOff = hostOf[rank] == victimHost;
    std::vector<int> across;
    for (int r = 0; r < nranks; ++r)
      if ((hostOf[r] == victimHost) != cutOff) across.push_back(r);
    return across;
  }
  return victims();
}

Trial drawTrial(uint64_t seed, const Offer& offer, bool cover) {
  // The draws come from the whole lists, whatever this machine offers, so
  // that a trial is the same everywhere but for what a machine lacks: a
  // transport not built here is replaced by one drawn from those that are,
  // several hosts without namespaces become one, and a network fault
  // there becomes a fault of one host.
  const std::vector<Transport>& offered = offer.transports;
  if (offered.empty()) throw std::runtime_error("no transport to draw from here");
  auto isOffered = [&](Transport t) {
    return std::find(offered.begin(), offered.end(), t) != offered.end();
  };
  if (offer.onlyTransport && !isOffered(*offer.onlyTransport))
    throw std::runtime_error(std::string("transport ") + transportName(*offer.onlyTransport) +
                             " is not available here");
  if (offer.onlyFault && multiHostOnly(*offer.onlyFault)) {
    if (!offer.namespaces)
      throw std::runtime_error(std::string("fault ") + faultName(*offer.onlyFault) +
                               " needs network namespaces (run as root)");
    if (offer.onlyTransport == Transport::Shm)
      throw std::runtime_error("shm is a transport within one host: it has no network faults");
  }

  Draw draw(seed);
  Trial trial;
  trial.seed = seed;
  trial.nranks = 2 + static_cast<int>(draw.below(kMaxRanks - 1));
  trial.transport = static_cast<Transport>(draw.below(kNumTransports));
  const uint64_t otherTransport = draw.any();
  trial.fault = static_cast<Fault>(draw.below(kNumFaults));
  const Fault oneHostFault = kOneHostFaults[draw.below(std::size(kOneHostFaults))];
  const bool drewHosts = draw.below(2) == 0;
  const int manyHosts = 2 + static_cast<int>(draw.below(kMaxHosts - 1));
  if (cover) {
    // Pair i of the walk over what is here: transport i, fault i + i / T,
    // so that every pair comes once in T * F consecutive seeds, and every
    // transport and every fault within max(T, F).
    std::vector<Fault> faults;
    for (int f = 0; f < kNumFaults; ++f)
      if (offer.namespaces || !multiHostOnly(static_cast<Fault>(f)))
        faults.push_back(static_cast<Fault>(f));
    const uint64_t i = seed;
    trial.transport = offered[i % offered.size()];
    trial.fault = faults[(i + i / offered.size()) % faults.size()];
  }
  if (offer.onlyTransport) trial.transport = *offer.onlyTransport;
  if (offer.onlyFault) trial.fault = *offer.onlyFault;
  if (!isOffered(trial.transport)) trial.transport = offered[otherTransport % offered.size()];
  if (multiHostOnly(trial.fault) && trial.transport == Transport::Shm) {
    if (offer.onlyFault) {
      // The fault was asked for: a transport between hosts instead.
      std::vector<Transport> between;
      for (Transport t : offered)
        if (t != Transport::Shm) between.push_back(t);
      if (between.empty()) throw std::runtime_error("no transport between hosts here");
      trial.transport = between[otherTransport % between.size()];
    } else {
      trial.fault = oneHostFault;
    }
  }
  if (multiHostOnly(trial.fault) && !offer.namespaces) trial.fault = oneHostFault;
  trial.hosts = 1;
  if (trial.transport != Transport::Shm && (drewHosts || multiHostOnly(trial.fault))) {
    if (offer.namespaces)
      trial.hosts = std::min(manyHosts, trial.nranks);
    else
      trial.downgraded = true;
  }

  // Every host has a rank: a shuffled order gives the first ones a host
  // each, the rest land anywhere.
  std::vector<int> order(trial.nranks);
  for (int r = 0; r < trial.nranks; ++r) order[r] = r;
  for (int r = trial.nranks - 1; r > 0; --r)
    std::swap(order[r], order[draw.below(static_cast<uint64_t>(r) + 1)]);
  trial.hostOf.assign(trial.nranks, 0);
  for (int i = 0; i < trial.nranks; ++i) {
    const uint64_t anywhere = draw.any();
    trial.hostOf[order[i]] = i < trial.hosts ? i : static_cast<int>(anywhere % trial.hosts);
  }

  const int victim = static_cast<int>(draw.below(trial.nranks));
  const int victimHost = static_cast<int>(draw.any() % trial.hosts);
  if (trial.fault == Fault::Kill || trial.fault == Fault::Stop || trial.fault == Fault::Abort)
    trial.victim = victim;
  if (multiHostOnly(trial.fault)) trial.victimHost = victimHost;
  trial.moment = std::chrono::milliseconds(draw.below(1501));
  trial.linger = draw.below(8) != 0;

  const int nops = 5 + static_cast<int>(draw.below(26));
  for (int i = 0; i < nops; ++i) trial.ops.push_back(drawOp(draw, trial.nranks));
  return trial;
}

}  // namespace braid::chaos
