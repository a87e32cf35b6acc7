#include "core/knobs.h"

#include <strings.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>

#include "braid/error.h"
#include "core/errors.h"
#include "reduce/streaming.h"
#include "tuning/algo_choice.h"

namespace braid {

const std::vector<KnobInfo>& knobTable() {
  static const std::vector<KnobInfo> table = {
      {"BRAID_TIMEOUT", "duration", "300s",
       "deadline of every wait (init, each op, destroy); a bare number is seconds; an op "
       "waits a quarter more (at most 1 s) for a peer to say whom it blames",
       nullptr},
      {"BRAID_TRANSPORT", "list", "",
       "ordered transports of host buffers to use, e.g. \"tcp\" or \"shm,ibverbs\" (braid-info "
       "lists those built, in the order braid prefers them); empty picks the best per peer",
       nullptr},
      {"BRAID_SOCKET_IFNAME", "string", "",
       "network interface for bootstrap and TCP; empty uses the one that routes to the root",
       "NCCL_SOCKET_IFNAME"},
      {"BRAID_SOCKET_KEY_FILE", "string", "",
       "a file holding a secret of at least 32 bytes (a trailing newline dropped): braid's TCP "
       "sockets then carry TLS 1.3 with a key made from it; every process of a job names the "
       "same secret (ncclSetEncryption sets one from the program); read once per process",
       nullptr},
      {"BRAID_UCX", "string", "AUTO",
       "AUTO: ranks on different hosts use ucx where it is built, every rank has an RDMA device "
       "(InfiniBand, RoCE; over plain TCP braid's tcp is faster) and it starts on every rank, "
       "else tcp; ON: ucx between hosts, failing to start it is an error; OFF: tcp "
       "(BRAID_TRANSPORT=ucx still selects it)",
       nullptr},
      {"BRAID_SYSFS", "string", "/sys",
       "where braid looks for devices (class/infiniband); tests point it at recorded samples",
       nullptr},
      {"BRAID_IBVERBS", "string", "AUTO",
       "AUTO: ranks on different hosts use ibverbs where it is built and every rank has an "
       "active RDMA port, else ucx or tcp; ON: ibverbs between hosts, failing to start it is an "
       "error; OFF: never chosen automatically (BRAID_TRANSPORT=ibverbs still selects it)",
       nullptr},
      {"BRAID_IB_HCA", "string", "",
       "RDMA devices and ports to use, NCCL's syntax: mlx5 (prefix), =mlx5_1 (exact), "
       "^mlx5_0 (all but), mlx5_0:1 (a port); empty: every active port, the first serving",
       "NCCL_IB_HCA"},
      {"BRAID_IB_GID_INDEX", "int", "-1",
       "GID index of a RoCE port; -1 takes a RoCE v2 GID from sysfs, IPv4-mapped first",
       "NCCL_IB_GID_INDEX"},
      {"BRAID_IB_TIMEOUT", "int", "20", "RC QP ACK timeout, 4.096 us x 2^value (1 to 31)",
       "NCCL_IB_TIMEOUT"},
      {"BRAID_IB_RETRY_CNT", "int", "7", "RC QP retries before a send fails (0 to 7)",
       "NCCL_IB_RETRY_CNT"},
      {"BRAID_IB_QPS_PER_CONNECTION", "int", "1",
       "QPs per connection (1 to 16); messages of 128 KiB and more are striped over them",
       "NCCL_IB_QPS_PER_CONNECTION"},
      {"BRAID_IB_GDR", "string", "AUTO",
       "device buffers over ibverbs: AUTO reads and writes device memory directly (GPUDirect "
       "RDMA, dma-buf) where the GPU and the NIC allow it, else stages through page-locked host "
       "memory; ON: GPUDirect RDMA or an error; OFF: always staged",
       nullptr},
      {"BRAID_IB_FAKE", "string", "",
       "tests: the name of a fake fabric (shared memory) that the ibverbs transport runs over "
       "instead of libibverbs; every rank of a job names the same one",
       nullptr},
      {"BRAID_IB_FAKE_FAULT", "string", "",
       "tests: a fault the fake fabric injects: retry@N, rkey@N or flush@N (the N-th send "
       "work request of this process)",
       nullptr},
      {"BRAID_CHUNK_BYTES", "bytes", "1M",
       "pipeline chunk of a collective step (at most half a connection's FIFO)", nullptr},
      {"BRAID_SLOT_BYTES", "bytes", "256K", "bytes per FIFO slot of a connection", nullptr},
      {"BRAID_SLOTS", "int", "8", "slots per FIFO of a connection", nullptr},
      {"BRAID_NSOCKS_PERTHREAD", "int", "1",
       "sockets per tcp connection (1 to 16), messages taking turns on them; braid drives them "
       "all from the executor's thread, so NCCL_SOCKET_NTHREADS has no counterpart",
       nullptr},
      {"BRAID_DEVICE", "string", "auto",
       "device memory: auto (CUDA where built and a GPU is present, else none), cuda, emulated "
       "(host memory posing as a GPU, for tests) or none",
       nullptr},
      {"BRAID_DEVICE_SLOT_BYTES", "bytes", "4M",
       "bytes per FIFO slot of a device connection (cuda_ipc); a step's piece is at most this",
       nullptr},
      {"BRAID_DEVICE_SLOTS", "int", "4", "slots per FIFO of a device connection", nullptr},
      {"BRAID_DEVICE_GRAPHS", "int", "1",
       "1: a device communicator also sets up FIFOs (as large as the ordinary ones) for ops "
       "captured into CUDA graphs; 0: it does not, and capturing its ops is refused",
       nullptr},
      {"BRAID_EMULATED_PEER_ACCESS", "int", "1",
       "0: the emulated device's devices do not reach each other (FIFOs between them are then "
       "staged through host memory, as between GPUs without peer access)",
       nullptr},
      {"BRAID_EMULATED_VISIBLE_DEVICES", "string", "",
       "the emulated GPUs (0 to 7) this process sees, in order, as CUDA_VISIBLE_DEVICES names "
       "GPUs: \"2\" makes GPU 2 its device 0; empty: all 8",
       nullptr},
      {"BRAID_EMULATED_FD_HANDLES", "int", "1",
       "0: the emulated device cannot export its memory to other processes, as a GPU without "
       "cuMem POSIX-fd handles (FIFOs to other processes are then staged through host memory)",
       nullptr},
      {"BRAID_ONESHOT_BYTES", "bytes", "4K",
       "with BRAID_TUNING=fixed, all-reduces up to this size send every input to every rank "
       "(one hop; max 64K)",
       nullptr},
      {"BRAID_ALGO", "list", "",
       "algorithms to use, each for every collective that has it or for one, e.g. "
       "\"allreduce:tree,broadcast:binomial\" (braid-info --algorithms lists them); empty lets "
       "braid choose (NCCL_ALGO's Ring, Tree and PAT map to braid's nearest)",
       "NCCL_ALGO"},
      {"BRAID_TUNING", "string", "measured",
       "how braid picks algorithms BRAID_ALGO leaves open: measured (fastest by an alpha-beta "
       "model of costs measured at creation), model (the same with each transport's default "
       "costs) or fixed (one-shot, then ring; chain)",
       nullptr},
      {"BRAID_DETERMINISTIC", "int", "0",
       "1: all-reduce and reduce-scatter results bitwise the same from run to run (the "
       "algorithm depends on rank count, size and knobs only, never on timing or transport)",
       nullptr},
      {"BRAID_DUMP_ON_TIMEOUT", "int", "0",
       "1: an op that times out first logs its rank's hang report (as on SIGUSR1; see "
       "braid-info -h)",
       nullptr},
      {"BRAID_DEBUG_COLLECTIVES", "int", "0",
       "1: before each collective the ranks compare what they called (collective, type, count, "
       "op, root) and fail naming the ranks that differ, instead of mixing data or hanging",
       nullptr},
      {"BRAID_DIRECT_BYTES", "bytes", "4K",
       "pieces of at least this size in braid::memAlloc memory are read in place by same-host "
       "peers instead of copied through slots; 0 turns this off",
       nullptr},
      {"BRAID_CMA_BYTES", "bytes", "auto",
       "pieces of at least this size travel between processes of one host in one copy: the "
       "receiver reads them where they lie in the sender (process_vm_readv, where the ptrace "
       "policy allows it) instead of through slots; auto: from the size at which that was "
       "measured faster at creation, and then ops of 4 KiB and more time slots and slots "
       "written with streaming stores (from 128 KiB addresses too) now and then and take the "
       "fastest; a size fixes it (0: never, slots only)",
       nullptr},
      {"BRAID_STREAM_BYTES", "bytes", "auto",
       "host ops whose output is at least this big write it with streaming stores, past the "
       "cache, where nothing reads it again soon; auto: half the last-level cache; 0: never",
       nullptr},
      {"BRAID_LOG_LEVEL", "string", "warn", "off, warn, info, debug or trace", "NCCL_DEBUG"},
      {"BRAID_LOG_SUBSYS", "list", "all",
       "subsystems to log: init, bootstrap, net, exec, coll, env; ^ first leaves them out",
       "NCCL_DEBUG_SUBSYS"},
      {"BRAID_LOG_FILE", "string", "", "log to this file instead of stderr (%p = pid)", nullptr},
  };
  return table;
}

const char* tuningName(Tuning tuning) {
  switch (tuning) {
    case Tuning::Measured:
      return "measured";
    case Tuning::Model:
      return "model";
    case Tuning::Fixed:
      return "fixed";
  }
  return "?";
}

const char* transportUseName(TransportUse use) {
  switch (use) {
    case TransportUse::Auto:
      return "AUTO";
    case TransportUse::On:
      return "ON";
    case TransportUse::Off:
      return "OFF";
  }
  return "?";
}

TransportUse parseTransportUse(const std::string& text, const char* knob) {
  for (TransportUse use : {TransportUse::Auto, TransportUse::On, TransportUse::Off})
    if (strcasecmp(text.c_str(), transportUseName(use)) == 0) return use;
  throw Error(ErrorCode::InvalidArgument,
              format("braid: %s: '%s' is not AUTO, ON or OFF", knob, text.c_str()));
}

std::string getEnv(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

namespace {

[[noreturn]] void badValue(const char* what, const std::string& text, const char* expected) {
  throw Error(ErrorCode::InvalidArgument,
              format("braid: %s: '%s' is not %s", what, text.c_str(), expected));
}

// Splits "1500ms" into 1500 and "ms".
bool splitNumber(const std::string& text, double* number, std::string* unit) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return false;
  char* end = nullptr;
  std::string digits = text.substr(0, i);
  *number = std::strtod(digits.c_str(), &end);
  if (end != digits.c_str() + digits.size()) return false;
  *unit = text.substr(i);
  for (char& c : *unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return true;
}

const KnobInfo& knob(const char* name) {
  for (const KnobInfo& info : knobTable())
    if (std::string(info.name) == name) return info;
  throw Error(ErrorCode::Internal, format("braid: no knob named %s", name));
}

// The knob's text and where it came from: the braid name, then its alias,
// then the default.
std::pair<std::string, std::string> lookup(const KnobInfo& info) {
  if (std::string value = getEnv(info.name); !value.empty())
    return {value, format("environment (%s)", info.name)};
  if (info.alias)
    if (std::string value = getEnv(info.alias); !value.empty())
      return {value, format("environment (%s)", info.alias)};
  return {info.defaultValue, "default"};
}

// A knob that is 0 or 1.
bool flag(const char* name) {
  const long long value = parseInt(lookup(knob(name)).first, name);
  if (value != 0 && value != 1)
    throw Error(ErrorCode::InvalidArgument, format("braid: %s: %lld is not 0 or 1", name, value));
  return value == 1;
}

}  // namespace

std::chrono::milliseconds parseDuration(const std::string& text, const char* what) {
  double number = 0;
  std::string unit;
  if (!splitNumber(text, &number, &unit)) badValue(what, text, "a duration such as 30s or 1500ms");
  double ms;
  if (unit.empty() || unit == "s") {
    ms = number * 1000;
  } else if (unit == "ms") {
    ms = number;
  } else if (unit == "m" || unit == "min") {
    ms = number * 60000;
  } else {
    badValue(what, text, "a duration such as 30s or 1500ms");
  }
  // Longer than any deadline braid keeps (a year; see Knobs::resolve), and
  // far from overflowing the conversion.
  if (!(ms < 1e15)) badValue(what, text, "a duration of at most 1e15 ms");
  return std::chrono::milliseconds(static_cast<long long>(ms));
}

size_t parseBytes(const std::string& text, const char* what) {
  double number = 0;
  std::string unit;
  if (!splitNumber(text, &number, &unit)) badValue(what, text, "a size such as 4096 or 16M");
  if (unit.size() > 1 && unit.back() == 'b') unit.pop_back();  // "kb", "kib" -> "k", "ki"
  if (unit.size() > 1 && unit.back() == 'i') unit.pop_back();  // "ki" -> "k"
  double scale;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "k") {
    scale = 1024.0;
  } else if (unit == "m") {
    scale = 1024.0 * 1024;
  } else if (unit == "g") {
    scale = 1024.0 * 1024 * 1024;
  } else {
    badValue(what, text, "a size such as 4096 or 16M");
  }
  const double bytes = number * scale;
  if (!(bytes < 9.0e18)) badValue(what, text, "a size below 8 EiB");
  return static_cast<size_t>(bytes);
}

long long parseInt(const std::string& text, const char* what) {
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text.c_str(), &end, 10);
  const bool digitFirst = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) ||
                                            (text[0] == '-' && text.size() > 1));
  if (!digitFirst || *end != '\0' || errno == ERANGE || value < INT_MIN || value > INT_MAX)
    badValue(what, text, "an integer in the int range");
  return value;
}

std::string knobText(const char* name) { return lookup(knob(name)).first; }

Knobs Knobs::resolve(const Config& config) {
  Knobs knobs;
  knobs.timeout = config.timeout.count() > 0
                      ? config.timeout
                      : parseDuration(lookup(knob("BRAID_TIMEOUT")).first, "BRAID_TIMEOUT");
  if (knobs.timeout.count() <= 0)
    throw Error(ErrorCode::InvalidArgument, "braid: BRAID_TIMEOUT must be positive");
  knobs.timeout = std::min(knobs.timeout, kLongestTimeout);
  knobs.transports =
      config.transports.empty() ? lookup(knob("BRAID_TRANSPORT")).first : config.transports;
  knobs.socketIfname =
      config.socketIfname.empty() ? lookup(knob("BRAID_SOCKET_IFNAME")).first : config.socketIfname;
  knobs.slotBytes = parseBytes(lookup(knob("BRAID_SLOT_BYTES")).first, "BRAID_SLOT_BYTES");
  knobs.slots = static_cast<int>(parseInt(lookup(knob("BRAID_SLOTS")).first, "BRAID_SLOTS"));
  if (knobs.slotBytes < 4096 || knobs.slotBytes % 64 != 0 || knobs.slotBytes > (1u << 30))
    throw Error(ErrorCode::InvalidArgument,
                "braid: BRAID_SLOT_BYTES must be a multiple of 64 between 4K and 1G");
  if (knobs.slots < 2 || knobs.slots > 512)
    throw Error(ErrorCode::InvalidArgument, "braid: BRAID_SLOTS must be between 2 and 512");
  knobs.sockets = static_cast<int>(
      parseInt(lookup(knob("BRAID_NSOCKS_PERTHREAD")).first, "BRAID_NSOCKS_PERTHREAD"));
  if (knobs.sockets < 1 || knobs.sockets > 16)
    throw Error(ErrorCode::InvalidArgument,
                "braid: BRAID_NSOCKS_PERTHREAD must be between 1 and 16");
  knobs.chunkBytes = config.chunkBytes > 0
                         ? config.chunkBytes
                         : parseBytes(lookup(knob("BRAID_CHUNK_BYTES")).first, "BRAID_CHUNK_BYTES");
  if (knobs.chunkBytes == 0)
    throw Error(ErrorCode::InvalidArgument, "braid: BRAID_CHUNK_BYTES must be positive");
  knobs.oneShotBytes = parseBytes(lookup(knob("BRAID_ONESHOT_BYTES")).first, "BRAID_ONESHOT_BYTES");
  if (knobs.oneShotBytes > 64 * 1024)
    throw Error(ErrorCode::InvalidArgument, "braid: BRAID_ONESHOT_BYTES must be at most 64K");
  const auto [algo, algoSource] = lookup(knob("BRAID_ALGO"));
  // NCCL_ALGO names NCCL's algorithms: braid's nearest stand in for them.
  knobs.algo =
      algoSource.find("NCCL_ALGO") != std::string::npos ? tuning::fromNcclAlgo(algo) : algo;
  tuning::AlgoPreference::parse(knobs.algo);  // rejects a bad list here, naming the knob
  const std::string tuning = lookup(knob("BRAID_TUNING")).first;
  if (tuning == "measured")
    knobs.tuning = Tuning::Measured;
  else if (tuning == "model")
    knobs.tuning = Tuning::Model;
  else if (tuning == "fixed")
    knobs.tuning = Tuning::Fixed;
  else
    throw Error(
        ErrorCode::InvalidArgument,
        format("braid: BRAID_TUNING: '%s' is not measured, model or fixed", tuning.c_str()));
  knobs.deterministic = flag("BRAID_DETERMINISTIC");
  knobs.dumpOnTimeout = flag("BRAID_DUMP_ON_TIMEOUT");
  knobs.debugCollectives = flag("BRAID_DEBUG_COLLECTIVES");
  if (config.device < -1)
    throw Error(ErrorCode::InvalidArgument,
                format("braid: Config::device is %d: a device index, or -1 for the current device",
                       config.device));
  knobs.device = config.device;
  knobs.directBytes = parseBytes(lookup(knob("BRAID_DIRECT_BYTES")).first, "BRAID_DIRECT_BYTES");
  const std::string cma = lookup(knob("BRAID_CMA_BYTES")).first;
  knobs.addressBytes =
      cma == "auto" || cma == "AUTO" ? kMeasuredAddressBytes : parseBytes(cma, "BRAID_CMA_BYTES");
  const std::string stream = lookup(knob("BRAID_STREAM_BYTES")).first;
  knobs.streamBytes = stream == "auto" || stream == "AUTO"
                          ? reduce::lastLevelCacheBytes() / 2
                          : parseBytes(stream, "BRAID_STREAM_BYTES");
  knobs.deviceSlotBytes =
      parseBytes(lookup(knob("BRAID_DEVICE_SLOT_BYTES")).first, "BRAID_DEVICE_SLOT_BYTES");
  knobs.deviceSlots =
      static_cast<int>(parseInt(lookup(knob("BRAID_DEVICE_SLOTS")).first, "BRAID_DEVICE_SLOTS"));
  knobs.deviceGraphs = flag("BRAID_DEVICE_GRAPHS");
  if (knobs.deviceSlotBytes < 4096 || knobs.deviceSlotBytes % 64 != 0 ||
      knobs.deviceSlotBytes > (1u << 30))
    throw Error(ErrorCode::InvalidArgument,
                "braid: BRAID_DEVICE_SLOT_BYTES must be a multiple of 64 between 4K and 1G");
  if (knobs.deviceSlots < 2 || knobs.deviceSlots > 64)
    throw Error(ErrorCode::InvalidArgument, "braid: BRAID_DEVICE_SLOTS must be between 2 and 64");
  // A device stream cannot wait for two things at once: every send that a
  // plan posts before it receives must fit in the FIFO unreceived (a
  // one-shot all-reduce sends up to 64 KiB to every peer first).
  if (knobs.deviceSlotBytes * static_cast<size_t>(knobs.deviceSlots) < 128 * 1024)
    throw Error(ErrorCode::InvalidArgument,
                format("braid: BRAID_DEVICE_SLOT_BYTES x BRAID_DEVICE_SLOTS is %zu bytes; a "
                       "device FIFO needs at least 128K",
                       knobs.deviceSlotBytes * static_cast<size_t>(knobs.deviceSlots)));
  knobs.ucx = parseTransportUse(lookup(knob("BRAID_UCX")).first, "BRAID_UCX");
  knobs.ibverbs = parseTransportUse(lookup(knob("BRAID_IBVERBS")).first, "BRAID_IBVERBS");
  knobs.deviceChunkBytes = knobs.deviceSlotBytes * static_cast<size_t>(knobs.deviceSlots) / 2;
  // A ring step never holds more than half a FIFO, so every rank can always
  // post its next piece and no ring can deadlock.
  size_t half = knobs.slotBytes * static_cast<size_t>(knobs.slots) / 2;
  if (knobs.chunkBytes > half) knobs.chunkBytes = half;
  if (knobs.oneShotBytes > half) knobs.oneShotBytes = half;  // every send fits, unreceived
  return knobs;
}

std::vector<KnobValue> Knobs::describe(const Config& config) {
  Knobs effective = resolve(config);
  std::vector<KnobValue> out;
  for (const KnobInfo& info : knobTable()) {
    auto [value, source] = lookup(info);
    std::string name = info.name;
    if (name == "BRAID_TIMEOUT") {
      value = std::to_string(effective.timeout.count()) + "ms";
      if (config.timeout.count() > 0) source = "config";
    } else if (name == "BRAID_TRANSPORT" && !config.transports.empty()) {
      value = config.transports, source = "config";
    } else if (name == "BRAID_SOCKET_IFNAME" && !config.socketIfname.empty()) {
      value = config.socketIfname, source = "config";
    } else if (name == "BRAID_CHUNK_BYTES") {
      value = std::to_string(effective.chunkBytes);
      if (config.chunkBytes > 0) source = "config";
    }
    out.push_back({&info, value, source});
  }
  return out;
}

}  // namespace braid
