#include "transports/device_proxy.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "braid/error.h"
#include "core/errors.h"
#include "core/log.h"

namespace braid::transport {
namespace {

// How long a rank that leaves waits for its last messages to go out, and
// one that gives up for its last word.
constexpr auto kDrainWait = std::chrono::seconds(10);
constexpr auto kNoticeWait = std::chrono::milliseconds(200);

}  // namespace

void StagingBlock::wire(DeviceConnection& c, int peer, std::byte* block, std::byte* sendSlots,
                        std::byte* recvSlots) {
  c.peer = peer;
  c.send.slots = sendSlots;
  c.send.tags = word(block, kSendTags);
  c.send.lengths = word(block, kSendLengths);
  c.send.filled = word(block, kSendFilled);
  c.send.credit = word(block, kSendCredit);
  c.recv.slots = recvSlots;
  c.recv.tags = word(block, kRecvTags);
  c.recv.filled = word(block, kRecvFilled);
  c.recv.credit = word(block, kRecvCredit);
}

ProxiedDeviceTransport::ProxiedDeviceTransport(device::Device& device, int deviceIndex, int rank,
                                               int nranks, size_t slotBytes, int slots,
                                               const char* name)
    : device_(device),
      deviceIndex_(deviceIndex),
      rank_(rank),
      name_(name),
      slotBytes_(slotBytes),
      slots_(static_cast<uint64_t>(slots)),
      byPeer_(static_cast<size_t>(nranks), nullptr),
      wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (wake_ < 0)
    throw Error(ErrorCode::SystemError,
                format("braid rank %d: %s: eventfd: %s", rank, name, std::strerror(errno)));
}

ProxiedDeviceTransport::~ProxiedDeviceTransport() {
  stopProxy();
  ::close(wake_);
}

void ProxiedDeviceTransport::addLink(ProxyLink* link) {
  links_.push_back(link);
  byPeer_[static_cast<size_t>(link->peer)] = link;
}

void ProxiedDeviceTransport::startProxy() {
  if (!links_.empty()) proxy_ = std::thread([this] { run(); });
}

void ProxiedDeviceTransport::stopProxy() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake();
  if (proxy_.joinable()) proxy_.join();
}

void ProxiedDeviceTransport::enqueued() {
  for (ProxyLink* link : links_) {
    link->sendsDue.store(link->connection.send.next, std::memory_order_seq_cst);
    link->receivesDue.store(link->connection.recv.next, std::memory_order_seq_cst);
  }
  if (sleeping_.load(std::memory_order_seq_cst)) wake();
}

void ProxiedDeviceTransport::poll(std::vector<PeerNotice>* notices) {
  std::lock_guard<std::mutex> lock(mutex_);
  notices->insert(notices->end(), heard_.begin(), heard_.end());
  heard_.clear();
}

void ProxiedDeviceTransport::announceFailure(int failedRank, GiveUpReason reason) {
  std::unique_lock<std::mutex> lock(mutex_);
  quiet_ = true;  // the streams were released: nothing they write means anything now
  for (ProxyLink* link : links_) queueFailure(*link, failedRank, reason);
  lock.unlock();
  wake();
  // A peer trusts this rank's released streams only once it heard that
  // this rank gave up: a socket that takes no last word is shut instead.
  lock.lock();
  if (!changed_.wait_for(lock, kNoticeWait, [&] { return allShut(); }))
    for (ProxyLink* link : links_)
      if (!link->shut) ::shutdown(link->socket.fd(), SHUT_RDWR);
}

void ProxiedDeviceTransport::sayGoodbye() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (ProxyLink* link : links_) link->goodbyeDue = true;
  lock.unlock();
  wake();
  lock.lock();
  if (!changed_.wait_for(lock, kDrainWait, [&] { return allShut(); }))
    BRAID_WARN(Exec,
               "braid rank %d: %s: device messages to some peer were still not sent after %lld "
               "s; leaving without them",
               rank_, name_, static_cast<long long>(kDrainWait.count()));
}

void ProxiedDeviceTransport::announceWaitingFor(int rank) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (ProxyLink* link : links_) queueWaitingFor(*link, rank);
  }
  wake();
}

int ProxiedDeviceTransport::peerWaitsFor(int peer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const ProxyLink* link = linkTo(peer);
  return link ? link->waitsFor : -1;
}

void ProxiedDeviceTransport::wake() {
  const uint64_t one = 1;
  (void)!::write(wake_, &one, sizeof(one));
}

size_t ProxiedDeviceTransport::settled() const {
  return static_cast<size_t>(std::count_if(links_.begin(), links_.end(), [](const ProxyLink* link) {
    return link->shut || link->closed;
  }));
}

void ProxiedDeviceTransport::run() {
  // Its sleeps are a few microseconds while messages are due: with the
  // default slack of 50 us they would all be 50 us.
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  try {
    device_.setCurrent(deviceIndex_);  // writeFlagNow acts on the communicator's device
  } catch (const Error& error) {
    BRAID_WARN(Exec, "%s: device proxy: %s", name_, error.what());
  }
  std::vector<pollfd> fds;
  int idle = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    const size_t settledBefore = settled();
    if (turn()) {
      idle = 0;
      if (settled() != settledBefore) changed_.notify_all();  // (sayGoodbye, announceFailure)
      continue;
    }
    fds.clear();
    fds.push_back({wake_, POLLIN, 0});
    for (ProxyLink* link : links_) {
      if (!listening(*link)) continue;
      fds.push_back({link->socket.fd(),
                     static_cast<short>(POLLIN | (link->blocked && !link->shut ? POLLOUT : 0)), 0});
    }
    // While something is owed, look again soon (a few microseconds,
    // growing; 100 us once nothing came for some 30 ms, as while a stream
    // runs a long kernel before its collective); otherwise sleep until a
    // socket or enqueued() wakes this thread.
    sleeping_.store(true, std::memory_order_seq_cst);
    const bool due = owed();
    if (due) sleeping_.store(false, std::memory_order_seq_cst);
    timespec wait{0, 0};
    if (!due)
      wait.tv_nsec = 100'000'000;
    else if (idle > 2000)
      wait.tv_nsec = 100'000;
    else if (idle > 4)
      wait.tv_nsec = 1000L << std::min(idle - 4, 4);  // 2 us ... 16 us
    ++idle;
    lock.unlock();
    const int ready = ::ppoll(fds.data(), fds.size(), &wait, nullptr);
    if (ready > 0 && fds[0].revents) {
      uint64_t count;
      (void)!::read(wake_, &count, sizeof(count));
    }
    lock.lock();
    sleeping_.store(false, std::memory_order_seq_cst);
    if (ready > 0) idle = 0;
  }
}

}  // namespace braid::transport
