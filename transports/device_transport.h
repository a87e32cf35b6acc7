// Device connections: the FIFOs through which the device executor moves a
// plan's pieces between device buffers, entirely in stream order.
//
// Each direction between two ranks is a FIFO of `slots` slots of
// `slotBytes` in the receiver's device memory, plus two 32-bit counters:
// `filled` (messages written, in the receiver's memory, written by the
// sender's stream) and `credit` (messages released, in the sender's
// memory, written by the receiver's stream). Message k lives in slot
// k % slots. To send message k a stream waits for credit >= k + 1 - slots,
// writes the slot (a copy or a reduction kernel straight into the peer's
// memory), then the slot's tag word (the op's tag) and filled = k + 1; to
// receive it a stream waits for filled >= k + 1 and for the tag to be its
// op's, reads the slot and writes credit = k + 1. A message of another op
// (ranks that issued different operations) so never gets read: the op
// stays stuck, and the watchdog names the mismatch. Every wait is
// on this rank's own memory; comparisons are cyclic, so counters wrap.
//
// The host keeps `next` per direction (messages enqueued so far): it is
// what the executor lowers the next piece with, and what a failed op
// writes into this rank's counters to release every wait it enqueued.
//
// Between hosts (tcp) both ends keep their own copy of a direction in
// page-locked host memory, and a proxy thread moves it: the sender's
// stream fills its own slot and writes its own `filled` (and the slot's
// `lengths` word); the proxy sends the message, and the receiving proxy
// writes it into the receiver's slot, then its tag and `filled`; credit
// travels back the same way. Every counter a stream waits on or writes is
// then in its own process, and the executor sees the same FIFO.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transports/transport.h"

namespace braid::transport {

struct DeviceFifo {
  std::byte* slots = nullptr;  // the receiver's slots (for a send: mapped from the peer)
  uint32_t* tags = nullptr;    // per slot, the tag of the op whose message it holds (receiver's)
  uint32_t* filled = nullptr;  // in the receiver's memory
  uint32_t* credit = nullptr;  // in the sender's memory
  // Per slot, the bytes of the message it holds, for a sender whose
  // messages a proxy forwards (written before the tag); null otherwise.
  uint32_t* lengths = nullptr;
  uint64_t next = 0;  // messages enqueued on this direction so far (host side)
};

struct DeviceConnection {
  int peer = -1;
  DeviceFifo send;  // this rank -> peer
  DeviceFifo recv;  // peer -> this rank
};

// A rank's window (device memory registered with the communicator) as
// this rank reaches it.
struct PeerWindow {
  std::byte* base = nullptr;  // null: the rank is on another host
  bool imported = false;      // mapped here by Device::import(): unmap it
};

// What a peer said (or did) on the transport's side channel.
struct PeerNotice {
  int peer = -1;
  int waitsFor = -1;     // not closed: the peer said it is stuck waiting for this rank
  bool closed = false;   // the peer left: it exited, died, gave up or destroyed its communicator
  bool goodbye = false;  // ...after saying it leaves with all its device work done
  bool gaveUp = false;   // ...after saying it gave up (failed or aborted)
  int failedRank = -1;   // the rank it blamed when it gave up, or -1
  GiveUpReason reason = GiveUpReason::Failed;  // ...and why
};

// One per communicator that uses device memory. Used by the device
// executor: set-up and lowering on the issuing thread, the side channel
// by the executor's watchdog.
class DeviceTransport {
 public:
  virtual ~DeviceTransport() = default;
  virtual size_t slotBytes() const = 0;
  virtual int slots() const = 0;
  // The connection to `peer` (this rank included), or nullptr when the
  // transport cannot reach it (another host).
  virtual DeviceConnection* connection(int peer) = 0;
  // How `peer`'s memory is reached from this rank, for braid-info: "self",
  // or the transport and the way, e.g. "nvlink_p2p: peer access",
  // "cuda_ipc: same device", "tcp: staged through host memory".
  virtual std::string path(int peer) const = 0;
  // Called on the issuing thread once an op is lowered (every `next` is
  // up to date): a transport whose proxy moves the messages learns how
  // many are coming.
  virtual void enqueued() {}

  // Appends every notice that arrived since the last call, without
  // waiting: peers that closed or gave up (each reported once) and what
  // peers said they wait for.
  virtual void poll(std::vector<PeerNotice>* notices) = 0;
  // Tells every peer this rank gives up because of `failedRank` (-1:
  // another reason), for `reason`. Best effort.
  virtual void announceFailure(int failedRank, GiveUpReason reason) = 0;
  // Tells every peer this rank leaves with all its device work done.
  virtual void sayGoodbye() = 0;
  // The device broke and its streams may still use the FIFO memory: the
  // transport leaves it mapped when destroyed (leaked) rather than freed.
  virtual void keepMemory() = 0;
  // Device memory this transport allocated (its FIFOs), in bytes.
  virtual size_t deviceBytes() const { return 0; }
  // Tells every peer this rank's op is past its deadline waiting for
  // `rank` (-1: no longer), so that a rank waiting for this one can follow
  // the chain of waits to the rank that stopped answering.
  virtual void announceWaitingFor(int rank) = 0;
  // The rank `peer` last said it waits for, or -1.
  virtual int peerWaitsFor(int peer) const = 0;
  // Where the connection to `peer` was reported closed because this
  // rank's end of it broke (a failed RDMA work request) while the peer
  // was not leaving, why; else "". The executor fails the communicator
  // then: messages may have been lost either way.
  virtual std::string whyBroken(int peer) const {
    (void)peer;
    return "";
  }
};

}  // namespace braid::transport
