// The fake fabric (tests/fake_fabric/fake_fabric.h) across processes: a
// forked child holds the other end of each connection; the two swap QP
// numbers, GIDs, addresses and rkeys over a socketpair and then tell each
// other when a step is done. And its library, loaded as libbraid loads it
// (transports/ibverbs/fake_fabric_loader.h).
#include "tests/fake_fabric/fake_fabric.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "braid/error.h"
#include "transports/ibverbs/fake_fabric_loader.h"

namespace braid::transport::ibverbs {
namespace {

using namespace std::chrono_literals;

// In a child's body: returns 1 (the child's exit status) with the failed
// condition on stderr.
#define CHILD_CHECK(condition)                                                    \
  do {                                                                            \
    if (!(condition)) {                                                           \
      std::fprintf(stderr, "child: %s:%d: %s\n", __FILE__, __LINE__, #condition); \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

// What one end tells the other: its QP and its target block.
struct Wire {
  uint32_t qpNum = 0;
  Gid gid;
  uint64_t address = 0;
  uint32_t rkey = 0;
};

// One end of a socketpair, moving plain values; a receive gives up after
// 5 s, so a test whose other side died fails instead of hanging.
class Channel {
 public:
  explicit Channel(int fd = -1) : fd_(fd) {}
  template <typename T>
  void send(const T& value) {
    const char* at = reinterpret_cast<const char*>(&value);
    for (size_t done = 0; done < sizeof value;) {
      const ssize_t n = ::send(fd_, at + done, sizeof value - done, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("channel: send failed");
      done += static_cast<size_t>(n);
    }
  }
  template <typename T>
  T recv() {
    T value;
    char* at = reinterpret_cast<char*>(&value);
    for (size_t done = 0; done < sizeof value;) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 5000) != 1) throw std::runtime_error("channel: nothing came in 5 s");
      const ssize_t n = ::recv(fd_, at + done, sizeof value - done, 0);
      if (n <= 0) throw std::runtime_error("channel: the other side closed");
      done += static_cast<size_t>(n);
    }
    return value;
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

struct PairSetup {
  QpCaps caps{16, 16, 64};
  int sendCqDepth = 64;
  int recvCqDepth = 64;
  size_t targetBytes = 1 << 16;
  PathOptions path;
  std::string childFault;      // the child's FakeOptions::fault
  bool parentConnects = true;  // false: the parent's QP stays in RESET
  bool childOwnNetns = false;  // the child enters network and mount namespaces of its own
  // The parent's backend comes from libbraid_fake_fabric.so, as libbraid's
  // does (the child's is linked in, as everywhere else here).
  bool parentLoadsTheLibrary = false;
};

// A backend with one device, a send and a receive CQ, one RC QP and a
// target block registered for local and remote access.
struct End {
  End(const std::string& fabric, const std::string& fault, const PairSetup& setup)
      : End(makeFakeFabric({fabric, fault}), setup) {}
  End(std::unique_ptr<VerbsBackend> made, const PairSetup& setup) : backend(std::move(made)) {
    device = backend->openDevice("fake_0", nullptr);
    pd = backend->allocPd(device);
    sendCq = backend->createCq(device, setup.sendCqDepth);
    recvCq = backend->createCq(device, setup.recvCqDepth);
    qp = backend->createQp(pd, sendCq, recvCq, setup.caps, &qpNum);
    targetBytes = setup.targetBytes;
    target = static_cast<uint8_t*>(backend->allocateTarget(targetBytes));
    mr = backend->registerMemory(pd, target, targetBytes, kLocalWrite | kRemoteWrite | kRemoteRead,
                                 &keys);
    path = setup.path;
    path.gidIndex = 1;
  }
  ~End() {
    backend->destroyQp(qp);
    backend->destroyCq(sendCq);
    backend->destroyCq(recvCq);
    backend->deregister(mr);
    backend->releaseTarget(target, targetBytes);
    backend->deallocPd(pd);
    backend->closeDevice(device);
  }

  Wire wire() const {
    Wire w;
    w.qpNum = qpNum, w.gid = backend->queryGid(device, 1, 1);
    w.address = reinterpret_cast<uint64_t>(target), w.rkey = keys.rkey;
    return w;
  }
  void connect(const Wire& peer) {
    RemoteQp remote;
    remote.qpNum = peer.qpNum, remote.gid = peer.gid, remote.useGid = true;
    backend->toInit(qp, path);
    backend->toRtr(qp, remote, path);
    backend->toRts(qp, path);
  }

  // A WR between target[offset..] and the peer's target[remoteOffset..].
  SendRequest wr(Opcode opcode, uint64_t wrId, size_t offset, uint32_t bytes, const Wire& peer,
                 uint64_t remoteOffset, bool signaled = true, uint32_t imm = 0) const {
    SendRequest r;
    r.wrId = wrId, r.opcode = opcode, r.signaled = signaled;
    r.local = target + offset, r.lkey = keys.lkey, r.bytes = bytes;
    r.remoteAddr = peer.address + remoteOffset, r.rkey = peer.rkey, r.imm = imm;
    return r;
  }
  int post(const SendRequest& request) { return backend->postSend(qp, &request, 1); }
  int postRecv(uint64_t wrId) {
    RecvRequest r{wrId};
    return backend->postRecv(qp, &r, 1);
  }
  // The next completion of `cq`, waiting for it up to `limit`.
  std::optional<Completion> next(CompletionQueue* cq, Clock::duration limit = 2s) {
    const Clock::time_point deadline = Clock::now() + limit;
    for (;;) {
      Completion c;
      if (backend->pollCq(cq, &c, 1) == 1) return c;
      if (Clock::now() >= deadline) return std::nullopt;
      backend->waitCq(cq, deadline);
    }
  }
  std::optional<AsyncEvent> event() {
    AsyncEvent e;
    if (backend->nextAsyncEvent(device, &e)) return e;
    return std::nullopt;
  }

  std::unique_ptr<VerbsBackend> backend;
  Device* device;
  ProtectionDomain* pd;
  CompletionQueue* sendCq;
  CompletionQueue* recvCq;
  QueuePair* qp;
  uint32_t qpNum = 0;
  uint8_t* target;
  size_t targetBytes;
  MemoryRegion* mr;
  Keys keys;
  PathOptions path;
};

// Where the build put libbraid_fake_fabric.so.
const std::string kLibraryDirectory = BRAID_FAKE_FABRIC_DIR;

// A backend of libbraid_fake_fabric.so, loaded as libbraid loads it.
std::unique_ptr<VerbsBackend> loadedBackend(const std::string& fabric) {
  std::string why;
  std::unique_ptr<VerbsBackend> backend = loadFakeFabric(fabric, "", &why, kLibraryDirectory);
  if (!backend) throw std::runtime_error(why);
  return backend;
}

std::string testFabric() {
  return "fake-fabric-test-" + std::to_string(getpid()) + "-" +
         ::testing::UnitTest::GetInstance()->current_test_info()->name();
}

// The child's part once both ends are connected; returns its exit status.
using ChildBody = std::function<int(End& end, Channel& channel, const Wire& peer)>;

// Forks a child holding one End, builds the other End here and connects
// both (the parent's only if setup.parentConnects). Kills the child if it
// is still there at the end.
class TwoProcesses {
 public:
  TwoProcesses(const PairSetup& setup, const ChildBody& body) {
    const std::string fabric = testFabric();
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
      throw std::runtime_error("socketpair");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork");
    if (pid_ == 0) {
      close(fds[0]);
      int status = 2;
      try {
        status = runChild(fabric, setup, body, Channel(fds[1]));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child: %s\n", e.what());
      }
      _exit(status);
    }
    close(fds[1]);
    channel_ = Channel(fds[0]);
    if (channel_.recv<char>() != 'y') {
      skipped_ = true;
      return;
    }
    end_ = setup.parentLoadsTheLibrary ? std::make_unique<End>(loadedBackend(fabric), setup)
                                       : std::make_unique<End>(fabric, "", setup);
    channel_.send(end_->wire());
    peer_ = channel_.recv<Wire>();
    if (setup.parentConnects) end_->connect(peer_);
    channel_.send('c');
    channel_.recv<char>();  // the child is connected
  }
  ~TwoProcesses() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    end_.reset();
    close(channel_.fd());
  }

  bool skipped() const { return skipped_; }
  End& end() { return *end_; }
  Channel& channel() { return channel_; }
  const Wire& peer() const { return peer_; }
  pid_t pid() const { return pid_; }

  // The child's exit status (128 + signal if one ended it), waiting up to
  // 5 s; -1 if it had to be killed.
  int finish() {
    const Clock::time_point deadline = Clock::now() + 5s;
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
        return -1;
      }
      std::this_thread::sleep_for(1ms);
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  static int runChild(const std::string& fabric, const PairSetup& setup, const ChildBody& body,
                      Channel channel) {
    if (setup.childOwnNetns && unshare(CLONE_NEWNET | CLONE_NEWNS) != 0) {
      channel.send('n');
      return 0;
    }
    channel.send('y');
    End end(fabric, setup.childFault, setup);
    channel.send(end.wire());
    const Wire peer = channel.recv<Wire>();
    end.connect(peer);
    channel.send('c');
    channel.recv<char>();  // the parent is connected (or chose not to be)
    return body(end, channel, peer);
  }

  pid_t pid_ = -1;
  Channel channel_;
  std::unique_ptr<End> end_;
  Wire peer_;
  bool skipped_ = false;
};

void expectThrowNaming(const std::function<void()>& call, const std::string& word) {
  try {
    call();
    ADD_FAILURE() << "no exception; expected one naming " << word;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
  }
}

std::set<std::string> listing(const char* dir) {
  std::set<std::string> names;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d)) names.insert(e->d_name);
    closedir(d);
  }
  return names;
}

int countBytes(const uint8_t* at, size_t bytes, uint8_t value) {
  int n = 0;
  for (size_t i = 0; i < bytes; ++i) n += at[i] == value;
  return n;
}

size_t pageBytes() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// What the tests register as a dma-buf: a memfd mapped MAP_SHARED here, as
// the emulated device's memory is (its name is not the fabric's, so
// mappingCount() leaves it out).
constexpr char kDmabufName[] = "fake-fabric-test-dmabuf";
struct DeviceMemory {
  explicit DeviceMemory(size_t size) : bytes(size) {
    fd = memfd_create(kDmabufName, MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) throw std::runtime_error("memfd");
    void* mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapping == MAP_FAILED) throw std::runtime_error("mmap");
    data = static_cast<uint8_t*>(mapping);
  }
  ~DeviceMemory() {
    munmap(data, bytes);
    closeFd();
  }
  // What a caller may do right after registering.
  void closeFd() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  uint64_t address(size_t offset = 0) const { return reinterpret_cast<uint64_t>(data + offset); }

  int fd = -1;
  uint8_t* data = nullptr;
  size_t bytes;
};

// `e`'s wire, naming a dma-buf region at `address` instead of its target.
Wire regionWire(const End& e, uint64_t address, uint32_t rkey) {
  Wire w = e.wire();
  w.address = address, w.rkey = rkey;
  return w;
}

// ------------------------------------------------------------ the device

TEST(FakeFabric, DeviceIsOneActiveRoCEPortWithAGidPerProcess) {
  auto backend = makeFakeFabric({"fake-fabric-test-device", ""});
  EXPECT_EQ(backend->describe(), "fake fabric 'fake-fabric-test-device'");
  EXPECT_EQ(backend->deviceNames(), std::vector<std::string>{"fake_0"});
  EXPECT_THROW(backend->openDevice("mlx5_0", nullptr), Error);
  DeviceInfo info;
  Device* device = backend->openDevice("fake_0", &info);
  EXPECT_EQ(info.name, "fake_0");
  EXPECT_EQ(info.ports, 1);
  EXPECT_GE(info.maxQpWr, 1024);
  EXPECT_GE(info.maxCqe, 1024);
  const PortInfo port = backend->queryPort(device, 1);
  EXPECT_EQ(port.state, PortState::Active);
  EXPECT_EQ(port.linkLayer, LinkLayer::Ethernet);
  EXPECT_EQ(port.lid, 0);
  EXPECT_EQ(port.activeMtu, 4096);
  EXPECT_GE(port.gidTableLength, 2);

  const Gid linkLocal = backend->queryGid(device, 1, 0);
  EXPECT_EQ(linkLocal.raw[0], 0xfe);
  EXPECT_EQ(linkLocal.raw[1], 0x80);
  const Gid mapped = backend->queryGid(device, 1, 1);
  EXPECT_EQ(countBytes(mapped.raw.data(), 10, 0), 10);
  EXPECT_EQ(mapped.raw[10], 0xff);
  EXPECT_EQ(mapped.raw[11], 0xff);
  EXPECT_THROW(backend->queryGid(device, 1, port.gidTableLength), Error);

  // Another process has another GID.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  if (child == 0) {
    auto own = makeFakeFabric({"fake-fabric-test-device", ""});
    Device* d = own->openDevice("fake_0", nullptr);
    const Gid gid = own->queryGid(d, 1, 1);
    _exit(write(fds[1], &gid, sizeof gid) == sizeof gid ? 0 : 1);
  }
  Gid theirs;
  EXPECT_EQ(read(fds[0], &theirs, sizeof theirs), static_cast<ssize_t>(sizeof theirs));
  waitpid(child, nullptr, 0);
  close(fds[0]), close(fds[1]);
  EXPECT_FALSE(theirs == mapped);
  EXPECT_EQ(theirs.raw[10], 0xff);
  backend->closeDevice(device);
}

// ------------------------------------------------------------ data movement

TEST(FakeFabric, WriteLandsInThePeersTargetMemory) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire& peer) {
    for (int i = 0; i < 1000; ++i) e.target[i] = static_cast<uint8_t>(i * 7 + 1);
    CHILD_CHECK(e.post(e.wr(Opcode::Write, 5, 0, 1000, peer, 100)) == 0);
    const auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::Success && c->wrId == 5);
    CHILD_CHECK(c->opcode == Opcode::Write && c->qpNum == e.qpNum);
    channel.send('w');
    return 0;
  });
  p.channel().recv<char>();
  const uint8_t* t = p.end().target;
  int wrong = 0;
  for (int i = 0; i < 1000; ++i) wrong += t[100 + i] != static_cast<uint8_t>(i * 7 + 1);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(t[99], 0);
  EXPECT_EQ(t[1100], 0);
  EXPECT_EQ(p.finish(), 0);
}

TEST(FakeFabric, WriteWithImmCompletesAtThePeerWithItsImmBytesAndReceive) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire& peer) {
    channel.recv<char>();  // the peer's receive is posted
    std::memset(e.target, 0xab, 256);
    CHILD_CHECK(e.post(e.wr(Opcode::WriteWithImm, 9, 0, 256, peer, 4096, true, 0xabcd1234)) == 0);
    const auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::Success && c->opcode == Opcode::WriteWithImm);
    return 0;
  });
  End& e = p.end();
  ASSERT_EQ(e.postRecv(77), 0);
  p.channel().send('r');
  const auto c = e.next(e.recvCq);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, WcStatus::Success);
  EXPECT_EQ(c->opcode, Opcode::RecvWithImm);
  EXPECT_EQ(c->wrId, 77u);
  EXPECT_EQ(c->bytes, 256u);
  EXPECT_EQ(c->imm, 0xabcd1234u);
  EXPECT_EQ(c->qpNum, e.qpNum);
  EXPECT_EQ(countBytes(e.target + 4096, 256, 0xab), 256);  // visible once polled
  EXPECT_EQ(p.finish(), 0);
}

TEST(FakeFabric, ReadCopiesThePeersMemoryIntoLocalMemory) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire& peer) {
    channel.recv<char>();  // the peer's memory is filled
    CHILD_CHECK(e.post(e.wr(Opcode::Read, 3, 8192, 512, peer, 2048)) == 0);
    const auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::Success && c->opcode == Opcode::Read && c->wrId == 3);
    for (int i = 0; i < 512; ++i) CHILD_CHECK(e.target[8192 + i] == static_cast<uint8_t>(i ^ 0x5a));
    return 0;
  });
  for (int i = 0; i < 512; ++i) p.end().target[2048 + i] = static_cast<uint8_t>(i ^ 0x5a);
  p.channel().send('f');
  EXPECT_EQ(p.finish(), 0);
}

TEST(FakeFabric, UnsignaledWritesMakeNoCompletionButASignaledOneDoes) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire& peer) {
    SendRequest batch[4];
    for (int i = 0; i < 4; ++i) {
      e.target[i] = static_cast<uint8_t>(10 + i);
      batch[i] = e.wr(Opcode::Write, i + 1, i, 1, peer, i, i == 3);
    }
    CHILD_CHECK(e.backend->postSend(e.qp, batch, 4) == 0);
    const auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->wrId == 4 && c->status == WcStatus::Success);
    CHILD_CHECK(!e.next(e.sendCq, 20ms));
    channel.send('w');
    return 0;
  });
  p.channel().recv<char>();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(p.end().target[i], 10 + i);
  EXPECT_EQ(p.finish(), 0);
}

// ------------------------------------------------------------ queue depths

TEST(FakeFabric, SendDepthHoldsUntilASignaledCompletionIsPolled) {
  PairSetup setup;
  setup.caps.sendDepth = 4;
  TwoProcesses p(setup, [](End& e, Channel& channel, const Wire& peer) {
    SendRequest four[4];
    for (int i = 0; i < 4; ++i) four[i] = e.wr(Opcode::Write, i, 0, 1, peer, 0, i == 3);
    CHILD_CHECK(e.backend->postSend(e.qp, four, 4) == 0);
    e.target[1] = 'z';
    CHILD_CHECK(e.post(e.wr(Opcode::Write, 9, 1, 1, peer, 100)) == ENOMEM);  // all 4 unretired
    const auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->wrId == 3);  // retires all four
    for (int i = 0; i < 3; ++i)
      CHILD_CHECK(e.post(e.wr(Opcode::Write, 20 + i, 0, 1, peer, 0)) == 0);
    e.target[2] = 'y';
    SendRequest two[2] = {e.wr(Opcode::Write, 30, 2, 1, peer, 200),
                          e.wr(Opcode::Write, 31, 2, 1, peer, 201)};
    CHILD_CHECK(e.backend->postSend(e.qp, two, 2) == ENOMEM);  // one slot left: none posted
    CHILD_CHECK(e.post(e.wr(Opcode::Write, 23, 0, 1, peer, 0)) == 0);
    for (int i = 0; i < 4; ++i) {
      const auto done = e.next(e.sendCq);
      CHILD_CHECK(done && done->wrId == static_cast<uint64_t>(20 + i));
    }
    channel.send('d');
    return 0;
  });
  p.channel().recv<char>();
  EXPECT_EQ(p.end().target[100], 0);
  EXPECT_EQ(p.end().target[200], 0);
  EXPECT_EQ(p.end().target[201], 0);
  EXPECT_EQ(p.finish(), 0);
}

TEST(FakeFabric, ReceiveDepthHoldsUntilTheReceiveCompletionIsPolled) {
  PairSetup setup;
  setup.caps.recvDepth = 2;
  TwoProcesses p(setup, [](End& e, Channel& channel, const Wire& peer) {
    channel.recv<char>();
    CHILD_CHECK(e.post(e.wr(Opcode::WriteWithImm, 1, 0, 8, peer, 0, true, 1)) == 0);
    const auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::Success);
    channel.send('w');
    return 0;
  });
  End& e = p.end();
  EXPECT_EQ(e.postRecv(1), 0);
  EXPECT_EQ(e.postRecv(2), 0);
  EXPECT_EQ(e.postRecv(3), ENOMEM);
  p.channel().send('r');
  p.channel().recv<char>();
  EXPECT_EQ(e.postRecv(3), ENOMEM);  // consumed, but its completion not yet polled
  const auto c = e.next(e.recvCq);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wrId, 1u);
  EXPECT_EQ(e.postRecv(3), 0);
  EXPECT_EQ(p.finish(), 0);
}

// ------------------------------------------------------------ errors

TEST(FakeFabric, WriteWithImmWithoutAReceiveFailsRnrAndLaterWrsFlush) {
  TwoProcesses p({}, [](End& e, Channel&, const Wire& peer) {
    CHILD_CHECK(e.post(e.wr(Opcode::WriteWithImm, 1, 0, 16, peer, 0, true, 5)) == 0);
    auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->wrId == 1 && c->status == WcStatus::RnrRetryExcErr);
    CHILD_CHECK(e.post(e.wr(Opcode::Write, 2, 0, 16, peer, 0)) == 0);
    CHILD_CHECK(e.post(e.wr(Opcode::Write, 3, 0, 16, peer, 0, false)) == 0);
    c = e.next(e.sendCq);
    CHILD_CHECK(c && c->wrId == 2 && c->status == WcStatus::WrFlushErr);
    c = e.next(e.sendCq);  // unsignaled, but errors always complete
    CHILD_CHECK(c && c->wrId == 3 && c->status == WcStatus::WrFlushErr);
    const auto event = e.event();
    CHILD_CHECK(event && event->kind == AsyncEventKind::QpFatal && event->qpNum == e.qpNum);
    CHILD_CHECK(!e.event());  // once
    return 0;
  });
  EXPECT_EQ(p.finish(), 0);
}

// The child writes 16 bytes of 0xee to (address, rkey) the parent sends,
// expects `status` and then that the QP flushes.
int writeExpecting(End& e, Channel& channel, const Wire& peer, WcStatus status) {
  Wire to = channel.recv<Wire>();
  to.gid = peer.gid;
  std::memset(e.target, 0xee, 16);
  CHILD_CHECK(e.post(e.wr(Opcode::Write, 1, 0, 16, to, 0)) == 0);
  auto c = e.next(e.sendCq);
  CHILD_CHECK(c && c->wrId == 1);
  if (c->status != status) {
    std::fprintf(stderr, "child: status %d, expected %d\n", static_cast<int>(c->status),
                 static_cast<int>(status));
    return 1;
  }
  CHILD_CHECK(e.post(e.wr(Opcode::Write, 2, 0, 16, peer, 0)) == 0);
  c = e.next(e.sendCq);
  CHILD_CHECK(c && c->wrId == 2 && c->status == WcStatus::WrFlushErr);
  return 0;
}

TEST(FakeFabric, UnknownRkeyGivesRemoteAccessError) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire& peer) {
    return writeExpecting(e, channel, peer, WcStatus::RemAccessErr);
  });
  Wire to = p.end().wire();
  to.rkey ^= 0x100;
  p.channel().send(to);
  EXPECT_EQ(p.finish(), 0);
  EXPECT_EQ(countBytes(p.end().target, 16, 0), 16);
}

TEST(FakeFabric, WriteBeyondTheRegionGivesRemoteAccessError) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire& peer) {
    return writeExpecting(e, channel, peer, WcStatus::RemAccessErr);
  });
  Wire to = p.end().wire();
  to.address += p.end().targetBytes - 8;
  p.channel().send(to);
  EXPECT_EQ(p.finish(), 0);
  EXPECT_EQ(countBytes(p.end().target + p.end().targetBytes - 8, 8, 0), 8);
}

TEST(FakeFabric, RegionOutsideTargetMemoryIsNotReachable) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire& peer) {
    return writeExpecting(e, channel, peer, WcStatus::RemAccessErr);
  });
  std::vector<uint8_t> plain(4096);
  Keys keys;
  MemoryRegion* mr = p.end().backend->registerMemory(p.end().pd, plain.data(), plain.size(),
                                                     kLocalWrite | kRemoteWrite, &keys);
  Wire to = p.end().wire();
  to.address = reinterpret_cast<uint64_t>(plain.data()), to.rkey = keys.rkey;
  p.channel().send(to);
  EXPECT_EQ(p.finish(), 0);
  EXPECT_EQ(countBytes(plain.data(), 16, 0), 16);
  p.end().backend->deregister(mr);
}

TEST(FakeFabric, ReadWithoutRemoteReadAccessGivesRemoteAccessError) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire& peer) {
    Wire to = channel.recv<Wire>();
    CHILD_CHECK(e.post(e.wr(Opcode::Read, 1, 0, 16, to, 0)) == 0);
    const auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::RemAccessErr);
    (void)peer;
    return 0;
  });
  Keys keys;
  MemoryRegion* mr = p.end().backend->registerMemory(p.end().pd, p.end().target, 4096,
                                                     kLocalWrite | kRemoteWrite, &keys);
  Wire to = p.end().wire();
  to.rkey = keys.rkey;
  p.channel().send(to);
  EXPECT_EQ(p.finish(), 0);
  p.end().backend->deregister(mr);
}

TEST(FakeFabric, DeregisteredRkeyIsRejected) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire& peer) {
    Wire to = channel.recv<Wire>();
    e.target[0] = 1;
    CHILD_CHECK(e.post(e.wr(Opcode::Write, 1, 0, 1, to, 0)) == 0);
    auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::Success);
    channel.send('a');
    channel.recv<char>();  // deregistered
    e.target[0] = 2;
    CHILD_CHECK(e.post(e.wr(Opcode::Write, 2, 0, 1, to, 1)) == 0);
    c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::RemAccessErr);
    (void)peer;
    return 0;
  });
  End& e = p.end();
  Keys keys;
  MemoryRegion* mr =
      e.backend->registerMemory(e.pd, e.target, 4096, kLocalWrite | kRemoteWrite, &keys);
  Wire to = e.wire();
  to.rkey = keys.rkey;
  p.channel().send(to);
  p.channel().recv<char>();
  EXPECT_EQ(e.target[0], 1);
  e.backend->deregister(mr);
  p.channel().send('d');
  EXPECT_EQ(p.finish(), 0);
  EXPECT_EQ(e.target[1], 0);
}

TEST(FakeFabric, UnregisteredLocalBufferGivesLocalProtectionError) {
  TwoProcesses p({}, [](End& e, Channel&, const Wire& peer) {
    uint8_t elsewhere[64] = {};
    SendRequest request = e.wr(Opcode::Write, 1, 0, sizeof elsewhere, peer, 0);
    request.local = elsewhere;  // not under e.keys.lkey
    CHILD_CHECK(e.post(request) == 0);
    const auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::LocProtErr);
    return 0;
  });
  EXPECT_EQ(p.finish(), 0);
}

TEST(FakeFabric, InlineDataNeedsNoKeyAndItsLimitHolds) {
  PairSetup setup;
  setup.caps.maxInline = 32;
  TwoProcesses p(setup, [](End& e, Channel& channel, const Wire& peer) {
    uint8_t small[32];
    std::memset(small, 'i', sizeof small);
    SendRequest request = e.wr(Opcode::Write, 1, 0, sizeof small, peer, 64);
    request.inlineData = true, request.local = small, request.lkey = 0;
    CHILD_CHECK(e.post(request) == 0);
    std::memset(small, 0, sizeof small);
    const auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::Success);
    request.bytes = 33;
    CHILD_CHECK(e.post(request) == EINVAL);
    channel.send('w');
    return 0;
  });
  p.channel().recv<char>();
  EXPECT_EQ(countBytes(p.end().target + 64, 32, 'i'), 32);
  EXPECT_EQ(p.finish(), 0);
}

// ------------------------------------------------------------ fault injection

TEST(FakeFabric, RetryFaultFailsTheNthWrAndFlushesTheRest) {
  PairSetup setup;
  setup.childFault = "retry@3";
  TwoProcesses p(setup, [](End& e, Channel& channel, const Wire& peer) {
    const WcStatus expected[] = {WcStatus::Success, WcStatus::Success, WcStatus::RetryExcErr,
                                 WcStatus::WrFlushErr};
    for (int i = 0; i < 4; ++i) {
      e.target[i] = static_cast<uint8_t>(i + 1);
      CHILD_CHECK(e.post(e.wr(Opcode::Write, i + 1, i, 1, peer, i)) == 0);
      const auto c = e.next(e.sendCq);
      CHILD_CHECK(c && c->wrId == static_cast<uint64_t>(i + 1) && c->status == expected[i]);
    }
    channel.send('d');
    return 0;
  });
  p.channel().recv<char>();
  EXPECT_EQ(p.end().target[0], 1);
  EXPECT_EQ(p.end().target[1], 2);
  EXPECT_EQ(p.end().target[2], 0);
  EXPECT_EQ(p.finish(), 0);
}

TEST(FakeFabric, RkeyFaultGivesRemoteAccessErrorAtTheNthWr) {
  PairSetup setup;
  setup.childFault = "rkey@2";
  TwoProcesses p(setup, [](End& e, Channel&, const Wire& peer) {
    const WcStatus expected[] = {WcStatus::Success, WcStatus::RemAccessErr, WcStatus::WrFlushErr};
    for (int i = 0; i < 3; ++i) {
      CHILD_CHECK(e.post(e.wr(Opcode::Write, i + 1, 0, 8, peer, 0)) == 0);
      const auto c = e.next(e.sendCq);
      CHILD_CHECK(c && c->status == expected[i]);
    }
    return 0;
  });
  EXPECT_EQ(p.finish(), 0);
}

TEST(FakeFabric, FlushFaultMovesTheQpToErrorAtTheNthWr) {
  PairSetup setup;
  setup.childFault = "flush@2";
  TwoProcesses p(setup, [](End& e, Channel&, const Wire& peer) {
    CHILD_CHECK(e.postRecv(50) == 0);
    const WcStatus expected[] = {WcStatus::Success, WcStatus::WrFlushErr, WcStatus::WrFlushErr};
    for (int i = 0; i < 3; ++i) {
      CHILD_CHECK(e.post(e.wr(Opcode::Write, i + 1, 0, 8, peer, 0)) == 0);
      const auto c = e.next(e.sendCq);
      CHILD_CHECK(c && c->status == expected[i]);
    }
    const auto r = e.next(e.recvCq);
    CHILD_CHECK(r && r->wrId == 50 && r->status == WcStatus::WrFlushErr);
    const auto event = e.event();
    CHILD_CHECK(event && event->kind == AsyncEventKind::QpFatal);
    return 0;
  });
  EXPECT_EQ(p.finish(), 0);
}

TEST(FakeFabric, BadFaultSpecIsAnInvalidArgumentNamingTheKnob) {
  for (const char* spec :
       {"retry", "retry@", "retry@0", "rkey@x", "flush@-1", "drop@3", "retry@3x"}) {
    try {
      makeFakeFabric({"fake-fabric-test-spec", spec});
      ADD_FAILURE() << "'" << spec << "' was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << spec;
      EXPECT_NE(std::string(e.what()).find("BRAID_IB_FAKE_FAULT"), std::string::npos) << e.what();
    }
  }
  for (const char* spec : {"", "retry@1", "rkey@10", "flush@2"}) {
    EXPECT_NO_THROW(makeFakeFabric({"fake-fabric-test-spec", spec})) << spec;
  }
}

// ------------------------------------------------------------ peers

TEST(FakeFabric, KilledPeerProcessGivesRetryExceeded) {
  TwoProcesses p({}, [](End&, Channel& channel, const Wire&) {
    channel.send('s');
    pause();
    return 0;
  });
  p.channel().recv<char>();
  End& e = p.end();
  ASSERT_EQ(e.post(e.wr(Opcode::Write, 1, 0, 64, p.peer(), 0)), 0);
  auto c = e.next(e.sendCq);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, WcStatus::Success);
  ASSERT_EQ(kill(p.pid(), SIGKILL), 0);
  // Not reaped: a zombie, which kill(pid, 0) would still find.
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(p.pid()), &info, WEXITED | WNOWAIT), 0);
  std::this_thread::sleep_for(2ms);  // the liveness check runs once a millisecond
  ASSERT_EQ(e.post(e.wr(Opcode::Write, 2, 0, 64, p.peer(), 0)), 0);
  c = e.next(e.sendCq);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wrId, 2u);
  EXPECT_EQ(c->status, WcStatus::RetryExcErr);
  ASSERT_EQ(e.post(e.wr(Opcode::Write, 3, 0, 64, p.peer(), 0)), 0);
  c = e.next(e.sendCq);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, WcStatus::WrFlushErr);
  EXPECT_EQ(p.finish(), 128 + SIGKILL);
}

TEST(FakeFabric, WrBeforeThePeerReachesRtrWaitsForIt) {
  PairSetup setup;
  setup.parentConnects = false;
  TwoProcesses p(setup, [](End& e, Channel& channel, const Wire& peer) {
    e.target[0] = 42;
    CHILD_CHECK(e.post(e.wr(Opcode::Write, 1, 0, 1, peer, 0)) == 0);
    CHILD_CHECK(!e.next(e.sendCq, 50ms));
    channel.send('p');
    channel.recv<char>();  // the peer is connected
    const auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::Success);
    channel.send('w');
    return 0;
  });
  p.channel().recv<char>();
  EXPECT_EQ(p.end().target[0], 0);
  p.end().connect(p.peer());
  p.channel().send('c');
  p.channel().recv<char>();
  EXPECT_EQ(p.end().target[0], 42);
  EXPECT_EQ(p.finish(), 0);
}

TEST(FakeFabric, WrToAPeerThatNeverReachesRtrFailsWithRetryExceeded) {
  PairSetup setup;
  setup.parentConnects = false;
  setup.path.timeout = 10;  // 4.2 ms a try, 8 tries
  setup.path.retryCount = 7;
  TwoProcesses p(setup, [](End& e, Channel&, const Wire& peer) {
    const Clock::time_point start = Clock::now();
    CHILD_CHECK(e.post(e.wr(Opcode::Write, 1, 0, 1, peer, 0)) == 0);
    const auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::RetryExcErr);
    CHILD_CHECK(Clock::now() - start >= 30ms);
    return 0;
  });
  EXPECT_EQ(p.finish(), 0);
}

TEST(FakeFabric, PeerInAnotherNetworkNamespaceIsReachable) {
  PairSetup setup;
  setup.childOwnNetns = true;
  TwoProcesses p(setup, [](End& e, Channel& channel, const Wire& peer) {
    channel.recv<char>();
    std::memset(e.target, 0x77, 128);
    CHILD_CHECK(e.post(e.wr(Opcode::WriteWithImm, 1, 0, 128, peer, 0, true, 7)) == 0);
    const auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::Success);
    return 0;
  });
  if (p.skipped()) GTEST_SKIP() << "no permission to make namespaces";
  ASSERT_EQ(p.end().postRecv(1), 0);
  p.channel().send('r');
  const auto c = p.end().next(p.end().recvCq);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->imm, 7u);
  EXPECT_EQ(countBytes(p.end().target, 128, 0x77), 128);
  EXPECT_EQ(p.finish(), 0);
}

TEST(FakeFabric, TwoBackendsOfOneProcessConnectButNotAcrossFabrics) {
  const std::string fabric = testFabric();
  End a(fabric, "", PairSetup{}), b(fabric, "", PairSetup{});
  a.connect(b.wire());
  b.connect(a.wire());
  ASSERT_EQ(b.postRecv(5), 0);
  std::memset(a.target, 0x3c, 64);
  ASSERT_EQ(a.post(a.wr(Opcode::WriteWithImm, 1, 0, 64, b.wire(), 128, false, 99)), 0);
  const auto c = b.next(b.recvCq);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wrId, 5u);
  EXPECT_EQ(c->imm, 99u);
  EXPECT_EQ(countBytes(b.target + 128, 64, 0x3c), 64);

  End other(fabric + "-other", "", PairSetup{});
  expectThrowNaming([&] { other.connect(a.wire()); }, "toRtr");
}

// ------------------------------------------------------------ CQs

TEST(FakeFabric, WaitCqWakesWhenThePeerPushesACompletion) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire& peer) {
    channel.recv<char>();
    std::this_thread::sleep_for(100ms);
    CHILD_CHECK(e.post(e.wr(Opcode::WriteWithImm, 1, 0, 8, peer, 0, true, 1)) == 0);
    CHILD_CHECK(e.next(e.sendCq));
    return 0;
  });
  End& e = p.end();
  ASSERT_EQ(e.postRecv(1), 0);
  p.channel().send('g');
  const Clock::time_point start = Clock::now();
  Completion c;
  int polled = 0;
  while ((polled = e.backend->pollCq(e.recvCq, &c, 1)) == 0 && Clock::now() < start + 5s) {
    e.backend->waitCq(e.recvCq, start + 5s);
  }
  const auto waited = Clock::now() - start;
  EXPECT_EQ(polled, 1);
  EXPECT_GE(waited, 50ms);
  EXPECT_LT(waited, 1500ms);  // woken, not timed out
  EXPECT_EQ(p.finish(), 0);
}

TEST(FakeFabric, WaitCqDoesNotSleepThroughACompletionThatCameBefore) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire& peer) {
    channel.recv<char>();
    CHILD_CHECK(e.post(e.wr(Opcode::WriteWithImm, 1, 0, 8, peer, 0, true, 1)) == 0);
    CHILD_CHECK(e.next(e.sendCq));
    channel.send('w');
    return 0;
  });
  End& e = p.end();
  ASSERT_EQ(e.postRecv(1), 0);
  p.channel().send('g');
  p.channel().recv<char>();
  const Clock::time_point start = Clock::now();
  e.backend->waitCq(e.recvCq, start + 5s);
  EXPECT_LT(Clock::now() - start, 500ms);
  Completion c;
  EXPECT_EQ(e.backend->pollCq(e.recvCq, &c, 1), 1);
  EXPECT_EQ(p.finish(), 0);
}

TEST(FakeFabric, WaitCqReturnsAtItsDeadlineWhenNothingArrives) {
  auto backend = makeFakeFabric({testFabric(), ""});
  Device* device = backend->openDevice("fake_0", nullptr);
  CompletionQueue* cq = backend->createCq(device, 16);
  const Clock::time_point start = Clock::now();
  backend->waitCq(cq, start + 50ms);
  const auto waited = Clock::now() - start;
  EXPECT_GE(waited, 40ms);
  EXPECT_LT(waited, 1s);
  Completion c;
  EXPECT_EQ(backend->pollCq(cq, &c, 1), 0);
  backend->destroyCq(cq);
  backend->closeDevice(device);
}

TEST(FakeFabric, FullSendCqOverrunsAndMovesItsQpToError) {
  PairSetup setup;
  setup.sendCqDepth = 2;
  TwoProcesses p(setup, [](End& e, Channel&, const Wire& peer) {
    for (int i = 0; i < 3; ++i) CHILD_CHECK(e.post(e.wr(Opcode::Write, i, 0, 8, peer, 0)) == 0);
    auto event = e.event();
    CHILD_CHECK(event && event->kind == AsyncEventKind::CqError);
    event = e.event();
    CHILD_CHECK(event && event->kind == AsyncEventKind::QpFatal && event->qpNum == e.qpNum);
    Completion c[4];
    CHILD_CHECK(e.backend->pollCq(e.sendCq, c, 4) == 2);  // the third was lost
    CHILD_CHECK(e.post(e.wr(Opcode::Write, 9, 0, 8, peer, 0)) == 0);
    const auto flushed = e.next(e.sendCq);
    CHILD_CHECK(flushed && flushed->wrId == 9 && flushed->status == WcStatus::WrFlushErr);
    return 0;
  });
  EXPECT_EQ(p.finish(), 0);
}

TEST(FakeFabric, PeerOverrunningAReceiveCqMovesThatQpToError) {
  PairSetup setup;
  setup.recvCqDepth = 2;
  TwoProcesses p(setup, [](End& e, Channel& channel, const Wire& peer) {
    channel.recv<char>();
    for (int i = 0; i < 3; ++i) {
      CHILD_CHECK(e.post(e.wr(Opcode::WriteWithImm, i, 0, 8, peer, 0, true, i)) == 0);
      const auto c = e.next(e.sendCq);
      CHILD_CHECK(c && c->status == WcStatus::Success);
    }
    channel.send('w');
    channel.recv<char>();
    CHILD_CHECK(e.post(e.wr(Opcode::WriteWithImm, 3, 0, 8, peer, 0, true, 3)) == 0);
    const auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::RetryExcErr);
    return 0;
  });
  End& e = p.end();
  for (int i = 0; i < 4; ++i) ASSERT_EQ(e.postRecv(i), 0);
  p.channel().send('r');
  p.channel().recv<char>();
  Completion c[4];
  ASSERT_EQ(e.backend->pollCq(e.recvCq, c, 4), 2);
  EXPECT_EQ(c[0].wrId, 0u);
  EXPECT_EQ(c[1].wrId, 1u);
  auto event = e.event();
  ASSERT_TRUE(event);
  EXPECT_EQ(event->kind, AsyncEventKind::CqError);
  event = e.event();
  ASSERT_TRUE(event);
  EXPECT_EQ(event->kind, AsyncEventKind::QpFatal);
  const auto flushed = e.next(e.recvCq);  // the receive nobody took
  ASSERT_TRUE(flushed);
  EXPECT_EQ(flushed->wrId, 3u);
  EXPECT_EQ(flushed->status, WcStatus::WrFlushErr);
  p.channel().send('x');
  EXPECT_EQ(p.finish(), 0);
}

// ------------------------------------------------------------ QP states

TEST(FakeFabric, QpStateStepsOutOfOrderThrowNamingTheStep) {
  End e(testFabric(), "", PairSetup{});
  const Wire self = e.wire();
  RemoteQp remote;
  remote.qpNum = self.qpNum, remote.gid = self.gid, remote.useGid = true;
  const SendRequest request = e.wr(Opcode::Write, 1, 0, 8, self, 1024);
  EXPECT_EQ(e.post(request), EINVAL);  // RESET
  EXPECT_EQ(e.postRecv(1), EINVAL);
  expectThrowNaming([&] { e.backend->toRtr(e.qp, remote, e.path); }, "toRtr");
  expectThrowNaming([&] { e.backend->toRts(e.qp, e.path); }, "toRts");
  e.backend->toInit(e.qp, e.path);
  expectThrowNaming([&] { e.backend->toInit(e.qp, e.path); }, "toInit");
  expectThrowNaming([&] { e.backend->toRts(e.qp, e.path); }, "toRts");
  EXPECT_EQ(e.post(request), EINVAL);  // INIT
  EXPECT_EQ(e.postRecv(1), 0);
  e.backend->toRtr(e.qp, remote, e.path);  // to itself
  expectThrowNaming([&] { e.backend->toRtr(e.qp, remote, e.path); }, "toRtr");
  EXPECT_EQ(e.post(request), EINVAL);  // RTR
  e.backend->toRts(e.qp, e.path);
  expectThrowNaming([&] { e.backend->toRts(e.qp, e.path); }, "toRts");
  EXPECT_EQ(e.post(request), 0);
  const auto c = e.next(e.sendCq);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, WcStatus::Success);
}

TEST(FakeFabric, ToRtrThrowsWhenTheGidOrQpNumberNamesNothing) {
  End e(testFabric(), "", PairSetup{});
  e.backend->toInit(e.qp, e.path);
  RemoteQp remote;
  remote.gid = e.wire().gid, remote.useGid = true;
  remote.qpNum = 0xfffff0;  // no such QP here
  expectThrowNaming([&] { e.backend->toRtr(e.qp, remote, e.path); }, "toRtr");
  remote.qpNum = e.qpNum;
  remote.useGid = false;
  expectThrowNaming([&] { e.backend->toRtr(e.qp, remote, e.path); }, "toRtr");
  remote.useGid = true;
  remote.gid = Gid{};
  expectThrowNaming([&] { e.backend->toRtr(e.qp, remote, e.path); }, "toRtr");

  // The GID of a process that has gone.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  if (child == 0) {
    auto own = makeFakeFabric({testFabric(), ""});
    const Gid gid = own->queryGid(own->openDevice("fake_0", nullptr), 1, 1);
    _exit(write(fds[1], &gid, sizeof gid) == sizeof gid ? 0 : 1);
  }
  ASSERT_EQ(read(fds[0], &remote.gid, sizeof remote.gid), static_cast<ssize_t>(sizeof remote.gid));
  waitpid(child, nullptr, 0);
  close(fds[0]), close(fds[1]);
  expectThrowNaming([&] { e.backend->toRtr(e.qp, remote, e.path); }, "toRtr");
}

// ------------------------------------------------------------ dma-buf regions

constexpr int kAllAccess = kLocalWrite | kRemoteWrite | kRemoteRead;

TEST(FakeFabric, DmabufRegionIsWrittenAndReadByAPeerProcess) {
  const size_t page = pageBytes();
  TwoProcesses p({}, [page](End& e, Channel& channel, const Wire&) {
    const Wire to = channel.recv<Wire>();
    for (int i = 0; i < 1000; ++i) e.target[i] = static_cast<uint8_t>(i * 7 + 1);
    CHILD_CHECK(e.post(e.wr(Opcode::Write, 1, 0, 1000, to, 100)) == 0);
    auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->wrId == 1 && c->status == WcStatus::Success);
    std::memset(e.target + 2048, 0xab, 256);  // across the region's first page boundary
    CHILD_CHECK(e.post(e.wr(Opcode::WriteWithImm, 2, 2048, 256, to, page - 128, true, 0x5eed)) ==
                0);
    c = e.next(e.sendCq);
    CHILD_CHECK(c && c->wrId == 2 && c->status == WcStatus::Success);
    CHILD_CHECK(e.post(e.wr(Opcode::Read, 3, 8192, 512, to, 6000)) == 0);
    c = e.next(e.sendCq);
    CHILD_CHECK(c && c->wrId == 3 && c->status == WcStatus::Success && c->opcode == Opcode::Read);
    for (int i = 0; i < 512; ++i) CHILD_CHECK(e.target[8192 + i] == static_cast<uint8_t>(i ^ 0x5a));
    return 0;
  });
  End& e = p.end();
  // Three pages of file; the region is its last two, seen at a mapping of
  // them alone: remote address A is file offset page + (A - seen).
  DeviceMemory file(3 * page);
  void* view = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_SHARED, file.fd, page);
  ASSERT_NE(view, MAP_FAILED);
  auto* seen = static_cast<uint8_t*>(view);
  Keys keys;
  MemoryRegion* mr = e.backend->registerDmabuf(e.pd, file.fd, page, 2 * page,
                                               reinterpret_cast<uint64_t>(seen), kAllAccess, &keys);
  ASSERT_NE(mr, nullptr);
  file.closeFd();  // the fake keeps its own
  for (int i = 0; i < 512; ++i) seen[6000 + i] = static_cast<uint8_t>(i ^ 0x5a);
  ASSERT_EQ(e.postRecv(77), 0);
  p.channel().send(regionWire(e, reinterpret_cast<uint64_t>(seen), keys.rkey));

  const auto c = e.next(e.recvCq);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, WcStatus::Success);
  EXPECT_EQ(c->wrId, 77u);
  EXPECT_EQ(c->bytes, 256u);
  EXPECT_EQ(c->imm, 0x5eedu);
  const uint8_t* whole = file.data;  // by file offset
  int wrong = 0;
  for (int i = 0; i < 1000; ++i) wrong += whole[page + 100 + i] != static_cast<uint8_t>(i * 7 + 1);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(whole[page + 99], 0);
  EXPECT_EQ(countBytes(whole + 2 * page - 128, 256, 0xab), 256);
  EXPECT_EQ(countBytes(whole, page, 0), static_cast<int>(page));  // before the region
  EXPECT_EQ(p.finish(), 0);
  e.backend->deregister(mr);
  munmap(view, 2 * page);
}

TEST(FakeFabric, DmabufRegionIsLocalMemoryOfWritesAndReads) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire& peer) {
    DeviceMemory memory(2 * pageBytes());
    Keys keys;
    MemoryRegion* mr = e.backend->registerDmabuf(e.pd, memory.fd, 0, memory.bytes, memory.address(),
                                                 kLocalWrite, &keys);
    CHILD_CHECK(mr != nullptr);
    memory.closeFd();
    channel.recv<char>();  // the peer's memory is filled
    std::memset(memory.data + 100, 0xd1, 300);
    SendRequest write = e.wr(Opcode::Write, 1, 0, 300, peer, 0);
    write.local = memory.data + 100, write.lkey = keys.lkey;
    SendRequest read = e.wr(Opcode::Read, 2, 0, 300, peer, 4096);
    read.local = memory.data + 5000, read.lkey = keys.lkey;
    CHILD_CHECK(e.post(write) == 0 && e.post(read) == 0);
    for (uint64_t id = 1; id <= 2; ++id) {
      const auto c = e.next(e.sendCq);
      CHILD_CHECK(c && c->wrId == id && c->status == WcStatus::Success);
    }
    CHILD_CHECK(countBytes(memory.data + 5000, 300, 0x2e) == 300);
    e.backend->deregister(mr);
    channel.send('d');
    return 0;
  });
  std::memset(p.end().target + 4096, 0x2e, 300);
  p.channel().send('f');
  p.channel().recv<char>();
  EXPECT_EQ(countBytes(p.end().target, 300, 0xd1), 300);
  EXPECT_EQ(p.finish(), 0);
}

// The "flush READ" of GPUDirect RDMA: after receives into device memory,
// the engine reads a byte of it back through a QP connected to itself.
TEST(FakeFabric, QpConnectedToItselfReadsItsOwnDmabufRegion) {
  End e(testFabric(), "", PairSetup{});
  e.connect(e.wire());
  DeviceMemory memory(2 * pageBytes());
  for (int i = 0; i < 1000; ++i) memory.data[100 + i] = static_cast<uint8_t>(i * 3 + 1);
  Keys keys;
  MemoryRegion* mr = e.backend->registerDmabuf(e.pd, memory.fd, 0, memory.bytes, memory.address(),
                                               kAllAccess, &keys);
  ASSERT_NE(mr, nullptr);
  memory.closeFd();
  const Wire self = regionWire(e, memory.address(), keys.rkey);

  ASSERT_EQ(e.post(e.wr(Opcode::Read, 1, 0, 1, self, 100)), 0);  // one byte, as engines flush
  auto c = e.next(e.sendCq);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wrId, 1u);
  EXPECT_EQ(c->status, WcStatus::Success);
  EXPECT_EQ(c->opcode, Opcode::Read);
  EXPECT_EQ(c->qpNum, e.qpNum);
  EXPECT_EQ(e.target[0], 1);

  ASSERT_EQ(e.post(e.wr(Opcode::Read, 2, 4096, 1000, self, 100)), 0);
  c = e.next(e.sendCq);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, WcStatus::Success);
  int wrong = 0;
  for (int i = 0; i < 1000; ++i) wrong += e.target[4096 + i] != static_cast<uint8_t>(i * 3 + 1);
  EXPECT_EQ(wrong, 0);

  // Its own target memory too.
  std::memset(e.target + 8192, 0x6b, 64);
  ASSERT_EQ(e.post(e.wr(Opcode::Read, 3, 12288, 64, e.wire(), 8192)), 0);
  c = e.next(e.sendCq);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, WcStatus::Success);
  EXPECT_EQ(countBytes(e.target + 12288, 64, 0x6b), 64);
  e.backend->deregister(mr);
}

TEST(FakeFabric, DeregisteredDmabufRkeyIsRejected) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire&) {
    const Wire to = channel.recv<Wire>();
    e.target[0] = 1;
    CHILD_CHECK(e.post(e.wr(Opcode::Write, 1, 0, 1, to, 0)) == 0);
    auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::Success);
    channel.send('a');
    channel.recv<char>();  // deregistered
    e.target[0] = 2;
    CHILD_CHECK(e.post(e.wr(Opcode::Write, 2, 0, 1, to, 1)) == 0);
    c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::RemAccessErr);
    return 0;
  });
  End& e = p.end();
  DeviceMemory memory(pageBytes());
  const size_t fdsBefore = listing("/proc/self/fd").size();
  Keys keys;
  MemoryRegion* mr = e.backend->registerDmabuf(e.pd, memory.fd, 0, memory.bytes, memory.address(),
                                               kAllAccess, &keys);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(listing("/proc/self/fd").size(), fdsBefore + 1);  // the fake's dup
  p.channel().send(regionWire(e, memory.address(), keys.rkey));
  p.channel().recv<char>();
  EXPECT_EQ(memory.data[0], 1);
  e.backend->deregister(mr);
  EXPECT_EQ(listing("/proc/self/fd").size(), fdsBefore);
  p.channel().send('d');
  EXPECT_EQ(p.finish(), 0);
  EXPECT_EQ(memory.data[1], 0);
}

// Dups of both regions likely share a descriptor number, so a mapping
// cached by anything but the registration would reach the old file.
TEST(FakeFabric, DmabufRegisteredAfterADeregisteredOneReachesItsOwnFile) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire&) {
    for (const uint8_t value : {uint8_t{'a'}, uint8_t{'b'}}) {
      const Wire to = channel.recv<Wire>();
      e.target[0] = value;
      CHILD_CHECK(e.post(e.wr(Opcode::Write, value, 0, 1, to, 0)) == 0);
      const auto c = e.next(e.sendCq);
      CHILD_CHECK(c && c->status == WcStatus::Success);
      channel.send('w');
    }
    return 0;
  });
  End& e = p.end();
  DeviceMemory first(pageBytes()), second(pageBytes());
  Keys keys;
  MemoryRegion* mr =
      e.backend->registerDmabuf(e.pd, first.fd, 0, first.bytes, first.address(), kAllAccess, &keys);
  ASSERT_NE(mr, nullptr);
  p.channel().send(regionWire(e, first.address(), keys.rkey));
  p.channel().recv<char>();
  e.backend->deregister(mr);
  mr = e.backend->registerDmabuf(e.pd, second.fd, 0, second.bytes, second.address(), kAllAccess,
                                 &keys);
  ASSERT_NE(mr, nullptr);
  p.channel().send(regionWire(e, second.address(), keys.rkey));
  p.channel().recv<char>();
  EXPECT_EQ(first.data[0], 'a');
  EXPECT_EQ(second.data[0], 'b');
  EXPECT_EQ(p.finish(), 0);
  e.backend->deregister(mr);
}

TEST(FakeFabric, WriteBeyondADmabufRegionGivesRemoteAccessError) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire& peer) {
    return writeExpecting(e, channel, peer, WcStatus::RemAccessErr);
  });
  DeviceMemory memory(2 * pageBytes());
  Keys keys;
  MemoryRegion* mr = p.end().backend->registerDmabuf(p.end().pd, memory.fd, 0, pageBytes(),
                                                     memory.address(), kAllAccess, &keys);
  ASSERT_NE(mr, nullptr);
  p.channel().send(regionWire(p.end(), memory.address(pageBytes() - 8), keys.rkey));
  EXPECT_EQ(p.finish(), 0);
  EXPECT_EQ(countBytes(memory.data + pageBytes() - 8, 16, 0), 16);  // the file goes on
  p.end().backend->deregister(mr);
}

TEST(FakeFabric, ReadOfADmabufRegionWithoutRemoteReadGivesRemoteAccessError) {
  TwoProcesses p({}, [](End& e, Channel& channel, const Wire&) {
    const Wire to = channel.recv<Wire>();
    CHILD_CHECK(e.post(e.wr(Opcode::Read, 1, 0, 16, to, 0)) == 0);
    const auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::RemAccessErr);
    return 0;
  });
  DeviceMemory memory(pageBytes());
  Keys keys;
  MemoryRegion* mr = p.end().backend->registerDmabuf(
      p.end().pd, memory.fd, 0, memory.bytes, memory.address(), kLocalWrite | kRemoteWrite, &keys);
  ASSERT_NE(mr, nullptr);
  p.channel().send(regionWire(p.end(), memory.address(), keys.rkey));
  EXPECT_EQ(p.finish(), 0);
  p.end().backend->deregister(mr);
}

TEST(FakeFabric, DmabufBeyondTheFileIsRefused) {
  auto backend = makeFakeFabric({testFabric(), ""});
  Device* device = backend->openDevice("fake_0", nullptr);
  ProtectionDomain* pd = backend->allocPd(device);
  const size_t page = pageBytes();
  DeviceMemory memory(2 * page);
  const size_t fdsBefore = listing("/proc/self/fd").size();
  Keys keys;
  const uint64_t at = memory.address();
  EXPECT_EQ(backend->registerDmabuf(pd, memory.fd, page, 2 * page, at + page, kAllAccess, &keys),
            nullptr);
  EXPECT_EQ(backend->registerDmabuf(pd, memory.fd, 0, 2 * page + 1, at, kAllAccess, &keys),
            nullptr);
  EXPECT_EQ(backend->registerDmabuf(pd, memory.fd, 3 * page, 0, at + 3 * page, kAllAccess, &keys),
            nullptr);
  EXPECT_EQ(listing("/proc/self/fd").size(), fdsBefore);  // no dup kept for a refusal
  MemoryRegion* mr =
      backend->registerDmabuf(pd, memory.fd, page, page, at + page, kAllAccess, &keys);
  EXPECT_NE(mr, nullptr);  // up to the file's end
  if (mr != nullptr) backend->deregister(mr);
  backend->deallocPd(pd);
  backend->closeDevice(device);
}

TEST(FakeFabric, DmabufOfAnUnusableFdOrAnOffsetOutOfPlaceIsRefused) {
  auto backend = makeFakeFabric({testFabric(), ""});
  Device* device = backend->openDevice("fake_0", nullptr);
  ProtectionDomain* pd = backend->allocPd(device);
  DeviceMemory memory(2 * pageBytes());
  int pipeFds[2];
  ASSERT_EQ(pipe2(pipeFds, O_CLOEXEC), 0);
  const int closed = fcntl(memory.fd, F_DUPFD_CLOEXEC, 0);
  close(closed);
  const size_t fdsBefore = listing("/proc/self/fd").size();
  Keys keys;
  const uint64_t at = memory.address();
  EXPECT_EQ(backend->registerDmabuf(pd, -1, 0, 4096, at, kAllAccess, &keys), nullptr);
  EXPECT_EQ(backend->registerDmabuf(pd, closed, 0, 4096, at, kAllAccess, &keys), nullptr);
  EXPECT_EQ(backend->registerDmabuf(pd, pipeFds[0], 0, 4096, at, kAllAccess, &keys), nullptr);
  // Offset and address at different places in a page, as mlx5 refuses.
  EXPECT_EQ(backend->registerDmabuf(pd, memory.fd, 0, 4096, at + 64, kAllAccess, &keys), nullptr);
  // Remote write without local write (EINVAL on hardware).
  EXPECT_EQ(backend->registerDmabuf(pd, memory.fd, 0, 4096, at, kRemoteWrite, &keys), nullptr);
  EXPECT_EQ(listing("/proc/self/fd").size(), fdsBefore);
  MemoryRegion* mr = backend->registerDmabuf(pd, memory.fd, 64, 4096, at + 64, kAllAccess, &keys);
  EXPECT_NE(mr, nullptr);  // at the same place in a page
  if (mr != nullptr) backend->deregister(mr);
  close(pipeFds[0]), close(pipeFds[1]);
  backend->deallocPd(pd);
  backend->closeDevice(device);
}

// ------------------------------------------------------------ leaving nothing behind

// The shared mappings of process `pid` that have a name in the filesystem
// (all of the fake's are memfds, which have none).
std::vector<std::string> namedSharedMappings(pid_t pid) {
  std::vector<std::string> named;
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string range, perms, offset, dev, inode, path;
    fields >> range >> perms >> offset >> dev >> inode >> path;
    if (perms.size() == 4 && perms[3] == 's' && !path.empty() && path.rfind("/memfd:", 0) != 0) {
      named.push_back(path);
    }
  }
  return named;
}

// Other jobs may use /dev/shm meanwhile, so the check is that nothing of
// ours shows up there: no shared mapping of either process has a name, and
// nothing named braid appears.
TEST(FakeFabric, NothingIsLeftInDevShmOrOpenAfterTheProcessesEnd) {
  const std::set<std::string> shmBefore = listing("/dev/shm");
  const size_t fdsBefore = listing("/proc/self/fd").size();
  {
    TwoProcesses p({}, [](End& e, Channel& channel, const Wire& peer) {
      channel.recv<char>();
      CHILD_CHECK(e.post(e.wr(Opcode::WriteWithImm, 1, 0, 4096, peer, 0, true, 1)) == 0);
      CHILD_CHECK(e.next(e.sendCq));
      channel.send('w');
      pause();  // killed, so nothing of its own is cleaned up
      return 0;
    });
    ASSERT_EQ(p.end().postRecv(1), 0);
    p.channel().send('r');
    p.channel().recv<char>();
    ASSERT_TRUE(p.end().next(p.end().recvCq));
    EXPECT_EQ(namedSharedMappings(getpid()), std::vector<std::string>{});
    EXPECT_EQ(namedSharedMappings(p.pid()), std::vector<std::string>{});
    kill(p.pid(), SIGKILL);
    EXPECT_EQ(p.finish(), 128 + SIGKILL);
  }
  for (const std::string& name : listing("/dev/shm")) {
    EXPECT_TRUE(shmBefore.count(name) != 0 || name.find("braid") == std::string::npos) << name;
  }
  EXPECT_EQ(listing("/proc/self/fd").size(), fdsBefore);
}

// The fabric's own mappings (its memfds show as /memfd:braid-...), or
// those of another memfd `name`: a count of every mapping would also count
// what a sanitizer's allocator maps meanwhile.
size_t mappingCount(const std::string& name = "braid") {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);)
    if (line.find("/memfd:" + name) != std::string::npos) ++n;
  return n;
}

TEST(FakeFabric, DestroyingTheBackendFreesWhatWasLeftOpen) {
  const size_t fdsBefore = listing("/proc/self/fd").size();
  const size_t mappingsBefore = mappingCount();
  const size_t dmabufMappingsBefore = mappingCount(kDmabufName);
  {
    DeviceMemory memory(pageBytes());
    const std::string fabric = testFabric();
    End a(fabric, "", PairSetup{});
    auto b = makeFakeFabric({fabric, ""});  // everything of b is left open
    Device* device = b->openDevice("fake_0", nullptr);
    ProtectionDomain* pd = b->allocPd(device);
    CompletionQueue* cq = b->createCq(device, 16);
    uint32_t qpNum = 0;
    QueuePair* qp = b->createQp(pd, cq, cq, QpCaps{4, 4, 0}, &qpNum);
    auto* target = static_cast<uint8_t*>(b->allocateTarget(8192));
    Keys keys;
    b->registerMemory(pd, target, 8192, kLocalWrite | kRemoteWrite | kRemoteRead, &keys);
    Keys dmabufKeys;
    ASSERT_NE(b->registerDmabuf(pd, memory.fd, 0, memory.bytes, memory.address(), kAllAccess,
                                &dmabufKeys),
              nullptr);
    memory.closeFd();  // b's dup is all that is open of it
    Wire wire;
    wire.qpNum = qpNum, wire.gid = b->queryGid(device, 1, 1);
    wire.address = reinterpret_cast<uint64_t>(target), wire.rkey = keys.rkey;
    a.connect(wire);
    PathOptions path;
    path.gidIndex = 1;
    RemoteQp remote;
    remote.qpNum = a.qpNum, remote.gid = a.wire().gid, remote.useGid = true;
    b->toInit(qp, path);
    b->toRtr(qp, remote, path);
    b->toRts(qp, path);
    ASSERT_EQ(a.post(a.wr(Opcode::Write, 1, 0, 64, wire, 0)), 0);  // a maps b's block
    ASSERT_TRUE(a.next(a.sendCq));
    Wire region = wire;
    region.address = memory.address(), region.rkey = dmabufKeys.rkey;
    ASSERT_EQ(a.post(a.wr(Opcode::Write, 2, 0, 64, region, 0)), 0);  // and the dma-buf region
    ASSERT_TRUE(a.next(a.sendCq));
    EXPECT_GT(mappingCount(), mappingsBefore);  // (the count sees the fabric's mappings)
    EXPECT_EQ(mappingCount(kDmabufName), dmabufMappingsBefore + 2);  // the test's and a's
  }
  EXPECT_EQ(listing("/proc/self/fd").size(), fdsBefore);
  EXPECT_EQ(mappingCount(), mappingsBefore);
  EXPECT_EQ(mappingCount(kDmabufName), dmabufMappingsBefore);
}

// ------------------------------------------------------------ the library

// A process holds one copy of the fake (QP numbers are unique per copy),
// so the library's backend meets a linked one in another process, as the
// backends of libbraid's ranks meet each other.
TEST(FakeFabricLibrary, ItsBackendAndALinkedOneInAnotherProcessWriteToEachOther) {
  PairSetup setup;
  setup.parentLoadsTheLibrary = true;
  TwoProcesses p(setup, [](End& e, Channel& channel, const Wire& peer) {
    channel.recv<char>();  // the peer's receive is posted
    std::memset(e.target, 0x5a, 64);
    CHILD_CHECK(e.post(e.wr(Opcode::WriteWithImm, 1, 0, 64, peer, 128, true, 77)) == 0);
    const auto c = e.next(e.sendCq);
    CHILD_CHECK(c && c->status == WcStatus::Success && c->wrId == 1);
    channel.recv<char>();  // the peer wrote here
    CHILD_CHECK(countBytes(e.target + 256, 64, 0xa5) == 64);
    return 0;
  });
  End& loaded = p.end();
  EXPECT_EQ(loaded.backend->describe(), "fake fabric '" + testFabric() + "'");
  ASSERT_EQ(loaded.postRecv(5), 0);
  p.channel().send('r');
  const auto received = loaded.next(loaded.recvCq);
  ASSERT_TRUE(received);
  EXPECT_EQ(received->wrId, 5u);
  EXPECT_EQ(received->imm, 77u);
  EXPECT_EQ(countBytes(loaded.target + 128, 64, 0x5a), 64);
  std::memset(loaded.target, 0xa5, 64);
  ASSERT_EQ(loaded.post(loaded.wr(Opcode::Write, 2, 0, 64, p.peer(), 256)), 0);
  const auto sent = loaded.next(loaded.sendCq);
  ASSERT_TRUE(sent);
  EXPECT_EQ(sent->status, WcStatus::Success);
  p.channel().send('w');
  EXPECT_EQ(p.finish(), 0);
}

TEST(FakeFabricLibrary, BadFaultSpecComesBackAsAnInvalidArgumentNamingTheKnob) {
  std::string why;
  try {
    loadFakeFabric("fake-fabric-test-spec", "retry@0", &why, kLibraryDirectory);
    ADD_FAILURE() << "'retry@0' was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("BRAID_IB_FAKE_FAULT 'retry@0'"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(why, "");
}

TEST(FakeFabricLibrary, ACallerOfAnotherInterfaceVersionIsRefused) {
  const std::string path = kLibraryDirectory + "/" + kFakeFabricLibrary;
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << ::dlerror();
  const auto create = reinterpret_cast<FakeFabricCreate>(::dlsym(handle, kFakeFabricEntry));
  ASSERT_NE(create, nullptr) << path << " lacks " << kFakeFabricEntry;
  int code = -1;
  std::string message;
  EXPECT_EQ(create(kFakeFabricInterface + 1, "fake-fabric-test-version", "", &code, &message),
            nullptr);
  EXPECT_EQ(code, 0);
  EXPECT_EQ(message, "it was built for interface " + std::to_string(kFakeFabricInterface) +
                         ", libbraid asks for " + std::to_string(kFakeFabricInterface + 1));
  std::unique_ptr<VerbsBackend> made(
      create(kFakeFabricInterface, "fake-fabric-test-version", "", &code, &message));
  ASSERT_TRUE(made) << message;
  EXPECT_EQ(made->deviceNames(), std::vector<std::string>{"fake_0"});
}

// In a fresh process (the death test's "threadsafe" style executes this
// program again), where nothing has loaded the library yet and the loader's
// search path does not reach the build's lib/.
TEST(FakeFabricLibrary, AMissingLibraryIsNamedWithEachPathTriedAndTheKnob) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::string why;
        const bool loaded =
            loadFakeFabric("x", "", &why, "/nonexistent/fake-fabric-test") != nullptr;
        std::fprintf(stderr, "%s\n", why.c_str());
        std::_Exit(loaded ? 1 : 0);
      },
      ::testing::ExitedWithCode(0),
      "BRAID_IB_FAKE: cannot load /nonexistent/fake-fabric-test/libbraid_fake_fabric\\.so "
      "\\(cannot open shared object file: No such file or directory\\) nor "
      "libbraid_fake_fabric\\.so on the loader's search path \\(the same\\)");
}

}  // namespace
}  // namespace braid::transport::ibverbs
