// The collectives on device buffers as test cases: issued on a rank's
// stream, then checked on the host against the reference. Shared by the
// device suites: ranks with a process each, and several ranks driven by
// one process, which issues every rank's case before it waits for any.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "device_support.h"

namespace braid::testing {

enum class Coll { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter };

const char* collName(Coll c);
bool reduces(Coll c);
extern const std::vector<Coll> kAllColls;

struct Case {
  Coll coll;
  DataType type;
  ReduceOp op;
  size_t count;  // per rank for all-gather and reduce-scatter
  bool inPlace;
  int root;
};

// "allReduce int32 sum count 7 in place root 0 at 3 ranks: "
std::string label(const Case& c, int nranks);

// One rank's case, issued on `stream` (device memory of the communicator's
// device), with its buffers, until it is checked.
class IssuedCase {
 public:
  IssuedCase(Communicator& comm, TestStream& stream, const Case& c, uint64_t seed);
  // On the caller's memory (e.g. in a registered window): `send` and
  // `recv` hold at least sendBytes() and recvBytes() and stay valid until
  // check() returned.
  IssuedCase(Communicator& comm, TestStream& stream, const Case& c, uint64_t seed, std::byte* send,
             std::byte* recv);
  static size_t sendBytes(const Case& c, int nranks);
  static size_t recvBytes(const Case& c, int nranks);
  IssuedCase(const IssuedCase&) = delete;
  IssuedCase& operator=(const IssuedCase&) = delete;

  // After the caller synchronized the stream: waits for the Work (which
  // rethrows the op's error), then "" when the result is right, else what
  // is wrong, starting with the case's label.
  std::string check();

 private:
  void issue(TestStream& stream);
  std::vector<std::byte> download(const std::byte* from, size_t bytes) const;

  Communicator& comm_;
  const Case case_;
  const uint64_t seed_;
  std::unique_ptr<DeviceBuffer> ownSend_, ownRecv_;  // unless the caller's
  std::byte* send_;
  std::byte* recv_;
  Work work_;
};

// Issues the case, waits for the stream and checks: "" when right.
std::string runCase(Communicator& comm, TestStream& stream, const Case& c, uint64_t seed);

}  // namespace braid::testing
