// The one exception type braid throws.
#pragma once

#include <stdexcept>
#include <string>

namespace braid {

enum class ErrorCode : int {
  InvalidArgument = 1,  // a bad argument; the communicator stays usable
  InvalidUsage = 2,     // a call that is not allowed in this state
  SystemError = 3,      // the operating system refused (socket, memory, ...)
  RemoteError = 4,      // a peer failed or closed its connection; sticky
  Timeout = 5,          // a wait passed Config::timeout; sticky
  Aborted = 6,          // abort() was called; sticky
  Internal = 7,         // a braid bug or a protocol violation; sticky
  Revoked = 8,          // a rank revoked the communicator (revoke()); sticky
};

const char* errorCodeName(ErrorCode code);

// what() says what failed, on which rank, in which op (with its sequence
// number) and with which peer, e.g.
//   "braid rank 1: allReduce #12 (count 1024, float32, sum): peer 2 closed the connection"
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace braid
