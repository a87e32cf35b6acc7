#include "tuning/cost_model.h"

namespace braid::tuning {
namespace {

algo::LinkModel linkModel(double latency, double bandwidth, double copy, double reduce) {
  algo::LinkModel link;
  link.latency = latency;
  link.bandwidth = bandwidth;
  link.copyBandwidth = copy;
  link.reduceBandwidth = reduce;
  return link;
}

}  // namespace

algo::LinkModel hostLinkModel(double latency, double bandwidth) {
  return linkModel(latency, bandwidth, 12e9, 10e9);
}

algo::LinkModel deviceLinkModel(double latency, double bandwidth) {
  return linkModel(latency, bandwidth, 1.5e12, 1e12);
}

}  // namespace braid::tuning
