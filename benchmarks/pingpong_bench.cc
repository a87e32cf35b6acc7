// Google Benchmark: ping-pong between two ranks of one host over braid's
// send/recv (shared memory unless BRAID_TRANSPORT says otherwise).
//
// The benchmark process forks the second rank, which echoes every message.
// Before each run the first rank tells it the size and the number of
// round trips, so both sides issue matching receives.
#include <benchmark/benchmark.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "braid/braid.h"

namespace {

struct Control {
  uint64_t bytes;
  uint64_t rounds;  // 0: stop
};

braid::Communicator* gComm = nullptr;

void sendControl(const Control& control) {
  gComm->send(&control, sizeof(control), braid::DataType::Uint8, 1);
}

// Rank 1: echo until told to stop.
int echo(braid::Communicator& comm) {
  std::vector<uint8_t> buffer;
  for (;;) {
    Control control{};
    comm.recv(&control, sizeof(control), braid::DataType::Uint8, 0);
    if (control.rounds == 0) return 0;
    buffer.resize(control.bytes);
    for (uint64_t i = 0; i < control.rounds; ++i) {
      comm.recv(buffer.data(), control.bytes, braid::DataType::Uint8, 0);
      comm.send(buffer.data(), control.bytes, braid::DataType::Uint8, 0);
    }
  }
}

void PingPong(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> out(bytes, 7), in(bytes);
  sendControl({bytes, static_cast<uint64_t>(state.max_iterations)});
  for (auto _ : state) {
    gComm->send(out.data(), bytes, braid::DataType::Uint8, 1);
    gComm->recv(in.data(), bytes, braid::DataType::Uint8, 1);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * bytes));
  // Seconds per one-way message (half a round trip).
  state.counters["one_way"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 2,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(PingPong)->RangeMultiplier(8)->Range(8, 4 << 20)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  braid::Config config;
  config.socketIfname = "lo";
  braid::UniqueId id = braid::Communicator::newUniqueId(config);
  std::fflush(nullptr);
  pid_t child = fork();
  if (child == 0) {
    braid::Communicator comm = braid::Communicator::init(2, 1, id, config);
    _exit(echo(comm));
  }
  braid::Communicator comm = braid::Communicator::init(2, 0, id, config);
  gComm = &comm;
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  sendControl({0, 0});
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
