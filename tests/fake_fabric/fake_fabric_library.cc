// libbraid_fake_fabric.so's one exported symbol: the entry point of
// transports/ibverbs/fake_fabric_loader.h, which makes a fake fabric
// (fake_fabric.h) for libbraid. Errors cross as a code and a message, not
// as exceptions, so nothing rests on the library's hidden copy of
// braid::Error matching libbraid's.
#include <exception>
#include <string>
#include <type_traits>

#include "braid/error.h"
#include "tests/fake_fabric/fake_fabric.h"
#include "transports/ibverbs/fake_fabric_loader.h"

namespace braid::transport::ibverbs {

extern "C" __attribute__((visibility("default"))) VerbsBackend* braid_fake_fabric_create(
    int version, const char* fabric, const char* fault, int* code, std::string* message) {
  *code = 0;
  if (version != kFakeFabricInterface) {
    *message = "it was built for interface " + std::to_string(kFakeFabricInterface) +
               ", libbraid asks for " + std::to_string(version);
    return nullptr;
  }
  try {
    return makeFakeFabric({fabric, fault}).release();
  } catch (const Error& error) {
    *code = static_cast<int>(error.code());
    *message = error.what();
  } catch (const std::exception& error) {
    *code = static_cast<int>(ErrorCode::Internal);
    *message = std::string("fake fabric: ") + error.what();
  }
  return nullptr;
}

// The loader casts what dlsym finds to FakeFabricCreate.
static_assert(std::is_same_v<decltype(&braid_fake_fabric_create), FakeFabricCreate>);

}  // namespace braid::transport::ibverbs
