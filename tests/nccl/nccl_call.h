// What the NCCL-only test programs share: an NCCL call that did not
// succeed, reported in NCCL's own words.
#pragma once

#include <nccl.h>

#include <string>

// Runs `call`; where it does not return ncclSuccess, hands what it said to
// the program's own failed(const std::string&), then does `orElse`
// (`return`, `exit(1)`, ...).
#define NCCL_CALL_OR(call, orElse)                                                    \
  do {                                                                                \
    ncclResult_t result_ = (call);                                                    \
    if (result_ != ncclSuccess) {                                                     \
      failed(std::string(#call) + " returned " + ncclGetErrorString(result_) + ": " + \
             ncclGetLastError(nullptr));                                              \
      orElse;                                                                         \
    }                                                                                 \
  } while (0)
