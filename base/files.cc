// write_text_atomic (see files.h).
#include "base/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
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

std::string read_text(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(str(path, ": cannot open ", what));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(str(path, ": cannot read ", what));
  return text;
}

}  // namespace tt
