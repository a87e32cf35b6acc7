// A rank's UCP context and worker: one of each per ucx transport (that is,
// per communicator). The worker runs in thread mode SINGLE: the transport
// drives it from one thread at a time (see transport.h).
#pragma once

#include <ucp/api/ucp.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "transports/transport.h"

namespace braid::transport::ucx {

class Worker {
 public:
  // Loads UCX (ucx_api.h) and opens a context with features TAG and
  // WAKEUP (UCX reads its own configuration, UCX_TLS, UCX_NET_DEVICES and
  // the rest, from the environment; braid changes none of it) and a worker
  // on it. Throws Error(SystemError) saying what is missing or naming the
  // UCX call that failed.
  static std::unique_ptr<Worker> open(int nranks);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  ucp_worker_h handle() const { return worker_; }
  // Bytes UCX keeps in front of a request that the caller provides.
  size_t requestSize() const { return requestSize_; }
  // The worker's event file descriptor (UCX owns it).
  int eventFd() const { return eventFd_; }
  // The worker's address, for the peers.
  const std::vector<std::byte>& address() const { return address_; }

  // Handles the events already there; if there were none, arms the worker
  // and blocks on its event fd until an event or `until`. Returns false,
  // with UCX's status in *status, when the worker cannot be armed.
  bool sleep(Clock::time_point until, ucs_status_t* status);

 private:
  Worker() = default;

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  size_t requestSize_ = 0;
  int eventFd_ = -1;
  std::vector<std::byte> address_;
};

// Arms `worker` for a wait on its event fd, handling the events that keep it
// from being armed first (UCS_ERR_BUSY means: progress, then try again).
// Returns UCS_OK when armed; UCS_INPROGRESS when an event was handled
// instead (the caller's state may have changed); another status on failure.
// Never spins: after many busy answers in a row it pauses briefly, and it
// gives up at `until` (returning UCS_INPROGRESS).
ucs_status_t arm(ucp_worker_h worker, Clock::time_point until);

}  // namespace braid::transport::ucx
