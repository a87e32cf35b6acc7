#include "transports/ucx/ucx_api.h"

#include <dlfcn.h>

#include <type_traits>

#include "core/errors.h"

namespace braid::transport::ucx {
namespace {

struct Loaded {
  Api api{};
  std::string why;  // empty once every function is there
};

// libucp and its functions, for the process's life (never unloaded: UCX's
// memory hooks stay in place once installed).
const Loaded& loaded() {
  static const Loaded result = [] {
    Loaded out;
    void* library = ::dlopen("libucp.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!library) {
      const char* error = ::dlerror();
      out.why = format("cannot load libucp.so.0 (%s)", error ? error : "no reason given");
      return out;
    }
    // dlsym on libucp's handle also finds its dependencies' symbols
    // (ucs_status_string is libucs's).
    auto take = [&](auto& function, const char* name) {
      void* symbol = ::dlsym(library, name);
      if (!symbol && out.why.empty()) out.why = format("libucp.so.0 lacks %s", name);
      function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(symbol);
    };
    Api& api = out.api;
    take(api.configRead, "ucp_config_read");
    take(api.configRelease, "ucp_config_release");
    take(api.initVersion, "ucp_init_version");
    take(api.cleanup, "ucp_cleanup");
    take(api.contextQuery, "ucp_context_query");
    take(api.workerCreate, "ucp_worker_create");
    take(api.workerDestroy, "ucp_worker_destroy");
    take(api.workerGetEfd, "ucp_worker_get_efd");
    take(api.workerGetAddress, "ucp_worker_get_address");
    take(api.workerReleaseAddress, "ucp_worker_release_address");
    take(api.workerProgress, "ucp_worker_progress");
    take(api.workerArm, "ucp_worker_arm");
    take(api.epCreate, "ucp_ep_create");
    take(api.epCloseNbx, "ucp_ep_close_nbx");
    take(api.tagSendNbx, "ucp_tag_send_nbx");
    take(api.tagSendSyncNbx, "ucp_tag_send_sync_nbx");
    take(api.tagRecvNbx, "ucp_tag_recv_nbx");
    take(api.requestCancel, "ucp_request_cancel");
    take(api.requestCheckStatus, "ucp_request_check_status");
    take(api.requestFree, "ucp_request_free");
    take(api.statusString, "ucs_status_string");
    return out;
  }();
  return result;
}

}  // namespace

const Api* load(std::string* why) {
  const Loaded& result = loaded();
  if (result.why.empty()) return &result.api;
  *why = result.why;
  return nullptr;
}

const Api& api() { return loaded().api; }

}  // namespace braid::transport::ucx
