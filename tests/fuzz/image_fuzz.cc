// libFuzzer target: bytes as an image through image_size_bytes (the header only) and, as a file,
// decode_image (data/image.h: PNG and JPEG via libpng and libjpeg-turbo) and, for every image it
// accepts, the tower's resize. The decoder may only throw tt::Error; any other exception, a
// crash, a sanitizer report, a leak or a hang is a bug (libpng and libjpeg are Debian's,
// uninstrumented: this guards our side of them, the setjmp error path included).
#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "base/check.h"
#include "data/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/image_fuzz_" + std::to_string(::getpid()) + ".bin";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {  // the header-only read a server checks sizes with (its own setjmp path for JPEG)
    tt::data::image_size_bytes(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const tt::Error&) {
  }
  try {
    const tt::data::Image img = tt::data::decode_image(path);
    if ((int64_t)img.width * img.height <= (int64_t)1 << 20) tt::data::tower_pixels(img, 8, {0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f});
  } catch (const tt::Error&) {
  }
  return 0;
}
