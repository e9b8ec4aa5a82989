// Local multi-process launch: `treetrain launch --nproc N [--master-port P] -- <treetrain args>`.
//
// Starts N copies of treetrain (or, with LaunchOptions::program, of any program) with the
// torchrun-style variables RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT set (distributed/env.h), and TT_JOB_ID (the caller's, else a new
// "launch-<host>-<pid>-<unix time>") so that the rendezvous admits only this launch's ranks, and
// forwards each child's stdout and stderr line by line
// with a "[rank r] " prefix. When a child fails (non-zero exit or a signal), the others get
// SIGTERM, then SIGKILL after grace_s, and launch() throws tt::Error naming the rank that failed
// first, e.g. "launch: rank 1 (pid 4242) exited with code 1; stopped ranks 0, 2, 3". Each child
// runs in a process group of its own, and signals go to the whole group, so whatever a rank
// started (a wrapper script's children) stops with it. SIGINT or SIGTERM to the launcher is
// passed on to the children. Children get SIGTERM if the launcher dies (PR_SET_PDEATHSIG).
// Unless the user set them, the children get OMP_NUM_THREADS = CPUs / N (the ranks share the
// host) and OMP_WAIT_POLICY=passive (no spinning threads; base/omp_env.h).
#pragma once

#include <string>
#include <vector>

namespace tt::distributed {

struct LaunchOptions {
  int nproc = 1;
  int master_port = 0;  // 0: a free port, picked here
  std::string master_addr = "127.0.0.1";
  std::string program;            // "" : this executable (/proc/self/exe), i.e. treetrain
  std::vector<std::string> args;  // the children's arguments
  double grace_s = 5;             // SIGTERM -> SIGKILL
};

// Runs the children to completion. Returns normally when all exit with 0; throws tt::Error
// otherwise (only main decides to exit).
void launch(const LaunchOptions& options);

// A TCP port that was free a moment ago (bind to port 0 and release it).
int free_port();

// The path of the running executable (/proc/self/exe resolved).
std::string self_executable();

// Runs argv[0] with argv (searching PATH when it has no '/'), stdio inherited; returns its exit
// code, or 128 + the signal that killed it. Throws tt::Error when it cannot be started.
int run_process(const std::vector<std::string>& argv);

}  // namespace tt::distributed
