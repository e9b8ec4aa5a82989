// The run folder: checks before the trainer writes there (see run_dir.h).
#include "trainer/run_dir.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>

#include "base/check.h"
#include "base/json.h"
#include "base/files.h"

namespace tt::trainer {

namespace fs = std::filesystem;

namespace {

// Why `dir` must not be a run folder ("" when it may be): the trainer rewrites metrics.jsonl and
// prunes checkpoints/ there, so the filesystem root, system folders and the home folder itself
// are refused (a folder below them is fine).
std::string refusal(const fs::path& dir) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(dir, ec), ec);
  if (ec) p = fs::absolute(dir).lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();  // "/x/" -> "/x"
  if (p == p.root_path()) return "is the filesystem root";
  static const char* const kSystem[] = {"/bin",  "/boot", "/dev", "/etc",  "/lib", "/lib32", "/lib64",
                                        "/proc", "/root", "/run", "/sbin", "/sys", "/usr",   "/var"};
  for (const char* s : kSystem)
    if (p == fs::path(s)) return str("is the system folder ", s);
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    const fs::path h = fs::weakly_canonical(fs::absolute(home, ec), ec);
    if (!ec && p == h) return "is the home folder itself";
  }
  return "";
}

}  // namespace

std::string utc_stamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
  return stamp;
}

namespace {

// `text` written to `file` through a temporary file in `folder` (fsynced, renamed, the folder
// fsynced).
void replace_file(const fs::path& file, const fs::path& folder, const std::string& text, const std::string& what) {
  const fs::path tmp = atomic_temp_path((folder / file.filename()).string(), (long)::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) throw Error(str(tmp.string(), ": cannot write (", what, ")"));
  }
  fsync_path(tmp.string(), false);
  std::error_code ec;
  fs::rename(tmp, file, ec);
  if (ec) throw Error(str(file.string(), ": cannot replace it with ", tmp.string(), ": ", ec.message()));
  fsync_path(folder.string(), true);
}

}  // namespace

std::string rewrite_metrics(const std::string& path, int64_t last_step) {
  std::string kept, dropped;
  int64_t dropped_lines = 0, first = -1, last = -1;
  {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const nlohmann::json j = parse_json_or_discarded(line);
      const bool has_step = j.is_object() && j.contains("step") && j["step"].is_number_integer();
      if (has_step && j["step"].get<int64_t>() <= last_step) {
        kept += line + "\n";
        continue;
      }
      dropped += line + "\n";
      ++dropped_lines;
      if (has_step) {
        const int64_t s = j["step"].get<int64_t>();
        first = first < 0 ? s : std::min(first, s);
        last = std::max(last, s);
      }
    }
  }
  const fs::path file = path;
  const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  std::string aside;
  if (dropped_lines > 0) {  // kept beside it before the file loses them
    const std::string stamp = utc_stamp();
    fs::path out = path + ".dropped-" + stamp;
    for (int k = 2; fs::exists(out); ++k) out = path + ".dropped-" + stamp + "-" + std::to_string(k);
    write_text_atomic(out.string(), dropped);  // its rename is made durable with the rewrite's below
    aside = out.string();
    spdlog::warn("{}: {} lines after step {} ({}) moved to {}; the file keeps the steps up to {}", path,
                 dropped_lines, last_step, first >= 0 ? str("steps ", first, "..", last) : std::string("unparseable"),
                 aside, last_step);
  }
  replace_file(file, folder, kept, str("rewriting ", path));
  return aside;
}

RunDirLock::RunDirLock(const std::string& run_dir) {
  const std::string path = (fs::path(run_dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  // Another user's lock file in a shared run_dir: flock works on a read-only descriptor too.
  if (fd_ < 0 && errno == EACCES) fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error(str(path, ": cannot open the run_dir's lock file: ", std::strerror(errno)));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == ENOLCK || err == ENOSYS || err == EOPNOTSUPP) {  // e.g. Lustre without -o flock
      spdlog::warn("{}: this filesystem does not lock files ({}): nothing stops a second treetrain writing run_dir {}",
                   path, std::strerror(err), run_dir);
      return;  // keeps fd_ open: harmless, closed with the lock
    }
    std::string holder;
    {
      std::ifstream in(path);
      std::getline(in, holder);
    }
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      throw Error(str("run_dir ", run_dir, " is in use by another treetrain (", holder.empty() ? "holder unknown" : holder,
                      "; ", path, "): one run writes a run_dir at a time; wait for that run to end, or use another "
                      "run_dir"));
    throw Error(str(path, ": cannot lock the run_dir: ", std::strerror(err)));
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string me = str("pid ", (long)::getpid(), " on host ", host, " since ", utc_stamp(), "\n");
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != (ssize_t)me.size())
    spdlog::info("{}: this process is not recorded in the lock file ({}); the lock holds", path, std::strerror(errno));
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (removing it would race a new holder)
}

RunDirLock& RunDirLock::operator=(RunDirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void prepare_run_dir(const RunConfig& cfg) {
  const std::string at = str(cfg.where("run_dir"), ": run_dir '", cfg.run_dir, "'");
  const fs::path dir = cfg.run_dir;
  if (const std::string why = refusal(dir); !why.empty())
    throw Error(str(at, " ", why,
                    "; the trainer writes metrics.jsonl and checkpoints/ into run_dir and prunes them: use a folder "
                    "of its own, e.g. runs/<name>"));
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (fs::exists(st) && !fs::is_directory(st)) throw Error(str(at, " exists and is not a folder"));
  if (!fs::exists(st)) {
    fs::create_directories(dir, ec);
    if (ec) throw Error(str(at, ": cannot create the folder: ", ec.message()));
  }
  if (!fs::is_directory(dir, ec)) throw Error(str(at, " is not a folder"));
  if (::access(dir.c_str(), W_OK | X_OK) != 0) throw Error(str(at, ": cannot write there: ", std::strerror(errno)));
  // What the trainer writes there, found as the wrong kind of entry: refused now, not after the
  // steps whose checkpoint it could then not write.
  struct Entry {
    const char *name, *what;
    bool folder;
  };
  for (const Entry& n : {Entry{"checkpoints", "checkpoints", true}, Entry{"tb", "TensorBoard events", true},
                         Entry{"metrics.jsonl", "metrics", false}}) {
    const fs::file_status e = fs::status(dir / n.name, ec);
    if (fs::exists(e) && fs::is_directory(e) != n.folder)
      throw Error(str(at, ": ", (dir / n.name).string(), " exists and is not a ", n.folder ? "folder" : "file",
                      " (the trainer writes its ", n.what, " there): move it away"));
  }
}

}  // namespace tt::trainer
