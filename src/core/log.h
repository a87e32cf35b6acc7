// Leveled, subsystem-filtered logging: BRAID_LOG_LEVEL, BRAID_LOG_SUBSYS,
// BRAID_LOG_FILE. Each line carries rank, pid and subsystem:
//   braid[rank 1 pid 4242 bootstrap] warn: dropped a connection without the job secret
#pragma once

#include <cstdarg>

namespace braid::log {

enum class Level : int { Off = 0, Warn = 1, Info = 2, Debug = 3, Trace = 4 };

// Subsystems name where a line comes from; BRAID_LOG_SUBSYS=init,net keeps
// only those (default: all).
enum class Subsys : int { Init, Bootstrap, Net, Exec, Coll, Env };

// True when a line at `level` from `subsys` would be written. Cheap: the
// configuration is read from the environment once per process, and again
// on reload().
bool enabled(Level level, Subsys subsys);

// Reads the logging variables of the environment again (NCCL's
// ncclResetDebugInit). Safe while other threads log.
void reload();

void write(Level level, Subsys subsys, const char* format, ...)
    __attribute__((format(printf, 3, 4)));

// The rank printed on each line; the first communicator sets it.
void setRank(int rank);

}  // namespace braid::log

#define BRAID_WARN(subsys, ...)                                                                  \
  do {                                                                                           \
    if (::braid::log::enabled(::braid::log::Level::Warn, ::braid::log::Subsys::subsys))          \
      ::braid::log::write(::braid::log::Level::Warn, ::braid::log::Subsys::subsys, __VA_ARGS__); \
  } while (0)
#define BRAID_INFO(subsys, ...)                                                                  \
  do {                                                                                           \
    if (::braid::log::enabled(::braid::log::Level::Info, ::braid::log::Subsys::subsys))          \
      ::braid::log::write(::braid::log::Level::Info, ::braid::log::Subsys::subsys, __VA_ARGS__); \
  } while (0)
#define BRAID_DEBUG(subsys, ...)                                                                  \
  do {                                                                                            \
    if (::braid::log::enabled(::braid::log::Level::Debug, ::braid::log::Subsys::subsys))          \
      ::braid::log::write(::braid::log::Level::Debug, ::braid::log::Subsys::subsys, __VA_ARGS__); \
  } while (0)
