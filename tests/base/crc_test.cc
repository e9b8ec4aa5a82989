// base/crc.h: a file's CRC-32 read in parallel pieces equals the one of its bytes at once (the
// standard check value of "123456789" too), every byte counts, and errors name the file.
#include "base/crc.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>

#include "base/check.h"

namespace tt {
namespace {

std::string temp_file(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return path;
}

// The CRC-32 of bytes, bit by bit (the reference: reflected polynomial 0xEDB88320).
uint32_t crc_reference(const std::string& bytes) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

TEST(Crc, TheCheckValueAndEmptyFiles) {
  EXPECT_EQ(file_crc32(temp_file("check", "123456789")), 0xCBF43926u);
  EXPECT_EQ(file_crc32(temp_file("empty", "")), 0u);
  EXPECT_EQ(crc32_hex(0xCBF43926u), "cbf43926");
  EXPECT_EQ(parse_crc32_hex("cbf43926"), 0xCBF43926);
  EXPECT_EQ(parse_crc32_hex("CBF43926"), -1);
  EXPECT_EQ(parse_crc32_hex("cbf4392"), -1);
}

// A file of several 64 MiB pieces and a part: the pieces' CRCs combined equal the whole's, and a
// single changed byte in any piece changes it.
TEST(Crc, PiecesCombineToTheWholeFilesCrc) {
  std::string bytes((size_t{64} << 20) * 2 + 12345, '\0');
  std::mt19937_64 rng(3);
  for (size_t i = 0; i < bytes.size(); i += 8) {
    const uint64_t x = rng();
    for (size_t k = 0; k < 8 && i + k < bytes.size(); ++k) bytes[i + k] = (char)(x >> (8 * k));
  }
  const uint32_t want = crc_reference(bytes);
  const std::string path = temp_file("big", bytes);
  EXPECT_EQ(file_crc32(path), want);
  for (size_t at : {size_t{0}, (size_t{64} << 20) + 7, bytes.size() - 1}) {
    std::string changed = bytes;
    changed[at] ^= 0x10;
    EXPECT_NE(file_crc32(temp_file("big_changed", changed)), want) << "byte " << at;
  }
  std::remove(path.c_str());
}

TEST(Crc, AMissingFileIsAnErrorNamingIt) {
  try {
    file_crc32("/nonexistent/x.safetensors");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "/nonexistent/x.safetensors: cannot open for reading: No such file or directory");
  }
}

}  // namespace
}  // namespace tt
