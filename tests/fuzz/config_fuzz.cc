// libFuzzer target: YAML text through the strict run config (trainer/config.h parse_config_text,
// which validates) and, when it is accepted, its resolved YAML back through the parser, which
// must accept it again. Only tt::Error may come out; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "base/check.h"
#include "trainer/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  tt::trainer::RunConfig cfg;
  try {
    cfg = tt::trainer::parse_config_text(text, "fuzz.yaml", {});
  } catch (const tt::Error&) {
    return 0;
  }
  try {
    tt::trainer::parse_config_text(cfg.to_yaml(), "fuzz-resolved.yaml", {});
  } catch (const tt::Error&) {
    // The resolved config of an accepted config must load back (it is written next to every
    // checkpoint and read on resume).
    __builtin_trap();
  }
  return 0;
}
