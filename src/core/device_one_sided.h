// One-sided calls on device windows (Communicator::put, signal and
// waitSignals with a device stream; NCCL's ncclPutSignal, ncclSignal and
// ncclWaitSignal on device memory): stream-ordered, NCCL's semantics.
//
// Each rank keeps a signal board in device memory: a 32-bit counter per
// (source rank, signal), mapped by the ranks of this host that map its
// windows. A put from rank s to rank p is, on the caller's stream, a copy
// into p's window as mapped here, then a flag write that sets p's counter
// for (s, signal) to the number of raises s made of it so far. s alone
// writes that counter, so an absolute value needs no atomic, and the write
// lands after the copy (Device::flagOps). A wait is a flag wait on this
// rank's board for the count consumed so far plus the count asked, so the
// stream, not the host, waits.
//
// Each call is an op of the device executor (enqueueOneSided): after this
// communicator's ops issued before it, whatever their stream, so one
// rank's puts and signals land in issue order; failed past the timeout
// naming the signal it waits for; released when the communicator fails.
// Device puts reach the ranks whose windows are mapped here (this host, a
// same-host transport), not ranks staged over the network; and they are
// not captured into graphs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "braid/communicator.h"
#include "exec/device_executor.h"
#include "transports/device_transport.h"

namespace braid {

class DeviceSignals {
 public:
  // Collective: allocates this rank's board and maps the peers'. Throws as
  // registerWindow does.
  explicit DeviceSignals(Communicator::Impl& impl);
  ~DeviceSignals();
  DeviceSignals(const DeviceSignals&) = delete;
  DeviceSignals& operator=(const DeviceSignals&) = delete;

  // Whether this rank can raise `peer`'s signals (its board is mapped here).
  bool reaches(int peer) const;
  size_t boardBytes() const { return bytes_; }

  // REQUIRES: arguments checked: `target` is `bytes` of `peer`'s window as
  // mapped here, the signal in [0, kSignals) or -1 for none, `stream` not
  // capturing, reaches(peer), outside groups.
  Work put(const void* source, std::byte* target, size_t bytes, int peer, int signal, void* stream);
  Work signal(int peer, int signal, void* stream);
  // REQUIRES: every wait's peer reaches this rank (reaches(peer)).
  Work wait(const SignalWait* waits, size_t count, void* stream);

 private:
  uint32_t* slot(int owner, int source, int signal) const;
  // `count` names the op: bytes put, or raises made or waited for.
  Work enqueue(const char* name, int peer, size_t count, const void* source, void* target,
               size_t bytes, const std::vector<device::FlagOp>& flags,
               std::vector<exec::DeviceExecutor::BoardWait> waits, void* stream);

  Communicator::Impl& impl_;
  size_t bytes_ = 0;
  std::byte* board_ = nullptr;                 // this rank's, allocated here
  std::vector<transport::PeerWindow> boards_;  // every rank's, as mapped here
  std::vector<uint32_t> raised_;               // per (peer, signal): raises sent so far
  std::vector<uint32_t> consumed_;             // per (source, signal): raises waited for
  uint64_t seq_ = 0;                           // one-sided calls issued, for their names
};

}  // namespace braid
