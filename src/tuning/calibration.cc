#include "tuning/calibration.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace braid::tuning {
namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

bool usable(double value) { return std::isfinite(value) && value > 0; }

}  // namespace

algo::LinkModel fitLink(const std::vector<Probe>& probes, const algo::LinkModel& fallback) {
  std::vector<double> small, perByte, copy, reduce;
  uint32_t memoryLinks = 0;
  for (const Probe& p : probes) {
    if (p.smallSeconds <= 0) continue;
    if (!usable(p.smallSeconds) || !usable(p.largeSeconds) || !usable(p.largeBytes) ||
        !usable(p.copyRate) || !usable(p.reduceRate))
      return fallback;
    small.push_back(p.smallSeconds);
    perByte.push_back(std::max(0.0, p.largeSeconds - p.smallSeconds) / p.largeBytes);
    copy.push_back(p.copyRate);
    reduce.push_back(p.reduceRate);
    memoryLinks += p.memoryLink ? 1 : 0;
  }
  if (small.empty() || (memoryLinks != 0 && memoryLinks != small.size())) return fallback;

  algo::LinkModel link;
  link.latency = median(small);
  const double exchange = median(perByte);  // seconds per byte, both ends' work
  const double localCopy = median(copy), localReduce = median(reduce);
  // An exchange that took no measurable per-byte time cannot be split.
  if (exchange * localCopy < 0.25) return fallback;
  if (memoryLinks) {
    link.bandwidth = link.copyBandwidth = 2 / exchange;
    link.reduceBandwidth = localReduce * (link.copyBandwidth / localCopy);
  } else {
    link.copyBandwidth = localCopy;
    link.reduceBandwidth = localReduce;
    // At least half of the exchange is the link's: the rest is the local
    // copy, which the measurement cannot tell apart from noise.
    link.bandwidth = 1 / std::max(exchange - 1 / localCopy, exchange / 2);
  }
  return link;
}

size_t addressCrossover(std::vector<Probe>* probes) {
  std::vector<double> large, largeAddress, middle, middleAddress;
  double middleBytes = 0, largeBytes = 0;
  for (const Probe& p : *probes) {
    if (!usable(p.largeAddressSeconds) || !usable(p.middleAddressSeconds)) continue;
    large.push_back(p.largeSeconds);
    largeAddress.push_back(p.largeAddressSeconds);
    middle.push_back(p.middleSeconds);
    middleAddress.push_back(p.middleAddressSeconds);
    middleBytes = p.middleBytes;
    largeBytes = p.largeBytes;
  }
  if (large.empty() || median(largeAddress) >= median(large)) return 0;
  for (Probe& p : *probes)
    if (usable(p.largeAddressSeconds)) p.largeSeconds = p.largeAddressSeconds;
  return static_cast<size_t>(median(middleAddress) < median(middle) ? middleBytes : largeBytes);
}

}  // namespace braid::tuning
