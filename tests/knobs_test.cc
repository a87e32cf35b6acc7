// The knob parsers: what they accept, and that everything else is refused
// with InvalidArgument naming the knob (tests/fuzz/fuzz_knobs.cc throws
// arbitrary text at them).
#include "core/knobs.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "braid/config.h"
#include "braid/error.h"
#include "core/log.h"
#include "tuning/algo_choice.h"

namespace braid {
namespace {

template <typename Parse>
void expectRefused(const std::string& text, const char* name, Parse parse) {
  try {
    parse(text);
    ADD_FAILURE() << name << " accepted '" << text << "'";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::InvalidArgument) << error.what();
    EXPECT_NE(std::string(error.what()).find(name), std::string::npos) << error.what();
  }
}

TEST(Knobs, SizesAcceptUnitsAndRefuseWhatDoesNotFit) {
  EXPECT_EQ(parseBytes("4096", "B"), 4096u);
  EXPECT_EQ(parseBytes("64K", "B"), 65536u);
  EXPECT_EQ(parseBytes("8KiB", "B"), 8192u);
  EXPECT_EQ(parseBytes("1.5m", "B"), 1572864u);
  EXPECT_EQ(parseBytes("2G", "B"), size_t{2} << 30);
  auto bytes = [](const std::string& text) { return parseBytes(text, "BRAID_X_BYTES"); };
  const std::string nines(400, '9');
  // The first found by fuzzing: 2^64 * 10 once overflowed the conversion.
  for (const char* bad : {"184467440737095516160", "9000000000000000000", "8388608T", "16X", "",
                          "-1", "K", "1e3", nines.c_str()})
    expectRefused(bad, "BRAID_X_BYTES", bytes);
}

TEST(Knobs, DurationsAcceptUnitsAndRefuseWhatDoesNotFit) {
  EXPECT_EQ(parseDuration("30", "T").count(), 30000);
  EXPECT_EQ(parseDuration("1500ms", "T").count(), 1500);
  EXPECT_EQ(parseDuration("2m", "T").count(), 120000);
  auto duration = [](const std::string& text) { return parseDuration(text, "BRAID_X_TIME"); };
  const std::string nines(400, '9');
  for (const char* bad : {"99999999999999999999", "1e9", "5h", "", "ms", nines.c_str()})
    expectRefused(bad, "BRAID_X_TIME", duration);
}

TEST(Knobs, IntegersStayInTheIntRange) {
  EXPECT_EQ(parseInt("-12", "I"), -12);
  auto integer = [](const std::string& text) { return parseInt(text, "BRAID_X_INT"); };
  for (const char* bad : {"2147483648", "-2147483649", "12a", "", " 1", "+1", "-"})
    expectRefused(bad, "BRAID_X_INT", integer);
}

// NCCL_ALGO in NCCL's syntax becomes braid's nearest algorithms.
TEST(Knobs, NcclAlgoMapsToBraidsNearestAlgorithms) {
  EXPECT_EQ(tuning::fromNcclAlgo("Ring"),
            "allreduce:ring,broadcast:chain,reduce:chain,allgather:ring,reducescatter:ring");
  EXPECT_EQ(tuning::fromNcclAlgo("TREE,ring"),
            "allreduce:tree,allreduce:ring,broadcast:chain,reduce:chain,allgather:ring,"
            "reducescatter:ring");
  EXPECT_EQ(tuning::fromNcclAlgo("^ring,nvls"),
            "allreduce:tree,allgather:bruck,reducescatter:rechalving");
  EXPECT_EQ(tuning::fromNcclAlgo("allreduce:tree;broadcast:ring"),
            "allreduce:tree,broadcast:chain");
  EXPECT_EQ(tuning::fromNcclAlgo("allgather:^ring"), "allgather:bruck");
  EXPECT_EQ(tuning::fromNcclAlgo("NVLS,CollnetDirect"), "");  // nothing of a host's: braid picks
  for (const char* bad : {"Rings", "allreduce:fast", "everything:ring"})
    expectRefused(bad, "NCCL_ALGO", [](const std::string& text) { tuning::fromNcclAlgo(text); });
  // Every translation is a list BRAID_ALGO accepts.
  tuning::AlgoPreference::parse(tuning::fromNcclAlgo("tree,ring,pat"));

  // The alias counts only while BRAID_ALGO is unset.
  ::setenv("NCCL_ALGO", "Tree", 1);
  EXPECT_EQ(Knobs::resolve(Config{}).algo, "allreduce:tree");
  ::setenv("BRAID_ALGO", "ring", 1);
  EXPECT_EQ(Knobs::resolve(Config{}).algo, "ring");
  ::unsetenv("BRAID_ALGO");
  ::setenv("NCCL_ALGO", "Spiral", 1);
  expectRefused("", "NCCL_ALGO", [](const std::string&) { Knobs::resolve(Config{}); });
  ::unsetenv("NCCL_ALGO");
}

// NCCL's logging variables count while braid's are unset. (The settings are
// read once per process: this test sets them before anything logs.)
TEST(Knobs, NcclDebugVariablesSetTheLogLevelAndSubsystems) {
  ::setenv("NCCL_DEBUG", "INFO", 1);
  ::setenv("NCCL_DEBUG_SUBSYS", "INIT,NET", 1);
  ::unsetenv("BRAID_LOG_LEVEL");
  ::unsetenv("BRAID_LOG_SUBSYS");
  EXPECT_TRUE(log::enabled(log::Level::Info, log::Subsys::Init));
  EXPECT_TRUE(log::enabled(log::Level::Info, log::Subsys::Net));  // NCCL's NET
  EXPECT_FALSE(log::enabled(log::Level::Info, log::Subsys::Coll));
  EXPECT_FALSE(log::enabled(log::Level::Debug, log::Subsys::Init));
  // The socket interface alias.
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  EXPECT_EQ(Knobs::resolve(Config{}).socketIfname, "lo");
  ::unsetenv("NCCL_SOCKET_IFNAME");
}

}  // namespace
}  // namespace braid
