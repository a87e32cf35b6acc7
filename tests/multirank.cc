#include "multirank.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace braid::testing {

void require(bool condition, const std::string& message) {
  if (!condition) throw RankFailure{message};
}

namespace {

struct Child {
  int rank;
  pid_t pid;
  int pipe;  // read end: the child's failure message, if any
  std::string message;
  int status = 0;
  bool exited = false;
};

// In the child: run, then report through the pipe and leave without running
// the parent's atexit handlers or GoogleTest's teardown.
[[noreturn]] void runChild(int fd, const std::function<void()>& body) {
  std::string message;
  try {
    body();
  } catch (const RankFailure& failure) {
    message = failure.message;
  } catch (const std::exception& error) {
    message = std::string("exception: ") + error.what();
  } catch (...) {
    message = "unknown exception";
  }
  if (!message.empty()) {
    ssize_t unused = ::write(fd, message.data(), message.size());
    (void)unused;
  }
  ::close(fd);
  ::_exit(message.empty() ? 0 : 1);
}

// Every thread's stack of a process that hung, from gdb where it is
// installed ("" where it is not, or cannot attach), for the failure report.
std::string stacksOf(pid_t pid) {
  if (::access("/usr/bin/gdb", X_OK) != 0) return "";
  const std::string command = "timeout 60 /usr/bin/gdb -p " + std::to_string(pid) +
                              " -batch -nx -ex 'thread apply all bt' 2>/dev/null"
                              " | grep -E '^(Thread|#)'";
  std::string stacks;
  if (FILE* gdb = ::popen(command.c_str(), "r")) {
    char line[1024];
    while (std::fgets(line, sizeof(line), gdb)) stacks += line;
    ::pclose(gdb);
  }
  return stacks;
}

void drain(Child& child) {
  char buffer[4096];
  for (;;) {
    ssize_t got = ::read(child.pipe, buffer, sizeof(buffer));
    if (got <= 0) return;
    child.message.append(buffer, static_cast<size_t>(got));
  }
}

}  // namespace

void runProcesses(int nranks,
                  const std::function<void(int rank, const UniqueId& id, const Config&)>& body,
                  const RunOptions& options) {
  // The test process starts no thread of braid's: the first rank makes the
  // id (and runs the root, as rank 0 of a real job would) and the test
  // process passes it on to the others through pipes. A process that forks
  // while another of its threads holds a lock (the sanitizers' allocators
  // have no fork handlers) can leave the child waiting for it forever.
  std::vector<Child> children;
  std::vector<int> idPipes;  // write ends, one per child that waits for the id
  int idBack = -1;           // read end: the id from the child that made it
  const bool makeId = !options.id;
  for (int rank = 0; rank < nranks; ++rank) {
    if (std::find(options.absent.begin(), options.absent.end(), rank) != options.absent.end())
      continue;
    const bool maker = makeId && idBack < 0;
    int fds[2], idFds[2];
    ASSERT_EQ(::pipe(fds), 0);
    ASSERT_EQ(::pipe(idFds), 0);
    std::fflush(nullptr);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      for (int other : idPipes) ::close(other);
      if (idBack >= 0) ::close(idBack);
      runChild(fds[1], [&] {
        if (options.enter) options.enter(rank);
        UniqueId id;
        if (maker) {
          ::close(idFds[0]);
          id = Communicator::newUniqueId(options.idConfig ? *options.idConfig : options.config);
          const ssize_t n = ::write(idFds[1], id.bytes.data(), sizeof(id.bytes));
          require(n == static_cast<ssize_t>(sizeof(id.bytes)), "passing the unique id on failed");
          ::close(idFds[1]);
        } else {
          ::close(idFds[1]);
          size_t got = 0;
          while (got < sizeof(id.bytes)) {
            const ssize_t n = ::read(idFds[0], id.bytes.data() + got, sizeof(id.bytes) - got);
            require(n > 0, "the test process passed on no unique id");
            got += static_cast<size_t>(n);
          }
          ::close(idFds[0]);
        }
        body(rank, id, options.config);
      });
    }
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    children.push_back({rank, pid, fds[0], {}});
    if (maker) {
      ::close(idFds[1]);
      idBack = idFds[0];
    } else {
      ::close(idFds[0]);
      idPipes.push_back(idFds[1]);
    }
  }
  UniqueId id;
  bool haveId = false;
  if (options.id) {
    id = *options.id;
    haveId = true;
  } else if (idBack >= 0) {
    size_t got = 0;
    while (got < sizeof(id.bytes)) {
      const ssize_t n = ::read(idBack, id.bytes.data() + got, sizeof(id.bytes) - got);
      if (n <= 0) break;  // that rank failed: it reports why
      got += static_cast<size_t>(n);
    }
    haveId = got == sizeof(id.bytes);
    ::close(idBack);
  }
  for (int fd : idPipes) {
    if (haveId) {
      const ssize_t n = ::write(fd, id.bytes.data(), sizeof(id.bytes));
      (void)n;  // a rank that misses it fails and says so
    }
    ::close(fd);
  }

  std::chrono::seconds limit = options.deadline;
  if (const char* cap = std::getenv("BRAID_TEST_DEADLINE"); cap && std::atoi(cap) > 0)
    limit = std::min(limit, std::chrono::seconds(std::atoi(cap)));
  auto deadline = std::chrono::steady_clock::now() + limit;
  size_t running = children.size();
  while (running > 0 && std::chrono::steady_clock::now() < deadline) {
    for (Child& child : children) {
      if (child.exited) continue;
      drain(child);
      if (::waitpid(child.pid, &child.status, WNOHANG) == child.pid) {
        child.exited = true;
        drain(child);
        --running;
      }
    }
    if (running > 0) ::usleep(2000);
  }
  // Ranks still running hung: each logs its hang report (SIGUSR1: what it
  // waits for), then all are stopped together (so that none sees another
  // die and changes its story) and each one's stacks are taken before it
  // is killed.
  std::vector<std::string> stacks(children.size());
  bool anyHung = false;
  for (Child& child : children)
    if (!child.exited) anyHung = ::kill(child.pid, SIGUSR1) == 0 || anyHung;
  if (anyHung) {
    ::usleep(300000);
    for (Child& child : children)
      if (!child.exited) ::kill(child.pid, SIGSTOP);
    for (size_t i = 0; i < children.size(); ++i)
      if (!children[i].exited) stacks[i] = stacksOf(children[i].pid);
  }
  for (size_t i = 0; i < children.size(); ++i) {
    Child& child = children[i];
    if (!child.exited) {
      ::kill(child.pid, SIGKILL);
      ::waitpid(child.pid, &child.status, 0);
      drain(child);
      ADD_FAILURE() << "rank " << child.rank << " hung: still running after " << limit.count()
                    << " s" << (child.message.empty() ? "" : ": ") << child.message
                    << (stacks[i].empty() ? "" : "\nits threads:\n") << stacks[i];
    } else if (WIFSIGNALED(child.status)) {
      const bool expected = WTERMSIG(child.status) == SIGKILL &&
                            std::find(options.killed.begin(), options.killed.end(), child.rank) !=
                                options.killed.end();
      if (!expected)
        ADD_FAILURE() << "rank " << child.rank << " was killed by signal "
                      << WTERMSIG(child.status);
    } else if (WEXITSTATUS(child.status) != 0) {
      ADD_FAILURE() << "rank " << child.rank << " failed: " << child.message;
    }
    ::close(child.pipe);
  }
}

std::string captureStderr(const std::function<void()>& body) {
  char path[] = "/tmp/braid-stderr-XXXXXX";
  const int file = ::mkstemp(path);
  require(file >= 0, "mkstemp failed");
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(file, 2);
  std::exception_ptr failure;
  try {
    body();
  } catch (...) {
    failure = std::current_exception();
  }
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ::close(file);
  ::unlink(path);
  if (failure) std::rethrow_exception(failure);
  return text;
}

std::string askInChild(const std::function<std::string()>& ask) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    std::string answer;
    try {
      answer = ask();
    } catch (const std::exception& error) {
      answer = error.what();
    }
    (void)!::write(fds[1], answer.data(), answer.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string answer;
  char buffer[512];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof(buffer))) > 0;) answer.append(buffer, n);
  ::close(fds[0]);
  ::waitpid(child, nullptr, 0);
  return answer;
}

void runRanks(int nranks, const std::function<void(Communicator&)>& body,
              const RunOptions& options) {
  runProcesses(
      nranks,
      [&](int rank, const UniqueId& id, const Config& config) {
        Communicator comm = Communicator::init(nranks, rank, id, config);
        body(comm);
      },
      options);
}

}  // namespace braid::testing
