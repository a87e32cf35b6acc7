// The communicator: a group of ranks that run collectives together.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "braid/config.h"
#include "braid/error.h"
#include "braid/types.h"

namespace braid {

// Where an operation runs. The default stream is host-synchronous: the call
// runs the operation in the caller's thread and returns a completed Work, the
// latency path. Stream::async() queues it on the communicator's progress
// thread and returns at once; Work::wait() joins it. Operations still run in
// issue order across both kinds.
//
// Stream::cuda(stream) is for device buffers (memory of the communicator's
// device): the operation is enqueued on that cudaStream_t (0 is the legacy
// default stream) and the call returns, NCCL's semantics; it runs after
// the work queued on the stream before it, and what is queued after it
// runs after it. Work::test() and wait() follow its completion on the
// device. Host buffers given with a device stream keep the host path and
// run in the caller's thread.
class Stream {
 public:
  Stream() = default;
  static Stream async() { return Stream(Kind::HostAsync, nullptr); }
  static Stream cuda(void* cudaStream) { return Stream(Kind::Device, cudaStream); }
  bool isAsync() const { return kind_ == Kind::HostAsync; }
  bool isDevice() const { return kind_ == Kind::Device; }
  // The cudaStream_t given to cuda(), else nullptr.
  void* deviceStream() const { return handle_; }

 private:
  enum class Kind { HostSync, HostAsync, Device };
  Stream(Kind kind, void* handle) : kind_(kind), handle_(handle) {}
  Kind kind_ = Kind::HostSync;
  void* handle_ = nullptr;
};

// A window registered with Communicator::registerWindow (0: none).
struct Window {
  uint64_t id = 0;
};

// Signals of one-sided calls: each rank keeps a counter per (source rank,
// signal), signals 0 to kSignals - 1.
constexpr int kSignals = 16;

// What Communicator::waitSignals waits for: `count` more raises of signal
// `signal` by rank `peer`.
struct SignalWait {
  int peer = 0;
  int signal = 0;
  uint64_t count = 1;
};

// What shrink() does with the ops still pending on the communicator:
// waits for them to finish (Default; NCCL_SHRINK_DEFAULT), or fails them at
// once (Abort; NCCL_SHRINK_ABORT), for a communicator hung on a dead rank.
enum class ShrinkFlags { Default, Abort };

// Completion handle of one operation. Copies share the same operation.
class Work {
 public:
  struct State;
  Work() = default;
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}

  // True once the operation finished (successfully or not). Never blocks.
  bool test() const;
  // Blocks until the operation finished; rethrows its error, if any.
  void wait() const;
  // Whether the operation was captured into a CUDA graph (its stream was
  // being captured): then it runs on each replay of the graph, and test()
  // and wait() report only that it was captured (at once, true).
  bool captured() const;

 private:
  std::shared_ptr<State> state_;
};

class Communicator {
 public:
  // Makes a new job id and starts the rendezvous service for it in this
  // process; ship the id to every rank out of band. The service lives until
  // the job's ranks have met or Config::timeout passed.
  static UniqueId newUniqueId(const Config& config = {});

  // Collective over `nranks` processes: every rank calls it with the same id.
  // Fails with Timeout, naming the ranks that never arrived, after
  // Config::timeout.
  static Communicator init(int nranks, int rank, const UniqueId& id, const Config& config = {});

  // Reads rank, size and rendezvous address from the launcher's environment:
  // braid-run (BRAID_RANK, BRAID_WORLD_SIZE, BRAID_UNIQUE_ID or BRAID_ROOT),
  // torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open MPI
  // (OMPI_COMM_WORLD_RANK/SIZE), MPICH/Hydra (PMI_RANK/PMI_SIZE) and Slurm
  // (SLURM_PROCID/SLURM_NTASKS), in that order.
  static Communicator fromEnvironment(const Config& config = {});

  // One process driving several devices, as ncclCommInitAll: a communicator
  // of devices.size() ranks, all in this process, rank i on devices[i] (a
  // device may appear more than once), returned in rank order. Ranks of
  // one process reach each other's device memory directly;
  // ops on device buffers only enqueue, so one thread can issue a
  // collective on every rank in turn and then wait for their streams. A
  // process without a device gets communicators for host buffers. Throws
  // Error(InvalidArgument) naming the entry for an empty list or a device
  // this process does not have.
  static std::vector<Communicator> initAll(const std::vector<int>& devices,
                                           const Config& config = {});

  Communicator();  // an empty handle; every operation on it is InvalidUsage
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  // Finishes queued operations (bounded by Config::timeout), then frees
  // every thread, socket and buffer the communicator owns.
  ~Communicator();

  // Collectives follow NCCL: every rank issues the same ones in the same
  // order; `count` 0 is legal and does nothing; in place means send == recv
  // (all-gather: send == recv + rank * sendCount; reduce-scatter:
  // recv == send + rank * recvCount).
  Work allReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                 Stream stream = {});
  Work broadcast(const void* send, void* recv, size_t count, DataType type, int root,
                 Stream stream = {});
  Work reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root,
              Stream stream = {});
  Work allGather(const void* send, void* recv, size_t sendCount, DataType type, Stream stream = {});
  Work reduceScatter(const void* send, void* recv, size_t recvCount, DataType type, ReduceOp op,
                     Stream stream = {});
  Work send(const void* buffer, size_t count, DataType type, int peer, Stream stream = {});
  Work recv(void* buffer, size_t count, DataType type, int peer, Stream stream = {});
  // A receive from whichever peer's send to this rank arrives first (MPI's
  // MPI_ANY_SOURCE): blocks until one has, receives it into `buffer` and
  // returns that peer. It counts as that peer's receive: the k-th send
  // from A to B meets B's k-th receive from A, recv() or recvFromAny().
  // Host buffers only, `count` above 0, outside groups, in the calling
  // thread once this rank's async ops are done; InvalidArgument or
  // InvalidUsage otherwise, naming what is wrong. Fails as recv() does,
  // and with Timeout after Config::timeout when no peer sent.
  int recvFromAny(void* buffer, size_t count, DataType type);
  Work barrier(Stream stream = {});

  // Operations issued between groupStart() and the matching groupEnd() run
  // together when groupEnd() is called, so grouped sends and receives to
  // every peer cannot deadlock. Groups nest; the outermost groupEnd() runs.
  // Messages between two ranks keep issue order per direction: a group that
  // holds both collectives and sends must issue them in the same order on
  // both ends. An op rejected for a bad argument is not part of the group.
  // Work::wait() on an op of a group that has not ended is InvalidUsage.
  void groupStart();
  void groupEnd();

  // Collective: ranks with the same color form a new communicator, ordered by
  // (key, old rank). A negative color joins none and returns an empty handle.
  Communicator split(int color, int key);

  // Fails every pending and later operation with Aborted. Safe from any
  // thread while this Communicator object exists (not concurrently with its
  // destruction or a move).
  void abort();

  // Revokes the communicator (ULFM's MPIX_Comm_revoke): this rank's pending
  // and later ops fail with Revoked, and every peer is told, so that its
  // ops fail with Revoked too, naming this rank: an op waiting for any
  // peer within milliseconds, a later one where it meets a rank that was
  // told (every collective does), and each rank told tells the others.
  // What remains to do with it is shrink() and destruction. Safe from any
  // thread, as abort(): from a thread other than the one issuing ops, an op
  // waiting there fails and then tells the peers. Calling it again does
  // nothing.
  void revoke();

  // Not collective over this communicator: every rank not in `excluded`
  // calls it (the excluded ranks need not: they may be dead, stopped, or
  // alive and leaving) with the same list, and gets a communicator of the
  // others, ranked in their old order, without a restart: the rendezvous
  // runs among them over their existing listeners. `flags` says what
  // becomes of this communicator's pending ops (ShrinkFlags); with Abort
  // this communicator is aborted, to be destroyed. Throws
  // Error(InvalidArgument) naming `excluded` when it names this rank, a
  // rank twice, a rank out of range, every rank, or differs from another
  // caller's list (every caller throws then); RemoteError or Timeout when
  // a rank not excluded is gone or never calls it.
  Communicator shrink(const std::vector<int>& excluded, ShrinkFlags flags = ShrinkFlags::Default);
  // After a failure: the survivors agree among themselves on which ranks
  // failed and shrink without them, as ULFM's MPIX_Comm_shrink. Every live
  // rank calls it; ranks that died, stopped answering past the timeout, or
  // never call it within the timeout are left out, and every survivor ends
  // with the same members, even when another rank fails during the
  // agreement. Ops still pending here are failed first (ShrinkFlags::Abort).
  // The lowest live rank coordinates; if it stopped answering, the others'
  // shrink fails with Timeout naming it (a shrink with a list that names it
  // leaves it out).
  Communicator shrink();

  // Growing, in NCCL 2.29's model (ncclCommGetUniqueId, ncclCommGrow): one
  // member makes an id with growId() and ships it to the new processes out
  // of band; every member calls grow(nranks, &id) (that member) or
  // grow(nranks) (the others) and keeps its rank; each new process calls
  // init(nranks, rank, id) with its rank in [size(), nranks). Collective
  // over this communicator; the new communicator is made among all of them
  // (a fresh rendezvous, as init), and this one stays as it was. Throws
  // Error(InvalidArgument) on every member naming `nranks` when it is not
  // above size() or differs between members, or `id` when no member or
  // more than one passed one; Timeout naming the new ranks that never came.
  UniqueId growId();
  Communicator grow(int nranks, const UniqueId* id = nullptr);

  // Sets this rank's timeout (Config::timeout, `timeout` > 0) for what
  // waits from now on: ops that start after the call, the deadline checks
  // of device ops in flight, and communicators split from this one. Safe
  // from any thread. Throws Error(InvalidArgument) naming `timeout`.
  void setTimeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const;

  // Device memory this communicator holds (NCCL's ncclCommMemStats), in
  // bytes: what suspend() frees (its ops' scratch, made as ops need it),
  // and what it keeps (its FIFOs in device memory, the graph FIFOs'
  // counters and captured ops' scratch). All 0 without device buffers.
  struct MemoryStats {
    uint64_t suspendable = 0;
    uint64_t persistent = 0;
    bool suspended = false;
    uint64_t total() const { return suspendable + persistent; }
  };
  MemoryStats memoryStats() const;
  // Collective (NCCL's ncclCommSuspend with NCCL_SUSPEND_MEM): once every
  // op issued before has finished on every rank, frees the device memory
  // that memoryStats() counts as suspendable. Until resume(), every op and
  // collective call is InvalidUsage; abort(), revoke(), setTimeout(),
  // memoryStats() and destruction still work. Throws InvalidUsage when it
  // is suspended already (on every rank).
  void suspend();
  // Collective (ncclCommResume): makes again what suspend() freed, and the
  // communicator usable. Throws InvalidUsage when it is not suspended.
  void resume();

  int rank() const;
  int size() const;
  // The device whose memory this communicator's device buffers live in
  // (Config::device), or -1 when the process has no device.
  int device() const;

  // Collective: registers `bytes` at `buffer` as this rank's part of a
  // window (NCCL's ncclCommWindowRegister). Every rank registers the same
  // kind of memory: host memory, or device memory of this communicator's
  // device.
  //
  // A host window takes one-sided puts (put() below) from every rank; its
  // parts may differ in size. Puts from ranks of this host write into it
  // directly (mapped when it is braid::memAlloc memory, else with
  // process_vm_writev), those from other hosts through a socket that a
  // thread of this rank drains. The first host window sets that up
  // (collective, once per communicator).
  //
  // A device window is mapped by every rank of this host. The
  // memory is this communicator's device's; for ranks of other processes
  // it must be an allocation braid made (ncclMemAlloc), from its start, and
  // every rank registers the same size. From then on a device collective
  // whose buffers lie in windows, at the same offsets on every rank (the
  // symmetric contract), may move its data by direct loads and stores into
  // the peers' windows (all-reduce, all-gather and broadcast, when all
  // ranks are on this host; docs/algorithms-and-tuning.md says which
  // algorithm runs at which size, and BRAID_ALGO can force one). Ranks
  // must agree on which calls use windows. Throws Error(InvalidArgument) naming
  // the argument, or the rank whose window differs, with nothing
  // registered anywhere.
  Window registerWindow(void* buffer, size_t bytes);
  // Collective: waits until the device passed every op issued before (on
  // every rank), and every put into the window issued before has landed,
  // then unmaps the window everywhere; the memory is the caller's again.
  // Throws Error(InvalidArgument) for a window this communicator did not
  // register.
  void deregisterWindow(Window window);
  // Where this process reaches byte `offset` of rank `peer`'s part of device
  // window `window`: its own memory for this rank, the peer's memory as
  // mapped here for a peer of this host that maps it, and nullptr for a
  // peer this rank does not map (another host, a pair staged through host
  // memory) or a host window. A device pointer, for the caller's kernels
  // (NCCL's ncclGetPeerDevicePointer). Throws Error(InvalidArgument) naming
  // the argument: a window this communicator did not register, a peer out
  // of range, an offset at or past the window's end.
  void* peerPointer(Window window, size_t offset, int peer);

  // One-sided (NCCL's ncclPutSignal): writes `count` elements of `type` from
  // `source` into rank `peer`'s part of host window `window`, `offset` bytes
  // in, then raises `signal` there (-1: none). `peer` takes no part; it
  // learns of the put through waitSignals(). Puts and signals from one rank
  // to another land in the order they were issued. Returns a completed
  // Work: `source` may be reused, and the bytes are in the window or on
  // their way (a put to another host). Runs after this rank's ops issued
  // before, outside groups. Throws Error(InvalidArgument) naming the
  // argument (a peer out of range, a window not registered or a device
  // window, bytes past the end of the peer's part, a signal out of
  // range), with nothing written.
  Work put(const void* source, size_t count, DataType type, int peer, Window window, size_t offset,
           int signal, Stream stream = {});
  // Raises `signal` at `peer` with no data (NCCL's ncclSignal), in order
  // with this rank's puts to it. Needs a host window registered first.
  Work signal(int peer, int signal, Stream stream = {});
  // Waits until each of `waits` is met (NCCL's ncclWaitSignal): rank
  // waits[i].peer raised waits[i].signal waits[i].count more times than
  // the counts consumed by earlier waits; then consumes them. The puts
  // before those signals are then in this rank's window. Throws
  // Error(InvalidArgument) naming the wait at fault; Timeout after the
  // communicator's timeout; RemoteError when a peer on another host that
  // it waits for is gone.
  Work waitSignals(const SignalWait* waits, size_t count, Stream stream = {});
  bool valid() const { return impl_ != nullptr; }

  struct Impl;  // opaque outside the library
  Impl* impl() const { return impl_.get(); }

 private:
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace braid
