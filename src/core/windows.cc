// Windows: memory registered with a communicator. Device windows are mapped
// by every rank of one host, so that one-shot and two-shot plans read and
// write peers' buffers directly, and take stream-ordered one-sided puts
// (device_one_sided.h); host windows take one-sided puts (one_sided.h).
// Communicator::registerWindow and the one-sided calls.
#include <algorithm>

#include "core/arguments.h"
#include "core/communicator_impl.h"
#include "core/device_one_sided.h"
#include "core/errors.h"
#include "core/log.h"
#include "core/one_sided.h"

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

namespace {

// A completed Work, for calls that finish before they return.
Work finished() {
  auto state = std::make_shared<Work::State>();
  state->complete(nullptr);
  return Work(std::move(state));
}

}  // namespace

Window Communicator::registerWindow(void* buffer, size_t bytes) {
  Impl& impl = usable(impl_.get(), "registerWindow");
  const char* what = "registerWindow";
  std::string problem;
  const int holder = buffer && impl.device ? impl.device->deviceOf(buffer) : -1;
  if (!buffer)
    problem = "argument 'buffer' is NULL";
  else if (bytes == 0)
    problem = "argument 'bytes' is 0";
  else if (holder >= 0 && holder != impl.deviceIndex)
    problem = format(
        "argument 'buffer' is memory of device %d, not of this communicator's "
        "device %d",
        holder, impl.deviceIndex);
  impl.waitForAsyncIdle();
  agreeOnArguments(impl, what, problem);
  // Every rank registers the same kind of memory.
  std::vector<uint8_t> kinds(static_cast<size_t>(impl.nranks));
  kinds[static_cast<size_t>(impl.rank)] = holder >= 0;
  impl.bootstrap->allGather(kinds.data(), 1, deadlineAfter(impl.timeout()));
  for (int r = 1; r < impl.nranks; ++r)
    if (kinds[static_cast<size_t>(r)] != kinds[0])
      fail(ErrorCode::InvalidArgument, impl.rank,
           format("%s: argument 'buffer' is %s memory on rank 0 but %s memory on rank %d: every "
                  "rank registers the same kind",
                  what, kinds[0] ? "device" : "host", kinds[0] ? "host" : "device", r));
  const bool onDevice = holder >= 0;
  try {
    if (!onDevice) {
      if (!impl.oneSided) impl.oneSided = std::make_unique<OneSided>(impl);
      const uint64_t id = impl.nextWindow++;
      impl.oneSided->addWindow(id, static_cast<std::byte*>(buffer), bytes);
      return Window{id};
    }
    if (!impl.deviceExecutor)
      throw Error(ErrorCode::InvalidUsage,
                  format("device buffers cannot be used: %s", impl.noDevice.c_str()));
    const transport::Setup setup = impl.deviceSetup();
    // Peers that do not map the window put into it through the host
    // windows' sockets, as soon as their registration returns.
    if (!impl.oneSided) impl.oneSided = std::make_unique<OneSided>(impl);
    const uint64_t id = impl.nextWindow;
    impl.oneSided->addDeviceWindow(id, static_cast<std::byte*>(buffer), bytes);
    std::vector<transport::PeerWindow> ranks;
    try {
      ranks = transport::mapWindow(setup, impl.wiring, buffer, bytes);
      if (!impl.deviceSignals) {
        try {
          impl.deviceSignals = std::make_unique<DeviceSignals>(impl, *impl.oneSided);
        } catch (...) {
          transport::unmapWindow(*impl.device, ranks, bytes);
          throw;
        }
      }
    } catch (...) {
      impl.oneSided->forgetWindow(id);
      throw;
    }
    ++impl.nextWindow;
    impl.windows.emplace_back(id, static_cast<std::byte*>(buffer), bytes, std::move(ranks),
                              *impl.device);
    return Window{id};
  } catch (const Error& error) {
    // Every rank throws alike; an argument error leaves the communicator as it was.
    if (error.code() == ErrorCode::Timeout || error.code() == ErrorCode::RemoteError)
      impl.recordFailure(error);
    const std::string message = error.what();
    if (message.rfind("braid rank", 0) == 0) throw;
    throw Error(error.code(), format("braid rank %d: %s: %s", impl.rank, what, message.c_str()));
  }
}

void Communicator::deregisterWindow(Window window) {
  Impl& impl = usable(impl_.get(), "deregisterWindow");
  auto found = std::find_if(impl.windows.begin(), impl.windows.end(),
                            [&](const RegisteredWindow& w) { return w.id() == window.id; });
  const bool device = found != impl.windows.end();
  // Host windows, and device windows' part that staged peers put into.
  const bool staged = impl.oneSided && impl.oneSided->hasWindow(window.id);
  // Every op that may reach into a window runs before the peers unmap it;
  // the agreement after it is also the barrier behind every rank's ops.
  impl.waitForAsyncIdle();
  if (impl.deviceExecutor) impl.deviceExecutor->waitIdle();
  agreeOnArguments(impl, "deregisterWindow",
                   device || staged
                       ? ""
                       : format("window %llu was not registered with this communicator (or was "
                                "deregistered already)",
                                static_cast<unsigned long long>(window.id)));
  try {
    if (staged) impl.oneSided->removeWindow(window.id);
  } catch (const Error& error) {
    impl.recordFailure(error);
    if (device) impl.windows.erase(found);
    throw;
  }
  if (device) impl.windows.erase(found);
}

void* Communicator::peerPointer(Window window, size_t offset, int peer) {
  Impl& impl = usable(impl_.get(), "peerPointer");
  if (peer < 0 || peer >= impl.nranks)
    fail(ErrorCode::InvalidArgument, impl.rank,
         format("peerPointer: argument 'peer' is %d: ranks are 0 to %d", peer, impl.nranks - 1));
  for (const RegisteredWindow& w : impl.windows) {
    if (w.id() != window.id) continue;
    if (offset >= w.bytes())
      fail(ErrorCode::InvalidArgument, impl.rank,
           format("peerPointer: argument 'offset' is %zu: the window has %zu bytes", offset,
                  w.bytes()));
    return w.at(peer, w.base() + offset, 1);
  }
  if (impl.oneSided && impl.oneSided->hasWindow(window.id)) return nullptr;  // a host window
  fail(ErrorCode::InvalidArgument, impl.rank,
       format("peerPointer: argument 'window' (%llu) was not registered with this communicator",
              static_cast<unsigned long long>(window.id)));
}

namespace {

// Where one-sided calls may run: on a communicator with host windows,
// outside groups, after this rank's earlier ops.
OneSided& oneSidedFor(Communicator::Impl& impl, const char* op) {
  if (!impl.oneSided)
    fail(ErrorCode::InvalidUsage, impl.rank,
         format("%s: one-sided calls need a host window registered first (registerWindow)", op));
  if (impl.groupDepth > 0)
    fail(ErrorCode::InvalidUsage, impl.rank,
         format("%s: one-sided calls cannot be part of a group (call it before groupStart() or "
                "after groupEnd())",
                op));
  impl.waitForAsyncIdle();
  impl.throwIfFailed();
  return *impl.oneSided;
}

const RegisteredWindow* deviceWindow(const Communicator::Impl& impl, Window window) {
  for (const RegisteredWindow& w : impl.windows)
    if (w.id() == window.id) return &w;
  return nullptr;
}

// Where one-sided calls on device windows run: on a device stream that is
// not being captured, outside groups, after this rank's earlier ops. The
// peers are checked already.
DeviceSignals& deviceSignalsFor(Communicator::Impl& impl, const char* op, const Stream& stream) {
  if (!impl.deviceSignals)
    fail(ErrorCode::InvalidUsage, impl.rank,
         format("%s: one-sided calls on a device stream need a device window registered first "
                "(registerWindow)",
                op));
  if (impl.groupDepth > 0)
    fail(ErrorCode::InvalidUsage, impl.rank,
         format("%s: one-sided calls cannot be part of a group (call it before groupStart() or "
                "after groupEnd())",
                op));
  if (impl.device->capturing(stream.deviceStream()))
    fail(ErrorCode::InvalidUsage, impl.rank,
         format("%s: one-sided calls on device windows cannot be captured into a CUDA graph "
                "(the stream is being captured)",
                op));
  impl.waitForAsyncIdle();
  impl.throwIfFailed();
  return *impl.deviceSignals;
}

// A device one-sided call's peer maps this rank's board, or has a socket
// for one-sided calls with it.
void checkDevicePeer(const Communicator::Impl& impl, const ArgumentCheck& check, const char* name,
                     int peer) {
  if (impl.deviceSignals && !impl.deviceSignals->reaches(peer))
    check.reject(
        format("argument '%s' is %d, a rank that neither maps this rank's device "
               "windows nor has a socket for one-sided calls with it",
               name, peer));
}

void checkSignal(const ArgumentCheck& check, const char* name, int signal, bool noneAllowed) {
  if (signal < (noneAllowed ? -1 : 0) || signal >= kSignals)
    check.reject(format("argument '%s' is %d, not in [%d, %d)", name, signal, noneAllowed ? -1 : 0,
                        kSignals));
}

// Runs a one-sided call; a failure that is not an argument's is sticky.
template <typename Call>
Work runOneSided(Communicator::Impl& impl, int peer, Call call) {
  try {
    call();
  } catch (const Error& error) {
    if (error.code() != ErrorCode::InvalidArgument) impl.recordFailure(error, peer);
    throw;
  }
  return finished();
}

}  // namespace

Work Communicator::put(const void* source, size_t count, DataType type, int peer, Window window,
                       size_t offset, int signal, Stream stream) {
  Impl& impl = usable(impl_.get(), "put");
  ArgumentCheck check(impl, "put");
  check.type(type);
  check.size("count", count, type);
  check.rank("peer", peer);
  check.buffer("source", source, count);
  checkSignal(check, "signal", signal, true);
  const RegisteredWindow* onDevice = deviceWindow(impl, window);
  if (!onDevice && (!impl.oneSided || !impl.oneSided->hasWindow(window.id)))
    check.reject(format("argument 'window' (%llu) is not a window of this communicator",
                        static_cast<unsigned long long>(window.id)));
  const size_t bytes = count * dataTypeSize(type);
  const size_t part = onDevice ? onDevice->bytes() : impl.oneSided->windowBytes(window.id, peer);
  if (offset > part || bytes > part - offset)
    check.reject(
        format("argument 'offset' (%zu) and %zu bytes pass the end of rank %d's part of "
               "the window (%zu bytes)",
               offset, bytes, peer, part));
  if (onDevice) {
    if (!stream.isDevice())
      check.reject(
          format("argument 'stream': window %llu is device memory, whose puts are "
                 "stream-ordered: pass a device stream (Stream::cuda)",
                 static_cast<unsigned long long>(window.id)));
    checkDevicePeer(impl, check, "peer", peer);
    std::byte* target = onDevice->at(peer, onDevice->base() + offset, bytes);  // null: staged
    // A pair's calls take one path, so that they land in issue order.
    if (!target && impl.deviceSignals && impl.deviceSignals->mapped(peer))
      check.reject(
          format("argument 'window': rank %d maps this rank's device memory, but not "
                 "window %llu (not memory from braid's allocator, ncclMemAlloc)",
                 peer, static_cast<unsigned long long>(window.id)));
    DeviceSignals& signals = deviceSignalsFor(impl, "put", stream);
    return signals.put(source, target, bytes, peer, window.id, offset, signal,
                       stream.deviceStream());
  }
  // Host windows: the call runs in this thread, whatever the stream.
  OneSided& oneSided = oneSidedFor(impl, "put");
  return runOneSided(impl, peer,
                     [&] { oneSided.put(source, bytes, peer, window.id, offset, signal); });
}

Work Communicator::signal(int peer, int signal, Stream stream) {
  Impl& impl = usable(impl_.get(), "signal");
  ArgumentCheck check(impl, "signal");
  check.rank("peer", peer);
  checkSignal(check, "signal", signal, false);
  if (stream.isDevice()) {
    checkDevicePeer(impl, check, "peer", peer);
    return deviceSignalsFor(impl, "signal", stream).signal(peer, signal, stream.deviceStream());
  }
  OneSided& oneSided = oneSidedFor(impl, "signal");
  return runOneSided(impl, peer, [&] { oneSided.signal(peer, signal); });
}

Work Communicator::waitSignals(const SignalWait* waits, size_t count, Stream stream) {
  Impl& impl = usable(impl_.get(), "waitSignals");
  ArgumentCheck check(impl, "waitSignals");
  if (!waits && count > 0) check.reject(format("argument 'waits' is null but count is %zu", count));
  for (size_t i = 0; i < count; ++i) {
    const SignalWait& wait = waits[i];
    if (wait.peer < 0 || wait.peer >= impl.nranks)
      check.reject(format("waits[%zu].peer is %d, not a rank of this %d-rank communicator", i,
                          wait.peer, impl.nranks));
    if (wait.signal < 0 || wait.signal >= kSignals)
      check.reject(format("waits[%zu].signal is %d, not in [0, %d)", i, wait.signal, kSignals));
    for (size_t j = 0; j < i; ++j)
      if (waits[j].peer == wait.peer && waits[j].signal == wait.signal)
        check.reject(format("waits[%zu] and waits[%zu] both wait for signal %d of rank %d", j, i,
                            wait.signal, wait.peer));
  }
  if (count == 0) return finished();
  if (stream.isDevice()) {
    for (size_t i = 0; i < count; ++i) {
      checkDevicePeer(impl, check, format("waits[%zu].peer", i).c_str(), waits[i].peer);
      if (waits[i].count > (uint64_t{1} << 31))  // device counters compare cyclically
        check.reject(
            format("waits[%zu].count is %llu: a wait on a device stream counts at most "
                   "2^31 raises",
                   i, static_cast<unsigned long long>(waits[i].count)));
    }
    return deviceSignalsFor(impl, "waitSignals", stream).wait(waits, count, stream.deviceStream());
  }
  OneSided& oneSided = oneSidedFor(impl, "waitSignals");
  return runOneSided(impl, -1, [&] { oneSided.wait(waits, count, deadlineAfter(impl.timeout())); });
}

}  // namespace braid
