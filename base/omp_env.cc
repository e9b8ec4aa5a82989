// OpenMP defaults and the re-exec that applies them (see omp_env.h).
#include "base/omp_env.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace tt {

std::vector<std::pair<std::string, std::string>> omp_defaults(const std::function<const char*(const char*)>& lookup,
                                                              int cpus, int local_world_size) {
  std::vector<std::pair<std::string, std::string>> out;
  if (lookup("OMP_WAIT_POLICY") == nullptr && lookup("GOMP_SPINCOUNT") == nullptr)
    out.emplace_back("OMP_WAIT_POLICY", "passive");
  if (lookup("OMP_NUM_THREADS") == nullptr && local_world_size > 1)
    out.emplace_back("OMP_NUM_THREADS", std::to_string(std::max(1, cpus / local_world_size)));
  return out;
}

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

int local_world_size_env() {
  if (const char* s = std::getenv("LOCAL_WORLD_SIZE")) {
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    if (end != s && *end == '\0' && v > 0 && v <= 1 << 20) return (int)v;
  }
  return 1;
}

void reexec_with_omp_defaults(char** argv) {
  if (std::getenv(kOmpReexecMarker) != nullptr) return;
  const auto add =
      omp_defaults([](const char* name) { return std::getenv(name); }, available_cpus(), local_world_size_env());
  if (add.empty()) return;
  for (const auto& [name, value] : add) ::setenv(name.c_str(), value.c_str(), 1);
  ::setenv(kOmpReexecMarker, "1", 1);
  ::execv("/proc/self/exe", argv);
  // exec failed (no /proc): run on with libgomp's defaults; the variables reach child processes.
}

}  // namespace tt
