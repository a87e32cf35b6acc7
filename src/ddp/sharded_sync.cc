// ShardedSync (ZeRO stage 1): buckets reduce-scattered, so each rank holds
// the averaged gradients of its shard, and parameters all-gathered after the
// optimizer updated the shards.
//
// Each bucket is padded to a multiple of the rank count n; its shard r is
// elements [r * padded / n, (r + 1) * padded / n). Buckets start in bucket
// order as their gradients become ready, as in GradSync; the layout stays
// in reverse registration order (the shards, and the optimizer state that
// follows them, must not move).
#include <cstring>

#include "braid/ddp.h"
#include "braid/error.h"
#include "core/errors.h"
#include "ddp/buckets.h"
#include "reduce/streaming.h"

namespace braid::ddp {

using detail::Flat;
using detail::Layout;

namespace {

struct Bucket {
  Layout::Bucket layout;
  size_t padded = 0;   // elements, a multiple of the rank count
  Flat gradients;      // padded, flat
  Flat values;         // padded, flat: the all-gathered parameters
  Flat shardGradient;  // padded / n: this rank's averaged gradients
  size_t pending = 0;
  Work work;
};

}  // namespace

struct ShardedSync::State {
  Communicator& comm;
  std::vector<Parameter> params;
  Options options;
  std::vector<Bucket> buckets;
  std::vector<std::pair<size_t, size_t>> place;
  std::vector<char> ready;
  size_t nextStart = 0;

  State(Communicator& c, std::vector<Parameter> p, Options o)
      : comm(c), params(std::move(p)), options(o) {}

  size_t shardOf(const Bucket& bucket) const { return bucket.padded / comm.size(); }

  std::byte* valueShard(const Bucket& bucket) const {
    return bucket.values.data() +
           static_cast<size_t>(comm.rank()) * shardOf(bucket) * dataTypeSize(bucket.layout.type);
  }

  void resetStep() {
    ready.assign(params.size(), 0);
    for (Bucket& bucket : buckets) {
      bucket.pending = bucket.layout.params.size();
      bucket.work = Work();
    }
    nextStart = 0;
  }

  void start(Bucket& bucket) {
    const DataType type = bucket.layout.type;
    if (bucket.padded == 0) return;
    ReduceOp op = ReduceOp::Sum;
    if (options.averaging == Averaging::Avg) op = ReduceOp::Avg;
    if (options.averaging == Averaging::PreDivide)
      detail::scale(bucket.gradients.data(), bucket.padded, type, 1.0 / comm.size());
    bucket.work = comm.reduceScatter(bucket.gradients.data(), bucket.shardGradient.data(),
                                     shardOf(bucket), type, op, Stream::async());
  }

  void startReady() {
    while (nextStart < buckets.size() && buckets[nextStart].pending == 0)
      start(buckets[nextStart++]);
  }

  std::byte* gradientSlot(size_t i) const {
    const Bucket& bucket = buckets[place[i].first];
    return bucket.gradients.data() + place[i].second * dataTypeSize(bucket.layout.type);
  }
};

ShardedSync::ShardedSync(Communicator& comm, std::vector<Parameter> parameters, Options options) {
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Parameter& p = parameters[i];
    if (!isValid(p.type))
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: ShardedSync: parameter %zu ('%s') has an invalid type", i,
                         p.name.c_str()));
    if (p.count > 0 && (!p.gradient || !p.value))
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: ShardedSync: parameter %zu ('%s') needs a gradient and a value "
                         "pointer",
                         i, p.name.c_str()));
  }
  if (options.gradientsAsBucketViews || options.fp32Accumulation ||
      options.compression != Compression::None)
    throw Error(ErrorCode::InvalidArgument,
                "braid: ShardedSync: gradientsAsBucketViews, fp32Accumulation and compression "
                "are GradSync options; ShardedSync reduces each bucket in its own type");
  if (options.firstBucketBytes == 0 || options.bucketCapBytes == 0)
    throw Error(
        ErrorCode::InvalidArgument,
        "braid: ShardedSync: Options::firstBucketBytes and bucketCapBytes must be positive");
  detail::checkSameParameters(comm, parameters, "ShardedSync");
  state_ = std::make_unique<State>(comm, std::move(parameters), options);
  State& s = *state_;
  Layout layout = detail::makeLayout(s.params, detail::reverseOrder(s.params.size()),
                                     options.firstBucketBytes, options.bucketCapBytes);
  const size_t n = static_cast<size_t>(comm.size());
  for (Layout::Bucket& l : layout.buckets) {
    Bucket bucket;
    bucket.layout = std::move(l);
    bucket.padded = (bucket.layout.count + n - 1) / n * n;
    const size_t size = dataTypeSize(bucket.layout.type);
    bucket.gradients = Flat(bucket.padded * size);
    bucket.values = Flat(bucket.padded * size);
    bucket.shardGradient = Flat(bucket.padded / n * size);
    // Every rank starts from its own values; broadcastParameters() makes
    // them the same.
    for (size_t k = 0; k < bucket.layout.params.size(); ++k) {
      const Parameter& p = s.params[bucket.layout.params[k]];
      if (p.count > 0)
        reduce::copy(bucket.values.data() + bucket.layout.offsets[k] * size, p.value,
                     p.count * size);
    }
    s.buckets.push_back(std::move(bucket));
  }
  s.place = std::move(layout.place);
  s.resetStep();
}

ShardedSync::~ShardedSync() {
  if (!state_) return;
  for (Bucket& bucket : state_->buckets) {
    try {
      bucket.work.wait();
    } catch (const Error&) {
      // Reported by finish(), if it ran.
    }
  }
}

void ShardedSync::markReady(size_t i) {
  State& s = *state_;
  detail::checkMark(s.params, s.ready, i, "ShardedSync");
  s.ready[i] = 1;
  const Parameter& p = s.params[i];
  if (p.count > 0) reduce::copy(s.gradientSlot(i), p.gradient, p.count * dataTypeSize(p.type));
  --s.buckets[s.place[i].first].pending;
  s.startReady();
}

void ShardedSync::finish() {
  State& s = *state_;
  std::vector<size_t> missing;
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.ready[i]) continue;
    missing.push_back(i);
    std::memset(s.gradientSlot(i), 0, s.params[i].count * dataTypeSize(s.params[i].type));
    --s.buckets[s.place[i].first].pending;
  }
  s.startReady();
  std::exception_ptr failure;
  for (Bucket& bucket : s.buckets) {
    try {
      bucket.work.wait();
    } catch (const Error&) {
      if (!failure) failure = std::current_exception();
    }
  }
  s.resetStep();
  if (failure) std::rethrow_exception(failure);
  if (!s.options.findUnusedParameters)
    detail::checkAllMarked(s.comm, s.params, missing, "ShardedSync");
}

std::vector<ShardedSync::Shard> ShardedSync::shards() const {
  const State& s = *state_;
  std::vector<Shard> out;
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    const Bucket& bucket = s.buckets[b];
    const size_t count = s.shardOf(bucket);
    out.push_back({b, static_cast<size_t>(s.comm.rank()) * count, count, bucket.layout.type,
                   bucket.shardGradient.data(), s.valueShard(bucket)});
  }
  return out;
}

std::pair<size_t, size_t> ShardedSync::placeOf(size_t i) const {
  if (i >= state_->params.size())
    throw Error(ErrorCode::InvalidArgument,
                format("braid: ShardedSync::placeOf: argument 'i' is %zu, there are %zu "
                       "parameters",
                       i, state_->params.size()));
  return state_->place[i];
}

void ShardedSync::allGatherParameters() {
  State& s = *state_;
  s.comm.groupStart();
  try {
    for (Bucket& bucket : s.buckets)
      if (bucket.padded > 0)
        s.comm.allGather(s.valueShard(bucket), bucket.values.data(), s.shardOf(bucket),
                         bucket.layout.type);
  } catch (...) {
    s.comm.groupEnd();
    throw;
  }
  s.comm.groupEnd();
  for (Bucket& bucket : s.buckets) {
    const size_t size = dataTypeSize(bucket.layout.type);
    for (size_t k = 0; k < bucket.layout.params.size(); ++k) {
      const Parameter& p = s.params[bucket.layout.params[k]];
      if (p.count > 0)
        reduce::copy(p.value, bucket.values.data() + bucket.layout.offsets[k] * size,
                     p.count * size);
    }
  }
}

void ShardedSync::broadcastParameters(int root) {
  State& s = *state_;
  detail::broadcastValues(s.comm, s.params, root, "ShardedSync::broadcastParameters");
  for (Bucket& bucket : s.buckets) {
    const size_t size = dataTypeSize(bucket.layout.type);
    for (size_t k = 0; k < bucket.layout.params.size(); ++k) {
      const Parameter& p = s.params[bucket.layout.params[k]];
      if (p.count > 0)
        reduce::copy(bucket.values.data() + bucket.layout.offsets[k] * size, p.value,
                     p.count * size);
    }
  }
}

std::vector<std::vector<size_t>> ShardedSync::buckets() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& bucket : state_->buckets) out.push_back(bucket.layout.params);
  return out;
}

}  // namespace braid::ddp
