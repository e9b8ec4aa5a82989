// How many OpenMP threads a treetrain process runs and how they wait.
//
// libgomp spins by default: a thread that waits for work busy-loops for a while before it sleeps.
// With several processes on few cores (data-parallel ranks, concurrent runs, a build) the spinning
// threads take the cores from the ones with work (3 runs on 2 cores made no progress for a
// minute). So treetrain waits passively (OMP_WAIT_POLICY=passive) and ranks of one host divide the
// host's CPUs (OMP_NUM_THREADS = CPUs / LOCAL_WORLD_SIZE), unless the user set these variables:
// an explicit OMP_WAIT_POLICY or GOMP_SPINCOUNT, or OMP_NUM_THREADS, is kept as it is.
//
// libgomp reads its environment once, in a constructor that runs when the library is loaded,
// before main; setenv() in main is too late and libgomp has no call that changes the wait policy
// afterwards. So main re-executes the binary once with the variables added
// (reexec_with_omp_defaults): the cost is one exec at start (a few milliseconds), and it works
// however the process was started (a shell, bazel run, srun, torchrun, `treetrain launch`, a
// sweep). The alternatives do not: a launcher or a wrapper script covers only the processes it
// starts, and linking libgomp statically or preloading a shim changes the build for every binary.
// `treetrain launch` also sets OMP_NUM_THREADS for its ranks (launch.cc), so they need no re-exec.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tt {

// Set in the re-executed process, so it never re-executes again.
constexpr const char* kOmpReexecMarker = "TREETRAIN_OMP_DEFAULTS";

// The variables to add, given the environment (lookup returns nullptr for an unset variable) and
// the CPUs this process may run on: OMP_WAIT_POLICY=passive when neither OMP_WAIT_POLICY nor
// GOMP_SPINCOUNT is set; OMP_NUM_THREADS=max(1, cpus / local_world_size) when OMP_NUM_THREADS is
// unset and local_world_size (LOCAL_WORLD_SIZE, the ranks of this host) is above 1.
std::vector<std::pair<std::string, std::string>> omp_defaults(const std::function<const char*(const char*)>& lookup,
                                                              int cpus, int local_world_size);

// CPUs in this process's affinity mask (at least 1).
int available_cpus();

// LOCAL_WORLD_SIZE (the ranks of this host) when it is a positive integer, else 1.
int local_world_size_env();

// Called first in main: when omp_defaults() of the real environment (LOCAL_WORLD_SIZE read from
// it) adds anything and this is not already the re-executed process, sets the variables and the
// marker and executes /proc/self/exe with the same argv. Returns only when nothing was to be done
// or the exec failed (the process then runs as it is).
void reexec_with_omp_defaults(char** argv);

}  // namespace tt
