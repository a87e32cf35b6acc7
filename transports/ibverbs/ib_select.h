// Which RDMA ports the ibverbs transport uses, and with which GID: the
// BRAID_IB_HCA filter, GID selection from sysfs (or from the backend where
// sysfs does not describe the device), the port chooser over a
// VerbsBackend, MTU arithmetic and the range checks of the BRAID_IB_*
// integer knobs. Nothing here reads the environment: knob values come in as
// parameters. Internal to transports/ibverbs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "transports/ibverbs/verbs_backend.h"

namespace braid::transport::ibverbs {

// ------------------------------------------------------------ BRAID_IB_HCA
//
// As NCCL_IB_HCA: a comma-separated list of `name[:port]`. A leading `^`
// excludes the listed ports instead of taking only them; a leading `=`
// (after the `^`, if any: "^=mlx5_0") makes names match exactly, where
// otherwise each is a prefix ("mlx5" takes mlx5_0 and mlx5_10, "=mlx5_1"
// takes mlx5_1 and not mlx5_10). An entry without a port stands for every
// port of the device. The empty list takes every port of every device.
struct HcaEntry {
  std::string name;
  int port = 0;  // 0: every port
};

struct HcaFilter {
  bool exclude = false;  // `^`: the entries say what is left out
  bool exact = false;    // `=`: names match whole, not as prefixes
  std::vector<HcaEntry> entries;

  // Whether port `port` of `device` is to be used.
  bool matches(const std::string& device, int port) const;
  // Whether some port of `device` may pass matches(): false only where the
  // device is left out whole.
  bool mayMatchDevice(const std::string& device) const;
};

// Throws Error(InvalidArgument) naming BRAID_IB_HCA for an empty entry
// ("a,,b", a lone "^"), a name with characters other than letters, digits,
// '_', '-' and '.', or a port that is not a number in 1..255. Spaces around
// entries are ignored.
HcaFilter parseHcaList(const std::string& spec);

// ----------------------------------------------------------------- the GID

enum class GidType : uint8_t {
  Unknown,   // gid_attrs/types/<index> could not be read
  IbRoceV1,  // "IB/RoCE v1"
  RoceV2,    // "RoCE v2"
};

struct GidEntry {
  int index = 0;
  Gid gid;
  GidType type = GidType::Unknown;
};

// One port's GID table, as sysfs or the backend reports it.
struct GidTable {
  LinkLayer linkLayer = LinkLayer::InfiniBand;
  bool typed = false;             // from sysfs: every entry's type was looked up
  std::vector<GidEntry> entries;  // readable entries, by index
};

bool isZero(const Gid& gid);
bool isLinkLocal(const Gid& gid);   // fe80::/10
bool isIpv4Mapped(const Gid& gid);  // ::ffff:a.b.c.d
// "fe80:0000:0000:0000:0202:c9ff:fe00:0001", the form sysfs writes.
std::string formatGid(const Gid& gid);
// Eight groups of 1 to 4 hex digits separated by ':' (the form above),
// surrounding whitespace ignored; false for anything else.
bool parseGid(const std::string& text, Gid* gid);

// Reads <root>/class/infiniband/<device>/ports/<port>/{link_layer, gids/*,
// gid_attrs/types/*}. nullopt where sysfs has no such port (the fake
// fabric's devices, a container without /sys/class/infiniband) or its
// link_layer is unreadable; a GID file that cannot be read or parsed
// leaves its entry out.
std::optional<GidTable> readSysfsGids(const std::string& root, const std::string& device, int port);

// The port's table as the backend reports it (queryGid over
// info.gidTableLength entries), untyped.
GidTable backendGids(VerbsBackend& backend, Device* device, int port, const PortInfo& info);

// The GID a port uses; index -1 when none qualifies, with `reason`.
struct GidChoice {
  int index = -1;
  Gid gid;
  std::string reason;  // where index is -1: why, naming the port
  bool ok() const { return index >= 0; }
};

// Picks the GID of a port whose table is `table`; `where` names the port in
// reasons ("mlx5_0 port 1").
//  - overrideIndex >= 0 (BRAID_IB_GID_INDEX) is taken as it is if the table
//    has that entry and it is not all zero; otherwise throws
//    Error(InvalidArgument) naming BRAID_IB_GID_INDEX.
//  - InfiniBand: index 0 (the LID routes; the GID is used only across
//    subnets).
//  - Ethernet, typed: a RoCE v2 entry that is set and not link-local,
//    IPv4-mapped ones before other IPv6, lowest index first; failing that
//    a RoCE v1 (or untyped) one by the same order; failing that none.
//  - Ethernet, untyped (the backend's table): the first entry that is set
//    and not link-local, else index 0.
GidChoice chooseGid(const GidTable& table, int overrideIndex, const std::string& where);

// chooseGid over sysfs where it describes the port, else over the
// backend's table; the link layer is always the backend's (info).
GidChoice selectGid(VerbsBackend& backend, Device* device, const std::string& deviceName, int port,
                    const PortInfo& info, const std::string& sysfsRoot, int overrideIndex);

// ------------------------------------------------------------ the ports

struct UsablePort {
  std::string deviceName;
  Device* device = nullptr;  // owned by the PortSelection (its `devices`)
  DeviceInfo deviceInfo;
  int port = 0;
  LinkLayer linkLayer = LinkLayer::InfiniBand;
  uint16_t lid = 0;
  int mtu = 0;  // active MTU, bytes
  int gidIndex = 0;
  Gid gid;
};

struct PortSelection {
  // Active ports that passed the filter and have a GID, by device name
  // (digit runs compared as numbers: mlx5_2 before mlx5_10), then port.
  std::vector<UsablePort> ports;
  // The open devices the ports refer to, each once. The caller owns them
  // and closes them with close() (or backend.closeDevice each); devices
  // without a usable port were closed before selectPorts returned.
  std::vector<Device*> devices;
  // Each port or device passed over and why ("mlx5_0 port 2 is down").
  std::vector<std::string> skipped;
  // Where `ports` is empty: why, in one line.
  std::string reason;

  void close(VerbsBackend& backend);
};

struct SelectOptions {
  // BRAID_IB_HCA. Default: every port of every device.
  std::string hca;
  // BRAID_IB_GID_INDEX. Default: -1, chosen per port by chooseGid().
  int gidIndex = -1;
  // BRAID_SYSFS. Default: "/sys".
  std::string sysfsRoot = "/sys";
};

// Opens every device of `backend` that the filter may take, queries its
// ports and keeps the Active ones with a GID. A device that cannot be
// opened or queried is skipped with its reason. Throws
// Error(InvalidArgument) for a malformed BRAID_IB_HCA or a
// BRAID_IB_GID_INDEX a chosen port does not have (closing what it opened).
PortSelection selectPorts(VerbsBackend& backend, const SelectOptions& options);

// ------------------------------------------------------------------ MTU

// Both ends use the smaller active MTU.
inline int commonMtu(int mine, int theirs) { return mine < theirs ? mine : theirs; }
// 256, 512, 1024, 2048, 4096 -> 1..5 (ibv_mtu's numbering); 0 for
// anything else.
int mtuEnum(int bytes);
// 1..5 -> bytes; 0 for anything else.
int mtuBytes(int mtuEnumValue);

// --------------------------------------------------------- integer knobs
//
// Each returns `value` when it is in range and otherwise throws
// Error(InvalidArgument) naming `knob` and the range.
constexpr int kDefaultTimeout = 20;          // BRAID_IB_TIMEOUT: 4.096 us * 2^20, about 4 s
constexpr int kDefaultRetryCount = 7;        // BRAID_IB_RETRY_CNT
constexpr int kDefaultQpsPerConnection = 1;  // BRAID_IB_QPS_PER_CONNECTION
constexpr int kMaxQpsPerConnection = 16;
int checkTimeout(int value, const char* knob = "BRAID_IB_TIMEOUT");                      // 1..31
int checkRetryCount(int value, const char* knob = "BRAID_IB_RETRY_CNT");                 // 0..7
int checkQpsPerConnection(int value, const char* knob = "BRAID_IB_QPS_PER_CONNECTION");  // 1..16
int checkGidIndex(int value, const char* knob = "BRAID_IB_GID_INDEX");  // -1 (none) or 0..255

}  // namespace braid::transport::ibverbs
