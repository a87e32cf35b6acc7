#include "core/diagnose.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "core/log.h"

namespace braid {

std::string Communicator::Impl::describeState() const {
  constexpr auto relaxed = std::memory_order_relaxed;
  std::string text = format(
      "rank %d of %d: collectives issued %llu, completed %llu, %zu async ops queued; ", rank,
      nranks, static_cast<unsigned long long>(collectiveSeq.load(relaxed)),
      static_cast<unsigned long long>(completedSeq.load(relaxed)), outstanding.load(relaxed));
  if (deviceExecutor)
    if (const std::string stuck = deviceExecutor->describeStuck(); !stuck.empty())
      text += stuck + "; on the host: ";
  const exec::Activity& now = executor->activity();
  const char* name = now.name.load(std::memory_order_acquire);
  if (!name) return text + "no op running";
  const uint64_t seq = now.seq.load(relaxed);
  const size_t steps = now.steps.load(relaxed);
  if (steps == 0)  // it has not had to wait yet
    return text + format("in %s #%llu, moving data", name, static_cast<unsigned long long>(seq));
  exec::OpInfo info;
  info.name = name;
  info.seq = seq;
  info.count = now.count.load(relaxed);
  info.type = static_cast<DataType>(now.type.load(relaxed));
  info.op = static_cast<ReduceOp>(now.op.load(relaxed));
  info.reduces = now.reduces.load(relaxed);
  info.root = now.root.load(relaxed);
  info.peer = now.peer.load(relaxed);
  text += "in " + info.describe();
  if (const size_t lanes = now.lanes.load(relaxed); lanes > 1)
    text += format(" (one of a group of %zu)", lanes);
  text += format(", step %zu of %zu", now.step.load(relaxed) + 1, steps);
  if (const int from = now.recvPeer.load(relaxed); from >= 0)
    text += format(", receiving from rank %d", from);
  if (const int to = now.sendPeer.load(relaxed); to >= 0)
    text += format(", sending to rank %d", to);
  if (const int64_t since = now.waitingSince.load(relaxed); since != 0) {
    const int64_t nowNs = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now().time_since_epoch())
                              .count();
    text += format(", waiting for %.3g s", std::max<int64_t>(0, nowNs - since) / 1e9);
  } else {
    text += ", moving data";
  }
  return text;
}

namespace diagnose {
namespace {

std::mutex gMutex;  // guards gLive and the installation
std::vector<const Communicator::Impl*> gLive;
pid_t gInstalledIn = 0;  // the process that installed the handler (0: none)
int gPipe[2] = {-1, -1};
struct sigaction gPrevious {};

// Async-signal-safe: one byte into the pipe wakes the reporting thread.
void onSignal(int signal, siginfo_t* info, void* context) {
  const int saved = errno;
  if (gPipe[1] >= 0) {
    const char byte = 1;
    [[maybe_unused]] ssize_t ignored = ::write(gPipe[1], &byte, 1);
  }
  errno = saved;
  if (gPrevious.sa_flags & SA_SIGINFO) {
    if (gPrevious.sa_sigaction) gPrevious.sa_sigaction(signal, info, context);
  } else if (gPrevious.sa_handler != SIG_DFL && gPrevious.sa_handler != SIG_IGN) {
    gPrevious.sa_handler(signal);
  }
}

void reportLoop(int readEnd) {
  for (;;) {
    char bytes[64];
    const ssize_t got = ::read(readEnd, bytes, sizeof(bytes));
    if (got > 0) {
      reportAll("SIGUSR1");
    } else if (got == 0 || errno != EINTR) {
      return;
    }
  }
}

// REQUIRES: gMutex held. Once per process (a forked child installs anew:
// the thread did not come along).
void install() {
  if (gInstalledIn == ::getpid()) return;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;
  ::fcntl(fds[1], F_SETFL, O_NONBLOCK);  // a signal storm never blocks the handler
  std::thread(reportLoop, fds[0]).detach();
  gPipe[1] = fds[1];
  struct sigaction action {};
  action.sa_sigaction = onSignal;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  struct sigaction previous {};
  if (::sigaction(SIGUSR1, &action, &previous) == 0 && gInstalledIn == 0) gPrevious = previous;
  gInstalledIn = ::getpid();
}

}  // namespace

void add(const Communicator::Impl* impl) {
  std::lock_guard<std::mutex> lock(gMutex);
  install();
  gLive.push_back(impl);
}

void remove(const Communicator::Impl* impl) {
  std::lock_guard<std::mutex> lock(gMutex);
  gLive.erase(std::remove(gLive.begin(), gLive.end(), impl), gLive.end());
}

void report(const Communicator::Impl& impl, const char* why) {
  // Written whatever BRAID_LOG_LEVEL says: someone asked for it.
  log::write(log::Level::Warn, log::Subsys::Exec, "hang report (%s): %s", why,
             impl.describeState().c_str());
}

void reportAll(const char* why) {
  std::lock_guard<std::mutex> lock(gMutex);
  if (gLive.empty())
    log::write(log::Level::Warn, log::Subsys::Exec, "hang report (%s): no communicator", why);
  for (const Communicator::Impl* impl : gLive) report(*impl, why);
}

}  // namespace diagnose
}  // namespace braid
