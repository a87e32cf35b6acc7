// Whether a large op's pieces go to same-host peers by address
// (Connection::postAddress: the receiver copies them with one
// process_vm_readv) or through the FIFO slots (two copies), chosen op by op
// from what recent ops of its kind and about its size took each way.
//
// Which path is faster can change while a job runs. A cache line a core has
// just written crosses to another core several times more slowly when the
// two do not share a cache, and a virtual machine's vCPUs move between
// physical cores: on one VM the same 1 MiB all-reduce ran at 18 GB/s through
// slots and 8.5 by address in one spell, and at 2.1 through slots in the
// next. Calibration at creation (core/calibrate.cc) only gives the first
// guess. After it, every op is timed in its class: its kind (which the
// caller numbers: a collective, in place or not) and its size to a power
// of two. The class keeps a moving average of the seconds per byte of the path it uses,
// and now and then (its third op, then every kTrialPeriod-th) one op tries
// the other path. The class switches to the other path where its time per
// byte is below kSwitchRatio of the chosen one's.
//
// Which ops try the other path depends only on how many ops of the class
// came before, which is the same on every rank (ranks issue collectives in
// the same order), so all ranks try it in the same op and time the same
// thing. The choices themselves follow each rank's own clock and may differ
// between ranks: either path gives the same bytes, so that costs speed
// only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace braid::tuning {

class AddressChoice {
 public:
  // Ops of at least kSmallestOp bytes choose; smaller ones use slots. An
  // op that sends by address sends so its pieces of at least pieceFrom().
  static constexpr size_t kSmallestOp = 128 * 1024;
  static constexpr size_t kSmallestPiece = 64 * 1024;
  static constexpr uint64_t kFirstTrial = 2;  // (the first op of a class is cold: not timed)
  static constexpr uint64_t kTrialPeriod = 64;
  static constexpr double kSwitchRatio = 0.9;

  // Ops of `from` bytes and more start out by address (0: none do).
  explicit AddressChoice(size_t from);

  // Kinds of op: 0 to kKinds - 1.
  static constexpr unsigned kKinds = 16;

  // Whether the next op of `kind` and `bytes` sends by address. Counts the
  // op: call it once per op of its class, in the order ranks issue them.
  bool next(unsigned kind, size_t bytes);
  // That op, which next() answered `byAddress` for, took `seconds`. Returns
  // whether that made its class change paths.
  bool record(unsigned kind, size_t bytes, bool byAddress, double seconds);
  // The path the class of `kind` and `bytes` uses now (no trial, nothing
  // counted).
  bool chosen(unsigned kind, size_t bytes) const;
  // The time per byte that class last knew by address or through slots
  // (0: none).
  double secondsPerByte(unsigned kind, size_t bytes, bool byAddress) const {
    return classes_[kind % kKinds][sizeClass(bytes)].secondsPerByte[byAddress];
  }
  // The first guess's size (0: never), and the smallest piece lent.
  size_t from() const { return from_; }
  size_t pieceFrom() const { return from_ > kSmallestPiece ? from_ : kSmallestPiece; }

 private:
  struct Class {
    uint64_t ops = 0;  // counted by next()
    bool byAddress = false;
    double secondsPerByte[2] = {0, 0};  // [byAddress]; 0: not timed yet
  };
  static size_t sizeClass(size_t bytes);
  Class& classOf(unsigned kind, size_t bytes) { return classes_[kind % kKinds][sizeClass(bytes)]; }
  size_t from_;
  std::array<std::array<Class, 64>, kKinds> classes_{};
};

}  // namespace braid::tuning
