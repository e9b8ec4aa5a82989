// CRC-32 of files (see crc.h).
#include "base/crc.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/parallel.h"

namespace tt {

uint32_t file_crc32(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(str(path, ": cannot open for reading: ", std::strerror(errno)));
  struct Closer {  // closed however this returns or throws
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error(str(path, ": cannot stat: ", std::strerror(errno)));
  const int64_t size = st.st_size, piece = int64_t{64} << 20;
  const int64_t n = (size + piece - 1) / piece;
  std::vector<uLong> crc((size_t)n, 0);
  const auto [bad, error] = parallel_for_first_error(n, [&](int64_t i) {
    std::vector<unsigned char> buf(size_t{1} << 20);
    uLong c = ::crc32(0L, Z_NULL, 0);
    for (int64_t at = i * piece, end = std::min(size, at + piece); at < end;) {
      const ssize_t got = ::pread(fd, buf.data(), (size_t)std::min<int64_t>((int64_t)buf.size(), end - at), at);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        throw Error(str(path, ": read failed at byte ", at, " of ", size, got < 0 ? ": " : " (the file is shorter)",
                        got < 0 ? std::strerror(errno) : ""));
      c = ::crc32(c, buf.data(), (uInt)got);
      at += got;
    }
    crc[(size_t)i] = c;
  });
  if (error) std::rethrow_exception(error);
  uLong c = ::crc32(0L, Z_NULL, 0);
  for (int64_t i = 0; i < n; ++i) c = ::crc32_combine(c, crc[(size_t)i], (z_off_t)(std::min(size, (i + 1) * piece) - i * piece));
  return (uint32_t)c;
}

std::string crc32_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

int64_t parse_crc32_hex(const std::string& hex) {
  if (hex.size() != 8 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) return -1;
  return (int64_t)std::strtoul(hex.c_str(), nullptr, 16);
}

}  // namespace tt
