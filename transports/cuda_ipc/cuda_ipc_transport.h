// The cuda_ipc transport: device-memory FIFOs between processes of one
// host (transports/device_transport.h has the protocol).
//
// Each rank allocates, per same-host peer, one block of device memory on
// its communicator's device: the FIFO it receives on from that peer (its
// slots and `filled` counter) and the `credit` counter of its own sends to
// that peer. The block is exported as a file descriptor (cuMem's POSIX
// handle, or the emulated device's memfd), passed to the peer over a
// Unix-domain socket authenticated with the job secret (SCM_RIGHTS), and
// mapped there. Any number of ranks may share one GPU; ranks on GPUs
// with peer access write into each other's device memory, and between GPUs
// without it the blocks are page-locked host memory both reach (staging:
// kernels write and read it across PCIe). The sockets stay open as a side
// channel: a peer that dies closes them, and a peer that gives up says
// whom it blames on them first.
//
// Peers in this same process (several GPUs driven by one process) are the
// nvlink_p2p path: their blocks are not exported but handed over as
// pointers (transports/nvlink_p2p), with the same FIFO protocol and the
// same side channel.
#pragma once

#include <memory>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "device/device.h"
#include "transports/device_transport.h"

namespace braid::transport::cuda_ipc {

// Collective over the communicator. Connects this rank to `peers` (ranks
// on its host, itself included; every peer listed must list this rank
// too); the others get no connection. When any rank cannot (no device
// memory, no peer access between two devices, a socket that fails), every
// rank throws the same Error naming that rank, with the failure's own code.
std::unique_ptr<DeviceTransport> create(bootstrap::Bootstrap& bootstrap,
                                        const std::vector<int>& peers, device::Device& device,
                                        int deviceIndex, size_t slotBytes, int slots,
                                        net::Deadline deadline);

// Collective over the communicator: every rank offers `bytes` of device
// memory at `base`, and gets every rank's window as it can reach it: its
// own and those of ranks in this process as they are (one address space:
// nvlink_p2p), those of other processes on this host imported from the
// allocation's file descriptor (cuda_ipc: the window must then be an
// allocation of `device` from its start), none of ranks not in `peers`
// (other hosts, or peers this transport does not serve). When any
// rank cannot (the sizes differ, memory that cannot be exported, a socket
// that fails), every rank throws the same Error naming that rank.
std::vector<PeerWindow> mapWindow(bootstrap::Bootstrap& bootstrap, const std::vector<int>& peers,
                                  device::Device& device, int deviceIndex, void* base, size_t bytes,
                                  net::Deadline deadline);
// Unmaps what mapWindow() imported.
void unmapWindow(device::Device& device, const std::vector<PeerWindow>& windows, size_t bytes);

}  // namespace braid::transport::cuda_ipc
