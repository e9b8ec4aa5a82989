// The run folder: checks before the trainer writes there (see run_dir.h).
#include "trainer/run_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "base/check.h"

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

void fsync_path(const std::string& path, bool is_dir) {
  const int fd = ::open(path.c_str(), O_RDONLY | (is_dir ? O_DIRECTORY : 0));
  if (fd < 0) throw Error(str(path, ": cannot open for fsync: ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(str(path, ": fsync failed: ", std::strerror(err)));
}

void rewrite_metrics(const std::string& path, int64_t last_step) {
  std::string kept;
  {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() <= last_step)
        kept += line + "\n";
    }
  }
  const fs::path file = path;
  const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  const fs::path tmp = folder / ("." + file.filename().string() + ".tmp-" + std::to_string(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << kept;
    out.close();
    if (!out) throw Error(str(tmp.string(), ": cannot write (rewriting ", path, ")"));
  }
  fsync_path(tmp.string(), false);
  std::error_code ec;
  fs::rename(tmp, file, ec);
  if (ec) throw Error(str(path, ": cannot replace it with ", tmp.string(), ": ", ec.message()));
  fsync_path(folder.string(), true);
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
}

}  // namespace tt::trainer
