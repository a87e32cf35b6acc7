// One-sided calls on device windows (Communicator::put, signal and
// waitSignals with a device stream; NCCL's ncclPutSignal, ncclSignal and
// ncclWaitSignal on device memory): stream-ordered, NCCL's semantics.
//
// Each rank keeps a signal board in device memory: a 32-bit counter per
// (source rank, signal), mapped by the ranks of this host that map its
// windows. A wait is a flag wait on this rank's board for the count
// consumed so far plus the count asked, so the stream, not the host, waits.
// How a put from rank s reaches rank p:
//   - Mapped (p maps s's windows: this host, cuda_ipc): on the caller's
//     stream, a copy into p's window as mapped here, then a flag write that
//     sets p's counter for (s, signal) to the number of raises s made of it
//     so far. s alone writes that counter, so an absolute value needs no
//     atomic, and the write lands after the copy (Device::flagOps).
//   - Staged (another host, or a pair on the network): through the host
//     windows' socket to p (one_sided.h). The stream waits on a flag of this
//     rank's board that a proxy thread writes once it has copied the source
//     out and sent it; a thread of p copies the bytes into its window and
//     then raises the counter (p's link thread alone writes the counters of
//     its staged sources).
//
// Each call is an op of the device executor (enqueueOneSided): after this
// communicator's ops issued before it, whatever their stream, so one rank's
// puts and signals to a peer land in issue order; failed past the timeout
// naming what it waits for; released when the communicator fails. They are
// not captured into graphs.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "braid/communicator.h"
#include "exec/device_executor.h"
#include "transports/device_transport.h"

namespace braid {

class OneSided;

class DeviceSignals {
 public:
  // Collective: allocates this rank's board and maps the peers'; staged
  // pairs go through `staged` (which outlives this).
  DeviceSignals(Communicator::Impl& impl, OneSided& staged);
  ~DeviceSignals();
  DeviceSignals(const DeviceSignals&) = delete;
  DeviceSignals& operator=(const DeviceSignals&) = delete;

  // Stops the proxy thread once it has sent what is queued (skipped, once
  // the communicator failed). The device ops must be done: none waits for
  // it any more.
  void stopProxy();

  // Whether this rank can put to `peer` and raise its signals.
  bool reaches(int peer) const;
  // Whether it does so directly (`peer` maps this rank's board), not
  // through the proxy.
  bool mapped(int peer) const { return boards_[static_cast<size_t>(peer)].base != nullptr; }
  size_t boardBytes() const { return bytes_; }

  // REQUIRES: arguments checked: reaches(peer); `target` is `bytes` of
  // `peer`'s part of window `window` as mapped here, or null where it is
  // not mapped; the signal in [0, kSignals) or -1 for none; `stream` not
  // capturing; outside groups.
  Work put(const void* source, std::byte* target, size_t bytes, int peer, uint64_t window,
           size_t offset, int signal, void* stream);
  Work signal(int peer, int signal, void* stream);
  // REQUIRES: reaches(peer) for every wait's peer.
  Work wait(const SignalWait* waits, size_t count, void* stream);

 private:
  // A staged call the proxy sends once the stream reached it.
  struct Staged {
    device::EventHandle reached;
    const void* source;
    size_t bytes;
    int peer;
    uint64_t window;
    size_t offset;
    int signal;
    bool signalOnly;
    uint32_t ticket;  // what the proxy writes into sentFlag() once it is sent
  };

  uint32_t* slot(int owner, int source, int signal) const;
  uint32_t* sentFlag() const;
  // Where this rank counts the raises of `signal` by `source`, a staged
  // peer (its link thread writes them).
  uint32_t* stagedSlot(int source, int signal) const;
  // Frees board_ and host_ (either may be null).
  void freeBoard();
  // `count` names the op: bytes put, or raises made or waited for.
  Work enqueue(const char* name, int peer, size_t count, const void* source, void* target,
               size_t bytes, const std::vector<device::FlagOp>& flags,
               std::vector<exec::DeviceExecutor::BoardWait> waits, void* stream,
               device::EventHandle reached = nullptr);
  Work stage(Staged call, void* stream);
  void proxy();
  // A staged peer's raise (its link thread).
  void raiseStaged(int source, int signal);

  Communicator::Impl& impl_;
  OneSided& staged_;
  size_t bytes_ = 0;
  std::byte* board_ = nullptr;  // this rank's, allocated here
  // Page-locked host memory: the counters of staged sources' raises
  // (stagedSlot), then the proxy's flag (sentFlag).
  uint32_t* host_ = nullptr;
  std::vector<transport::PeerWindow> boards_;  // every rank's, as mapped here
  std::vector<uint32_t> raised_;               // per (peer, signal): raises sent so far
  std::vector<uint32_t> consumed_;             // per (source, signal): raises waited for
  std::vector<uint32_t> stagedRaised_;         // per (source, signal): raised by the link thread
  uint64_t seq_ = 0;                           // one-sided calls issued, for their names
  uint32_t tickets_ = 0;                       // staged calls issued

  std::mutex mutex_;  // guards what follows
  std::condition_variable changed_;
  std::deque<Staged> queue_;
  std::vector<device::EventHandle> freeEvents_;
  bool stopping_ = false;
  std::thread proxy_;  // started by the first staged call
};

}  // namespace braid
