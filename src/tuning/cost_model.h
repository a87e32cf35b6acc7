// The alpha-beta link models the tuner starts from (the simulator's
// LinkModel), before a communicator measures its own (BRAID_TUNING=measured,
// tuning/calibration.h). Each transport's entry in the transport table
// (transports/table.h) carries its links' latency and bandwidth; these
// helpers add the rates of the local work every step also does. The
// defaults are the orders of magnitude measured on a 2-vCPU AMD EPYC host:
// shared memory ~0.15 us a hop including the call and ~12 GB/s per process
// copying across cores; TCP over loopback tens of microseconds and a few
// GB/s.
#pragma once

#include "algorithms/simulate.h"

namespace braid::tuning {

// A link between host buffers: `latency` seconds per message, `bandwidth`
// bytes per second, with the host's copy and reduction rates.
algo::LinkModel hostLinkModel(double latency, double bandwidth);

// A link between device buffers: the same, with copies and reductions at
// device speed (kernels on HBM).
algo::LinkModel deviceLinkModel(double latency, double bandwidth);

}  // namespace braid::tuning
