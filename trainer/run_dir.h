// The run folder (run_dir) and the files the trainer keeps there besides checkpoints.
//
// prepare_run_dir() runs before anything is read from or written to run_dir: it refuses folders
// that must not hold a run (the filesystem root, system folders such as /etc or /usr, the home
// folder itself: the trainer rewrites metrics.jsonl there and prunes checkpoints/), creates the
// folder and checks that it is a writable folder, so a bad run_dir is an error naming the key,
// where it was set (file:line or --set) and the path, not a bare filesystem error later.
#pragma once

#include <string>

#include "trainer/config.h"

namespace tt::trainer {

// metrics.jsonl: one JSON object per step. A resumed run keeps the lines of the steps up to its
// checkpoint and rewrites the file atomically (rewrite_metrics): the kept lines go to
// .metrics.jsonl.tmp-<pid> in the same folder, which is fsynced and renamed over metrics.jsonl,
// and the folder is fsynced, so a kill at any moment leaves the old file or the new one whole.

// Refuses a dangerous run_dir (above), creates cfg.run_dir (and its parents) and checks that it
// is a folder this process can write.
// Throws tt::Error "<where>: run_dir '<path>': <what is wrong>".
void prepare_run_dir(const RunConfig& cfg);

// Keeps the lines of `path` whose "step" is <= last_step (unparseable lines go), atomically (see
// above); creates an empty file when there is none. Throws tt::Error naming the file.
void rewrite_metrics(const std::string& path, int64_t last_step);

// fsync of a file or a folder (a rename is durable once its folder is); throws tt::Error naming it.
void fsync_path(const std::string& path, bool is_dir);

}  // namespace tt::trainer
