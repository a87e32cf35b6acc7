// braid-info: what this braid build and this machine offer.
//
//   braid-info            version, build features, transports, host, interfaces
//   braid-info --config   every knob with its effective value and its source
//   braid-info --config --markdown   the knob table as a Markdown page (docs/knobs.md)
//   braid-info --peers    (under braid-run) the transport between every pair of ranks
//   braid-info --tuning   the algorithm braid picks per collective and size, and the
//                         time the cost model predicts for it
//   braid-info --algorithms [C] [--names]   every algorithm, from the catalog
//   braid-info --device   the device, its properties, and each device-seam call checked
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "algorithms/catalog.h"
#include "bootstrap/bootstrap.h"
#include "braid/communicator.h"
#include "braid/config.h"
#include "braid/error.h"
#include "braid/types.h"
#include "braid/version.h"
#include "core/introspect.h"
#include "core/knobs.h"
#include "device/device.h"
#include "tools/device_probe.h"
#include "transports/table.h"
#include "transports/wiring.h"
#include "tuning/algo_choice.h"

#if !defined(BRAID_HAVE_CUDA) || !defined(BRAID_HAVE_UCX) || !defined(BRAID_HAVE_IBVERBS) || \
    !defined(BRAID_HAVE_TLS)
#error "braid-info needs BRAID_FEATURE_DEFINITIONS (BRAID_HAVE_CUDA, _UCX, _IBVERBS, _TLS)"
#endif

namespace {

constexpr const char* kUsage =
    "usage: braid-info [--config [--markdown] | --peers |\n"
    "                   --tuning [--ranks N] [--transport T] [--measure] |\n"
    "                   --algorithms [COLLECTIVE] [--names] | --device]\n"
    "  (no option)  version, build features, transports, host identity, interfaces\n"
    "  --config     every knob with its effective value, its source and what it does;\n"
    "               with --markdown, the knob table alone (no values: the same on every\n"
    "               machine) as the Markdown page docs/knobs.md\n"
    "  --peers      run under braid-run -n N: the transport each rank uses to reach each\n"
    "               other rank\n"
    "  --tuning     for each collective and size (8 B to 1 GiB of float32), the algorithm\n"
    "               braid picks with this environment's knobs (BRAID_ALGO,\n"
    "               BRAID_ONESHOT_BYTES, BRAID_CHUNK_BYTES) and the time the alpha-beta\n"
    "               model of transport T (default: the first within a host, shm)\n"
    "               predicts for it at N ranks (default 2); the model's parameters head\n"
    "               the table. With --measure, run under braid-run -n N: the model a\n"
    "               communicator measures at creation (BRAID_TUNING=measured), at N ranks\n"
    "  --algorithms every algorithm braid has (the names BRAID_ALGO takes), or those of\n"
    "               COLLECTIVE: its schedule and cost per rank and the shapes it needs;\n"
    "               with --names, the names alone of COLLECTIVE's algorithms that run on\n"
    "               host buffers of ranks on one host (as braid-perf runs them), on one line\n"
    "  --device     the device braid would use (BRAID_DEVICE), each device's properties\n"
    "               (UUID, bus id, virtual memory management, POSIX-fd handles, dma-buf,\n"
    "               unified addressing), then every device-seam call made once and checked;\n"
    "               the first that fails ends it, named with its error (exit status 1)\n"
    "  -h, --help   print this help\n"
    "\n"
    "Hang reports: send SIGUSR1 to a rank (kill -USR1 PID; to braid-run, which passes it\n"
    "to every rank), or set BRAID_DUMP_ON_TIMEOUT=1 to have a timed-out op do it. Each\n"
    "communicator of the process logs one line, whatever BRAID_LOG_LEVEL says:\n"
    "  hang report (SIGUSR1): rank 1 of 4: collectives issued 812, completed 811,\n"
    "  0 async ops queued; in allReduce #811 (count 1024, float32, sum), step 3 of 6,\n"
    "  receiving from rank 0, sending to rank 2, waiting for 12.3 s\n"
    "'issued' counts the collectives started on the communicator (braid's own tuning\n"
    "trials included, alike on every rank), 'completed' those that finished here.\n"
    "Compare ranks: one whose issued count is lower than the others'\n"
    "has not called the collective they wait in (look at its program, not at braid);\n"
    "equal counts with every rank waiting point at the rank named in 'receiving from'\n"
    "that is itself waiting longest, or stopped. 'moving data' means the op is not\n"
    "stuck; 'no op running' that this rank waits in none.\n";

const char* yesNo(int on) { return on ? "yes" : "no"; }

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
  return out;
}

struct Interface {
  std::string name;
  std::string family;
  std::string address;
  std::string notes;
};

std::vector<Interface> interfaces() {
  std::vector<Interface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* ifa = list; ifa; ifa = ifa->ifa_next) {
    if (!ifa->ifa_addr) continue;
    int family = ifa->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw = family == AF_INET
                          ? static_cast<const void*>(
                                &reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr)->sin_addr)
                          : static_cast<const void*>(
                                &reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr)->sin6_addr);
    if (!inet_ntop(family, raw, text, sizeof(text))) continue;
    std::vector<std::string> notes;
    if (ifa->ifa_flags & IFF_LOOPBACK) notes.emplace_back("loopback");
    if (!(ifa->ifa_flags & IFF_UP)) notes.emplace_back("down");
    out.push_back({ifa->ifa_name, family == AF_INET ? "inet" : "inet6", text, join(notes, ", ")});
  }
  freeifaddrs(list);
  // Each interface's addresses together, interfaces in the kernel's order.
  std::vector<std::string> order;
  for (const Interface& i : out)
    if (std::find(order.begin(), order.end(), i.name) == order.end()) order.push_back(i.name);
  auto position = [&](const Interface& i) {
    return std::find(order.begin(), order.end(), i.name) - order.begin();
  };
  std::stable_sort(out.begin(), out.end(), [&](const Interface& a, const Interface& b) {
    return position(a) < position(b);
  });
  return out;
}

int printOverview() {
  std::printf("braid %s\n", BRAID_VERSION_STRING);
  // What the build found, and the device this process would use.
  std::printf("found at build:   cuda toolkit %s, ucx %s, ibverbs %s, tls %s\n",
              yesNo(BRAID_HAVE_CUDA), yesNo(BRAID_HAVE_UCX), yesNo(BRAID_HAVE_IBVERBS),
              yesNo(BRAID_HAVE_TLS));
  if (braid::device::Device* device = braid::device::current())
    std::printf("memory:           host, device (%s, %d devices, current %d)\n", device->name(),
                device->count(), device->current());
  else
    std::printf("memory:           host (no device: %s)\n",
                braid::device::unavailableReason().c_str());
  std::printf("transports built: %s\n", join(braid::detail::builtTransports(), ", ").c_str());
  std::printf("transports, in priority order (BRAID_TRANSPORT overrides it):\n");
  for (const braid::transport::TableRow& row : braid::transport::table()) {
    const braid::transport::TransportEntry& entry = row.entry;
    const char* carries = !entry.notBuilt.empty()              ? "-"
                          : entry.create && entry.createDevice ? "host, device"
                          : entry.create                       ? "host"
                                                               : "device";
    const std::string status = braid::detail::transportStatus(entry.name);
    std::printf("  %-9s %-13s %s\n", entry.name, carries,
                status.empty() ? entry.summary : ("not usable here: " + status).c_str());
  }
  std::printf("host identity:    %s\n", braid::bootstrap::localHostId().c_str());
  std::vector<Interface> found = interfaces();
  std::printf("network interfaces:%s\n", found.empty() ? " none found" : "");
  size_t nameWidth = 0, addressWidth = 0;
  for (const Interface& i : found) {
    nameWidth = std::max(nameWidth, i.name.size());
    addressWidth = std::max(addressWidth, i.address.size());
  }
  for (const Interface& i : found) {
    if (i.notes.empty()) {
      std::printf("  %-*s  %-5s  %s\n", static_cast<int>(nameWidth), i.name.c_str(),
                  i.family.c_str(), i.address.c_str());
    } else {
      std::printf("  %-*s  %-5s  %-*s  (%s)\n", static_cast<int>(nameWidth), i.name.c_str(),
                  i.family.c_str(), static_cast<int>(addressWidth), i.address.c_str(),
                  i.notes.c_str());
    }
  }
  return 0;
}

int printConfig() {
  std::vector<braid::KnobValue> knobs = braid::Knobs::describe(braid::Config{});
  struct Row {
    std::string name, value, source, doc;
  };
  std::vector<Row> rows = {{"name", "value", "source", "description"}};
  for (const braid::KnobValue& k : knobs) {
    std::string doc = k.knob->doc;
    doc += std::string(" [") + k.knob->type + ", default \"" + k.knob->defaultValue + "\"";
    if (k.knob->alias) doc += std::string(", alias ") + k.knob->alias;
    doc += "]";
    rows.push_back({k.knob->name, k.value.empty() ? "\"\"" : k.value, k.source, doc});
  }
  size_t w[3] = {0, 0, 0};
  for (const Row& r : rows) {
    w[0] = std::max(w[0], r.name.size());
    w[1] = std::max(w[1], r.value.size());
    w[2] = std::max(w[2], r.source.size());
  }
  for (const Row& r : rows)
    std::printf("%-*s  %-*s  %-*s  %s\n", static_cast<int>(w[0]), r.name.c_str(),
                static_cast<int>(w[1]), r.value.c_str(), static_cast<int>(w[2]), r.source.c_str(),
                r.doc.c_str());
  return 0;
}

// Text for a Markdown table cell: characters that would end the cell or
// start markup are escaped.
std::string markdownCell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|' || c == '\\' || c == '*' || c == '`' || c == '<' || c == '>') out += '\\';
    out += c;
  }
  return out;
}

// The knob table as the page docs/knobs.md. Reads the table only, never the
// environment, so every machine prints the same page.
int printConfigMarkdown() {
  std::printf(
      "# Knobs\n\n"
      "This page is generated from braid's knob table by `braid-info --config --markdown`; "
      "after changing the table, regenerate it with "
      "`build/bin/braid-info --config --markdown > docs/knobs.md` "
      "(the test `Tools.KnobsPageMatchesTheKnobTable` fails until then).\n\n"
      "| knob | type | default | alias | what it does |\n"
      "| --- | --- | --- | --- | --- |\n");
  for (const braid::KnobInfo& k : braid::knobTable()) {
    const std::string value = k.defaultValue;
    std::printf("| `%s` | %s | %s | %s | %s |\n", k.name, k.type,
                value.empty() ? "(empty)" : ("`" + value + "`").c_str(),
                k.alias ? (std::string("`") + k.alias + "`").c_str() : "",
                markdownCell(k.doc).c_str());
  }
  return 0;
}

// Gathers one fixed-size, NUL-padded text field per entry from every rank.
// `mine` holds this rank's entries; the result holds size() * mine.size().
std::vector<std::string> gatherText(braid::Communicator& comm, const std::vector<std::string>& mine,
                                    size_t width) {
  std::vector<uint8_t> send(mine.size() * width, 0);
  for (size_t i = 0; i < mine.size(); ++i)
    std::memcpy(&send[i * width], mine[i].data(), std::min(mine[i].size(), width - 1));
  std::vector<uint8_t> recv(send.size() * comm.size(), 0);
  comm.allGather(send.data(), recv.data(), send.size(), braid::DataType::Uint8).wait();
  std::vector<std::string> out;
  for (size_t i = 0; i < recv.size(); i += width) {
    const char* field = reinterpret_cast<const char*>(&recv[i]);
    out.emplace_back(field, strnlen(field, width));
  }
  return out;
}

int printPeers() {
  constexpr size_t kTransportWidth = 16;
  constexpr size_t kHostWidth = 128;
  braid::Communicator comm = braid::Communicator::fromEnvironment();
  int n = comm.size();
  std::vector<std::string> row = braid::detail::peerTransports(comm);
  if (static_cast<int>(row.size()) != n) {
    std::fprintf(stderr, "braid-info: rank %d: peerTransports gave %zu entries for %d ranks\n",
                 comm.rank(), row.size(), n);
    return 1;
  }
  std::vector<std::string> matrix = gatherText(comm, row, kTransportWidth);
  // Device paths: every rank has some, or none has (the communicator then
  // has no device connections at all).
  constexpr size_t kPathWidth = 48;  // "cuda_ipc: staged through host memory" and more
  std::vector<std::string> paths = braid::detail::peerDevicePaths(comm);
  if (paths.empty()) paths.assign(static_cast<size_t>(n), "");
  std::vector<std::string> pathMatrix = gatherText(comm, paths, kPathWidth);
  std::vector<std::string> hosts = gatherText(comm, {braid::bootstrap::localHostId()}, kHostWidth);
  // How host buffers' pieces travel: the connections' ways, and the size
  // from which each rank sends by address (where some peer reads so).
  constexpr size_t kCopyWidth = 48;  // "slots, memAlloc in place, by address"
  std::vector<std::string> copyMatrix =
      gatherText(comm, braid::detail::peerCopyPaths(comm), kCopyWidth);
  const size_t from = braid::detail::addressFrom(comm);
  std::string sizes =
      from == 0 ? std::string("never") : "from " + std::to_string(from / 1024) + " KiB";
  // (Measured: the first guess; ops of 4 KiB and more choose again as
  // they run, tuning/copy_choice.h.)
  if (braid::detail::copyPathAdapts(comm))
    sizes += " at first; ops of 4 KiB and up time their copy paths as they run";
  std::vector<std::string> addressFrom = gatherText(comm, {sizes}, kCopyWidth + 32);
  bool anyAddress = false;
  for (const std::string& paths : copyMatrix)
    anyAddress |= paths.find("address") != std::string::npos;
  if (!anyAddress) addressFrom.clear();
  if (comm.rank() != 0) return 0;

  std::printf("%d ranks\n", n);
  for (int r = 0; r < n; ++r) std::printf("  rank %d: host %s\n", r, hosts[r].c_str());
  // The hosts, in order of their first rank, with the ranks each holds.
  std::vector<std::string> distinct;
  for (const std::string& host : hosts)
    if (std::find(distinct.begin(), distinct.end(), host) == distinct.end())
      distinct.push_back(host);
  std::printf("%zu host%s:\n", distinct.size(), distinct.size() == 1 ? "" : "s");
  for (size_t h = 0; h < distinct.size(); ++h) {
    std::printf("  host %zu: ranks", h);
    for (int r = 0; r < n; ++r)
      if (hosts[r] == distinct[h]) std::printf(" %d", r);
    std::printf("\n");
  }
  std::printf("transport from rank (row) to rank (column):\n");
  size_t width = std::to_string(n - 1).size();
  for (const std::string& t : matrix) width = std::max(width, t.size());
  int label = static_cast<int>(std::to_string(n - 1).size());
  std::printf("  %*s", label, "");
  for (int c = 0; c < n; ++c) std::printf("  %*d", static_cast<int>(width), c);
  std::printf("\n");
  for (int r = 0; r < n; ++r) {
    std::printf("  %*d", label, r);
    for (int c = 0; c < n; ++c)
      std::printf("  %*s", static_cast<int>(width), matrix[static_cast<size_t>(r) * n + c].c_str());
    std::printf("\n");
  }
  std::printf("host buffers' pieces from rank (row) to rank (column) can travel%s:\n",
              addressFrom.empty() ? "" : " (by address: from the size each rank says)");
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < n; ++c)
      if (r != c)
        std::printf("  %*d -> %-*d  %s\n", label, r, label, c,
                    copyMatrix[static_cast<size_t>(r) * n + c].c_str());
  for (int r = 0; r < n && !addressFrom.empty(); ++r)
    std::printf("  rank %*d sends pieces by address %s\n", label, r, addressFrom[r].c_str());
  if (pathMatrix[0].empty()) return 0;
  std::printf("device buffers from rank (row) to rank (column):\n");
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < n; ++c)
      std::printf("  %*d -> %-*d  %s\n", label, r, label, c,
                  pathMatrix[static_cast<size_t>(r) * n + c].c_str());
  return 0;
}

int printTuning(int ranks, const std::string& transport, bool measure) {
  using braid::algo::Collective;
  const braid::Knobs knobs = braid::Knobs::resolve(braid::Config{});
  const braid::tuning::AlgoPreference preference = braid::tuning::AlgoPreference::parse(knobs.algo);
  braid::algo::SimOptions options;
  const braid::transport::TransportEntry* entry = braid::transport::find(transport);
  if (!entry || !entry->create)
    throw std::runtime_error("--transport: '" + transport +
                             "' is no transport of host buffers in this library (" +
                             join(braid::detail::builtTransports(), ", ") + ")");
  options.link = entry->hostLink;
  options.checkData = false;
  options.elemSize = 4;
  options.chunkBytes = knobs.chunkBytes;
  std::string source = transport + "'s default costs";
  if (knobs.deterministic) {
    options.link = braid::transport::linkModels(0).host;
    source = "the same default costs over every transport (BRAID_DETERMINISTIC=1)";
  }
  if (measure) {
    braid::Communicator comm = braid::Communicator::fromEnvironment();
    ranks = comm.size();
    if (!braid::detail::tuningLink(comm, &options.link))
      throw std::runtime_error("--measure: BRAID_TUNING is fixed: there is no model to measure");
    if (comm.rank() != 0) return 0;
    if (knobs.tuning == braid::Tuning::Measured && !knobs.deterministic)
      source = "costs measured at creation";
  }
  const bool modelled = knobs.tuning != braid::Tuning::Fixed;
  std::printf(
      "braid-info --tuning: %d ranks, %s: latency %.3g us, %.3g GB/s per link, copies %.3g "
      "GB/s, reductions %.3g GB/s; BRAID_ALGO '%s', BRAID_TUNING %s\n",
      ranks, source.c_str(), options.link.latency * 1e6, options.link.bandwidth / 1e9,
      options.link.copyBandwidth / 1e9, options.link.reduceBandwidth / 1e9, knobs.algo.c_str(),
      braid::tuningName(knobs.tuning));
  std::printf("%-14s %10s  %-13s %14s\n", "collective", "size", "algorithm", "predicted us");
  for (Collective c : {Collective::AllReduce, Collective::Broadcast, Collective::Reduce,
                       Collective::AllGather, Collective::ReduceScatter}) {
    const bool gathered = c == Collective::AllGather || c == Collective::ReduceScatter;
    for (size_t bytes = 8; bytes <= (size_t{1} << 30); bytes *= 8) {
      braid::algo::Shape shape;
      shape.nranks = ranks;
      shape.elemSize = options.elemSize;
      shape.count = std::max<size_t>(1, bytes / options.elemSize / (gathered ? ranks : 1));
      shape.alignElems = 16;
      shape.chunkElems = std::max<size_t>(16, knobs.chunkBytes / options.elemSize / 16 * 16);
      const braid::algo::Algorithm a = braid::tuning::choose(
          c, shape, preference, knobs.oneShotBytes, modelled ? &options.link : nullptr);
      const braid::algo::SimResult result =
          braid::algo::simulate(c, a, ranks, shape.count, 0, options);
      if (!result.problem.empty()) throw std::runtime_error(result.problem);
      std::printf("%-14s %10zu  %-13s %14.2f\n", braid::algo::collectiveName(c), bytes,
                  braid::algo::algorithmName(a), result.seconds * 1e6);
    }
  }
  return 0;
}

// Whether `algorithm` runs `collective` on host buffers of ranks on one
// host (as braid-perf runs it) at some rank count.
bool runsOnOneHost(braid::algo::Collective collective, braid::algo::Algorithm algorithm) {
  for (int n = 2; n <= 64; ++n) {
    braid::algo::Shape shape;
    shape.nranks = n;
    shape.localRanks = n;
    shape.count = 1;
    shape.elemSize = 4;
    if (braid::algo::applies(collective, algorithm, shape)) return true;
  }
  return false;
}

// The catalog of algorithms, whole or for the collective `only` names; with
// `names`, those of `only` that run on one host, by name alone. Send and
// receive have one plan each, nothing to choose: they are left out.
int printAlgorithms(const std::string& only, bool names) {
  using braid::algo::Collective;
  auto chosen = [](Collective c) { return c != Collective::Send && c != Collective::Recv; };
  Collective collective{};
  if (!only.empty() && (!braid::algo::parseCollective(only, &collective) || !chosen(collective)))
    throw std::runtime_error("--algorithms: '" + only +
                             "' is not a collective with algorithms to choose from");
  if (names) {
    if (only.empty()) throw std::runtime_error("--algorithms --names: which collective?");
    std::string line;
    for (braid::algo::Algorithm a : braid::algo::algorithmsFor(collective))
      if (runsOnOneHost(collective, a))
        line += (line.empty() ? "" : " ") + std::string(braid::algo::algorithmName(a));
    std::printf("%s\n", line.c_str());
    return 0;
  }
  std::printf(
      "Per collective, each algorithm's name, its schedule and cost per rank, and what it\n"
      "needs where it does not apply at every shape. S is the bytes of a rank's buffer (its\n"
      "input block for allgather, its output block for reducescatter); n ranks, L on each of\n"
      "H hosts.\n");
  const braid::algo::AlgorithmInfo* previous = nullptr;
  for (const braid::algo::AlgorithmInfo& row : braid::algo::catalog()) {
    if (!chosen(row.collective) || (!only.empty() && row.collective != collective)) continue;
    if (!previous || previous->collective != row.collective)
      std::printf("%s\n", braid::algo::collectiveName(row.collective));
    previous = &row;
    std::printf("  %-13s %s\n", row.name, row.description);
    if (*row.rule.text) std::printf("  %-13s needs %s\n", "", row.rule.text);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  enum class Mode { Overview, Config, Peers, Tuning, Algorithms, Device } mode = Mode::Overview;
  std::string collective;  // --algorithms COLLECTIVE
  bool names = false;      // --algorithms --names
  int ranks = 2;
  std::string transport;  // --tuning --transport; default: the table's first within a host
  for (const braid::transport::TableRow& row : braid::transport::table())
    if (transport.empty() && row.entry.create &&
        row.entry.reach == braid::transport::Reach::SameHost)
      transport = row.entry.name;
  bool measure = false;
  bool markdown = false;  // --config --markdown
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    Mode chosen;
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--config") {
      chosen = Mode::Config;
    } else if (arg == "--peers") {
      chosen = Mode::Peers;
    } else if (arg == "--tuning") {
      chosen = Mode::Tuning;
    } else if (arg == "--algorithms") {
      chosen = Mode::Algorithms;
    } else if (arg == "--device") {
      chosen = Mode::Device;
    } else if (arg == "--names" && mode == Mode::Algorithms) {
      names = true;
      continue;
    } else if (mode == Mode::Algorithms && collective.empty() && arg[0] != '-') {
      collective = arg;
      continue;
    } else if ((arg == "--ranks" || arg == "--transport") && mode == Mode::Tuning && i + 1 < argc) {
      const std::string value = argv[++i];
      if (arg == "--transport") {
        transport = value;
        continue;
      }
      char* end = nullptr;
      const long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < 1 || n > 65536) {
        std::fprintf(stderr, "braid-info: --ranks: '%s' is not a rank count (1..65536)\n%s",
                     value.c_str(), kUsage);
        return 2;
      }
      ranks = static_cast<int>(n);
      continue;
    } else if (arg == "--measure" && mode == Mode::Tuning) {
      measure = true;
      continue;
    } else if (arg == "--markdown" && mode == Mode::Config) {
      markdown = true;
      continue;
    } else {
      std::fprintf(stderr, "braid-info: unknown option '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
    if (mode != Mode::Overview && mode != chosen) {
      std::fprintf(stderr,
                   "braid-info: --config, --peers, --tuning, --algorithms and --device are "
                   "exclusive\n%s",
                   kUsage);
      return 2;
    }
    mode = chosen;
  }
  try {
    switch (mode) {
      case Mode::Overview:
        return printOverview();
      case Mode::Config:
        return markdown ? printConfigMarkdown() : printConfig();
      case Mode::Peers:
        return printPeers();
      case Mode::Tuning:
        return printTuning(ranks, transport, measure);
      case Mode::Algorithms:
        return printAlgorithms(collective, names);
      case Mode::Device:
        return braid::tools::printDeviceProbe();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-info: %s\n", e.what());
    return 1;
  }
  return 0;
}
