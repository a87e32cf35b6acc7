// The shared-memory transport: for ranks on one host.
//
// Each rank owns one POSIX shared-memory segment holding a slot FIFO per
// peer that sends to it, plus its wake-up word. A sender writes a message
// straight into the receiver's slot and publishes it with one store per
// cache line of the slot's header (messages of up to 440 bytes travel inside
// the header, each line flagged); the receiver reads it in place and frees
// the slot by advancing the FIFO's head. Bytes that lie in braid::memAlloc
// memory may instead go by reference: the receiver maps the sender's memfd
// once (pidfd_getfd) and reads them where they are, a copy fewer. Nothing on
// that path allocates, locks or enters the kernel; a rank that found nothing
// to do for a while sleeps on a futex and is woken only when a peer changed
// one of its FIFOs. Segments are unlinked as soon as every peer has mapped
// them, so a crash leaves nothing in /dev/shm.
#pragma once

#include "transports/table.h"

namespace braid::transport::shm {

// The transport's row in the table. Its create() is collective over every
// rank (also one with no shm peers) and throws Error(SystemError) naming
// the segment when /dev/shm cannot hold it.
TransportEntry entry();

}  // namespace braid::transport::shm
