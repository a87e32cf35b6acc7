// Plans: what one rank does for one collective, as an ordered list of
// primitive steps. A planner (planners.h) is a pure function of the
// collective's shape; it never touches a transport, so every algorithm can
// be checked without processes. The executor (src/exec) runs plans over
// connections.
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

}  // namespace braid::algo
