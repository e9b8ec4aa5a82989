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

// Refuses a dangerous run_dir (above), creates cfg.run_dir (and its parents) and checks that it
// is a folder this process can write.
// Throws tt::Error "<where>: run_dir '<path>': <what is wrong>".
void prepare_run_dir(const RunConfig& cfg);

}  // namespace tt::trainer
