// Per-communicator options. Every field left at its default falls back to the
// matching environment knob (see `braid-info --config`), then to the built-in
// default.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

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

// Encrypts braid's TCP sockets with TLS 1.3 and a key made from `secret`
// (at least 32 bytes), for every connection this process makes or takes
// from then on: the bootstrap's, the tcp transport's, the one-sided
// links'. An empty secret chooses plaintext, the default. Every process of
// a job must choose alike before its first communicator;
// BRAID_SOCKET_KEY_FILE makes the choice from the environment instead.
// Shared memory, cuda_ipc and what ucx and ibverbs move stay outside.
// Throws Error(InvalidArgument) for a shorter secret, Error(InvalidUsage)
// once sockets were made under another choice, or when this build has no
// TLS (BRAID_TLS).
void setSocketSecret(std::string_view secret);

}  // namespace braid
