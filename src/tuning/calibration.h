// Fitting the link model to what the ranks measured at communicator
// creation (core/calibrate.cc takes the measurements).
//
// Each rank with a partner times two back-to-back exchanges with it (both
// send, then both receive): one of a few bytes, which costs a message's
// latency, and one of `largeBytes`, which adds the per-byte work of both
// ends (the sender putting the message on the link, the receiver copying it
// out). It also times a local copy and a local float32 sum on its own core.
// All ranks run them at once, so a host with more ranks than cores measures
// the contention its collectives will see.
#pragma once

#include <cstdint>
#include <vector>

#include "algorithms/simulate.h"

namespace braid::tuning {

// One rank's measurements. Shared between ranks as raw bytes: plain fields.
struct Probe {
  double smallSeconds = 0;  // per exchange of a few bytes; 0: the rank had no partner
  double largeSeconds = 0;  // per exchange of largeBytes
  double largeBytes = 0;
  double copyRate = 0;      // bytes per second of a local copy
  double reduceRate = 0;    // bytes per second of a local float32 sum
  uint32_t memoryLink = 0;  // 1: the partner is reached through shared memory
  uint32_t reserved = 0;
};

// The link model every rank uses, from every rank's probe (the same vector
// on every rank gives the same model). Each quantity is the median over the
// ranks that measured it, so one preempted rank does not sway it. Over a
// memory link the sender's and the receiver's copies cost the same, so the
// exchange's per-byte time splits evenly between bandwidth and
// copyBandwidth; a reduction slows down by the factor that separates those
// from a local copy. Over a network link local copies and reductions run at
// their local speed and the rest of the exchange's per-byte time is the
// link's. Returns `fallback` when no rank had a partner, when the ranks'
// links are of different kinds, or when a measurement is not usable.
algo::LinkModel fitLink(const std::vector<Probe>& probes, const algo::LinkModel& fallback);

}  // namespace braid::tuning
