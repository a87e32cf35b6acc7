// The DDP layer: data-parallel training with GradSync or ShardedSync gives
// the parameters one rank gets from the whole batch; buckets follow the
// rules; unused parameters and mismatched registrations fail on every rank.
#include "braid/ddp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../examples/ddp_mlp/mlp.h"
#include "ddp/buckets.h"
#include "multirank.h"

namespace braid::testing {
namespace {

using ddp::Averaging;
using ddp::GradSync;
using ddp::Options;
using ddp::Parameter;
using ddp::ShardedSync;

const std::vector<int> kWidths = {16, 48, 40, 6};
constexpr uint32_t kSeed = 7;
constexpr float kLearningRate = 0.2f;

// The model's parameters for the DDP layer (weights and biases, in order).
std::vector<Parameter> parametersOf(mlp::Model& model) {
  std::vector<Parameter> params;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    mlp::Linear& layer = model.layers[l];
    params.push_back({"fc" + std::to_string(l) + ".weight", layer.weightGrad.data(),
                      layer.weight.size(), DataType::Float32, layer.weight.data()});
    params.push_back({"fc" + std::to_string(l) + ".bias", layer.biasGrad.data(), layer.bias.size(),
                      DataType::Float32, layer.bias.data()});
  }
  return params;
}

// The samples of global batch `step` that rank `rank` of `ranks` trains on.
void batchOf(int step, int rank, int perRank, int ranks, const mlp::Model& model,
             std::vector<float>* x, std::vector<float>* t) {
  const int in = model.inputs(), out = model.outputs();
  x->resize(static_cast<size_t>(perRank) * in);
  t->resize(static_cast<size_t>(perRank) * out);
  for (int s = 0; s < perRank; ++s)
    mlp::sample(static_cast<uint64_t>(step) * perRank * ranks + rank * perRank + s, in, out,
                &(*x)[static_cast<size_t>(s) * in], &(*t)[static_cast<size_t>(s) * out]);
}

void sgd(std::vector<Parameter>& params) {
  for (Parameter& p : params) {
    float* value = static_cast<float*>(p.value);
    const float* grad = static_cast<const float*>(p.gradient);
    for (size_t i = 0; i < p.count; ++i) value[i] -= kLearningRate * grad[i];
  }
}

// One rank training on the whole batch: what data parallelism must match.
mlp::Model reference(int steps, int batch) {
  mlp::Model model(kWidths, kSeed);
  std::vector<Parameter> params = parametersOf(model);
  std::vector<float> x, t;
  for (int step = 0; step < steps; ++step) {
    model.zeroGrad();
    batchOf(step, 0, batch, 1, model, &x, &t);
    model.step(x.data(), t.data(), batch, 1.0f);
    sgd(params);
  }
  return model;
}

void requireClose(const mlp::Model& got, const mlp::Model& want, const std::string& what) {
  for (size_t l = 0; l < want.layers.size(); ++l) {
    const auto& a = got.layers[l].weight;
    const auto& b = want.layers[l].weight;
    for (size_t i = 0; i < a.size(); ++i)
      require(std::fabs(a[i] - b[i]) <= 1e-5f * (1.0f + std::fabs(b[i])),
              what + ": layer " + std::to_string(l) + " weight " + std::to_string(i) + " is " +
                  std::to_string(a[i]) + ", one rank with the whole batch has " +
                  std::to_string(b[i]));
    for (size_t i = 0; i < want.layers[l].bias.size(); ++i)
      require(std::fabs(got.layers[l].bias[i] - want.layers[l].bias[i]) <=
                  1e-5f * (1.0f + std::fabs(want.layers[l].bias[i])),
              what + ": layer " + std::to_string(l) + " bias " + std::to_string(i));
  }
}

enum class Mode { GradSync, GradSyncViews, Sharded };

// Trains `steps` steps at `ranks` ranks, `perRank` samples each, in
// `micro` micro-batches (all but the last inside noSync), and checks the
// parameters against one rank training on the whole batch.
void trainAndCompare(int ranks, Mode mode, int micro) {
  constexpr int kSteps = 4, kPerRank = 12;
  const mlp::Model want = reference(kSteps, kPerRank * ranks);
  runRanks(ranks, [&](Communicator& comm) {
    mlp::Model model(kWidths,
                     kSeed + static_cast<uint32_t>(comm.rank()));  // differ until broadcast
    std::vector<Parameter> params = parametersOf(model);
    Options options;
    options.firstBucketBytes = 2048;  // several buckets even for this small model
    options.bucketCapBytes = 8192;
    options.gradientsAsBucketViews = mode == Mode::GradSyncViews;
    std::vector<float> x, t;
    const int size = kPerRank / micro;
    auto microBatch = [&](int step, int m, const std::function<void(size_t)>& done) {
      batchOf(step, comm.rank(), kPerRank, ranks, model, &x, &t);
      model.step(x.data() + static_cast<size_t>(m) * size * model.inputs(),
                 t.data() + static_cast<size_t>(m) * size * model.outputs(), size,
                 1.0f / static_cast<float>(micro), done);
    };
    if (mode == Mode::Sharded) {
      ShardedSync sync(comm, params, options);
      sync.broadcastParameters(0);
      for (int step = 0; step < kSteps; ++step) {
        model.zeroGrad();
        for (int m = 0; m + 1 < micro; ++m) microBatch(step, m, nullptr);  // accumulate locally
        microBatch(step, micro - 1, [&](size_t l) {
          sync.markReady(2 * l);
          sync.markReady(2 * l + 1);
        });
        sync.finish();
        for (const ShardedSync::Shard& shard : sync.shards()) {
          float* value = static_cast<float*>(shard.value);
          const float* grad = static_cast<const float*>(shard.gradient);
          for (size_t i = 0; i < shard.count; ++i) value[i] -= kLearningRate * grad[i];
        }
        sync.allGatherParameters();
      }
    } else {
      GradSync sync(comm, params, options);
      sync.broadcastParameters(0);
      // The backward pass writes into the views: copy the model's grads there.
      auto mark = [&](size_t l) {
        for (size_t i : {2 * l, 2 * l + 1}) {
          if (mode == Mode::GradSyncViews)
            std::memcpy(sync.gradient(i), params[i].gradient, params[i].count * sizeof(float));
          sync.markReady(i);
        }
      };
      for (int step = 0; step < kSteps; ++step) {
        model.zeroGrad();
        if (micro > 1) {
          auto quiet = sync.noSync();
          for (int m = 0; m + 1 < micro; ++m) {
            microBatch(step, m, mark);
            sync.finish();
            if (mode == Mode::GradSyncViews)  // the views hold the accumulated sum now
              for (size_t i = 0; i < params.size(); ++i)
                std::memcpy(params[i].gradient, sync.gradient(i), params[i].count * sizeof(float));
          }
        }
        microBatch(step, micro - 1, mark);
        sync.finish();
        if (mode == Mode::GradSyncViews)
          for (size_t i = 0; i < params.size(); ++i)
            std::memcpy(params[i].gradient, sync.gradient(i), params[i].count * sizeof(float));
        sgd(params);
      }
      require(sync.buckets().size() > 2, "the model should span several buckets");
    }
    requireClose(model, want,
                 "rank " + std::to_string(comm.rank()) + " of " + std::to_string(ranks));
  });
}

TEST(GradSync, NRanksMatchOneRankWithTheWholeBatch) {
  for (int ranks : {2, 3, 4}) trainAndCompare(ranks, Mode::GradSync, 1);
}

TEST(GradSync, AccumulationUnderNoSyncMatchesOneRankWithTheWholeBatch) {
  for (int ranks : {2, 3, 4}) trainAndCompare(ranks, Mode::GradSync, 3);
}

TEST(GradSync, GradientsAsBucketViewsMatchOneRankWithTheWholeBatch) {
  for (int ranks : {2, 3}) trainAndCompare(ranks, Mode::GradSyncViews, 2);
}

TEST(ShardedSync, ZeroStageOneMatchesOneRankWithTheWholeBatch) {
  for (int ranks : {2, 3, 4}) trainAndCompare(ranks, Mode::Sharded, 1);
  trainAndCompare(3, Mode::Sharded, 2);
}

// Buckets: filled in reverse registration order, the first one small, a new
// one at a type change or past the cap, a parameter never split.
TEST(GradSync, BucketsFollowTheRules) {
  auto param = [](const char* name, size_t count, DataType type) {
    return Parameter{name, nullptr, count, type, nullptr};
  };
  const std::vector<Parameter> params = {
      param("a", 100, DataType::Float32),   // 400 B
      param("b", 5000, DataType::Float32),  // 20000 B: more than the cap, alone
      param("c", 300, DataType::Float16),   // 600 B
      param("d", 200, DataType::Float16),   // 400 B
      param("e", 600, DataType::Float32),   // 2400 B
      param("f", 100, DataType::Float32),   // 400 B
  };
  const auto layout =
      ddp::detail::makeLayout(params, ddp::detail::reverseOrder(params.size()), 1000, 4096);
  std::vector<std::vector<size_t>> got;
  for (const auto& bucket : layout.buckets) got.push_back(bucket.params);
  // f (400) fits the 1000-byte first bucket, e (2400) does not: a new one.
  const std::vector<std::vector<size_t>> want = {{5}, {4}, {3, 2}, {1}, {0}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(layout.buckets[2].type, DataType::Float16);
  EXPECT_EQ(layout.place[2], (std::pair<size_t, size_t>{2, 200}));
}

// Every rank's gradient is rank + 1: the options' averages of 1..n.
TEST(GradSync, AveragingAndCompressionOptions) {
  runRanks(3, [](Communicator& comm) {
    const int n = comm.size();
    const float mine = static_cast<float>(comm.rank() + 1), mean = (n + 1) / 2.0f;
    struct Case {
      Averaging averaging;
      ddp::Compression compression;
      float want;
    };
    for (const Case& c : {Case{Averaging::Avg, ddp::Compression::None, mean},
                          Case{Averaging::PreDivide, ddp::Compression::None, mean},
                          Case{Averaging::Sum, ddp::Compression::None, mean * n},
                          Case{Averaging::Avg, ddp::Compression::Float16, mean},
                          Case{Averaging::Sum, ddp::Compression::BFloat16, mean * n}}) {
      std::vector<float> grad(1000, mine);
      Options options;
      options.averaging = c.averaging;
      options.compression = c.compression;
      GradSync sync(comm, {{"w", grad.data(), grad.size(), DataType::Float32, nullptr}}, options);
      sync.markReady(0);
      sync.finish();
      require(std::fabs(grad[999] - c.want) < 1e-2f,
              "averaging " + std::to_string(static_cast<int>(c.averaging)) + " compression " +
                  std::to_string(static_cast<int>(c.compression)) + ": got " +
                  std::to_string(grad[999]));
    }
    // fp16 gradients accumulated in fp32.
    std::vector<uint16_t> half(64, comm.rank() == 0 ? 0x3c00 : 0x4000);  // 1.0 and 2.0
    Options options;
    options.fp32Accumulation = true;
    GradSync sync(comm, {{"h", half.data(), half.size(), DataType::Float16, nullptr}}, options);
    sync.markReady(0);
    sync.finish();
    require(half[7] == 0x3eab,
            "fp16 average of 1, 2, 2 reduced in fp32: 5/3 rounds to 0x3eab, got " +
                std::to_string(half[7]));
  });
}

// fp16 compression divides before the cast: gradients beyond fp16's range
// (65504) average correctly, and a plain sum of large values comes back in
// fp32.
TEST(GradSync, CompressionKeepsLargeGradientsInRange) {
  runRanks(2, [](Communicator& comm) {
    for (Averaging averaging : {Averaging::Avg, Averaging::Sum}) {
      std::vector<float> grad(256, comm.rank() == 0 ? 1e5f : 2e4f);  // halves sum to 6e4
      Options options;
      options.compression = ddp::Compression::Float16;
      options.averaging = averaging;
      GradSync sync(comm, {{"w", grad.data(), grad.size(), DataType::Float32}}, options);
      sync.markReady(0);
      sync.finish();
      const float want = averaging == Averaging::Avg ? 6e4f : 1.2e5f;
      require(std::fabs(grad[100] - want) <= want * 2e-3f,
              "compressed " + std::string(averaging == Averaging::Avg ? "average" : "sum") +
                  " of 1e5 and 2e4: " + std::to_string(grad[100]));
    }
  });
}

// Gradient accumulation: a parameter marked only in a skipped micro-step
// still counts in the synced step; a NoSync scope opened in the middle of a
// synced step changes nothing before the next step.
TEST(GradSync, AccumulatedGradientsCountEvenWhenTheSyncedStepDoesNotMarkThem) {
  runRanks(2, [](Communicator& comm) {
    std::vector<float> a(64, 0.0f), b(64, 0.0f);
    GradSync sync(comm, {{"a", a.data(), a.size(), DataType::Float32},
                         {"b", b.data(), b.size(), DataType::Float32}});
    {
      auto quiet = sync.noSync();
      std::fill(b.begin(), b.end(), comm.rank() == 0 ? 2.0f : 4.0f);  // only this micro-step uses b
      sync.markReady(1);
      sync.finish();
    }
    std::fill(a.begin(), a.end(), 1.0f);
    sync.markReady(0);
    sync.finish();  // no unused-parameter error: b was used
    require(a[3] == 1.0f && b[3] == 3.0f,
            "b's accumulated gradient was dropped: " + std::to_string(b[3]));
    std::fill(a.begin(), a.end(), comm.rank() + 1.0f);
    std::fill(b.begin(), b.end(), comm.rank() + 1.0f);
    sync.markReady(0);
    {
      auto late = sync.noSync();  // opened mid-step: this step still syncs
      sync.markReady(1);
      sync.finish();
    }
    require(a[7] == 1.5f && b[7] == 1.5f, "a scope opened mid-step changed the step");
  });
}

// A parameter some rank never marks: every rank fails naming it, and
// nobody hangs; with findUnusedParameters it counts as zero there.
TEST(GradSync, AnUnusedParameterFailsOnEveryRankNamingIt) {
  runRanks(3, [](Communicator& comm) {
    std::vector<float> a(100, 1.0f), b(100, 1.0f);
    std::vector<Parameter> params = {{"encoder.weight", a.data(), a.size(), DataType::Float32},
                                     {"decoder.weight", b.data(), b.size(), DataType::Float32}};
    {
      GradSync sync(comm, params);
      sync.markReady(0);
      if (comm.rank() != 1) sync.markReady(1);
      try {
        sync.finish();
        require(false, "finish() passed with an unused parameter");
      } catch (const Error& error) {
        const std::string what = error.what();
        require(error.code() == ErrorCode::InvalidUsage, "expected InvalidUsage: " + what);
        require(what.find("'decoder.weight'") != std::string::npos, "not named: " + what);
      }
    }
    Options options;
    options.findUnusedParameters = true;
    std::fill(b.begin(), b.end(), 3.0f);
    GradSync sync(comm, params, options);
    sync.markReady(0);
    if (comm.rank() != 1) sync.markReady(1);
    sync.finish();
    require(b[50] == 2.0f, "an unused gradient counts as zero: (3 + 0 + 3) / 3");
    // Marking twice, or out of range, is refused and the step goes on.
    sync.markReady(1);
    try {
      sync.markReady(1);
      require(false, "a second mark passed");
    } catch (const Error& error) {
      require(error.code() == ErrorCode::InvalidUsage, error.what());
    }
    try {
      sync.markReady(2);
      require(false, "an index out of range passed");
    } catch (const Error& error) {
      require(error.code() == ErrorCode::InvalidArgument, error.what());
    }
    sync.markReady(0);
    sync.finish();
  });
}

TEST(GradSync, MismatchedRegistrationFailsOnEveryRankNamingTheRankAndParameter) {
  runRanks(3, [](Communicator& comm) {
    std::vector<float> g(64);
    std::vector<Parameter> params = {
        {"embed", g.data(), 64, DataType::Float32},
        {"head", g.data(), comm.rank() == 2 ? 32u : 16u, DataType::Float32}};
    try {
      GradSync sync(comm, params);
      require(false, "a mismatched registration was accepted");
    } catch (const Error& error) {
      const std::string what = error.what();
      require(error.code() == ErrorCode::InvalidUsage, "expected InvalidUsage: " + what);
      require(what.find("rank 2 differs from rank 0 at parameter 1") != std::string::npos &&
                  what.find("head 16 float32") != std::string::npos,
              "does not name the rank and parameter: " + what);
    }
    // The communicator is still usable.
    int32_t one = 1, sum = 0;
    comm.allReduce(&one, &sum, 1, DataType::Int32, ReduceOp::Sum);
    require(sum == 3, "communicator unusable after the failed check");
  });
}

// After the first step the buckets follow rank 0's order of readiness.
TEST(GradSync, BucketsAreRebuiltInRankZerosReadyOrderAfterTheFirstStep) {
  runRanks(2, [](Communicator& comm) {
    std::vector<std::vector<float>> grads(4, std::vector<float>(1024, 1.0f));
    std::vector<Parameter> params;
    for (int i = 0; i < 4; ++i)
      params.push_back({"p" + std::to_string(i), grads[i].data(), 1024, DataType::Float32});
    Options options;
    options.firstBucketBytes = 4096;  // one parameter per bucket
    options.bucketCapBytes = 4096;
    GradSync sync(comm, params, options);
    require(sync.buckets() == std::vector<std::vector<size_t>>{{3}, {2}, {1}, {0}},
            "reverse registration order at first");
    const std::vector<size_t> order =
        comm.rank() == 0 ? std::vector<size_t>{1, 3, 0, 2} : std::vector<size_t>{0, 1, 2, 3};
    for (size_t i : order) sync.markReady(i);
    sync.finish();
    require(sync.buckets() == std::vector<std::vector<size_t>>{{1}, {3}, {0}, {2}},
            "rank 0's order after the first step");
    for (size_t i = 0; i < 4; ++i) sync.markReady(i);
    sync.finish();
    require(grads[2][5] == 1.0f, "the average of ones");
  });
}

}  // namespace
}  // namespace braid::testing
