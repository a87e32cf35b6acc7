// The fake fabric: a VerbsBackend with no RDMA device behind it, for the
// tests of the ibverbs transport. Its QPs connect across processes of the
// same user, also in different network namespaces: they need one pid
// namespace, /proc and each other's file descriptors, not a network.
//
// Test equipment, not part of libbraid: it is built as its own library,
// libbraid_fake_fabric.so (fake_fabric_library.cc exports its one entry
// point), which libbraid loads when BRAID_IB_FAKE names a fabric
// (transports/ibverbs/fake_fabric_loader.h). Its own tests link these
// files directly and call makeFakeFabric(). One copy of the fake serves a
// process: QP numbers are unique per copy, so backends of a linked copy
// and of a loaded one in the same process may clash.
//
// What it looks like: one device "fake_0" with one Active port, link
// layer Ethernet (RoCE), MTU 4096, LID 0, and a GID table of four entries
// of which two are set: index 0 link-local (fe80::), index 1 IPv4-mapped
// (::ffff:10.x.y.z), both encoding the process id, which is how toRtr
// finds the peer's process from the GID it is given.
//
// How it moves data (RC semantics, as the engine sees them on hardware):
// - The poster does the work: postSend copies a WRITE into the peer's
//   target memory (or a READ out of it) at once, through a mapping of the
//   peer's allocateTarget() block, and queues its own completion then.
//   WRITE_WITH_IMM takes one receive posted on the peer QP and pushes the
//   RecvWithImm completion into the peer's receive CQ after the data, so
//   the data is visible when the completion is polled.
// - A dma-buf region (registerDmabuf) is a range of a regular file (in
//   braid the emulated device's memfd) whose `offset` and `address` lie
//   at the same place in a page; anything else gives nullptr. The fake
//   holds a dup of the fd until deregister; a peer maps the range through
//   /proc/<pid>/fd, remote address A at file offset offset + (A - address).
// - A WR toward a peer QP not yet in RTR waits (in order, with the WRs
//   behind it) until it is, or until the retry time the path's timeout and
//   retry count give (at most 10 s), then fails with RetryExcErr. Waiting
//   WRs advance in pollCq and waitCq.
// - Errors: a bad lkey or a local range outside its region: LocProtErr;
//   an rkey that is unknown, deregistered, neither in a target block nor
//   a dma-buf region, without the access, or a range outside its region:
//   RemAccessErr; no receive posted for WRITE_WITH_IMM: RnrRetryExcErr
//   at once (whatever rnrRetry says; the engine must never write without
//   a receive); the peer QP gone or in error, or the peer process gone:
//   RetryExcErr. Each moves the QP to ERROR: its later and waiting WRs
//   and its posted receives complete with WrFlushErr, and nextAsyncEvent
//   reports QpFatal once.
// - Depth: a send WR holds its slot until a signaled completion at or
//   after it is polled; a receive until its completion is polled. Beyond
//   the depth post* return ENOMEM and post nothing of the batch; a QP not
//   yet in RTS (send) or INIT (receive), or a malformed WR, gives EINVAL.
// - A completion that finds its CQ full is lost and the CQ overruns: the
//   owner's next pollCq (or the push itself, for its own completions)
//   reports CqError and moves every QP on that CQ to ERROR.
// - A dead peer process is noticed through a pidfd (zombies count as
//   dead), checked at most once a millisecond per peer, so WRs posted in
//   the first millisecond after a death may still succeed.
//
// Fault injection (FakeOptions::fault, from BRAID_IB_FAKE_FAULT), counting
// the send WRs posted in this process by backends that have a fault spec,
// from 1 (a forked child counts afresh):
//   retry@N  WR N fails with RetryExcErr, its QP goes to ERROR;
//   rkey@N   WR N carries a corrupted rkey: RemAccessErr;
//   flush@N  WR N is not executed: its QP goes to ERROR and WR N and
//            everything outstanding completes with WrFlushErr.
//
// Nothing touches the filesystem: all shared memory is memfd, which the
// kernel frees when the last process holding it exits, also when killed.
// A backend is used by one thread; it belongs to the process that made it
// (a forked child makes its own).
#pragma once

#include <memory>
#include <string>

#include "transports/ibverbs/verbs_backend.h"

namespace braid::transport::ibverbs {

struct FakeOptions {
  // The fabric's name; processes see each other's QPs only within one
  // fabric, so every process of a job passes the same name. Default: "".
  // REQUIRES: at most 200 characters.
  std::string fabric;
  // The fault to inject, as above. Default: "" (none).
  std::string fault;
};

// Throws Error(InvalidArgument) naming BRAID_IB_FAKE_FAULT for a fault
// spec it cannot read, and for a fabric name that is too long.
std::unique_ptr<VerbsBackend> makeFakeFabric(const FakeOptions& options);

}  // namespace braid::transport::ibverbs
