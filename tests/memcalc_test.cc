// braid-memcalc: the numbers of its model, and the tool as a user runs it.
#include "memcalc.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <regex>
#include <string>
#include <vector>

namespace braid::memcalc {
namespace {

memcalc::Setup setupOf(double params, int64_t ranks = 1) {
  memcalc::Setup setup;
  setup.params = params;
  setup.ranks = ranks;
  return setup;
}

TEST(Memcalc, MixedPrecisionAdamIsSixteenBytesPerParameter) {
  const Report report = compute(setupOf(7e9));
  EXPECT_EQ(report.bytesPerParam, 16);  // 2 + 2 + 4 + 4 + 4
  std::vector<double> perParam;
  for (const Component& c : report.components) perParam.push_back(c.bytesPerParam);
  EXPECT_EQ(perParam, (std::vector<double>{2, 2, 4, 4, 4}));
  EXPECT_EQ(report.components[0].name, "weights");
  EXPECT_EQ(report.components[0].precision, "fp16");
  EXPECT_EQ(report.components[0].totalBytes, 14e9);  // 7B fp16 weights: 14 GB
  EXPECT_EQ(report.totalBytes, 112e9);
  memcalc::Setup onOneGpu = setupOf(7e9);
  onOneGpu.gpuBytes = 80e9;
  EXPECT_FALSE(compute(onOneGpu).stages[0].fits);  // 112 GB > 80 GB
}

TEST(Memcalc, OtherPrecisionsAndOptimizers) {
  auto perParam = [](Precision precision, Optimizer optimizer, bool fp32Grads) {
    memcalc::Setup setup = setupOf(1e9);
    setup.precision = precision;
    setup.optimizer = optimizer;
    setup.fp32Grads = fp32Grads;
    return compute(setup).bytesPerParam;
  };
  EXPECT_EQ(perParam(Precision::BF16Mixed, Optimizer::AdamW, false), 16);
  EXPECT_EQ(perParam(Precision::Mixed, Optimizer::Adam, true), 20);  // + fp32 gradient copy
  EXPECT_EQ(perParam(Precision::FP32, Optimizer::Adam, false), 16);  // 4 + 4 + 4 + 4, no master
  EXPECT_EQ(perParam(Precision::Mixed, Optimizer::SGD, false), 8);   // 2 + 2 + master 4
  EXPECT_EQ(perParam(Precision::Mixed, Optimizer::SGDMomentum, false), 12);
  EXPECT_EQ(perParam(Precision::FP32, Optimizer::SGD, false), 8);
}

// Per rank, mixed-precision Adam: 16P, 4P + 12P/N, 2P + 14P/N and 16P/N.
TEST(Memcalc, ZeroStagesFollowTheirFormulas) {
  const double p = 7e9;
  for (int64_t n : {1, 2, 3, 8, 64, 1000}) {
    const Report report = compute(setupOf(p, n));
    ASSERT_EQ(report.stages.size(), 4u);
    const double want[] = {16 * p, 4 * p + 12 * p / n, 2 * p + 14 * p / n, 16 * p / n};
    for (int stage = 0; stage < 4; ++stage)
      EXPECT_DOUBLE_EQ(report.stages[stage].bytesPerRank, want[stage])
          << "stage " << stage << " at " << n << " ranks";
    // All-reduce of fp16 gradients: 2(n-1)/n * 2P sent per rank; stage 3: 1.5x.
    const double allReduce = 2.0 * (n - 1) / n * 2 * p;
    EXPECT_DOUBLE_EQ(report.stages[0].sendBytesPerStep, allReduce);
    EXPECT_DOUBLE_EQ(report.stages[2].sendBytesPerStep, allReduce);
    EXPECT_DOUBLE_EQ(report.stages[3].sendBytesPerStep, 1.5 * allReduce);
  }
}

TEST(Memcalc, ActivationEstimateFollowsTheNamedFormula) {
  memcalc::Setup setup = setupOf(7e9, 8);
  setup.transformer = Transformer{32, 4096, 32, 4096, 1, false};
  const double sbh = 4096.0 * 1 * 4096;
  EXPECT_DOUBLE_EQ(*compute(setup).activationBytes, 32 * sbh * (34 + 5.0 * 32 * 4096 / 4096));
  setup.transformer->recompute = true;
  EXPECT_DOUBLE_EQ(*compute(setup).activationBytes, 32 * 2 * sbh);
}

TEST(Memcalc, CountsAndSizesParse) {
  EXPECT_EQ(parseCount("7B"), 7e9);
  EXPECT_EQ(parseCount("1.3B"), 1.3e9);
  EXPECT_EQ(parseCount("125M"), 125e6);
  EXPECT_EQ(parseCount("7e9"), 7e9);
  EXPECT_EQ(parseCount("70b"), 70e9);
  EXPECT_EQ(parseBytes("80GB"), 80e9);
  EXPECT_EQ(parseBytes("80GiB"), 80.0 * (1 << 30));
  EXPECT_EQ(parseBytes("24 GB"), 24e9);
  for (const char* bad : {"", "7X", "-7B", "0", "B", "7BB", "inf", "nan", "1e999"}) {
    EXPECT_FALSE(parseCount(bad)) << bad;
    EXPECT_FALSE(parseBytes(bad)) << bad;
  }
}

// ---- the tool as a user runs it

struct Invocation {
  int status;
  std::string out;
};

Invocation run(const std::string& args) {
  const std::string command = std::string(BRAID_MEMCALC) + " " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string out;
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, got);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Every per-rank figure of the JSON shows in the table, as the table
// prints it.
TEST(Memcalc, JsonHasTheTablesNumbers) {
  const std::string args =
      "--params 13B --ranks 16 --gpu-memory 40GB --layers 40 --hidden 5120 --heads 40 --seq 2048 "
      "--micro-batch 2 --recompute";
  const Invocation table = run(args), json = run(args + " --json");
  ASSERT_EQ(table.status, 0) << table.out;
  ASSERT_EQ(json.status, 0) << json.out;
  const std::regex stage(
      "\"zero\": (\\d+), \"bytes_per_rank\": ([0-9.e+]+), \"bytes_per_rank_with_activations\": "
      "([0-9.e+]+), \"fits\": (true|false), \"send_bytes_per_rank_per_step\": ([0-9.e+]+)");
  int stages = 0;
  for (auto it = std::sregex_iterator(json.out.begin(), json.out.end(), stage);
       it != std::sregex_iterator(); ++it, ++stages) {
    const std::smatch& m = *it;
    const std::string row = "  " + m[1].str() + " ";
    const size_t at = table.out.find("\n" + row);
    ASSERT_NE(at, std::string::npos) << "no table row for stage " << m[1];
    const std::string line = table.out.substr(at + 1, table.out.find('\n', at + 1) - at - 1);
    for (int k : {2, 3, 5})
      EXPECT_NE(line.find(humanBytes(std::stod(m[k].str()))), std::string::npos)
          << "stage " << m[1] << ": " << humanBytes(std::stod(m[k].str())) << " not in '" << line
          << "'";
    EXPECT_NE(line.find(m[4].str() == "true" ? "yes" : "no"), std::string::npos) << line;
  }
  EXPECT_EQ(stages, 4);
  EXPECT_NE(json.out.find("\"total_bytes\": 208000000000"), std::string::npos) << json.out;
  EXPECT_NE(table.out.find("208 GB"), std::string::npos) << table.out;
}

TEST(Memcalc, BadInputIsOneLineAndExitCodeTwo) {
  for (const char* args :
       {"", "--params 7Q", "--params -7B", "--params 0", "--params 7B --ranks 0",
        "--params 7B --ranks -2", "--params 7B --zero 4", "--params 7B --precision fp8",
        "--params 7B --optimizer lion", "--params 7B --gpu-memory 80XB", "--params 7B --layers 2",
        "--params 7B --frobnicate", "--params"}) {
    const Invocation r = run(args);
    EXPECT_EQ(r.status, 2) << "'" << args << "': " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "'" << args << "': " << r.out;
    EXPECT_EQ(r.out.rfind("braid-memcalc: ", 0), 0u) << r.out;
  }
  EXPECT_EQ(run("--help").status, 0);
}

}  // namespace
}  // namespace braid::memcalc
