// The libibverbs backend (transports/ibverbs/verbs_real.h). Everywhere:
// loading (the library found, a missing one named) and the status names.
// Where an RDMA device exists (hardware, or soft RoCE: `rdma link add rxe0
// type rxe netdev eth0`), one QP connected to itself writes into its own
// memory: that checks the binding end to end. Without a device those
// tests skip, saying so.
//
// This binary is linked without -libverbs: that it links at all shows the
// backend reaches libibverbs only through dlopen.
#include "transports/ibverbs/verbs_real.h"

#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace braid::transport::ibverbs {
namespace {

std::unique_ptr<VerbsBackend> loadOrFail() {
  std::string why;
  std::unique_ptr<VerbsBackend> backend = loadLibibverbs(&why);
  EXPECT_NE(backend, nullptr) << why;
  return backend;
}

TEST(VerbsReal, LoadsTheInstalledLibrary) {
  std::unique_ptr<VerbsBackend> backend = loadOrFail();
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->describe(), "libibverbs");
  // Loaded once per process: a second backend shares the library.
  std::string why;
  EXPECT_NE(loadLibibverbs(&why), nullptr) << why;
}

TEST(VerbsReal, NoDeviceOnThisMachineIsAnEmptyList) {
  std::unique_ptr<VerbsBackend> backend = loadOrFail();
  ASSERT_NE(backend, nullptr);
  std::vector<std::string> names = backend->deviceNames();
  if (!names.empty()) GTEST_SKIP() << "this machine has RDMA devices (" << names[0] << ", ...)";
  EXPECT_TRUE(names.empty());
}

TEST(VerbsReal, AMissingLibraryFailsNamingIt) {
  std::string why;
  EXPECT_EQ(loadLibibverbs(&why, "libbraid-no-such-verbs.so.1"), nullptr);
  EXPECT_NE(why.find("cannot load libbraid-no-such-verbs.so.1"), std::string::npos) << why;
  // Asked again, the same answer (the failure is remembered too).
  std::string again;
  EXPECT_EQ(loadLibibverbs(&again, "libbraid-no-such-verbs.so.1"), nullptr);
  EXPECT_EQ(again, why);
}

TEST(VerbsReal, ALibraryWithoutTheVerbsFailsNamingTheFirstMissingOne) {
  std::string why;
  EXPECT_EQ(loadLibibverbs(&why, "libm.so.6"), nullptr);
  EXPECT_EQ(why, "libm.so.6 lacks ibv_get_device_list");
}

// Every status name against the header's own enumerators and spelling.
TEST(VerbsReal, StatusNamesAreTheIbvWcStatusNames) {
#define BRAID_STATUS(name) \
  { name, #name }
  struct Named {
    int number;
    const char* name;
  };
  const Named statuses[] = {
      BRAID_STATUS(IBV_WC_SUCCESS),
      BRAID_STATUS(IBV_WC_LOC_LEN_ERR),
      BRAID_STATUS(IBV_WC_LOC_QP_OP_ERR),
      BRAID_STATUS(IBV_WC_LOC_EEC_OP_ERR),
      BRAID_STATUS(IBV_WC_LOC_PROT_ERR),
      BRAID_STATUS(IBV_WC_WR_FLUSH_ERR),
      BRAID_STATUS(IBV_WC_MW_BIND_ERR),
      BRAID_STATUS(IBV_WC_BAD_RESP_ERR),
      BRAID_STATUS(IBV_WC_LOC_ACCESS_ERR),
      BRAID_STATUS(IBV_WC_REM_INV_REQ_ERR),
      BRAID_STATUS(IBV_WC_REM_ACCESS_ERR),
      BRAID_STATUS(IBV_WC_REM_OP_ERR),
      BRAID_STATUS(IBV_WC_RETRY_EXC_ERR),
      BRAID_STATUS(IBV_WC_RNR_RETRY_EXC_ERR),
      BRAID_STATUS(IBV_WC_LOC_RDD_VIOL_ERR),
      BRAID_STATUS(IBV_WC_REM_INV_RD_REQ_ERR),
      BRAID_STATUS(IBV_WC_REM_ABORT_ERR),
      BRAID_STATUS(IBV_WC_INV_EECN_ERR),
      BRAID_STATUS(IBV_WC_INV_EEC_STATE_ERR),
      BRAID_STATUS(IBV_WC_FATAL_ERR),
      BRAID_STATUS(IBV_WC_RESP_TIMEOUT_ERR),
      BRAID_STATUS(IBV_WC_GENERAL_ERR),
      BRAID_STATUS(IBV_WC_TM_ERR),
      BRAID_STATUS(IBV_WC_TM_RNDV_INCOMPLETE),
  };
#undef BRAID_STATUS
  for (const Named& status : statuses) {
    EXPECT_STREQ(wcStatusName(static_cast<WcStatus>(status.number)), status.name);
  }
  EXPECT_EQ(static_cast<int>(WcStatus::RetryExcErr), IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(static_cast<int>(WcStatus::GeneralErr), IBV_WC_GENERAL_ERR);
}

TEST(VerbsReal, UnknownStatusesAreNamedByNumber) {
  EXPECT_STREQ(wcStatusName(static_cast<WcStatus>(24)), "IBV_WC_24");
  EXPECT_STREQ(wcStatusName(static_cast<WcStatus>(255)), "IBV_WC_255");
  EXPECT_STREQ(wcStatusName(static_cast<WcStatus>(256)), "IBV_WC_UNKNOWN");
  EXPECT_STREQ(wcStatusName(static_cast<WcStatus>(-1)), "IBV_WC_UNKNOWN");
}

TEST(VerbsReal, HintsSayWhatUsuallyCausesAStatus) {
  EXPECT_NE(std::string(wcStatusHint(WcStatus::RetryExcErr)).find("GID index"), std::string::npos);
  EXPECT_NE(std::string(wcStatusHint(WcStatus::RemAccessErr)).find("rkey"), std::string::npos);
  EXPECT_NE(std::string(wcStatusHint(WcStatus::RnrRetryExcErr)).find("no receive posted"),
            std::string::npos);
  EXPECT_NE(std::string(wcStatusHint(WcStatus::WrFlushErr)).find("first error"), std::string::npos);
  EXPECT_STREQ(wcStatusHint(WcStatus::Success), "");
  EXPECT_STREQ(wcStatusHint(static_cast<WcStatus>(99)), "");
}

// A device's first port, a QP connected to itself, one WRITE_WITH_IMM from
// one buffer into another and one READ back: the data, the receive's
// immediate and byte count, and both send completions.
TEST(VerbsReal, AQpConnectedToItselfWritesAndReadsItsOwnMemory) {
  std::unique_ptr<VerbsBackend> backend = loadOrFail();
  ASSERT_NE(backend, nullptr);
  std::vector<std::string> names = backend->deviceNames();
  if (names.empty()) GTEST_SKIP() << "no RDMA device on this machine (ibv_get_device_list)";

  DeviceInfo info;
  Device* device = backend->openDevice(names[0], &info);
  EXPECT_EQ(info.name, names[0]);
  ASSERT_GE(info.ports, 1);
  PortInfo port = backend->queryPort(device, 1);
  if (port.state != PortState::Active) {
    backend->closeDevice(device);
    GTEST_SKIP() << names[0] << " port 1 is not active";
  }
  PathOptions path;
  path.port = 1;
  path.gidIndex = 0;
  path.mtu = port.activeMtu;
  path.psn = 0x123456;
  RemoteQp self;
  self.lid = port.lid;
  self.psn = path.psn;
  self.useGid = port.linkLayer == LinkLayer::Ethernet;
  if (self.useGid) self.gid = backend->queryGid(device, 1, path.gidIndex);

  ProtectionDomain* pd = backend->allocPd(device);
  constexpr size_t kBytes = size_t{64} << 10;
  auto* source = static_cast<unsigned char*>(backend->allocateTarget(kBytes));
  auto* target = static_cast<unsigned char*>(backend->allocateTarget(kBytes));
  auto* readBack = static_cast<unsigned char*>(backend->allocateTarget(kBytes));
  for (size_t i = 0; i < kBytes; ++i) source[i] = static_cast<unsigned char>(i * 7 + 1);
  Keys sourceKeys, targetKeys, readBackKeys;
  MemoryRegion* sourceMr = backend->registerMemory(pd, source, kBytes, kLocalWrite, &sourceKeys);
  MemoryRegion* targetMr = backend->registerMemory(
      pd, target, kBytes, kLocalWrite | kRemoteWrite | kRemoteRead, &targetKeys);
  MemoryRegion* readBackMr =
      backend->registerMemory(pd, readBack, kBytes, kLocalWrite, &readBackKeys);

  CompletionQueue* cq = backend->createCq(device, 64);
  QpCaps caps;
  caps.sendDepth = 16;
  caps.recvDepth = 16;
  caps.maxInline = 0;
  QueuePair* qp = backend->createQp(pd, cq, cq, caps, &self.qpNum);
  backend->toInit(qp, path);
  backend->toRtr(qp, self, path);
  backend->toRts(qp, path);

  RecvRequest receive;
  receive.wrId = 100;
  ASSERT_EQ(backend->postRecv(qp, &receive, 1), 0);
  SendRequest write;
  write.wrId = 1;
  write.opcode = Opcode::WriteWithImm;
  write.signaled = true;
  write.local = source;
  write.lkey = sourceKeys.lkey;
  write.bytes = kBytes;
  write.remoteAddr = reinterpret_cast<uintptr_t>(target);
  write.rkey = targetKeys.rkey;
  write.imm = 0xfeedbeef;
  ASSERT_EQ(backend->postSend(qp, &write, 1), 0);

  // Waits for `count` completions, sleeping in waitCq between polls.
  auto collect = [&](size_t count) {
    std::vector<Completion> got;
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
    while (got.size() < count && Clock::now() < deadline) {
      Completion batch[8];
      const int n = backend->pollCq(cq, batch, 8);
      got.insert(got.end(), batch, batch + n);
      if (n == 0) backend->waitCq(cq, deadline);
    }
    return got;
  };
  std::vector<Completion> done = collect(2);
  ASSERT_EQ(done.size(), 2u);
  for (const Completion& completion : done) {
    EXPECT_EQ(completion.status, WcStatus::Success)
        << wcStatusName(completion.status) << ": " << wcStatusHint(completion.status);
    EXPECT_EQ(completion.qpNum, self.qpNum);
    if (completion.wrId == receive.wrId) {
      EXPECT_EQ(completion.opcode, Opcode::RecvWithImm);
      EXPECT_EQ(completion.imm, 0xfeedbeefu);
      EXPECT_EQ(completion.bytes, kBytes);
    } else {
      EXPECT_EQ(completion.wrId, write.wrId);
      EXPECT_EQ(completion.opcode, Opcode::Write);
    }
  }
  EXPECT_EQ(std::memcmp(source, target, kBytes), 0);

  SendRequest read;
  read.wrId = 2;
  read.opcode = Opcode::Read;
  read.signaled = true;
  read.local = readBack;
  read.lkey = readBackKeys.lkey;
  read.bytes = kBytes;
  read.remoteAddr = reinterpret_cast<uintptr_t>(target);
  read.rkey = targetKeys.rkey;
  ASSERT_EQ(backend->postSend(qp, &read, 1), 0);
  done = collect(1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::Success) << wcStatusName(done[0].status);
  EXPECT_EQ(done[0].opcode, Opcode::Read);
  EXPECT_EQ(std::memcmp(source, readBack, kBytes), 0);

  // Nothing outstanding: a short wait returns by its deadline.
  const Clock::time_point before = Clock::now();
  backend->waitCq(cq, before + std::chrono::milliseconds(50));
  EXPECT_LT(Clock::now() - before, std::chrono::seconds(2));
  Completion none[1];
  EXPECT_EQ(backend->pollCq(cq, none, 1), 0);

  AsyncEvent event;
  while (backend->nextAsyncEvent(device, &event)) {
    EXPECT_NE(event.kind, AsyncEventKind::QpFatal) << "QP 0x" << std::hex << event.qpNum;
  }

  backend->destroyQp(qp);
  backend->destroyCq(cq);
  backend->deregister(readBackMr);
  backend->deregister(targetMr);
  backend->deregister(sourceMr);
  backend->releaseTarget(readBack, kBytes);
  backend->releaseTarget(target, kBytes);
  backend->releaseTarget(source, kBytes);
  backend->deallocPd(pd);
  backend->closeDevice(device);
}

}  // namespace
}  // namespace braid::transport::ibverbs
