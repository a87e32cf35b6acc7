// The ibverbs transport's pure pieces: the BRAID_IB_HCA filter, GID
// selection over recorded sysfs samples (tests/data/ib_sysfs), the port
// chooser over a small in-test backend, the connection-info wire format
// and the registration cache.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "braid/error.h"
#include "transports/ibverbs/ib_select.h"
#include "transports/ibverbs/ib_wire.h"
#include "transports/ibverbs/registration_cache.h"

namespace braid::transport::ibverbs {
namespace {

// Runs `body`, which must throw braid::Error with `code` and a message that
// contains `part`.
template <typename Body>
void expectError(Body body, ErrorCode code, const std::string& part) {
  try {
    body();
    ADD_FAILURE() << "no error; expected one containing '" << part << "'";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), code) << error.what();
    EXPECT_NE(std::string(error.what()).find(part), std::string::npos)
        << "'" << error.what() << "' does not contain '" << part << "'";
  }
}

Gid gidOf(const std::string& text) {
  Gid gid;
  EXPECT_TRUE(parseGid(text, &gid)) << text;
  return gid;
}

std::string sample(const std::string& name) {
  return std::string(BRAID_TEST_DATA) + "/ib_sysfs/" + name;
}

// ------------------------------------------------------------ BRAID_IB_HCA

const std::vector<std::string> kDevices = {"mlx5_0", "mlx5_1", "mlx5_10", "mlx4_0", "bnxt_re0"};

// The devices of kDevices whose port `port` the spec takes.
std::vector<std::string> taken(const std::string& spec, int port = 1) {
  const HcaFilter filter = parseHcaList(spec);
  std::vector<std::string> out;
  for (const std::string& device : kDevices)
    if (filter.matches(device, port)) out.push_back(device);
  return out;
}

using Names = std::vector<std::string>;

TEST(HcaList, EmptySpecTakesEveryPortOfEveryDevice) {
  EXPECT_EQ(taken(""), kDevices);
  EXPECT_EQ(taken("", 2), kDevices);
  EXPECT_TRUE(parseHcaList("").mayMatchDevice("anything"));
}

TEST(HcaList, NameIsAPrefixOfTheDevicesItTakes) {
  EXPECT_EQ(taken("mlx5"), (Names{"mlx5_0", "mlx5_1", "mlx5_10"}));
  EXPECT_EQ(taken("mlx5_1"), (Names{"mlx5_1", "mlx5_10"}));
  EXPECT_EQ(taken("bnxt"), (Names{"bnxt_re0"}));
}

TEST(HcaList, ExactMatchDoesNotTakeALongerNameWithTheSamePrefix) {
  EXPECT_EQ(taken("=mlx5_1"), (Names{"mlx5_1"}));
  EXPECT_EQ(taken("=mlx5"), Names{});
}

TEST(HcaList, CaretExcludesTheListedDevices) {
  EXPECT_EQ(taken("^mlx5"), (Names{"mlx4_0", "bnxt_re0"}));
  EXPECT_EQ(taken("^mlx5_1"), (Names{"mlx5_0", "mlx4_0", "bnxt_re0"}));
  EXPECT_FALSE(parseHcaList("^mlx5").mayMatchDevice("mlx5_0"));
}

TEST(HcaList, CaretEqualsExcludesOnlyTheExactNames) {
  EXPECT_EQ(taken("^=mlx5_1"), (Names{"mlx5_0", "mlx5_10", "mlx4_0", "bnxt_re0"}));
}

TEST(HcaList, PortRestrictsAnEntryToThatPort) {
  const HcaFilter filter = parseHcaList("mlx5_0:2,mlx4_0");
  EXPECT_FALSE(filter.matches("mlx5_0", 1));
  EXPECT_TRUE(filter.matches("mlx5_0", 2));
  EXPECT_TRUE(filter.matches("mlx4_0", 1));
  EXPECT_TRUE(filter.matches("mlx4_0", 2));
  EXPECT_FALSE(filter.matches("bnxt_re0", 2));
  ASSERT_EQ(filter.entries.size(), 2u);
  EXPECT_EQ(filter.entries[0].name, "mlx5_0");
  EXPECT_EQ(filter.entries[0].port, 2);
  EXPECT_EQ(filter.entries[1].port, 0);
}

TEST(HcaList, ExcludingOnePortLeavesTheDevicesOtherPorts) {
  const HcaFilter filter = parseHcaList("^=mlx5_0:1");
  EXPECT_FALSE(filter.matches("mlx5_0", 1));
  EXPECT_TRUE(filter.matches("mlx5_0", 2));
  EXPECT_TRUE(filter.mayMatchDevice("mlx5_0"));
  EXPECT_TRUE(filter.matches("mlx5_1", 1));
}

TEST(HcaList, SpacesAroundEntriesAreIgnored) {
  EXPECT_EQ(taken(" =mlx5_0 , mlx4_0 "), (Names{"mlx5_0", "mlx4_0"}));
}

TEST(HcaList, MalformedSpecsAreRejectedNamingTheKnob) {
  for (const char* spec : {",", "mlx5_0,", "mlx5_0,,mlx5_1", "^", "=", "^=", "=^mlx5_0", "x^y",
                           "mlx5 0", ":1", "mlx5_0:", "mlx5_0:0", "mlx5_0:256", "mlx5_0:x",
                           "mlx5_0:1:2", "mlx5_0:-1", "mlx5_0:+1", "mlx5_0:01", "mlx5_0/1"}) {
    SCOPED_TRACE(spec);
    expectError([&] { parseHcaList(spec); }, ErrorCode::InvalidArgument,
                std::string("BRAID_IB_HCA '") + spec + "'");
  }
}

// ----------------------------------------------------------------- GIDs

TEST(Gid, ParsesAndFormatsTheSysfsForm) {
  const Gid gid = gidOf("fe80:0000:0000:0000:0202:c9ff:fe00:0001\n");
  EXPECT_EQ(gid.raw[0], 0xfe);
  EXPECT_EQ(gid.raw[1], 0x80);
  EXPECT_EQ(gid.raw[15], 0x01);
  EXPECT_EQ(formatGid(gid), "fe80:0000:0000:0000:0202:c9ff:fe00:0001");
  EXPECT_EQ(formatGid(gidOf("FE80:0:0:0:202:C9FF:FE00:1")), formatGid(gid));
}

TEST(Gid, RejectsTextThatIsNotEightHexGroups) {
  Gid gid;
  for (const char* text : {"", "fe80::1", "fe80:0:0:0:0:0:0", "fe80:0:0:0:0:0:0:0:0",
                           "fe80:0:0:0:0:0:0:12345", "fe80:0:0:0:0:0:0:x", "fe80:0:0:0:0:0:0:1 2"})
    EXPECT_FALSE(parseGid(text, &gid)) << text;
}

TEST(Gid, ClassifiesZeroLinkLocalAndIpv4Mapped) {
  EXPECT_TRUE(isZero(Gid{}));
  EXPECT_TRUE(isLinkLocal(gidOf("fe80:0:0:0:0:0:0:1")));
  EXPECT_TRUE(isLinkLocal(gidOf("febf:0:0:0:0:0:0:1")));
  EXPECT_FALSE(isLinkLocal(gidOf("fec0:0:0:0:0:0:0:1")));
  EXPECT_TRUE(isIpv4Mapped(gidOf("0:0:0:0:0:ffff:c0a8:010a")));
  EXPECT_FALSE(isIpv4Mapped(gidOf("2001:db8:0:0:0:ffff:c0a8:010a")));
}

// The choice for port 1 of `device` in a recorded sample.
GidChoice sysfsChoice(const std::string& name, const std::string& device, int overrideIndex = -1) {
  const std::optional<GidTable> table = readSysfsGids(sample(name), device, 1);
  EXPECT_TRUE(table.has_value()) << name;
  if (!table) return {};
  return chooseGid(*table, overrideIndex, device + " port 1");
}

TEST(GidSelection, ReadsEveryEntryWithItsTypeAndTheLinkLayer) {
  const std::optional<GidTable> table = readSysfsGids(sample("roce"), "mlx5_1", 1);
  ASSERT_TRUE(table);
  EXPECT_EQ(table->linkLayer, LinkLayer::Ethernet);
  EXPECT_TRUE(table->typed);
  ASSERT_EQ(table->entries.size(), 8u);
  EXPECT_EQ(table->entries[3].index, 3);
  EXPECT_EQ(table->entries[3].type, GidType::RoceV2);
  EXPECT_EQ(table->entries[4].type, GidType::IbRoceV1);
  EXPECT_EQ(table->entries[6].type, GidType::Unknown);  // unset: its type cannot be read
  EXPECT_TRUE(isZero(table->entries[6].gid));
}

TEST(GidSelection, SysfsWithoutTheDeviceGivesNoTable) {
  EXPECT_FALSE(readSysfsGids(sample("roce"), "mlx5_9", 1));
  EXPECT_FALSE(readSysfsGids(sample("roce"), "mlx5_1", 2));
  EXPECT_FALSE(readSysfsGids(sample("absent"), "mlx5_1", 1));
}

TEST(GidSelection, InfiniBandPortUsesIndexZero) {
  const GidChoice choice = sysfsChoice("ib", "mlx5_0");
  ASSERT_TRUE(choice.ok()) << choice.reason;
  EXPECT_EQ(choice.index, 0);
  EXPECT_EQ(formatGid(choice.gid), "fe80:0000:0000:0000:0202:c9ff:fe00:0001");
}

TEST(GidSelection, RocePrefersTheIpv4MappedV2EntryOverV1AndOtherIpv6) {
  const GidChoice choice = sysfsChoice("roce", "mlx5_1");
  ASSERT_TRUE(choice.ok()) << choice.reason;
  EXPECT_EQ(choice.index, 5);
  EXPECT_EQ(formatGid(choice.gid), "0000:0000:0000:0000:0000:ffff:c0a8:010a");
}

TEST(GidSelection, RoceWithoutV2EntriesFallsBackToANonLinkLocalV1Entry) {
  const GidChoice choice = sysfsChoice("roce_v1_only", "mlx5_2");
  ASSERT_TRUE(choice.ok()) << choice.reason;
  EXPECT_EQ(choice.index, 1);
}

TEST(GidSelection, Ipv6OnlyRocePortTakesTheGlobalV2Entry) {
  const GidChoice choice = sysfsChoice("roce_ipv6", "mlx5_4");
  ASSERT_TRUE(choice.ok()) << choice.reason;
  EXPECT_EQ(choice.index, 3);
  EXPECT_EQ(formatGid(choice.gid), "2001:0db8:0001:0000:0000:0000:0000:0005");
}

TEST(GidSelection, LinkLocalOnlyRocePortFailsWithAReason) {
  const GidChoice choice = sysfsChoice("roce_link_local", "mlx5_3");
  EXPECT_FALSE(choice.ok());
  EXPECT_EQ(choice.reason,
            "mlx5_3 port 1 has no RoCE GID that is set and not link-local (4 entries: 2 "
            "link-local, 2 unset): give its interface an IP address, or name an entry with "
            "BRAID_IB_GID_INDEX");
}

TEST(GidSelection, OverrideIndexIsTakenAsItIsEvenWhereTheRulesWouldNot) {
  EXPECT_EQ(sysfsChoice("roce", "mlx5_1", 2).index, 2);             // v1 IPv6
  EXPECT_EQ(sysfsChoice("roce_link_local", "mlx5_3", 1).index, 1);  // link-local
  EXPECT_EQ(sysfsChoice("ib", "mlx5_0", 0).index, 0);
}

TEST(GidSelection, OverrideOfAnUnsetOrMissingEntryIsRejectedNamingTheKnob) {
  expectError([] { sysfsChoice("roce", "mlx5_1", 6); }, ErrorCode::InvalidArgument,
              "BRAID_IB_GID_INDEX 6: GID 6 of mlx5_1 port 1 is unset");
  expectError([] { sysfsChoice("roce", "mlx5_1", 9); }, ErrorCode::InvalidArgument,
              "BRAID_IB_GID_INDEX 9: mlx5_1 port 1 has no GID 9");
  expectError([] { sysfsChoice("ib", "mlx5_0", 1); }, ErrorCode::InvalidArgument,
              "BRAID_IB_GID_INDEX 1");
}

GidTable untyped(LinkLayer linkLayer, const std::vector<std::string>& gids) {
  GidTable table;
  table.linkLayer = linkLayer;
  for (size_t i = 0; i < gids.size(); ++i)
    table.entries.push_back({static_cast<int>(i), gidOf(gids[i]), GidType::Unknown});
  return table;
}

TEST(GidSelection, BackendTableTakesTheFirstSetNonLinkLocalEntry) {
  const GidTable table = untyped(
      LinkLayer::Ethernet,
      {"fe80:0:0:0:0:0:0:1", "0:0:0:0:0:0:0:0", "2001:db8:0:0:0:0:0:7", "0:0:0:0:0:ffff:a00:1"});
  EXPECT_EQ(chooseGid(table, -1, "fake port 1").index, 2);
}

TEST(GidSelection, BackendTableWithoutSuchEntryTakesIndexZero) {
  const GidTable table = untyped(LinkLayer::Ethernet, {"fe80:0:0:0:0:0:0:1", "0:0:0:0:0:0:0:0"});
  EXPECT_EQ(chooseGid(table, -1, "fake port 1").index, 0);
  const GidTable none = untyped(LinkLayer::Ethernet, {});
  EXPECT_FALSE(chooseGid(none, -1, "fake port 1").ok());
}

// ------------------------------------------------------------ the ports

// A backend with devices and ports as a test sets them; only what the port
// chooser calls is implemented.
class TableBackend : public VerbsBackend {
 public:
  struct FakePort {
    PortInfo info;
    std::vector<Gid> gids;
  };
  struct FakeDevice {
    std::vector<FakePort> ports;  // port n at [n - 1]
    int opened = 0;
  };

  std::map<std::string, FakeDevice> devices;
  std::vector<std::string> order;  // as deviceNames() lists them
  int open = 0;

  static FakePort activePort(LinkLayer linkLayer, const std::vector<std::string>& gids,
                             int mtu = 4096) {
    FakePort port;
    port.info.state = PortState::Active;
    port.info.linkLayer = linkLayer;
    port.info.lid = linkLayer == LinkLayer::InfiniBand ? 7 : 0;
    port.info.activeMtu = mtu;
    for (const std::string& gid : gids) port.gids.push_back(gidOf(gid));
    port.info.gidTableLength = static_cast<int>(port.gids.size());
    return port;
  }
  static FakePort downPort() {
    FakePort port = activePort(LinkLayer::InfiniBand, {"fe80:0:0:0:0:0:0:1"});
    port.info.state = PortState::Down;
    return port;
  }
  void add(const std::string& name, std::vector<FakePort> ports) {
    devices[name].ports = std::move(ports);
    order.push_back(name);
  }

  std::string describe() const override { return "table backend"; }
  std::vector<std::string> deviceNames() override { return order; }
  Device* openDevice(const std::string& name, DeviceInfo* info) override {
    FakeDevice& device = devices.at(name);
    info->name = name;
    info->ports = static_cast<int>(device.ports.size());
    ++device.opened;
    ++open;
    return reinterpret_cast<Device*>(&device);
  }
  void closeDevice(Device* device) override {
    --reinterpret_cast<FakeDevice*>(device)->opened;
    --open;
  }
  PortInfo queryPort(Device* device, int port) override {
    return reinterpret_cast<FakeDevice*>(device)->ports.at(static_cast<size_t>(port - 1)).info;
  }
  Gid queryGid(Device* device, int port, int index) override {
    return reinterpret_cast<FakeDevice*>(device)
        ->ports.at(static_cast<size_t>(port - 1))
        .gids.at(static_cast<size_t>(index));
  }

  [[noreturn]] static void unused() { throw std::logic_error("not used by the port chooser"); }
  ProtectionDomain* allocPd(Device*) override { unused(); }
  void deallocPd(ProtectionDomain*) override { unused(); }
  void* allocateTarget(size_t) override { unused(); }
  void releaseTarget(void*, size_t) override { unused(); }
  MemoryRegion* registerMemory(ProtectionDomain*, void*, size_t, int, Keys*) override { unused(); }
  MemoryRegion* registerDmabuf(ProtectionDomain*, int, uint64_t, size_t, uint64_t, int,
                               Keys*) override {
    unused();
  }
  void deregister(MemoryRegion*) override { unused(); }
  CompletionQueue* createCq(Device*, int) override { unused(); }
  void destroyCq(CompletionQueue*) override { unused(); }
  int pollCq(CompletionQueue*, Completion*, int) override { unused(); }
  void waitCq(CompletionQueue*, Clock::time_point) override { unused(); }
  QueuePair* createQp(ProtectionDomain*, CompletionQueue*, CompletionQueue*, const QpCaps&,
                      uint32_t*) override {
    unused();
  }
  void destroyQp(QueuePair*) override { unused(); }
  void toInit(QueuePair*, const PathOptions&) override { unused(); }
  void toRtr(QueuePair*, const RemoteQp&, const PathOptions&) override { unused(); }
  void toRts(QueuePair*, const PathOptions&) override { unused(); }
  int postSend(QueuePair*, const SendRequest*, size_t) override { unused(); }
  int postRecv(QueuePair*, const RecvRequest*, size_t) override { unused(); }
  bool nextAsyncEvent(Device*, AsyncEvent*) override { unused(); }
};

SelectOptions withoutSysfs(const std::string& hca = "") {
  SelectOptions options;
  options.hca = hca;
  options.sysfsRoot = sample("absent");
  return options;
}

TEST(PortSelection, DownPortIsSkippedAndTheActiveOneKept) {
  TableBackend backend;
  backend.add("mlx5_0", {TableBackend::activePort(LinkLayer::InfiniBand, {"fe80:0:0:0:0:0:0:1"}),
                         TableBackend::downPort()});
  PortSelection selection = selectPorts(backend, withoutSysfs());
  ASSERT_EQ(selection.ports.size(), 1u) << selection.reason;
  const UsablePort& port = selection.ports[0];
  EXPECT_EQ(port.deviceName, "mlx5_0");
  EXPECT_EQ(port.port, 1);
  EXPECT_EQ(port.linkLayer, LinkLayer::InfiniBand);
  EXPECT_EQ(port.lid, 7);
  EXPECT_EQ(port.mtu, 4096);
  EXPECT_EQ(port.gidIndex, 0);
  EXPECT_EQ(selection.skipped, (Names{"mlx5_0 port 2 is down"}));
  EXPECT_TRUE(selection.reason.empty());
  EXPECT_EQ(selection.devices.size(), 1u);
  EXPECT_EQ(backend.open, 1);
  selection.close(backend);
  EXPECT_EQ(backend.open, 0);
}

TEST(PortSelection, EveryPortDownGivesTheReasonAndClosesTheDevice) {
  TableBackend backend;
  backend.add("mlx5_0", {TableBackend::downPort()});
  const PortSelection selection = selectPorts(backend, withoutSysfs());
  EXPECT_TRUE(selection.ports.empty());
  EXPECT_EQ(selection.reason, "mlx5_0 port 1 is down");
  EXPECT_TRUE(selection.devices.empty());
  EXPECT_EQ(backend.open, 0);
}

TEST(PortSelection, NoDeviceSaysSo) {
  TableBackend backend;
  EXPECT_EQ(selectPorts(backend, withoutSysfs()).reason, "no RDMA device (table backend)");
}

TEST(PortSelection, FilterThatMatchesNoDeviceListsTheDevicesThereAre) {
  TableBackend backend;
  backend.add("mlx5_1", {TableBackend::downPort()});
  backend.add("mlx5_0", {TableBackend::downPort()});
  EXPECT_EQ(selectPorts(backend, withoutSysfs("=mlx5_9")).reason,
            "BRAID_IB_HCA '=mlx5_9' matches no device (there are mlx5_0, mlx5_1)");
  EXPECT_EQ(selectPorts(backend, withoutSysfs("^mlx5")).reason,
            "BRAID_IB_HCA '^mlx5' leaves out every device (there are mlx5_0, mlx5_1)");
  EXPECT_EQ(backend.open, 0);
}

TEST(PortSelection, FilterPortThatADeviceLacksSaysSo) {
  TableBackend backend;
  backend.add("mlx5_0", {TableBackend::activePort(LinkLayer::InfiniBand, {"fe80:0:0:0:0:0:0:1"})});
  EXPECT_EQ(selectPorts(backend, withoutSysfs("mlx5_0:2")).reason,
            "BRAID_IB_HCA 'mlx5_0:2' takes no port of mlx5_0 (it has 1)");
}

TEST(PortSelection, DevicesComeInNameOrderWithNumbersComparedAsNumbers) {
  TableBackend backend;
  for (const char* name : {"mlx5_10", "mlx5_2", "bnxt_re0", "mlx5_1"})
    backend.add(name, {TableBackend::activePort(LinkLayer::InfiniBand, {"fe80:0:0:0:0:0:0:1"})});
  PortSelection selection = selectPorts(backend, withoutSysfs());
  Names names;
  for (const UsablePort& port : selection.ports) names.push_back(port.deviceName);
  EXPECT_EQ(names, (Names{"bnxt_re0", "mlx5_1", "mlx5_2", "mlx5_10"}));
  EXPECT_EQ(selection.devices.size(), 4u);
  selection.close(backend);
}

TEST(PortSelection, OnlyDevicesWithAUsablePortStayOpen) {
  TableBackend backend;
  backend.add("mlx5_0", {TableBackend::downPort()});
  backend.add("mlx5_1", {TableBackend::activePort(LinkLayer::InfiniBand, {"fe80:0:0:0:0:0:0:1"})});
  PortSelection selection = selectPorts(backend, withoutSysfs());
  ASSERT_EQ(selection.devices.size(), 1u);
  EXPECT_EQ(backend.devices["mlx5_0"].opened, 0);
  EXPECT_EQ(backend.devices["mlx5_1"].opened, 1);
  EXPECT_EQ(selection.ports[0].device, selection.devices[0]);
  selection.close(backend);
  EXPECT_EQ(backend.open, 0);
}

TEST(PortSelection, RocePortTakesItsGidFromSysfsWhereSysfsHasTheDevice) {
  TableBackend backend;
  // The backend's table would give index 0; the sysfs sample says 5.
  backend.add("mlx5_1",
              {TableBackend::activePort(LinkLayer::Ethernet, {"fe80:0:0:0:0:0:0:1"}, 1024)});
  SelectOptions options;
  options.sysfsRoot = sample("roce");
  PortSelection selection = selectPorts(backend, options);
  ASSERT_EQ(selection.ports.size(), 1u) << selection.reason;
  EXPECT_EQ(selection.ports[0].gidIndex, 5);
  EXPECT_EQ(selection.ports[0].mtu, 1024);
  EXPECT_EQ(selection.ports[0].linkLayer, LinkLayer::Ethernet);
  selection.close(backend);
}

TEST(PortSelection, RocePortWithoutSysfsTakesTheBackendsFirstRoutableGid) {
  TableBackend backend;
  backend.add("fake0", {TableBackend::activePort(LinkLayer::Ethernet,
                                                 {"fe80:0:0:0:0:0:0:1", "0:0:0:0:0:ffff:a00:2"})});
  PortSelection selection = selectPorts(backend, withoutSysfs());
  ASSERT_EQ(selection.ports.size(), 1u) << selection.reason;
  EXPECT_EQ(selection.ports[0].gidIndex, 1);
  EXPECT_EQ(formatGid(selection.ports[0].gid), "0000:0000:0000:0000:0000:ffff:0a00:0002");
  selection.close(backend);
}

TEST(PortSelection, LinkLocalOnlyRocePortIsSkippedWithTheReason) {
  TableBackend backend;
  backend.add("mlx5_3", {TableBackend::activePort(LinkLayer::Ethernet, {"fe80:0:0:0:0:0:0:1"})});
  SelectOptions options;
  options.sysfsRoot = sample("roce_link_local");
  const PortSelection selection = selectPorts(backend, options);
  EXPECT_TRUE(selection.ports.empty());
  EXPECT_NE(selection.reason.find("mlx5_3 port 1 has no RoCE GID that is set and not link-local"),
            std::string::npos)
      << selection.reason;
  EXPECT_EQ(backend.open, 0);
}

TEST(PortSelection, BadGidIndexOverrideThrowsAndClosesEveryDevice) {
  TableBackend backend;
  backend.add("mlx5_0", {TableBackend::activePort(LinkLayer::InfiniBand,
                                                  {"fe80:0:0:0:0:0:0:1", "fe80:0:0:0:0:0:0:2"})});
  backend.add("mlx5_1", {TableBackend::activePort(LinkLayer::InfiniBand, {"fe80:0:0:0:0:0:0:3"})});
  SelectOptions options = withoutSysfs();
  options.gidIndex = 1;  // mlx5_0 has it, mlx5_1 does not
  expectError([&] { selectPorts(backend, options); }, ErrorCode::InvalidArgument,
              "BRAID_IB_GID_INDEX 1: mlx5_1 port 1 has no GID 1");
  EXPECT_EQ(backend.open, 0);
  options.gidIndex = 256;
  expectError([&] { selectPorts(backend, options); }, ErrorCode::InvalidArgument,
              "BRAID_IB_GID_INDEX 256");
}

TEST(PortSelection, MalformedHcaSpecIsRejectedBeforeAnyDeviceOpens) {
  TableBackend backend;
  backend.add("mlx5_0", {TableBackend::downPort()});
  expectError([&] { selectPorts(backend, withoutSysfs("mlx5_0,")); }, ErrorCode::InvalidArgument,
              "BRAID_IB_HCA 'mlx5_0,'");
  EXPECT_EQ(backend.devices["mlx5_0"].opened, 0);
}

// ------------------------------------------------- MTU and integer knobs

TEST(Mtu, BothEndsUseTheSmaller) {
  EXPECT_EQ(commonMtu(4096, 1024), 1024);
  EXPECT_EQ(commonMtu(2048, 4096), 2048);
  EXPECT_EQ(commonMtu(512, 512), 512);
}

TEST(Mtu, BytesAndEnumConvertBothWays) {
  const int bytes[] = {256, 512, 1024, 2048, 4096};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(mtuEnum(bytes[i]), i + 1);
    EXPECT_EQ(mtuBytes(i + 1), bytes[i]);
  }
  for (int bad : {0, 128, 1000, 1500, 8192}) EXPECT_EQ(mtuEnum(bad), 0) << bad;
  EXPECT_EQ(mtuBytes(0), 0);
  EXPECT_EQ(mtuBytes(6), 0);
}

TEST(IbKnobs, DefaultsAndBoundsAreAccepted) {
  EXPECT_EQ(checkTimeout(kDefaultTimeout), 20);
  EXPECT_EQ(checkTimeout(1), 1);
  EXPECT_EQ(checkTimeout(31), 31);
  EXPECT_EQ(checkRetryCount(kDefaultRetryCount), 7);
  EXPECT_EQ(checkRetryCount(0), 0);
  EXPECT_EQ(checkQpsPerConnection(kDefaultQpsPerConnection), 1);
  EXPECT_EQ(checkQpsPerConnection(16), 16);
  EXPECT_EQ(checkGidIndex(-1), -1);
  EXPECT_EQ(checkGidIndex(255), 255);
}

TEST(IbKnobs, OutOfRangeIsRejectedNamingTheKnob) {
  expectError([] { checkTimeout(0); }, ErrorCode::InvalidArgument,
              "BRAID_IB_TIMEOUT 0: must be in 1..31");
  expectError([] { checkTimeout(32); }, ErrorCode::InvalidArgument, "BRAID_IB_TIMEOUT 32");
  expectError([] { checkRetryCount(8); }, ErrorCode::InvalidArgument,
              "BRAID_IB_RETRY_CNT 8: must be in 0..7");
  expectError([] { checkRetryCount(-1); }, ErrorCode::InvalidArgument, "BRAID_IB_RETRY_CNT -1");
  expectError([] { checkQpsPerConnection(0); }, ErrorCode::InvalidArgument,
              "BRAID_IB_QPS_PER_CONNECTION 0: must be in 1..16");
  expectError([] { checkQpsPerConnection(17); }, ErrorCode::InvalidArgument,
              "BRAID_IB_QPS_PER_CONNECTION 17");
  expectError([] { checkGidIndex(-2); }, ErrorCode::InvalidArgument, "BRAID_IB_GID_INDEX -2");
  expectError([] { checkTimeout(40, "NCCL_IB_TIMEOUT"); }, ErrorCode::InvalidArgument,
              "NCCL_IB_TIMEOUT 40");
}

// ------------------------------------------------------------ the wire

EndpointInfo endpoint(size_t qps) {
  EndpointInfo info;
  info.lid = 0xbeef;
  info.gid = gidOf("0:0:0:0:0:ffff:c0a8:010a");
  info.useGid = true;
  info.mtu = 4096;
  for (size_t i = 0; i < qps; ++i) {
    info.qpNums.push_back(0x100 + static_cast<uint32_t>(i));
    info.psns.push_back(0xabc000 + static_cast<uint32_t>(i));
  }
  info.fifoAddress = 0x7f0012345000;
  info.fifoRkey = 0x11223344;
  info.slots = 8;
  info.slotBytes = 1 << 20;
  return info;
}

// `info` encoded, with byte `at` set to `value`.
std::vector<std::byte> patched(const EndpointInfo& info, size_t at, uint8_t value) {
  std::vector<std::byte> bytes = encode(info);
  bytes.at(at) = static_cast<std::byte>(value);
  return bytes;
}

void expectRefused(const std::vector<std::byte>& bytes, const std::string& part) {
  expectError([&] { decode(bytes.data(), bytes.size()); }, ErrorCode::RemoteError, part);
}

TEST(IbWire, RoundTripKeepsEveryField) {
  for (size_t qps : {size_t{1}, size_t{2}, kWireMaxQps}) {
    const EndpointInfo info = endpoint(qps);
    const std::vector<std::byte> bytes = encode(info);
    EXPECT_EQ(bytes.size(), encodedSize(qps));
    EXPECT_EQ(decode(bytes.data(), bytes.size()), info) << qps << " QPs";
  }
  EndpointInfo plain = endpoint(1);
  plain.useGid = false;
  plain.gid = Gid{};
  plain.mtu = 256;
  plain.slots = 2;
  plain.slotBytes = 1;
  const std::vector<std::byte> bytes = encode(plain);
  EXPECT_EQ(decode(bytes.data(), bytes.size()), plain);
}

TEST(IbWire, FieldsSitLittleEndianAtTheDocumentedOffsets) {
  const std::vector<std::byte> bytes = encode(endpoint(2));
  auto at = [&](size_t offset) { return static_cast<unsigned>(bytes.at(offset)); };
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), 4), "BRIB");
  EXPECT_EQ(at(4), 1u);     // version
  EXPECT_EQ(at(6), 2u);     // QP count
  EXPECT_EQ(at(8), 0xefu);  // lid, low byte first
  EXPECT_EQ(at(9), 0xbeu);
  EXPECT_EQ(at(10), 1u);          // useGid
  EXPECT_EQ(at(12 + 10), 0xffu);  // gid
  EXPECT_EQ(at(29), 0x10u);       // mtu 4096 = 0x1000
  EXPECT_EQ(at(32), 0x00u);       // fifoAddress = 0x7f0012345000
  EXPECT_EQ(at(33), 0x50u);
  EXPECT_EQ(at(37), 0x7fu);
  EXPECT_EQ(at(40), 0x44u);  // fifoRkey
  EXPECT_EQ(at(43), 0x11u);
  EXPECT_EQ(at(44), 8u);     // slots
  EXPECT_EQ(at(50), 0x10u);  // slotBytes 1 << 20 = 0x100000
  EXPECT_EQ(at(52), 0x00u);  // qpNums[0] = 0x100
  EXPECT_EQ(at(53), 0x01u);
  EXPECT_EQ(at(56), 0x01u);  // qpNums[1] = 0x101
  EXPECT_EQ(at(60), 0x00u);  // psns[0] = 0xabc000
  EXPECT_EQ(at(62), 0xabu);
  EXPECT_EQ(at(64), 0x01u);  // psns[1] = 0xabc001
  EXPECT_EQ(bytes.size(), 68u);
}

TEST(IbWire, EveryTruncationIsRejectedNamingTheField) {
  // The documented layout for 2 QPs: where each field starts, in order.
  struct Field {
    size_t offset;
    const char* name;
  };
  const std::vector<Field> fields = {
      {0, "magic"},      {4, "version"},    {6, "the QP count"},
      {8, "lid"},        {10, "useGid"},    {11, "the reserved byte"},
      {12, "gid"},       {28, "mtu"},       {32, "fifoAddress"},
      {40, "fifoRkey"},  {44, "slots"},     {48, "slotBytes"},
      {52, "qpNums[0]"}, {56, "qpNums[1]"}, {60, "psns[0]"},
      {64, "psns[1]"},
  };
  const std::vector<std::byte> bytes = encode(endpoint(2));
  ASSERT_EQ(bytes.size(), 68u);
  for (size_t length = 0; length < bytes.size(); ++length) {
    SCOPED_TRACE(length);
    size_t field = 0;
    while (field + 1 < fields.size() && fields[field + 1].offset <= length) ++field;
    const size_t end = field + 1 < fields.size() ? fields[field + 1].offset : bytes.size();
    expectError([&] { decode(bytes.data(), length); }, ErrorCode::RemoteError,
                std::string("truncated at ") + fields[field].name + " (the field needs " +
                    std::to_string(end - fields[field].offset) + " bytes from offset " +
                    std::to_string(fields[field].offset) + ")");
  }
}

TEST(IbWire, WrongMagicIsRejected) { expectRefused(patched(endpoint(1), 0, 'X'), "wrong magic"); }

TEST(IbWire, OtherVersionIsRejectedSayingWhich) {
  expectRefused(patched(endpoint(1), 4, 2), "version 2, where this build speaks version 1");
  expectRefused(patched(endpoint(1), 5, 1), "version 257");
}

TEST(IbWire, QpCountOutsideOneToSixteenIsRejected) {
  expectRefused(patched(endpoint(1), 6, 0), "QP count 0, not in 1..16");
  expectRefused(patched(endpoint(16), 6, 17), "QP count 17, not in 1..16");
  expectRefused(patched(endpoint(1), 7, 1), "QP count 257");
}

TEST(IbWire, QpCountThatDisagreesWithTheLengthIsRejected) {
  // One QP more than sent: the record ends early; one fewer: bytes are left.
  expectRefused(patched(endpoint(2), 6, 3), "truncated at psns[1]");
  expectRefused(patched(endpoint(2), 6, 1), "8 bytes after the last field (it says 1 QPs");
}

TEST(IbWire, FlagAndReservedBytesMustBeClean) {
  expectRefused(patched(endpoint(1), 10, 2), "useGid is 2");
  expectRefused(patched(endpoint(1), 11, 1), "the reserved byte is 1");
}

TEST(IbWire, MtuThatIsNotAPowerOfTwoIn256To4096IsRejected) {
  for (uint32_t mtu : {0u, 128u, 1000u, 1500u, 8192u}) {
    std::vector<std::byte> bytes = encode(endpoint(1));
    for (int i = 0; i < 4; ++i) bytes[28 + i] = static_cast<std::byte>(mtu >> (8 * i));
    expectRefused(bytes, "mtu " + std::to_string(mtu));
  }
}

TEST(IbWire, FewerThanTwoSlotsOrEmptySlotsAreRejected) {
  std::vector<std::byte> bytes = encode(endpoint(1));
  bytes[44] = std::byte{1};
  expectRefused(bytes, "1 slots, fewer than 2");
  bytes = encode(endpoint(1));
  for (int i = 0; i < 4; ++i) bytes[48 + i] = std::byte{0};
  expectRefused(bytes, "slotBytes is 0");
}

TEST(IbWire, TrailingBytesAreRejected) {
  std::vector<std::byte> bytes = encode(endpoint(1));
  bytes.push_back(std::byte{0});
  expectRefused(bytes, "1 bytes after the last field");
}

TEST(IbWire, EncodeRefusesWhatDecodeWould) {
  EndpointInfo info = endpoint(2);
  info.psns.pop_back();
  expectError([&] { encode(info); }, ErrorCode::Internal, "qpNums and psns differ in length");
  expectError([] { encode(endpoint(0)); }, ErrorCode::Internal, "QP count");
  expectError([] { encode(endpoint(17)); }, ErrorCode::Internal, "QP count");
  info = endpoint(1);
  info.mtu = 1500;
  expectError([&] { encode(info); }, ErrorCode::Internal, "mtu");
  info = endpoint(1);
  info.slots = 1;
  expectError([&] { encode(info); }, ErrorCode::Internal, "fewer than 2 slots");
  info = endpoint(1);
  info.slotBytes = 0;
  expectError([&] { encode(info); }, ErrorCode::Internal, "slotBytes is 0");
}

// ------------------------------------------------------ the registration cache

constexpr uintptr_t kPage = RegistrationCache::kPageBytes;
constexpr uintptr_t kBase = 0x7f0000000000;  // never dereferenced

const void* addr(uintptr_t offset) { return reinterpret_cast<const void*>(kBase + offset); }

// Records what the cache registers and deregisters; region n has keys n.
struct Registrar {
  struct Call {
    uintptr_t offset;  // from kBase
    size_t bytes;
    bool operator==(const Call& other) const {
      return offset == other.offset && bytes == other.bytes;
    }
  };
  std::vector<Call> registered;
  std::vector<uint32_t> deregistered;  // region numbers, in order
  bool failNext = false;
  bool failDeregister = false;

  RegistrationCache cache(size_t idleCapacity) {
    return RegistrationCache(
        [this](void* base, size_t bytes) {
          if (failNext) throw Error(ErrorCode::SystemError, "ibv_reg_mr: Cannot allocate memory");
          registered.push_back({reinterpret_cast<uintptr_t>(base) - kBase, bytes});
          const uint32_t number = static_cast<uint32_t>(registered.size());
          return RegistrationCache::Registered{reinterpret_cast<MemoryRegion*>(uintptr_t{number}),
                                               Keys{number, number + 1000}};
        },
        [this](MemoryRegion* region) {
          deregistered.push_back(static_cast<uint32_t>(reinterpret_cast<uintptr_t>(region)));
          if (failDeregister) throw Error(ErrorCode::SystemError, "ibv_dereg_mr: Invalid argument");
        },
        idleCapacity);
  }
};

using Calls = std::vector<Registrar::Call>;
using Numbers = std::vector<uint32_t>;

TEST(RegistrationCache, MissRegistersTheEnclosingPages) {
  Registrar registrar;
  RegistrationCache cache = registrar.cache(1 << 20);
  RegistrationCache::Handle one = cache.acquire(addr(0x10), 100);
  EXPECT_EQ(registrar.registered, (Calls{{0, kPage}}));
  EXPECT_EQ(one.keys().lkey, 1u);
  EXPECT_EQ(one.keys().rkey, 1001u);
  EXPECT_EQ(one.base(), kBase);
  EXPECT_EQ(one.bytes(), kPage);
  RegistrationCache::Handle two = cache.acquire(addr(3 * kPage - 1), 2);  // spans two pages
  EXPECT_EQ(registrar.registered, (Calls{{0, kPage}, {2 * kPage, 2 * kPage}}));
  EXPECT_EQ(cache.counters().misses, 2u);
  EXPECT_EQ(cache.counters().hits, 0u);
  cache.release(one);
  cache.release(two);
}

TEST(RegistrationCache, RangeInsideALargerRegionHitsIt) {
  Registrar registrar;
  RegistrationCache cache = registrar.cache(1 << 20);
  RegistrationCache::Handle whole = cache.acquire(addr(0), 3 * kPage);
  RegistrationCache::Handle inside = cache.acquire(addr(kPage + 0x10), 64);
  RegistrationCache::Handle edge = cache.acquire(addr(2 * kPage), kPage);
  EXPECT_EQ(registrar.registered.size(), 1u);
  EXPECT_EQ(inside.keys().lkey, whole.keys().lkey);
  EXPECT_EQ(edge.region(), whole.region());
  EXPECT_EQ(cache.counters().hits, 2u);
  EXPECT_EQ(cache.counters().misses, 1u);
  for (RegistrationCache::Handle* handle : {&whole, &inside, &edge}) cache.release(*handle);
}

TEST(RegistrationCache, ZeroBytesStillGetsKeysForItsPage) {
  Registrar registrar;
  RegistrationCache cache = registrar.cache(1 << 20);
  RegistrationCache::Handle handle = cache.acquire(addr(kPage + 5), 0);
  EXPECT_TRUE(handle);
  EXPECT_EQ(registrar.registered, (Calls{{kPage, kPage}}));
  cache.release(handle);
}

TEST(RegistrationCache, RangeWrappingTheAddressSpaceIsRejected) {
  Registrar registrar;
  RegistrationCache cache = registrar.cache(1 << 20);
  expectError([&] { cache.acquire(reinterpret_cast<const void*>(~uintptr_t{0} - 10), 100); },
              ErrorCode::InvalidArgument, "wraps around");
  EXPECT_TRUE(registrar.registered.empty());
}

TEST(RegistrationCache, RangeReachingPastARegionRegistersTheUnionAndRetiresTheOld) {
  Registrar registrar;
  RegistrationCache cache = registrar.cache(1 << 20);
  RegistrationCache::Handle first = cache.acquire(addr(0), kPage);
  RegistrationCache::Handle wider = cache.acquire(addr(kPage - 16), 32);
  EXPECT_EQ(registrar.registered, (Calls{{0, kPage}, {0, 2 * kPage}}));
  EXPECT_EQ(cache.counters().merged, 1u);
  EXPECT_TRUE(registrar.deregistered.empty());  // still held
  EXPECT_EQ(first.keys().lkey, 1u);             // the holder keeps its keys
  // The old region is never hit again: the new one covers its range.
  RegistrationCache::Handle again = cache.acquire(addr(0), 8);
  EXPECT_EQ(again.keys().lkey, 2u);
  cache.release(first);
  EXPECT_EQ(registrar.deregistered, (Numbers{1}));
  cache.release(wider);
  cache.release(again);
  EXPECT_EQ(registrar.deregistered, (Numbers{1}));  // region 2 stays cached
}

TEST(RegistrationCache, MergeTakesInEveryOverlappedRegion) {
  Registrar registrar;
  RegistrationCache cache = registrar.cache(1 << 20);
  RegistrationCache::Handle a = cache.acquire(addr(0), kPage);
  RegistrationCache::Handle b = cache.acquire(addr(2 * kPage), kPage);
  cache.release(b);  // idle: deregistered as soon as it is merged
  RegistrationCache::Handle all = cache.acquire(addr(kPage / 2), 2 * kPage);
  EXPECT_EQ(registrar.registered.back(), (Registrar::Call{0, 3 * kPage}));
  EXPECT_EQ(registrar.deregistered, (Numbers{2}));
  EXPECT_EQ(cache.counters().merged, 2u);
  EXPECT_EQ(cache.idleBytes(), 0u);
  cache.release(a);
  cache.release(all);
  EXPECT_EQ(registrar.deregistered, (Numbers{2, 1}));
}

TEST(RegistrationCache, RegionIsIdleOnlyAfterItsLastRelease) {
  Registrar registrar;
  RegistrationCache cache = registrar.cache(1 << 20);
  RegistrationCache::Handle one = cache.acquire(addr(0), 100);
  RegistrationCache::Handle two = cache.acquire(addr(0), 100);
  cache.release(one);
  EXPECT_FALSE(one);
  EXPECT_EQ(cache.idleBytes(), 0u);
  cache.release(two);
  EXPECT_EQ(cache.idleBytes(), kPage);
  EXPECT_TRUE(registrar.deregistered.empty());
  RegistrationCache::Handle three = cache.acquire(addr(8), 8);  // a hit on the idle region
  EXPECT_EQ(cache.idleBytes(), 0u);
  EXPECT_EQ(registrar.registered.size(), 1u);
  cache.release(three);
  expectError([&] { cache.release(three); }, ErrorCode::Internal, "not held");
}

TEST(RegistrationCache, IdleRegionsAreEvictedLeastRecentlyReleasedFirst) {
  Registrar registrar;
  RegistrationCache cache = registrar.cache(2 * kPage);
  RegistrationCache::Handle a = cache.acquire(addr(0), kPage);          // region 1
  RegistrationCache::Handle b = cache.acquire(addr(2 * kPage), kPage);  // region 2
  RegistrationCache::Handle c = cache.acquire(addr(4 * kPage), kPage);  // region 3
  cache.release(b);
  cache.release(a);
  EXPECT_TRUE(registrar.deregistered.empty());  // two pages idle: within capacity
  cache.release(c);
  EXPECT_EQ(registrar.deregistered, (Numbers{2}));
  EXPECT_EQ(cache.counters().evictions, 1u);
  // A hit makes a region the most recent once released again.
  a = cache.acquire(addr(0), 8);
  cache.release(a);
  RegistrationCache::Handle d = cache.acquire(addr(6 * kPage), kPage);  // region 4
  cache.release(d);
  EXPECT_EQ(registrar.deregistered, (Numbers{2, 3}));
  EXPECT_EQ(cache.idleBytes(), 2 * kPage);
  // The evicted range registers afresh.
  b = cache.acquire(addr(2 * kPage), 8);
  EXPECT_EQ(b.keys().lkey, 5u);
  cache.release(b);
}

TEST(RegistrationCache, ZeroCapacityDeregistersAtTheLastRelease) {
  Registrar registrar;
  RegistrationCache cache = registrar.cache(0);
  RegistrationCache::Handle one = cache.acquire(addr(0), 100);
  RegistrationCache::Handle two = cache.acquire(addr(0), 100);
  cache.release(one);
  EXPECT_TRUE(registrar.deregistered.empty());
  cache.release(two);
  EXPECT_EQ(registrar.deregistered, (Numbers{1}));
  EXPECT_EQ(cache.regions(), 0u);
}

TEST(RegistrationCache, InvalidateDeregistersIdleRegionsAndRetiresHeldOnes) {
  Registrar registrar;
  RegistrationCache cache = registrar.cache(1 << 20);
  RegistrationCache::Handle idle = cache.acquire(addr(0), kPage);           // region 1
  RegistrationCache::Handle held = cache.acquire(addr(2 * kPage), kPage);   // region 2
  RegistrationCache::Handle apart = cache.acquire(addr(8 * kPage), kPage);  // region 3
  cache.release(idle);
  cache.invalidate(addr(100), 2 * kPage + 1);  // touches regions 1 and 2, not 3
  EXPECT_EQ(registrar.deregistered, (Numbers{1}));
  EXPECT_EQ(cache.counters().invalidated, 2u);
  // The held region is never hit again, though its holder still uses it.
  RegistrationCache::Handle fresh = cache.acquire(addr(2 * kPage), 8);
  EXPECT_EQ(fresh.keys().lkey, 4u);
  EXPECT_EQ(held.keys().lkey, 2u);
  cache.release(held);
  EXPECT_EQ(registrar.deregistered, (Numbers{1, 2}));
  // Region 3 was outside the range and still hits.
  RegistrationCache::Handle again = cache.acquire(addr(8 * kPage + 8), 8);
  EXPECT_EQ(again.keys().lkey, 3u);
  for (RegistrationCache::Handle* handle : {&fresh, &apart, &again}) cache.release(*handle);
  EXPECT_EQ(registrar.deregistered, (Numbers{1, 2}));
}

TEST(RegistrationCache, InvalidateOfUntouchedMemoryChangesNothing) {
  Registrar registrar;
  RegistrationCache cache = registrar.cache(1 << 20);
  RegistrationCache::Handle handle = cache.acquire(addr(kPage), kPage);
  cache.release(handle);
  cache.invalidate(addr(0), kPage);  // ends where the region begins
  cache.invalidate(addr(2 * kPage), kPage);
  EXPECT_TRUE(registrar.deregistered.empty());
  EXPECT_EQ(cache.counters().invalidated, 0u);
  EXPECT_EQ(cache.regions(), 1u);
}

TEST(RegistrationCache, ThrowingRegisterLeavesTheCacheUnchanged) {
  Registrar registrar;
  RegistrationCache cache = registrar.cache(1 << 20);
  RegistrationCache::Handle first = cache.acquire(addr(0), kPage);
  cache.release(first);
  registrar.failNext = true;
  // A miss that would have merged region 1 into a larger one.
  expectError([&] { cache.acquire(addr(kPage - 8), 16); }, ErrorCode::SystemError, "ibv_reg_mr");
  EXPECT_EQ(cache.regions(), 1u);
  EXPECT_EQ(cache.idleBytes(), kPage);
  EXPECT_EQ(cache.counters().misses, 1u);
  EXPECT_EQ(cache.counters().merged, 0u);
  EXPECT_TRUE(registrar.deregistered.empty());
  registrar.failNext = false;
  RegistrationCache::Handle hit = cache.acquire(addr(8), 8);  // region 1 still hits
  EXPECT_EQ(hit.keys().lkey, 1u);
  EXPECT_EQ(cache.counters().hits, 1u);
  cache.release(hit);
}

TEST(RegistrationCache, ThrowingDeregisterStillTakesEveryRegionOut) {
  Registrar registrar;
  RegistrationCache cache = registrar.cache(1 << 20);
  RegistrationCache::Handle a = cache.acquire(addr(0), kPage);
  RegistrationCache::Handle b = cache.acquire(addr(2 * kPage), kPage);
  cache.release(a);
  cache.release(b);
  registrar.failDeregister = true;
  expectError([&] { cache.invalidate(addr(0), 3 * kPage); }, ErrorCode::SystemError,
              "ibv_dereg_mr");
  EXPECT_EQ(registrar.deregistered, (Numbers{1, 2}));  // both tried, though the first threw
  EXPECT_EQ(cache.regions(), 0u);
  EXPECT_EQ(cache.idleBytes(), 0u);
  registrar.failDeregister = false;
}

TEST(RegistrationCache, DestructorDeregistersEveryRegionHeldOrNot) {
  Registrar registrar;
  {
    RegistrationCache cache = registrar.cache(1 << 20);
    RegistrationCache::Handle held = cache.acquire(addr(0), kPage);
    RegistrationCache::Handle idle = cache.acquire(addr(4 * kPage), kPage);
    cache.release(idle);
    (void)held;
  }
  EXPECT_EQ(registrar.deregistered.size(), 2u);
}

}  // namespace
}  // namespace braid::transport::ibverbs
