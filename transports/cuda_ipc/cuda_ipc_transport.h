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
// pointers (shared_blocks.h), with the same FIFO protocol and the
// same side channel.
#pragma once

#include "transports/table.h"

namespace braid::transport::cuda_ipc {

// The transport's row in the table: device buffers only, between ranks of
// one host (itself included). Its create() is collective over the
// communicator and connects this rank to the peers given; when any rank
// cannot (no device memory, no peer access between two devices, a socket
// that fails), every rank throws the same Error naming that rank, with
// the failure's own code. Its mapWindow() gives every rank's window of
// `bytes` at `base` as this rank reaches it: its own and those of ranks
// in this process as they are (one address space), those of other
// processes on this host imported from the allocation's file descriptor
// (the window must then be an allocation of the device from its start),
// none of ranks not given (other hosts, or peers staged through host
// memory); when any rank cannot (the sizes differ, memory that cannot be
// exported, a socket that fails), every rank throws the same Error naming
// that rank. unmapWindow() unmaps what it imported.
TransportEntry entry();

}  // namespace braid::transport::cuda_ipc
