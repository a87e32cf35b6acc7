// tcp's device side: device buffers between ranks that tcp serves (ranks
// on other hosts), staged through page-locked host memory.
//
// Per peer, one block of Device::allocateHost() memory holds both
// directions of the pair's device FIFO: this rank's copy of each slot and
// counter (device_transport.h, "Between hosts"). A proxy thread per
// communicator moves them over one socket per peer. It watches the words
// the streams write (the sender's `filled`, the receiver's `credit`),
// sends each message straight from its slot ([header | slot bytes], one
// writev), and reads each arriving message straight into the receiver's
// slot, then writes the slot's tag and `filled` from the host, which is
// what the receiving stream waits on: no stream ever waits for a host
// callback. Pieces pipeline through the slots: while the sending stream
// copies piece k+1 into its next slot, the proxy sends piece k, and the
// receiving stream copies piece k-1 out while piece k arrives.
//
// The same socket is the side channel, in order after the data: a rank
// that leaves first forwards everything its streams wrote, then says
// goodbye; one that gives up says whom it blames; a closed socket is a
// peer that died.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transports/table.h"

namespace braid::transport::tcp {

// Collective over the communicator (every rank calls it, also with no
// peers): connects this rank's device FIFOs to `peers` (every peer listed
// must list this rank too) on Setup's device, in Setup's FIFO shape. When
// any rank cannot (no page-locked memory, a socket that fails, another
// FIFO shape), every rank throws the same Error naming that rank.
std::unique_ptr<DeviceTransport> createDevice(const Setup& setup, const std::vector<int>& peers,
                                              std::string* whyNot);

}  // namespace braid::transport::tcp
