// The seam's backend-independent pieces: names and hints for work
// completion statuses. They do not include verbs.h: the fake fabric reports
// the same statuses and builds without it (verbs_real.cc checks that the
// numbering matches ibv_wc_status).
#include "transports/ibverbs/verbs_backend.h"

#include <array>

namespace braid::transport::ibverbs {
namespace {

// ibv_wc_status's names, by number. 22 and 23 are the tag-matching
// statuses, which WcStatus leaves out but a device could still report.
constexpr const char* kStatusNames[] = {
    "IBV_WC_SUCCESS",
    "IBV_WC_LOC_LEN_ERR",
    "IBV_WC_LOC_QP_OP_ERR",
    "IBV_WC_LOC_EEC_OP_ERR",
    "IBV_WC_LOC_PROT_ERR",
    "IBV_WC_WR_FLUSH_ERR",
    "IBV_WC_MW_BIND_ERR",
    "IBV_WC_BAD_RESP_ERR",
    "IBV_WC_LOC_ACCESS_ERR",
    "IBV_WC_REM_INV_REQ_ERR",
    "IBV_WC_REM_ACCESS_ERR",
    "IBV_WC_REM_OP_ERR",
    "IBV_WC_RETRY_EXC_ERR",
    "IBV_WC_RNR_RETRY_EXC_ERR",
    "IBV_WC_LOC_RDD_VIOL_ERR",
    "IBV_WC_REM_INV_RD_REQ_ERR",
    "IBV_WC_REM_ABORT_ERR",
    "IBV_WC_INV_EECN_ERR",
    "IBV_WC_INV_EEC_STATE_ERR",
    "IBV_WC_FATAL_ERR",
    "IBV_WC_RESP_TIMEOUT_ERR",
    "IBV_WC_GENERAL_ERR",
    "IBV_WC_TM_ERR",
    "IBV_WC_TM_RNDV_INCOMPLETE",
};
constexpr int kNamedStatuses = static_cast<int>(sizeof(kStatusNames) / sizeof(kStatusNames[0]));

// "IBV_WC_<n>" for every number below kNumbered, made at compile time so
// that wcStatusName returns a string that lives forever and is shared by
// all threads (a buffer filled per call could not be). Numbers outside
// that range get "IBV_WC_UNKNOWN".
constexpr int kNumbered = 256;
constexpr size_t kNumberedLength = sizeof("IBV_WC_255");
using NumberedNames = std::array<std::array<char, kNumberedLength>, kNumbered>;

constexpr NumberedNames makeNumberedNames() {
  NumberedNames names{};
  constexpr char kPrefix[] = "IBV_WC_";
  for (int n = 0; n < kNumbered; ++n) {
    auto& name = names[n];
    size_t at = 0;
    for (; kPrefix[at] != '\0'; ++at) name[at] = kPrefix[at];
    char digits[3] = {};
    int count = 0;
    int rest = n;
    do {
      digits[count++] = static_cast<char>('0' + rest % 10);
      rest /= 10;
    } while (rest > 0);
    while (count > 0) name[at++] = digits[--count];
    name[at] = '\0';
  }
  return names;
}
constexpr NumberedNames kNumberedNames = makeNumberedNames();

}  // namespace

const char* wcStatusName(WcStatus status) {
  const int number = static_cast<int>(status);
  if (number >= 0 && number < kNamedStatuses) return kStatusNames[number];
  if (number >= 0 && number < kNumbered) return kNumberedNames[number].data();
  return "IBV_WC_UNKNOWN";
}

const char* wcStatusHint(WcStatus status) {
  switch (status) {
    case WcStatus::RetryExcErr:
      return "the peers cannot reach each other; often a wrong GID index (BRAID_IB_GID_INDEX) or "
             "a RoCE network without the right VLAN/PFC setup";
    case WcStatus::RemAccessErr:
      return "a bad rkey or a write outside the peer's registered region";
    case WcStatus::RnrRetryExcErr:
      return "the peer had no receive posted";
    case WcStatus::WrFlushErr:
      return "the QP had already failed; see the first error";
    case WcStatus::LocProtErr:
      return "a local buffer not covered by its memory region";
    case WcStatus::LocAccessErr:
      return "a local buffer whose memory region lacks the access the operation needs";
    case WcStatus::LocLenErr:
      return "a message longer than the receive buffer or than the device allows";
    case WcStatus::RemInvReqErr:
      return "the peer rejected the request: its QP does not allow the operation, or the length "
             "is beyond what it accepts";
    case WcStatus::RemOpErr:
      return "the peer could not complete the operation; its QP has usually failed (see the "
             "peer's error)";
    default:
      return "";
  }
}

}  // namespace braid::transport::ibverbs
