// Camera frames for the VLA data path (issue 16): PNG and JPEG files decoded with Debian's libpng
// and libjpeg-turbo (linked statically), then resized and normalised as a vision tower's
// processor does.
//
// decode_image reads 8-bit RGB (grey and palette images expanded, alpha dropped, 16-bit PNG
// channels reduced to their high byte); the format is told by the file's signature, not its name.
// Every failure is a tt::Error naming the file and what is wrong (missing, not PNG or JPEG,
// truncated or corrupt, larger than kMaxImageSide).
// tower_pixels resizes to size x size with bilinear interpolation (half-pixel centres, the
// antialias-free convention) and maps each channel c to (x / 255 - mean[c]) / std[c], in
// channel-first order (3, size, size), as SigLIP's processor feeds its patch embedding
// (mean = std = 0.5).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace tt::data {

constexpr int kMaxImageSide = 16384;

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // (height, width, 3)
};

Image decode_image(const std::string& path);
// The same from bytes in memory (a policy server's base64 payload); `what` names them in errors.
Image decode_image_bytes(const std::string& bytes, const std::string& what);
struct ImageSize {
  int width = 0, height = 0;
};
// The size a PNG or JPEG in memory declares in its header, its pixels not decoded (a server
// rejects a wrongly sized image before paying for it: a 20-byte header may claim 16384 x 16384).
// The same errors as decode_image_bytes for bytes that are not PNG or JPEG, an unreadable header
// or sides outside [1, kMaxImageSide]; a corrupt body shows only when decoded.
ImageSize image_size_bytes(const std::string& bytes, const std::string& what);
// An 8-bit RGB PNG in memory.
std::string encode_png(const Image& img);

// Writes an 8-bit RGB PNG (libpng's simplified API); a tt::Error names the file on failure.
// Generated episodes (tests, the built-in environment) write their frames with it.
void write_png(const std::string& path, const Image& img);

std::vector<float> tower_pixels(const Image& img, int size, const std::array<float, 3>& mean,
                                const std::array<float, 3>& std);

}  // namespace tt::data
