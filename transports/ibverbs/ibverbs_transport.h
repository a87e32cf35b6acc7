// The ibverbs transport: RC queue pairs over InfiniBand or RoCE, driven
// through the VerbsBackend seam (verbs_backend.h): libibverbs, or the fake
// fabric the tests run it over (libbraid_fake_fabric.so, from
// tests/fake_fabric), each loaded at run time. The FIFO protocol is
// in ibverbs_connection.h: RDMA WRITE_WITH_IMM into the peer's slots,
// credit returned in immediates, only every k-th WR signaled, several QPs
// per connection striping large messages (BRAID_IB_QPS_PER_CONNECTION).
// Each peer also has a tcp connection that carries the set-up exchange
// and, afterwards, liveness and the side-channel words (the tcp
// transport's, reused).
//
// Devices: every device and active port BRAID_IB_HCA admits (NCCL's
// syntax); the first is used. RoCE takes a RoCE v2 GID from sysfs
// (BRAID_SYSFS) unless BRAID_IB_GID_INDEX says; the MTU is the smaller of
// both ends'; BRAID_IB_TIMEOUT and BRAID_IB_RETRY_CNT go to RTS.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "core/knobs.h"
#include "transports/ibverbs/ib_select.h"
#include "transports/ibverbs/verbs_backend.h"
#include "transports/table.h"

namespace braid::transport::ibverbs {

// The knobs, as read at the communicator's creation.
struct Options {
  std::string hca;           // BRAID_IB_HCA; empty: every device
  int gidIndex = -1;         // BRAID_IB_GID_INDEX; -1: chosen from sysfs
  int timeout = 20;          // BRAID_IB_TIMEOUT
  int retryCount = 7;        // BRAID_IB_RETRY_CNT
  int qpsPerConnection = 1;  // BRAID_IB_QPS_PER_CONNECTION
  std::string sysfs = "/sys";
  std::string fake;       // BRAID_IB_FAKE: the fake fabric's name; empty: libibverbs
  std::string fakeFault;  // BRAID_IB_FAKE_FAULT
  // BRAID_IB_GDR: device buffers read and written in device memory by the
  // NIC (GPUDirect RDMA, dma-buf), or staged through host memory.
  TransportUse gdr = TransportUse::Auto;
};

// The backend `options` name: the fake fabric (BRAID_IB_FAKE), or
// libibverbs; nullptr, with `*why`, where its library cannot be loaded.
// Throws Error(InvalidArgument) for a fake fabric's bad BRAID_IB_FAKE_FAULT.
// For this folder's transports.
std::unique_ptr<VerbsBackend> openBackend(const Options& options, std::string* why);
// The device and port filter of `options`.
SelectOptions selectOptions(const Options& options);
// The first port `options` admit, its device open (the caller closes it)
// and every other device closed; `*path` set for it (port, GID index, MTU,
// BRAID_IB_TIMEOUT, BRAID_IB_RETRY_CNT). Throws Error(SystemError) saying
// why there is none. The first port serves every peer.
UsablePort openFirstPort(VerbsBackend& backend, const Options& options, PathOptions* path);

// Checks the knobs' ranges; throws Error(InvalidArgument) naming a bad one.
void validate(const Options& options);

// Whether this rank could use verbs: "" when a device and an active port
// are there, else why not ("cannot load libibverbs.so.1 (...)", "no RDMA
// device", "mlx5_0 port 1 is down"). Opens nothing that outlives the call.
std::string probe(const Options& options);

// The knobs as set (BRAID_IB_*, BRAID_SYSFS), checked: Error(InvalidArgument)
// naming a bad one.
Options optionsFromKnobs();

// The transport's row in the table. The automatic choice takes it between
// hosts where BRAID_IBVERBS allows and every rank has an active port. Its
// create() is collective over every rank (also one that serves no peer
// over verbs): it opens the device, sets up a connection to each peer and
// connects their QPs; it returns nullptr, with `*whyNot` naming the rank
// that could not and why (the same on every rank), so that all ranks can
// pass it over together, and throws Error(Timeout) past the deadline and
// Error(InvalidArgument) for a bad knob or one that ranks set differently.
// Device buffers between ranks whose host buffers take it go over verbs
// too (ibverbs_device.h).
TransportEntry entry();

}  // namespace braid::transport::ibverbs
