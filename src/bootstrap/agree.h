// Collective set-up that fails on every rank at once: each rank runs its
// part, then all of them say whether it went well, so that no rank waits
// for a peer that already gave up until the deadline.
#pragma once

#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "braid/error.h"
#include "core/errors.h"

namespace braid::bootstrap {

// Runs `phase`, then tells every rank whether it threw: when any rank's
// did, every rank throws the first such rank's error (its code and what it
// said) as "<who>: rank R could not <doing>: ...". Collective.
template <typename Phase>
void agree(Bootstrap& bootstrap, net::Deadline deadline, const char* who, const char* doing,
           Phase&& phase) {
  struct Outcome {
    int32_t code;  // -1: fine
    char what[244];
  };
  std::vector<Outcome> all(static_cast<size_t>(bootstrap.size()));
  Outcome& mine = all[static_cast<size_t>(bootstrap.rank())];
  std::memset(&mine, 0, sizeof(mine));
  mine.code = -1;
  try {
    phase();
  } catch (const Error& error) {
    mine.code = static_cast<int32_t>(error.code());
    std::snprintf(mine.what, sizeof(mine.what), "%s", error.what());
  } catch (const std::exception& error) {
    mine.code = static_cast<int32_t>(ErrorCode::SystemError);
    std::snprintf(mine.what, sizeof(mine.what), "%s", error.what());
  }
  bootstrap.allGather(all.data(), sizeof(Outcome), deadline);
  for (int r = 0; r < bootstrap.size(); ++r) {
    Outcome& outcome = all[static_cast<size_t>(r)];
    if (outcome.code < 0) continue;
    outcome.what[sizeof(outcome.what) - 1] = '\0';
    throw Error(static_cast<ErrorCode>(outcome.code),
                format("%s: rank %d could not %s: %s", who, r, doing, outcome.what));
  }
}

}  // namespace braid::bootstrap
