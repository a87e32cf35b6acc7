// braid-run: starts N local ranks of a program, like
// `torchrun --standalone --nproc-per-node N`.
//
//   braid-run -n N [--timeout 60s] [--] prog args...
//
// braid-run makes the job's UniqueId itself, which starts the rendezvous root
// as a thread of this process (so there is no port to agree on and no race
// for one), and hands each child its rank through the environment:
// BRAID_RANK, BRAID_WORLD_SIZE, BRAID_LOCAL_RANK, BRAID_LOCAL_WORLD_SIZE,
// BRAID_UNIQUE_ID (the id in hex) and BRAID_ROOT (the root's host:port).
// It also sets what torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT), so a
// PyTorch program's init_process_group() finds its rendezvous the same way
// under both launchers.
//
// SIGINT, SIGTERM and SIGHUP are forwarded to every child, and so is SIGUSR1,
// which makes every rank log its hang report (braid-info -h). The first child
// that fails (non-zero exit or killed by a signal) fails the job: braid-run
// names it on stderr, sends SIGTERM to the others, SIGKILL after 5 s, and
// exits with that child's status (128 + signal for a signal). It exits 0 when
// every rank does, and 2 on bad usage.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "braid/communicator.h"
#include "braid/config.h"
#include "braid/error.h"
#include "core/knobs.h"

extern char** environ;

namespace {

constexpr const char* kUsage =
    "usage: braid-run -n N [--timeout DURATION] [--] program [args...]\n"
    "  -n N                 number of local ranks to start (N >= 1)\n"
    "  --timeout DURATION   how long the rendezvous waits for the ranks, e.g. 60s\n"
    "                       (default: BRAID_TIMEOUT, 300s)\n"
    "  -h, --help           print this help\n";

constexpr std::chrono::seconds kKillGrace{5};

struct Options {
  int nranks = 0;
  braid::Config config;
  std::vector<std::string> command;  // program and its arguments
};

[[noreturn]] void usageError(const std::string& message) {
  std::fprintf(stderr, "braid-run: %s (try braid-run --help)\n", message.c_str());
  std::exit(2);
}

int parseRanks(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < 1 || value > 65536)
    usageError("-n: '" + text + "' is not a rank count >= 1");
  return static_cast<int>(value);
}

Options parseOptions(int argc, char** argv) {
  Options options;
  bool haveRanks = false;
  int i = 1;
  // Returns the option's value: the rest of `arg` after `prefix`, else the next argument.
  auto value = [&](const std::string& arg, size_t prefix, const char* name) -> std::string {
    if (arg.size() > prefix) return arg.substr(arg[prefix] == '=' ? prefix + 1 : prefix);
    if (i + 1 >= argc) usageError(std::string(name) + " needs a value");
    return argv[++i];
  };
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;  // the program starts here
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (arg.compare(0, 2, "-n") == 0 && (arg.size() == 2 || arg[2] != '-')) {
      options.nranks = parseRanks(value(arg, 2, "-n"));
      haveRanks = true;
    } else if (arg == "--timeout" || arg.compare(0, 10, "--timeout=") == 0) {
      std::string text = value(arg, 9, "--timeout");
      try {
        options.config.timeout = braid::parseDuration(text, "--timeout");
      } catch (const braid::Error&) {
        usageError("--timeout: '" + text + "' is not a duration such as 60s or 1500ms");
      }
      if (options.config.timeout.count() <= 0) usageError("--timeout must be positive");
    } else {
      usageError("unknown option '" + arg + "'");
    }
  }
  if (!haveRanks) usageError("missing -n N");
  if (i >= argc) usageError("missing the program to run");
  options.command.assign(argv + i, argv + argc);
  return options;
}

bool isExecutableFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// The file execvp() would run for `program`, or "" when there is none.
std::string findProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) return isExecutableFile(program) ? program : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (isExecutableFile(candidate)) return candidate;
    start = end + 1;
  }
  return "";
}

// Everything a child needs to exec, prepared before fork(): between fork()
// and exec() the child may only make async-signal-safe calls, and the
// rendezvous thread may hold the allocator's lock at the moment of the fork.
struct ChildSpec {
  std::vector<std::string> envStrings;
  std::vector<char*> env;
  std::vector<char*> argv;
};

// A loopback port nobody listens on now, for torch's store (MASTER_PORT):
// rank 0's process binds it moments later, as under torchrun --standalone.
int freeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  int port = 29500;  // torchrun's default, should the kernel not pick one
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    port = ntohs(address.sin_port);
  if (fd >= 0) ::close(fd);
  return port;
}

bool isLauncherVariable(const char* entry) {
  static const char* const kNames[] = {"BRAID_RANK=",
                                       "BRAID_WORLD_SIZE=",
                                       "BRAID_LOCAL_RANK=",
                                       "BRAID_LOCAL_WORLD_SIZE=",
                                       "BRAID_UNIQUE_ID=",
                                       "BRAID_ROOT=",
                                       "RANK=",
                                       "WORLD_SIZE=",
                                       "LOCAL_RANK=",
                                       "LOCAL_WORLD_SIZE=",
                                       "MASTER_ADDR=",
                                       "MASTER_PORT="};
  for (const char* name : kNames)
    if (std::strncmp(entry, name, std::strlen(name)) == 0) return true;
  return false;
}

void makeChildSpec(ChildSpec* spec, int rank, int nranks, const std::string& idHex,
                   const std::string& root, int torchPort, std::vector<std::string>& command) {
  for (char** e = environ; *e; ++e)
    if (!isLauncherVariable(*e)) spec->envStrings.emplace_back(*e);
  spec->envStrings.push_back("BRAID_RANK=" + std::to_string(rank));
  spec->envStrings.push_back("BRAID_WORLD_SIZE=" + std::to_string(nranks));
  spec->envStrings.push_back("BRAID_LOCAL_RANK=" + std::to_string(rank));
  spec->envStrings.push_back("BRAID_LOCAL_WORLD_SIZE=" + std::to_string(nranks));
  spec->envStrings.push_back("BRAID_UNIQUE_ID=" + idHex);
  spec->envStrings.push_back("BRAID_ROOT=" + root);
  for (const char* name : {"RANK=", "LOCAL_RANK="})
    spec->envStrings.push_back(name + std::to_string(rank));
  for (const char* name : {"WORLD_SIZE=", "LOCAL_WORLD_SIZE="})
    spec->envStrings.push_back(name + std::to_string(nranks));
  spec->envStrings.push_back("MASTER_ADDR=127.0.0.1");
  spec->envStrings.push_back("MASTER_PORT=" + std::to_string(torchPort));
  for (std::string& s : spec->envStrings) spec->env.push_back(s.data());
  spec->env.push_back(nullptr);
  for (std::string& s : command) spec->argv.push_back(s.data());
  spec->argv.push_back(nullptr);
}

// The children, shared between the main thread (which forks and reaps them)
// and the signal thread (which forwards signals to them).
struct Children {
  std::mutex mutex;
  std::vector<pid_t> pids;   // by rank; 0 once reaped or never started (mutex held)
  int signalReceived = 0;    // the first forwarded signal, 0 if none (mutex held)
  bool terminating = false;  // no more children may start (mutex held)
};

Children gChildren;

void killAll(int sig) {
  std::lock_guard<std::mutex> lock(gChildren.mutex);
  for (pid_t pid : gChildren.pids)
    if (pid > 0) ::kill(pid, sig);
}

// Runs on its own thread with the forwarded signals blocked everywhere else,
// so forwarding needs no async-signal-safety tricks.
void forwardSignals(sigset_t set) {
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    std::lock_guard<std::mutex> lock(gChildren.mutex);
    if (sig != SIGUSR1) {  // SIGUSR1 asks each rank for a hang report, nothing more
      if (gChildren.signalReceived == 0) gChildren.signalReceived = sig;
      gChildren.terminating = true;
    }
    for (pid_t pid : gChildren.pids)
      if (pid > 0) ::kill(pid, sig);
  }
}

// Writes a message without allocating; for the child between fork and exec.
void writeStderr(const char* a, const char* b, const char* c) {
  for (const char* s : {a, b, c}) {
    size_t len = std::strlen(s);
    while (len > 0) {
      ssize_t n = ::write(STDERR_FILENO, s, len);
      if (n <= 0) return;
      s += n, len -= static_cast<size_t>(n);
    }
  }
}

// Returns the rank the pid belongs to and forgets the pid, or -1.
int reaped(pid_t pid) {
  std::lock_guard<std::mutex> lock(gChildren.mutex);
  for (size_t r = 0; r < gChildren.pids.size(); ++r) {
    if (gChildren.pids[r] == pid) {
      gChildren.pids[r] = 0;
      return static_cast<int>(r);
    }
  }
  return -1;
}

int running() {
  std::lock_guard<std::mutex> lock(gChildren.mutex);
  int n = 0;
  for (pid_t pid : gChildren.pids) n += pid > 0;
  return n;
}

// SIGTERM to the remaining children, SIGKILL to those still there after the
// grace period; returns once all are reaped.
void stopRemaining() {
  killAll(SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + kKillGrace;
  while (running() > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      reaped(pid);
      continue;
    }
    if (pid < 0 && errno == ECHILD) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      killAll(SIGKILL);
      while ((pid = ::waitpid(-1, &status, 0)) > 0 || (pid < 0 && errno == EINTR))
        if (pid > 0) reaped(pid);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Exit without running static destructors: the rendezvous root may still be
// running on its detached thread.
[[noreturn]] void finish(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parseOptions(argc, argv);
  std::string program = findProgram(options.command[0]);
  if (program.empty()) usageError("program not found: " + options.command[0]);

  // Block the forwarded signals before any thread exists (the rendezvous root
  // is one), so that every thread inherits the mask and only the signal
  // thread receives them. Children get the original mask back before exec.
  // A signal this process was started with ignored (nohup, a background job
  // of a non-interactive shell) stays ignored, here and in the children.
  sigset_t forwarded, original;
  sigemptyset(&forwarded);
  sigaddset(&forwarded, SIGINT);
  sigaddset(&forwarded, SIGTERM);
  sigaddset(&forwarded, SIGHUP);
  sigaddset(&forwarded, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &forwarded, &original);

  std::string idHex, root;
  try {
    braid::UniqueId id = braid::Communicator::newUniqueId(options.config);
    idHex = id.toHex();
    root = braid::bootstrap::decodeId(id).root.toString();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-run: cannot start the rendezvous: %s\n", e.what());
    finish(1);
  }

  const int torchPort = freeLoopbackPort();
  std::vector<ChildSpec> specs(options.nranks);
  for (int rank = 0; rank < options.nranks; ++rank)
    makeChildSpec(&specs[rank], rank, options.nranks, idHex, root, torchPort, options.command);
  gChildren.pids.assign(options.nranks, 0);
  std::thread(forwardSignals, forwarded).detach();

  int started = 0;
  pid_t self = ::getpid();
  for (int rank = 0; rank < options.nranks; ++rank) {
    // Under the mutex, so a signal arriving now either stops the loop or
    // reaches this child.
    std::lock_guard<std::mutex> lock(gChildren.mutex);
    if (gChildren.terminating) break;
    pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "braid-run: fork for rank %d failed: %s\n", rank, std::strerror(errno));
      gChildren.terminating = true;
      break;
    }
    if (pid == 0) {
      // A rank must not outlive braid-run, even when braid-run is SIGKILLed.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != self) ::_exit(127);  // braid-run died before the prctl
      pthread_sigmask(SIG_SETMASK, &original, nullptr);
      ::execve(program.c_str(), specs[rank].argv.data(), specs[rank].env.data());
      writeStderr("braid-run: cannot execute ", program.c_str(), ": ");
      writeStderr(std::strerror(errno), "\n", "");
      ::_exit(127);
    }
    gChildren.pids[rank] = pid;
    ++started;
  }

  if (started < options.nranks) {
    // A signal or a failed fork: the ranks that did start would wait for the
    // others until the rendezvous timed out.
    stopRemaining();
    std::lock_guard<std::mutex> lock(gChildren.mutex);
    finish(gChildren.signalReceived ? 128 + gChildren.signalReceived : 1);
  }

  // Reap the children; the first failure fails the job.
  int exitCode = 0;
  for (int left = started; left > 0;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;  // ECHILD: nothing left
    }
    int rank = reaped(pid);
    if (rank < 0) continue;
    --left;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    if (WIFSIGNALED(status)) {
      std::fprintf(stderr, "braid-run: rank %d killed by signal %d\n", rank, WTERMSIG(status));
      exitCode = 128 + WTERMSIG(status);
    } else {
      std::fprintf(stderr, "braid-run: rank %d exited with status %d\n", rank, WEXITSTATUS(status));
      exitCode = WEXITSTATUS(status);
    }
    stopRemaining();
    break;
  }
  finish(exitCode);
}
