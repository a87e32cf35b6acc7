#include "ddp/buckets.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <sstream>

#include "braid/error.h"
#include "braid/memory.h"
#include "core/errors.h"
#include "reduce/float_convert.h"

namespace braid::ddp::detail {

Flat::Flat(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  data_ = static_cast<std::byte*>(memAlloc(bytes));
  std::memset(data_, 0, bytes);
}

Flat::~Flat() {
  if (data_) memFree(data_);
}

Flat::Flat(Flat&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

Flat& Flat::operator=(Flat&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

std::vector<size_t> reverseOrder(size_t count) {
  std::vector<size_t> order(count);
  std::iota(order.rbegin(), order.rend(), size_t{0});
  return order;
}

Layout makeLayout(const std::vector<Parameter>& parameters, const std::vector<size_t>& order,
                  size_t first, size_t cap) {
  Layout layout;
  layout.place.resize(parameters.size());
  size_t bytes = 0;
  for (size_t i : order) {
    const Parameter& p = parameters[i];
    const size_t size = p.count * dataTypeSize(p.type);
    const size_t limit =
        layout.buckets.size() == 1 ? first : cap;  // filling the first bucket, or a later one
    bool fresh = layout.buckets.empty() || layout.buckets.back().type != p.type ||
                 (bytes > 0 && bytes + size > limit);
    if (fresh) {
      layout.buckets.emplace_back();
      layout.buckets.back().type = p.type;
      bytes = 0;
    }
    Layout::Bucket& bucket = layout.buckets.back();
    layout.place[i] = {layout.buckets.size() - 1, bucket.count};
    bucket.params.push_back(i);
    bucket.offsets.push_back(bucket.count);
    bucket.count += p.count;
    bytes += size;
  }
  return layout;
}

namespace {

// One line per parameter: what every rank must agree on.
std::string describe(const std::vector<Parameter>& parameters) {
  std::string text;
  for (const Parameter& p : parameters)
    text += format("%s %zu %s\n", p.name.c_str(), p.count, dataTypeName(p.type));
  return text;
}

uint64_t hashOf(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : text) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream stream(text);
  for (std::string line; std::getline(stream, line);) out.push_back(line);
  return out;
}

}  // namespace

void checkSameParameters(Communicator& comm, const std::vector<Parameter>& parameters,
                         const char* who) {
  const int n = comm.size(), me = comm.rank();
  const std::string mine = describe(parameters);
  const uint64_t hash = hashOf(mine);
  std::vector<uint64_t> hashes(static_cast<size_t>(n));
  comm.allGather(&hash, hashes.data(), 1, DataType::Uint64);
  if (std::all_of(hashes.begin(), hashes.end(), [&](uint64_t h) { return h == hashes[0]; })) return;
  // Someone differs: rank 0's list to everyone, and each rank's first
  // difference from it to everyone.
  uint64_t length = mine.size();
  comm.broadcast(&length, &length, 1, DataType::Uint64, 0);
  std::string reference(length, '\0');
  comm.broadcast(mine.data(), reference.data(), length, DataType::Uint8, 0);
  const std::vector<std::string> theirs = lines(reference), ours = lines(mine);
  int64_t differs = -1;
  for (size_t i = 0; i < std::max(theirs.size(), ours.size()) && differs < 0; ++i)
    if (i >= theirs.size() || i >= ours.size() || theirs[i] != ours[i])
      differs = static_cast<int64_t>(i);
  std::vector<int64_t> firsts(static_cast<size_t>(n));
  comm.allGather(&differs, firsts.data(), 1, DataType::Int64);
  std::string message =
      format("braid rank %d: %s: ranks registered different parameters:", me, who);
  for (int r = 0; r < n; ++r) {
    const int64_t i = firsts[static_cast<size_t>(r)];
    if (i < 0) continue;
    const size_t at = static_cast<size_t>(i);
    message += format(" rank %d differs from rank 0 at parameter %lld (rank 0 has %s", r,
                      static_cast<long long>(i),
                      at < theirs.size() ? ("'" + theirs[at] + "'").c_str() : "none");
    if (r == me)
      message +=
          format(", this rank %s", at < ours.size() ? ("'" + ours[at] + "'").c_str() : "none");
    message += ");";
  }
  throw Error(ErrorCode::InvalidUsage, message);
}

void broadcastValues(Communicator& comm, const std::vector<Parameter>& parameters, int root,
                     const char* who) {
  if (root < 0 || root >= comm.size())
    throw Error(ErrorCode::InvalidArgument,
                format("braid rank %d: %s: argument 'root' is %d, not in [0, %d)", comm.rank(), who,
                       root, comm.size()));
  comm.groupStart();
  try {
    for (const Parameter& p : parameters)
      if (p.value) comm.broadcast(p.value, p.value, p.count, p.type, root);
  } catch (...) {
    comm.groupEnd();
    throw;
  }
  comm.groupEnd();
}

void checkMark(const std::vector<Parameter>& parameters, const std::vector<char>& ready, size_t i,
               const char* who) {
  if (i >= parameters.size())
    throw Error(ErrorCode::InvalidArgument,
                format("braid: %s::markReady: argument 'i' is %zu, there are %zu parameters", who,
                       i, parameters.size()));
  if (ready[i])
    throw Error(ErrorCode::InvalidUsage,
                format("braid: %s::markReady: parameter %zu ('%s') was already marked ready in "
                       "this step",
                       who, i, parameters[i].name.c_str()));
}

void checkAllMarked(Communicator& comm, const std::vector<Parameter>& parameters,
                    const std::vector<size_t>& missing, const char* who) {
  int32_t count = static_cast<int32_t>(missing.size()), total = 0;
  comm.allReduce(&count, &total, 1, DataType::Int32, ReduceOp::Sum);
  if (total == 0) return;
  std::vector<uint8_t> mine(parameters.size(), 0), any(parameters.size(), 0);
  for (size_t i : missing) mine[i] = 1;
  comm.allReduce(mine.data(), any.data(), mine.size(), DataType::Uint8, ReduceOp::Max);
  std::string names;
  for (size_t i = 0; i < any.size(); ++i)
    if (any[i]) names += (names.empty() ? "'" : ", '") + parameters[i].name + "'";
  throw Error(ErrorCode::InvalidUsage,
              format("braid rank %d: %s.finish: %d parameter gradient(s) were never marked ready "
                     "on some rank (%s; this rank missed %d); set Options::findUnusedParameters "
                     "to count them as zero",
                     comm.rank(), who, total, names.c_str(), count));
}

namespace {

namespace fc = braid::reduce::detail;

float load(const void* data, size_t i, DataType type) {
  switch (type) {
    case DataType::Float16:
      return fc::halfToFloatInline(static_cast<const uint16_t*>(data)[i]);
    case DataType::BFloat16:
      return fc::bf16ToFloatInline(static_cast<const uint16_t*>(data)[i]);
    case DataType::Float8E4M3:
      return fc::fp8e4m3ToFloatInline(static_cast<const uint8_t*>(data)[i]);
    case DataType::Float8E5M2:
      return fc::fp8e5m2ToFloatInline(static_cast<const uint8_t*>(data)[i]);
    default:
      return static_cast<const float*>(data)[i];
  }
}

void store(void* data, size_t i, DataType type, float value) {
  switch (type) {
    case DataType::Float16:
      static_cast<uint16_t*>(data)[i] = fc::floatToHalfInline(value);
      return;
    case DataType::BFloat16:
      static_cast<uint16_t*>(data)[i] = fc::floatToBf16Inline(value);
      return;
    case DataType::Float8E4M3:
      static_cast<uint8_t*>(data)[i] = fc::floatToFp8e4m3Inline(value);
      return;
    case DataType::Float8E5M2:
      static_cast<uint8_t*>(data)[i] = fc::floatToFp8e5m2Inline(value);
      return;
    default:
      static_cast<float*>(data)[i] = value;
  }
}

template <typename T>
void scaleAs(void* data, size_t count, double factor) {
  T* values = static_cast<T*>(data);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<T>(values[i] * factor);
}

}  // namespace

void scale(void* data, size_t count, DataType type, double factor) {
  switch (type) {
    case DataType::Float32:
      return scaleAs<float>(data, count, factor);
    case DataType::Float64:
      return scaleAs<double>(data, count, factor);
    case DataType::Int8:
      return scaleAs<int8_t>(data, count, factor);
    case DataType::Uint8:
      return scaleAs<uint8_t>(data, count, factor);
    case DataType::Int32:
      return scaleAs<int32_t>(data, count, factor);
    case DataType::Uint32:
      return scaleAs<uint32_t>(data, count, factor);
    case DataType::Int64:
      return scaleAs<int64_t>(data, count, factor);
    case DataType::Uint64:
      return scaleAs<uint64_t>(data, count, factor);
    default: {
      const auto f = static_cast<float>(factor);
      for (size_t i = 0; i < count; ++i) store(data, i, type, load(data, i, type) * f);
    }
  }
}

void convert(const void* from, DataType fromType, void* to, DataType toType, size_t count) {
  for (size_t i = 0; i < count; ++i) store(to, i, toType, load(from, i, fromType));
}

}  // namespace braid::ddp::detail
