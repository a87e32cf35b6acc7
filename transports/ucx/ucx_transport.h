// The UCX transport: one UCP context and one UCP worker per communicator
// (thread mode SINGLE: the executor drives a transport from one thread at a
// time), one endpoint per peer (error handling mode PEER), and every message
// a tagged send into a receive that the peer posted into its own slot
// memory.
//
// - FIFO and credit: the receiver owns its slots and keeps one receive
//   posted per free slot; a sender's slot stays in flight until a posted
//   receive of the peer has taken its message (synchronous sends), so the
//   receives a rank posts are its peer's credit, as the free slots of a
//   shared-memory FIFO are, and flushed() means the peer has the message.
// - Tags and header: ucx_connection.h (communicator bits, sender's rank,
//   sequence number in the tag; bytes and tag in a trailer).
// - No allocation per message: UCX fills request memory the connection
//   preallocated (UCP_OP_ATTR_FIELD_REQUEST), and every completion takes
//   the callback (UCP_OP_ATTR_FLAG_NO_IMM_CMPL).
// - Waiting: the worker's event fd (ucp_worker_arm) with ppoll, and the
//   pidfds of same-host peers' processes (UCX notices a dead peer over
//   shared memory only by its keepalive, seconds later).
// - UCX is loaded at run time (ucx_api.h) and picks its wires from its own
//   environment (UCX_TLS, UCX_NET_DEVICES), which braid leaves alone. With
//   peer failure handling on, UCX 1.13 takes TCP even between ranks on one
//   host unless UCX_POSIX_ERROR_HANDLING=y lets it use posix shared memory.
#pragma once

#include "transports/table.h"

namespace braid::transport::ucx {

// The transport's row in the table. The automatic choice takes it between
// hosts where BRAID_UCX allows and, under AUTO, every rank has an RDMA
// device (over plain TCP braid's own socket transport measured faster).
// Its create() is collective over every rank (also one that serves no
// peer over UCX): it loads UCX and opens this rank's context and worker,
// exchanges worker addresses through the bootstrap's allgather, makes an
// endpoint to each peer and waits until each has said hello; it returns
// nullptr, with `*whyNot` naming the rank that could not start UCX or
// reach a peer and why (the same on every rank), so that all ranks can
// pass it over together, and throws Error(Timeout) past the deadline.
TransportEntry entry();

}  // namespace braid::transport::ucx
