// braid-memcalc's model: the memory a training setup needs per parameter
// and per rank, and the bytes each rank sends per step.
//
// Per parameter, by precision and optimizer (bytes):
//   weights      2 (fp16/bf16 in mixed precision) or 4 (fp32)
//   gradients    2 or 4, plus 4 for a kept fp32 copy (--fp32-grads, mixed only)
//   optimizer    master fp32 weights 4 (mixed only), and Adam's m and v 4 + 4,
//                SGD with momentum 4, plain SGD 0
// so mixed-precision Adam is 2 + 2 + 4 + 4 + 4 = 16 bytes. ZeRO shards the
// optimizer states over N ranks (stage 1), then the gradients too (stage 2),
// then the weights too (stage 3).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace braid::memcalc {

enum class Precision { Mixed, BF16Mixed, FP32 };
enum class Optimizer { Adam, AdamW, SGD, SGDMomentum };

// A transformer's shape for the activation estimate.
struct Transformer {
  int64_t layers = 0, hidden = 0, heads = 0, seq = 0, microBatch = 0;
  bool recompute = false;
};

struct Setup {
  double params = 0;  // the parameter count
  Precision precision = Precision::Mixed;
  Optimizer optimizer = Optimizer::Adam;
  int64_t ranks = 1;
  std::vector<int> stages = {0, 1, 2, 3};  // ZeRO stages to report
  double gpuBytes = 0;                     // 0: not given
  bool fp32Grads = false;
  std::optional<Transformer> transformer;
};

// One row of the per-parameter table.
struct Component {
  std::string name;       // "weights", "gradients", "fp32 gradient copy", "master weights", ...
  std::string precision;  // "fp16", "fp32", ...
  std::string group;      // "weights", "gradients" or "optimizer": what ZeRO shards when
  double bytesPerParam;
  double totalBytes;
};

struct Stage {
  int stage;
  double bytesPerRank;      // model states (weights, gradients, optimizer) on each rank
  double withActivations;   // plus the activation estimate, when there is one
  bool fits;                // within the GPU memory, when given
  double sendBytesPerStep;  // what each rank sends per step (ring collectives)
  std::string communication;
};

struct Report {
  Setup setup;
  std::vector<Component> components;
  double bytesPerParam = 0;
  double totalBytes = 0;
  std::optional<double> activationBytes;  // per rank, an estimate
  std::vector<Stage> stages;
};

Report compute(const Setup& setup);

// Parses "7B", "1.3B", "125M", "7e9", "70b", "350K"; nullopt for anything
// else (and for zero, negatives, infinities).
std::optional<double> parseCount(const std::string& text);
// Parses "80GB", "80G", "80GiB", "24 GB", "1.5TB", "512MiB"; bare numbers are
// bytes. GB is 10^9 bytes, GiB 2^30.
std::optional<double> parseBytes(const std::string& text);

// "14 GB", "112 GB", "1.75 GB", "512 MB": decimal units, 3 significant digits.
std::string humanBytes(double bytes);
std::string toJson(const Report& report);
std::string toTable(const Report& report);

const char* name(Precision precision);
const char* name(Optimizer optimizer);

}  // namespace braid::memcalc
