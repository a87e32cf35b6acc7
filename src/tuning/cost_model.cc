#include "tuning/cost_model.h"

namespace braid::tuning {

algo::LinkModel defaultLink(const std::string& transport) {
  algo::LinkModel link;
  link.copyBandwidth = 12e9;
  link.reduceBandwidth = 10e9;
  if (transport == "shm" || transport == "self") {
    link.latency = 0.15e-6;
    link.bandwidth = 12e9;  // the sender's copy into the shared FIFO
  } else {
    link.latency = 15e-6;
    link.bandwidth = 3e9;
  }
  return link;
}

}  // namespace braid::tuning
