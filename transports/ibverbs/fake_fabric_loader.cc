// Loading libbraid_fake_fabric.so (fake_fabric_loader.h).
#include "transports/ibverbs/fake_fabric_loader.h"

#include <dlfcn.h>

#include <map>
#include <mutex>

#include "braid/error.h"
#include "core/errors.h"

namespace braid::transport::ibverbs {
namespace {

struct Loaded {
  FakeFabricCreate create = nullptr;
  std::string why;  // set where `create` is nullptr
};

// The folder of the object this code was linked into (libbraid.so; a test
// program that compiles this file itself), "" where the loader cannot say.
std::string ownDirectory() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&loadFakeFabric), &info) == 0 || !info.dli_fname) return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// dlopen of `file`; on failure nullptr, with `*reason` set to dlerror()'s
// reason less the file name it starts with.
void* tryOpen(const std::string& file, std::string* reason) {
  void* handle = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* error = ::dlerror();
    *reason = error ? error : "no reason given";
    const std::string prefix = file + ": ";
    if (reason->compare(0, prefix.size(), prefix) == 0) reason->erase(0, prefix.size());
  }
  return handle;
}

// Kept short: the reason reaches every rank in a message of 243 bytes.
Loaded load(const std::string& directory) {
  Loaded out;
  const std::string beside = directory.empty() ? "" : directory + "/" + kFakeFabricLibrary;
  std::string besideReason, searchReason;
  void* handle = beside.empty() ? nullptr : tryOpen(beside, &besideReason);
  if (!handle) handle = tryOpen(kFakeFabricLibrary, &searchReason);
  if (!handle) {
    const std::string search =
        format("%s on the loader's search path (%s)", kFakeFabricLibrary,
               searchReason == besideReason ? "the same" : searchReason.c_str());
    out.why = beside.empty() ? format("BRAID_IB_FAKE: cannot load %s", search.c_str())
                             : format("BRAID_IB_FAKE: cannot load %s (%s) nor %s", beside.c_str(),
                                      besideReason.c_str(), search.c_str());
    return out;
  }
  out.create = reinterpret_cast<FakeFabricCreate>(::dlsym(handle, kFakeFabricEntry));
  if (!out.create) {
    Dl_info info{};
    const bool named = ::dladdr(handle, &info) != 0 && info.dli_fname;
    out.why = format("BRAID_IB_FAKE: %s lacks %s", named ? info.dli_fname : kFakeFabricLibrary,
                     kFakeFabricEntry);
  }
  return out;
}

// Each folder's attempt, made once per process and kept.
const Loaded& loadedFrom(const std::string& directory) {
  static std::mutex mutex;
  static std::map<std::string, Loaded> loaded;  // by folder; mutex held
  std::lock_guard<std::mutex> lock(mutex);
  auto found = loaded.find(directory);
  if (found == loaded.end()) found = loaded.emplace(directory, load(directory)).first;
  return found->second;
}

}  // namespace

std::unique_ptr<VerbsBackend> loadFakeFabric(const std::string& fabric, const std::string& fault,
                                             std::string* whyNot, const std::string& directory) {
  const Loaded& loaded = loadedFrom(directory.empty() ? ownDirectory() : directory);
  if (!loaded.create) {
    if (whyNot) *whyNot = loaded.why;
    return nullptr;
  }
  int code = 0;
  std::string message;
  std::unique_ptr<VerbsBackend> backend(
      loaded.create(kFakeFabricInterface, fabric.c_str(), fault.c_str(), &code, &message));
  if (backend) return backend;
  if (code == 0) {
    if (whyNot)
      *whyNot = format("BRAID_IB_FAKE: %s refused: %s", kFakeFabricLibrary, message.c_str());
    return nullptr;
  }
  throw Error(static_cast<ErrorCode>(code), message);
}

}  // namespace braid::transport::ibverbs
