// Windows: device memory registered with a communicator, which every rank
// of one host maps, so that one-shot and two-shot plans read and write
// peers' buffers directly (Communicator::registerWindow).
#include <algorithm>

#include "core/arguments.h"
#include "core/communicator_impl.h"
#include "core/errors.h"
#include "core/log.h"

namespace braid {

RegisteredWindow& RegisteredWindow::operator=(RegisteredWindow&& other) noexcept {
  if (this != &other) {
    std::swap(id_, other.id_);
    std::swap(base_, other.base_);
    std::swap(bytes_, other.bytes_);
    std::swap(ranks_, other.ranks_);
    std::swap(device_, other.device_);
  }
  return *this;
}

RegisteredWindow::~RegisteredWindow() {
  if (!device_) return;
  try {
    transport::unmapWindow(*device_, ranks_, bytes_);
  } catch (const Error& error) {  // a broken device: nothing more to do about it
    BRAID_WARN(Exec, "unmapping window %llu failed: %s", static_cast<unsigned long long>(id_),
               error.what());
  }
}

std::byte* RegisteredWindow::at(int r, const void* pointer, size_t bytes) const {
  const auto* p = static_cast<const std::byte*>(pointer);
  if (p < base_ || p > base_ + bytes_ || bytes > static_cast<size_t>(base_ + bytes_ - p))
    return nullptr;
  std::byte* theirs = ranks_[static_cast<size_t>(r)].base;
  return theirs ? theirs + (p - base_) : nullptr;
}

bool RegisteredWindow::reachesEveryRank() const {
  return std::all_of(ranks_.begin(), ranks_.end(),
                     [](const transport::PeerWindow& w) { return w.base != nullptr; });
}

void Communicator::Impl::mapBuffers(PendingOp& op) const {
  // Only these collectives have direct plans.
  if (windows.empty() || nranks > algo::kMaxDirectRanks ||
      (op.kind != Collective::AllReduce && op.kind != Collective::AllGather &&
       op.kind != Collective::Broadcast))
    return;
  const size_t bytes = op.shape.count * dataTypeSize(op.info.type);
  if (bytes == 0) return;
  // The buffers the direct plans reach into: every rank's input and
  // output for all-reduce, the output for all-gather and broadcast.
  const bool inputs = op.kind == Collective::AllReduce;
  const size_t outBytes = op.kind == Collective::AllGather ? bytes * nranks : bytes;
  auto windowOf = [&](const void* pointer, size_t length) -> const RegisteredWindow* {
    for (const RegisteredWindow& w : windows)
      if (w.reachesEveryRank() && w.at(rank, pointer, length)) return &w;
    return nullptr;
  };
  const RegisteredWindow* in = inputs ? windowOf(op.input, bytes) : nullptr;
  const RegisteredWindow* out = windowOf(op.output, outBytes);
  if (!out || (inputs && !in)) return;
  op.shape.mapped = true;
  op.peerOutputs.resize(static_cast<size_t>(nranks));
  if (inputs) op.peerInputs.resize(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    op.peerOutputs[r] = out->at(r, op.output, outBytes);
    if (inputs) op.peerInputs[r] = in->at(r, op.input, bytes);
  }
}

Window Communicator::registerWindow(void* buffer, size_t bytes) {
  Impl& impl = usable(impl_.get(), "registerWindow");
  const char* what = "registerWindow";
  // (Every rank or none has a device: these fail alike everywhere.)
  if (!impl.device)
    throw Error(ErrorCode::InvalidUsage, format("braid rank %d: %s: %s", impl.rank, what,
                                                device::unavailableReason().c_str()));
  if (!impl.deviceExecutor)
    throw Error(ErrorCode::InvalidUsage,
                format("braid rank %d: %s: device buffers cannot be used: %s", impl.rank, what,
                       impl.noDevice.c_str()));
  std::string problem;
  const int holder = buffer ? impl.device->deviceOf(buffer) : -1;
  if (!buffer)
    problem = "argument 'buffer' is NULL";
  else if (bytes == 0)
    problem = "argument 'bytes' is 0";
  else if (holder != impl.deviceIndex)
    problem = format("argument 'buffer' is %s, not memory of this communicator's device %d",
                     holder < 0 ? "host memory" : format("memory of device %d", holder).c_str(),
                     impl.deviceIndex);
  impl.waitForAsyncIdle();
  agreeOnArguments(impl, what, problem);
  const transport::Setup setup{*impl.bootstrap,
                               impl.knobs,
                               impl.knobs.deviceSlotBytes,
                               impl.knobs.deviceSlots,
                               deadlineAfter(impl.timeout()),
                               impl.device,
                               impl.deviceIndex};
  std::vector<transport::PeerWindow> ranks;
  try {
    ranks = transport::mapWindow(setup, impl.wiring, buffer, bytes);
  } catch (const Error& error) {
    // Every rank throws alike; an argument error leaves the communicator as it was.
    if (error.code() == ErrorCode::Timeout) impl.recordFailure(error);
    throw Error(error.code(), format("braid rank %d: %s: %s", impl.rank, what, error.what()));
  }
  const uint64_t id = impl.nextWindow++;
  impl.windows.emplace_back(id, static_cast<std::byte*>(buffer), bytes, std::move(ranks),
                            *impl.device);
  return Window{id};
}

void Communicator::deregisterWindow(Window window) {
  Impl& impl = usable(impl_.get(), "deregisterWindow");
  auto found = std::find_if(impl.windows.begin(), impl.windows.end(),
                            [&](const RegisteredWindow& w) { return w.id() == window.id; });
  // Every op that may reach into a window runs before the peers unmap it;
  // the agreement after it is also the barrier behind every rank's ops.
  impl.waitForAsyncIdle();
  if (impl.deviceExecutor) impl.deviceExecutor->waitIdle();
  agreeOnArguments(impl, "deregisterWindow",
                   found != impl.windows.end()
                       ? ""
                       : format("window %llu was not registered with this communicator (or was "
                                "deregistered already)",
                                static_cast<unsigned long long>(window.id)));
  impl.windows.erase(found);
}

}  // namespace braid
