// Every environment knob, declared once. Values are read when a communicator
// is created (Knobs::resolve) and never again; `braid-info --config` prints
// the table with each knob's effective value and where it came from.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "braid/config.h"

namespace braid {

struct KnobInfo {
  const char* name;          // environment variable, e.g. "BRAID_TIMEOUT"
  const char* type;          // "duration", "bytes", "int", "string", "list"
  const char* defaultValue;  // as a user would write it
  const char* doc;           // one line
  const char* alias;         // NCCL-style alias read when the braid name is unset, or nullptr
};

// The knob table, in the order braid-info prints it.
const std::vector<KnobInfo>& knobTable();

struct KnobValue {
  const KnobInfo* knob;
  std::string value;
  std::string source;  // "default", "environment (NAME)", "config"
};

// How braid picks the algorithms BRAID_ALGO leaves open (BRAID_TUNING).
enum class Tuning : uint8_t {
  Measured,  // the alpha-beta model, with costs measured at creation
  Model,     // the alpha-beta model, with each transport's default costs
  Fixed,     // fixed rules: one-shot, then ring; chain
};
const char* tuningName(Tuning tuning);

// Whether the automatic transport choice may take a network transport
// (ucx: BRAID_UCX, ibverbs: BRAID_IBVERBS) across hosts.
enum class TransportUse : uint8_t {
  Auto,  // where built and it starts on every rank; otherwise the next one
  On,    // where built; failing to start it is an error
  Off,   // never chosen automatically (BRAID_TRANSPORT naming it still selects it)
};
const char* transportUseName(TransportUse use);
// "AUTO", "ON" or "OFF" (any case). Throws Error(InvalidArgument) naming
// `knob` otherwise.
TransportUse parseTransportUse(const std::string& text, const char* knob);

// The longest timeout a communicator takes (a longer one is cut to it):
// deadlines are now + timeout on a nanosecond clock, kept far from overflow.
constexpr std::chrono::milliseconds kLongestTimeout = std::chrono::hours(24 * 365);
// Knobs::addressBytes when BRAID_CMA_BYTES is auto.
constexpr size_t kMeasuredAddressBytes = ~size_t{0};

// Effective values after Config, then the environment, then the defaults.
// Throws Error(InvalidArgument) naming the knob when a value does not parse.
struct Knobs {
  std::chrono::milliseconds timeout;  // at most kLongestTimeout
  std::string transports;             // comma-separated, empty = automatic
  std::string socketIfname;           // empty = the interface that routes to the root
  size_t chunkBytes;                  // bytes per pipeline chunk of a collective step
  size_t slotBytes;                   // bytes per FIFO slot of a connection
  int slots;                          // slots per FIFO
  int sockets;                        // BRAID_NSOCKS_PERTHREAD: sockets per tcp connection
  size_t oneShotBytes;                // all-reduces up to this size use the one-shot plan
  size_t directBytes;       // pieces from memAlloc memory at least this big go by reference
  size_t streamBytes;       // host outputs at least this big take streaming stores (0: none)
  size_t addressBytes;      // BRAID_CMA_BYTES: pieces from which same-host peers read by address
                            // (0: never; kMeasuredAddressBytes: as measured)
  std::string algo;         // BRAID_ALGO as given (see tuning::AlgoPreference)
  Tuning tuning;            // BRAID_TUNING
  bool deterministic;       // BRAID_DETERMINISTIC=1: the algorithm never depends on timing
  bool dumpOnTimeout;       // BRAID_DUMP_ON_TIMEOUT=1: a timed-out op logs the hang report
  bool debugCollectives;    // BRAID_DEBUG_COLLECTIVES=1: ranks compare every collective first
  int device;               // Config::device: the communicator's device, -1 = the current one
  size_t deviceSlotBytes;   // bytes per FIFO slot of a device connection
  int deviceSlots;          // slots per device FIFO
  bool deviceGraphs;        // BRAID_DEVICE_GRAPHS: set up the FIFOs of ops captured in graphs
  size_t deviceChunkBytes;  // pipeline chunk of a device plan's step: half a device FIFO
  TransportUse ucx;         // BRAID_UCX
  TransportUse ibverbs;     // BRAID_IBVERBS

  static Knobs resolve(const Config& config);
  static std::vector<KnobValue> describe(const Config& config);
};

// Parsers shared with the tools. Each throws Error(InvalidArgument) naming
// `what` when `text` does not parse.
// "300", "300s", "1500ms", "2m" -> milliseconds (a bare number is seconds).
std::chrono::milliseconds parseDuration(const std::string& text, const char* what);
// "4096", "64K", "16M", "1G", "8KiB" -> bytes.
size_t parseBytes(const std::string& text, const char* what);
long long parseInt(const std::string& text, const char* what);

// A knob's text as set (its name, then its alias, then the default), for
// the few read outside a communicator (BRAID_DEVICE, once per process).
std::string knobText(const char* name);

// The environment variable, or "" when unset.
std::string getEnv(const char* name);

}  // namespace braid
