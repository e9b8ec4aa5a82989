// CRC-32 (zlib's, the gzip/PNG polynomial) of whole files, for the checkpoint manifest's check
// that a file still holds the bytes that were written (trainer/checkpoint.h).
#pragma once

#include <cstdint>
#include <string>

namespace tt {

// The CRC-32 of the file's bytes, read in 64 MiB pieces on host_threads() threads and combined
// (crc32_combine): a checkpoint's ~17 GB in a few seconds. Throws tt::Error naming the path when
// it cannot be read.
uint32_t file_crc32(const std::string& path);

// As 8 lowercase hex digits, and back (-1 for anything else).
std::string crc32_hex(uint32_t crc);
int64_t parse_crc32_hex(const std::string& hex);

}  // namespace tt
