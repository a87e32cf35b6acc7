// braid-memcalc: why a 7B model does not train on one 80 GB GPU, and what
// data parallelism and ZeRO sharding do about it. See --help.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "memcalc.h"

namespace {

using namespace braid::memcalc;

const char kHelp[] = R"(usage: braid-memcalc --params COUNT [options]

Memory for training a model, per component and per rank, and what each rank
sends per step.

  --params COUNT        parameters: 125M, 1.3B, 7B, 70B, 7e9 (required)
  --precision P         mixed (fp16 weights and gradients, fp32 master; default),
                        bf16-mixed (the same with bf16), fp32
  --optimizer O         adam (default), adamw, sgd, sgd-momentum
  --ranks N             data-parallel ranks (default 1)
  --zero S              ZeRO stage to report: 0, 1, 2, 3 or all (default all).
                        Stage 1 shards the optimizer states over the ranks,
                        stage 2 also the gradients, stage 3 also the weights.
  --gpu-memory SIZE     memory per GPU, e.g. 80GB (10^9 bytes) or 80GiB: says
                        whether each stage fits
  --fp32-grads          keep an fp32 copy of the gradients (some frameworks do)
  --json                the same numbers as JSON

Activation estimate for a transformer (all five, or none):
  --layers L --hidden H --heads A --seq S --micro-batch B [--recompute]
      per rank, L * S*B*H*(34 + 5*A*S/H) bytes of 16-bit activations, the
      formula of Korthikanti et al., "Reducing Activation Recomputation in
      Large Transformer Models" (2022), without tensor or sequence
      parallelism; with --recompute (full activation recomputation) only each
      layer's input, L * 2*S*B*H bytes. fp32 training doubles them. An
      estimate: kernels' workspace, fragmentation and the framework's own
      memory come on top.

Mixed-precision Adam keeps 2 + 2 + 4 + 4 + 4 = 16 bytes per parameter: 7B
parameters need 14 GB of fp16 weights but 112 GB in all.
)";

[[noreturn]] void bad(const std::string& message) {
  std::fprintf(stderr, "braid-memcalc: %s (see --help)\n", message.c_str());
  std::exit(2);
}

int64_t positive(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value <= 0)
    bad(flag + " must be a positive integer, not '" + text + "'");
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  Setup setup;
  bool json = false, haveParams = false;
  Transformer transformer;
  int shapeFlags = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::fputs(kHelp, stdout);
      return 0;
    }
    if (flag == "--json") {
      json = true;
      continue;
    }
    if (flag == "--fp32-grads") {
      setup.fp32Grads = true;
      continue;
    }
    if (flag == "--recompute") {
      transformer.recompute = true;
      continue;
    }
    if (i + 1 >= argc) bad(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--params") {
      const auto count = parseCount(value);
      if (!count)
        bad("--params must be a positive count like 125M, 1.3B, 7e9 or 70B, not '" + value + "'");
      setup.params = *count;
      haveParams = true;
    } else if (flag == "--precision") {
      if (value == "mixed")
        setup.precision = Precision::Mixed;
      else if (value == "bf16-mixed")
        setup.precision = Precision::BF16Mixed;
      else if (value == "fp32")
        setup.precision = Precision::FP32;
      else
        bad("--precision must be mixed, bf16-mixed or fp32, not '" + value + "'");
    } else if (flag == "--optimizer") {
      if (value == "adam")
        setup.optimizer = Optimizer::Adam;
      else if (value == "adamw")
        setup.optimizer = Optimizer::AdamW;
      else if (value == "sgd")
        setup.optimizer = Optimizer::SGD;
      else if (value == "sgd-momentum")
        setup.optimizer = Optimizer::SGDMomentum;
      else
        bad("--optimizer must be adam, adamw, sgd or sgd-momentum, not '" + value + "'");
    } else if (flag == "--ranks") {
      setup.ranks = positive(flag, value);
    } else if (flag == "--zero") {
      if (value == "all")
        setup.stages = {0, 1, 2, 3};
      else if (value.size() == 1 && value[0] >= '0' && value[0] <= '3')
        setup.stages = {value[0] - '0'};
      else
        bad("--zero must be 0, 1, 2, 3 or all, not '" + value + "'");
    } else if (flag == "--gpu-memory") {
      const auto bytes = parseBytes(value);
      if (!bytes)
        bad("--gpu-memory must be a positive size like 80GB or 80GiB, not '" + value + "'");
      setup.gpuBytes = *bytes;
    } else if (flag == "--layers") {
      transformer.layers = positive(flag, value), ++shapeFlags;
    } else if (flag == "--hidden") {
      transformer.hidden = positive(flag, value), ++shapeFlags;
    } else if (flag == "--heads") {
      transformer.heads = positive(flag, value), ++shapeFlags;
    } else if (flag == "--seq") {
      transformer.seq = positive(flag, value), ++shapeFlags;
    } else if (flag == "--micro-batch") {
      transformer.microBatch = positive(flag, value), ++shapeFlags;
    } else {
      bad("unknown option '" + flag + "'");
    }
  }
  if (!haveParams) bad("--params is required");
  if (shapeFlags > 0 && shapeFlags < 5)
    bad("the activation estimate needs all of --layers, --hidden, --heads, --seq and "
        "--micro-batch");
  if (transformer.recompute && shapeFlags == 0)
    bad("--recompute needs the transformer's shape (--layers, --hidden, --heads, --seq, "
        "--micro-batch)");
  if (shapeFlags == 5) setup.transformer = transformer;
  const Report report = compute(setup);
  std::fputs(json ? toJson(report).c_str() : toTable(report).c_str(), stdout);
  return 0;
}
