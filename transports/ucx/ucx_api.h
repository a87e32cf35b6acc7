// The UCX functions the ucx transport calls, loaded from libucp at run time
// (dlopen) the first time a process makes a ucx transport. libbraid does not
// link UCX: loading libucp brings libucm, which patches the process's
// memory calls (mmap, madvise, ...) as it loads, and a process that never
// takes ucx should not carry that (nor need UCX installed). The headers
// (libucx-dev) are needed at build time only.
#pragma once

#include <ucp/api/ucp.h>

#include <string>

namespace braid::transport::ucx {

struct Api {
  decltype(&ucp_config_read) configRead;
  decltype(&ucp_config_release) configRelease;
  decltype(&ucp_init_version) initVersion;
  decltype(&ucp_cleanup) cleanup;
  decltype(&ucp_context_query) contextQuery;
  decltype(&ucp_worker_create) workerCreate;
  decltype(&ucp_worker_destroy) workerDestroy;
  decltype(&ucp_worker_get_efd) workerGetEfd;
  decltype(&ucp_worker_get_address) workerGetAddress;
  decltype(&ucp_worker_release_address) workerReleaseAddress;
  decltype(&ucp_worker_progress) workerProgress;
  decltype(&ucp_worker_arm) workerArm;
  decltype(&ucp_ep_create) epCreate;
  decltype(&ucp_ep_close_nbx) epCloseNbx;
  decltype(&ucp_tag_send_nbx) tagSendNbx;
  decltype(&ucp_tag_send_sync_nbx) tagSendSyncNbx;
  decltype(&ucp_tag_recv_nbx) tagRecvNbx;
  decltype(&ucp_request_cancel) requestCancel;
  decltype(&ucp_request_check_status) requestCheckStatus;
  decltype(&ucp_request_free) requestFree;
  decltype(&ucs_status_string) statusString;
};

// Loads libucp once per process (thread-safe) and returns its functions,
// or nullptr with `*why` saying what is missing.
const Api* load(std::string* why);

// The functions, once load() has succeeded. REQUIRES: load() returned them.
const Api& api();

}  // namespace braid::transport::ucx
