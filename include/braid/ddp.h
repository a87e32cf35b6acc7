// Data-parallel gradient synchronization for a trainer that owns its model.
//
// Each rank runs the same model on its own batch; after the backward pass
// every rank must hold the average of all ranks' gradients. GradSync groups
// the gradients into flat buckets and all-reduces each bucket as soon as its
// gradients are ready, on the communicator's progress thread, so that
// communication overlaps the rest of the backward pass:
//
//   braid::ddp::GradSync sync(comm, {{"fc1.weight", g1, n1, DataType::Float32}, ...});
//   for (each step) {
//     forward();
//     backward();          // calls sync.markReady(i) as gradient i is done
//     sync.finish();       // waits; every gradient now holds the average
//     optimizerStep();
//   }
//
// Every rank must register the same parameters (names, counts, types) in the
// same order; the constructor checks it and names the first difference.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "braid/communicator.h"
#include "braid/types.h"

namespace braid::ddp {

// A parameter whose gradient is synchronized.
struct Parameter {
  std::string name;
  void* gradient = nullptr;  // `count` elements of `type`, written by the backward pass
  size_t count = 0;
  DataType type = DataType::Float32;
  // The parameter's values, for broadcastParameters(); may be null.
  void* value = nullptr;
};

// How the sum over ranks becomes an average.
enum class Averaging {
  Avg,        // the all-reduce's Avg operator. Default.
  PreDivide,  // each rank divides its gradient by the rank count, then a sum
  Sum,        // no averaging: the plain sum
};

// What a bucket travels as.
enum class Compression {
  None,      // its own type. Default.
  Float16,   // fp32 gradients cast to fp16 for the all-reduce and back
  BFloat16,  // ... to bf16
};

struct Options {
  // Bucket sizes: the first bucket (the last layers' gradients, ready
  // first) is small, so communication starts early. Defaults: 1 MiB, 25 MiB.
  size_t firstBucketBytes = size_t{1} << 20;
  size_t bucketCapBytes = size_t{25} << 20;
  // The gradients live inside the flat bucket buffers (no copy in or out):
  // the backward pass writes gradient i at gradient(i), not at
  // Parameter::gradient. The buckets are rebuilt once, after the first
  // step, so gradient(i) moves then. Default: false (gradients are copied
  // into the bucket when marked ready and back when the bucket is done).
  bool gradientsAsBucketViews = false;
  Averaging averaging = Averaging::Avg;
  // fp16/bf16 gradients are reduced in fp32 (converted, reduced, rounded
  // once). Default: false (reduced in their own type, accumulating in fp32
  // per step of the algorithm).
  bool fp32Accumulation = false;
  // For fp32 gradients: the all-reduce runs on fp16 or bf16 copies (half
  // the bytes; divided by the rank count first, so the sum stays in range).
  Compression compression = Compression::None;
  // A parameter never marked ready before finish() counts as a zero
  // gradient on that rank. Default: false (finish() fails on every rank
  // with InvalidUsage naming the parameters).
  bool findUnusedParameters = false;
};

class GradSync {
 public:
  // Collective: every rank constructs it with the same parameters (checked:
  // a difference is InvalidUsage on every rank naming the first one).
  // REQUIRES: `comm` outlives this object.
  GradSync(Communicator& comm, std::vector<Parameter> parameters, Options options = {});
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Where the backward pass writes gradient `i`: Parameter::gradient, or
  // with gradientsAsBucketViews its place in a bucket (which changes once,
  // when the buckets are rebuilt after the first synced step).
  void* gradient(size_t i) const;

  // Gradient `i` is final for this step. A bucket whose gradients are all
  // ready starts its all-reduce, once every bucket before it has started.
  // InvalidArgument for an index out of range; InvalidUsage for a second
  // mark in one step.
  void markReady(size_t i);

  // Ends the step: starts what has not started (parameters never marked
  // are zeros with findUnusedParameters, else an error), waits, and leaves
  // the averaged gradients in place. Inside a noSync() scope it only resets
  // the step: nothing is communicated.
  void finish();

  // Gradient accumulation: while the returned object lives, steps skip
  // communication (the backward pass keeps adding into the gradients); the
  // first step after it reduces the accumulated gradients.
  class NoSync {
   public:
    explicit NoSync(GradSync& sync);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    GradSync& sync_;
  };
  NoSync noSync() { return NoSync(*this); }

  // Collective: copies every parameter's value from rank `root` (for the
  // start of training). Parameters without a value pointer are skipped.
  void broadcastParameters(int root);

  // The buckets, each a list of parameter indices in bucket order.
  std::vector<std::vector<size_t>> buckets() const;

  struct State;  // opaque outside the library

 private:
  std::unique_ptr<State> state_;
};

// ZeRO stage 1: each rank keeps the optimizer state of its shard only.
// finish() reduce-scatters the gradients so that each rank holds the
// averaged gradient of its shard; after the optimizer updated that shard,
// allGatherParameters() gives every rank the whole updated parameters.
// Buckets are padded to a multiple of the rank count, and each bucket's
// shard r goes to rank r.
class ShardedSync {
 public:
  // As GradSync; every parameter needs a value pointer.
  ShardedSync(Communicator& comm, std::vector<Parameter> parameters, Options options = {});
  ~ShardedSync();
  ShardedSync(const ShardedSync&) = delete;
  ShardedSync& operator=(const ShardedSync&) = delete;

  void markReady(size_t i);
  // Waits for the reduce-scatters; then shard(b) holds bucket b's averaged
  // gradients for this rank's part.
  void finish();

  // This rank's part of bucket `b`: `count` elements of the bucket's type
  // starting at element `offset` of the bucket's flattened parameters
  // (parameter i occupies [start(i), start(i) + count_i) in it). `gradient`
  // holds the averaged gradient after finish(); `value` is this rank's copy
  // of those parameter values, which the optimizer updates.
  struct Shard {
    size_t bucket;
    size_t offset;
    size_t count;
    DataType type;
    void* gradient;
    void* value;
  };
  std::vector<Shard> shards() const;
  // Parameter `i`'s bucket and first element in it.
  std::pair<size_t, size_t> placeOf(size_t i) const;

  // Collective: every rank's updated shard values go to every rank's
  // Parameter::value.
  void allGatherParameters();

  void broadcastParameters(int root);
  std::vector<std::vector<size_t>> buckets() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace braid::ddp
