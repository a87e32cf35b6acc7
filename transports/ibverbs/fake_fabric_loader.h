// Loading the fake fabric: the VerbsBackend the tests run the ibverbs
// transport over (tests/fake_fabric/fake_fabric.h). It is test equipment,
// so libbraid does not contain it: it is a library of its own,
// libbraid_fake_fabric.so, built beside libbraid.so and not installed, and
// libbraid loads it with dlopen when BRAID_IB_FAKE names a fabric, as
// verbs_real.h loads libibverbs.
//
// This header is the whole contract between the two: the library's name,
// its one exported symbol (C linkage, so no mangled name is part of it),
// that symbol's type, and the interface version both were built with.
#pragma once

#include <memory>
#include <string>

#include "transports/ibverbs/verbs_backend.h"

namespace braid::transport::ibverbs {

constexpr const char* kFakeFabricLibrary = "libbraid_fake_fabric.so";
constexpr const char* kFakeFabricEntry = "braid_fake_fabric_create";
// Raised whenever FakeFabricCreate or VerbsBackend changes; a library built
// for another number refuses to make a backend.
constexpr int kFakeFabricInterface = 1;

// The entry point: a new backend for `fabric` with the fault spec `fault`
// ("" for none), owned by the caller, who deletes it through VerbsBackend's
// virtual destructor. On failure nullptr, with `*message` saying why and
// `*code` the ErrorCode the caller is to throw, or 0 where the library was
// built for an interface other than `version` (then it cannot serve the
// caller at all). Throws nothing.
using FakeFabricCreate = VerbsBackend* (*)(int version, const char* fabric, const char* fault,
                                           int* code, std::string* message);

// Loads the library (once per process and folder, thread-safe; never
// unloaded: its fork handler and its backends' code stay in use) and makes
// a backend over `fabric`. The library is looked for in `directory`, by
// default the one libbraid.so was loaded from, then by its plain name
// through the dynamic loader's search path. Returns nullptr with `*whyNot`
// set to one line where it cannot be loaded (naming BRAID_IB_FAKE and each
// path tried with dlerror()'s reason), or where it was built for another
// interface. Throws the Error the library reports: InvalidArgument for a
// fault spec it cannot read (naming BRAID_IB_FAKE_FAULT) or a fabric name
// that is too long.
std::unique_ptr<VerbsBackend> loadFakeFabric(const std::string& fabric, const std::string& fault,
                                             std::string* whyNot,
                                             const std::string& directory = "");

}  // namespace braid::transport::ibverbs
