// libFuzzer target: the knob parsers, as the environment feeds them. Every
// value is either accepted or refused with braid::Error(InvalidArgument)
// naming the knob; nothing else.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "braid/config.h"
#include "braid/error.h"
#include "core/knobs.h"
#include "tuning/algo_choice.h"

namespace {

void check(bool condition) {
  if (!condition) __builtin_trap();
}

// Runs `parse`; a refusal must be InvalidArgument and mention `name`.
template <typename Parse>
void expectParsedOrRefused(const char* name, Parse parse) {
  try {
    parse();
  } catch (const braid::Error& error) {
    check(error.code() == braid::ErrorCode::InvalidArgument);
    check(std::string(error.what()).find(name) != std::string::npos);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The environment holds C strings: stop at the first NUL.
  std::string text(reinterpret_cast<const char*>(data), size);
  text = text.substr(0, text.find('\0'));
  expectParsedOrRefused("X_BYTES", [&] { braid::parseBytes(text, "X_BYTES"); });
  expectParsedOrRefused("X_DURATION", [&] { braid::parseDuration(text, "X_DURATION"); });
  expectParsedOrRefused("X_INT", [&] { braid::parseInt(text, "X_INT"); });
  expectParsedOrRefused("BRAID_ALGO", [&] { braid::tuning::AlgoPreference::parse(text); });
  // Through the environment, one knob at a time, as a user would set it.
  for (const char* knob : {"BRAID_TIMEOUT", "BRAID_CHUNK_BYTES", "BRAID_SLOTS", "BRAID_TUNING",
                           "BRAID_ALGO", "BRAID_DETERMINISTIC"}) {
    ::setenv(knob, text.c_str(), 1);
    expectParsedOrRefused(knob, [&] { braid::Knobs::resolve(braid::Config{}); });
    ::unsetenv(knob);
  }
  return 0;
}
