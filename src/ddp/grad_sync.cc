// GradSync: buckets all-reduced on the progress thread as the backward pass
// marks their gradients ready, strictly in bucket order.
//
// A step: markReady(i) copies gradient i into its bucket (unless the
// gradients are bucket views) and, once a bucket is complete and every
// bucket before it has started, starts the bucket's all-reduce (after
// pre-dividing or converting it, as the options say). finish() starts the
// rest, waits for all of them in order, converts back and copies out. After
// the first synced step the buckets are rebuilt in the order rank 0 saw the
// gradients become ready, so that the first bucket is the first one ready.
#include <algorithm>
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

// A bucket's buffers and this step's progress.
struct Bucket {
  Layout::Bucket layout;
  Flat data;  // the flat gradients, in the bucket's type
  Flat wire;  // what travels when it differs: fp32 for fp32 accumulation, fp16/bf16 compressed
  DataType wireType = DataType::Float32;
  size_t pending = 0;  // parameters not yet ready this step
  Work work;
};

bool narrowFloat(DataType type) { return type == DataType::Float16 || type == DataType::BFloat16; }

}  // namespace

struct GradSync::State {
  Communicator& comm;
  std::vector<Parameter> params;
  Options options;
  std::vector<Bucket> buckets;
  std::vector<std::pair<size_t, size_t>> place;  // per parameter: (bucket, first element)
  std::vector<char> ready;                       // per parameter, this step
  size_t nextStart = 0;                          // the next bucket to start
  std::vector<size_t> readyOrder;                // this step's marks, until the rebuild
  bool rebuilt = false;
  int noSync = 0;  // open NoSync scopes
  // Whether this step skips communication, fixed by its first mark (-1: no
  // mark yet), so that a NoSync scope opened or closed mid-step changes
  // nothing before the next step.
  int stepSkips = -1;
  // Parameters marked in skipped steps since the last synced one: their
  // accumulated gradients count in the next synced step even if it does not
  // mark them.
  std::vector<char> used;

  State(Communicator& c, std::vector<Parameter> p, Options o)
      : comm(c), params(std::move(p)), options(o) {}

  void build(const std::vector<size_t>& order) {
    Layout layout =
        detail::makeLayout(params, order, options.firstBucketBytes, options.bucketCapBytes);
    std::vector<Bucket> fresh(layout.buckets.size());
    for (size_t b = 0; b < fresh.size(); ++b) {
      Bucket& bucket = fresh[b];
      bucket.layout = std::move(layout.buckets[b]);
      const DataType type = bucket.layout.type;
      bucket.data = Flat(bucket.layout.count * dataTypeSize(type));
      bucket.wireType = type;
      if (options.fp32Accumulation && narrowFloat(type)) bucket.wireType = DataType::Float32;
      if (type == DataType::Float32 && options.compression != Compression::None)
        bucket.wireType =
            options.compression == Compression::Float16 ? DataType::Float16 : DataType::BFloat16;
      if (bucket.wireType != type)
        bucket.wire = Flat(bucket.layout.count * dataTypeSize(bucket.wireType));
    }
    // Bucket views keep their values across the rebuild.
    if (options.gradientsAsBucketViews && !buckets.empty())
      for (size_t i = 0; i < params.size(); ++i) {
        const size_t bytes = params[i].count * dataTypeSize(params[i].type);
        if (bytes > 0) reduce::copy(slot(fresh, layout.place[i]), slot(buckets, place[i]), bytes);
      }
    buckets = std::move(fresh);
    place = std::move(layout.place);
    resetStep();
  }

  std::byte* slot(const std::vector<Bucket>& in, std::pair<size_t, size_t> at) const {
    const Bucket& bucket = in[at.first];
    return bucket.data.data() + at.second * dataTypeSize(bucket.layout.type);
  }

  void resetStep() {
    ready.assign(params.size(), 0);
    for (Bucket& bucket : buckets) {
      bucket.pending = bucket.layout.params.size();
      bucket.work = Work();
    }
    nextStart = 0;
    readyOrder.clear();
    stepSkips = -1;
    used.resize(params.size(), 0);
  }

  // Parameter i's gradient goes into its bucket (unless it lives there).
  void copyIn(size_t i) {
    const Parameter& p = params[i];
    if (!options.gradientsAsBucketViews && p.count > 0)
      reduce::copy(slot(buckets, place[i]), p.gradient, p.count * dataTypeSize(p.type));
  }

  ReduceOp op() const {
    return options.averaging == Averaging::Avg ? ReduceOp::Avg : ReduceOp::Sum;
  }

  void start(Bucket& bucket) {
    const size_t count = bucket.layout.count;
    if (count == 0) return;
    const DataType type = bucket.layout.type;
    const double share = 1.0 / comm.size();
    if (bucket.wireType == type) {
      if (options.averaging == Averaging::PreDivide)
        detail::scale(bucket.data.data(), count, type, share);
      bucket.work = comm.allReduce(bucket.data.data(), bucket.data.data(), count, type, op(),
                                   Stream::async());
      return;
    }
    ReduceOp wireOp = op();
    if (bucket.wireType != DataType::Float32) {
      // Compressed: divided in fp32 before the cast, so that values and
      // their sum stay in the narrow type's range. (A plain sum is
      // multiplied back in fp32 when it lands.)
      detail::scale(bucket.data.data(), count, type, share);
      detail::convert(bucket.data.data(), type, bucket.wire.data(), bucket.wireType, count);
      wireOp = ReduceOp::Sum;
    } else {
      detail::convert(bucket.data.data(), type, bucket.wire.data(), bucket.wireType, count);
      if (options.averaging == Averaging::PreDivide)
        detail::scale(bucket.wire.data(), count, DataType::Float32, share);
    }
    bucket.work = comm.allReduce(bucket.wire.data(), bucket.wire.data(), count, bucket.wireType,
                                 wireOp, Stream::async());
  }

  // Starts every complete bucket whose predecessors have started.
  void startReady() {
    while (nextStart < buckets.size() && buckets[nextStart].pending == 0) {
      start(buckets[nextStart]);  // if it throws, the bucket has not started
      ++nextStart;
    }
  }

  // After its all-reduce: back to the bucket's type, and out to the gradients.
  void land(Bucket& bucket) {
    const size_t count = bucket.layout.count;
    const DataType type = bucket.layout.type;
    if (bucket.wireType != type) {
      detail::convert(bucket.wire.data(), bucket.wireType, bucket.data.data(), type, count);
      if (bucket.wireType != DataType::Float32 && options.averaging == Averaging::Sum)
        detail::scale(bucket.data.data(), count, type, comm.size());
    }
    if (options.gradientsAsBucketViews) return;
    const size_t size = dataTypeSize(type);
    for (size_t k = 0; k < bucket.layout.params.size(); ++k) {
      const Parameter& p = params[bucket.layout.params[k]];
      if (p.count > 0)
        reduce::copy(p.gradient, bucket.data.data() + bucket.layout.offsets[k] * size,
                     p.count * size);
    }
  }
};

GradSync::GradSync(Communicator& comm, std::vector<Parameter> parameters, Options options) {
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Parameter& p = parameters[i];
    if (!isValid(p.type))
      throw Error(
          ErrorCode::InvalidArgument,
          format("braid: GradSync: parameter %zu ('%s') has an invalid type", i, p.name.c_str()));
    if (!options.gradientsAsBucketViews && !p.gradient && p.count > 0)
      throw Error(ErrorCode::InvalidArgument,
                  format("braid: GradSync: parameter %zu ('%s') has no gradient pointer", i,
                         p.name.c_str()));
  }
  if (options.firstBucketBytes == 0 || options.bucketCapBytes == 0)
    throw Error(ErrorCode::InvalidArgument,
                "braid: GradSync: Options::firstBucketBytes and bucketCapBytes must be positive");
  detail::checkSameParameters(comm, parameters, "GradSync");
  state_ = std::make_unique<State>(comm, std::move(parameters), options);
  state_->build(detail::reverseOrder(state_->params.size()));
}

GradSync::~GradSync() {
  if (!state_) return;
  for (Bucket& bucket : state_->buckets) {
    try {
      bucket.work.wait();  // nothing may still read or write the buckets
    } catch (const Error&) {
      // The step's error was (or will not be) reported by finish().
    }
  }
}

void* GradSync::gradient(size_t i) const {
  if (i >= state_->params.size())
    throw Error(ErrorCode::InvalidArgument,
                format("braid: GradSync::gradient: argument 'i' is %zu, there are %zu parameters",
                       i, state_->params.size()));
  if (!state_->options.gradientsAsBucketViews) return state_->params[i].gradient;
  return state_->slot(state_->buckets, state_->place[i]);
}

void GradSync::markReady(size_t i) {
  State& s = *state_;
  detail::checkMark(s.params, s.ready, i, "GradSync");
  if (s.stepSkips < 0) s.stepSkips = s.noSync > 0 ? 1 : 0;
  s.ready[i] = 1;
  if (s.stepSkips) {
    s.used[i] = 1;
    return;
  }
  if (!s.rebuilt) s.readyOrder.push_back(i);
  s.copyIn(i);
  --s.buckets[s.place[i].first].pending;
  s.startReady();
}

void GradSync::finish() {
  State& s = *state_;
  if (s.stepSkips >= 0 ? s.stepSkips != 0 : s.noSync > 0) {
    s.resetStep();
    return;
  }
  // Parameters not marked in this step but in a skipped one since the last
  // sync carry their accumulated gradients. Those never marked: zeros, so
  // that every bucket still starts and no peer waits for this rank; an
  // error after, unless they are expected.
  std::vector<size_t> missing;
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.ready[i]) continue;
    if (s.used[i]) {
      s.copyIn(i);
      --s.buckets[s.place[i].first].pending;
      continue;
    }
    missing.push_back(i);
    const Parameter& p = s.params[i];
    std::memset(s.slot(s.buckets, s.place[i]), 0, p.count * dataTypeSize(p.type));
    --s.buckets[s.place[i].first].pending;
  }
  std::fill(s.used.begin(), s.used.end(), 0);
  s.startReady();
  std::exception_ptr failure;
  for (Bucket& bucket : s.buckets) {
    try {
      bucket.work.wait();
      s.land(bucket);
    } catch (const Error&) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) {
    s.resetStep();
    std::rethrow_exception(failure);
  }
  if (!s.options.findUnusedParameters) {
    try {
      detail::checkAllMarked(s.comm, s.params, missing, "GradSync");
    } catch (const Error&) {
      s.resetStep();
      throw;
    }
  }
  if (!s.rebuilt) {
    // Rank 0's order of readiness, for every rank; the parameters it never
    // saw ready go last, in reverse registration order.
    std::vector<int64_t> order(s.params.size(), -1);
    std::vector<char> seen(s.params.size(), 0);
    size_t k = 0;
    for (size_t i : s.readyOrder) {
      order[k++] = static_cast<int64_t>(i);
      seen[i] = 1;
    }
    for (size_t i : detail::reverseOrder(s.params.size()))
      if (!seen[i]) order[k++] = static_cast<int64_t>(i);
    s.comm.broadcast(order.data(), order.data(), order.size(), DataType::Int64, 0);
    s.rebuilt = true;
    s.build(std::vector<size_t>(order.begin(), order.end()));
    return;
  }
  s.resetStep();
}

GradSync::NoSync::NoSync(GradSync& sync) : sync_(sync) { ++sync_.state_->noSync; }
GradSync::NoSync::~NoSync() { --sync_.state_->noSync; }

void GradSync::broadcastParameters(int root) {
  detail::broadcastValues(state_->comm, state_->params, root, "GradSync::broadcastParameters");
}

std::vector<std::vector<size_t>> GradSync::buckets() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& bucket : state_->buckets) out.push_back(bucket.layout.params);
  return out;
}

}  // namespace braid::ddp
