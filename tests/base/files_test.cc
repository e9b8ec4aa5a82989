// base/files.h: an atomic write replaces a regular file (or the file a symbolic link leads to,
// keeping the link) and refuses what a rename would destroy (a folder, a FIFO, a device), with
// errors naming the path; a failed write leaves the old file as it was.
#include "base/files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "base/check.h"
#include "tests/base/error_of.h"

namespace tt {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::path(::testing::TempDir()) / "files_test" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using tt::testing::error_of;

TEST(AtomicWrite, ReplacesAFileAndCreatesANewOne) {
  const fs::path d = fresh_dir("plain");
  write_text_atomic((d / "a.txt").string(), "one");
  EXPECT_EQ(slurp(d / "a.txt"), "one");
  write_text_atomic((d / "a.txt").string(), "two");
  EXPECT_EQ(slurp(d / "a.txt"), "two");
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 1) << "no temporary file left";
}

// A link is kept and its file replaced (relative and absolute links, a chain of two).
TEST(AtomicWrite, WritesTheFileALinkLeadsTo) {
  const fs::path d = fresh_dir("links");
  fs::create_directories(d / "real");
  std::ofstream(d / "real" / "t.jsonl") << "old";
  fs::create_symlink("real/t.jsonl", d / "rel.jsonl");
  fs::create_symlink(d / "rel.jsonl", d / "chain.jsonl");
  EXPECT_EQ(atomic_write_target((d / "chain.jsonl").string()), (d / "real/t.jsonl").string());
  write_text_atomic((d / "chain.jsonl").string(), "new", Links::kFollow);
  EXPECT_TRUE(fs::is_symlink(d / "chain.jsonl"));
  EXPECT_TRUE(fs::is_symlink(d / "rel.jsonl"));
  EXPECT_EQ(slurp(d / "real" / "t.jsonl"), "new");
  // A dangling link: its target is created.
  fs::create_symlink("real/new.jsonl", d / "dangling.jsonl");
  write_text_atomic((d / "dangling.jsonl").string(), "made", Links::kFollow);
  EXPECT_TRUE(fs::is_symlink(d / "dangling.jsonl"));
  EXPECT_EQ(slurp(d / "real" / "new.jsonl"), "made");
  // Without following: an error naming the path.
  EXPECT_EQ(error_of([&] { atomic_write_target((d / "rel.jsonl").string(), Links::kRefuse); }),
            (d / "rel.jsonl").string() + ": is a symbolic link, expected a regular file or a new name");
  // A loop of links is an error, not a hang.
  fs::create_symlink("loop_b", d / "loop_a");
  fs::create_symlink("loop_a", d / "loop_b");
  EXPECT_EQ(error_of([&] { atomic_write_target((d / "loop_a").string()); }).rfind(
                (d / "loop_a").string() + ": cannot follow the symbolic link: ", 0),
            0u);
  // Replacing (a file the program owns): the link itself, whatever it leads to.
  EXPECT_EQ(atomic_write_target((d / "loop_a").string(), Links::kReplace), (d / "loop_a").string());
  write_text_atomic((d / "chain.jsonl").string(), "own", Links::kReplace);
  EXPECT_FALSE(fs::is_symlink(d / "chain.jsonl"));
  EXPECT_EQ(slurp(d / "chain.jsonl"), "own");
  EXPECT_EQ(slurp(d / "real" / "t.jsonl"), "new");
}

TEST(AtomicWrite, RefusesFoldersFifosAndDevicesNamingThePath) {
  const fs::path d = fresh_dir("special");
  fs::create_directories(d / "sub");
  EXPECT_EQ(error_of([&] { write_text_atomic((d / "sub").string(), "x"); }),
            (d / "sub").string() + ": is a folder, expected a regular file or a new name");
  EXPECT_EQ(error_of([&] { write_text_atomic((d / "new_folder/").string(), "x"); }),
            (d / "new_folder/").string() + ": ends in '/', expected a file path");
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0644), 0);
  EXPECT_EQ(error_of([&] { write_text_atomic((d / "fifo").string(), "x"); }),
            (d / "fifo").string() + ": is a FIFO, expected a regular file or a new name");
  EXPECT_TRUE(fs::is_fifo(d / "fifo")) << "the FIFO is still there";
  fs::create_symlink("fifo", d / "fifo_link");  // as /dev/stdout leads to a pipe
  EXPECT_EQ(error_of([&] { write_text_atomic((d / "fifo_link").string(), "x", Links::kFollow); }),
            (d / "fifo_link").string() + " (" + fs::canonical(d / "fifo").string() +
                "): is a FIFO, expected a regular file or a new name");
  fs::create_symlink("/dev/null", d / "null_link");  // a link to a device: the device named too
  EXPECT_EQ(error_of([&] { write_text_atomic((d / "null_link").string(), "x", Links::kFollow); }),
            (d / "null_link").string() + " (/dev/null): is a character device, expected a regular file or a new name");
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  EXPECT_EQ(error_of([&] { atomic_write_target(""); }), "an empty output path, expected a file name");
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 4) << "nothing else written";
}

}  // namespace
}  // namespace tt
