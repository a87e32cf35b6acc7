#include "core/knob_agreement.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/errors.h"
#include "tuning/algo_choice.h"

namespace braid {

void checkKnobsAgree(bootstrap::Bootstrap& bootstrap, const Knobs& knobs, net::Deadline deadline) {
  struct Shared {
    uint64_t slotBytes, slots, sockets, chunkBytes, oneShotBytes, algo, tuning, deterministic;
    uint64_t deviceSlotBytes, deviceSlots, deviceGraphs, cmaMeasured;
    char transports[48];
  };
  std::vector<Shared> all(bootstrap.size());
  Shared& mine = all[bootstrap.rank()];
  std::memset(&mine, 0, sizeof(mine));
  mine.slotBytes = knobs.slotBytes;
  mine.slots = static_cast<uint64_t>(knobs.slots);
  mine.sockets = static_cast<uint64_t>(knobs.sockets);
  mine.chunkBytes = knobs.chunkBytes;
  mine.oneShotBytes = knobs.oneShotBytes;
  mine.tuning = static_cast<uint64_t>(knobs.tuning);
  mine.deterministic = knobs.deterministic ? 1 : 0;
  mine.deviceSlotBytes = knobs.deviceSlotBytes;
  mine.deviceSlots = static_cast<uint64_t>(knobs.deviceSlots);
  mine.deviceGraphs = knobs.deviceGraphs ? 1 : 0;
  // (Whether the ranks measure pieces by address at creation, together.)
  mine.cmaMeasured = knobs.addressBytes == kMeasuredAddressBytes ? 1 : 0;
  // BRAID_ALGO by a hash of its meaning (the same list may be spelled apart).
  const std::string algo = tuning::AlgoPreference::parse(knobs.algo).describe();
  mine.algo = 0xcbf29ce484222325ull;
  for (char c : algo) mine.algo = (mine.algo ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  std::snprintf(mine.transports, sizeof(mine.transports), "%s", knobs.transports.c_str());
  bootstrap.allGather(all.data(), sizeof(Shared), deadline);
  for (int r = 0; r < bootstrap.size(); ++r) {
    const Shared& theirs = all[r];
    auto differ = [&](const char* knob, const std::string& a, const std::string& b) {
      fail(ErrorCode::InvalidArgument, bootstrap.rank(),
           format("%s must be the same on every rank: rank %d has %s, rank %d has %s", knob,
                  bootstrap.rank(), a.c_str(), r, b.c_str()));
    };
    if (theirs.slotBytes != mine.slotBytes)
      differ("BRAID_SLOT_BYTES", std::to_string(mine.slotBytes), std::to_string(theirs.slotBytes));
    if (theirs.slots != mine.slots)
      differ("BRAID_SLOTS", std::to_string(mine.slots), std::to_string(theirs.slots));
    if (theirs.sockets != mine.sockets)
      differ("BRAID_NSOCKS_PERTHREAD", std::to_string(mine.sockets),
             std::to_string(theirs.sockets));
    if (theirs.chunkBytes != mine.chunkBytes)
      differ("BRAID_CHUNK_BYTES (Config::chunkBytes)", std::to_string(mine.chunkBytes),
             std::to_string(theirs.chunkBytes));
    if (theirs.deviceSlotBytes != mine.deviceSlotBytes)
      differ("BRAID_DEVICE_SLOT_BYTES", std::to_string(mine.deviceSlotBytes),
             std::to_string(theirs.deviceSlotBytes));
    if (theirs.deviceSlots != mine.deviceSlots)
      differ("BRAID_DEVICE_SLOTS", std::to_string(mine.deviceSlots),
             std::to_string(theirs.deviceSlots));
    if (theirs.deviceGraphs != mine.deviceGraphs)
      differ("BRAID_DEVICE_GRAPHS", std::to_string(mine.deviceGraphs),
             std::to_string(theirs.deviceGraphs));
    if (theirs.cmaMeasured != mine.cmaMeasured)
      differ("BRAID_CMA_BYTES", mine.cmaMeasured ? "auto" : "a size",
             theirs.cmaMeasured ? "auto" : "a size");
    if (theirs.oneShotBytes != mine.oneShotBytes)
      differ("BRAID_ONESHOT_BYTES", std::to_string(mine.oneShotBytes),
             std::to_string(theirs.oneShotBytes));
    if (theirs.tuning != mine.tuning)
      differ("BRAID_TUNING", tuningName(knobs.tuning),
             theirs.tuning <= 2 ? tuningName(static_cast<Tuning>(theirs.tuning)) : "?");
    if (theirs.deterministic != mine.deterministic)
      differ("BRAID_DETERMINISTIC", std::to_string(mine.deterministic),
             std::to_string(theirs.deterministic));
    if (theirs.algo != mine.algo)
      differ("BRAID_ALGO", format("'%s'", knobs.algo.c_str()), "another list");
    if (std::strncmp(theirs.transports, mine.transports, sizeof(mine.transports)) != 0)
      differ("BRAID_TRANSPORT (Config::transports)", format("'%s'", mine.transports),
             format("'%.47s'", theirs.transports));
  }
}

}  // namespace braid
