// Argument checks of the public calls: what a bad argument is told, and
// the agreement that makes every rank refuse a collective call together.
// A bad argument is never sticky: the communicator stays usable.
#pragma once

#include <initializer_list>
#include <limits>
#include <string>

#include "braid/communicator.h"
#include "core/communicator_impl.h"
#include "core/errors.h"

namespace braid {

// The communicator behind a handle, for call `op`: throws
// Error(InvalidUsage) for an empty handle, and the sticky failure of a
// failed communicator.
Communicator::Impl& usable(Communicator::Impl* impl, const char* op);

// Collective (one bootstrap all-gather): each rank's verdict on its own
// arguments of `call` ("" when fine). When any rank's are bad, every rank
// throws Error(InvalidArgument) with the first such rank's reason, so no
// rank waits for the others in a collective they never enter.
void agreeOnArguments(Communicator::Impl& impl, const char* call, const std::string& problem);

// The checks of one call's arguments (`op` names the call). Each throws
// Error(InvalidArgument) naming the argument; none changes the
// communicator, so it stays usable.
class ArgumentCheck {
 public:
  ArgumentCheck(const Communicator::Impl& impl, const char* op) : impl_(impl), op_(op) {}

  [[noreturn]] void reject(const std::string& why) const {
    fail(ErrorCode::InvalidArgument, impl_.rank, format("%s: %s", op_, why.c_str()));
  }
  void type(DataType type) const {
    if (!isValid(type))
      reject(format("argument 'type' (%d) is not a braid::DataType", static_cast<int>(type)));
  }
  void op(ReduceOp op) const {
    if (!isValid(op))
      reject(format("argument 'op' (%d) is not a braid::ReduceOp", static_cast<int>(op)));
  }
  void rank(const char* name, int value) const {
    if (value < 0 || value >= impl_.nranks)
      reject(format("argument '%s' is %d, not a rank of this %d-rank communicator", name, value,
                    impl_.nranks));
  }
  // count * blocks elements of `type` must be addressable.
  void size(const char* name, size_t count, DataType type, size_t blocks = 1) const {
    size_t bytes = 0;
    if (__builtin_mul_overflow(count, dataTypeSize(type) * blocks, &bytes) ||
        bytes > std::numeric_limits<size_t>::max() / 2)
      reject(format("argument '%s' (%zu) times the %s element size%s overflows", name, count,
                    dataTypeName(type), blocks > 1 ? " and the rank count" : ""));
  }
  void buffer(const char* name, const void* pointer, size_t count) const {
    if (pointer == nullptr && count > 0)
      reject(format("argument '%s' is null but count is %zu", name, count));
  }
  // Whether the op's buffers (those this rank uses; null ones are skipped)
  // are memory of the communicator's device, so that it runs on the device
  // executor. All host, or all this device's, and a device stream with
  // device memory; else InvalidArgument naming the argument.
  struct Named {
    const char* name;
    const void* pointer;
  };
  bool onDevice(const Stream& stream, std::initializer_list<Named> buffers) const {
    if (!impl_.device) return false;  // every pointer is host memory
    const Named* first = nullptr;
    int firstDevice = -1;
    for (const Named& buffer : buffers) {
      if (!buffer.pointer) continue;
      const int device = impl_.device->deviceOf(buffer.pointer);
      if (device >= 0 && device != impl_.deviceIndex)
        reject(format("argument '%s' is memory of device %d; this communicator's device is %d",
                      buffer.name, device, impl_.deviceIndex));
      if (!first) {
        first = &buffer;
        firstDevice = device;
      } else if ((device >= 0) != (firstDevice >= 0)) {
        reject(
            format("argument '%s' is %s memory and '%s' %s memory: both must be host memory "
                   "or both device memory",
                   first->name, firstDevice >= 0 ? "device" : "host", buffer.name,
                   device >= 0 ? "device" : "host"));
      }
    }
    if (firstDevice < 0) return false;
    if (!stream.isDevice())
      reject(
          format("argument 'stream': '%s' is device memory, which needs Stream::cuda(stream) "
                 "(the host streams cannot order device work)",
                 first->name));
    if (!impl_.deviceExecutor)
      fail(ErrorCode::InvalidUsage, impl_.rank,
           format("%s: device buffers cannot be used by this communicator: %s", op_,
                  impl_.noDevice.c_str()));
    return true;
  }

 private:
  const Communicator::Impl& impl_;
  const char* op_;
};

}  // namespace braid
