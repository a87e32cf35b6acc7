#include "chaos/rank.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/communicator_impl.h"
#include "core/errors.h"
#include "core/introspect.h"
#include "device/device.h"
#include "device_support.h"
#include "multirank.h"
#include "reference.h"

namespace braid::chaos {
namespace {

using std::chrono::milliseconds;
using testing::checkCopied;
using testing::checkReduced;
using testing::fillInput;
using testing::poisoned;

void copyText(char (&to)[1024], const std::string& text) {
  const size_t n = std::min(text.size(), sizeof(to) - 1);
  std::memcpy(to, text.data(), n);
  to[n] = '\0';
}

// The process's file descriptors and threads, by number, with what each is
// (the fd's target, the thread's name).
struct Census {
  std::map<int, std::string> fds, threads;
};

std::map<int, std::string> listDir(const char* path, const std::function<std::string(int)>& what,
                                   bool skipOwnFd) {
  std::map<int, std::string> found;
  DIR* dir = ::opendir(path);
  if (!dir) return found;
  const int own = skipOwnFd ? ::dirfd(dir) : -1;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const int number = std::atoi(entry->d_name);
    if (number != own) found[number] = what(number);
  }
  ::closedir(dir);
  return found;
}

Census census() {
  Census c;
  c.fds = listDir(
      "/proc/self/fd",
      [](int fd) {
        char target[256] = {};
        const std::string link = "/proc/self/fd/" + std::to_string(fd);
        const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
        return n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string("?");
      },
      true);
  c.threads = listDir(
      "/proc/self/task",
      [](int tid) {
        std::string name;
        if (FILE* f =
                std::fopen(("/proc/self/task/" + std::to_string(tid) + "/comm").c_str(), "r")) {
          char line[64] = {};
          if (std::fgets(line, sizeof(line), f)) name = line;
          std::fclose(f);
        }
        while (!name.empty() && name.back() == '\n') name.pop_back();
        return name;
      },
      false);
  return c;
}

// What is in `after` and not in `before`: "fd 7 (socket:[123]), thread
// 4242 (braid-exec)".
std::string newcomers(const Census& before, const Census& after) {
  std::string text;
  auto add = [&](const char* kind, const std::map<int, std::string>& was,
                 const std::map<int, std::string>& now) {
    for (const auto& [number, what] : now) {
      auto it = was.find(number);
      if (it != was.end() && it->second == what) continue;
      text += (text.empty() ? "" : ", ") + std::string(kind) + " " + std::to_string(number) + " (" +
              what + ")";
    }
  };
  add("fd", before.fds, after.fds);
  add("thread", before.threads, after.threads);
  return text;
}

// A buffer of one op: host memory, or device memory of the process's
// (emulated) device, holding `contents` to begin with.
class Buffer {
 public:
  Buffer(int device, std::vector<std::byte> contents) {
    if (device < 0) {
      host_ = std::move(contents);
      if (host_.empty()) host_.resize(1);  // a valid pointer for count 0
      return;
    }
    device_ = std::make_unique<testing::DeviceBuffer>(device, contents.size());
    if (!contents.empty()) device_->upload(contents);
  }
  std::byte* data() { return device_ ? device_->data() : host_.data(); }
  std::vector<std::byte> read() const { return device_ ? device_->download() : host_; }

 private:
  std::vector<std::byte> host_;
  std::unique_ptr<testing::DeviceBuffer> device_;
};

std::vector<std::byte> inputOf(const Op& op, int rank, size_t count) {
  std::vector<std::byte> bytes(count * dataTypeSize(op.type));
  fillInput(op.type, op.op, op.seed, rank, 0, count, bytes.data());
  return bytes;
}

// One issued op of this rank, until it is checked: its buffers live until
// then (a grouped or asynchronous op runs after the call returned).
struct Pending {
  Work work;
  std::shared_ptr<Buffer> send, recv;
  std::function<std::string()> check;  // once it completed: "" or what is wrong
};

// Issues this rank's part of `op` (not a group), with buffers on `device`
// (-1: host). Returns nothing for a send/recv this rank has no part in.
std::optional<Pending> issue(Communicator& comm, const Op& op, Stream stream, int device) {
  const int n = comm.size(), r = comm.rank();
  const size_t size = dataTypeSize(op.type), count = op.count;
  Pending p;
  std::shared_ptr<Buffer>& send = p.send;
  std::shared_ptr<Buffer>& recv = p.recv;
  switch (op.kind) {
    case OpKind::AllReduce:
    case OpKind::Reduce: {
      send = std::make_shared<Buffer>(device, inputOf(op, r, count));
      recv = op.inPlace ? send : std::make_shared<Buffer>(device, poisoned(op.type, count));
      p.work =
          op.kind == OpKind::AllReduce
              ? comm.allReduce(send->data(), recv->data(), count, op.type, op.op, stream)
              : comm.reduce(send->data(), recv->data(), count, op.type, op.op, op.root, stream);
      if (op.kind == OpKind::Reduce && r != op.root) return p;
      p.check = [op, n, recv] {
        return checkReduced(op.type, op.op, op.seed, n, 0, op.count, recv->read().data());
      };
      return p;
    }
    case OpKind::Broadcast: {
      const bool root = r == op.root;
      if (op.inPlace) {
        recv = std::make_shared<Buffer>(device,
                                        root ? inputOf(op, r, count) : poisoned(op.type, count));
        send = recv;
      } else {
        if (root) send = std::make_shared<Buffer>(device, inputOf(op, r, count));
        recv = std::make_shared<Buffer>(device, poisoned(op.type, count));
      }
      p.work = comm.broadcast(send ? send->data() : nullptr, recv->data(), count, op.type, op.root,
                              stream);
      p.check = [op, recv] {
        return checkCopied(op.type, op.op, op.seed, op.root, 0, op.count, recv->read().data());
      };
      return p;
    }
    case OpKind::AllGather: {
      std::vector<std::byte> whole = poisoned(op.type, count * n);
      const std::vector<std::byte> mine = inputOf(op, r, count);
      std::byte* in = nullptr;
      if (op.inPlace) {
        std::copy(mine.begin(), mine.end(), whole.begin() + r * count * size);
        recv = std::make_shared<Buffer>(device, std::move(whole));
        in = recv->data() + r * count * size;
      } else {
        send = std::make_shared<Buffer>(device, mine);
        recv = std::make_shared<Buffer>(device, std::move(whole));
        in = send->data();
      }
      p.work = comm.allGather(in, recv->data(), count, op.type, stream);
      p.check = [op, n, size, recv] {
        const std::vector<std::byte> got = recv->read();
        std::string problem;
        for (int b = 0; b < n && problem.empty(); ++b)
          problem = checkCopied(op.type, op.op, op.seed, b, 0, op.count,
                                got.data() + b * op.count * size);
        return problem;
      };
      return p;
    }
    case OpKind::ReduceScatter: {
      send = std::make_shared<Buffer>(device, inputOf(op, r, count * n));
      std::byte* out = nullptr;
      if (op.inPlace) {
        out = send->data() + r * count * size;
        recv = send;
      } else {
        recv = std::make_shared<Buffer>(device, poisoned(op.type, count));
        out = recv->data();
      }
      p.work = comm.reduceScatter(send->data(), out, count, op.type, op.op, stream);
      const size_t offset = op.inPlace ? r * count * size : 0;
      p.check = [op, n, r, offset, recv] {
        return checkReduced(op.type, op.op, op.seed, n, r * op.count, op.count,
                            recv->read().data() + offset);
      };
      return p;
    }
    case OpKind::SendRecv:
      if (r == op.from) {
        send = std::make_shared<Buffer>(device, inputOf(op, r, count));
        p.work = comm.send(send->data(), count, op.type, op.to, stream);
        return p;
      }
      if (r == op.to) {
        recv = std::make_shared<Buffer>(device, poisoned(op.type, count));
        p.work = comm.recv(recv->data(), count, op.type, op.from, stream);
        p.check = [op, recv] {
          return checkCopied(op.type, op.op, op.seed, op.from, 0, op.count, recv->read().data());
        };
        return p;
      }
      return std::nullopt;
    case OpKind::Group:
      break;
  }
  return std::nullopt;
}

// Runs this rank's part of `op` to completion: "" when every result is
// right, else what is wrong. A braid::Error propagates.
std::string runOp(Communicator& comm, const Op& op, testing::TestStream* stream, int device) {
  const Stream where = stream ? stream->stream() : op.async ? Stream::async() : Stream();
  std::vector<Pending> pending;
  if (op.kind == OpKind::Group) {
    comm.groupStart();
    try {
      for (const Op& member : op.members)
        if (auto p = issue(comm, member, where, device)) pending.push_back(std::move(*p));
    } catch (const Error&) {
      try {
        comm.groupEnd();
      } catch (const Error&) {
      }
      throw;
    }
    comm.groupEnd();
  } else if (auto p = issue(comm, op, where, device)) {
    pending.push_back(std::move(*p));
  }
  if (stream) stream->synchronize();
  for (Pending& p : pending) p.work.wait();
  for (Pending& p : pending)
    if (p.check)
      if (std::string problem = p.check(); !problem.empty()) return problem;
  return "";
}

// The trial's first communicator, made and destroyed before the measured
// one: whatever a process makes once and keeps exists before the measured
// communicator is made, so what is left after it is destroyed is its own.
// Without it every transport would seem to leak a thread and a pipe: the
// hang report's signal thread (SIGUSR1, src/core/diagnose.cc), which the
// first communicator of a process installs for the process's lifetime;
// likewise a loaded library's own state (UCX, the fake fabric) and the
// emulated device's.
void warmUp(const Trial& trial, int rank, const UniqueId& id, const Config& config,
            RankReport& report) {
  Communicator comm = Communicator::init(trial.nranks, rank, id, config);
  report.warmSecret.store(comm.impl()->bootstrap->secret());
  std::vector<float> values(1024, 1.0f);
  comm.allReduce(values.data(), values.data(), values.size(), DataType::Float32, ReduceOp::Sum);
  if (usesDevice(trial.transport)) {
    const int device = device::current()->current();
    testing::TestStream stream(device);
    Buffer buffer(device, std::vector<std::byte>(4096));
    comm.allReduce(buffer.data(), buffer.data(), 1024, DataType::Float32, ReduceOp::Sum,
                   stream.stream());
    stream.synchronize();
  }
  comm.barrier();
}

// The transport `rank` should reach `peer` by in this trial: "" when it
// is.
std::string wrongTransport(const Trial& trial, const Communicator& comm) {
  const std::vector<std::string> names = detail::peerTransports(comm);
  const int r = comm.rank();
  for (int p = 0; p < comm.size(); ++p) {
    std::string want = "self";
    if (p != r) switch (trial.transport) {
        case Transport::Shm:
          want = "shm";
          break;
        case Transport::Tcp:
        case Transport::Tcp4:
        case Transport::Staged:
          want = "tcp";
          break;
        case Transport::Ucx:
          want = "ucx";
          break;
        case Transport::Ibverbs:
          want = "ibverbs";
          break;
        case Transport::Device:
          want = trial.hostOf[p] == trial.hostOf[r] ? "shm" : "tcp";
          break;
      }
    if (names[p] != want)
      return format("rank %d reaches rank %d over %s, not %s", r, p, names[p].c_str(),
                    want.c_str());
  }
  return "";
}

// The measured communicator's id: rank 0 makes it and passes it on through
// the shared state; the others wait for it.
UniqueId secondId(int rank, const Config& idConfig, const Config& config, SharedState* shared) {
  UniqueId id;
  if (rank == 0) {
    id = Communicator::newUniqueId(idConfig);
    std::memcpy(shared->id, id.bytes.data(), sizeof(shared->id));
    shared->idReady.store(1);
    return id;
  }
  const auto giveUp = std::chrono::steady_clock::now() + 2 * config.timeout;
  while (shared->idReady.load() == 0) {
    testing::require(std::chrono::steady_clock::now() < giveUp,
                     "rank 0 passed on no id for the measured communicator");
    std::this_thread::sleep_for(milliseconds(1));
  }
  std::memcpy(id.bytes.data(), shared->id, sizeof(shared->id));
  return id;
}

}  // namespace

const char* phaseName(Phase phase) {
  static const char* const kNames[] = {"not started",
                                       "started",
                                       "warmed up",
                                       "joined the measured communicator",
                                       "past its first barrier",
                                       "done with its ops",
                                       "reported"};
  return kNames[static_cast<int>(phase)];
}

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string transportEnvironment(const Trial& trial) {
  switch (trial.transport) {
    case Transport::Shm:
      return "";
    case Transport::Tcp:
      return "BRAID_TRANSPORT=tcp";
    case Transport::Tcp4:
      return "BRAID_TRANSPORT=tcp BRAID_NSOCKS_PERTHREAD=4";
    case Transport::Ucx:
      // Namespace hosts share the IPC namespace: UCX over TCP, as between
      // machines. On one host, UCX's shared memory with its peer failure
      // handling.
      return trial.hosts > 1 ? "BRAID_TRANSPORT=ucx UCX_TLS=tcp,self"
                             : "BRAID_TRANSPORT=ucx UCX_POSIX_ERROR_HANDLING=y";
    case Transport::Ibverbs:
      return "BRAID_TRANSPORT=ibverbs BRAID_IB_FAKE=chaos";
    case Transport::Device:
      return "BRAID_DEVICE=emulated BRAID_DEVICE_SLOT_BYTES=64K";
    case Transport::Staged:
      return "BRAID_DEVICE=emulated BRAID_DEVICE_SLOT_BYTES=64K BRAID_TRANSPORT=tcp";
  }
  return "";
}

void enterTransport(const Trial& trial) {
  for (const char* name : {"BRAID_TRANSPORT", "BRAID_NSOCKS_PERTHREAD", "BRAID_IB_FAKE", "UCX_TLS",
                           "UCX_POSIX_ERROR_HANDLING", "BRAID_DEVICE", "BRAID_DEVICE_SLOT_BYTES"})
    ::unsetenv(name);
  const std::string env = transportEnvironment(trial);
  for (size_t at = 0; at < env.size();) {
    const size_t space = std::min(env.find(' ', at), env.size());
    const std::string pair = env.substr(at, space - at);
    const size_t eq = pair.find('=');
    ::setenv(pair.substr(0, eq).c_str(), pair.substr(eq + 1).c_str(), 1);
    at = space + 1;
  }
  if (usesDevice(trial.transport)) device::select("emulated");
}

void runRank(const Trial& trial, int rank, const UniqueId& id, const Config& config,
             const Config& idConfig, SharedState* shared) {
  RankReport& report = shared->ranks[rank];
  report.pid.store(::getpid());
  report.phase.store(static_cast<int>(Phase::Started));
  auto reached = [&](Phase phase) { report.phase.store(static_cast<int>(phase)); };
  auto failed = [&](const Error& error) {
    report.errorCode.store(static_cast<int>(error.code()));
    copyText(report.error, error.what());
    report.errorAtNs.store(nowNs());
  };
  try {
    warmUp(trial, rank, id, config, report);
  } catch (const Error& error) {
    failed(error);
    reached(Phase::Reported);  // with nothing to count: the driver judges the error
    return;
  }
  reached(Phase::WarmedUp);
  const UniqueId measured = secondId(rank, idConfig, config, shared);

  const Census before = census();
  report.fdsBefore.store(static_cast<int>(before.fds.size()));
  report.threadsBefore.store(static_cast<int>(before.threads.size()));
  {
    Communicator comm;
    const auto started = std::chrono::steady_clock::now();
    try {
      comm = Communicator::init(trial.nranks, rank, measured, config);
    } catch (const Error& error) {
      failed(error);
    }
    report.initMs.store(
        std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - started)
            .count());
    if (comm.valid()) {
      reached(Phase::Joined);
      report.secret.store(comm.impl()->bootstrap->secret());
      // A trial that does not run over the transport it drew tests nothing.
      copyText(report.wrong, wrongTransport(trial, comm));
      // Abort: a thread of the victim aborts its communicator when the
      // driver says, unless the rank is closing it already (abort() must
      // not run while the communicator is destroyed).
      std::mutex closing;
      bool closed = false;
      std::thread aborter;
      if (trial.fault == Fault::Abort && rank == trial.victim)
        aborter = std::thread([&] {
          for (;;) {
            {
              std::lock_guard<std::mutex> hold(closing);
              if (closed) return;
              if (shared->abortNow.load()) {
                comm.abort();
                shared->aborted.store(1);
                return;
              }
            }
            std::this_thread::sleep_for(milliseconds(1));
          }
        });
      const int device = usesDevice(trial.transport) ? device::current()->current() : -1;
      std::unique_ptr<testing::TestStream> stream;
      if (device >= 0) stream = std::make_unique<testing::TestStream>(device);
      try {
        comm.barrier();
        reached(Phase::PastBarrier);
        const auto barrierAt = std::chrono::steady_clock::now();
        shared->pastBarrier.fetch_add(1);
        for (size_t i = 0; i < trial.ops.size(); ++i) {
          const int64_t opStart = nowNs();
          report.opStartNs.store(opStart);
          const std::string problem = runOp(comm, trial.ops[i], stream.get(), device);
          report.opStartNs.store(0);
          report.longestOpMs.store(
              std::max(report.longestOpMs.load(), (nowNs() - opStart) / 1'000'000));
          if (!problem.empty() && report.wrong[0] == '\0')
            copyText(report.wrong,
                     "op #" + std::to_string(i) + " " + describe(trial.ops[i]) + ": " + problem);
          report.opsDone.fetch_add(1);
        }
        if (trial.linger && trial.fault != Fault::None) {
          const auto giveUp = barrierAt + trial.moment + std::chrono::seconds(10);
          while (!shared->faultOver.load() && std::chrono::steady_clock::now() < giveUp)
            std::this_thread::sleep_for(milliseconds(1));
          comm.barrier();
        }
      } catch (const Error& error) {
        failed(error);
      }
      report.opStartNs.store(0);
      reached(Phase::Ended);
      stream.reset();
      if (aborter.joinable()) {
        {
          std::lock_guard<std::mutex> hold(closing);
          closed = true;
        }
        aborter.join();
      }
      const auto destroying = std::chrono::steady_clock::now();
      comm = Communicator();
      report.destroyMs.store(
          std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - destroying)
              .count());
    }
  }
  // Some threads outlive what made them by design, and go of themselves:
  // the emulated device's streams (this rank's and the communicator's)
  // finish their queued work after they are destroyed, as on a GPU, and
  // then their worker exits. What is still there a second later is left.
  Census after = census();
  for (int settle = 0; settle < 100; ++settle) {
    if (after.fds.size() <= before.fds.size() && after.threads.size() <= before.threads.size())
      break;
    std::this_thread::sleep_for(milliseconds(10));
    after = census();
  }
  report.fdsAfter.store(static_cast<int>(after.fds.size()));
  report.threadsAfter.store(static_cast<int>(after.threads.size()));
  if (after.fds.size() > before.fds.size() || after.threads.size() > before.threads.size())
    copyText(report.leaked, newcomers(before, after));
  reached(Phase::Reported);
}

}  // namespace braid::chaos
