// Fitting the link model to what the ranks measured at communicator
// creation (core/calibrate.cc takes the measurements).
//
// Every rank times a token passed around the ring of ranks, which costs a
// message's latency per hop, wake-ups included (only one rank is busy at a
// time), and then ring steps of `largeBytes` in which every rank sends to
// the next and receives from the previous at once, which adds the per-byte
// work of both ends of a message (the sender putting it on the link, the
// receiver copying it out). It also times a local copy and a local float32
// sum on its own core. All ranks run the ring steps at once, so a host with
// more ranks than cores measures the contention its collectives will see.
#pragma once

#include <cstdint>
#include <vector>

#include "algorithms/simulate.h"

namespace braid::tuning {

// One rank's measurements. Shared between ranks as raw bytes: plain fields.
struct Probe {
  double smallSeconds = 0;  // per hop of the token; 0: not measured (a single rank)
  double largeSeconds = 0;  // per ring step of largeBytes
  double largeBytes = 0;
  double copyRate = 0;      // bytes per second of a local copy
  double reduceRate = 0;    // bytes per second of a local float32 sum
  uint32_t memoryLink = 0;  // 1: both ring neighbours are reached through shared memory
  uint32_t reserved = 0;
  // The ring steps once more with every piece by address
  // (Connection::postAddress), and at a middle size both ways; 0: not
  // measured.
  double largeAddressSeconds = 0;
  double middleBytes = 0;
  double middleSeconds = 0;
  double middleAddressSeconds = 0;
};

// From every rank's probe (the same vector on every rank gives the same
// answer): the size from which pieces go by address, 0 for never. That is
// the middle size where the median rank's step by address beat its step
// through slots there and at the large size, the large size where it did
// there only. Where addresses win at the large size, *probes' large steps
// become the ones by address, for fitLink.
size_t addressCrossover(std::vector<Probe>* probes);

// The link model every rank uses, from every rank's probe (the same vector
// on every rank gives the same model). Each quantity is the median over the
// ranks that measured it, so one preempted rank does not sway it. Over a
// memory link the sender's and the receiver's copies cost the same, so the
// ring step's per-byte time splits evenly between bandwidth and
// copyBandwidth; a reduction slows down by the factor that separates those
// from a local copy. Over a network link local copies and reductions run at
// their local speed and the rest of the step's per-byte time is the link's.
// Returns `fallback` when no rank measured, when the ranks' links are of
// different kinds, or when a measurement is not usable.
algo::LinkModel fitLink(const std::vector<Probe>& probes, const algo::LinkModel& fallback);

}  // namespace braid::tuning
