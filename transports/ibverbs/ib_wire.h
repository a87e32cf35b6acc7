// The connection info one rank sends the other for one ibverbs connection,
// through the bootstrap's out-of-band exchange: how to reach its QPs and
// where its FIFO is. Internal to transports/ibverbs. Credit needs no
// address: it travels in the immediate of a zero-byte RDMA WRITE_WITH_IMM
// (ibverbs_connection.h).
//
// Layout, little-endian, with no padding (encodedSize(n) = 52 + 8n bytes);
// fifoAddress keeps its 8-byte alignment:
//   0  u32  magic kWireMagic ("BRIB")
//   4  u16  version (kWireVersion)
//   6  u16  QP count n, 1..kWireMaxQps
//   8  u16  lid
//  10  u8   useGid, 0 or 1
//  11  u8   reserved, 0
//  12  16   gid
//  28  u32  mtu, bytes: 256, 512, 1024, 2048 or 4096
//  32  u64  fifoAddress
//  40  u32  fifoRkey
//  44  u32  slots, >= 2
//  48  u32  slotBytes, >= 1
//  52  u32  qpNums[n]
//  ..  u32  psns[n]
// The QP count is sent once, so qpNums and psns cannot disagree on the
// wire; encode() refuses a struct where they do. Every byte is checked, so
// what decodes encodes back to the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "transports/ibverbs/verbs_backend.h"

namespace braid::transport::ibverbs {

constexpr uint32_t kWireMagic = 0x42495242;  // "BRIB" as the bytes are sent
constexpr uint16_t kWireVersion = 1;
constexpr size_t kWireMaxQps = 16;

struct EndpointInfo {
  uint16_t lid = 0;              // InfiniBand: the port's LID
  Gid gid;                       // RoCE, or InfiniBand across subnets
  bool useGid = false;           // the peer addresses this end by gid
  uint32_t mtu = 0;              // this port's active MTU; both use the smaller
  std::vector<uint32_t> qpNums;  // one per QP, in the order both ends stripe over
  std::vector<uint32_t> psns;    // each QP's initial send PSN
  // This rank's receive slots, which the peer writes into:
  // slots * slotBytes bytes at fifoAddress.
  uint64_t fifoAddress = 0;
  uint32_t fifoRkey = 0;
  uint32_t slots = 0;
  uint32_t slotBytes = 0;

  bool operator==(const EndpointInfo& other) const;
  bool operator!=(const EndpointInfo& other) const { return !(*this == other); }
};

// The encoded size for `qps` QPs, so both ends can exchange fixed-size
// records.
constexpr size_t encodedSize(size_t qps) { return 52 + 8 * qps; }

// Throws Error(Internal) for a struct decode() would refuse (a braid bug:
// the struct is this rank's own).
std::vector<std::byte> encode(const EndpointInfo& info);

// Throws Error(RemoteError) saying what is wrong: truncated (naming the
// field), wrong magic, unsupported version, QP count 0 or over kWireMaxQps,
// useGid or reserved byte out of range, mtu not a power of two in
// 256..4096, fewer than 2 slots, slotBytes 0, bytes after the last field.
EndpointInfo decode(const void* data, size_t bytes);

}  // namespace braid::transport::ibverbs
