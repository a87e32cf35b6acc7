// peer-ompi-allreduce and peer-mpich-allreduce: MPI_Allreduce(MPI_FLOAT,
// MPI_SUM) on MPI_COMM_WORLD, timed like braid-perf allreduce (see
// peer_bench.h). The same file is built once against Open MPI and once
// against MPICH (benchmarks/peers/CMakeLists.txt), which name the program
// through PEER_PROGRAM and PEER_LAUNCH.
//
//   mpirun.openmpi -np 2 --oversubscribe --bind-to none peer-ompi-allreduce -b 8 -e 64M
//   mpiexec.mpich -n 2 peer-mpich-allreduce -b 8 -e 64M
//
// In place is MPI_IN_PLACE. Only MPI's C API is used.
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include "benchmarks/peers/peer_bench.h"

#ifndef PEER_PROGRAM
#error "PEER_PROGRAM must name the program (peer-ompi-allreduce, peer-mpich-allreduce)"
#endif
#ifndef PEER_LAUNCH
#define PEER_LAUNCH "run it under the MPI's mpiexec -n N"
#endif

namespace braid::peers {
namespace {

class MpiCollectives : public Collectives {
 public:
  MpiCollectives() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // The first line of MPI_Get_library_version, up to its first comma, with
  // runs of blanks made one space: "Open MPI v4.1.4", "MPICH Version: 4.0.2".
  std::string library() const override {
    char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int length = 0;
    MPI_Get_library_version(text, &length);
    std::string line;
    for (int i = 0; i < length && text[i] != '\n' && text[i] != ',' && text[i] != '\0'; ++i) {
      char c = text[i] == '\t' ? ' ' : text[i];
      if (c == ' ' && (line.empty() || line.back() == ' ')) continue;
      line += c;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    return line;
  }

  void allReduce(const float* send, float* recv, size_t count) override {
    if (count > static_cast<size_t>(INT_MAX))
      throw std::runtime_error("MPI_Allreduce takes at most 2^31-1 elements");
    const void* in = send == recv ? MPI_IN_PLACE : send;
    MPI_Allreduce(in, recv, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }

  double maxOverRanks(double value) override {
    double out = 0;
    MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return out;
  }

  uint64_t sumOverRanks(uint64_t value) override {
    uint64_t out = 0;
    MPI_Allreduce(&value, &out, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    return out;
  }

  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }

 private:
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace
}  // namespace braid::peers

int main(int argc, char** argv) {
  using braid::peers::Program;
  Program program{PEER_PROGRAM, PEER_LAUNCH, {}};
  braid::peers::Options options;
  try {
    if (!braid::peers::parseOptions(argc, argv, program, &options)) return 0;
  } catch (const braid::peers::UsageError& e) {
    std::fprintf(stderr, "%s: %s (try %s -h)\n", PEER_PROGRAM, e.what(), PEER_PROGRAM);
    return 2;
  }

  MPI_Init(&argc, &argv);
  int code = 0;
  try {
    braid::peers::MpiCollectives mpi;
    code = braid::peers::runAllReduce(mpi, options, program);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", PEER_PROGRAM, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return code;
}
