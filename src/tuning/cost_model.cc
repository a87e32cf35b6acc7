#include "tuning/cost_model.h"

namespace braid::tuning {

algo::LinkModel hostLinkModel(double latency, double bandwidth) {
  algo::LinkModel link;
  link.latency = latency;
  link.bandwidth = bandwidth;
  link.copyBandwidth = 12e9;
  link.reduceBandwidth = 10e9;
  return link;
}

algo::LinkModel deviceLinkModel(double latency, double bandwidth) {
  algo::LinkModel link;
  link.latency = latency;
  link.bandwidth = bandwidth;
  link.copyBandwidth = 1.5e12;
  link.reduceBandwidth = 1e12;
  return link;
}

}  // namespace braid::tuning
