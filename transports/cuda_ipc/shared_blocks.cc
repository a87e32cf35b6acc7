#include "transports/cuda_ipc/shared_blocks.h"

#include <unistd.h>

#include <map>
#include <mutex>
#include <random>
#include <tuple>

#include "braid/error.h"
#include "core/errors.h"
#include "core/log.h"

namespace braid::transport::cuda_ipc {
namespace {

using Key = std::tuple<uint64_t, int, int>;  // job, owner, user

struct Table {
  std::mutex mutex;
  std::map<Key, BlockRef> blocks;
};

Table& table() {
  static Table* const kTable = new Table;  // (never destroyed: ranks may outlive statics)
  return *kTable;
}

}  // namespace

uint64_t processToken() {
  static const uint64_t kToken = [] {
    std::random_device random;
    const uint64_t drawn = (static_cast<uint64_t>(random()) << 32) ^ random();
    return drawn ^ static_cast<uint64_t>(::getpid());
  }();
  return kToken;
}

Block::~Block() {
  if (!base_) return;
  try {
    device_.free(base_);
  } catch (const Error& error) {  // a broken device: nothing more to do about it
    BRAID_WARN(Exec, "nvlink_p2p: freeing a FIFO block failed: %s", error.what());
  }
}

void publish(uint64_t job, int owner, int user, BlockRef block) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (!t.blocks.emplace(Key{job, owner, user}, std::move(block)).second)
    throw Error(ErrorCode::InvalidUsage,
                format("nvlink_p2p: rank %d's connection to rank %d was set up twice in this "
                       "process (the same UniqueId used for two communicators?)",
                       owner, user));
}

BlockRef take(uint64_t job, int owner, int user) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto found = t.blocks.find(Key{job, owner, user});
  if (found == t.blocks.end())
    throw Error(ErrorCode::Internal,
                format("nvlink_p2p: rank %d published no FIFO block for rank %d", owner, user));
  BlockRef block = std::move(found->second);
  t.blocks.erase(found);
  return block;
}

void withdraw(uint64_t job, int owner, int user) {
  BlockRef dropped;  // freed outside the lock
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto found = t.blocks.find(Key{job, owner, user});
  if (found == t.blocks.end()) return;
  dropped = std::move(found->second);
  t.blocks.erase(found);
}

}  // namespace braid::transport::cuda_ipc
