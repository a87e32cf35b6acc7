// The knobs every rank must set alike, checked when a communicator is made.
#pragma once

#include "bootstrap/bootstrap.h"
#include "core/knobs.h"

namespace braid {

// Collective over the communicator. Plans and connections are built from
// knobs each rank reads for itself; ranks that read different values
// would build plans that do not match. Throws Error(InvalidArgument) naming
// the first knob that differs, and the two ranks and values.
void checkKnobsAgree(bootstrap::Bootstrap& bootstrap, const Knobs& knobs, net::Deadline deadline);

}  // namespace braid
