#include "transports/self/self_transport.h"

#include <vector>

#include "transports/pages.h"
#include "tuning/cost_model.h"

namespace braid::transport::self {
namespace {

// A ring of slots: the sender fills slot `tail`, the receiver reads `head`.
// No allocation per message: the slots are allocated once, here.
class Loopback final : public Connection {
 public:
  Loopback(size_t slotBytes, int slots)
      : slotBytes_(slotBytes), memory_(slotBytes * slots), messages_(slots) {}

  size_t slotBytes() const override { return slotBytes_; }

  std::byte* sendSlot(size_t) override {
    if (tail_ - head_ == messages_.size()) return nullptr;
    return memory_.data() + (tail_ % messages_.size()) * slotBytes_;
  }
  void postSend(uint32_t bytes, uint32_t tag) override {
    Message& m = messages_[tail_ % messages_.size()];
    m.data = memory_.data() + (tail_ % messages_.size()) * slotBytes_;
    m.bytes = bytes;
    m.tag = tag;
    ++tail_;
  }
  const Message* peekRecv() override {
    return head_ == tail_ ? nullptr : &messages_[head_ % messages_.size()];
  }
  void releaseRecv() override { ++head_; }
  bool flushed() const override { return true; }
  bool peerClosed() const override { return false; }

 private:
  size_t slotBytes_;
  Pages memory_;
  std::vector<Message> messages_;
  size_t head_ = 0;  // next message to read
  size_t tail_ = 0;  // next slot to fill
};

// Owns the one connection. A posted message is already in the receiver's
// hands (passive), and there is never anything to wait for.
class SelfTransport final : public Transport {
 public:
  SelfTransport(size_t slotBytes, int slots) : loopback_(slotBytes, slots) {}
  const char* name() const override { return "self"; }
  Connection& connection(int) override { return loopback_; }
  bool progress() override { return false; }
  bool passive() const override { return true; }
  void waitForActivity(Clock::time_point) override {}

 private:
  Loopback loopback_;
};

// Not collective: the only peer is this rank (the table's Reach::Self).
std::unique_ptr<Transport> create(const Setup& setup, const std::vector<int>&, std::string*) {
  return std::make_unique<SelfTransport>(setup.slotBytes, setup.slots);
}

}  // namespace

TransportEntry entry() {
  TransportEntry entry("self", Reach::Self, "a rank's connection to itself");
  entry.create = create;
  entry.hostLink = tuning::hostLinkModel(0.15e-6, 12e9);  // a copy, as within shm
  return entry;
}

}  // namespace braid::transport::self
