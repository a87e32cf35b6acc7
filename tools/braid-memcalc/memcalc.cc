#include "memcalc.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace braid::memcalc {

const char* name(Precision precision) {
  switch (precision) {
    case Precision::Mixed:
      return "mixed";
    case Precision::BF16Mixed:
      return "bf16-mixed";
    case Precision::FP32:
      return "fp32";
  }
  return "?";
}

const char* name(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::Adam:
      return "adam";
    case Optimizer::AdamW:
      return "adamw";
    case Optimizer::SGD:
      return "sgd";
    case Optimizer::SGDMomentum:
      return "sgd-momentum";
  }
  return "?";
}

namespace {

// A number with an optional suffix: each suffix's scale, or nullopt.
std::optional<double> parseScaled(std::string text,
                                  const std::vector<std::pair<std::string, double>>& suffixes) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  size_t start = 0;
  while (start < text.size() && std::isspace(static_cast<unsigned char>(text[start]))) ++start;
  text = text.substr(start);
  if (text.empty()) return std::nullopt;
  double scale = 1;
  for (const auto& [suffix, factor] : suffixes) {
    if (text.size() <= suffix.size()) continue;
    std::string tail = text.substr(text.size() - suffix.size());
    bool same = true;
    for (size_t i = 0; i < suffix.size(); ++i)
      same &= std::tolower(static_cast<unsigned char>(tail[i])) == suffix[i];
    if (same) {
      scale = factor;
      text = text.substr(0, text.size() - suffix.size());
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
        text.pop_back();
      break;
    }
  }
  if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.'))
    return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(value) || value <= 0) return std::nullopt;
  const double scaled = value * scale;
  if (!std::isfinite(scaled)) return std::nullopt;
  return scaled;
}

}  // namespace

std::optional<double> parseCount(const std::string& text) {
  return parseScaled(text, {{"t", 1e12}, {"b", 1e9}, {"g", 1e9}, {"m", 1e6}, {"k", 1e3}});
}

std::optional<double> parseBytes(const std::string& text) {
  // Longest suffixes first.
  return parseScaled(text, {{"tib", 1099511627776.0},
                            {"gib", 1073741824.0},
                            {"mib", 1048576.0},
                            {"kib", 1024.0},
                            {"tb", 1e12},
                            {"gb", 1e9},
                            {"mb", 1e6},
                            {"kb", 1e3},
                            {"t", 1e12},
                            {"g", 1e9},
                            {"m", 1e6},
                            {"k", 1e3},
                            {"b", 1.0}});
}

std::string humanBytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int unit = 0;
  while (bytes >= 1000 && unit < 5) {
    bytes /= 1000;
    ++unit;
  }
  char text[32];
  if (bytes >= 100 || unit == 0)
    std::snprintf(text, sizeof(text), "%.0f %s", bytes, units[unit]);
  else if (bytes >= 10)
    std::snprintf(text, sizeof(text), "%.1f %s", bytes, units[unit]);
  else
    std::snprintf(text, sizeof(text), "%.2f %s", bytes, units[unit]);
  std::string out = text;
  // "14.0 GB" reads better as "14 GB".
  for (const char* zeros : {".00 ", ".0 "})
    if (size_t at = out.find(zeros); at != std::string::npos)
      out.erase(at, std::string(zeros).size() - 1);
  return out;
}

Report compute(const Setup& setup) {
  Report report;
  report.setup = setup;
  const bool mixed = setup.precision != Precision::FP32;
  const char* half = setup.precision == Precision::BF16Mixed ? "bf16" : "fp16";
  const char* low = mixed ? half : "fp32";
  const double w = mixed ? 2 : 4;
  auto add = [&](const char* component, const char* precision, const char* group, double bytes) {
    report.components.push_back({component, precision, group, bytes, bytes * setup.params});
  };
  add("weights", low, "weights", w);
  add("gradients", low, "gradients", w);
  if (mixed && setup.fp32Grads) add("fp32 gradient copy", "fp32", "gradients", 4);
  if (mixed) add("master weights", "fp32", "optimizer", 4);
  switch (setup.optimizer) {
    case Optimizer::Adam:
    case Optimizer::AdamW:
      add("Adam first moment (m)", "fp32", "optimizer", 4);
      add("Adam second moment (v)", "fp32", "optimizer", 4);
      break;
    case Optimizer::SGDMomentum:
      add("momentum", "fp32", "optimizer", 4);
      break;
    case Optimizer::SGD:
      break;
  }
  double weights = 0, gradients = 0, optimizer = 0;
  for (const Component& c : report.components) {
    report.bytesPerParam += c.bytesPerParam;
    (c.group == "weights"     ? weights
     : c.group == "gradients" ? gradients
                              : optimizer) += c.bytesPerParam;
  }
  report.totalBytes = report.bytesPerParam * setup.params;

  if (setup.transformer) {
    // Korthikanti et al. (2022): per layer s*b*h*(34 + 5*a*s/h) bytes of
    // 16-bit activations; with full recomputation only each layer's input,
    // 2*s*b*h bytes.
    const Transformer& t = *setup.transformer;
    const double sbh = static_cast<double>(t.seq) * t.microBatch * t.hidden;
    const double perLayer =
        t.recompute ? 2 * sbh : sbh * (34 + 5.0 * t.heads * static_cast<double>(t.seq) / t.hidden);
    report.activationBytes = perLayer * t.layers * (mixed ? 1.0 : 2.0);
  }

  const double n = static_cast<double>(setup.ranks), phi = setup.params;
  const double share = (n - 1) / n;  // of a buffer, what a ring collective sends per rank
  for (int stage : setup.stages) {
    Stage s{stage, 0, 0, true, 0, ""};
    switch (stage) {
      case 0:
        s.bytesPerRank = (weights + gradients + optimizer) * phi;
        break;
      case 1:
        s.bytesPerRank = (weights + gradients + optimizer / n) * phi;
        break;
      case 2:
        s.bytesPerRank = (weights + (gradients + optimizer) / n) * phi;
        break;
      default:
        s.bytesPerRank = (weights + gradients + optimizer) / n * phi;
        break;
    }
    // Gradients travel in the training precision; an all-reduce sends
    // 2(n-1)/n of the buffer per rank (as reduce-scatter + all-gather).
    const double allReduce = 2 * share * w * phi;
    if (stage < 3) {
      s.sendBytesPerStep = allReduce;
      s.communication = stage == 0 ? "all-reduce of the gradients"
                                   : "reduce-scatter of the gradients + all-gather of the "
                                     "updated weights (the volume of one all-reduce)";
    } else {
      s.sendBytesPerStep = allReduce + share * w * phi;
      s.communication =
          "as stages 0-2, plus an all-gather of the weights (before the forward and the "
          "backward pass each gathers the layers it needs): 1.5x";
    }
    s.withActivations = s.bytesPerRank + report.activationBytes.value_or(0);
    s.fits = setup.gpuBytes <= 0 || s.withActivations <= setup.gpuBytes;
    report.stages.push_back(s);
  }
  return report;
}

namespace {

// A right-aligned column of 14 characters.
std::string column(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%14s", humanBytes(bytes).c_str());
  return text;
}

// "7B", "1.3B", "125M".
std::string humanCount(double count) {
  const char* units[] = {"", "K", "M", "B", "T"};
  int unit = 0;
  while (count >= 1000 && unit < 4) {
    count /= 1000;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g%s", count, units[unit]);
  return text;
}

std::string number(double value) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string toJson(const Report& r) {
  const Setup& s = r.setup;
  std::string out = "{\n";
  out += "  \"params\": " + number(s.params) + ",\n";
  out += "  \"precision\": " + quoted(name(s.precision)) + ",\n";
  out += "  \"optimizer\": " + quoted(name(s.optimizer)) + ",\n";
  out += "  \"ranks\": " + number(static_cast<double>(s.ranks)) + ",\n";
  out += "  \"components\": [\n";
  for (size_t i = 0; i < r.components.size(); ++i) {
    const Component& c = r.components[i];
    out += "    {\"name\": " + quoted(c.name) + ", \"precision\": " + quoted(c.precision) +
           ", \"sharded_from_stage\": " +
           number(c.group == "optimizer"   ? 1
                  : c.group == "gradients" ? 2
                                           : 3) +
           ", \"bytes_per_param\": " + number(c.bytesPerParam) +
           ", \"total_bytes\": " + number(c.totalBytes) + "}" +
           (i + 1 < r.components.size() ? ",\n" : "\n");
  }
  out += "  ],\n";
  out += "  \"bytes_per_param\": " + number(r.bytesPerParam) + ",\n";
  out += "  \"total_bytes\": " + number(r.totalBytes) + ",\n";
  if (r.activationBytes)
    out += "  \"activation_bytes_per_rank_estimate\": " + number(*r.activationBytes) + ",\n";
  if (s.gpuBytes > 0) out += "  \"gpu_bytes\": " + number(s.gpuBytes) + ",\n";
  out += "  \"stages\": [\n";
  for (size_t i = 0; i < r.stages.size(); ++i) {
    const Stage& st = r.stages[i];
    out += "    {\"zero\": " + number(st.stage) +
           ", \"bytes_per_rank\": " + number(st.bytesPerRank) +
           ", \"bytes_per_rank_with_activations\": " + number(st.withActivations) +
           (s.gpuBytes > 0 ? std::string(", \"fits\": ") + (st.fits ? "true" : "false") : "") +
           ", \"send_bytes_per_rank_per_step\": " + number(st.sendBytesPerStep) +
           ", \"communication\": " + quoted(st.communication) + "}" +
           (i + 1 < r.stages.size() ? ",\n" : "\n");
  }
  out += "  ]\n}\n";
  return out;
}

std::string toTable(const Report& r) {
  const Setup& s = r.setup;
  char line[512];
  std::string out;
  std::snprintf(line, sizeof(line), "%s parameters, %s precision, %s, %lld rank%s\n\n",
                humanCount(s.params).c_str(), name(s.precision), name(s.optimizer),
                static_cast<long long>(s.ranks), s.ranks == 1 ? "" : "s");
  out += line;
  std::snprintf(line, sizeof(line), "  %-24s %-9s %15s %12s\n", "component", "precision",
                "bytes/param", "total");
  out += line;
  for (const Component& c : r.components) {
    std::snprintf(line, sizeof(line), "  %-24s %-9s %15g %12s\n", c.name.c_str(),
                  c.precision.c_str(), c.bytesPerParam, humanBytes(c.totalBytes).c_str());
    out += line;
  }
  std::snprintf(line, sizeof(line), "  %-24s %-9s %15g %12s\n", "total", "", r.bytesPerParam,
                humanBytes(r.totalBytes).c_str());
  out += line;
  if (r.activationBytes) {
    std::snprintf(line, sizeof(line), "\n  activations per rank (an estimate, see --help): %s%s\n",
                  humanBytes(*r.activationBytes).c_str(),
                  s.transformer->recompute ? " with full recomputation" : "");
    out += line;
  }
  out += "\n";
  std::snprintf(line, sizeof(line), "  %-6s %14s %s%16s  %s\n", "ZeRO", "per rank",
                r.activationBytes ? "  +activations " : "", "sent/rank/step",
                s.gpuBytes > 0 ? ("fits " + humanBytes(s.gpuBytes) + "?").c_str() : "");
  out += line;
  for (const Stage& st : r.stages) {
    const std::string act = r.activationBytes ? column(st.withActivations) + " " : "";
    std::snprintf(line, sizeof(line), "  %-6d %14s %s%16s  %s\n", st.stage,
                  humanBytes(st.bytesPerRank).c_str(), act.c_str(),
                  humanBytes(st.sendBytesPerStep).c_str(),
                  s.gpuBytes > 0 ? (st.fits ? "yes" : "no") : "");
    out += line;
  }
  out +=
      "\n  sent/rank/step: stages 0-2 all-reduce the gradients (2(N-1)/N of them per rank, "
      "in the\n  training precision); stage 3 adds an all-gather of the weights ((N-1)/N).\n";
  return out;
}

}  // namespace braid::memcalc
