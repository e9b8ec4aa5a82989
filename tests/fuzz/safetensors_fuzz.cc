// libFuzzer target: bytes as a safetensors file (model/safetensors.h, read from memory). The
// reader may only throw tt::Error; a crash, a sanitizer report, a leak, a hang or an allocation
// beyond what the bytes can describe is a bug.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "base/check.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size), std::ios::binary);
  try {
    size_t values = 0;
    for (const auto& [name, t] : tt::model::read_safetensors(in, "fuzz.safetensors")) values += t.values.size();
    if (values * 2 > size) __builtin_trap();  // every value is at least 2 bytes of the input
  } catch (const tt::Error&) {
  }
  return 0;
}
