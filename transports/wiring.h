// Wiring: a communicator's connections, one transport per pair of ranks,
// chosen from the transport table (table.h), for host buffers and for
// device buffers.
//
// Host buffers: the pair takes the first row of the table, or of
// BRAID_TRANSPORT's list where it is set, that reaches it. Under the
// automatic choice a row with a use knob (BRAID_UCX, BRAID_IBVERBS) is
// passed over where the knob says OFF, where some rank cannot use it, or
// where it fails to start on some rank; the pairs it would have taken go
// to the next row that reaches them. Every rank makes the same choice for
// every pair.
//
// Device buffers follow host buffers: a pair takes the row that the
// table names for its host transport (table.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transports/table.h"

namespace braid::transport {

// This rank's connections to every rank, and the transports that own them.
struct Wiring {
  std::vector<std::unique_ptr<Transport>> transports;
  // Indexed by rank; this rank's is its loopback.
  std::vector<Connection*> connections;
  std::vector<Transport*> transportOf;         // the owner of each connection
  std::vector<const TransportEntry*> entries;  // each connection's table entry
  // The rows that were created, in table (or BRAID_TRANSPORT) order; a
  // pair's host transport is the first of them that reaches it, on every
  // rank alike (hostRow()).
  std::vector<const TableRow*> order;
  // Per table row, where the automatic choice asked: whether it could
  // try that row (its use knob, agreed, and every rank able to), 1 or 0;
  // -1 where it did not ask. A shrunk communicator takes its parent's
  // answers rather than asking its ranks again.
  std::vector<int8_t> mayTry;
};

// Collective over the communicator: a connection to every rank for host
// buffers (Setup's FIFO shape: BRAID_SLOT_BYTES, BRAID_SLOTS). Throws
// Error(InvalidArgument) naming BRAID_TRANSPORT for a name that is no
// transport built here or one that cannot reach some peer, naming a use
// knob that ranks set differently; Error(SystemError) when a transport
// asked for (named by BRAID_TRANSPORT, or its knob ON) cannot start.
Wiring wireUp(const Setup& setup);

// The row that carries host buffers between ranks `a` and `b` once
// wireUp() made `hosts`.
const TableRow& hostRow(const Wiring& hosts, const bootstrap::Bootstrap& bootstrap, int a, int b);

// The bits of every table row that some pair of ranks uses (bit i:
// table()[i]), the loopback's included: the same on every rank, with no
// word between them, as every rank chooses alike for every pair.
uint32_t rowsUsed(const Wiring& hosts, const bootstrap::Bootstrap& bootstrap);

// The tuner's link models, from the rows that some pair uses (rowsUsed()),
// so that every rank models alike.
struct LinkModels {
  algo::LinkModel host;
  algo::LinkModel device;
  // Pairs of ranks on one host and pairs across hosts take different
  // kinds of links (host.hostLatency and hostBandwidth are the former's).
  bool mixed = false;
  // Some pair takes a transport that can carry messages by address.
  bool byAddress = false;
};
LinkModels linkModels(uint32_t rows);

// Collective over the communicator: device connections to every peer on
// Setup's device (FIFO shape: BRAID_DEVICE_SLOT_BYTES, BRAID_DEVICE_SLOTS),
// each pair over the row its host buffers name (table.cc). Several rows
// combine into one DeviceTransport.
std::unique_ptr<DeviceTransport> wireDevice(const Setup& setup, const Wiring& hosts);

// Collective over the communicator: a second set of device connections,
// for ops captured into graphs, to the peers whose device buffers go
// through device memory both map (none to peers staged through the host).
std::unique_ptr<DeviceTransport> wireGraphDevice(const Setup& setup, const Wiring& hosts);

// Collective over the communicator: every rank's window of `bytes` at
// `base` (device memory of Setup's device), as this rank reaches it:
// mapped from every peer whose device buffers go through device memory
// both map, none from the others. unmapWindow() undoes it.
std::vector<PeerWindow> mapWindow(const Setup& setup, const Wiring& hosts, void* base,
                                  size_t bytes);
void unmapWindow(device::Device& device, const std::vector<PeerWindow>& windows, size_t bytes);

}  // namespace braid::transport
