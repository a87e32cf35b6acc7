// A small multilayer perceptron with a hand-written forward and backward
// pass, in fp32: Linear layers with ReLU between them and a mean-squared
// error loss. Shared by examples/ddp_mlp and the DDP tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace mlp {

struct Linear {
  int in, out;
  std::vector<float> weight, bias;          // weight[o * in + i]
  std::vector<float> weightGrad, biasGrad;  // accumulated by backward()
};

class Model {
 public:
  // Layer widths, e.g. {32, 64, 64, 8}; weights from `seed` (the same on
  // every rank for the same seed).
  Model(const std::vector<int>& widths, uint32_t seed) {
    std::mt19937 random(seed);
    for (size_t l = 0; l + 1 < widths.size(); ++l) {
      Linear layer{widths[l], widths[l + 1], {}, {}, {}, {}};
      std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(layer.in)));
      layer.weight.resize(static_cast<size_t>(layer.in) * layer.out);
      for (float& w : layer.weight) w = normal(random);
      layer.bias.assign(static_cast<size_t>(layer.out), 0.01f);
      layer.weightGrad.assign(layer.weight.size(), 0.0f);
      layer.biasGrad.assign(layer.bias.size(), 0.0f);
      layers.push_back(std::move(layer));
    }
  }

  std::vector<Linear> layers;

  int inputs() const { return layers.front().in; }
  int outputs() const { return layers.back().out; }

  void zeroGrad() {
    for (Linear& layer : layers) {
      std::fill(layer.weightGrad.begin(), layer.weightGrad.end(), 0.0f);
      std::fill(layer.biasGrad.begin(), layer.biasGrad.end(), 0.0f);
    }
  }

  // Loss over `batch` samples (inputs x, targets t, row-major), and its
  // gradient times `scale` added into every layer's grads. `done(l)` runs as
  // soon as layer l's grads are final, last layer first, as a real backward
  // pass would let a trainer start communicating them.
  float step(const float* x, const float* t, int batch, float scale,
             const std::function<void(size_t)>& done = nullptr) {
    // Forward, keeping every layer's input.
    std::vector<std::vector<float>> acts(layers.size() + 1);
    acts[0].assign(x, x + static_cast<size_t>(batch) * inputs());
    for (size_t l = 0; l < layers.size(); ++l) {
      const Linear& layer = layers[l];
      std::vector<float>& y = acts[l + 1];
      y.assign(static_cast<size_t>(batch) * layer.out, 0.0f);
      for (int s = 0; s < batch; ++s)
        for (int o = 0; o < layer.out; ++o) {
          float sum = layer.bias[o];
          const float* w = &layer.weight[static_cast<size_t>(o) * layer.in];
          const float* in = &acts[l][static_cast<size_t>(s) * layer.in];
          for (int i = 0; i < layer.in; ++i) sum += w[i] * in[i];
          y[static_cast<size_t>(s) * layer.out + o] =
              l + 1 < layers.size() ? std::max(sum, 0.0f) : sum;
        }
    }
    // Mean squared error and its gradient.
    const std::vector<float>& y = acts.back();
    const size_t n = y.size();
    std::vector<float> grad(n);
    float loss = 0.0f;
    for (size_t k = 0; k < n; ++k) {
      const float d = y[k] - t[k];
      loss += d * d;
      grad[k] = 2.0f * d / static_cast<float>(n);
    }
    loss /= static_cast<float>(n);
    // Backward, last layer first.
    for (size_t l = layers.size(); l-- > 0;) {
      Linear& layer = layers[l];
      const std::vector<float>& in = acts[l];
      std::vector<float> back(static_cast<size_t>(batch) * layer.in, 0.0f);
      for (int s = 0; s < batch; ++s)
        for (int o = 0; o < layer.out; ++o) {
          const float g = grad[static_cast<size_t>(s) * layer.out + o];
          if (g == 0.0f) continue;
          layer.biasGrad[o] += scale * g;
          float* wg = &layer.weightGrad[static_cast<size_t>(o) * layer.in];
          const float* w = &layer.weight[static_cast<size_t>(o) * layer.in];
          const float* a = &in[static_cast<size_t>(s) * layer.in];
          float* b = &back[static_cast<size_t>(s) * layer.in];
          for (int i = 0; i < layer.in; ++i) {
            wg[i] += scale * g * a[i];
            b[i] += g * w[i];
          }
        }
      if (done) done(l);
      if (l > 0)  // through the previous layer's ReLU
        for (size_t k = 0; k < back.size(); ++k)
          if (in[k] <= 0.0f) back[k] = 0.0f;
      grad = std::move(back);
    }
    return loss;
  }
};

// Synthetic data: sample `index` of the dataset, the same on every rank.
inline void sample(uint64_t index, int inputs, int outputs, float* x, float* t) {
  std::mt19937 random(static_cast<uint32_t>(index * 2654435761u + 12345u));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int i = 0; i < inputs; ++i) x[i] = uniform(random);
  for (int o = 0; o < outputs; ++o) {  // a smooth target the model can learn
    float v = 0.0f;
    for (int i = 0; i < inputs; ++i) v += std::sin(0.3f * (o + 1) * x[i] + 0.1f * i);
    t[o] = v / static_cast<float>(inputs);
  }
}

}  // namespace mlp

namespace mlp {

// IEEE half precision, rounded to nearest even (subnormals, infinities and
// NaN included), for the mixed-precision trainer.
inline uint16_t toHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)
    return static_cast<uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {  // subnormal in half: scale into place, then round
    float magnitude;
    std::memcpy(&magnitude, &abs, sizeof(magnitude));
    const float scaled = magnitude * 16777216.0f;  // 2^24: one unit is the smallest subnormal
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  const uint32_t rounded = abs + 0x0fffu + ((abs >> 13) & 1u);  // to nearest even at bit 13
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

inline float fromHalf(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    value =
        mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    value = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  return sign ? -value : value;
}

}  // namespace mlp
