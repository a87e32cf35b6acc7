#include "device_cases.h"

#include "core/errors.h"
#include "reference.h"

namespace braid::testing {
namespace {

size_t sendCountOf(const Case& c, int nranks) {
  return c.coll == Coll::ReduceScatter ? c.count * nranks : c.count;
}
size_t recvCountOf(const Case& c, int nranks) {
  return c.coll == Coll::AllGather ? c.count * nranks : c.count;
}

}  // namespace

const char* collName(Coll c) {
  static const char* const kNames[] = {"allReduce", "broadcast", "reduce", "allGather",
                                       "reduceScatter"};
  return kNames[static_cast<int>(c)];
}

bool reduces(Coll c) {
  return c == Coll::AllReduce || c == Coll::Reduce || c == Coll::ReduceScatter;
}

const std::vector<Coll> kAllColls = {Coll::AllReduce, Coll::Broadcast, Coll::Reduce,
                                     Coll::AllGather, Coll::ReduceScatter};

std::string label(const Case& c, int nranks) {
  return std::string(collName(c.coll)) + " " + dataTypeName(c.type) + " " + reduceOpName(c.op) +
         " count " + std::to_string(c.count) + (c.inPlace ? " in place" : " out of place") +
         " root " + std::to_string(c.root) + " at " + std::to_string(nranks) + " ranks: ";
}

size_t IssuedCase::sendBytes(const Case& c, int nranks) {
  return sendCountOf(c, nranks) * dataTypeSize(c.type);
}
size_t IssuedCase::recvBytes(const Case& c, int nranks) {
  return recvCountOf(c, nranks) * dataTypeSize(c.type);
}

IssuedCase::IssuedCase(Communicator& comm, TestStream& stream, const Case& c, uint64_t seed)
    : comm_(comm),
      case_(c),
      seed_(seed),
      ownSend_(std::make_unique<DeviceBuffer>(comm.device(), sendBytes(c, comm.size()))),
      ownRecv_(std::make_unique<DeviceBuffer>(comm.device(), recvBytes(c, comm.size()))),
      send_(ownSend_->data()),
      recv_(ownRecv_->data()) {
  issue(stream);
}

IssuedCase::IssuedCase(Communicator& comm, TestStream& stream, const Case& c, uint64_t seed,
                       std::byte* send, std::byte* recv)
    : comm_(comm), case_(c), seed_(seed), send_(send), recv_(recv) {
  issue(stream);
}

void IssuedCase::issue(TestStream& stream) {
  const Case& c = case_;
  Communicator& comm = comm_;
  device::Device& dev = *device::current();
  const int r = comm.rank();
  const size_t size = dataTypeSize(c.type), sendCount = sendCountOf(c, comm.size());
  const std::vector<std::byte> sendPoison = poisoned(c.type, sendCount);
  const std::vector<std::byte> recvPoison = poisoned(c.type, recvCountOf(c, comm.size()));
  dev.copyNow(send_, sendPoison.data(), sendPoison.size());
  dev.copyNow(recv_, recvPoison.data(), recvPoison.size());
  std::vector<std::byte> input(sendCount * size);
  fillInput(c.type, c.op, seed_, r, 0, sendCount, input.data());
  std::byte* send = send_;
  std::byte* recv = recv_;
  auto upload = [&](std::byte* to) { dev.copyNow(to, input.data(), input.size()); };
  switch (c.coll) {
    case Coll::AllReduce:
      upload(send);
      work_ = comm.allReduce(send, c.inPlace ? send : recv, c.count, c.type, c.op, stream.stream());
      break;
    case Coll::Broadcast:
      if (r == c.root) upload(c.inPlace ? recv : send);
      work_ = comm.broadcast(c.inPlace ? recv : (r == c.root ? send : nullptr), recv, c.count,
                             c.type, c.root, stream.stream());
      break;
    case Coll::Reduce:
      upload(send);
      work_ = comm.reduce(send, c.inPlace ? send : recv, c.count, c.type, c.op, c.root,
                          stream.stream());
      break;
    case Coll::AllGather: {
      std::byte* in = c.inPlace ? recv + r * c.count * size : send;
      upload(in);
      work_ = comm.allGather(in, recv, c.count, c.type, stream.stream());
      break;
    }
    case Coll::ReduceScatter:
      upload(send);
      work_ = comm.reduceScatter(send, c.inPlace ? send + r * c.count * size : recv, c.count,
                                 c.type, c.op, stream.stream());
      break;
  }
}

std::vector<std::byte> IssuedCase::download(const std::byte* from, size_t bytes) const {
  std::vector<std::byte> host(bytes);
  device::current()->copyNow(host.data(), from, bytes);
  return host;
}

std::string IssuedCase::check() {
  const Case& c = case_;
  const int n = comm_.size(), r = comm_.rank();
  const size_t size = dataTypeSize(c.type);
  work_.wait();  // rethrows the op's error
  if (!work_.test()) return label(c, n) + "Work::test() is false after wait()";
  const bool outInSend = c.inPlace && c.coll != Coll::Broadcast && c.coll != Coll::AllGather;
  const std::vector<std::byte> out =
      outInSend ? download(send_, sendBytes(c, n)) : download(recv_, recvBytes(c, n));
  std::string problem;
  switch (c.coll) {
    case Coll::AllReduce:
      problem = checkReduced(c.type, c.op, seed_, n, 0, c.count, out.data());
      break;
    case Coll::Broadcast:
      problem = checkCopied(c.type, c.op, seed_, c.root, 0, c.count, out.data());
      break;
    case Coll::Reduce:
      if (r == c.root) problem = checkReduced(c.type, c.op, seed_, n, 0, c.count, out.data());
      break;
    case Coll::AllGather:
      for (int b = 0; b < n && problem.empty(); ++b)
        problem = checkCopied(c.type, c.op, seed_, b, 0, c.count, out.data() + b * c.count * size);
      break;
    case Coll::ReduceScatter:
      problem = checkReduced(c.type, c.op, seed_, n, r * c.count, c.count,
                             out.data() + (c.inPlace ? r * c.count * size : 0));
      break;
  }
  return problem.empty() ? "" : label(c, n) + problem;
}

std::string runCase(Communicator& comm, TestStream& stream, const Case& c, uint64_t seed) {
  IssuedCase issued(comm, stream, c, seed);
  stream.synchronize();
  return issued.check();
}

}  // namespace braid::testing
