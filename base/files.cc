// write_text_atomic (see files.h).
#include "base/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "base/check.h"

namespace tt {

void write_text_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = str(path, ".tmp.", (long)::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(str(path, ": cannot create ", tmp));
    out << text;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw Error(str(path, ": write failed"));
    }
  }
  const int fd = ::open(tmp.c_str(), O_RDONLY);
  const bool synced = fd >= 0 && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  if (!synced || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(str(path, ": fsync or rename from ", tmp, " failed"));
  }
}

std::string read_text(const std::string& path, const std::string& what, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(str(path, ": cannot open ", what));
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    if ((size_t)in.gcount() > max_bytes - text.size())
      throw Error(str(path, ": more than ", max_bytes, " bytes, too large for a ", what));
    text.append(buf, (size_t)in.gcount());
  }
  if (in.bad()) throw Error(str(path, ": cannot read ", what));
  return text;
}

}  // namespace tt
