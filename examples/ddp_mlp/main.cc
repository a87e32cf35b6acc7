// A data-parallel trainer on braid's DDP layer: an MLP with mixed-precision
// Adam on synthetic data, printing the loss per step.
//
//   braid-run -n 4 build/bin/ddp_mlp [--steps 50] [--batch 32] [--hidden 256] [--lr 0.003]
//
// Mixed precision as large models train: the forward and backward passes use
// fp16 weights and produce fp16 gradients (2 + 2 bytes per parameter);
// GradSync averages the fp16 gradients across ranks (accumulating in fp32)
// while the backward pass goes on, last layer first; Adam updates an fp32
// master copy with its fp32 moments m and v (4 + 4 + 4 bytes), and the fp16
// weights are rounded from the master. 16 bytes per parameter in all.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "braid/ddp.h"
#include "mlp.h"

namespace {

struct Args {
  int steps = 50;
  int batch = 32;  // samples per rank per step
  int hidden = 256;
  float lr = 0.003f;
};

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::printf("usage: ddp_mlp [--steps N] [--batch N] [--hidden N] [--lr X]\n");
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "ddp_mlp: %s needs a value\n", flag.c_str());
      std::exit(2);
    }
    const char* value = argv[++i];
    if (flag == "--steps") {
      args.steps = std::atoi(value);
    } else if (flag == "--batch") {
      args.batch = std::atoi(value);
    } else if (flag == "--hidden") {
      args.hidden = std::atoi(value);
    } else if (flag == "--lr") {
      args.lr = static_cast<float>(std::atof(value));
    } else {
      std::fprintf(stderr, "ddp_mlp: unknown option %s\n", flag.c_str());
      std::exit(2);
    }
  }
  if (args.steps < 1 || args.batch < 1 || args.hidden < 1 || !(args.lr > 0)) {
    std::fprintf(stderr, "ddp_mlp: --steps, --batch, --hidden and --lr must be positive\n");
    std::exit(2);
  }
  return args;
}

// One parameter tensor in mixed precision.
struct Tensor {
  std::string name;
  std::vector<uint16_t> half, grad;  // fp16 weights and gradients
  std::vector<float> master, m, v;   // fp32 master weights and Adam moments
  std::vector<float>* model;         // the model's fp32 working copy (forward and backward)
  std::vector<float>* modelGrad;
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    braid::Communicator comm = braid::Communicator::fromEnvironment();
    const int rank = comm.rank(), ranks = comm.size();
    mlp::Model model({64, args.hidden, args.hidden, 16}, 1234u + static_cast<uint32_t>(rank));

    std::vector<Tensor> tensors;
    for (size_t l = 0; l < model.layers.size(); ++l) {
      mlp::Linear& layer = model.layers[l];
      for (int part = 0; part < 2; ++part) {
        Tensor t;
        t.name = "fc" + std::to_string(l) + (part ? ".bias" : ".weight");
        t.model = part ? &layer.bias : &layer.weight;
        t.modelGrad = part ? &layer.biasGrad : &layer.weightGrad;
        t.master = *t.model;
        t.m.assign(t.master.size(), 0.0f);
        t.v.assign(t.master.size(), 0.0f);
        t.half.resize(t.master.size());
        t.grad.assign(t.master.size(), 0);
        for (size_t i = 0; i < t.master.size(); ++i) t.half[i] = mlp::toHalf(t.master[i]);
        tensors.push_back(std::move(t));
      }
    }
    std::vector<braid::ddp::Parameter> params;
    for (Tensor& t : tensors)
      params.push_back(
          {t.name, t.grad.data(), t.grad.size(), braid::DataType::Float16, t.half.data()});
    braid::ddp::Options options;
    options.fp32Accumulation = true;
    braid::ddp::GradSync sync(comm, params, options);
    sync.broadcastParameters(0);  // every rank starts from rank 0's weights
    for (Tensor& t : tensors)
      for (size_t i = 0; i < t.half.size(); ++i) t.master[i] = mlp::fromHalf(t.half[i]);

    size_t count = 0;
    for (const Tensor& t : tensors) count += t.master.size();
    if (rank == 0)
      std::printf(
          "ddp_mlp: %d ranks, %zu parameters (%zu bytes each: fp16 weights and "
          "gradients, fp32 master, m and v), %zu buckets, %d samples per rank per step\n",
          ranks, count, size_t{16}, sync.buckets().size(), args.batch);

    std::vector<float> x(static_cast<size_t>(args.batch) * model.inputs());
    std::vector<float> y(static_cast<size_t>(args.batch) * model.outputs());
    const float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;
    for (int step = 1; step <= args.steps; ++step) {
      // The fp16 weights are what the passes compute with.
      for (Tensor& t : tensors)
        for (size_t i = 0; i < t.half.size(); ++i) (*t.model)[i] = mlp::fromHalf(t.half[i]);
      model.zeroGrad();
      for (int s = 0; s < args.batch; ++s) {
        const uint64_t index = (static_cast<uint64_t>(step) * ranks + rank) * args.batch + s;
        mlp::sample(index, model.inputs(), model.outputs(),
                    &x[static_cast<size_t>(s) * model.inputs()],
                    &y[static_cast<size_t>(s) * model.outputs()]);
      }
      // Backward, handing each layer's fp16 gradients over as soon as they are done.
      const float loss = model.step(x.data(), y.data(), args.batch, 1.0f, [&](size_t l) {
        for (size_t k : {2 * l, 2 * l + 1}) {
          Tensor& t = tensors[k];
          for (size_t i = 0; i < t.grad.size(); ++i) t.grad[i] = mlp::toHalf((*t.modelGrad)[i]);
          sync.markReady(k);
        }
      });
      sync.finish();
      // Adam on the fp32 master, then the fp16 weights from it.
      const float correct1 = 1.0f - std::pow(beta1, static_cast<float>(step));
      const float correct2 = 1.0f - std::pow(beta2, static_cast<float>(step));
      for (Tensor& t : tensors)
        for (size_t i = 0; i < t.master.size(); ++i) {
          const float g = mlp::fromHalf(t.grad[i]);
          t.m[i] = beta1 * t.m[i] + (1.0f - beta1) * g;
          t.v[i] = beta2 * t.v[i] + (1.0f - beta2) * g * g;
          t.master[i] -= args.lr * (t.m[i] / correct1) / (std::sqrt(t.v[i] / correct2) + epsilon);
          t.half[i] = mlp::toHalf(t.master[i]);
        }
      float mean = 0.0f;
      comm.allReduce(&loss, &mean, 1, braid::DataType::Float32, braid::ReduceOp::Avg);
      if (rank == 0) std::printf("step %d loss %.6f\n", step, mean);
    }
    return 0;
  } catch (const braid::Error& error) {
    std::fprintf(stderr, "ddp_mlp: %s\n", error.what());
    return 1;
  }
}
