#include "process_group.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <numeric>
#include <optional>
#include <utility>

#include "braid/error.h"

namespace braid::torch_backend {

void refuse(int rank, const char* call, const std::string& why) {
  throw Error(ErrorCode::InvalidArgument,
              "braid rank " + std::to_string(rank) + ": " + call + ": " + why);
}

namespace {

#if BRAID_TORCH_CUDA
constexpr bool kCuda = true;
#else
constexpr bool kCuda = false;
#endif

// The Work types of the *_tensor_coalesced calls: their own from the torch
// that added it, the batch's before.
#if BRAID_TORCH_SINCE(14)  // OpType::ALLGATHER_INTO_TENSOR_COALESCED: torch 2.14
constexpr c10d::OpType kAllgatherIntoTensorCoalesced =
    c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED;
#else
constexpr c10d::OpType kAllgatherIntoTensorCoalesced = c10d::OpType::COALESCED;
#endif
#if BRAID_TORCH_SINCE(12)  // OpType::REDUCE_SCATTER_TENSOR_COALESCED: torch 2.12
constexpr c10d::OpType kReduceScatterTensorCoalesced =
    c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED;
#else
constexpr c10d::OpType kReduceScatterTensorCoalesced = c10d::OpType::COALESCED;
#endif

std::optional<DataType> braidType(at::ScalarType type) {
  switch (type) {
    case at::kChar:
      return DataType::Int8;
    case at::kByte:
    case at::kBool:  // one byte, 0 or 1
      return DataType::Uint8;
    case at::kInt:
      return DataType::Int32;
    case at::kLong:
      return DataType::Int64;
    case at::kHalf:
      return DataType::Float16;
    case at::kBFloat16:
      return DataType::BFloat16;
    case at::kFloat:
      return DataType::Float32;
    case at::kDouble:
      return DataType::Float64;
    case at::kFloat8_e4m3fn:
      return DataType::Float8E4M3;
    case at::kFloat8_e5m2:
      return DataType::Float8E5M2;
    case at::kUInt32:
      return DataType::Uint32;
    case at::kUInt64:
      return DataType::Uint64;
    default:
      return std::nullopt;
  }
}

// c10d's names, in RedOpType's order (SUM = 0 … PREMUL_SUM = 8).
const char* opName(c10d::ReduceOp::RedOpType op) {
  static const char* const kNames[] = {"SUM",  "AVG", "PRODUCT", "MIN",       "MAX",
                                       "BAND", "BOR", "BXOR",    "PREMUL_SUM"};
  return op < c10d::ReduceOp::UNUSED ? kNames[op] : "UNUSED";
}

// A reduction as braid runs it: the op, and for PREMUL_SUM the factor the
// input is scaled by first.
struct Reduction {
  ReduceOp op = ReduceOp::Sum;
  std::optional<double> factor;
};

// A tensor as braid sees it: contiguous memory of one of braid's types.
struct Flat {
  at::Tensor user;  // the caller's tensor
  at::Tensor data;  // contiguous; `user` itself where it already was

  std::byte* bytes(int64_t elementOffset = 0) const {
    return static_cast<std::byte*>(data.data_ptr()) + elementOffset * data.element_size();
  }
  size_t count() const { return static_cast<size_t>(data.numel()); }
  void copyBack() const {
    if (!data.is_same(user)) user.copy_(data.view(user.sizes()));
  }
};

Flat flat(const at::Tensor& tensor) { return {tensor, tensor.contiguous()}; }

int64_t sum(const std::vector<int64_t>& values) {
  return std::accumulate(values.begin(), values.end(), int64_t{0});
}

}  // namespace

// ---------------------------------------------------------------- BraidWork

BraidWork::BraidWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                     std::shared_ptr<Calls> calls)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      calls_(std::move(calls)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors())) {}

c10::intrusive_ptr<c10::ivalue::Future> BraidWork::getFuture() { return future_; }

std::vector<at::Tensor> BraidWork::result() { return outputs_; }

bool BraidWork::wait(std::chrono::milliseconds timeout) {
  calls_->runThrough(*this);  // runs it here unless the group's thread already does
  return c10d::Work::wait(timeout);
}

int BraidWork::sourceRank() const {
  if (!source_) return c10d::Work::sourceRank();  // (throws: not a receive)
  const int source = source_->load();
  if (source < 0)
    throw Error(ErrorCode::InvalidUsage, "braid rank " + std::to_string(rank_) +
                                             ": sourceRank() of a receive that has not completed "
                                             "(wait() for it first)");
  return source;
}

bool BraidWork::isCompleted() { return future_->completed() || c10d::Work::isCompleted(); }

bool BraidWork::isSuccess() const {
  return future_->completed() ? !future_->hasError() : c10d::Work::isSuccess();
}

std::exception_ptr BraidWork::exception() const {
  if (future_->completed() && future_->hasError()) return future_->exception_ptr();
  return c10d::Work::exception();
}

bool BraidWork::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

// The future first, as Gloo's work does: whoever returns from wait() finds
// it complete, so that a callback chained on it then runs at once, in the
// chaining thread (torchft's managed work counts on that).
void BraidWork::complete(const std::string& error) {
  if (error.empty()) {
    future_->markCompleted(c10::IValue(outputs_));
    finish();
    return;
  }
  const std::exception_ptr failure = std::make_exception_ptr(std::runtime_error(error));
  future_->setError(failure);
  finish(failure);
}

// ---------------------------------------------------------------- the group

namespace {

// The checks every call makes, and the conversions.
class Checks {
 public:
  Checks(int rank, int size, const char* call) : rank_(rank), size_(size), call_(call) {}

  const at::Tensor& one(const std::vector<at::Tensor>& tensors) const {
    if (tensors.size() != 1)
      refuse(format("takes one tensor per call (one device per process), got %zu", tensors.size()));
    return tensor(tensors[0], "tensor");
  }

  const at::Tensor& tensor(const at::Tensor& t, const std::string& what) const {
    if (!t.defined()) refuse(what + " is undefined");
    onOneDevice(t, what);
    if (t.is_sparse()) refuse(what + " is sparse: braid takes dense tensors");
    if (!braidType(t.scalar_type()))
      refuse(what + " has dtype " + std::string(c10::toString(t.scalar_type())) +
             ", which braid does not carry (it carries int8, uint8, bool, int32, int64, "
             "float16, bfloat16, float32 and float64)");
    return t;
  }

  DataType type(const at::Tensor& t) const { return *braidType(t.scalar_type()); }

  // The device of the tensors checked so far (the CPU before any).
  c10::Device device() const { return device_.value_or(c10::Device(c10::kCPU)); }

  // A coalesced call's lists: one output (list) per input tensor.
  void onePerInput(size_t outputs, size_t inputs, const char* output) const {
    if (outputs != inputs)
      refuse(format("one %s per input tensor, not %zu for %zu", output, outputs, inputs));
  }

  void sameLayout(const at::Tensor& t, const at::Tensor& like, const std::string& what) const {
    tensor(t, what);
    if (t.scalar_type() != like.scalar_type())
      refuse(what + " has dtype " + std::string(c10::toString(t.scalar_type())) + ", not " +
             std::string(c10::toString(like.scalar_type())));
    if (t.numel() != like.numel())
      refuse(format("%s has %lld elements, not %lld", what.c_str(),
                    static_cast<long long>(t.numel()), static_cast<long long>(like.numel())));
  }

  void rankArgument(int64_t rank, const char* what) const {
    if (rank < 0 || rank >= size_)
      refuse(format("%s %lld is not a rank of this group of %d", what, static_cast<long long>(rank),
                    size_));
  }

  void listOfSize(size_t got, const char* what) const {
    if (got != static_cast<size_t>(size_))
      refuse(format("%s holds %zu tensors, not one per rank (%d)", what, got, size_));
  }

  // gather's outputs, scatter's inputs: one tensor per rank like `like`
  // at the root, none elsewhere.
  std::vector<Flat> rootsList(bool isRoot, const std::vector<std::vector<at::Tensor>>& lists,
                              const at::Tensor& like, const std::string& what) const {
    std::vector<Flat> flats;
    if (!isRoot) {
      if (!lists.empty() && !lists[0].empty()) refuse("only the root takes " + what + " tensors");
      return flats;
    }
    if (lists.size() != 1) refuse("the root takes one list of " + what + " tensors");
    listOfSize(lists[0].size(), ("the " + what + " list").c_str());
    for (int r = 0; r < size_; ++r) {
      sameLayout(lists[0][r], like, what + " tensor " + std::to_string(r));
      flats.push_back(flat(lists[0][r]));
    }
    return flats;
  }

  Reduction reduction(const c10d::ReduceOp& reduceOp, at::ScalarType type) const {
    const bool isBool = type == at::kBool;
    const bool isFloat = at::isFloatingType(type);
    Reduction r;
    switch (reduceOp.op_) {
      case c10d::ReduceOp::SUM:
        r.op = isBool ? ReduceOp::Max : ReduceOp::Sum;  // bool: logical or
        return r;
      case c10d::ReduceOp::PRODUCT:
        r.op = isBool ? ReduceOp::Min : ReduceOp::Prod;  // bool: logical and
        return r;
      case c10d::ReduceOp::MIN:
        r.op = ReduceOp::Min;
        return r;
      case c10d::ReduceOp::MAX:
        r.op = ReduceOp::Max;
        return r;
      case c10d::ReduceOp::AVG:
        if (isBool) break;
        r.op = ReduceOp::Avg;
        return r;
      case c10d::ReduceOp::BAND:
      case c10d::ReduceOp::BOR:
        if (!isBool) break;
        r.op = reduceOp.op_ == c10d::ReduceOp::BAND ? ReduceOp::Min : ReduceOp::Max;
        return r;
      case c10d::ReduceOp::PREMUL_SUM: {
        if (!isFloat) break;
        // (torch 2.13 renamed it PreMulSumSupplement, keeping this name.)
        const auto* factor =
            dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(reduceOp.supplement_.get());
        const at::Tensor* tensor =
            factor && factor->tensor_factor.defined() ? &factor->tensor_factor : nullptr;
        if (!factor) refuse("ReduceOp.PREMUL_SUM without its factor");
        if (!tensor) {
          r.factor = factor->double_factor;
        } else {
          if (tensor->numel() != 1) refuse("PREMUL_SUM's factor tensor must hold one element");
          r.factor = tensor->to(at::kCPU, at::kDouble).item<double>();
        }
        r.op = ReduceOp::Sum;
        return r;
      }
      default:
        break;
    }
    refuse(std::string("ReduceOp.") + opName(reduceOp.op_) + " is not supported on " +
           c10::toString(type) +
           " tensors (braid reduces with SUM, AVG, PRODUCT, MIN and MAX, PREMUL_SUM on "
           "floating types, and BAND and BOR on bool)");
  }

  // The input braid reduces: the tensor itself, or a scaled copy.
  Flat reducible(const at::Tensor& t, const Reduction& r) const {
    if (!r.factor) return flat(t);
    return {t, t.mul(*r.factor).contiguous()};
  }

  [[noreturn]] void refuse(const std::string& why) const {
    braid::torch_backend::refuse(rank_, call_, why);
  }

  // A call's tensors are all on the CPU, or all on one GPU.
  void onOneDevice(const at::Tensor& t, const std::string& what) const {
    const c10::Device device = t.device();
    if (device.is_cuda() && !kCuda)
      refuse(what + " is on " + device.str() +
             ": this braid_torch was built without CUDA (the CMake build against a CUDA torch "
             "has it)");
    if (!device.is_cpu() && !device.is_cuda())
      refuse(what + " is on " + device.str() + ": braid takes CPU and CUDA tensors");
    if (!device_)
      device_ = device;
    else if (*device_ != device)
      refuse(what + " is on " + device.str() + ", and the call's other tensors on " +
             device_->str() + ": a call's tensors are on one device");
  }

  template <typename... Args>
  static std::string format(const char* pattern, Args... args) {
    char text[512];
    std::snprintf(text, sizeof(text), pattern, args...);
    return text;
  }

 private:
  int rank_, size_;
  const char* call_;
  mutable std::optional<c10::Device> device_;
};

// Issues grouped ops; ends the group however the block is left, so a
// throwing call never leaves the communicator inside a group.
class Grouped {
 public:
  explicit Grouped(Communicator& comm) : comm_(comm) { comm_.groupStart(); }
  ~Grouped() noexcept(false) {
    if (std::uncaught_exceptions() > 0) {
      try {
        comm_.groupEnd();
      } catch (...) {
      }
      return;
    }
    comm_.groupEnd();
  }

 private:
  Communicator& comm_;
};

}  // namespace

Op grouped(std::vector<Op> ops) {
  return [ops = std::move(ops)](Communicator& comm, Stream stream) {
    const Grouped group(comm);
    Work last;
    for (const Op& op : ops) last = op(comm, stream);
    return last;
  };
}

namespace {

std::vector<uint8_t> idBytes(const UniqueId& id) {
  const auto* first = reinterpret_cast<const uint8_t*>(id.bytes.data());
  return std::vector<uint8_t>(first, first + id.bytes.size());
}

// torch gives each group a store of its own (a PrefixStore named after the
// group), so one key serves every group.
const std::string kIdKey = "braid/unique_id";
const std::string kGrowIdKey = "braid/grow_id";

// The id set under `key` (waits for it, as the store's get does).
UniqueId readId(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key) {
  UniqueId id;
  const std::vector<uint8_t> bytes = store->get(key);
  if (bytes.size() != id.bytes.size())
    throw Error(ErrorCode::InvalidArgument, "braid: the store's " + key + " has " +
                                                std::to_string(bytes.size()) + " bytes, not " +
                                                std::to_string(id.bytes.size()) +
                                                " (another program set braid's key?)");
  std::memcpy(id.bytes.data(), bytes.data(), bytes.size());
  return id;
}

Communicator meet(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  std::chrono::milliseconds timeout) {
  Config config;
  config.timeout = timeout;
  UniqueId id;
  if (rank == 0) {
    id = Communicator::newUniqueId(config);
    store->set(kIdKey, idBytes(id));
  } else {
    id = readId(store, kIdKey);
  }
  return Communicator::init(size, rank, id, config);
}

}  // namespace

// ---------------------------------------------------------------- Calls

Calls::Calls(Communicator& comm) : comm_(comm) {
  threads_.emplace_back([this] { serve(); });
}

void Calls::push(Call call) {
  bool wake;
  bool helpers;
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    call.queued = lastPush_ = Clock::now();
    queue_.push_back(std::move(call));
    wake = eager_ || sleeping_;
    helpers = completing_ > 0;  // the first thread may be stuck in a callback
  }
  if (wake) queued_.notify_one();
  if (helpers) helpers_.notify_all();
}

std::optional<Calls::Call> Calls::runNext(bool ownThread) {
  Call call;
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    if (queue_.empty()) return std::nullopt;
    call = std::move(queue_.front());
    queue_.pop_front();
    eager_ = ownThread;  // the group's thread ran it: nobody claimed it in time
  }
  std::string error;
  try {
    call.run(comm_, Stream());
    if (call.finish) call.finish();
  } catch (const std::exception& failure) {
    error = failure.what();
  }
  call.run = nullptr;  // drops the tensors the closures kept alive
  call.finish = nullptr;
  call.error = std::move(error);
  return call;
}

void Calls::complete(Call& call) {
  for (const auto& member : call.members) member->complete(call.error);
  call.work->complete(call.error);
}

void Calls::completeOnGroupThread(Call& call) {
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    ++completing_;
    // Every thread of the group may now be held by a callback: one more
    // stands by (it sleeps until a call is issued meanwhile).
    if (completing_ == static_cast<int>(threads_.size()) && !exiting_) {
      const int index = static_cast<int>(threads_.size());
      threads_.emplace_back([this, index] { help(index); });
    }
  }
  complete(call);
  std::lock_guard<std::mutex> lock(queueMutex_);
  // (Stopping, the first thread ends once no callback can issue more.)
  if (--completing_ == 0 && stopping_) queued_.notify_all();
}

void Calls::runOneOnGroupThread() {
  std::optional<Call> call;
  {
    std::lock_guard<std::mutex> running(runMutex_);
    call = runNext(true);
  }
  if (call) completeOnGroupThread(*call);
}

void Calls::runThrough(const BraidWork& work) {
  std::unique_lock<std::mutex> running(runMutex_, std::try_to_lock);
  if (!running.owns_lock()) {
    // The group's thread runs a call (perhaps this one): leave the next
    // ones to their waiters again.
    {
      std::lock_guard<std::mutex> lock(queueMutex_);
      eager_ = false;
    }
    running.lock();
  }
  while (!work.done()) {
    std::optional<Call> call = runNext(false);
    if (!call) return;
    running.unlock();
    complete(*call);
    running.lock();
  }
}

void Calls::serve() {
  std::unique_lock<std::mutex> lock(queueMutex_);
  for (;;) {
    if (queue_.empty()) {
      if (stopping_ && completing_ == 0) return;
      if (stopping_ || eager_ || Clock::now() - lastPush_ >= kLinger) {
        sleeping_ = true;
        queued_.wait(lock, [&] { return (stopping_ && completing_ == 0) || !queue_.empty(); });
        sleeping_ = false;
      } else {
        queued_.wait_for(lock, kPoll);
      }
      continue;
    }
    const Clock::time_point due = queue_.front().queued + kGrace;
    if (!eager_ && !stopping_ && Clock::now() < due) {
      queued_.wait_until(lock, due);
      continue;
    }
    lock.unlock();
    runOneOnGroupThread();
    lock.lock();
  }
}

void Calls::help(int index) {
  std::unique_lock<std::mutex> lock(queueMutex_);
  for (;;) {
    helpers_.wait(lock, [&] { return exiting_ || (completing_ >= index && !queue_.empty()); });
    if (exiting_) return;
    const Clock::time_point due = queue_.front().queued + kStall;
    if (Clock::now() < due) {
      helpers_.wait_until(lock, due);
      continue;
    }
    lock.unlock();
    runOneOnGroupThread();
    lock.lock();
  }
}

void Calls::stop() {
  std::unique_lock<std::mutex> lock(queueMutex_);
  if (stopping_) return;  // (stopped, or stopping in another thread)
  stopping_ = true;
  queued_.notify_all();
  helpers_.notify_all();  // (the first thread may wait on a helper's call)
  std::thread first = std::move(threads_[0]);
  lock.unlock();
  if (first.joinable()) first.join();  // after every issued call ran (or failed)
  lock.lock();
  exiting_ = true;
  helpers_.notify_all();
  std::vector<std::thread> helpers = std::move(threads_);
  lock.unlock();
  for (std::thread& helper : helpers)
    if (helper.joinable()) helper.join();
}

// ---------------------------------------------------------------- the group

ProcessGroupBraid::ProcessGroupBraid(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size),
      store_(store),
      options_(c10::make_intrusive<Options>("braid", timeout)),
      comm_(meet(store, rank, size, timeout)),
      calls_(std::make_shared<Calls>(comm_)) {}

ProcessGroupBraid::ProcessGroupBraid(braid::Communicator comm,
                                     c10::intrusive_ptr<c10d::Store> store,
                                     c10::intrusive_ptr<Options> options)
    : c10d::Backend(comm.rank(), comm.size()),
      store_(std::move(store)),
      options_(std::move(options)),
      comm_(std::move(comm)),
      calls_(std::make_shared<Calls>(comm_)) {
  // split_group's timeout, where it gives one; else the parent's, inherited.
  if (!options_)
    options_ = c10::make_intrusive<Options>("braid", comm_.timeout());
  else if (options_->timeout.count() > 0)
    comm_.setTimeout(options_->timeout);
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupBraid::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  const Checks check(rank_, size_, "split");
  if (coalescing_) check.refuse("cannot split while coalescing (endCoalescing first)");
  for (int r : ranks) check.rankArgument(r, "the new group's rank");
  // torch's ProcessGroup::splitGroup splits the backend of each device type
  // the group has, and this one is the group's for both the CPU and CUDA:
  // the same split again, with nothing issued since, is that call's other
  // half and gets the same group.
  if (lastSplit_ && lastSplit_->ranks == ranks && lastSplit_->issued == issued_) {
    if (!lastSplit_->child) return nullptr;
    if (auto again = lastSplit_->child->lock()) return again;
  }
  const auto at = std::find(ranks.begin(), ranks.end(), rank_);
  const bool member = at != ranks.end();
  // The new group's lowest rank names it: the same on its members, another
  // on every group disjoint from it.
  const int color = member ? *std::min_element(ranks.begin(), ranks.end()) : -1;
  const int key = member ? static_cast<int>(at - ranks.begin()) : 0;
  auto child = std::make_shared<std::optional<braid::Communicator>>();
  post(c10::Device(c10::kCPU), c10d::OpType::UNKNOWN, {},
       [child, color, key](Communicator& comm, Stream) {
         child->emplace(comm.split(color, key));
         return Work();
       })
      ->wait();
  if (!member) {
    lastSplit_ = LastSplit{ranks, issued_, std::nullopt};
    return nullptr;
  }
  auto group = c10::make_intrusive<ProcessGroupBraid>(std::move(**child), store, opts);
  lastSplit_ = LastSplit{ranks, issued_, c10::weak_intrusive_ptr<c10d::Backend>(group)};
  return group;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupBraid::shrink(
    const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
    const c10::intrusive_ptr<Options>& opts) {
  const Checks check(rank_, size_, "shrink");
  if (coalescing_) check.refuse("cannot shrink while coalescing (endCoalescing first)");
  if (shrinkFlags != 0 && shrinkFlags != 1)
    check.refuse("shrink_flags is " + std::to_string(shrinkFlags) +
                 ": it is SHRINK_DEFAULT (0) or SHRINK_ABORT (1)");
  std::vector<int> excluded;
  for (int64_t r : ranksToExclude) {
    check.rankArgument(static_cast<int>(r), "an excluded rank");
    excluded.push_back(static_cast<int>(r));
  }
  const auto flags = shrinkFlags == 1 ? braid::ShrinkFlags::Abort : braid::ShrinkFlags::Default;
  if (flags == braid::ShrinkFlags::Abort) {
    comm_.abort();  // what runs and waits on the group's thread fails now
    if (cudaComm_) cudaComm_->abort();
  }
  auto child = std::make_shared<std::optional<braid::Communicator>>();
  post(c10::Device(c10::kCPU), c10d::OpType::UNKNOWN, {},
       [child, excluded, flags](Communicator& comm, Stream) {
         child->emplace(comm.shrink(excluded, flags));
         return Work();
       })
      ->wait();
  return c10::make_intrusive<ProcessGroupBraid>(std::move(**child), store_, opts);
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupBraid::grow(
    const c10::intrusive_ptr<c10d::Store>& store, int size) {
  const Checks check(rank_, size_, "grow");
  if (coalescing_) check.refuse("cannot grow while coalescing (endCoalescing first)");
  if (size <= size_)
    check.refuse("size is " + std::to_string(size) + ": the grown group has more ranks than this " +
                 "one's " + std::to_string(size_));
  auto child = std::make_shared<std::optional<braid::Communicator>>();
  post(c10::Device(c10::kCPU), c10d::OpType::UNKNOWN, {},
       [child, store, size](Communicator& comm, Stream) {
         std::optional<UniqueId> id;
         if (comm.rank() == 0) {
           id = comm.growId();
           store->set(kGrowIdKey, idBytes(*id));
         }
         child->emplace(comm.grow(size, id ? &*id : nullptr));
         return Work();
       })
      ->wait();
  return c10::make_intrusive<ProcessGroupBraid>(std::move(**child), store, nullptr);
}

ProcessGroupBraid::~ProcessGroupBraid() {
  calls_->stop();  // after every issued call ran (or failed)
}

void ProcessGroupBraid::setTimeout(std::chrono::milliseconds timeout) {
  comm_.setTimeout(timeout);  // (CUDA's communicator, split later, inherits it)
  if (cudaComm_) cudaComm_->setTimeout(timeout);
  options_->timeout = timeout;
}

void ProcessGroupBraid::abort() {
  comm_.abort();
  if (cudaComm_) cudaComm_->abort();
}

void ProcessGroupBraid::shutdown() {
  shutDown_ = true;
  calls_->stop();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::post(c10::Device device, c10d::OpType type,
                                                       std::vector<at::Tensor> outputs, Op run,
                                                       Finish finish) {
  if (shutDown_)
    throw Error(ErrorCode::InvalidUsage,
                "braid rank " + std::to_string(rank_) + ": the process group was shut down");
  if (coalescing_ && (cudaBatch_ ? !device.is_cuda() : device.is_cuda() && !batch_.empty()))
    refuse(rank_, "a coalesced call",
           "a coalesced batch's calls are on one device: this call's tensors are on " +
               device.str() + ", the batch's on " +
               (cudaBatch_ ? cudaBatch_->device.str() : "cpu"));
  ++issued_;
  if (type != c10d::OpType::SEND && type != c10d::OpType::RECV && type != c10d::OpType::UNKNOWN)
    ++collectives_;  // (UNKNOWN: a split)
  if (device.is_cuda())
    return postOnCuda(device, type, std::move(outputs), std::move(run), std::move(finish));
  auto work = c10::make_intrusive<BraidWork>(rank_, type, std::move(outputs), calls_);
  Calls::Call call{work, std::move(run), std::move(finish), {}, {}, {}};
  if (coalescing_)
    batch_.push_back(std::move(call));
  else
    calls_->push(std::move(call));
  return work;
}

void ProcessGroupBraid::startCoalescing() {
  if (coalescing_)
    throw Error(ErrorCode::InvalidUsage,
                "braid rank " + std::to_string(rank_) +
                    ": startCoalescing: this group is coalescing already (endCoalescing first)");
  coalescing_ = true;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::endCoalescing() {
  if (!coalescing_)
    throw Error(ErrorCode::InvalidUsage,
                "braid rank " + std::to_string(rank_) + ": endCoalescing without startCoalescing");
  coalescing_ = false;
  if (cudaBatch_) return endCudaCoalescing();
  std::vector<Calls::Call> calls = std::move(batch_);
  batch_.clear();
  std::vector<at::Tensor> outputs;
  std::vector<c10::intrusive_ptr<BraidWork>> members;
  for (const Calls::Call& call : calls) {
    for (const at::Tensor& t : call.work->result()) outputs.push_back(t);
    members.push_back(call.work);
    // (a coalesced call issued inside this batch: its Work too)
    members.insert(members.end(), call.members.begin(), call.members.end());
  }
  auto work =
      c10::make_intrusive<BraidWork>(rank_, c10d::OpType::COALESCED, std::move(outputs), calls_);
  if (calls.empty()) {  // nothing to run (torch coalesces around abort(), say)
    work->complete("");
    return work;
  }
  std::vector<Op> runs;
  std::vector<Finish> finishes;
  for (Calls::Call& call : calls) {
    runs.push_back(std::move(call.run));
    if (call.finish) finishes.push_back(std::move(call.finish));
  }
  Calls::Call batch{work,
                    grouped(std::move(runs)),
                    [finishes = std::move(finishes)] {
                      for (const Finish& finish : finishes) finish();
                    },
                    {},
                    std::move(members),
                    {}};
  calls_->push(std::move(batch));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::coalesced(c10d::OpType type,
                                                            const std::function<void()>& issue) {
  if (coalescing_) {  // part of the caller's batch: its Work stands for these
    const size_t first = batch_.size();
    const size_t firstOutput = cudaBatch_ ? cudaBatch_->outputs.size() : 0;
    issue();
    if (cudaBatch_) return cudaMember(type, firstOutput);
    std::vector<at::Tensor> outputs;
    for (size_t i = first; i < batch_.size(); ++i)
      for (const at::Tensor& t : batch_[i].work->result()) outputs.push_back(t);
    auto work = c10::make_intrusive<BraidWork>(rank_, type, std::move(outputs), calls_);
    if (batch_.size() == first)
      work->complete("");  // nothing to do
    else
      batch_.back().members.push_back(work);
    return work;
  }
  startCoalescing();
  try {
    issue();
  } catch (...) {  // a refused argument: nothing was queued
    coalescing_ = false;
    batch_.clear();
    cudaBatch_.reset();
    throw;
  }
  return endCoalescing();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  // outputLists[r][i] receives rank r's input i.
  const Checks check(rank_, size_, "allgather_coalesced");
  check.listOfSize(outputLists.size(), "output_tensor_lists");
  for (const auto& list : outputLists) check.onePerInput(list.size(), inputs.size(), "output");
  return coalesced(c10d::OpType::ALLGATHER_COALESCED, [&] {
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<std::vector<at::Tensor>> outs(1);
      for (const auto& list : outputLists) outs[0].push_back(list[i]);
      std::vector<at::Tensor> in{inputs[i]};
      allgather(outs, in, opts);
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  Checks(rank_, size_, "allgather_into_tensor_coalesced")
      .onePerInput(outputs.size(), inputs.size(), "output");
  return coalesced(kAllgatherIntoTensorCoalesced, [&] {
    for (size_t i = 0; i < inputs.size(); ++i) _allgather_base(outputs[i], inputs[i], opts);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  Checks(rank_, size_, "reduce_scatter_tensor_coalesced")
      .onePerInput(outputs.size(), inputs.size(), "output");
  return coalesced(kReduceScatterTensorCoalesced, [&] {
    for (size_t i = 0; i < inputs.size(); ++i) _reduce_scatter_base(outputs[i], inputs[i], opts);
  });
}

// ---- Collectives.

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  const Checks check(rank_, size_, "broadcast");
  const at::Tensor& t = check.one(tensors);
  check.rankArgument(opts.rootRank, "root");
  const Flat f = flat(t);
  return post(
      check.device(), c10d::OpType::BROADCAST, {t},
      [=](Communicator& comm, Stream on) {
        return comm.broadcast(f.bytes(), f.bytes(), f.count(), check.type(t),
                              static_cast<int>(opts.rootRank), on);
      },
      [f] { f.copyBack(); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  const Checks check(rank_, size_, "allreduce");
  const at::Tensor& t = check.one(tensors);
  const Reduction r = check.reduction(opts.reduceOp, t.scalar_type());
  const Flat f = check.reducible(t, r);
  return post(
      check.device(), c10d::OpType::ALLREDUCE, {t},
      [=](Communicator& comm, Stream on) {
        return comm.allReduce(f.bytes(), f.bytes(), f.count(), check.type(t), r.op, on);
      },
      [f] { f.copyBack(); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const Checks check(rank_, size_, "allreduce_coalesced");
  std::vector<Flat> flats;
  std::vector<Reduction> reductions;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = check.tensor(tensors[i], "tensor " + std::to_string(i));
    reductions.push_back(check.reduction(opts.reduceOp, t.scalar_type()));
    flats.push_back(check.reducible(t, reductions.back()));
  }
  return post(
      check.device(), c10d::OpType::ALLREDUCE_COALESCED, tensors,
      [=](Communicator& comm, Stream on) {
        const Grouped group(comm);
        Work last;
        for (size_t i = 0; i < flats.size(); ++i)
          last = comm.allReduce(flats[i].bytes(), flats[i].bytes(), flats[i].count(),
                                check.type(flats[i].user), reductions[i].op, on);
        return last;
      },
      [flats] {
        for (const Flat& f : flats) f.copyBack();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  const Checks check(rank_, size_, "reduce");
  const at::Tensor& t = check.one(tensors);
  check.rankArgument(opts.rootRank, "root");
  const Reduction r = check.reduction(opts.reduceOp, t.scalar_type());
  const Flat f = check.reducible(t, r);
  const bool root = opts.rootRank == rank_;
  return post(
      check.device(), c10d::OpType::REDUCE, {t},
      [=](Communicator& comm, Stream on) {
        return comm.reduce(f.bytes(), f.bytes(), f.count(), check.type(t), r.op,
                           static_cast<int>(opts.rootRank), on);
      },
      [f, root] {
        if (root) f.copyBack();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  const Checks check(rank_, size_, "allgather");
  const at::Tensor& in = check.one(inputs);
  if (outputs.size() != 1) check.refuse("takes one list of output tensors");
  check.listOfSize(outputs[0].size(), "the output list");
  for (int r = 0; r < size_; ++r)
    check.sameLayout(outputs[0][r], in, "output tensor " + std::to_string(r));
  const Flat f = flat(in);
  const at::Tensor gathered = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
  std::vector<at::Tensor> outs = outputs[0];
  return post(
      check.device(), c10d::OpType::ALLGATHER, outs,
      [=](Communicator& comm, Stream on) {
        return comm.allGather(f.bytes(), gathered.data_ptr(), f.count(), check.type(in), on);
      },
      [f, gathered, outs] {
        const int64_t n = f.data.numel();
        for (size_t r = 0; r < outs.size(); ++r)
          outs[r].copy_(gathered.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& /*opts*/) {
  const Checks check(rank_, size_, "_allgather_base");
  check.tensor(input, "input");
  check.tensor(output, "output");
  if (output.scalar_type() != input.scalar_type())
    check.refuse("the output's dtype differs from the input's");
  if (output.numel() != static_cast<int64_t>(size_) * input.numel())
    check.refuse(Checks::format(
        "the output has %lld elements, not the group's size (%d) times "
        "the input's %lld",
        static_cast<long long>(output.numel()), size_, static_cast<long long>(input.numel())));
  const Flat in = flat(input), out = flat(output);
  return post(
      check.device(), c10d::OpType::_ALLGATHER_BASE, {output},
      [=](Communicator& comm, Stream on) {
        return comm.allGather(in.bytes(), out.bytes(), in.count(), check.type(input), on);
      },
      [in, out] { out.copyBack(); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const Checks check(rank_, size_, "gather");
  const at::Tensor& in = check.one(inputs);
  check.rankArgument(opts.rootRank, "root");
  const int root = static_cast<int>(opts.rootRank);
  const std::vector<Flat> outs = check.rootsList(rank_ == root, outputs, in, "output");
  const Flat f = flat(in);
  return post(
      check.device(), c10d::OpType::GATHER, rank_ == root ? outputs[0] : std::vector<at::Tensor>{},
      [=, rank = rank_, nranks = size_](Communicator& comm, Stream on) {
        const Grouped group(comm);
        if (rank != root) return comm.send(f.bytes(), f.count(), check.type(in), root, on);
        Work last;
        for (int r = 0; r < nranks; ++r)
          if (r != root) last = comm.recv(outs[r].bytes(), outs[r].count(), check.type(in), r, on);
        return last;
      },
      [f, outs, root] {
        if (outs.empty()) return;
        outs[root].data.copy_(f.data.view(outs[root].data.sizes()));
        for (const Flat& out : outs) out.copyBack();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::gather_into_tensor(
    at::Tensor& output, at::Tensor& input, const c10d::GatherOptions& opts) {
  const Checks check(rank_, size_, "gather_into_tensor");
  check.tensor(input, "input");
  check.rankArgument(opts.rootRank, "root");
  const int root = static_cast<int>(opts.rootRank);
  const bool isRoot = rank_ == root;
  if (isRoot) {
    check.tensor(output, "output");
    if (output.scalar_type() != input.scalar_type())
      check.refuse("the output's dtype differs from the input's");
    if (output.numel() != static_cast<int64_t>(size_) * input.numel())
      check.refuse(Checks::format(
          "the output has %lld elements, not the group's size (%d) times the input's %lld",
          static_cast<long long>(output.numel()), size_, static_cast<long long>(input.numel())));
  }
  const Flat in = flat(input);
  const Flat out = isRoot ? flat(output) : Flat{};
  const DataType type = check.type(input);
  return post(
      check.device(), c10d::OpType::GATHER,
      isRoot ? std::vector<at::Tensor>{output} : std::vector<at::Tensor>{},
      [=, rank = rank_, nranks = size_](Communicator& comm, Stream on) {
        const Grouped group(comm);
        if (rank != root) return comm.send(in.bytes(), in.count(), type, root, on);
        const int64_t n = in.data.numel();
        Work last;
        for (int r = 0; r < nranks; ++r)
          if (r != root) last = comm.recv(out.bytes(r * n), in.count(), type, r, on);
        return last;
      },
      [in, out, root, isRoot] {
        if (!isRoot) return;
        const int64_t n = in.data.numel();
        out.data.view(-1).narrow(0, root * n, n).copy_(in.data.view(-1));
        out.copyBack();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const Checks check(rank_, size_, "scatter");
  const at::Tensor& out = check.one(outputs);
  check.rankArgument(opts.rootRank, "root");
  const int root = static_cast<int>(opts.rootRank);
  const std::vector<Flat> ins = check.rootsList(rank_ == root, inputs, out, "input");
  const Flat f = flat(out);
  return post(
      check.device(), c10d::OpType::SCATTER, {out},
      [=, rank = rank_, nranks = size_](Communicator& comm, Stream on) {
        const Grouped group(comm);
        if (rank != root) return comm.recv(f.bytes(), f.count(), check.type(out), root, on);
        Work last;
        for (int r = 0; r < nranks; ++r)
          if (r != root) last = comm.send(ins[r].bytes(), ins[r].count(), check.type(out), r, on);
        return last;
      },
      [f, ins, root] {
        if (!ins.empty()) f.data.copy_(ins[root].data.view(f.data.sizes()));
        f.copyBack();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const Checks check(rank_, size_, "reduce_scatter");
  const at::Tensor& out = check.one(outputs);
  if (inputs.size() != 1) check.refuse("takes one list of input tensors");
  check.listOfSize(inputs[0].size(), "the input list");
  std::vector<at::Tensor> pieces;
  for (int r = 0; r < size_; ++r) {
    check.sameLayout(inputs[0][r], out, "input tensor " + std::to_string(r));
    pieces.push_back(inputs[0][r].reshape({-1}));
  }
  const Reduction r = check.reduction(opts.reduceOp, out.scalar_type());
  const Flat in = check.reducible(at::cat(pieces), r);
  const Flat f = flat(out);
  return post(
      check.device(), c10d::OpType::REDUCE_SCATTER, {out},
      [=](Communicator& comm, Stream on) {
        return comm.reduceScatter(in.bytes(), f.bytes(), f.count(), check.type(out), r.op, on);
      },
      [in, f] { f.copyBack(); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const Checks check(rank_, size_, "_reduce_scatter_base");
  check.tensor(input, "input");
  check.tensor(output, "output");
  if (output.scalar_type() != input.scalar_type())
    check.refuse("the output's dtype differs from the input's");
  if (input.numel() != static_cast<int64_t>(size_) * output.numel())
    check.refuse(Checks::format(
        "the input has %lld elements, not the group's size (%d) times "
        "the output's %lld",
        static_cast<long long>(input.numel()), size_, static_cast<long long>(output.numel())));
  const Reduction r = check.reduction(opts.reduceOp, output.scalar_type());
  const Flat in = check.reducible(input, r), out = flat(output);
  return post(
      check.device(), c10d::OpType::_REDUCE_SCATTER_BASE, {output},
      [=](Communicator& comm, Stream on) {
        return comm.reduceScatter(in.bytes(), out.bytes(), out.count(), check.type(output), r.op,
                                  on);
      },
      [in, out] { out.copyBack(); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
    std::vector<int64_t>& inputSplits, const c10d::AllToAllOptions& /*opts*/) {
  const Checks check(rank_, size_, "alltoall_base");
  check.tensor(input, "input");
  check.tensor(output, "output");
  if (output.scalar_type() != input.scalar_type())
    check.refuse("the output's dtype differs from the input's");
  if (input.dim() == 0 || output.dim() == 0)
    check.refuse("the input and output split along their first dimension: not scalars");
  // Splits count rows of the first dimension; none given: equal parts.
  auto counts = [&](const at::Tensor& t, std::vector<int64_t> splits, const char* what) {
    const int64_t rows = t.size(0);
    if (splits.empty()) {
      if (rows % size_ != 0)
        check.refuse(
            Checks::format("the %s's first dimension (%lld) does not split into %d "
                           "equal parts",
                           what, static_cast<long long>(rows), size_));
      splits.assign(static_cast<size_t>(size_), rows / size_);
    }
    check.listOfSize(splits.size(), (std::string(what) + " split sizes").c_str());
    if (sum(splits) != rows)
      check.refuse(
          Checks::format("the %s split sizes add up to %lld, not its first dimension "
                         "%lld",
                         what, static_cast<long long>(sum(splits)), static_cast<long long>(rows)));
    const int64_t rowElems = rows == 0 ? 0 : t.numel() / rows;
    for (int64_t& s : splits) s *= rowElems;
    return splits;
  };
  const std::vector<int64_t> sendCounts = counts(input, inputSplits, "input");
  const std::vector<int64_t> recvCounts = counts(output, outputSplits, "output");
  std::vector<int64_t> sendAt(static_cast<size_t>(size_), 0), recvAt(sendAt);
  for (int r = 1; r < size_; ++r) {
    sendAt[r] = sendAt[r - 1] + sendCounts[r - 1];
    recvAt[r] = recvAt[r - 1] + recvCounts[r - 1];
  }
  if (sendCounts[rank_] != recvCounts[rank_])
    check.refuse(Checks::format("this rank sends itself %lld elements but receives %lld",
                                static_cast<long long>(sendCounts[rank_]),
                                static_cast<long long>(recvCounts[rank_])));
  const Flat in = flat(input), out = flat(output);
  const DataType type = check.type(input);
  const int self = rank_;
  return post(
      check.device(), c10d::OpType::ALLTOALL_BASE, {output},
      [=, rank = rank_, nranks = size_](Communicator& comm, Stream on) {
        const Grouped group(comm);
        Work last;
        for (int r = 0; r < nranks; ++r) {
          if (r == rank) continue;
          if (sendCounts[r] > 0)
            last = comm.send(in.bytes(sendAt[r]), static_cast<size_t>(sendCounts[r]), type, r, on);
          if (recvCounts[r] > 0)
            last = comm.recv(out.bytes(recvAt[r]), static_cast<size_t>(recvCounts[r]), type, r, on);
        }
        return last;
      },
      [in, out, at = sendAt[self], to = recvAt[self], n = sendCounts[self]] {
        out.data.view(-1).narrow(0, to, n).copy_(in.data.view(-1).narrow(0, at, n));
        out.copyBack();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& /*opts*/) {
  const Checks check(rank_, size_, "alltoall");
  check.listOfSize(inputs.size(), "the input list");
  check.listOfSize(outputs.size(), "the output list");
  std::vector<Flat> ins, outs;
  for (int r = 0; r < size_; ++r) {
    ins.push_back(flat(check.tensor(inputs[r], "input tensor " + std::to_string(r))));
    outs.push_back(flat(check.tensor(outputs[r], "output tensor " + std::to_string(r))));
    if (inputs[r].scalar_type() != inputs[0].scalar_type() ||
        outputs[r].scalar_type() != inputs[0].scalar_type())
      check.refuse("every input and output tensor must have the same dtype");
  }
  check.sameLayout(outputs[rank_], inputs[rank_], "this rank's own output tensor");
  const DataType type = check.type(inputs[0]);
  const int self = rank_;
  return post(
      check.device(), c10d::OpType::ALLTOALL, outputs,
      [=, rank = rank_, nranks = size_](Communicator& comm, Stream on) {
        const Grouped group(comm);
        Work last;
        for (int r = 0; r < nranks; ++r) {
          if (r == rank) continue;
          if (ins[r].count() > 0) last = comm.send(ins[r].bytes(), ins[r].count(), type, r, on);
          if (outs[r].count() > 0) last = comm.recv(outs[r].bytes(), outs[r].count(), type, r, on);
        }
        return last;
      },
      [ins, outs, self] {
        outs[self].data.copy_(ins[self].data.view(outs[self].data.sizes()));
        for (const Flat& out : outs) out.copyBack();
      });
}

// Point to point: braid keeps issue order per direction between two ranks,
// as NCCL does; torch's tag is not needed for matching and is ignored.
c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::send(std::vector<at::Tensor>& tensors,
                                                       int dstRank, int /*tag*/) {
  const Checks check(rank_, size_, "send");
  const at::Tensor& t = check.one(tensors);
  check.rankArgument(dstRank, "destination");
  if (dstRank == rank_) check.refuse("a rank cannot send to itself");
  const Flat f = flat(t);
  return post(check.device(), c10d::OpType::SEND, {t}, [=](Communicator& comm, Stream on) {
    return comm.send(f.bytes(), f.count(), check.type(t), dstRank, on);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::recv(std::vector<at::Tensor>& tensors,
                                                       int srcRank, int /*tag*/) {
  const Checks check(rank_, size_, "recv");
  const at::Tensor& t = check.one(tensors);
  check.rankArgument(srcRank, "source");
  if (srcRank == rank_) check.refuse("a rank cannot receive from itself");
  const Flat f = flat(t);
  return post(
      check.device(), c10d::OpType::RECV, {t},
      [=](Communicator& comm, Stream on) {
        return comm.recv(f.bytes(), f.count(), check.type(t), srcRank, on);
      },
      [f] { f.copyBack(); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                int /*tag*/) {
  const Checks check(rank_, size_, "recv from any source");
  const at::Tensor& t = check.one(tensors);
  if (check.device().is_cuda())
    check.refuse("takes a CPU tensor (braid receives from any source into host memory)");
  if (size_ == 1) check.refuse("this group has no other rank to receive from");
  if (t.numel() == 0) check.refuse("the tensor is empty: a receive from any source needs data");
  if (coalescing_) check.refuse("a receive from any source cannot be coalesced");
  const Flat f = flat(t);
  auto source = std::make_shared<std::atomic<int>>(-1);
  auto work = post(
      check.device(), c10d::OpType::RECVANYSOURCE, {t},
      [=](Communicator& comm, Stream) {
        source->store(comm.recvFromAny(f.bytes(), f.count(), check.type(t)));
        return braid::Work();  // (it blocked until done)
      },
      [f] { f.copyBack(); });
  static_cast<BraidWork&>(*work).reportSourceFrom(std::move(source));
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::barrier(const c10d::BarrierOptions& /*opts*/) {
  // (on the group's communicator, ordered with its calls on CPU tensors)
  return post(c10::Device(c10::kCPU), c10d::OpType::BARRIER, {},
              [](Communicator& comm, Stream) { return comm.barrier(); });
}

void ProcessGroupBraid::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  // Its messages are Gloo's (the one other backend that has it), which
  // scripts and torch's own tests look for.
  using Clock = std::chrono::steady_clock;
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? options_->timeout : opts.timeout;
  const auto deadline = Clock::now() + timeout;
  const std::string prefix =
      "braid/monitored_barrier/" + std::to_string(monitoredBarriers_++) + "/";
  const std::string released = prefix + "released";
  const std::string me = "braid rank " + std::to_string(rank_) + ": ";
  const std::string ms = std::to_string(timeout.count()) + " ms";
  const auto arrived = [&](const std::string& key) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return store_->check({key});
    try {
      store_->wait({key}, left);
      return true;
    } catch (const std::exception&) {  // the store's timeout
      return false;
    }
  };
  if (rank_ != 0) {
    store_->set(prefix + std::to_string(rank_), std::vector<uint8_t>{1});
    if (!arrived(released))
      throw Error(ErrorCode::Timeout,
                  me + "Rank " + std::to_string(rank_) +
                      " successfully reached monitoredBarrier, but received errors while waiting "
                      "for send/recv from rank 0: it did not release the barrier within " +
                      ms);
    return;
  }
  if (timeout.count() <= 0)
    throw Error(ErrorCode::Timeout, me + "Rank 0 timed out in monitoredBarrier after " + ms);
  std::vector<int> missing;
  for (int r = 1; r < size_; ++r) {
    if (arrived(prefix + std::to_string(r))) continue;
    missing.push_back(r);
    if (!waitAllRanks) break;
  }
  if (!missing.empty()) {
    std::string names;
    for (int r : missing) names += (names.empty() ? "" : ", ") + std::to_string(r);
    throw Error(ErrorCode::Timeout, me + (missing.size() == 1 ? "Rank " : "Ranks ") + names +
                                        " failed to pass monitoredBarrier in " + ms);
  }
  store_->set(released, std::vector<uint8_t>{1});
}

#if !BRAID_TORCH_CUDA
// Built without CUDA, Checks refuses CUDA tensors before a call gets here.
namespace {
[[noreturn]] void withoutCuda(int rank) {
  refuse(rank, "a call on CUDA tensors", "this braid_torch was built without CUDA");
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::postOnCuda(c10::Device, c10d::OpType,
                                                             std::vector<at::Tensor>, Op, Finish) {
  withoutCuda(rank_);
}
c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::endCudaCoalescing() { withoutCuda(rank_); }
c10::intrusive_ptr<c10d::Work> ProcessGroupBraid::cudaMember(c10d::OpType, size_t) {
  withoutCuda(rank_);
}
#endif

c10::intrusive_ptr<c10d::Backend> createProcessGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                     int rank, int size,
                                                     std::chrono::milliseconds timeout) {
  return c10::make_intrusive<ProcessGroupBraid>(store, rank, size, timeout);
}

c10::intrusive_ptr<c10d::Backend> joinGrown(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                            int size, std::chrono::milliseconds timeout) {
  Config config;
  config.timeout = timeout;
  Communicator comm = Communicator::init(size, rank, readId(store, kGrowIdKey), config);
  return c10::make_intrusive<ProcessGroupBraid>(std::move(comm), store, nullptr);
}

}  // namespace braid::torch_backend
