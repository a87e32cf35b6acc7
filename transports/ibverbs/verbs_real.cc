// The VerbsBackend over libibverbs (see verbs_real.h).
//
// Which verbs calls are library symbols and which are not. rdma-core's
// verbs.h makes several "functions" static inline wrappers; an inline that
// names an exported symbol would make this file need libibverbs at link
// time, so only inlines that reach the device through tables in the
// context are called directly:
//   inline, called as such: ibv_post_send, ibv_post_recv, ibv_poll_cq,
//     ibv_req_notify_cq (each one call through qp/cq->context->ops), and
//     verbs_get_ctx_op (a look into the extended context).
//   inline over a symbol, redone here on the loaded pointer: ibv_query_port
//     (a macro: the provider's query_port in the extended context when it
//     has one, else the exported ibv_query_port on a zeroed attribute
//     struct; see queryPortAttributes), and ibv_reg_mr (a macro that picks
//     ibv_reg_mr_iova2 when an optional access bit is set; no such bit is
//     used, so the exported ibv_reg_mr is right).
//   loaded with dlvsym at the version the headers' ABI matches (the one a
//     link would bind; the IBVERBS_1.0 twins take the old ABI):
//     ibv_get_device_list, ibv_free_device_list, ibv_get_device_name,
//     ibv_open_device, ibv_close_device, ibv_query_device, ibv_query_port,
//     ibv_query_gid, ibv_alloc_pd, ibv_dealloc_pd, ibv_reg_mr,
//     ibv_dereg_mr, ibv_create_cq, ibv_destroy_cq, ibv_get_cq_event,
//     ibv_ack_cq_events, ibv_create_qp, ibv_modify_qp, ibv_destroy_qp,
//     ibv_get_async_event, ibv_ack_async_event (IBVERBS_1.1),
//     ibv_create_comp_channel, ibv_destroy_comp_channel (IBVERBS_1.0, their
//     only version), and ibv_reg_dmabuf_mr (IBVERBS_1.12, rdma-core 34;
//     optional).
//
// Relaxed ordering (IBV_ACCESS_RELAXED_ORDERING) is not asked for: it lets
// a later RDMA write land before an earlier one, and a peer that watches
// memory for a flag written after the data would read stale data.
#include "transports/ibverbs/verbs_real.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <type_traits>

#include "core/errors.h"

namespace braid::transport::ibverbs {

// WcStatus is numbered as ibv_wc_status is, so completions pass through
// with a cast.
#define BRAID_SAME_STATUS(ours, theirs) \
  static_assert(static_cast<int>(WcStatus::ours) == (theirs), #ours " != " #theirs)
BRAID_SAME_STATUS(Success, IBV_WC_SUCCESS);
BRAID_SAME_STATUS(LocLenErr, IBV_WC_LOC_LEN_ERR);
BRAID_SAME_STATUS(LocQpOpErr, IBV_WC_LOC_QP_OP_ERR);
BRAID_SAME_STATUS(LocEecOpErr, IBV_WC_LOC_EEC_OP_ERR);
BRAID_SAME_STATUS(LocProtErr, IBV_WC_LOC_PROT_ERR);
BRAID_SAME_STATUS(WrFlushErr, IBV_WC_WR_FLUSH_ERR);
BRAID_SAME_STATUS(MwBindErr, IBV_WC_MW_BIND_ERR);
BRAID_SAME_STATUS(BadRespErr, IBV_WC_BAD_RESP_ERR);
BRAID_SAME_STATUS(LocAccessErr, IBV_WC_LOC_ACCESS_ERR);
BRAID_SAME_STATUS(RemInvReqErr, IBV_WC_REM_INV_REQ_ERR);
BRAID_SAME_STATUS(RemAccessErr, IBV_WC_REM_ACCESS_ERR);
BRAID_SAME_STATUS(RemOpErr, IBV_WC_REM_OP_ERR);
BRAID_SAME_STATUS(RetryExcErr, IBV_WC_RETRY_EXC_ERR);
BRAID_SAME_STATUS(RnrRetryExcErr, IBV_WC_RNR_RETRY_EXC_ERR);
BRAID_SAME_STATUS(LocRddViolErr, IBV_WC_LOC_RDD_VIOL_ERR);
BRAID_SAME_STATUS(RemInvRdReqErr, IBV_WC_REM_INV_RD_REQ_ERR);
BRAID_SAME_STATUS(RemAbortErr, IBV_WC_REM_ABORT_ERR);
BRAID_SAME_STATUS(InvEecnErr, IBV_WC_INV_EECN_ERR);
BRAID_SAME_STATUS(InvEecStateErr, IBV_WC_INV_EEC_STATE_ERR);
BRAID_SAME_STATUS(FatalErr, IBV_WC_FATAL_ERR);
BRAID_SAME_STATUS(RespTimeoutErr, IBV_WC_RESP_TIMEOUT_ERR);
BRAID_SAME_STATUS(GeneralErr, IBV_WC_GENERAL_ERR);
#undef BRAID_SAME_STATUS

namespace {

// ibv_reg_dmabuf_mr's prototype, spelled here so that headers older than
// rdma-core 34 still build (the library may lack it too).
using RegDmabufMr = ibv_mr* (*)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                int access);

struct Functions {
  decltype(&ibv_get_device_list) getDeviceList;
  decltype(&ibv_free_device_list) freeDeviceList;
  decltype(&ibv_get_device_name) getDeviceName;
  decltype(&ibv_open_device) openDevice;
  decltype(&ibv_close_device) closeDevice;
  decltype(&ibv_query_device) queryDevice;
  decltype(&ibv_query_port) queryPort;  // the exported one, on the compat struct
  decltype(&ibv_query_gid) queryGid;
  decltype(&ibv_alloc_pd) allocPd;
  decltype(&ibv_dealloc_pd) deallocPd;
  decltype(&ibv_reg_mr) regMr;  // the exported one (no optional access bits)
  RegDmabufMr regDmabufMr;      // nullptr: the library predates it
  decltype(&ibv_dereg_mr) deregMr;
  decltype(&ibv_create_comp_channel) createCompChannel;
  decltype(&ibv_destroy_comp_channel) destroyCompChannel;
  decltype(&ibv_create_cq) createCq;
  decltype(&ibv_destroy_cq) destroyCq;
  decltype(&ibv_get_cq_event) getCqEvent;
  decltype(&ibv_ack_cq_events) ackCqEvents;
  decltype(&ibv_create_qp) createQp;
  decltype(&ibv_modify_qp) modifyQp;
  decltype(&ibv_destroy_qp) destroyQp;
  decltype(&ibv_get_async_event) getAsyncEvent;
  decltype(&ibv_ack_async_event) ackAsyncEvent;
};

struct Library {
  Functions fn{};
  std::string why;  // empty once every required function is there
};

std::unique_ptr<Library> openLibrary(const char* name) {
  auto out = std::make_unique<Library>();
  void* handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* error = ::dlerror();
    out->why = format("cannot load %s (%s)", name, error ? error : "no reason given");
    return out;
  }
  // A library without symbol versions (a shim) answers dlsym only.
  auto find = [&](const char* symbol, const char* version) {
    void* found = ::dlvsym(handle, symbol, version);
    return found ? found : ::dlsym(handle, symbol);
  };
  auto take = [&](auto& function, const char* symbol, const char* version) {
    void* found = find(symbol, version);
    if (!found && out->why.empty()) out->why = format("%s lacks %s", name, symbol);
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(found);
  };
  Functions& fn = out->fn;
  constexpr const char* k10 = "IBVERBS_1.0";
  constexpr const char* k11 = "IBVERBS_1.1";
  take(fn.getDeviceList, "ibv_get_device_list", k11);
  take(fn.freeDeviceList, "ibv_free_device_list", k11);
  take(fn.getDeviceName, "ibv_get_device_name", k11);
  take(fn.openDevice, "ibv_open_device", k11);
  take(fn.closeDevice, "ibv_close_device", k11);
  take(fn.queryDevice, "ibv_query_device", k11);
  take(fn.queryPort, "ibv_query_port", k11);
  take(fn.queryGid, "ibv_query_gid", k11);
  take(fn.allocPd, "ibv_alloc_pd", k11);
  take(fn.deallocPd, "ibv_dealloc_pd", k11);
  take(fn.regMr, "ibv_reg_mr", k11);
  take(fn.deregMr, "ibv_dereg_mr", k11);
  take(fn.createCompChannel, "ibv_create_comp_channel", k10);
  take(fn.destroyCompChannel, "ibv_destroy_comp_channel", k10);
  take(fn.createCq, "ibv_create_cq", k11);
  take(fn.destroyCq, "ibv_destroy_cq", k11);
  take(fn.getCqEvent, "ibv_get_cq_event", k11);
  take(fn.ackCqEvents, "ibv_ack_cq_events", k11);
  take(fn.createQp, "ibv_create_qp", k11);
  take(fn.modifyQp, "ibv_modify_qp", k11);
  take(fn.destroyQp, "ibv_destroy_qp", k11);
  take(fn.getAsyncEvent, "ibv_get_async_event", k11);
  take(fn.ackAsyncEvent, "ibv_ack_async_event", k11);
  fn.regDmabufMr = reinterpret_cast<RegDmabufMr>(find("ibv_reg_dmabuf_mr", "IBVERBS_1.12"));
  if (!out->why.empty()) ::dlclose(handle);
  return out;
}

// Each library by name, opened once per process and kept (a backend's
// devices hold pointers into it, and its providers stay loaded anyway).
const Library& libraryNamed(const char* name) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Library>> libraries;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Library>& slot = libraries[name];
  if (!slot) slot = openLibrary(name);
  return *slot;
}

// The handles' types. They are not named Device, QueuePair, ...: the fake
// fabric defines its own in the same program, and two different
// definitions of one class would break the one-definition rule. The
// seam's handle pointers are these, cast.
struct RealDevice {
  ibv_context* context = nullptr;
  std::string name;
  uint8_t responderDepth = 1;  // RDMA READs this QP serves at once (max_dest_rd_atomic)
  uint8_t initiatorDepth = 1;  // RDMA READs this QP has outstanding (max_rd_atomic)
};

struct RealPd {
  ibv_pd* pd = nullptr;
  RealDevice* device = nullptr;
};

struct RealMr {
  ibv_mr* mr = nullptr;
};

// Completions that waitCq took to close the arming race, handed out by
// the next pollCq before anything else.
constexpr int kPeekDepth = 16;

struct RealCq {
  ibv_cq* cq = nullptr;
  ibv_comp_channel* channel = nullptr;
  RealDevice* device = nullptr;
  bool armed = false;  // a notification is requested and its event not yet taken
  int peekedHead = 0;
  int peekedCount = 0;
  ibv_wc peeked[kPeekDepth];
};

struct RealQp {
  ibv_qp* qp = nullptr;
  RealDevice* device = nullptr;
};

RealDevice* real(Device* handle) { return reinterpret_cast<RealDevice*>(handle); }
RealPd* real(ProtectionDomain* handle) { return reinterpret_cast<RealPd*>(handle); }
RealMr* real(MemoryRegion* handle) { return reinterpret_cast<RealMr*>(handle); }
RealCq* real(CompletionQueue* handle) { return reinterpret_cast<RealCq*>(handle); }
RealQp* real(QueuePair* handle) { return reinterpret_cast<RealQp*>(handle); }
template <typename Handle, typename Real>
Handle* handleOf(Real* object) {
  return reinterpret_cast<Handle*>(object);
}

// Up to 16 RDMA READs outstanding per QP: what current HCAs offer, capped
// by this device. RemoteQp does not carry the peer's limit, so both ends
// assume the same.
constexpr int kReadDepth = 16;

// Throws Error(SystemError, "<what> failed: <strerror(errnum)>"). The
// errno is an argument of its own, read before anything is formatted
// (formatting may allocate and so change errno); pass plain values only.
[[noreturn]] __attribute__((format(printf, 2, 3))) void failCall(int errnum, const char* what,
                                                                 ...) {
  char text[512];
  va_list args;
  va_start(args, what);
  std::vsnprintf(text, sizeof(text), what, args);
  va_end(args);
  throw Error(ErrorCode::SystemError,
              format("%s failed: %s", text, std::strerror(errnum ? errnum : EIO)));
}

// The errno a verbs call that returns an int failed with: most return the
// errno value itself, some -1 with errno set.
int errnoOf(int rc) { return rc > 0 ? rc : errno; }

uint8_t portNumber(int port) {
  if (port < 1 || port > 255) {
    throw Error(ErrorCode::InvalidArgument, format("RDMA port %d is not 1..255", port));
  }
  return static_cast<uint8_t>(port);
}

// IBV_MTU_256 is 1, ..., IBV_MTU_4096 is 5: 128 << enum bytes.
int mtuBytes(ibv_mtu mtu) { return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128 << mtu : 0; }

ibv_mtu mtuOf(int bytes) {
  for (int mtu = IBV_MTU_256; mtu <= IBV_MTU_4096; ++mtu) {
    if ((128 << mtu) == bytes) return static_cast<ibv_mtu>(mtu);
  }
  throw Error(ErrorCode::InvalidArgument,
              format("path MTU %d is not one of 256, 512, 1024, 2048, 4096", bytes));
}

PortState portStateOf(ibv_port_state state) {
  switch (state) {
    case IBV_PORT_DOWN:
      return PortState::Down;
    case IBV_PORT_INIT:
      return PortState::Init;
    case IBV_PORT_ARMED:
      return PortState::Armed;
    case IBV_PORT_ACTIVE:
      return PortState::Active;
    default:
      return PortState::Other;
  }
}

int accessFlagsOf(int access) {
  int flags = 0;
  if (access & kLocalWrite) flags |= IBV_ACCESS_LOCAL_WRITE;
  if (access & kRemoteWrite) flags |= IBV_ACCESS_REMOTE_WRITE;
  if (access & kRemoteRead) flags |= IBV_ACCESS_REMOTE_READ;
  return flags;
}

void makeNonBlocking(int fd, const std::string& what) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    failCall(errno, "making the %s non-blocking", what.c_str());
  }
}

size_t targetLength(size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (std::max<size_t>(bytes, 1) + page - 1) / page * page;
}

// Milliseconds from now until `until` for poll(): 0 if it has passed,
// rounded up so that a wait does not return just before its deadline.
int pollTimeoutMs(Clock::time_point until) {
  const Clock::time_point now = Clock::now();
  if (until <= now) return 0;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
  return left > INT_MAX ? INT_MAX : static_cast<int>(left);
}

Completion completionOf(const ibv_wc& wc) {
  Completion out;
  out.wrId = wc.wr_id;
  out.status = static_cast<WcStatus>(wc.status);
  out.qpNum = wc.qp_num;
  out.vendorError = wc.vendor_err;
  if (wc.status != IBV_WC_SUCCESS) return out;  // the other fields are not valid
  if (wc.opcode & IBV_WC_RECV) {
    out.opcode = Opcode::RecvWithImm;
    out.bytes = wc.byte_len;
    if (wc.wc_flags & IBV_WC_WITH_IMM) out.imm = ntohl(wc.imm_data);
  } else if (wc.opcode == IBV_WC_RDMA_READ) {
    out.opcode = Opcode::Read;
    out.bytes = wc.byte_len;
  } else {
    out.opcode = Opcode::Write;
  }
  return out;
}

class RealBackend final : public VerbsBackend {
 public:
  explicit RealBackend(const Functions& fn) : fn_(fn) {}

  std::string describe() const override { return "libibverbs"; }

  std::vector<std::string> deviceNames() override {
    std::vector<std::string> names;
    int count = 0;
    ibv_device** list = fn_.getDeviceList(&count);
    if (!list) {
      // ENOSYS: no RDMA support in the kernel, which is no device.
      if (errno == ENOSYS) return names;
      failCall(errno, "ibv_get_device_list");
    }
    for (int i = 0; i < count && list[i]; ++i) {
      const char* name = fn_.getDeviceName(list[i]);
      if (name) names.emplace_back(name);
    }
    fn_.freeDeviceList(list);
    return names;
  }

  Device* openDevice(const std::string& name, DeviceInfo* info) override {
    int count = 0;
    ibv_device** list = fn_.getDeviceList(&count);
    if (!list) failCall(errno, "ibv_get_device_list");
    ibv_device* found = nullptr;
    for (int i = 0; i < count && list[i] && !found; ++i) {
      const char* candidate = fn_.getDeviceName(list[i]);
      if (candidate && name == candidate) found = list[i];
    }
    if (!found) {
      fn_.freeDeviceList(list);
      throw Error(ErrorCode::SystemError, format("no RDMA device named %s", name.c_str()));
    }
    ibv_context* context = fn_.openDevice(found);
    const int openErrno = errno;
    fn_.freeDeviceList(list);  // an opened device outlives the list
    if (!context) failCall(openErrno, "ibv_open_device on %s", name.c_str());

    auto device = std::make_unique<RealDevice>();
    device->context = context;
    device->name = name;
    try {
      ibv_device_attr attr{};
      const int rc = fn_.queryDevice(context, &attr);
      if (rc != 0) failCall(errnoOf(rc), "ibv_query_device on %s", name.c_str());
      // Non-blocking, so that nextAsyncEvent can ask without waiting.
      makeNonBlocking(context->async_fd, "async event fd of " + name);
      device->responderDepth = static_cast<uint8_t>(std::clamp(attr.max_qp_rd_atom, 1, kReadDepth));
      device->initiatorDepth =
          static_cast<uint8_t>(std::clamp(attr.max_qp_init_rd_atom, 1, kReadDepth));
      *info = DeviceInfo{};
      info->name = name;
      info->ports = attr.phys_port_cnt;
      info->maxQpWr = attr.max_qp_wr;
      info->maxCqe = attr.max_cqe;
      info->maxMrSize = attr.max_mr_size;
    } catch (...) {
      fn_.closeDevice(context);
      throw;
    }
    return handleOf<Device>(device.release());
  }

  void closeDevice(Device* handle) override {
    std::unique_ptr<RealDevice> device(real(handle));
    if (device) fn_.closeDevice(device->context);
  }

  PortInfo queryPort(Device* handle, int port) override {
    RealDevice* device = real(handle);
    ibv_port_attr attr{};
    const int rc = queryPortAttributes(device->context, portNumber(port), &attr);
    if (rc != 0) {
      failCall(errnoOf(rc), "ibv_query_port on %s port %d", device->name.c_str(), port);
    }
    PortInfo info;
    info.state = portStateOf(attr.state);
    // Unspecified is what drivers older than RoCE report: InfiniBand.
    info.linkLayer =
        attr.link_layer == IBV_LINK_LAYER_ETHERNET ? LinkLayer::Ethernet : LinkLayer::InfiniBand;
    info.lid = attr.lid;
    info.activeMtu = mtuBytes(attr.active_mtu);
    info.gidTableLength = attr.gid_tbl_len;
    return info;
  }

  Gid queryGid(Device* handle, int port, int index) override {
    RealDevice* device = real(handle);
    ibv_gid gid{};
    const int rc = fn_.queryGid(device->context, portNumber(port), index, &gid);
    if (rc != 0) {
      failCall(errnoOf(rc), "ibv_query_gid on %s port %d index %d", device->name.c_str(), port,
               index);
    }
    Gid out;
    std::memcpy(out.raw.data(), gid.raw, out.raw.size());
    return out;
  }

  ProtectionDomain* allocPd(Device* handle) override {
    RealDevice* device = real(handle);
    ibv_pd* pd = fn_.allocPd(device->context);
    if (!pd) failCall(errno, "ibv_alloc_pd on %s", device->name.c_str());
    return handleOf<ProtectionDomain>(new RealPd{pd, device});
  }

  void deallocPd(ProtectionDomain* handle) override {
    std::unique_ptr<RealPd> pd(real(handle));
    if (pd) fn_.deallocPd(pd->pd);
  }

  // Anonymous private pages: zeroed, page-aligned, and never shared with
  // another process (the device reaches them through the registration).
  void* allocateTarget(size_t bytes) override {
    void* memory = ::mmap(nullptr, targetLength(bytes), PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
      failCall(errno, "mmap of %zu bytes for RDMA targets", bytes);
    }
    return memory;
  }

  void releaseTarget(void* memory, size_t bytes) override {
    if (memory) ::munmap(memory, targetLength(bytes));
  }

  MemoryRegion* registerMemory(ProtectionDomain* handle, void* address, size_t bytes, int access,
                               Keys* keys) override {
    RealPd* pd = real(handle);
    ibv_mr* mr = fn_.regMr(pd->pd, address, bytes, accessFlagsOf(access));
    if (!mr) {
      failCall(errno, "ibv_reg_mr on %s (%zu bytes at %p)", pd->device->name.c_str(), bytes,
               address);
    }
    keys->lkey = mr->lkey;
    keys->rkey = mr->rkey;
    return handleOf<MemoryRegion>(new RealMr{mr});
  }

  MemoryRegion* registerDmabuf(ProtectionDomain* handle, int fd, uint64_t offset, size_t bytes,
                               uint64_t address, int access, Keys* keys) override {
    if (!fn_.regDmabufMr) return nullptr;
    ibv_mr* mr =
        fn_.regDmabufMr(real(handle)->pd, offset, bytes, address, fd, accessFlagsOf(access));
    if (!mr) return nullptr;  // EOPNOTSUPP and the like: the caller stages instead
    keys->lkey = mr->lkey;
    keys->rkey = mr->rkey;
    return handleOf<MemoryRegion>(new RealMr{mr});
  }

  void deregister(MemoryRegion* handle) override {
    std::unique_ptr<RealMr> region(real(handle));
    if (region) fn_.deregMr(region->mr);
  }

  // Each queue has its own completion channel, so that waitCq sleeps on
  // this queue's events alone.
  CompletionQueue* createCq(Device* handle, int depth) override {
    RealDevice* device = real(handle);
    ibv_comp_channel* channel = fn_.createCompChannel(device->context);
    if (!channel) failCall(errno, "ibv_create_comp_channel on %s", device->name.c_str());
    ibv_cq* cq = nullptr;
    try {
      // Non-blocking: waitCq polls the fd and then reads an event that
      // may have gone (another spurious wake-up is all that costs).
      makeNonBlocking(channel->fd, "completion channel of " + device->name);
      cq = fn_.createCq(device->context, depth, nullptr, channel, 0);
      if (!cq) failCall(errno, "ibv_create_cq on %s (depth %d)", device->name.c_str(), depth);
    } catch (...) {
      fn_.destroyCompChannel(channel);
      throw;
    }
    auto out = std::make_unique<RealCq>();
    out->cq = cq;
    out->channel = channel;
    out->device = device;
    return handleOf<CompletionQueue>(out.release());
  }

  void destroyCq(CompletionQueue* handle) override {
    std::unique_ptr<RealCq> cq(real(handle));
    if (!cq) return;
    // Every event taken was acknowledged at once, so this does not wait.
    fn_.destroyCq(cq->cq);
    fn_.destroyCompChannel(cq->channel);
  }

  // Hot path: no allocation, no lock, no system call (ibv_poll_cq reads
  // the queue in user space).
  int pollCq(CompletionQueue* handle, Completion* out, int max) override {
    RealCq* cq = real(handle);
    int taken = 0;
    while (taken < max && cq->peekedCount > 0) {
      out[taken++] = completionOf(cq->peeked[cq->peekedHead++]);
      --cq->peekedCount;
    }
    constexpr int kBatch = 32;
    ibv_wc batch[kBatch];
    while (taken < max) {
      const int want = std::min(max - taken, kBatch);
      const int got = ibv_poll_cq(cq->cq, want, batch);
      if (got < 0) failCq(cq, "ibv_poll_cq", got);
      for (int i = 0; i < got; ++i) out[taken++] = completionOf(batch[i]);
      if (got < want) break;  // the queue is empty
    }
    return taken;
  }

  // Arm, then look once more: a completion that came before the arming
  // makes no event, so sleeping without that look could miss it. What the
  // look finds waits in the queue object for the next pollCq.
  void waitCq(CompletionQueue* handle, Clock::time_point until) override {
    RealCq* cq = real(handle);
    if (cq->peekedCount > 0) return;
    if (!cq->armed) {
      const int rc = ibv_req_notify_cq(cq->cq, 0);
      if (rc != 0) failCq(cq, "ibv_req_notify_cq", rc);
      cq->armed = true;
    }
    const int got = ibv_poll_cq(cq->cq, kPeekDepth, cq->peeked);
    if (got < 0) failCq(cq, "ibv_poll_cq", got);
    if (got > 0) {
      cq->peekedHead = 0;
      cq->peekedCount = got;
      return;
    }
    pollfd ready{cq->channel->fd, POLLIN, 0};
    if (::poll(&ready, 1, pollTimeoutMs(until)) <= 0) return;  // timed out, or EINTR
    ibv_cq* eventCq = nullptr;
    void* eventContext = nullptr;
    if (fn_.getCqEvent(cq->channel, &eventCq, &eventContext) == 0) {
      // The arming is spent; the next wait arms again. Acknowledged at
      // once (one mutex in the library) as this path is about to sleep or
      // has just woken anyway.
      fn_.ackCqEvents(eventCq, 1);
      cq->armed = false;
    }
  }

  QueuePair* createQp(ProtectionDomain* handle, CompletionQueue* sendCq, CompletionQueue* recvCq,
                      const QpCaps& caps, uint32_t* qpNum) override {
    RealPd* pd = real(handle);
    ibv_qp_init_attr attr{};
    attr.send_cq = real(sendCq)->cq;
    attr.recv_cq = real(recvCq)->cq;
    attr.qp_type = IBV_QPT_RC;
    attr.sq_sig_all = 0;  // only requests marked signaled complete (and failures)
    attr.cap.max_send_wr = static_cast<uint32_t>(std::max(caps.sendDepth, 1));
    attr.cap.max_recv_wr = static_cast<uint32_t>(std::max(caps.recvDepth, 1));
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;  // receives carry none; one costs nothing
    attr.cap.max_inline_data = static_cast<uint32_t>(std::max(caps.maxInline, 0));
    ibv_qp* qp = fn_.createQp(pd->pd, &attr);
    if (!qp) {
      failCall(errno, "ibv_create_qp on %s (send depth %d, receive depth %d, inline %d)",
               pd->device->name.c_str(), caps.sendDepth, caps.recvDepth, caps.maxInline);
    }
    *qpNum = qp->qp_num;
    return handleOf<QueuePair>(new RealQp{qp, pd->device});
  }

  void destroyQp(QueuePair* handle) override {
    std::unique_ptr<RealQp> qp(real(handle));
    if (qp) fn_.destroyQp(qp->qp);
  }

  void toInit(QueuePair* handle, const PathOptions& path) override {
    RealQp* qp = real(handle);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = portNumber(path.port);
    attr.qp_access_flags =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    modify(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT",
           0);
  }

  void toRtr(QueuePair* handle, const RemoteQp& remote, const PathOptions& path) override {
    RealQp* qp = real(handle);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = mtuOf(path.mtu);
    attr.dest_qp_num = remote.qpNum;
    attr.rq_psn = remote.psn & 0xffffff;  // PSNs are 24 bits
    attr.max_dest_rd_atomic = qp->device->responderDepth;
    attr.min_rnr_timer = 12;  // 0.64 ms before the peer retries a receive-not-ready
    attr.ah_attr.dlid = remote.lid;
    attr.ah_attr.sl = static_cast<uint8_t>(path.serviceLevel);
    attr.ah_attr.src_path_bits = 0;
    attr.ah_attr.port_num = portNumber(path.port);
    if (remote.useGid) {
      attr.ah_attr.is_global = 1;
      std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid.raw.data(), remote.gid.raw.size());
      attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(path.gidIndex);
      attr.ah_attr.grh.hop_limit = 255;
      attr.ah_attr.grh.traffic_class = static_cast<uint8_t>(path.trafficClass);
      attr.ah_attr.grh.flow_label = 0;
    }
    modify(qp, &attr,
           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
           "RTR", remote.qpNum);
  }

  void toRts(QueuePair* handle, const PathOptions& path) override {
    RealQp* qp = real(handle);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = static_cast<uint8_t>(path.timeout);
    attr.retry_cnt = static_cast<uint8_t>(path.retryCount);
    attr.rnr_retry = static_cast<uint8_t>(path.rnrRetry);
    attr.sq_psn = path.psn & 0xffffff;
    attr.max_rd_atomic = qp->device->initiatorDepth;
    modify(qp, &attr,
           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC,
           "RTS", 0);
  }

  // Hot path: the chain is built on the stack, posted 32 requests at a
  // time (one doorbell each); no allocation, no lock.
  int postSend(QueuePair* handle, const SendRequest* requests, size_t count) override {
    ibv_qp* qp = real(handle)->qp;
    constexpr size_t kChain = 32;
    ibv_send_wr chain[kChain];
    ibv_sge sges[kChain];
    for (size_t done = 0; done < count;) {
      const size_t n = std::min(count - done, kChain);
      for (size_t i = 0; i < n; ++i) {
        const SendRequest& request = requests[done + i];
        ibv_send_wr& wr = chain[i];
        wr = ibv_send_wr{};
        wr.wr_id = request.wrId;
        wr.next = i + 1 < n ? &chain[i + 1] : nullptr;
        switch (request.opcode) {
          case Opcode::Write:
            wr.opcode = IBV_WR_RDMA_WRITE;
            break;
          case Opcode::WriteWithImm:
            wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            wr.imm_data = htonl(request.imm);
            break;
          case Opcode::Read:
            wr.opcode = IBV_WR_RDMA_READ;
            break;
          default:
            return EINVAL;  // RecvWithImm is no request
        }
        if (request.bytes > 0) {
          sges[i].addr = reinterpret_cast<uintptr_t>(request.local);
          sges[i].length = request.bytes;
          sges[i].lkey = request.lkey;
          wr.sg_list = &sges[i];
          wr.num_sge = 1;
        }
        if (request.signaled) wr.send_flags |= IBV_SEND_SIGNALED;
        if (request.inlineData) wr.send_flags |= IBV_SEND_INLINE;
        wr.wr.rdma.remote_addr = request.remoteAddr;
        wr.wr.rdma.rkey = request.rkey;
      }
      ibv_send_wr* bad = nullptr;
      const int rc = ibv_post_send(qp, chain, &bad);
      if (rc != 0) return rc;
      done += n;
    }
    return 0;
  }

  // Receives for immediates: no scatter/gather entries (the peer's RDMA
  // WRITE places the data).
  int postRecv(QueuePair* handle, const RecvRequest* requests, size_t count) override {
    ibv_qp* qp = real(handle)->qp;
    constexpr size_t kChain = 32;
    ibv_recv_wr chain[kChain];
    for (size_t done = 0; done < count;) {
      const size_t n = std::min(count - done, kChain);
      for (size_t i = 0; i < n; ++i) {
        chain[i] = ibv_recv_wr{};
        chain[i].wr_id = requests[done + i].wrId;
        chain[i].next = i + 1 < n ? &chain[i + 1] : nullptr;
        chain[i].sg_list = nullptr;
        chain[i].num_sge = 0;
      }
      ibv_recv_wr* bad = nullptr;
      const int rc = ibv_post_recv(qp, chain, &bad);
      if (rc != 0) return rc;
      done += n;
    }
    return 0;
  }

  bool nextAsyncEvent(Device* handle, AsyncEvent* event) override {
    ibv_async_event raw{};
    // The fd is non-blocking: EAGAIN when there is none.
    if (fn_.getAsyncEvent(real(handle)->context, &raw) != 0) return false;
    *event = AsyncEvent{};
    event->code = raw.event_type;
    switch (raw.event_type) {
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:  // an invalid request; the QP is in error too
        event->kind = AsyncEventKind::QpFatal;
        event->qpNum = raw.element.qp->qp_num;
        break;
      case IBV_EVENT_QP_ACCESS_ERR:
        event->kind = AsyncEventKind::QpAccessError;
        event->qpNum = raw.element.qp->qp_num;
        break;
      case IBV_EVENT_COMM_EST:
      case IBV_EVENT_SQ_DRAINED:
      case IBV_EVENT_PATH_MIG:
      case IBV_EVENT_PATH_MIG_ERR:
      case IBV_EVENT_QP_LAST_WQE_REACHED:
        event->qpNum = raw.element.qp->qp_num;
        break;
      case IBV_EVENT_CQ_ERR:
        event->kind = AsyncEventKind::CqError;
        break;
      case IBV_EVENT_PORT_ACTIVE:
        event->kind = AsyncEventKind::PortActive;
        event->port = raw.element.port_num;
        break;
      case IBV_EVENT_PORT_ERR:
        event->kind = AsyncEventKind::PortError;
        event->port = raw.element.port_num;
        break;
      case IBV_EVENT_LID_CHANGE:
      case IBV_EVENT_PKEY_CHANGE:
      case IBV_EVENT_SM_CHANGE:
      case IBV_EVENT_CLIENT_REREGISTER:
      case IBV_EVENT_GID_CHANGE:
        event->port = raw.element.port_num;
        break;
      case IBV_EVENT_DEVICE_FATAL:
        event->kind = AsyncEventKind::DeviceFatal;
        break;
      default:
        break;
    }
    // After the fields are read: a QP may be destroyed once its events
    // are acknowledged.
    fn_.ackAsyncEvent(&raw);
    return true;
  }

 private:
  // ibv_query_port as verbs.h's macro does it: the provider's query_port
  // in the extended context, given the size of the struct it fills; else
  // the exported function, which fills the older (compat) prefix of a
  // zeroed struct.
  int queryPortAttributes(ibv_context* context, uint8_t port, ibv_port_attr* attr) const {
    verbs_context* extended = verbs_get_ctx_op(context, query_port);
    if (!extended) {
      std::memset(attr, 0, sizeof(*attr));
      return fn_.queryPort(context, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
    }
    return extended->query_port(context, port, attr, sizeof(*attr));
  }

  void modify(RealQp* qp, ibv_qp_attr* attr, int mask, const char* state, uint32_t peer) const {
    const int rc = fn_.modifyQp(qp->qp, attr, mask);
    if (rc == 0) return;
    const int errnum = errnoOf(rc);
    char peerText[32] = "";
    if (peer != 0) std::snprintf(peerText, sizeof(peerText), ", peer QP 0x%x", peer);
    failCall(errnum, "ibv_modify_qp to %s on %s (QP 0x%x%s)", state, qp->device->name.c_str(),
             qp->qp->qp_num, peerText);
  }

  [[noreturn]] static void failCq(const RealCq* cq, const char* call, int rc) {
    // ibv_poll_cq returns a negative number with no errno promised.
    throw Error(ErrorCode::SystemError,
                format("%s on %s failed (%d): the completion queue is broken", call,
                       cq->device->name.c_str(), rc));
  }

  const Functions& fn_;
};

}  // namespace

std::unique_ptr<VerbsBackend> loadLibibverbs(std::string* whyNot, const char* library) {
  const Library& loaded = libraryNamed(library);
  if (!loaded.why.empty()) {
    if (whyNot) *whyNot = loaded.why;
    return nullptr;
  }
  return std::make_unique<RealBackend>(loaded.fn);
}

}  // namespace braid::transport::ibverbs
