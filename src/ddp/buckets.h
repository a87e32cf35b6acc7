// What GradSync and ShardedSync share: the bucket layout, the check that
// every rank registered the same parameters, element conversions for
// averaging and compression, and the end-of-step check for parameters that
// were never marked ready.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "braid/communicator.h"
#include "braid/ddp.h"

namespace braid::ddp::detail {

// A flat buffer of braid::memAlloc memory (same-host peers read it in
// place), zeroed; null for 0 bytes.
class Flat {
 public:
  Flat() = default;
  explicit Flat(size_t bytes);
  ~Flat();
  Flat(Flat&& other) noexcept;
  Flat& operator=(Flat&& other) noexcept;
  std::byte* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  std::byte* data_ = nullptr;
  size_t bytes_ = 0;
};

// Parameters grouped into buckets in `order` (a permutation of the
// parameter indices, the order they are expected to become ready): a new
// bucket starts when the type changes or when the next parameter would
// take the bucket past its limit (the first bucket's `first`, then `cap`
// bytes); a parameter is never split, so one larger than the limit gets a
// bucket of its own.
struct Layout {
  struct Bucket {
    std::vector<size_t> params;   // in bucket order
    std::vector<size_t> offsets;  // each one's first element in the bucket
    size_t count = 0;             // elements
    DataType type = DataType::Float32;
  };
  std::vector<Bucket> buckets;
  std::vector<std::pair<size_t, size_t>> place;  // per parameter: (bucket, first element)
};
Layout makeLayout(const std::vector<Parameter>& parameters, const std::vector<size_t>& order,
                  size_t first, size_t cap);
// The order before anything was observed: the reverse of registration (the
// backward pass produces the last layers' gradients first).
std::vector<size_t> reverseOrder(size_t count);

// Collective: every rank registered the same names, counts and types in the
// same order; otherwise InvalidUsage on every rank naming each rank that
// differs from rank 0 and its first differing parameter.
void checkSameParameters(Communicator& comm, const std::vector<Parameter>& parameters,
                         const char* who);

// Collective: rank `root`'s values of every parameter that has one.
void broadcastValues(Communicator& comm, const std::vector<Parameter>& parameters, int root,
                     const char* who);

// markReady's checks: InvalidArgument naming `who` for an index out of
// range, InvalidUsage for a parameter already marked in this step.
void checkMark(const std::vector<Parameter>& parameters, const std::vector<char>& ready, size_t i,
               const char* who);

// Collective, at the end of a step: `missing` lists the parameters this rank
// never marked ready. When any rank missed one, every rank throws
// InvalidUsage naming them all.
void checkAllMarked(Communicator& comm, const std::vector<Parameter>& parameters,
                    const std::vector<size_t>& missing, const char* who);

// Elementwise: data[i] *= factor, in the type's arithmetic (narrow floats in
// float, rounded once; integers truncate).
void scale(void* data, size_t count, DataType type, double factor);
// Converts `count` elements between types (fp32 <-> fp16/bf16, fp16/bf16 -> fp32).
void convert(const void* from, DataType fromType, void* to, DataType toType, size_t count);

}  // namespace braid::ddp::detail
