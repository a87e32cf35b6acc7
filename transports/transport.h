// The transport interface: transports only move bytes.
//
// A Connection joins this rank to one peer. Each direction is a FIFO of
// fixed-size slots that the receiver can read: the executor writes a message
// straight into the next free send slot and posts it; on the other side it
// reads the message in place from the oldest filled receive slot and
// releases it. How a posted slot reaches the peer's receive slot is the
// transport's business: a socket write and a receive path (tcp), a slot that
// already is in shared memory (shm), a tagged send into a posted receive
// (ucx), an RDMA write into registered memory (ibverbs). (Device buffers
// travel over DeviceConnections instead: device_transport.h.) Every message carries
// a 32-bit tag (the op's sequence number) so a mismatched collective is
// caught instead of silently combining the wrong data.
//
// Threading: a Transport and its connections are used by one thread at a
// time (the communicator's executor serializes them).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "braid/error.h"
#include "core/memory.h"

namespace braid::transport {

using Clock = std::chrono::steady_clock;

// Why a rank gave up on its communicator, said with the rank it names
// (Transport::announceFailure): that rank failed, stopped answering (this
// rank timed out waiting for it), or revoked the communicator. The values
// travel between ranks.
enum class GiveUpReason : uint32_t { Failed = 0, TimedOut = 1, Revoked = 2 };

struct Message {
  const std::byte* data = nullptr;
  uint32_t bytes = 0;
  uint32_t tag = 0;
  // `data` is an address in the peer's process (Connection::postAddress):
  // only Connection::readRemote() reads it.
  bool remote = false;
  // The bytes lie in the peer's memory (by reference or by address): they
  // are what the peer sent only while its op still runs, so a receiver
  // that finds the connection closed once it has read them may not use
  // them.
  bool borrowed = false;
};

class Connection {
 public:
  virtual ~Connection() = default;

  // Capacity of one slot; every message is at most this long.
  virtual size_t slotBytes() const = 0;

  // Memory for the next message, of `bytes` <= slotBytes(), or nullptr while
  // every slot is in flight. Calling it again before postSend() returns the
  // same slot. (A transport may place small messages apart from large ones,
  // e.g. next to the flag that publishes them.)
  virtual std::byte* sendSlot(size_t bytes) = 0;
  // Publishes the slot last returned by sendSlot() as a message of `bytes`.
  virtual void postSend(uint32_t bytes, uint32_t tag) = 0;

  // The oldest unread message, or nullptr when none has arrived.
  virtual const Message* peekRecv() = 0;
  // Frees the message returned by peekRecv().
  virtual void releaseRecv() = 0;

  // Messages by reference (optional). Where the peer can map this rank's
  // memory from braid::memAlloc(), a message whose bytes lie there can be
  // posted as a reference to them instead of a copy: the receiver's
  // peekRecv() returns that memory itself, mapped, so nobody copies it into
  // a slot. The sender must leave those bytes unchanged until consumed()
  // says the receiver released the message.
  virtual bool carriesReferences() const { return false; }
  // Publishes the slot reserved by sendSlot(bytes) as a reference to the
  // `bytes` at `offset` in `region` (which holds them). Returns the ticket
  // for consumed(). REQUIRES: carriesReferences().
  virtual uint64_t postReference(const memory::Region& region, size_t offset, uint32_t bytes,
                                 uint32_t tag) {
    (void)region, (void)offset, (void)bytes, (void)tag;
    return 0;
  }
  // True once the peer released the message posted under `ticket`.
  virtual bool consumed(uint64_t ticket) const {
    (void)ticket;
    return true;
  }

  // Messages by address (optional): where the peer can read any memory of
  // this rank's process (cross-memory attach), a message may be posted as
  // the address of its bytes here. The receiver's peekRecv() returns it
  // with `remote` set, and it copies the bytes where it wants them with
  // readRemote(): one copy instead of two through a slot, for any memory.
  // The sender leaves the bytes unchanged until consumed(). Whether that
  // beats the slots depends on the host and the size: the executor posts
  // by address from a measured size on (Executor::sendByAddressFrom).
  virtual bool carriesAddresses() const { return false; }
  // Publishes the slot reserved by sendSlot(bytes) as the address of the
  // `bytes` at `data`. Returns the ticket for consumed().
  // REQUIRES: carriesAddresses().
  virtual uint64_t postAddress(const std::byte* data, uint32_t bytes, uint32_t tag) {
    (void)data, (void)bytes, (void)tag;
    return 0;
  }
  // Copies `bytes` from `from`, an address in the peer's process that the
  // message peekRecv() returned names (its data, or past it within its
  // bytes), to `to` here. Returns false when the peer's process is gone
  // or the peer gave up, which frees what it lent (peerClosed() then says
  // so too); throws Error(Internal) when a live peer named memory it does
  // not have.
  virtual bool readRemote(std::byte* to, const std::byte* from, size_t bytes) {
    (void)to, (void)from, (void)bytes;
    return false;
  }

  // How the connection can move a message's bytes, for braid-info:
  // "slots" and whatever it can do besides ("memAlloc in place", "by
  // address").
  virtual std::string copyPaths() const { return "slots"; }

  // True when every posted message has left this rank's hands: the peer will
  // receive it without this rank doing anything more.
  virtual bool flushed() const = 0;

  // True once the peer closed its end or died: beyond the messages already
  // received (peekRecv() still returns them), nothing more will arrive and
  // nothing sent will be read. A peer that finished its part of the last op
  // and destroyed its communicator looks like this, so it is an error only
  // for an op that still waits for that peer.
  virtual bool peerClosed() const = 0;
  // Once peerClosed(): the rank the peer named as failed when it gave up
  // (Transport::announceFailure), or -1 when the peer closed or died itself.
  virtual int failedRank() const { return -1; }
  // Why the peer gave up on failedRank().
  virtual GiveUpReason peerReason() const { return GiveUpReason::Failed; }
  // The rank the peer last said it is stuck waiting for
  // (Transport::announceWaitingFor), or -1.
  virtual int peerWaitsFor() const { return -1; }
  // For tools and tests: the data parts posted on each stripe of a
  // connection that stripes messages over several channels (verbs QPs);
  // empty for one with a single channel.
  virtual std::vector<uint64_t> stripePosts() const { return {}; }
};

// One transport instance per communicator; it owns its connections.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;

  // The connection to `peer`; REQUIRES: this transport serves that peer.
  virtual Connection& connection(int peer) = 0;

  // Moves bytes on every connection without blocking. Returns true if
  // anything moved. Throws Error(RemoteError) naming the peer when a
  // connection failed; the failure is sticky.
  virtual bool progress() = 0;

  // True when progress() never moves anything (peers write straight into
  // this rank's memory), so the executor need not call it.
  virtual bool passive() const { return false; }

  // Remembers the state of every connection; waitForActivity() returns as
  // soon as it changed. The executor calls it when it starts to idle and
  // after each wait, and checks its steps at least once more in between,
  // so nothing that arrived before the snapshot is slept through.
  virtual void prepareToWait() {}

  // As of the last prepareToWait(): the lowest-ranked peer of this
  // transport that last ran on this rank's CPU, or -1. A rank that shares
  // its CPU waits best asleep (a yield hands the CPU to the peer and back),
  // or elsewhere (Executor::leaveSharedCpu).
  virtual int cpuSharingPeer() const { return -1; }

  // Blocks until progress() might move something (anything changed since
  // prepareToWait()), or until `until`.
  virtual void waitForActivity(Clock::time_point until) = 0;
  // This rank gives up on the communicator because of rank `failedRank`
  // (-1: for another reason), for `reason`: every peer sees its connection
  // closed, with failedRank() and peerReason() saying why, so that each
  // can name the rank to blame. Best effort and quick; nothing is sent on
  // these connections afterwards.
  virtual void announceFailure(int failedRank, GiveUpReason reason) {
    (void)failedRank, (void)reason;
  }
  // This rank's op is past its deadline waiting for `rank` (-1: it no
  // longer waits): tells every peer, without closing anything, so that a
  // rank stuck waiting for this one can follow the chain of waits to the
  // rank that stopped answering. Wakes peers that sleep; best effort.
  virtual void announceWaitingFor(int rank) { (void)rank; }
  // The peer whose connection failed, after progress() threw; -1 if none.
  virtual int failedPeer() const { return -1; }
};

// For transports whose connections keep their first failure (ucx,
// ibverbs): throws Error(SystemError, own) when the transport itself
// failed (own not empty; *failedPeer = -1), else Error(RemoteError) with
// the first connection's failure, *failedPeer its peer. Returns when
// nothing failed. Each element of `connections` points to something with
// peer() and failure().
template <typename Connections>
void throwFirstFailure(const std::string& own, const Connections& connections, int* failedPeer) {
  if (!own.empty()) {
    *failedPeer = -1;
    throw Error(ErrorCode::SystemError, own);
  }
  for (const auto& connection : connections)
    if (!connection->failure().empty()) {
      *failedPeer = connection->peer();
      throw Error(ErrorCode::RemoteError, connection->failure());
    }
}

}  // namespace braid::transport
