#include "transports/table.h"

#include "core/errors.h"
#include "transports/cuda_ipc/cuda_ipc_transport.h"
#include "transports/self/self_transport.h"
#include "transports/shm/shm_transport.h"
#include "transports/tcp/tcp_transport.h"
#if BRAID_HAVE_UCX
#include "transports/ucx/ucx_transport.h"
#endif
#if BRAID_HAVE_IBVERBS
#include "transports/ibverbs/ibverbs_transport.h"
#endif

namespace braid::transport {
namespace {

#if !BRAID_HAVE_UCX || !BRAID_HAVE_IBVERBS
// The entry of a transport this library was built without: enough to
// name it, and to refuse its knob's ON.
TransportEntry unbuilt(const char* name, const char* useKnob, TransportUse Knobs::*use,
                       const char* why) {
  TransportEntry entry(name, Reach::AnyHost, "not built into this library");
  entry.useKnob = useKnob;
  entry.use = use;
  entry.notBuilt = why;
  return entry;
}
#endif

// The table. Priority is row order: a pair of ranks takes the first row
// that reaches it (and that the automatic choice has not passed over).
// The second column: the row that carries device buffers between ranks
// whose host buffers take this one. Device buffers go the way host
// buffers go: through device memory both map where the host buffers take
// shared memory, over verbs where they take verbs, and staged through
// host memory over tcp where they take tcp or ucx (UCX as Debian builds it
// has no CUDA support to stage through).
std::vector<TableRow> makeTable() {
  struct Line {
    TransportEntry entry;
    const char* deviceVia;
  };
  const Line lines[] = {
    {self::entry(), "cuda_ipc"},
    {shm::entry(), "cuda_ipc"},
    {cuda_ipc::entry(), nullptr},
#if BRAID_HAVE_IBVERBS
    {ibverbs::entry(), "ibverbs"},
#else
    {unbuilt("ibverbs", "BRAID_IBVERBS", &Knobs::ibverbs,
             "BRAID_IBVERBS=OFF at build, or no libibverbs-dev"),
     nullptr},
#endif
#if BRAID_HAVE_UCX
    {ucx::entry(), "tcp"},
#else
    {unbuilt("ucx", "BRAID_UCX", &Knobs::ucx, "BRAID_UCX=OFF at build, or no libucx-dev"), nullptr},
#endif
    {tcp::entry(), "tcp"},
  };
  std::vector<TableRow> rows;
  for (const Line& line : lines) rows.push_back({line.entry, nullptr});
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!lines[i].deviceVia) continue;
    for (const TableRow& row : rows)
      if (std::string(row.entry.name) == lines[i].deviceVia) rows[i].deviceVia = &row.entry;
    if (!rows[i].deviceVia)
      throw Error(ErrorCode::Internal,
                  format("transport table: %s's device buffers go by '%s', which has no row",
                         rows[i].entry.name, lines[i].deviceVia));
  }
  return rows;
}

}  // namespace

const std::vector<TableRow>& table() {
  static const std::vector<TableRow> rows = makeTable();
  return rows;
}

const TransportEntry* find(const std::string& name) {
  for (const TableRow& row : table())
    if (name == row.entry.name) return &row.entry;
  return nullptr;
}

const TableRow& loopback() {
  for (const TableRow& row : table())
    if (row.entry.reach == Reach::Self) return row;
  throw Error(ErrorCode::Internal, "transport table: no row serves a rank's loopback");
}

std::vector<std::string> builtTransports() {
  std::vector<std::string> built;
  for (const TableRow& row : table())
    if (row.entry.notBuilt.empty()) built.push_back(row.entry.name);
  return built;
}

bool canReach(const TransportEntry& entry, const bootstrap::Bootstrap& bootstrap, int a, int b) {
  switch (entry.reach) {
    case Reach::Self:
      return a == b;
    case Reach::SameHost:
      return bootstrap.table()[a].hostId == bootstrap.table()[b].hostId;
    case Reach::AnyHost:
      return true;
  }
  return false;
}

int firstRankWithout(const Setup& setup, bool mine) {
  bootstrap::Bootstrap& bootstrap = setup.bootstrap;
  std::vector<uint8_t> has(static_cast<size_t>(bootstrap.size()));
  has[static_cast<size_t>(bootstrap.rank())] = mine ? 1 : 0;
  bootstrap.allGather(has.data(), 1, setup.deadline);
  for (int r = 0; r < bootstrap.size(); ++r)
    if (!has[static_cast<size_t>(r)]) return r;
  return -1;
}

}  // namespace braid::transport
