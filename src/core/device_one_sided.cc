#include "core/device_one_sided.h"

#include "core/communicator_impl.h"
#include "core/errors.h"
#include "core/log.h"

namespace braid {

DeviceSignals::DeviceSignals(Communicator::Impl& impl)
    : impl_(impl),
      bytes_(static_cast<size_t>(impl.nranks) * kSignals * sizeof(uint32_t)),
      raised_(static_cast<size_t>(impl.nranks) * kSignals),
      consumed_(static_cast<size_t>(impl.nranks) * kSignals) {
  device::Device& device = *impl.device;
  board_ = static_cast<std::byte*>(device.allocate(impl.deviceIndex, bytes_));
  try {
    const std::vector<uint32_t> zeros(raised_.size());
    device.copyNow(board_, zeros.data(), bytes_);
    const transport::Setup setup{*impl.bootstrap,
                                 impl.knobs,
                                 impl.knobs.deviceSlotBytes,
                                 impl.knobs.deviceSlots,
                                 deadlineAfter(impl.timeout()),
                                 impl.device,
                                 impl.deviceIndex};
    boards_ = transport::mapWindow(setup, impl.wiring, board_, bytes_);
  } catch (...) {
    device.free(board_);
    throw;
  }
}

DeviceSignals::~DeviceSignals() {
  try {
    transport::unmapWindow(*impl_.device, boards_, bytes_);
    impl_.device->free(board_);
  } catch (const Error& error) {  // a broken device: nothing more to do about it
    BRAID_WARN(Exec, "freeing the device signal board failed: %s", error.what());
  }
}

bool DeviceSignals::reaches(int peer) const {
  return boards_[static_cast<size_t>(peer)].base != nullptr;
}

uint32_t* DeviceSignals::slot(int owner, int source, int signal) const {
  auto* counters = reinterpret_cast<uint32_t*>(boards_[static_cast<size_t>(owner)].base);
  return counters + static_cast<size_t>(source) * kSignals + signal;
}

Work DeviceSignals::enqueue(const char* name, int peer, size_t count, const void* source,
                            void* target, size_t bytes, const std::vector<device::FlagOp>& flags,
                            std::vector<exec::DeviceExecutor::BoardWait> waits, void* stream) {
  exec::OpInfo info;
  info.name = name;
  info.seq = seq_++;
  info.count = count;
  info.peer = peer;
  auto state = std::make_shared<Work::State>();
  impl_.deviceExecutor->enqueueOneSided(info, stream, target, source, bytes, flags,
                                        std::move(waits),
                                        [state](const Error* error) { state->complete(error); });
  return Work(std::move(state));
}

Work DeviceSignals::put(const void* source, std::byte* target, size_t bytes, int peer, int signal,
                        void* stream) {
  std::vector<device::FlagOp> flags;
  if (signal >= 0) {
    uint32_t& raised = raised_[static_cast<size_t>(peer) * kSignals + signal];
    flags.push_back(device::FlagOp::write(slot(peer, impl_.rank, signal), ++raised));
  }
  return enqueue("put", peer, bytes, source, target, bytes, flags, {}, stream);
}

Work DeviceSignals::signal(int peer, int signal, void* stream) {
  uint32_t& raised = raised_[static_cast<size_t>(peer) * kSignals + signal];
  const std::vector<device::FlagOp> flags{
      device::FlagOp::write(slot(peer, impl_.rank, signal), ++raised)};
  return enqueue("signal", peer, 1, nullptr, nullptr, 0, flags, {}, stream);
}

Work DeviceSignals::wait(const SignalWait* waits, size_t count, void* stream) {
  std::vector<exec::DeviceExecutor::BoardWait> boardWaits;
  size_t raises = 0;
  for (size_t i = 0; i < count; ++i) {
    const SignalWait& w = waits[i];
    uint32_t& consumed = consumed_[static_cast<size_t>(w.peer) * kSignals + w.signal];
    consumed += static_cast<uint32_t>(w.count);
    raises += w.count;
    boardWaits.push_back({slot(impl_.rank, w.peer, w.signal), consumed, w.peer, w.signal});
  }
  return enqueue("waitSignals", count == 1 ? waits[0].peer : -1, raises, nullptr, nullptr, 0, {},
                 std::move(boardWaits), stream);
}

}  // namespace braid
