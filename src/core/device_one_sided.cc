#include "core/device_one_sided.h"

#include <optional>

#include "core/communicator_impl.h"
#include "core/errors.h"
#include "core/log.h"
#include "core/one_sided.h"

namespace braid {
namespace {

// How long the proxy sleeps between looks at a stream it waits to reach a
// staged call, at first (a network send takes longer), and at most (the
// stream may be held by a wait for long).
constexpr auto kProxyTurn = std::chrono::microseconds(20);
constexpr auto kLongestProxyTurn = std::chrono::microseconds(1000);

}  // namespace

DeviceSignals::DeviceSignals(Communicator::Impl& impl, OneSided& staged)
    : impl_(impl),
      staged_(staged),
      // The counters.
      bytes_(static_cast<size_t>(impl.nranks) * kSignals * sizeof(uint32_t)),
      raised_(static_cast<size_t>(impl.nranks) * kSignals),
      consumed_(static_cast<size_t>(impl.nranks) * kSignals),
      stagedRaised_(static_cast<size_t>(impl.nranks) * kSignals) {
  device::Device& device = *impl.device;
  // Every rank's board is made, or none is kept: a rank that cannot make
  // its own says so before any rank maps one.
  std::optional<Error> failed;
  try {
    board_ = static_cast<std::byte*>(device.allocate(impl.deviceIndex, bytes_));
    const std::vector<uint32_t> zeros(bytes_ / sizeof(uint32_t));
    device.copyNow(board_, zeros.data(), bytes_);
    // What the host writes and a stream waits on, the counters of staged
    // sources' raises and the proxy's flag, is in host memory, so that a
    // write is a store. A write into device memory would be queued on a
    // stream, and the device may run that stream's work behind streams
    // blocked in waits (they share its hardware queues), the very wait the
    // write is to release among them.
    host_ = static_cast<uint32_t*>(device.allocateHost(bytes_ + sizeof(uint32_t)));
  } catch (const Error& error) {
    failed = error;
  }
  std::vector<uint8_t> made(static_cast<size_t>(impl.nranks));
  made[static_cast<size_t>(impl.rank)] = !failed;
  try {
    impl.bootstrap->allGather(made.data(), 1, deadlineAfter(impl.timeout()));
  } catch (...) {
    freeBoard();
    throw;
  }
  for (int r = 0; r < impl.nranks; ++r) {
    if (made[static_cast<size_t>(r)]) continue;
    freeBoard();
    if (r == impl.rank) throw *failed;
    throw Error(ErrorCode::SystemError,
                format("rank %d could not make its device signal board", r));
  }
  // Staged peers may raise signals as soon as they return from the mapping
  // below, before it returns here.
  staged_.setDeviceRaise([this](int source, int signal) { raiseStaged(source, signal); });
  try {
    boards_ = transport::mapWindow(impl.deviceSetup(), impl.wiring, board_, bytes_);
  } catch (...) {
    staged_.setDeviceRaise(nullptr);
    freeBoard();
    throw;
  }
}

void DeviceSignals::freeBoard() {
  if (board_) impl_.device->free(board_);
  if (host_) impl_.device->free(host_);
  board_ = nullptr;
  host_ = nullptr;
}

DeviceSignals::~DeviceSignals() {
  staged_.setDeviceRaise(nullptr);
  stopProxy();
  try {
    for (device::EventHandle event : freeEvents_) impl_.device->destroyEvent(event);
    transport::unmapWindow(*impl_.device, boards_, bytes_);
    freeBoard();
  } catch (const Error& error) {  // a broken device: nothing more to do about it
    BRAID_WARN(Exec, "freeing the device signal board failed: %s", error.what());
  }
}

void DeviceSignals::stopProxy() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (proxy_.joinable()) proxy_.join();
}

bool DeviceSignals::reaches(int peer) const {
  return boards_[static_cast<size_t>(peer)].base != nullptr || staged_.staged(peer);
}

uint32_t* DeviceSignals::slot(int owner, int source, int signal) const {
  auto* counters = reinterpret_cast<uint32_t*>(boards_[static_cast<size_t>(owner)].base);
  return counters + static_cast<size_t>(source) * kSignals + signal;
}

uint32_t* DeviceSignals::stagedSlot(int source, int signal) const {
  return host_ + static_cast<size_t>(source) * kSignals + signal;
}

uint32_t* DeviceSignals::sentFlag() const {
  return host_ + static_cast<size_t>(impl_.nranks) * kSignals;
}

Work DeviceSignals::enqueue(const char* name, int peer, size_t count, const void* source,
                            void* target, size_t bytes, const std::vector<device::FlagOp>& flags,
                            std::vector<exec::DeviceExecutor::BoardWait> waits, void* stream,
                            device::EventHandle reached) {
  exec::OpInfo info;
  info.name = name;
  info.seq = seq_++;
  info.count = count;
  info.peer = peer;
  auto state = std::make_shared<Work::State>();
  impl_.deviceExecutor->enqueueOneSided(
      info, stream, target, source, bytes, flags, std::move(waits),
      [state](const Error* error) { state->complete(error); }, reached);
  return Work(std::move(state));
}

Work DeviceSignals::put(const void* source, std::byte* target, size_t bytes, int peer,
                        uint64_t window, size_t offset, int signal, void* stream) {
  if (!target)
    return stage({nullptr, source, bytes, peer, window, offset, signal, false, 0}, stream);
  std::vector<device::FlagOp> flags;
  uint32_t* raised =
      signal >= 0 ? &raised_[static_cast<size_t>(peer) * kSignals + signal] : nullptr;
  if (raised) flags.push_back(device::FlagOp::write(slot(peer, impl_.rank, signal), *raised + 1));
  Work work = enqueue("put", peer, bytes, source, target, bytes, flags, {}, stream);
  if (raised) ++*raised;  // (counted once enqueued: a refused call counts nothing)
  return work;
}

Work DeviceSignals::signal(int peer, int signal, void* stream) {
  if (!boards_[static_cast<size_t>(peer)].base)
    return stage({nullptr, nullptr, 0, peer, 0, 0, signal, true, 0}, stream);
  uint32_t& raised = raised_[static_cast<size_t>(peer) * kSignals + signal];
  const std::vector<device::FlagOp> flags{
      device::FlagOp::write(slot(peer, impl_.rank, signal), raised + 1)};
  Work work = enqueue("signal", peer, 1, nullptr, nullptr, 0, flags, {}, stream);
  ++raised;
  return work;
}

Work DeviceSignals::wait(const SignalWait* waits, size_t count, void* stream) {
  std::vector<exec::DeviceExecutor::BoardWait> boardWaits;
  size_t raises = 0;
  for (size_t i = 0; i < count; ++i) {
    const SignalWait& w = waits[i];
    const uint32_t consumed = consumed_[static_cast<size_t>(w.peer) * kSignals + w.signal];
    raises += w.count;
    // A staged source's raises come through its socket: it has left only
    // once that is read to its end.
    const bool mapped = boards_[static_cast<size_t>(w.peer)].base != nullptr;
    boardWaits.push_back(
        {mapped ? slot(impl_.rank, w.peer, w.signal) : stagedSlot(w.peer, w.signal),
         consumed + static_cast<uint32_t>(w.count), w.peer, w.signal,
         mapped ? nullptr : staged_.linkClosed(w.peer)});
  }
  Work work = enqueue("waitSignals", count == 1 ? waits[0].peer : -1, raises, nullptr, nullptr, 0,
                      {}, std::move(boardWaits), stream);
  for (size_t i = 0; i < count; ++i)
    consumed_[static_cast<size_t>(waits[i].peer) * kSignals + waits[i].signal] +=
        static_cast<uint32_t>(waits[i].count);
  return work;
}

Work DeviceSignals::stage(Staged call, void* stream) {
  device::Device& device = *impl_.device;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (freeEvents_.empty()) {
      call.reached = device.createEvent(impl_.deviceIndex);
    } else {
      call.reached = freeEvents_.back();
      freeEvents_.pop_back();
    }
    if (!proxy_.joinable()) proxy_ = std::thread([this] { proxy(); });
  }
  call.ticket = ++tickets_;
  Work work;
  try {
    // The stream goes on once the proxy has sent the call.
    work = enqueue(call.signalOnly ? "signal" : "put", call.peer, call.signalOnly ? 1 : call.bytes,
                   nullptr, nullptr, 0, {}, {{sentFlag(), call.ticket, call.peer, -1}}, stream,
                   call.reached);
  } catch (...) {
    --tickets_;
    std::lock_guard<std::mutex> lock(mutex_);
    freeEvents_.push_back(call.reached);
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(call);
  }
  changed_.notify_all();
  return work;
}

void DeviceSignals::proxy() {
  device::Device& device = *impl_.device;
  try {
    device.setCurrent(impl_.deviceIndex);
  } catch (const Error& error) {
    BRAID_WARN(Exec, "one-sided proxy: %s", error.what());
  }
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    const Staged call = queue_.front();
    const bool stopping = stopping_;
    lock.unlock();
    try {
      // Once the stream reached the call, its source is ready (the
      // executor's ops before it finished; a failed one was released). A
      // failed communicator sends nothing more: the ticket alone releases
      // the stream (no wait for a stream that may never get there once the
      // communicator is going).
      auto turn = kProxyTurn;
      while (!device.query(call.reached)) {
        if (stopping && impl_.failed.load(std::memory_order_acquire)) break;
        std::this_thread::sleep_for(turn);
        turn = std::min<std::chrono::microseconds>(turn * 2, kLongestProxyTurn);
      }
      if (!impl_.failed.load(std::memory_order_acquire)) {
        if (call.signalOnly)
          staged_.signalOnDevice(call.peer, call.signal);
        else
          staged_.putFromDevice(call.source, call.bytes, call.peer, call.window, call.offset,
                                call.signal);
      }
    } catch (const std::exception& error) {
      // The peer is to blame when the connection to it failed; else this rank.
      const auto* known = dynamic_cast<const Error*>(&error);
      const bool peers =
          known && (known->code() == ErrorCode::RemoteError || known->code() == ErrorCode::Timeout);
      impl_.deviceExecutor->failWith(Error(known ? known->code() : ErrorCode::Internal,
                                           format("braid rank %d: a one-sided call to rank %d: %s",
                                                  impl_.rank, call.peer, error.what())),
                                     peers ? call.peer : -1);
    }
    try {
      device.writeFlagNow(sentFlag(), call.ticket);
    } catch (const Error& error) {  // the watchdog finds the device broken, and releases
      BRAID_WARN(Exec, "one-sided proxy: %s", error.what());
    }
    lock.lock();
    queue_.pop_front();
    freeEvents_.push_back(call.reached);
  }
}

void DeviceSignals::raiseStaged(int source, int signal) {
  uint32_t& raised = stagedRaised_[static_cast<size_t>(source) * kSignals + signal];
  impl_.device->writeFlagNow(stagedSlot(source, signal), ++raised);
}

}  // namespace braid
