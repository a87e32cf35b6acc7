// How an op's pieces cross to same-host peers, chosen op by op from
// what recent ops of its kind and about its size took each way:
// - Slots: the sender copies each piece into the peer's FIFO slot with
//   ordinary stores, the receiver reads it from there (two copies, the
//   lines going from one core's cache to the other's);
// - StreamedSlots: the same with streaming stores into the slot
//   (reduce/streaming.h), so the lines go through memory instead;
// - Address: the receiver copies the piece from the sender's memory with
//   one process_vm_readv (Connection::postAddress), where the peer may.
//
// Which is fastest can change while a job runs. A cache line one core has
// just written crosses to another core several times more slowly when the
// two do not share a cache, and a virtual machine's vCPUs move between
// physical cores. On one VM a 1 MiB all-reduce ran at 17 to 18 GB/s
// through slots in one spell and 2.1 in the next, when streamed slots ran
// at 10 to 11 and addresses at 8.5 in both; a 32 KiB one took 18 to 21 us
// through slots in such a spell, 5 to 7 streamed. Calibration at creation
// (core/calibrate.cc) only gives the first guess. After it, ops are timed
// in their class: its kind (which the caller numbers: a collective, in
// place or not) and its size to a power of two. The class keeps the
// median of the last three seconds per byte of the path it uses (one op
// that something else slowed, an interrupt or a page fault, moves nothing;
// two in a row do), and the last one of the others. From its third op
// it tries the paths other than the first guess, and then, every
// trialPeriod() ops, another path in turn; a trial takes two ops and times
// the second, as an op pays for the state its predecessor's path left in
// the caches. The class moves to the path whose last time per byte is lowest
// where that is below kSwitchRatio of its own path's.
//
// Which ops try another path depends only on how many ops of the class
// came before, which is the same on every rank (ranks issue collectives in
// the same order), so all ranks try it in the same op and time the same
// thing. The choices themselves follow each rank's own clock and may differ
// between ranks: every path gives the same bytes, so that costs speed only.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

namespace braid::tuning {

enum class CopyPath : uint8_t { Slots, StreamedSlots, Address };
inline constexpr size_t kCopyPaths = 3;
const char* copyPathName(CopyPath path);

class CopyChoice {
 public:
  // Ops of at least kSmallestOp bytes choose; smaller ones use slots (at
  // 2 KiB, choosing measured slower than slots alone in this VM's usual
  // spells). Addresses are a choice from kSmallestAddressOp: an op that
  // sends by address sends so its pieces of at least pieceFrom(), and a
  // smaller op has none that big.
  static constexpr size_t kSmallestOp = 4 * 1024;
  static constexpr size_t kSmallestAddressOp = 128 * 1024;
  static constexpr size_t kSmallestPiece = 64 * 1024;
  // A clock read or a trial weighs more in a small op, so classes below
  // kSparseBelow time only one op in kSampleEvery of their own path (two
  // clock reads are a tenth of a 4 KiB op), and try another path
  // kSparseBelow / size times less often (trialPeriod).
  static constexpr size_t kSparseBelow = 128 * 1024;
  static constexpr uint64_t kSampleEvery = 8;
  static constexpr uint64_t kFirstTrial = 2;  // (the first op of a class is cold: not timed)
  // (Each trial takes two ops, the first not timed.) From kSparseBelow:
  static constexpr uint64_t kTrialPeriod = 64;
  static constexpr double kSwitchRatio = 0.9;
  // Kinds of op: 0 to kKinds - 1.
  static constexpr unsigned kKinds = 16;

  // `addresses`: whether the Address path is there at all. Ops of
  // `addressFrom` bytes and more start out by address (0: none do), the
  // others through slots.
  CopyChoice(bool addresses, size_t addressFrom);

  // The path of the next op of `kind` and `bytes`. Counts the op: call it
  // once per op of its class, in the order ranks issue them.
  CopyPath next(unsigned kind, size_t bytes);
  // The ops from one trial of a class of `bytes` to its next.
  static uint64_t trialPeriod(size_t bytes) {
    return kTrialPeriod * std::max<uint64_t>(1, kSparseBelow >> sizeClass(bytes));
  }
  // Whether the op next() just counted in that class is to be timed.
  bool timesLast(unsigned kind, size_t bytes) const {
    return bytes >= kSmallestOp && classes_[kind % kKinds][sizeClass(bytes)].timed;
  }
  // That op, which next() gave `path`, took `seconds`. Returns whether that
  // made its class change paths.
  bool record(unsigned kind, size_t bytes, CopyPath path, double seconds);
  // The path the class of `kind` and `bytes` uses now (no trial, nothing
  // counted).
  CopyPath chosen(unsigned kind, size_t bytes) const;
  // The time per byte that class last knew for `path` (0: none).
  double secondsPerByte(unsigned kind, size_t bytes, CopyPath path) const {
    return classes_[kind % kKinds][sizeClass(bytes)].secondsPerByte[static_cast<size_t>(path)];
  }
  bool addresses() const { return addresses_; }
  // The first guess's size for addresses (0: never), and the smallest
  // piece lent.
  size_t addressFrom() const { return addressFrom_; }
  size_t pieceFrom() const { return addressFrom_ > kSmallestPiece ? addressFrom_ : kSmallestPiece; }

 private:
  struct Class {
    uint64_t ops = 0;    // counted by next()
    bool timed = false;  // whether next() said to time the op it counted last
    CopyPath path = CopyPath::Slots;
    double secondsPerByte[kCopyPaths] = {0, 0, 0};  // by path; 0: not timed yet
    double recent[3] = {0, 0, 0};                   // the last three times of `path`, per byte
    uint8_t newest = 0;                             // recent's newest
  };
  static size_t sizeClass(size_t bytes) {  // log2, rounded down
    return bytes == 0 ? 0 : static_cast<size_t>(63 - __builtin_clzll(bytes));
  }
  Class& classOf(unsigned kind, size_t bytes) { return classes_[kind % kKinds][sizeClass(bytes)]; }
  // The path of trial number `trial` in a class of `bytes` on `path`: the
  // others in turn.
  CopyPath trialPath(CopyPath path, uint64_t trial, size_t bytes) const;
  // The path a class of `bytes` starts on.
  CopyPath firstGuess(size_t bytes) const;
  bool addresses_;
  size_t addressFrom_;
  std::array<std::array<Class, 64>, kKinds> classes_{};
};

}  // namespace braid::tuning
