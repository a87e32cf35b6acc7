// The transport table: every transport braid has, one entry each, in
// priority order.
//
// An entry says what the transport carries (host buffers, device buffers
// or both), which peers it can reach, how to create it (one signature for
// all), what the tuner assumes of its links, and, for the transports the
// automatic choice takes only where they work, the knob that governs that
// and the collective check that they do. Wiring (wiring.h) reads the table
// to choose a transport per pair of ranks; nothing else in braid asks for
// a transport by name. A transport's name appears in its own folder and in
// table.cc only.
//
// To add a transport: a folder under transports/ with its CMakeLists.txt
// (a CMake option where it needs a library), a function in it that returns
// its TransportEntry, and one line in table.cc. transports/self is the
// smallest whole example.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "algorithms/simulate.h"
#include "bootstrap/bootstrap.h"
#include "core/knobs.h"
#include "device/device.h"
#include "transports/device_transport.h"
#include "transports/transport.h"

namespace braid::transport {

struct Wiring;

// A communicator made from another by a shrink, as its transports see it:
// the parent's connections (`wiring`), each new rank's rank in the parent,
// and whether the parent is retired on this rank (it failed or was
// aborted, so it moves no byte again). A transport may take over what a
// retired parent's connection to a survivor holds instead of making it
// anew, where every rank's parent is retired.
struct Parent {
  const Wiring& wiring;
  std::vector<int> ranks;
  bool retired;
};

// What a transport's creation needs. Every create() takes the same one.
struct Setup {
  bootstrap::Bootstrap& bootstrap;  // the communicator's; used for connection set-up
  const Knobs& knobs;               // as the communicator resolved them
  size_t slotBytes;                 // the FIFO shape: host or device knobs, by what is created
  int slots;
  net::Deadline deadline;
  device::Device* device = nullptr;  // for device buffers: the device and its index
  int deviceIndex = -1;
  const Parent* parent = nullptr;  // host buffers after a shrink
};

// Which pairs of ranks a transport can connect.
enum class Reach : uint8_t {
  Self,      // a rank and itself
  SameHost,  // ranks on one host (same hostname, boot id and network namespace)
  AnyHost,   // any two ranks the bootstrap connected
};

// Creates this rank's connections to `peers` (every peer listed lists this
// rank too). Collective: every rank calls it once any pair of ranks takes
// the transport, also a rank with no peers in it. Either throws, or returns
// nullptr with `*whyNot` saying why (the same on every rank, so that all
// can pass the transport over together).
using CreateHost = std::unique_ptr<Transport> (*)(const Setup& setup, const std::vector<int>& peers,
                                                  std::string* whyNot);
using CreateDevice = std::unique_ptr<DeviceTransport> (*)(const Setup& setup,
                                                          const std::vector<int>& peers,
                                                          std::string* whyNot);

struct TransportEntry {
  TransportEntry(const char* name, Reach reach, const char* summary)
      : name(name), summary(summary), reach(reach) {}

  const char* name;
  const char* summary;  // one line, for braid-info
  Reach reach;

  // Host buffers; null where it carries none.
  CreateHost create = nullptr;
  // Device buffers; null where it carries none. Which pairs it serves is
  // the table's choice (table.cc: device buffers follow host buffers).
  CreateDevice createDevice = nullptr;

  // Where the automatic choice takes it only when the knob `useKnob`
  // allows (Knobs::*use: AUTO, ON, OFF) and everyRankCan() says it works
  // on every rank; null for a transport taken wherever it reaches.
  const char* useKnob = nullptr;
  TransportUse Knobs::*use = nullptr;
  // Collective. Whether every rank can use the transport under `use`
  // (AUTO or ON): true, or false after logging why (under AUTO the choice
  // passes it over); under ON a rank that cannot is an error that names
  // the knob. Null: it is tried as it is.
  bool (*everyRankCan)(const Setup& setup, TransportUse use) = nullptr;

  // Why this process could not use the transport (no library, no
  // device), or ""; for braid-info. Null: nothing to find out.
  std::string (*unusableHere)() = nullptr;

  // Device buffers that travel through device memory both ranks map
  // (windows, one-shot and two-shot kernels, buffers captured into
  // graphs): mapWindow()/unmapWindow() as in wiring.h; null otherwise.
  std::vector<PeerWindow> (*mapWindow)(const Setup& setup, const std::vector<int>& peers,
                                       void* base, size_t bytes) = nullptr;
  void (*unmapWindow)(device::Device& device, const std::vector<PeerWindow>& windows,
                      size_t bytes) = nullptr;

  // Its connections can carry messages by address
  // (Connection::carriesAddresses), where the peer may read this process.
  bool byAddress = false;

  // The tuner's alpha-beta model of its links (algorithms/simulate.h) for
  // host buffers and for device buffers, until a communicator measures
  // its own (tuning/calibration.h).
  algo::LinkModel hostLink;
  algo::LinkModel deviceLink;

  // Why this library has no such transport (not built), or "".
  std::string notBuilt;
};

// The table's rows in priority order, each with the row that carries
// device buffers between ranks whose host buffers take it (null for a
// transport that carries no host buffers).
struct TableRow {
  TransportEntry entry;
  const TransportEntry* deviceVia = nullptr;
};
const std::vector<TableRow>& table();

// The entry named `name`, or nullptr.
const TransportEntry* find(const std::string& name);

// The row that serves a rank's loopback (Reach::Self).
const TableRow& loopback();

// The names of the transports built into this library, in table order.
std::vector<std::string> builtTransports();

// Whether `entry` can connect ranks `a` and `b` (the same answer whichever
// asks, from the bootstrap's table alone).
bool canReach(const TransportEntry& entry, const bootstrap::Bootstrap& bootstrap, int a, int b);

// Collective over the communicator: the first rank for which `mine` is
// false on that rank, or -1 when it is true on every rank. For
// everyRankCan().
int firstRankWithout(const Setup& setup, bool mine);

}  // namespace braid::transport
