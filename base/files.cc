// write_text_atomic (see files.h).
#include "base/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/check.h"

namespace tt {

std::string atomic_temp_path(const std::string& path, long pid) {
  const size_t slash = path.rfind('/');
  const size_t name_at = slash == std::string::npos ? 0 : slash + 1;
  return str(path.substr(0, name_at), ".", path.substr(name_at), ".tmp-", pid);
}

long atomic_temp_pid(const std::string& filename) {
  const std::string mark = ".tmp-";
  const size_t at = filename.rfind(mark);
  if (filename.size() < 2 || filename[0] != '.' || at == std::string::npos || at < 2) return -1;
  const std::string pid = filename.substr(at + mark.size());
  if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stol(pid);
}

namespace {

const char* kind_of(const std::filesystem::file_status& st) {
  namespace fs = std::filesystem;
  return fs::is_directory(st)        ? "a folder"
         : fs::is_fifo(st)           ? "a FIFO"
         : fs::is_character_file(st) ? "a character device"
         : fs::is_block_file(st)     ? "a block device"
         : fs::is_socket(st)         ? "a socket"
                                     : "not a regular file";
}

}  // namespace

std::string atomic_write_target(const std::string& path, Links links) {
  namespace fs = std::filesystem;
  if (path.empty()) throw Error("an empty output path, expected a file name");
  if (path.back() == '/') throw Error(str(path, ": ends in '/', expected a file path"));
  std::error_code ec;
  const fs::file_status own = fs::symlink_status(path, ec);
  if (own.type() == fs::file_type::not_found || fs::is_regular_file(own)) return path;
  if (ec) throw Error(str(path, ": cannot check the output file: ", ec.message()));
  if (!fs::is_symlink(own)) throw Error(str(path, ": is ", kind_of(own), ", expected a regular file or a new name"));
  if (links == Links::kRefuse) throw Error(str(path, ": is a symbolic link, expected a regular file or a new name"));
  if (links == Links::kReplace) return path;
  // What the kernel reaches through the links (a pipe behind /dev/stdout included) must be a
  // regular file or nothing yet; then the links are walked for the name to rename onto.
  const fs::file_status far = fs::status(path, ec);
  if (far.type() != fs::file_type::not_found) {
    if (ec) throw Error(str(path, ": cannot follow the symbolic link: ", ec.message()));
    if (!fs::is_regular_file(far)) {
      const fs::path to = fs::canonical(path, ec);
      throw Error(str(path, ec ? "" : str(" (", to.string(), ")"), ": is ", kind_of(far),
                      ", expected a regular file or a new name"));
    }
  }
  fs::path p = path;
  for (int hops = 0; fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    if (hops == 40) throw Error(str(path, ": more than 40 symbolic links in a row"));
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) throw Error(str(path, ": cannot read the symbolic link: ", ec.message()));
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  return p.string();
}

std::string flag_write_target(const std::string& flag, const std::string& path, Links links) {
  try {
    return atomic_write_target(path, links);
  } catch (const Error& e) {
    throw Error(str(flag, " ", e.what()));
  }
}

void write_text_atomic(const std::string& path, const std::string& text, Links links) {
  const std::string target = atomic_write_target(path, links);
  const std::string tmp = atomic_temp_path(target, (long)::getpid());
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
  bool synced = true;
  try {
    fsync_path(tmp, false);
  } catch (const Error&) {
    synced = false;
  }
  if (!synced || std::rename(tmp.c_str(), target.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(str(path, ": fsync or rename from ", tmp, " failed"));
  }
}

void fsync_path(const std::string& path, bool is_dir) {
  const int fd = ::open(path.c_str(), O_RDONLY | (is_dir ? O_DIRECTORY : 0));
  if (fd < 0) throw Error(str(path, ": cannot open for fsync: ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(str(path, ": fsync failed: ", std::strerror(err)));
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

bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ea, eb;
  if (fs::equivalent(a, b, ea)) return true;
  const fs::path ca = fs::weakly_canonical(a, ea), cb = fs::weakly_canonical(b, eb);
  return !ea && !eb && ca == cb;
}

bool read_line(std::istream& in, std::string& line, const std::string& path, int64_t lineno, const char* what,
               size_t max_bytes) {
  line.clear();
  char buf[1 << 16];
  for (;;) {
    // Up to the newline (extracted, not stored), the end of the stream, or a full buffer (failbit,
    // the line goes on). A read error sets badbit, as std::getline's would.
    in.getline(buf, sizeof buf);
    if (in.bad()) throw Error(str(path, ":", lineno, ": cannot read the file"));
    const size_t got = (size_t)in.gcount();
    const bool newline = !in.fail() && !in.eof();
    const size_t stored = newline ? got - 1 : got;
    if (stored > max_bytes - line.size())
      throw Error(str(path, ":", lineno, ": a line longer than ", max_bytes, " bytes; expected ", what,
                      " a line (is this a JSONL file?)"));
    line.append(buf, stored);
    if (newline) return true;
    if (in.eof()) return !line.empty();
    in.clear(in.rdstate() & ~std::ios::failbit);  // a full buffer: read on
  }
}

}  // namespace tt
