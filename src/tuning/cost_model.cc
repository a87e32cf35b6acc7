#include "tuning/cost_model.h"

namespace braid::tuning {

algo::LinkModel defaultLink(const std::string& transport) {
  algo::LinkModel link;
  link.copyBandwidth = 12e9;
  link.reduceBandwidth = 10e9;
  if (transport == "cuda_ipc") {
    // A piece costs a few stream operations (a flag wait, a kernel, a flag
    // write: microseconds each); HBM and NVLink move hundreds of GB/s.
    link.latency = 8e-6;
    link.bandwidth = 150e9;
    link.copyBandwidth = 1.5e12;
    link.reduceBandwidth = 1e12;
  } else if (transport == "tcp_staged") {
    // Device buffers between hosts: the stream operations of cuda_ipc
    // around a network hop, kernels at device speed.
    link.latency = 25e-6;
    link.bandwidth = 3e9;
    link.copyBandwidth = 1.5e12;
    link.reduceBandwidth = 1e12;
  } else if (transport == "shm" || transport == "self") {
    link.latency = 0.15e-6;
    link.bandwidth = 12e9;  // the sender's copy into the shared FIFO
  } else {
    link.latency = 15e-6;
    link.bandwidth = 3e9;
  }
  return link;
}

}  // namespace braid::tuning
