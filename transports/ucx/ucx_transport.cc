#include "transports/ucx/ucx_transport.h"

#include <dirent.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "braid/error.h"
#include "core/errors.h"
#include "core/log.h"
#include "transports/ucx/ucx_api.h"
#include "transports/ucx/ucx_connection.h"
#include "transports/ucx/ucx_worker.h"
#include "tuning/cost_model.h"

namespace braid::transport::ucx {
namespace {

// How long set-up waits for every peer's hello before the ranks give up on
// UCX together.
constexpr std::chrono::seconds kGreetWithin{30};

class UcxTransport final : public Transport {
 public:
  UcxTransport(std::unique_ptr<Worker> worker, int nranks)
      : worker_(std::move(worker)), byRank_(nranks) {}

  // Last words, then every endpoint closed (a bounded wait for those that
  // flush), the receives cancelled, and the worker destroyed while the
  // connections whose callbacks it may still call are alive. Never waits
  // for a dead peer: its endpoint is closed by force, and every wait here
  // has a bound.
  ~UcxTransport() override {
    for (auto& connection : connections_) connection->sayLastWord({kBye, -1});
    std::vector<void*> closing;
    for (auto& connection : connections_)
      if (void* request = connection->startClose()) closing.push_back(request);
    const Clock::time_point closeBy = Clock::now() + kCloseWithin;
    auto stillClosing = [&] {
      for (void* request : closing)
        if (api().requestCheckStatus(request) == UCS_INPROGRESS) return true;
      return false;
    };
    ucs_status_t status = UCS_OK;
    while (stillClosing() && Clock::now() < closeBy)
      if (!worker_->sleep(std::min(closeBy, Clock::now() + kIdleSlice), &status)) break;
    for (void* request : closing) api().requestFree(request);  // UCX frees those still going
    for (auto& connection : connections_) connection->cancelReceives();
    const Clock::time_point cancelBy = Clock::now() + kCancelWithin;
    auto outstanding = [&] {
      for (auto& connection : connections_)
        if (connection->requestsOutstanding()) return true;
      return false;
    };
    while (outstanding() && Clock::now() < cancelBy)
      if (!worker_->sleep(std::min(cancelBy, Clock::now() + kIdleSlice), &status)) break;
    worker_.reset();
  }

  void add(std::unique_ptr<UcxConnection> connection) {
    byRank_[connection->peer()] = connection.get();
    connections_.push_back(std::move(connection));
    pollFds_.reserve(connections_.size() + 1);
    watched_.reserve(connections_.size());
  }
  Shared& shared() { return shared_; }
  Worker& worker() { return *worker_; }

  const char* name() const override { return "ucx"; }
  Connection& connection(int peer) override { return *byRank_[peer]; }

  // One turn of the worker, then what the callbacks left: words taken in,
  // UCX errors settled (after the words: a peer that said bye or gave up
  // is closed, not failed), notices that waited for memory sent. Returns
  // true only when something of braid's moved: UCX may keep handling
  // events of its own (retrying a send to a dead peer), and the executor
  // must still idle, sleep and time out then.
  bool progress() override {
    throwIfFailed();
    const uint64_t before = shared_.activity;
    api().workerProgress(worker_->handle());
    // A UCX error may come of a peer's death that its pidfd tells of, now
    // or soon: hear that first, so that the error is laid to the dead rank.
    const bool troubled = shared_.trouble || settleBy_ != Clock::time_point::max();
    const Clock::time_point now = troubled ? Clock::now() : Clock::time_point();
    if (troubled) {
      shared_.trouble = false;
      watchProcesses();
      pollProcesses(false, std::chrono::nanoseconds(0));
    }
    settleBy_ = Clock::time_point::max();
    for (auto& connection : connections_) {
      connection->pumpWords();
      if (troubled) {
        connection->settle(firstLoss_, now);
        settleBy_ = std::min(settleBy_, connection->settleBy());
      }
      connection->sendNotice();
    }
    throwIfFailed();
    return shared_.activity != before;
  }

  int failedPeer() const override { return failedPeer_; }

  void prepareToWait() override { snapshot_ = shared_.activity; }

  // Sleeps on the worker's event file descriptor, and on the pidfds of
  // same-host peers, until anything happened since prepareToWait(). While
  // UCX keeps handling events of its own (so that the worker cannot be
  // armed; a send to a dead peer over shared memory retries like that),
  // it looks at the pidfds between turns and, after the first few turns,
  // pauses there briefly instead of spinning.
  void waitForActivity(Clock::time_point until) override {
    if (firstLoss_ >= 0 && !shared_.anyFailure && Clock::now() - lossAt_ > kDistrustAfter)
      byRank_[firstLoss_]->failStillWaiting(
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - lossAt_));
    until = std::min(until, settleBy_);  // an error that waits for a pidfd
    watchProcesses();
    for (int turn = 0;; ++turn) {
      if (shared_.activity != snapshot_ || shared_.anyFailure) return;
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(until - Clock::now());
      if (left.count() <= 0) return;
      const ucs_status_t armed = arm(worker_->handle(), until);
      if (armed != UCS_OK && armed != UCS_INPROGRESS) {
        failure_ = format("arming the UCX worker failed: %s", api().statusString(armed));
        shared_.anyFailure = true;
        return;
      }
      // Armed: the worker's fd and the pidfds, until `until`. Not armed
      // (UCX handled events, which may not be ours): the pidfds only.
      const std::chrono::nanoseconds wait = armed == UCS_OK ? left
                                            : turn < 4      ? std::chrono::nanoseconds(0)
                                                            : std::min(left, kPause);
      pollProcesses(armed == UCS_OK, wait);
      if (armed == UCS_OK) return;
    }
  }

  void announceWaitingFor(int rank) override {
    for (auto& connection : connections_) connection->noteWaitingFor(rank);
  }

  // The last word to every peer, synchronously, so that each has it before
  // this rank closes its endpoints by force: at most kGiveUpWithin.
  void announceFailure(int failedRank, GiveUpReason reason) override {
    const WordKind kind = reason == GiveUpReason::TimedOut  ? kTimedOut
                          : reason == GiveUpReason::Revoked ? kRevoked
                                                            : kFailed;
    for (auto& connection : connections_) connection->sayLastWord({kind, failedRank});
    const Clock::time_point until = Clock::now() + kGiveUpWithin;
    auto inFlight = [&] {
      for (auto& connection : connections_)
        if (connection->lastWordInFlight()) return true;
      return false;
    };
    ucs_status_t status = UCS_OK;
    while (inFlight() && Clock::now() < until)
      if (!worker_->sleep(std::min(until, Clock::now() + kIdleSlice), &status)) break;
  }

  // Says hello to every peer and waits until each has said hello, a
  // connection failed, or `until`. Returns "" or why not.
  std::string greet(int rank, Clock::time_point until) {
    for (auto& connection : connections_) connection->sayHello();
    try {
      for (;;) {
        progress();
        UcxConnection* silent = nullptr;
        for (auto& connection : connections_)
          if (!connection->heardHello() && !silent) silent = connection.get();
        if (!silent) return "";
        if (Clock::now() >= until)
          return format("rank %d heard nothing from rank %d over UCX in time", rank,
                        silent->peer());
        prepareToWait();
        if (!progress()) waitForActivity(std::min(until, Clock::now() + kIdleSlice));
      }
    } catch (const Error& error) {
      return format("rank %d: %s", rank, error.what());
    }
  }

 private:
  // How long announceFailure() may take, over all connections.
  static constexpr std::chrono::milliseconds kGiveUpWithin{200};
  // How long the destructor waits for endpoints that flush, and then for
  // cancelled receives.
  static constexpr std::chrono::milliseconds kCloseWithin{1000};
  static constexpr std::chrono::milliseconds kCancelWithin{200};
  static constexpr std::chrono::milliseconds kIdleSlice{10};
  // How long after a peer left unannounced a rank still waits for the
  // others' messages. UCX 1.13 over shared memory was seen to lose messages
  // between the ranks still alive after a peer died mid-op (a synchronous
  // send completed that no receive took, another was cancelled), so two
  // survivors could wait for each other forever; past this, the wait fails
  // naming the dead rank. An op whose messages are all in (a peer that
  // exited after its part) finishes well within it.
  static constexpr std::chrono::milliseconds kDistrustAfter{500};
  // The pause between turns of a worker that UCX keeps busy.
  static constexpr std::chrono::nanoseconds kPause{100000};

  // pollFds_ and watched_ for the peers whose processes are watched still.
  void watchProcesses() {
    pollFds_.assign(1, {worker_->eventFd(), POLLIN, 0});
    watched_.clear();
    for (auto& connection : connections_)
      if (connection->pidFd() >= 0) {
        pollFds_.push_back({connection->pidFd(), POLLIN, 0});
        watched_.push_back(connection.get());
      }
  }

  // Waits up to `wait` on the pidfds of watchProcesses() (and on the
  // worker's event fd too when `withWorker`: it is armed), and closes the
  // connections of the peers whose processes exited.
  void pollProcesses(bool withWorker, std::chrono::nanoseconds wait) {
    timespec timeout{static_cast<time_t>(wait.count() / 1000000000),
                     static_cast<long>(wait.count() % 1000000000)};
    const size_t first = withWorker ? 0 : 1;
    for (pollfd& each : pollFds_) each.revents = 0;
    if (::ppoll(pollFds_.data() + first, pollFds_.size() - first, &timeout, nullptr) <= 0) return;
    for (size_t i = 1; i < pollFds_.size(); ++i) {
      UcxConnection& connection = *watched_[i - 1];
      if (!pollFds_[i].revents || connection.pidFd() < 0) continue;
      // Whatever the peer said before it went is in the worker: take it in
      // before judging.
      for (int drain = 0; drain < 1000 && api().workerProgress(worker_->handle()) != 0; ++drain) {
      }
      connection.processExited(firstLoss_);
      if (firstLoss_ < 0 && connection.leftUnannounced()) {
        firstLoss_ = connection.peer();
        lossAt_ = Clock::now();
      }
    }
  }

  void throwIfFailed() {
    if (!shared_.anyFailure) return;
    if (!failure_.empty()) {
      failedPeer_ = -1;
      throw Error(ErrorCode::SystemError, failure_);
    }
    const UcxConnection& first = *shared_.firstFailed;
    failedPeer_ = first.blames();
    throw Error(ErrorCode::RemoteError, first.failure());
  }

  std::unique_ptr<Worker> worker_;  // destroyed first, explicitly (see the destructor)
  Shared shared_;
  std::vector<std::unique_ptr<UcxConnection>> connections_;
  std::vector<UcxConnection*> byRank_;
  std::vector<pollfd> pollFds_;          // the worker's event fd, then the pidfds of watched_
  std::vector<UcxConnection*> watched_;  // preallocated: no allocation per wait
  uint64_t snapshot_ = 0;
  // When progress() must settle an error that waits for a pidfd (max: none).
  Clock::time_point settleBy_ = Clock::time_point::max();
  int failedPeer_ = -1;
  // The first peer whose process exited without a last word (-1: none),
  // and when.
  int firstLoss_ = -1;
  Clock::time_point lossAt_;
  std::string failure_;  // of the worker itself
};

// The pid namespace of this process (its inode), to tell whether a peer's
// pid means the same process here.
uint64_t pidNamespace() {
  struct stat info {};
  return ::stat("/proc/self/ns/pid", &info) == 0 ? static_cast<uint64_t>(info.st_ino) : 0;
}

// A rank's verdict on a step of set-up, gathered so that every rank takes
// the same way on.
struct Verdict {
  uint32_t ok;
  char why[124];
};
static_assert(sizeof(Verdict) == 128, "one allgather block");

// Gathers every rank's verdict; returns "" when all are ok, else the first
// rank's reason.
std::string agree(bootstrap::Bootstrap& bootstrap, const std::string& mine,
                  net::Deadline deadline) {
  std::vector<Verdict> all(static_cast<size_t>(bootstrap.size()));
  Verdict& own = all[static_cast<size_t>(bootstrap.rank())];
  own.ok = mine.empty() ? 1 : 0;
  std::snprintf(own.why, sizeof(own.why), "%s", mine.c_str());
  bootstrap.allGather(all.data(), sizeof(Verdict), deadline);
  for (const Verdict& verdict : all)
    if (!verdict.ok) return std::string(verdict.why, strnlen(verdict.why, sizeof(verdict.why)));
  return "";
}

std::unique_ptr<Transport> create(const Setup& setup, const std::vector<int>& peers,
                                  std::string* whyNot) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  const size_t slotBytes = setup.slotBytes;
  const int slots = setup.slots;
  const net::Deadline deadline = setup.deadline;
  const int rank = bootstrap.rank();
  const int nranks = bootstrap.size();
  if (nranks > (1 << kRankBits)) {  // the same on every rank
    *whyNot = format("UCX's tags carry at most %d ranks, and this communicator has %d",
                     1 << kRankBits, nranks);
    return nullptr;
  }

  // 1. This rank's context and worker, and what the peers need to know.
  std::unique_ptr<Worker> worker;
  std::string why;
  try {
    worker = Worker::open(nranks);
  } catch (const Error& error) {
    why = format("rank %d could not start UCX: %s", rank, error.what());
  }
  struct Offer {
    uint32_t addressBytes;
    int32_t pid;
    uint64_t pidNamespace;
  };
  std::vector<Offer> offers(static_cast<size_t>(nranks));
  offers[rank] = {worker ? static_cast<uint32_t>(worker->address().size()) : 0,
                  static_cast<int32_t>(::getpid()), pidNamespace()};
  bootstrap.allGather(offers.data(), sizeof(Offer), deadline);
  if (std::string first = agree(bootstrap, why, deadline); !first.empty()) {
    *whyNot = first;
    return nullptr;
  }

  // 2. Worker addresses, through the bootstrap's allgather.
  size_t width = 0;
  for (const Offer& offer : offers) width = std::max<size_t>(width, offer.addressBytes);
  std::vector<std::byte> addresses(width * static_cast<size_t>(nranks));
  std::memcpy(&addresses[width * rank], worker->address().data(), worker->address().size());
  bootstrap.allGather(addresses.data(), width, deadline);

  // 3. An endpoint to each peer, and the receives posted.
  auto transport = std::make_unique<UcxTransport>(std::move(worker), nranks);
  const uint32_t comm = communicatorBits(bootstrap.secret());
  const std::string& host = bootstrap.table()[rank].hostId;
  for (int peer : peers) {
    auto connection =
        std::make_unique<UcxConnection>(transport->shared(), transport->worker(), rank, nranks,
                                        peer, comm, slotBytes, static_cast<size_t>(slots));
    if (bootstrap.table()[peer].hostId == host &&
        offers[peer].pidNamespace == offers[rank].pidNamespace &&
        offers[peer].pid != offers[rank].pid)
      connection->watchProcess(offers[peer].pid);
    if (why.empty()) {
      why = connection->connect(reinterpret_cast<const ucp_address_t*>(&addresses[width * peer]));
      if (!why.empty()) why = format("rank %d: %s", rank, why.c_str());
    }
    transport->add(std::move(connection));
  }
  if (std::string first = agree(bootstrap, why, deadline); !first.empty()) {
    *whyNot = first;
    return nullptr;
  }

  // 4. A hello each way on every endpoint: UCX has wired them up.
  why = transport->greet(rank, std::min(deadline, Clock::now() + kGreetWithin));
  if (std::string first = agree(bootstrap, why, deadline); !first.empty()) {
    *whyNot = first;
    return nullptr;
  }
  for (int peer : peers) BRAID_DEBUG(Net, "ucx: connected to peer %d", peer);
  return transport;
}

// Whether `sysfs`/class/infiniband lists a device (InfiniBand or RoCE).
bool hasRdmaDevice(const std::string& sysfs) {
  DIR* dir = ::opendir((sysfs + "/class/infiniband").c_str());
  if (!dir) return false;
  bool found = false;
  while (dirent* entry = ::readdir(dir))
    if (entry->d_name[0] != '.') found = true;
  ::closedir(dir);
  return found;
}

// AUTO takes ucx only over RDMA, on every rank: over plain TCP, UCX's tcp
// measured slower than braid's own (docs/performance.md). ON takes it
// wherever it starts.
bool everyRankCan(const Setup& setup, TransportUse use) {
  if (use != TransportUse::Auto) return true;
  const int without = firstRankWithout(setup, hasRdmaDevice(knobText("BRAID_SYSFS")));
  if (without < 0) return true;
  BRAID_INFO(Init,
             "ranks on different hosts do not use ucx: rank %d has no RDMA device, and over plain "
             "TCP braid's own sockets are faster than ucx (BRAID_UCX=ON takes ucx)",
             without);
  return false;
}

}  // namespace

TransportEntry entry() {
  TransportEntry entry("ucx", Reach::AnyHost,
                       "UCX tagged messages (its own wires: RDMA, shared memory, TCP), any host");
  entry.create = create;
  entry.useKnob = "BRAID_UCX";
  entry.use = &Knobs::ucx;
  entry.everyRankCan = everyRankCan;
  entry.hostLink = tuning::hostLinkModel(15e-6, 3e9);  // not measured apart from tcp's yet
  return entry;
}

}  // namespace braid::transport::ucx
