#include "transports/ibverbs/ib_select.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <tuple>

#include "core/errors.h"

namespace braid::transport::ibverbs {

namespace {

std::string trim(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

bool isNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
}

[[noreturn]] void badHca(const std::string& spec, const std::string& why) {
  throw Error(ErrorCode::InvalidArgument,
              format("BRAID_IB_HCA '%s': %s", spec.c_str(), why.c_str()));
}

bool nameMatches(const HcaFilter& filter, const HcaEntry& entry, const std::string& device) {
  if (filter.exact) return device == entry.name;
  return device.compare(0, entry.name.size(), entry.name) == 0;
}

// Device names in the order people expect: runs of digits compare as
// numbers, so mlx5_2 comes before mlx5_10.
bool naturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const bool da = std::isdigit(static_cast<unsigned char>(a[i]));
    const bool db = std::isdigit(static_cast<unsigned char>(b[j]));
    if (da && db) {
      size_t ei = i, ej = j;
      while (ei < a.size() && std::isdigit(static_cast<unsigned char>(a[ei]))) ++ei;
      while (ej < b.size() && std::isdigit(static_cast<unsigned char>(b[ej]))) ++ej;
      // Without leading zeros the longer run is the larger number.
      size_t si = i, sj = j;
      while (si + 1 < ei && a[si] == '0') ++si;
      while (sj + 1 < ej && b[sj] == '0') ++sj;
      if (ei - si != ej - sj) return ei - si < ej - sj;
      const int order = a.compare(si, ei - si, b, sj, ej - sj);
      if (order != 0) return order < 0;
      i = ei;
      j = ej;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// The whole of a small file (sysfs attributes); false where it cannot be
// opened or read (sysfs answers EINVAL for GID types of unset entries).
bool readSmallFile(const std::string& path, std::string* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buffer[256];
  out->clear();
  bool ok = true;
  for (;;) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) ok = false;
    if (got <= 0) break;
    out->append(buffer, static_cast<size_t>(got));
    if (out->size() > 4096) break;  // no sysfs attribute of ours is this long
  }
  ::close(fd);
  return ok;
}

// "1".."999" with no sign or leading zero; -1 for anything else.
int parseSmallNumber(const std::string& text) {
  if (text.empty() || text.size() > 3 || text[0] == '0') return -1;
  int value = 0;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
    value = value * 10 + (c - '0');
  }
  return value;
}

const char* portStateText(PortState state) {
  switch (state) {
    case PortState::Down:
      return "is down";
    case PortState::Init:
      return "is not active (initializing: no subnet manager?)";
    case PortState::Armed:
      return "is not active (armed)";
    case PortState::Active:
      return "is active";
    case PortState::Other:
      break;
  }
  return "is not active";
}

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const std::string& part : parts) {
    if (!out.empty()) out += separator;
    out += part;
  }
  return out;
}

int checkRange(int value, const char* knob, int low, int high, const char* what) {
  if (value < low || value > high)
    throw Error(ErrorCode::InvalidArgument,
                format("%s %d: must be in %d..%d (%s)", knob, value, low, high, what));
  return value;
}

}  // namespace

// ------------------------------------------------------------ BRAID_IB_HCA

bool HcaFilter::matches(const std::string& device, int port) const {
  if (entries.empty()) return true;
  bool listed = false;
  for (const HcaEntry& entry : entries)
    if (nameMatches(*this, entry, device) && (entry.port == 0 || entry.port == port)) listed = true;
  return exclude ? !listed : listed;
}

bool HcaFilter::mayMatchDevice(const std::string& device) const {
  if (entries.empty()) return true;
  for (const HcaEntry& entry : entries) {
    if (!nameMatches(*this, entry, device)) continue;
    // Included by any entry; excluded whole only by an entry without port.
    if (!exclude || entry.port == 0) return !exclude;
  }
  return exclude;
}

HcaFilter parseHcaList(const std::string& spec) {
  HcaFilter filter;
  const std::string text = trim(spec);
  if (text.empty()) return filter;
  size_t at = 0;
  if (text[at] == '^') {
    filter.exclude = true;
    ++at;
  }
  if (at < text.size() && text[at] == '=') {
    filter.exact = true;
    ++at;
  }
  const std::string list = text.substr(at);
  size_t begin = 0;
  for (int number = 1;; ++number) {
    const size_t comma = list.find(',', begin);
    const std::string entry =
        trim(list.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    if (entry.empty())
      badHca(spec, format("entry %d is empty (a list of name[:port], comma-separated)", number));
    const size_t colon = entry.find(':');
    HcaEntry parsed;
    parsed.name = entry.substr(0, colon);
    if (parsed.name.empty()) badHca(spec, format("entry '%s' has no device name", entry.c_str()));
    for (char c : parsed.name)
      if (!isNameChar(c))
        badHca(spec, format("entry '%s' holds '%c': a device name is letters, digits, '_', '-' "
                            "and '.' ('^' and '=' go only at the start of the list)",
                            entry.c_str(), c));
    if (colon != std::string::npos) {
      parsed.port = parseSmallNumber(entry.substr(colon + 1));
      if (parsed.port < 1 || parsed.port > 255)
        badHca(spec, format("entry '%s': the port must be a number in 1..255", entry.c_str()));
    }
    filter.entries.push_back(parsed);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return filter;
}

// ----------------------------------------------------------------- the GID

bool isZero(const Gid& gid) {
  for (uint8_t byte : gid.raw)
    if (byte != 0) return false;
  return true;
}

bool isLinkLocal(const Gid& gid) { return gid.raw[0] == 0xfe && (gid.raw[1] & 0xc0) == 0x80; }

bool isIpv4Mapped(const Gid& gid) {
  for (int i = 0; i < 10; ++i)
    if (gid.raw[i] != 0) return false;
  return gid.raw[10] == 0xff && gid.raw[11] == 0xff;
}

std::string formatGid(const Gid& gid) {
  std::string out;
  for (size_t group = 0; group < 8; ++group)
    out +=
        format(group == 0 ? "%02x%02x" : ":%02x%02x", gid.raw[2 * group], gid.raw[2 * group + 1]);
  return out;
}

bool parseGid(const std::string& text, Gid* gid) {
  const std::string body = trim(text);
  Gid parsed;
  size_t at = 0;
  for (size_t group = 0; group < 8; ++group) {
    if (group > 0) {
      if (at >= body.size() || body[at] != ':') return false;
      ++at;
    }
    unsigned value = 0;
    size_t digits = 0;
    while (at < body.size() && digits < 5 && std::isxdigit(static_cast<unsigned char>(body[at]))) {
      const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(body[at])));
      value = value * 16 + static_cast<unsigned>(c <= '9' ? c - '0' : c - 'a' + 10);
      ++digits;
      ++at;
    }
    if (digits == 0 || digits > 4) return false;
    parsed.raw[2 * group] = static_cast<uint8_t>(value >> 8);
    parsed.raw[2 * group + 1] = static_cast<uint8_t>(value & 0xff);
  }
  if (at != body.size()) return false;
  *gid = parsed;
  return true;
}

std::optional<GidTable> readSysfsGids(const std::string& root, const std::string& device,
                                      int port) {
  const std::string base = root + "/class/infiniband/" + device + "/ports/" + std::to_string(port);
  std::string text;
  if (!readSmallFile(base + "/link_layer", &text)) return std::nullopt;
  GidTable table;
  table.typed = true;
  text = trim(text);
  if (text == "InfiniBand")
    table.linkLayer = LinkLayer::InfiniBand;
  else if (text == "Ethernet")
    table.linkLayer = LinkLayer::Ethernet;
  else
    return std::nullopt;

  DIR* dir = ::opendir((base + "/gids").c_str());
  if (!dir) return std::nullopt;
  std::vector<int> indices;
  while (dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "0") {
      indices.push_back(0);
      continue;
    }
    const int index = parseSmallNumber(name);
    if (index > 0) indices.push_back(index);
  }
  ::closedir(dir);
  std::sort(indices.begin(), indices.end());

  for (int index : indices) {
    GidEntry entry;
    entry.index = index;
    if (!readSmallFile(base + "/gids/" + std::to_string(index), &text) ||
        !parseGid(text, &entry.gid))
      continue;
    if (readSmallFile(base + "/gid_attrs/types/" + std::to_string(index), &text)) {
      text = trim(text);
      if (text == "RoCE v2")
        entry.type = GidType::RoceV2;
      else if (text == "IB/RoCE v1")
        entry.type = GidType::IbRoceV1;
    }
    table.entries.push_back(entry);
  }
  return table;
}

GidTable backendGids(VerbsBackend& backend, Device* device, int port, const PortInfo& info) {
  GidTable table;
  table.linkLayer = info.linkLayer;
  // sgid_index is 8 bits wide: entries past 255 cannot be used.
  const int length = std::min(info.gidTableLength, 256);
  for (int index = 0; index < length; ++index) {
    GidEntry entry;
    entry.index = index;
    try {
      entry.gid = backend.queryGid(device, port, index);
    } catch (const Error&) {
      continue;  // an entry the device will not report is not one to use
    }
    table.entries.push_back(entry);
  }
  return table;
}

GidChoice chooseGid(const GidTable& table, int overrideIndex, const std::string& where) {
  GidChoice choice;
  auto take = [&](const GidEntry& entry) {
    choice.index = entry.index;
    choice.gid = entry.gid;
    return choice;
  };
  auto find = [&](int index) -> const GidEntry* {
    for (const GidEntry& entry : table.entries)
      if (entry.index == index) return &entry;
    return nullptr;
  };

  if (overrideIndex >= 0) {
    const GidEntry* entry = find(overrideIndex);
    if (!entry)
      throw Error(ErrorCode::InvalidArgument,
                  format("BRAID_IB_GID_INDEX %d: %s has no GID %d (%zu entries can be read)",
                         overrideIndex, where.c_str(), overrideIndex, table.entries.size()));
    if (isZero(entry->gid))
      throw Error(ErrorCode::InvalidArgument,
                  format("BRAID_IB_GID_INDEX %d: GID %d of %s is unset (all zero)", overrideIndex,
                         overrideIndex, where.c_str()));
    return take(*entry);
  }

  if (table.linkLayer == LinkLayer::InfiniBand) {
    if (const GidEntry* entry = find(0)) return take(*entry);
    choice.reason = where + " has no GID 0";
    return choice;
  }

  auto usable = [](const GidEntry& entry) { return !isZero(entry.gid) && !isLinkLocal(entry.gid); };
  if (!table.typed) {
    for (const GidEntry& entry : table.entries)
      if (usable(entry)) return take(entry);
    if (const GidEntry* entry = find(0)) return take(*entry);
    choice.reason = where + " reports no GID";
    return choice;
  }

  // Lower tier wins, then lower index: RoCE v2 before v1 (v2 is routable),
  // IPv4-mapped before other IPv6 (what the fabric's IP addresses are
  // usually configured as).
  const GidEntry* best = nullptr;
  std::tuple<int, int> bestRank{0, 0};
  int unset = 0, linkLocal = 0;
  for (const GidEntry& entry : table.entries) {
    if (isZero(entry.gid)) {
      ++unset;
      continue;
    }
    if (isLinkLocal(entry.gid)) {
      ++linkLocal;
      continue;
    }
    const int tier = (entry.type == GidType::RoceV2 ? 0 : 2) + (isIpv4Mapped(entry.gid) ? 0 : 1);
    const std::tuple<int, int> rank{tier, entry.index};
    if (!best || rank < bestRank) {
      best = &entry;
      bestRank = rank;
    }
  }
  if (best) return take(*best);
  choice.reason = format(
      "%s has no RoCE GID that is set and not link-local (%zu entries: %d link-local, %d unset): "
      "give its interface an IP address, or name an entry with BRAID_IB_GID_INDEX",
      where.c_str(), table.entries.size(), linkLocal, unset);
  return choice;
}

GidChoice selectGid(VerbsBackend& backend, Device* device, const std::string& deviceName, int port,
                    const PortInfo& info, const std::string& sysfsRoot, int overrideIndex) {
  std::optional<GidTable> table = readSysfsGids(sysfsRoot, deviceName, port);
  if (table)
    table->linkLayer = info.linkLayer;
  else
    table = backendGids(backend, device, port, info);
  return chooseGid(*table, overrideIndex, deviceName + " port " + std::to_string(port));
}

// ------------------------------------------------------------ the ports

void PortSelection::close(VerbsBackend& backend) {
  for (Device* device : devices) backend.closeDevice(device);
  devices.clear();
  ports.clear();
}

PortSelection selectPorts(VerbsBackend& backend, const SelectOptions& options) {
  const HcaFilter filter = parseHcaList(options.hca);
  checkGidIndex(options.gidIndex);
  PortSelection selection;
  std::vector<std::string> names = backend.deviceNames();
  std::sort(names.begin(), names.end(), naturalLess);
  if (names.empty()) {
    selection.reason = "no RDMA device (" + backend.describe() + ")";
    return selection;
  }

  // Devices already kept are closed if anything below throws.
  struct CloseOnThrow {
    VerbsBackend& backend;
    PortSelection& selection;
    bool armed = true;
    ~CloseOnThrow() {
      if (armed) selection.close(backend);
    }
  } guard{backend, selection};

  int considered = 0;
  for (const std::string& name : names) {
    if (!filter.mayMatchDevice(name)) continue;
    ++considered;
    DeviceInfo info;
    Device* device = nullptr;
    try {
      device = backend.openDevice(name, &info);
    } catch (const Error& error) {
      selection.skipped.push_back(name + " cannot be opened: " + error.what());
      continue;
    }
    bool used = false;
    int filtered = 0;
    try {
      for (int port = 1; port <= info.ports; ++port) {
        if (!filter.matches(name, port)) continue;
        ++filtered;
        const std::string where = name + " port " + std::to_string(port);
        PortInfo portInfo;
        try {
          portInfo = backend.queryPort(device, port);
        } catch (const Error& error) {
          selection.skipped.push_back(where + " cannot be queried: " + error.what());
          continue;
        }
        if (portInfo.state != PortState::Active) {
          selection.skipped.push_back(where + " " + portStateText(portInfo.state));
          continue;
        }
        if (mtuEnum(portInfo.activeMtu) == 0) {
          selection.skipped.push_back(
              format("%s reports an active MTU of %d bytes", where.c_str(), portInfo.activeMtu));
          continue;
        }
        const GidChoice gid =
            selectGid(backend, device, name, port, portInfo, options.sysfsRoot, options.gidIndex);
        if (!gid.ok()) {
          selection.skipped.push_back(gid.reason);
          continue;
        }
        UsablePort usable;
        usable.deviceName = name;
        usable.device = device;
        usable.deviceInfo = info;
        usable.port = port;
        usable.linkLayer = portInfo.linkLayer;
        usable.lid = portInfo.lid;
        usable.mtu = portInfo.activeMtu;
        usable.gidIndex = gid.index;
        usable.gid = gid.gid;
        selection.ports.push_back(std::move(usable));
        used = true;
      }
    } catch (...) {
      // Its ports may already be in the list; the guard closes the others.
      while (!selection.ports.empty() && selection.ports.back().device == device)
        selection.ports.pop_back();
      backend.closeDevice(device);
      throw;
    }
    if (info.ports <= 0)
      selection.skipped.push_back(name + " has no ports");
    else if (filtered == 0)
      selection.skipped.push_back(format("BRAID_IB_HCA '%s' takes no port of %s (it has %d)",
                                         options.hca.c_str(), name.c_str(), info.ports));
    if (used)
      selection.devices.push_back(device);
    else
      backend.closeDevice(device);
  }
  guard.armed = false;

  if (considered == 0)
    selection.reason = format("BRAID_IB_HCA '%s' %s (there %s %s)", options.hca.c_str(),
                              filter.exclude ? "leaves out every device" : "matches no device",
                              names.size() == 1 ? "is" : "are", join(names, ", ").c_str());
  else if (selection.ports.empty())
    selection.reason =
        selection.skipped.empty() ? "no usable RDMA port" : join(selection.skipped, "; ");
  return selection;
}

// ------------------------------------------------------------------ MTU

int mtuEnum(int bytes) {
  switch (bytes) {
    case 256:
      return 1;
    case 512:
      return 2;
    case 1024:
      return 3;
    case 2048:
      return 4;
    case 4096:
      return 5;
    default:
      return 0;
  }
}

int mtuBytes(int mtuEnumValue) {
  return mtuEnumValue >= 1 && mtuEnumValue <= 5 ? 128 << mtuEnumValue : 0;
}

// --------------------------------------------------------- integer knobs

int checkTimeout(int value, const char* knob) {
  return checkRange(value, knob, 1, 31, "the local ACK timeout is 4.096 us * 2^value");
}

int checkRetryCount(int value, const char* knob) {
  return checkRange(value, knob, 0, 7, "times a send is retried before the QP fails");
}

int checkQpsPerConnection(int value, const char* knob) {
  return checkRange(value, knob, 1, kMaxQpsPerConnection,
                    "queue pairs each connection stripes over");
}

int checkGidIndex(int value, const char* knob) {
  return checkRange(value, knob, -1, 255, "-1 chooses per port");
}

}  // namespace braid::transport::ibverbs
