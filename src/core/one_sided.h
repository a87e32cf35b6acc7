// One-sided communication on host windows (Communicator::put, signal and
// waitSignals; NCCL's ncclPutSignal, ncclSignal and ncclWaitSignal).
//
// Each rank keeps a signal board: a counter per (source rank, signal) in
// memory its same-host peers map, plus a bell word to sleep on. A put
// writes the bytes into the peer's window, then adds one to the board's
// counter for (this rank, signal); waitSignals waits until each counter it
// names has grown by the count asked, and consumes that much.
//
// How a put reaches each peer, chosen once per communicator:
//   - Local: the peer lives in this process (initAll), or is this rank:
//     memcpy into its window, an atomic add on its board.
//   - Near: the peer is on this host and its host buffers take a same-host
//     transport (shm): its board is mapped here (pidfd_getfd of its memfd),
//     and so is a window in braid::memAlloc memory; other memory is written
//     with process_vm_writev. One copy; no word from the peer.
//   - Staged: every other peer (another host, or a pair that BRAID_TRANSPORT
//     puts on tcp, ucx or ibverbs): a socket per pair, opened through the
//     bootstrap listeners. The sender writes [frame | bytes]; a thread of the
//     receiver reads the bytes straight into the window and raises the
//     signal. The thread drains every socket at all times, so a sender never
//     waits on what the receiving rank's user thread is doing.
// Per pair, puts and signals land in the order they were issued.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "bootstrap/socket.h"
#include "braid/communicator.h"

namespace braid {

class OneSided {
 public:
  // Collective: maps the same-host peers' boards and opens the staged
  // pairs' sockets. Throws as a communicator's set-up does.
  explicit OneSided(Communicator::Impl& impl);
  ~OneSided();
  OneSided(const OneSided&) = delete;
  OneSided& operator=(const OneSided&) = delete;

  // Collective: every rank's window `id` of `bytes` at `base` (host
  // memory), mapped from the peers that can map it.
  void addWindow(uint64_t id, std::byte* base, size_t bytes);
  // Collective: once every put into window `id` issued anywhere before the
  // call has landed, forgets it.
  void removeWindow(uint64_t id);
  bool hasWindow(uint64_t id) const;

  // Device windows (device_one_sided.h) take puts from staged peers here:
  // this rank's part of window `id` (device memory) receives their bytes
  // (copied in by the thread that reads them), and `raise(source, signal)`
  // raises their signals on the device. Not collective; removeWindow()
  // forgets it as it does a host window.
  void addDeviceWindow(uint64_t id, std::byte* base, size_t bytes);
  // Not collective: forgets window `id` whose registration failed everywhere.
  void forgetWindow(uint64_t id);
  // Where staged peers' device signals are raised; null stops raising them.
  void setDeviceRaise(std::function<void(int source, int signal)> raise);
  // Whether `peer` is reached through a socket (and so can take device puts
  // that way).
  bool staged(int peer) const { return links_[static_cast<size_t>(peer)] != nullptr; }
  // True once `peer`'s socket was read to its end (null: not staged).
  const std::atomic<bool>* linkClosed(int peer) const;
  // A staged put into `peer`'s part of device window `window`: `bytes` of
  // device memory at `source`, copied out piece by piece and sent; then
  // `signal` (-1: none) raised on the peer's device board. signalOnDevice()
  // raises one alone. Per pair, in order with every staged call.
  // REQUIRES: staged(peer), arguments checked.
  void putFromDevice(const void* source, size_t bytes, int peer, uint64_t window, size_t offset,
                     int signal);
  void signalOnDevice(int peer, int signal);
  // The size of `peer`'s part of window `id`. REQUIRES: hasWindow(id).
  size_t windowBytes(uint64_t id, int peer) const;

  // REQUIRES: arguments checked (a window of this communicator, the bytes
  // inside the peer's part, a signal in [0, kSignals) or -1 for none).
  void put(const void* source, size_t bytes, int peer, uint64_t window, size_t offset, int signal);
  void signal(int peer, int signal);
  // Waits until every wait's counter grew by its count since the counts
  // consumed before, then consumes them. Throws Timeout (naming the first
  // wait not met) past `deadline`; RemoteError when a staged peer it waits
  // for closed its socket; the communicator's failure when it failed.
  void wait(const SignalWait* waits, size_t count, net::Deadline deadline);

 private:
  enum class Reach : uint8_t { Local, Near, Staged };
  struct Board;
  struct Window;
  struct Link;

  std::atomic<uint64_t>& counter(Board& board, int source, int signal) const;
  void raise(int peer, int signal);
  void send(int peer, uint32_t kind, uint32_t signal, uint64_t window, uint64_t offset,
            const void* bytes, size_t length);
  void serveLinks();
  void readFrame(int peer);
  // A staged put into a device window: its bytes into the window through
  // a staging buffer, then its signal (windowsMutex_ held).
  void landOnDevice(Link& link, const Window& window, uint64_t offset, uint64_t bytes,
                    net::Deadline deadline, const std::string& who);
  void ring(Board& board);

  Communicator::Impl& impl_;
  const int rank_;
  const int nranks_;
  std::vector<Reach> reach_;
  std::vector<int> pids_;
  std::shared_ptr<Board> own_;
  std::vector<std::shared_ptr<Board>> boards_;  // each rank's, as this rank reaches it
  std::vector<uint64_t> consumed_;              // per (source, signal): counts waited for

  std::map<uint64_t, std::unique_ptr<Window>> windows_;
  std::function<void(int, int)> deviceRaise_;
  std::vector<std::byte> landing_;   // the link thread's staging for device windows
  mutable std::mutex windowsMutex_;  // guards windows_ and deviceRaise_ against the link thread

  std::vector<std::unique_ptr<Link>> links_;  // by rank; null but for staged peers
  uint64_t removals_ = 0;                     // removeWindow() calls
  std::mutex fenceMutex_;                     // guards each link's fences and closed flag
  std::condition_variable fenced_;
  int stopFd_ = -1;
  std::thread server_;
};

}  // namespace braid
