// Creates the transports a communicator uses and decides which one serves
// each peer. The only code outside transports/ that knows them by name.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "core/knobs.h"
#include "device/device.h"
#include "transports/device_transport.h"
#include "transports/transport.h"

namespace braid::transport {

struct Setup {
  bootstrap::Bootstrap& bootstrap;  // the communicator's; used for connection set-up
  size_t slotBytes;
  int slots;
  net::Deadline deadline;
  // BRAID_UCX as the communicator resolved it (Knobs::ucx); unset: wireUp()
  // resolves the knob itself, at the communicator's creation all the same.
  std::optional<TransportUse> ucx = std::nullopt;
  std::optional<TransportUse> ibverbs = std::nullopt;  // BRAID_IBVERBS, likewise
  int sockets = 1;  // per tcp connection (BRAID_NSOCKS_PERTHREAD)
};

// Every peer's connection and the transports that own them.
struct Wiring {
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<Connection*> connections;  // indexed by rank; this rank's is "self"
  std::vector<std::string> names;        // transport name per rank
  // Under the automatic choice, the transport that serves the pairs of
  // ranks on different hosts: "tcp", "ucx" or "ibverbs" (the same on every
  // rank).
  std::string acrossHosts = "tcp";
};

// Collective over the communicator. `preference` is an ordered comma list
// ("tcp", "shm,tcp", "shm,ucx") or empty for the automatic choice: shm
// between ranks on one host; between hosts ucx where it is built and
// BRAID_UCX allows (and it starts on every rank), else tcp. Throws
// Error(InvalidArgument) naming BRAID_TRANSPORT for an unknown or unbuilt
// transport, or one that cannot reach some peer; naming BRAID_UCX when
// ranks set it differently; Error(SystemError) when a transport asked for
// (BRAID_TRANSPORT=ucx, BRAID_UCX=ON) cannot start.
Wiring wireUp(const Setup& setup, const std::string& preference);

std::vector<std::string> builtTransports();

// Whether this process could use the ibverbs transport: "" when it could,
// else why not (not built, no library, no device, no active port), for
// braid-info.
std::string ibverbsStatus();

// Collective over the communicator: device connections to every peer, on
// `deviceIndex` of `device`, with the FIFO shape of BRAID_DEVICE_SLOT_BYTES
// and BRAID_DEVICE_SLOTS. Device buffers go the way host buffers go under
// `preference` (wireUp(), which made `hosts`): to a peer whose host
// buffers take shm through device memory both map (cuda_ipc, or
// nvlink_p2p within a process); to one whose host buffers take ibverbs
// over verbs (GPUDirect RDMA where possible, else staged through host
// memory; BRAID_IB_GDR); to one whose host buffers take tcp or ucx staged
// through host memory over tcp.
std::unique_ptr<DeviceTransport> wireDevice(const Setup& setup, const std::string& preference,
                                            const Wiring& hosts, device::Device& device,
                                            int deviceIndex);

// Collective over the communicator: a second set of device connections,
// for ops captured into graphs, to the peers whose device buffers go
// through mapped device memory (none to peers staged over tcp).
std::unique_ptr<DeviceTransport> wireGraphDevice(const Setup& setup, const std::string& preference,
                                                 device::Device& device, int deviceIndex);

// Collective over the communicator: every rank's window of `bytes` at
// `base` (device memory of `deviceIndex`), as this rank reaches it (see
// cuda_ipc::mapWindow): mapped from every peer whose device buffers go
// through mapped memory, none from those staged over tcp. unmapWindow()
// undoes it.
std::vector<PeerWindow> mapWindow(const Setup& setup, const std::string& preference,
                                  device::Device& device, int deviceIndex, void* base,
                                  size_t bytes);
void unmapWindow(device::Device& device, const std::vector<PeerWindow>& windows, size_t bytes);

}  // namespace braid::transport
