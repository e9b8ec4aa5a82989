// Base64 (see base64.h).
#include "base/base64.h"

#include <algorithm>
#include <cstdint>

#include "base/check.h"

namespace tt {
namespace {

const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

std::string base64_encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k) v = v << 8 | (k < n ? (uint8_t)bytes[i + k] : 0);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? kAlphabet[(v >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

std::string base64_decode(const std::string& text, const std::string& what) {
  if (text.size() % 4 != 0)
    throw Error(str(what, ": base64 of ", text.size(), " characters, expected a multiple of 4"));
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        ++pad;
        v <<= 6;
        continue;
      }
      const int x = value(c);
      if (x < 0 || pad > 0)
        throw Error(str(what, ": not base64 at character ", i + k, " ('", c, "'), expected A-Z a-z 0-9 + / and = padding"));
      v = v << 6 | (uint32_t)x;
    }
    for (int k = 0; k < 3 - pad; ++k) out += (char)((v >> (16 - 8 * k)) & 255);
  }
  return out;
}

}  // namespace tt
