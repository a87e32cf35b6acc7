// The first braid program: rank r contributes r + 1 and every rank receives
// the sum over n ranks, n(n+1)/2.
//
//   build/bin/braid-run -n 4 build/bin/hello_allreduce
#include <cstdio>
#include <vector>

#include "braid/braid.h"

int main() {
  braid::Communicator comm = braid::Communicator::fromEnvironment();  // braid-run, torchrun, ...
  const int n = comm.size();
  std::vector<float> data(1024, static_cast<float>(comm.rank() + 1));  // plain host memory
  comm.allReduce(data.data(), data.data(), data.size(), braid::DataType::Float32,
                 braid::ReduceOp::Sum);  // in place; returns when done
  const float expected = n * (n + 1) / 2.0f;
  bool ok = true;
  for (float x : data) ok = ok && x == expected;
  std::printf("rank %d of %d: sum %g, expected %g: %s\n", comm.rank(), n, data[0], expected,
              ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
