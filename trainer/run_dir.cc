// The run folder: checks before the trainer writes there (see run_dir.h).
#include "trainer/run_dir.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "base/check.h"

namespace tt::trainer {

namespace fs = std::filesystem;

void prepare_run_dir(const RunConfig& cfg) {
  const std::string at = str(cfg.where("run_dir"), ": run_dir '", cfg.run_dir, "'");
  const fs::path dir = cfg.run_dir;
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
