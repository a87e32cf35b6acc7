// The "self" transport: a rank's connection to itself, a FIFO in local
// memory, for send/recv to one's own rank inside a group.
//
// It is also the smallest whole transport, and the one to copy when adding
// one: a Connection (slots, post, peek, release), a Transport that owns the
// connections and moves bytes (here: nothing to move), a create() with the
// table's signature, and entry(), the transport's row in the transport
// table (transports/table.h), which is all that the rest of braid sees.
#pragma once

#include "transports/table.h"

namespace braid::transport::self {

TransportEntry entry();

}  // namespace braid::transport::self
