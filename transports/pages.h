// Pages: a connection's FIFO memory, mapped privately from the system.
// The kernel zeroes a page when it is first touched, so a FIFO costs
// nothing until its slots are used, and all of it goes back to the system
// when the connection ends (memory from malloc of this size would stay in
// the allocator's heap, resident, once touched).
#pragma once

#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

#include "braid/error.h"

namespace braid::transport {

class Pages {
 public:
  explicit Pages(size_t bytes) : bytes_(bytes) {
    if (bytes_ == 0) return;
    void* memory =
        ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED)
      throw Error(ErrorCode::SystemError, "braid: mapping " + std::to_string(bytes_) +
                                              " bytes for a FIFO failed: " + std::strerror(errno));
    data_ = static_cast<std::byte*>(memory);
  }
  ~Pages() {
    if (data_) ::munmap(data_, bytes_);
  }
  Pages(const Pages&) = delete;
  Pages& operator=(const Pages&) = delete;

  std::byte* data() const { return data_; }

 private:
  size_t bytes_;
  std::byte* data_ = nullptr;
};

}  // namespace braid::transport
