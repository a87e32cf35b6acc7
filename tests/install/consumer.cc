// Uses only the installed public headers: a one-rank all-reduce.
#include <braid/braid.h>

#include <cstdio>

int main() {
  braid::Config config;
  config.socketIfname = "lo";
  braid::UniqueId id = braid::Communicator::newUniqueId(config);
  braid::Communicator comm = braid::Communicator::init(1, 0, id, config);
  float in[3] = {1, 2, 3}, out[3] = {};
  comm.allReduce(in, out, 3, braid::DataType::Float32, braid::ReduceOp::Sum);
  bool ok = out[0] == 1 && out[1] == 2 && out[2] == 3;
  std::printf("braid %s consumer: %s\n", BRAID_VERSION_STRING, ok ? "ok" : "wrong result");
  return ok ? 0 : 1;
}
