// A chaos trial: everything one run of braid_chaos does to one job, drawn
// from a 64-bit seed. The draw is a pure function of the seed and of what
// the machine offers (Offer: the transports built here, whether network
// namespaces can be made) and of the restrictions given on the command
// line, so `braid_chaos --seed S` with the same flags replays trial S.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "braid/types.h"

namespace braid::chaos {

constexpr int kMaxRanks = 6;
constexpr int kMaxHosts = 3;

// How the ranks' buffers travel. Device and Staged use device buffers on
// the emulated device; the others host buffers.
enum class Transport {
  Shm,      // one host only, braid's default there
  Tcp,      // BRAID_TRANSPORT=tcp
  Tcp4,     // ... with BRAID_NSOCKS_PERTHREAD=4
  Ucx,      // BRAID_TRANSPORT=ucx (where braid was built with UCX)
  Ibverbs,  // BRAID_TRANSPORT=ibverbs over the fake fabric
  Device,   // device buffers, the default transports (cuda_ipc within a host)
  Staged,   // device buffers over tcp, staged through host memory
};
constexpr int kNumTransports = 7;

enum class Fault {
  None,
  Kill,       // SIGKILL of a rank
  Stop,       // SIGSTOP of a rank past the timeout, SIGKILL at the end
  Abort,      // Communicator::abort() of a rank, from another of its threads
  LinkDown,   // multi-host: a host's eth0 set down
  Partition,  // multi-host: blackhole routes between a host and the others
  TornDown,   // multi-host: a host's link deleted, then its ranks killed
};
constexpr int kNumFaults = 7;

const char* transportName(Transport t);
const char* faultName(Fault f);
std::optional<Transport> parseTransport(const std::string& name);
std::optional<Fault> parseFault(const std::string& name);
bool multiHostOnly(Fault f);
bool usesDevice(Transport t);

enum class OpKind { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, SendRecv, Group };
const char* opKindName(OpKind k);

// One operation of the schedule, the same on every rank: each rank issues
// its part (a send/recv only concerns `from` and `to`).
struct Op {
  OpKind kind = OpKind::AllReduce;
  DataType type = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;  // also picks the input's range for the copies
  size_t count = 0;             // per rank for all-gather and reduce-scatter
  int root = 0;
  bool inPlace = false;
  int from = 0, to = 0;     // SendRecv
  uint64_t seed = 0;        // of the inputs (tests/reference.h)
  bool async = false;       // host buffers: issued on Stream::async()
  std::vector<Op> members;  // Group: collectives and send/recvs, no groups
};

// "allReduce float32 sum count 1000 in place" and the like.
std::string describe(const Op& op);

// What the machine offers, and what the command line allows.
struct Offer {
  std::vector<Transport> transports;  // built and usable here
  bool namespaces = false;            // multi-host trials possible
  std::optional<Transport> onlyTransport;
  std::optional<Fault> onlyFault;
};

struct Trial {
  uint64_t seed = 0;
  int nranks = 2;
  int hosts = 1;            // 1: loopback; 2-3: namespace hosts
  bool downgraded = false;  // drew several hosts, but there are no namespaces
  std::vector<int> hostOf;  // rank -> host
  Transport transport = Transport::Shm;
  Fault fault = Fault::None;
  int victim = -1;                      // Kill, Stop, Abort: the rank
  int victimHost = -1;                  // network faults: the host
  std::chrono::milliseconds moment{0};  // after every rank passed the first barrier
  bool linger = false;  // ranks done before the fault wait for it, then end with a barrier
  std::vector<Op> ops;

  // Ranks the fault strikes directly: the rank of Kill, Stop and Abort, the
  // ranks on the torn-down host; none for the others.
  std::vector<int> victims() const;
  // The ranks whose names in `rank`'s error are right: the victim; for a
  // cut link, every rank on the other side of the cut.
  std::vector<int> culprits(int rank) const;
};

// Draws trial `seed`. With `cover`, the transport and fault are not drawn
// but the seed-th pair of a walk over every pair of those here (where the
// pair is possible: shm has no network faults), so that consecutive seeds
// cover every pair; the rest still comes from the seed. Throws
// std::runtime_error when the restrictions leave nothing to draw.
Trial drawTrial(uint64_t seed, const Offer& offer, bool cover = false);

}  // namespace braid::chaos
