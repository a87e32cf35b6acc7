// Plans: what one rank does for one collective, as an ordered list of
// primitive steps. A planner is a pure function of the collective's shape; it
// never touches a transport, so every algorithm can be checked without
// processes. The executor (src/exec) runs plans over connections.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace braid::algo {

// The buffers a step reads or writes: the user's two, and a scratch area
// of kScratchBytes (or the plan's scratchBytes, if more) that the executor
// gives each running op.
enum class Buffer : uint8_t { Input, Output, Scratch };
inline constexpr size_t kScratchBytes = 64 * 1024;

// The primitives. "Recv" reads the next message from recvPeer; "Send" posts
// one to sendPeer; "Reduce" combines the received data with `src` using the
// op's kernel; "Copy" writes `dst`. A step moves `count` elements, streamed
// through the connection in slot-sized pieces, so a step that receives and
// sends forwards each piece as soon as it arrived.
enum class StepKind : uint8_t {
  Send,                // src -> peer
  Recv,                // peer -> dst
  RecvReduceSend,      // (peer op src) -> peer
  RecvReduceCopy,      // (peer op src) -> dst
  RecvReduceCopySend,  // (peer op src) -> dst and -> peer
  RecvCopySend,        // peer -> dst and -> peer
  Copy,                // src -> dst, locally
  Reduce,              // (dst op src) -> dst, locally
  // Direct steps, for buffers every rank maps at the same offsets
  // (Shape::mapped): the data moves by loads and stores into peers'
  // buffers, never through a connection, and Signals order the ranks.
  Signal,      // an empty message to sendPeer, and one from recvPeer
  ReduceFrom,  // (every rank's src, combined in rank order) -> dst
  CopyTo,      // src -> sendPeer's dst
  CopyFrom,    // recvPeer's src -> dst
};

// Whether a step of `kind` reads a message from recvPeer / posts one to
// sendPeer.
inline bool receives(StepKind kind) {
  return kind == StepKind::Recv || kind == StepKind::RecvReduceSend ||
         kind == StepKind::RecvReduceCopy || kind == StepKind::RecvReduceCopySend ||
         kind == StepKind::RecvCopySend || kind == StepKind::Signal;
}
inline bool sends(StepKind kind) {
  return kind == StepKind::Send || kind == StepKind::RecvReduceSend ||
         kind == StepKind::RecvReduceCopySend || kind == StepKind::RecvCopySend ||
         kind == StepKind::Signal;
}
// Whether a step of `kind` touches a peer's buffer directly.
inline bool direct(StepKind kind) {
  return kind == StepKind::ReduceFrom || kind == StepKind::CopyTo || kind == StepKind::CopyFrom;
}

struct Step {
  StepKind kind = StepKind::Copy;
  // The step produces final values: apply the op's finalize (Avg divides).
  bool finalize = false;
  // What the step sends from Output (a Send's src, or the dst it wrote) is
  // never written again by this plan, so a transport may let the peer read
  // it in place (see Connection::postReference) instead of a copy.
  bool settled = false;
  int sendPeer = -1;
  int recvPeer = -1;
  Buffer src = Buffer::Input;
  Buffer dst = Buffer::Output;
  size_t srcOffset = 0;  // elements
  size_t dstOffset = 0;  // elements
  size_t count = 0;      // elements; never 0 in a plan but for a Signal
};

struct Plan {
  std::vector<Step> steps;
  // Bytes of scratch the steps use, when more than kScratchBytes.
  size_t scratchBytes = 0;
  // It has direct steps (for mapped buffers), ordered by Signals.
  bool mapped = false;
};

// Everything a planner may depend on. Plans are cached by this shape.
struct Shape {
  int nranks = 1;
  int rank = 0;
  size_t count = 0;       // elements: per rank for all-gather and reduce-scatter
  int root = 0;           // broadcast, reduce
  int peer = -1;          // send, recv
  size_t chunkElems = 1;  // most elements one step moves
  size_t alignElems = 1;  // chunk boundaries fall on multiples of this
  size_t elemSize = 1;    // bytes per element
  // Every rank's Input and Output are mapped by every other rank, at the
  // same offsets on all of them (device buffers in a registered window):
  // the algorithms that have direct plans use them.
  bool mapped = false;
  // Ranks per host, when every host has this many and ranks are numbered
  // host by host (ranks 0..L-1 on the first host, L..2L-1 on the next, as
  // srun, mpirun and torchrun number them); 0 when the layout is not known
  // or not like that. The hierarchical algorithms need it.
  int localRanks = 0;
};

// The most ranks a direct ReduceFrom combines (the device's n-input
// reduction kernel).
inline constexpr int kMaxDirectRanks = 8;

// Ring all-reduce: reduce-scatter then all-gather around the ring, in rounds
// of nranks chunks. 2(n-1) steps per round; each rank sends and receives
// 2(n-1)/n * S bytes for an S-byte buffer.
Plan ringAllReduce(const Shape& shape);

// One-shot all-reduce, for small buffers: every rank sends its whole input
// to every other rank, then adds the n inputs in rank order, so every rank
// computes bitwise the same result. One hop of latency instead of 2(n-1);
// each rank sends and receives (n-1) * S bytes. REQUIRES: S <= kScratchBytes.
Plan oneShotAllReduce(const Shape& shape);

// One-shot on mapped buffers: every rank reads the n inputs where they are
// and combines them in rank order in one kernel (bitwise the same result
// everywhere). REQUIRES: shape.mapped, nranks <= kMaxDirectRanks.
Plan oneShotMappedAllReduce(const Shape& shape);

// Two-shot all-reduce on mapped buffers: rank r reduces part r of every
// rank's input into its output (a reduce-scatter by direct reads, in rank
// order), then writes that part into every other rank's output (an
// all-gather by direct writes). Each rank reads (n-1)/n * S bytes from its
// peers and writes as much into them; every part is combined in rank
// order, so the result is bitwise one-shot's. REQUIRES: shape.mapped,
// nranks <= kMaxDirectRanks.
Plan twoShotAllReduce(const Shape& shape);

// One-shot all-gather and broadcast on mapped buffers: each rank writes
// its input into every peer's output / reads the root's output.
// REQUIRES: shape.mapped.
Plan oneShotAllGather(const Shape& shape);
Plan oneShotBroadcast(const Shape& shape);

// Ring all-gather: n-1 steps per round; each rank sends and receives
// (n-1) * S bytes for an S-byte input.
Plan ringAllGather(const Shape& shape);

// Ring reduce-scatter: n-1 steps per round; each rank sends and receives
// (n-1) * S bytes for an S-byte output.
Plan ringReduceScatter(const Shape& shape);

// Recursive-doubling all-reduce (folded onto a power of two): log2(p)
// exchanges of the whole buffer. See recursive_doubling_all_reduce.cc.
Plan recursiveDoublingAllReduce(const Shape& shape);

// Rabenseifner all-reduce: recursive-halving reduce-scatter, then
// recursive-doubling all-gather, folded onto a power of two.
Plan rabenseifnerAllReduce(const Shape& shape);

// Double-binary-tree all-reduce: two complementary trees, each reducing and
// then broadcasting half of the buffer.
Plan treeAllReduce(const Shape& shape);

// Binomial-tree broadcast and reduce: ceil(log2 n) hops.
Plan binomialBroadcast(const Shape& shape);
Plan binomialReduce(const Shape& shape);

// Scatter + all-gather broadcast: the root scatters n parts, the ring
// all-gathers them. For large buffers.
Plan scatterAllGatherBroadcast(const Shape& shape);

// Bruck all-gather: ceil(log2 n) rounds at any rank count.
Plan bruckAllGather(const Shape& shape);

// Recursive-halving reduce-scatter. REQUIRES: nranks is a power of two.
Plan recursiveHalvingReduceScatter(const Shape& shape);

// Pipelined chain broadcast from root around the ring: one step per chunk;
// every rank but the last in the chain sends S bytes, every rank but the
// root receives S bytes. Time ~ (n - 1 + chunks) chunk-hops.
Plan chainBroadcast(const Shape& shape);

// Pipelined chain reduce ending at root: one step per chunk; every rank but
// the root sends S bytes, every rank but the first receives S bytes.
Plan chainReduce(const Shape& shape);

// The hierarchical algorithms, for ranks spread over hosts (L =
// Shape::localRanks ranks on each of H = n / L hosts): the links within a
// host (shm) carry most of the bytes, and the H rings across hosts, one per
// local rank, carry a 1/L share each, so every local rank's network link
// works at once. REQUIRES: L >= 2 and H >= 2 (catalog's applies()).
//
// All-reduce: reduce-scatter within the host, all-reduce of each shard
// across hosts, all-gather within the host. Per rank 2(L-1)/L * S bytes
// within the host and 2(H-1)/H * S/L across.
Plan hierarchicalAllReduce(const Shape& shape);
// All-gather: the blocks of the ranks with local number l, gathered across
// hosts, then each rank's H blocks passed around the host. Per rank
// (H-1) * S bytes across hosts and (L-1) * H * S within, for S-byte inputs.
Plan hierarchicalAllGather(const Shape& shape);
// Reduce-scatter: within the host, each rank gathers the host's sums of the
// H blocks it forwards (in scratch), then the ring across hosts reduces
// them to its own. Per rank (L-1) * H * S bytes within the host and
// (H-1) * S across, for S-byte outputs.
Plan hierarchicalReduceScatter(const Shape& shape);
// Broadcast: the root hands part l of L to local rank l, part l goes down
// the chain of hosts among the ranks with local number l, and each host
// all-gathers the parts. Per rank S/L bytes across hosts.
Plan hierarchicalBroadcast(const Shape& shape);

// Point-to-point: one step of `count` elements to or from `peer`.
Plan sendTo(const Shape& shape);
Plan recvFrom(const Shape& shape);

}  // namespace braid::algo
