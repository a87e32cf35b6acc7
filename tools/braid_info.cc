// braid-info: what this braid build and this machine offer.
//
//   braid-info            version, build features, transports, host, interfaces
//   braid-info --config   every knob with its effective value and its source
//   braid-info --peers    (under braid-run) the transport between every pair of ranks
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "braid/communicator.h"
#include "braid/config.h"
#include "braid/error.h"
#include "braid/types.h"
#include "braid/version.h"
#include "core/introspect.h"
#include "core/knobs.h"

#if !defined(BRAID_HAVE_CUDA) || !defined(BRAID_HAVE_UCX) || !defined(BRAID_HAVE_IBVERBS)
#error "braid-info needs BRAID_FEATURE_DEFINITIONS (BRAID_HAVE_CUDA, _UCX, _IBVERBS)"
#endif

namespace {

constexpr const char* kUsage =
    "usage: braid-info [--config | --peers]\n"
    "  (no option)  version, build features, transports, host identity, interfaces\n"
    "  --config     every knob with its effective value, its source and what it does\n"
    "  --peers      run under braid-run -n N: the transport each rank uses to reach each\n"
    "               other rank\n"
    "  -h, --help   print this help\n";

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
  // What the build found. No device or RDMA code ships yet: host memory
  // over tcp is what this build runs.
  std::printf("found at build:   cuda toolkit %s, ucx %s, ibverbs %s\n", yesNo(BRAID_HAVE_CUDA),
              yesNo(BRAID_HAVE_UCX), yesNo(BRAID_HAVE_IBVERBS));
  std::printf("memory:           host\n");
  std::printf("transports built: %s\n", join(braid::detail::builtTransports(), ", ").c_str());
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
  std::vector<std::string> hosts = gatherText(comm, {braid::bootstrap::localHostId()}, kHostWidth);
  if (comm.rank() != 0) return 0;

  std::printf("%d ranks\n", n);
  for (int r = 0; r < n; ++r) std::printf("  rank %d: host %s\n", r, hosts[r].c_str());
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
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  enum class Mode { Overview, Config, Peers } mode = Mode::Overview;
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
    } else {
      std::fprintf(stderr, "braid-info: unknown option '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
    if (mode != Mode::Overview && mode != chosen) {
      std::fprintf(stderr, "braid-info: --config and --peers are exclusive\n%s", kUsage);
      return 2;
    }
    mode = chosen;
  }
  try {
    switch (mode) {
      case Mode::Overview:
        return printOverview();
      case Mode::Config:
        return printConfig();
      case Mode::Peers:
        return printPeers();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-info: %s\n", e.what());
    return 1;
  }
  return 0;
}
