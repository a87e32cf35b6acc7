// What the device transports that move messages with a proxy thread share
// (tcp's and ibverbs'; device_transport.h, "Between hosts"): the block of
// page-locked host memory that holds each link's counters, and the proxy
// thread with the side channel's bookkeeping. A transport supplies what its
// proxy does in one turn and how its words go out; the waits for a last
// word, the notices and the proxy's sleeps are here.
//
// Threading: the proxy thread runs turn() with mutex_ held; the
// DeviceTransport calls come from the executor's threads (enqueued() from
// the issuing one, the side channel from the watchdog).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/socket.h"
#include "device/device.h"
#include "transports/device_transport.h"

namespace braid::transport {

// A link's block (Device::allocateHost): the four counters, each on a
// line of its own; words of the transport's own; the slots' tag and length
// words; then, from kSlots, slots where the transport keeps them there.
struct StagingBlock {
  static constexpr size_t kSendFilled = 0;    // written by this rank's stream, read by the proxy
  static constexpr size_t kSendCredit = 64;   // written by the proxy, waited on by the stream
  static constexpr size_t kRecvFilled = 128;  // written by the proxy, waited on by the stream
  static constexpr size_t kRecvCredit = 192;  // written by the stream, read by the proxy
  static constexpr size_t kOwnWords = 256;    // up to kSendTags: the transport's
  static constexpr size_t kSendTags = 512;
  static constexpr size_t kSendLengths = 768;
  static constexpr size_t kRecvTags = 1024;
  static constexpr size_t kSlots = 4096;
  static constexpr int kMaxSlots = 64;  // tag and length words per direction

  static uint32_t* word(std::byte* block, size_t offset) {
    return reinterpret_cast<uint32_t*>(block + offset);
  }
  // Points `connection` at `block`'s counters and tag words, and at the
  // slots given (in the block, or device memory).
  static void wire(DeviceConnection& connection, int peer, std::byte* block, std::byte* sendSlots,
                   std::byte* recvSlots);
};

// One peer's end as the shared bookkeeping sees it; a transport's own link
// extends it.
struct ProxyLink {
  int peer = -1;
  net::Socket socket;  // the side channel (for tcp, the data too)
  DeviceConnection connection;
  // From enqueued(): messages this rank's streams will send and receive.
  std::atomic<uint64_t> sendsDue{0};
  std::atomic<uint64_t> receivesDue{0};
  // The proxy's (mutex_ held).
  bool goodbyeDue = false;  // say goodbye once every message went out
  bool shut = false;        // this rank sends nothing more
  bool closed = false;      // reported: nothing more arrives
  bool blocked = false;     // the socket took no more: poll for POLLOUT
  int waitsFor = -1;        // what the peer last said it waits for
};

class ProxiedDeviceTransport : public DeviceTransport {
 public:
  ~ProxiedDeviceTransport() override;

  size_t slotBytes() const override { return slotBytes_; }
  int slots() const override { return static_cast<int>(slots_); }
  DeviceConnection* connection(int peer) override {
    ProxyLink* link = linkTo(peer);
    return link ? &link->connection : nullptr;
  }
  void enqueued() override;
  void poll(std::vector<PeerNotice>* notices) override;
  void announceFailure(int failedRank, GiveUpReason reason) override;
  void sayGoodbye() override;
  void keepMemory() override { kept_ = true; }
  void announceWaitingFor(int rank) override;
  int peerWaitsFor(int peer) const override;

 protected:
  // `name` ("tcp", "ibverbs") starts log lines and errors; every link's
  // FIFO has `slots` slots of `slotBytes` each way.
  ProxiedDeviceTransport(device::Device& device, int deviceIndex, int rank, int nranks,
                         size_t slotBytes, int slots, const char* name);

  // Set-up, before startProxy(): the links, each a member of the derived
  // transport, which outlives the proxy.
  void addLink(ProxyLink* link);
  ProxyLink* linkTo(int peer) const { return byPeer_[static_cast<size_t>(peer)]; }
  void startProxy();
  // The derived transport's destructor calls it first: its turn() must
  // not run on members already destroyed.
  void stopProxy();

  // ---- The proxy's (mutex_ held).
  // Moves what can move without blocking; true if anything did.
  virtual bool turn() = 0;
  // Whether the proxy must look again soon (messages or credit the streams
  // will write, messages they wait for, work in flight); else it sleeps
  // until a socket or enqueued() wakes it.
  virtual bool owed() const = 0;
  // Whether the link's socket is still worth polling.
  virtual bool listening(const ProxyLink& link) const { return !link.closed; }
  // Queue a side-channel word on `link` (sent by a later turn()).
  virtual void queueFailure(ProxyLink& link, int failedRank, GiveUpReason reason) = 0;
  virtual void queueWaitingFor(ProxyLink& link, int rank) = 0;

  void wake();
  // Links on which this rank sends nothing more.
  size_t settled() const;
  bool allShut() const { return settled() == links_.size(); }

  device::Device& device_;
  const int deviceIndex_;
  const int rank_;
  const char* const name_;
  const size_t slotBytes_;
  const uint64_t slots_;
  std::atomic<bool> kept_{false};  // keepMemory(): the memory is never freed

  mutable std::mutex mutex_;         // guards the links' proxy state and what follows
  std::condition_variable changed_;  // a link shut or closed
  std::vector<PeerNotice> heard_;    // for poll()
  bool quiet_ = false;               // this rank gave up: forward nothing more
  bool stopping_ = false;

 private:
  void run();

  std::vector<ProxyLink*> links_;
  std::vector<ProxyLink*> byPeer_;     // indexed by rank; null for peers not served here
  const int wake_;                     // eventfd: enqueued() and the side channel wake the proxy
  std::atomic<bool> sleeping_{false};  // the proxy sleeps with no message due
  std::thread proxy_;
};

}  // namespace braid::transport
