// Bootstrap: how ranks find each other, and the out-of-band (OOB) channel the
// transports use to exchange connection details.
//
// A UniqueId holds magic "BRD1", a version, the root's address and a random
// 64-bit job secret. The root is a thread in the process that made the id (or
// in rank 0 when launched from the environment). Every rank opens its own
// listener, connects to the root and registers {rank, nranks, listen address,
// host identity}; once all ranks are in, the root sends the table back to each
// and exits. Every connection, to the root or between ranks, opens with a
// hello carrying the job secret; a connection without it, or with a malformed
// or oversized frame, is dropped with a warning and never crashes the
// receiver. No length read from the wire is trusted.
//
// After the rendezvous, ranks form an OOB ring (rank r connects to r+1) for
// allGather and barrier, and transports open extra connections between pairs
// through connectTo()/acceptFrom().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/socket.h"
#include "braid/error.h"
#include "braid/types.h"

namespace braid::bootstrap {

// What a UniqueId says.
struct IdContents {
  net::Address root;
  uint64_t secret = 0;
};
UniqueId encodeId(const IdContents& contents);
// Throws Error(InvalidArgument) naming "UniqueId" when the bytes are not an id.
IdContents decodeId(const UniqueId& id);

// Starts the rendezvous root on `listener` in a detached thread. It serves one
// job: it waits for `nranks` registrations (nranks is learned from the first
// one), answers each with the table, and exits; or, `idle` after it started
// with nobody registered, or when the earliest registered rank's deadline is
// near, it tells every registered rank which ranks never arrived and exits.
void startRoot(net::Listener listener, uint64_t secret, std::chrono::milliseconds idle);

// One rank's entry in the table.
struct PeerInfo {
  net::Address listen;  // where this rank accepts OOB and transport connections
  std::string hostId;   // hostname + boot id + network namespace: equal means "same host"
};

// The host identity of this machine (hostname + kernel boot id + network
// namespace).
std::string localHostId();

// Why a connection to a rank's listener was opened. Transports use their own
// values from kTransportBase upwards.
enum class Purpose : uint32_t { OobRing = 1, kTransportBase = 16 };

// One rank's view of a job. Not thread-safe: one thread at a time calls it.
class Bootstrap {
 public:
  // Joins the job named by `id` as `rank` of `nranks`, listening on
  // `listenAt` (port 0). Throws Error(Timeout) past the deadline, naming the
  // ranks that never arrived when the root could tell. A wildcard `listenAt`
  // (0.0.0.0 or ::) is advertised as the local address that routes to the root.
  static std::unique_ptr<Bootstrap> join(const UniqueId& id, int nranks, int rank,
                                         const net::Address& listenAt, net::Deadline deadline);

  // A job whose table is already known (a split communicator): `listener` is
  // this rank's, `table` everyone's, `secret` the new job's.
  static std::unique_ptr<Bootstrap> fromTable(net::Listener listener, std::vector<PeerInfo> table,
                                              int rank, uint64_t secret, net::Deadline deadline);

  ~Bootstrap();

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(table_.size()); }
  uint64_t secret() const { return secret_; }
  const std::vector<PeerInfo>& table() const { return table_; }
  const net::Address& listenAddress() const { return listener_.address(); }

  // OOB allgather over the ring: `data` holds size() blocks of `bytesPerRank`;
  // this rank's block is filled in, the others are filled on return.
  void allGather(void* data, size_t bytesPerRank, net::Deadline deadline);
  void barrier(net::Deadline deadline);

  // Opens a connection to `peer`'s listener with a hello {secret, rank,
  // purpose}. The returned socket is blocking.
  net::Socket connectTo(int peer, uint32_t purpose, net::Deadline deadline);
  // Returns the connection `peer` opened with connectTo(rank(), purpose).
  // Connections that arrive for other (peer, purpose) pairs are kept for
  // their own acceptFrom(); strangers are dropped with a warning.
  net::Socket acceptFrom(int peer, uint32_t purpose, net::Deadline deadline);
  // One attempt at connectTo(): an invalid socket when it failed, with the
  // reason in *errnum: ECONNREFUSED or ECONNRESET when `peer`'s listener is
  // gone (its process exited or died), ETIMEDOUT when nothing answered by
  // `deadline`.
  net::Socket tryConnectTo(int peer, uint32_t purpose, net::Deadline deadline, int* errnum);
  // A connection some peer opened with connectTo(rank(), purpose) (the
  // lowest such peer's first), and that peer; {-1, invalid} when none came
  // by `until`.
  std::pair<int, net::Socket> acceptAny(uint32_t purpose, net::Deadline until);

 private:
  // An accepted connection whose hello has not fully arrived (bootstrap.cc).
  struct Arrival;
  using Key = std::pair<int, uint32_t>;  // (peer, purpose)

  Bootstrap(net::Listener listener, std::vector<PeerInfo> table, int rank, uint64_t secret);
  // The rank side of the rendezvous (root.cc): registers `self` with the root
  // and returns the table.
  static std::vector<PeerInfo> registerWithRoot(const IdContents& job, int nranks, int rank,
                                                const PeerInfo& self, net::Deadline deadline);
  void connectRing(net::Deadline deadline);
  void checkPeer(int peer, const char* op) const;
  // Waits once for activity on the listener and the arrivals, accepting new
  // connections and moving those whose hello is complete to pending_.
  void waitForArrivals(net::Deadline deadline);
  void acceptArrivals();
  void readHello(Arrival& arrival);
  void gather(void* data, size_t bytesPerRank, net::Deadline deadline, const char* op);

  net::Listener listener_;
  std::vector<PeerInfo> table_;
  int rank_;
  uint64_t secret_;
  net::Socket ringNext_;  // to (rank + 1) % size
  net::Socket ringPrev_;  // from (rank - 1 + size) % size
  // The first error of the OOB ring; the ring stays failed after it.
  std::optional<Error> ringFailure_;
  // Accepted and identified, not yet claimed; oldest first for equal keys.
  std::multimap<Key, net::Socket> pending_;
  std::vector<Arrival> arrivals_;  // accepted, hello still incomplete
};

}  // namespace braid::bootstrap
