#include "transports/ucx/ucx_worker.h"

#include <poll.h>

#include <string>
#include <thread>

#include "braid/error.h"
#include "core/errors.h"
#include "transports/ucx/ucx_api.h"

namespace braid::transport::ucx {
namespace {

[[noreturn]] void failStep(const char* call, ucs_status_t status) {
  throw Error(ErrorCode::SystemError, format("%s failed: %s", call, api().statusString(status)));
}

}  // namespace

std::unique_ptr<Worker> Worker::open(int nranks) {
  if (std::string why; !load(&why)) throw Error(ErrorCode::SystemError, why);
  std::unique_ptr<Worker> worker(new Worker());
  ucp_config_t* config = nullptr;
  ucs_status_t status = api().configRead(nullptr, nullptr, &config);
  if (status != UCS_OK) failStep("ucp_config_read", status);
  ucp_params_t params{};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.estimated_num_eps = static_cast<size_t>(nranks);
  params.name = "braid";
  status = api().initVersion(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &worker->context_);
  api().configRelease(config);
  if (status != UCS_OK) {
    worker->context_ = nullptr;
    failStep("ucp_init", status);
  }
  ucp_context_attr_t attributes{};
  attributes.field_mask = UCP_ATTR_FIELD_REQUEST_SIZE;
  status = api().contextQuery(worker->context_, &attributes);
  if (status != UCS_OK) failStep("ucp_context_query", status);
  worker->requestSize_ = attributes.request_size;
  ucp_worker_params_t workerParams{};
  workerParams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  workerParams.thread_mode = UCS_THREAD_MODE_SINGLE;
  status = api().workerCreate(worker->context_, &workerParams, &worker->worker_);
  if (status != UCS_OK) {
    worker->worker_ = nullptr;
    failStep("ucp_worker_create", status);
  }
  status = api().workerGetEfd(worker->worker_, &worker->eventFd_);
  if (status != UCS_OK) failStep("ucp_worker_get_efd", status);
  ucp_address_t* address = nullptr;
  size_t length = 0;
  status = api().workerGetAddress(worker->worker_, &address, &length);
  if (status != UCS_OK) failStep("ucp_worker_get_address", status);
  const auto* bytes = reinterpret_cast<const std::byte*>(address);
  worker->address_.assign(bytes, bytes + length);
  api().workerReleaseAddress(worker->worker_, address);
  return worker;
}

Worker::~Worker() {
  if (worker_) api().workerDestroy(worker_);
  if (context_) api().cleanup(context_);
}

bool Worker::sleep(Clock::time_point until, ucs_status_t* status) {
  const ucs_status_t armed = arm(worker_, until);
  if (armed == UCS_INPROGRESS) return true;
  if (armed != UCS_OK) {
    *status = armed;
    return false;
  }
  const auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(until - Clock::now());
  if (wait.count() <= 0) return true;
  timespec timeout{static_cast<time_t>(wait.count() / 1000000000),
                   static_cast<long>(wait.count() % 1000000000)};
  pollfd ready{eventFd_, POLLIN, 0};
  ::ppoll(&ready, 1, &timeout, nullptr);
  return true;
}

ucs_status_t arm(ucp_worker_h worker, Clock::time_point until) {
  for (int busy = 1;; ++busy) {
    if (api().workerProgress(worker) != 0) return UCS_INPROGRESS;
    const ucs_status_t status = api().workerArm(worker);
    if (status != UCS_ERR_BUSY) return status;
    if (busy % 64 == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (Clock::now() >= until) return UCS_INPROGRESS;
    }
  }
}

}  // namespace braid::transport::ucx
