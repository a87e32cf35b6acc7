// The VerbsBackend over libibverbs, loaded with dlopen the first time a
// process asks for it. libbraid does not link libibverbs: it is built
// against the headers (libibverbs-dev) alone, so a process that never
// takes the ibverbs transport neither needs rdma-core installed nor pays
// for loading its providers.
//
// What the backend adds to the seam's contract:
// - Completions: a failed completion carries only wrId, status, qpNum and
//   vendorError, as ibv_poll_cq defines; its opcode reads Write because the
//   device does not say, so tell sends from receives by wrId. A successful
//   send-side completion of a WriteWithImm also reads Write (ibv_wc has no
//   opcode for it).
// - pollCq throws Error(SystemError) if the device reports the completion
//   queue itself broken (ibv_poll_cq < 0): that is no connection's failure.
// - registerDmabuf returns nullptr where the library predates
//   ibv_reg_dmabuf_mr (rdma-core < 34) and wherever the registration fails.
// - Teardown (close, dealloc, deregister, destroy) never throws; an object
//   the device refuses to free (still in use: an engine bug) is leaked.
#pragma once

#include <memory>
#include <string>

#include "transports/ibverbs/verbs_backend.h"

namespace braid::transport::ibverbs {

// Loads `library` (once per process and name, thread-safe; never unloaded)
// and returns a backend over it, or nullptr with `*whyNot` set to one line
// ("cannot load libibverbs.so.1 (...)", "libibverbs.so.1 lacks ibv_xxx").
// A library that loads but finds no device still succeeds: deviceNames()
// is empty then.
std::unique_ptr<VerbsBackend> loadLibibverbs(std::string* whyNot,
                                             const char* library = "libibverbs.so.1");

}  // namespace braid::transport::ibverbs
