// Per-communicator options. Every field left at its default falls back to the
// matching environment knob (see `braid-info --config`), then to the built-in
// default.
#pragma once

#include <chrono>
#include <string>

namespace braid {

struct Config {
  // How long any wait (init, each op, destroy) may take before it fails with
  // ErrorCode::Timeout. Default: 0, meaning BRAID_TIMEOUT (300 s unless set).
  std::chrono::milliseconds timeout{0};

  // Ordered, comma-separated list of transports to use, e.g. "tcp".
  // Default: "", meaning BRAID_TRANSPORT, else the best transport per peer.
  std::string transports;

  // Network interface for bootstrap and TCP traffic, e.g. "eth0".
  // Default: "", meaning BRAID_SOCKET_IFNAME, else the interface that routes
  // to the root.
  std::string socketIfname;

  // Bytes per pipeline chunk of a collective step. Default: 0, meaning
  // BRAID_CHUNK_BYTES.
  size_t chunkBytes = 0;

  // The GPU whose memory the communicator's device buffers live in (with
  // BRAID_DEVICE=emulated, an emulated device). Default: -1, meaning the
  // calling thread's current device at init, as NCCL takes it.
  int device = -1;
};

}  // namespace braid
