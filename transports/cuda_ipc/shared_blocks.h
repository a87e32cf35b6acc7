// The cuda_ipc transport's path between ranks of one process (several GPUs
// driven by one process, Communicator::initAll, ncclCommInitAll), which
// braid-info and the logs call nvlink_p2p.
//
// Ranks that share an address space need no IPC to reach each other's FIFO
// blocks: a rank's block for a peer is a pointer the peer's kernels use as
// it is. The block is device memory when the two devices are the same or
// have peer access (the device seam opens braid's allocations to every
// device with peer access: cuMemSetAccess, so loads and stores go over
// NVLink or PCIe), and page-locked host memory that both reach when they
// do not.
//
// Blocks pass between ranks through a process-wide table, keyed by the job
// (its secret) and the two ranks, and are owned jointly: a block is freed
// when both its owner's and its user's connections let go of it, so
// neither rank can pull memory from under the other's streams, whatever
// order their communicators are destroyed in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "device/device.h"

namespace braid::transport::cuda_ipc {

// The same for every rank of this process, and different in every other
// process (also in another PID namespace): two ranks on one host share an
// address space exactly when their tokens are equal.
uint64_t processToken();

// A FIFO block of device (or staging host) memory from device.allocate()
// or allocateHost(). Freed with the last reference, unless leaked.
class Block {
 public:
  Block(device::Device& device, std::byte* base, bool host)
      : device_(device), base_(base), host_(host) {}
  ~Block();
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  std::byte* base() const { return base_; }
  bool host() const { return host_; }  // staging memory in host memory
  // The device broke and streams may still use the memory: it stays
  // allocated when the last reference goes.
  void leak() { base_ = nullptr; }

 private:
  device::Device& device_;
  std::byte* base_;
  const bool host_;
};

using BlockRef = std::shared_ptr<Block>;

// Hands `block` (owner's memory, which `user` writes into) to `user`.
// Throws Error(InvalidUsage) when the job already handed one from `owner`
// to `user` (the same UniqueId joined twice in this process).
void publish(uint64_t job, int owner, int user, BlockRef block);

// The block `owner` published for `user` (this rank), removed from the
// table. Throws Error(Internal) when there is none: the caller publishes
// before the agreement that precedes every take().
BlockRef take(uint64_t job, int owner, int user);

// Drops whatever `owner` published for `user` and nobody took (set-up
// failed half way).
void withdraw(uint64_t job, int owner, int user);

}  // namespace braid::transport::cuda_ipc
