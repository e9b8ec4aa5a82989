// The run folder (run_dir) and the files the trainer keeps there besides checkpoints.
//
// prepare_run_dir() runs before anything is read from or written to run_dir: it refuses folders
// that must not hold a run (the filesystem root, system folders such as /etc or /usr, the home
// folder itself: the trainer rewrites metrics.jsonl there and prunes checkpoints/), creates the
// folder and checks that it is a writable folder, so a bad run_dir is an error naming the key,
// where it was set (file:line or --set) and the path, not a bare filesystem error later.
#pragma once

#include <cstdint>
#include <string>

#include "base/files.h"  // fsync_path

#include "trainer/config.h"

namespace tt::trainer {

// metrics.jsonl: one JSON object per step. A resumed run keeps the lines of the steps up to its
// checkpoint and rewrites the file atomically (rewrite_metrics): the kept lines go to
// .metrics.jsonl.tmp-<pid> in the same folder, which is fsynced and renamed over metrics.jsonl,
// and the folder is fsynced, so a kill at any moment leaves the old file or the new one whole.
// The lines it drops (steps after the checkpoint; a whole earlier run when a run starts fresh)
// are first written to metrics.jsonl.dropped-<UTC time> beside it, with a warning: nothing a run
// logged is lost.
//
// One writer per run_dir: the writer (rank 0) holds an exclusive lock on run_dir/.lock while it
// trains (RunDirLock: flock, released when the process ends however it ends); a second treetrain
// writing the same run_dir stops with an error naming the holder's pid and host.

// Refuses a dangerous run_dir (above), creates cfg.run_dir (and its parents) and checks that it
// is a folder this process can write.
// Throws tt::Error "<where>: run_dir '<path>': <what is wrong>".
void prepare_run_dir(const RunConfig& cfg);

// Keeps the lines of `path` whose "step" is <= last_step, atomically (see above); the others
// (unparseable lines too) go to `path`.dropped-<UTC time> first. Creates an empty file when there
// is none. Returns the file the dropped lines went to ("" when none were dropped). Throws
// tt::Error naming the file.
std::string rewrite_metrics(const std::string& path, int64_t last_step);

// The exclusive lock of a run_dir (see above). Empty (no lock) when default-constructed.
class RunDirLock {
 public:
  RunDirLock() = default;
  // Takes run_dir/.lock and writes this process's pid, host and start time into it. Throws
  // tt::Error naming run_dir and the holder when another process holds it.
  explicit RunDirLock(const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(RunDirLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  RunDirLock& operator=(RunDirLock&& o) noexcept;
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

// The current UTC time as 20261205T013000Z (names of files set aside).
std::string utc_stamp();

}  // namespace tt::trainer
