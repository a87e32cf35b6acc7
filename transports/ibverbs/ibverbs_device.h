// ibverbs' device side: device buffers between ranks whose host buffers
// take ibverbs, moved by the NIC. The FIFO the device executor sees is the
// one of device_transport.h ("Between hosts"): every counter a stream
// waits on or writes is in this process's page-locked host memory, and a
// proxy thread per communicator moves the messages.
//
// Where the slots live:
// - GPUDirect RDMA (BRAID_IB_GDR=AUTO where the GPU and NIC allow, or ON):
//   both ends' slots are device memory registered with the NIC through its
//   dma-buf (Device::exportDmabuf, ibv_reg_dmabuf_mr). The sending stream
//   copies or reduces into its own send slot, the NIC writes that slot
//   into the peer's receive slot, the receiving stream reads it there: no
//   host memory on the way.
// - Staged (OFF, or AUTO where dma-buf is not possible): the slots are the
//   same page-locked host memory as the counters, registered as host
//   memory. One log line per communicator says which path is in use.
//
// Per message (one RC QP per peer):
// - The sender's proxy sees the stream's `filled` pass the message, and
//   posts one RDMA WRITE_WITH_IMM of the slot's bytes into the peer's slot;
//   the immediate is the op's tag.
// - The receiver's proxy takes the receive completion (RC places a write
//   before the completion of its immediate). Into device memory the write
//   may still be in flight on PCIe: the proxy posts an RDMA READ of a word
//   of the slots through a QP connected to itself, which PCIe orders after
//   the NIC's writes, and only once that READ completed writes the slot's
//   tag and `filled` (writeFlagNow), which is what the stream waits on.
// - Credit: the receiving stream writes `credit`; the proxy RDMA-writes it
//   into a word of the sender's host memory, whose proxy copies it into
//   the counter the sending stream waits on. A message goes only into a
//   slot the peer released, so a receive is posted for every immediate
//   that can arrive.
//
// Liveness and the side channel (goodbye, gave up, waits for) travel on a
// socket per peer, opened through the bootstrap listeners, which also
// carries the set-up exchange. A goodbye carries the number of messages
// sent, and a receiver reports the peer closed only once it has them all.
#pragma once

#include <memory>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "device/device.h"
#include "transports/device_transport.h"
#include "transports/ibverbs/ibverbs_transport.h"

namespace braid::transport::ibverbs {

// Collective over the communicator (every rank calls it, also one with no
// peers here): connects this rank's device FIFOs to `peers` over verbs, on
// Setup's device, in Setup's FIFO shape. When any rank cannot (no RDMA
// port, a registration or QP that fails, BRAID_IB_GDR=ON without dma-buf,
// another FIFO shape), every rank throws the same Error naming that rank.
std::unique_ptr<DeviceTransport> createDevice(const Setup& setup, const std::vector<int>& peers,
                                              const Options& options);

}  // namespace braid::transport::ibverbs
