// Files written so that nothing already there is lost: a temporary file in the same folder,
// fsynced, then renamed over the target (readers see the old file or the new one, never a part).
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <string>

namespace tt {

// The temporary file an atomic write of `path` by process `pid` goes through: ".<name>.tmp-<pid>"
// beside it (hidden, and named so that a start-up cleaner can tell a dead writer's leftover:
// atomic_temp_pid).
std::string atomic_temp_path(const std::string& path, long pid);

// The writer's pid when `filename` (no folder) is such a temporary file, else -1.
long atomic_temp_pid(const std::string& filename);

// What an atomic write does with a symbolic link at its path: writes the file it leads to (the
// link kept: a user's output), replaces the link itself (a file the program owns, whose
// temporary name a cleaner looks for beside it), or refuses it.
enum class Links { kFollow, kReplace, kRefuse };

// Checks `path` as an output file that an atomic write (a temporary file beside it, renamed over
// it) may replace, and returns the name to rename onto: `path`, or, following links, the file
// they lead to. Throws tt::Error "<path>: ..." for a name ending in '/' and for an existing
// folder, FIFO, device or socket (through links too, when followed): a rename would replace the
// node itself, and a FIFO's reader would get nothing.
std::string atomic_write_target(const std::string& path, Links links = Links::kFollow);

// atomic_write_target for a file a command-line flag names: its errors start with the flag
// ("--out <path>: ...").
std::string flag_write_target(const std::string& flag, const std::string& path, Links links);

// Writes text to path atomically (onto atomic_write_target(path, links)). Throws tt::Error naming
// the path when any step fails (the temporary file is removed).
void write_text_atomic(const std::string& path, const std::string& text, Links links = Links::kReplace);

// Flushes the file (or folder: is_dir) at `path` to disk. Throws tt::Error "<path>: ..." on failure.
void fsync_path(const std::string& path, bool is_dir);

// The whole file as bytes. Throws tt::Error "<path>: cannot open <what>" when it cannot be read,
// and "<path>: more than <max_bytes> bytes ..." past max_bytes (a stream that never ends, such as
// /dev/zero, stops there instead of filling memory).
std::string read_text(const std::string& path, const std::string& what, size_t max_bytes = SIZE_MAX);

// Whether paths a and b name the same file: the same file on disk, or, where either does not exist
// yet, the same canonical name (an output that would replace an input checks both ways). Never
// throws.
bool same_file(const std::string& a, const std::string& b);

// The longest line read_line takes by default: 1 GiB (a rollouts group of ~10^8 tokens).
constexpr size_t kMaxLineBytes = size_t{1} << 30;

// std::getline with a bound: the next line of `in` (its '\n' dropped) into `line`; false at the
// end of the stream. A line longer than max_bytes throws tt::Error "<path>:<lineno>: a line longer
// than <max_bytes> bytes ..." (a file without newlines, such as /dev/zero, stops there instead of
// filling memory). `what`: what each line should hold, for the message.
bool read_line(std::istream& in, std::string& line, const std::string& path, int64_t lineno, const char* what,
               size_t max_bytes = kMaxLineBytes);

}  // namespace tt
