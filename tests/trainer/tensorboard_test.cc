// TensorBoard events: CRC-32C and the TFRecord framing against known vectors, a written file read
// back by an independent reader (tests/trainer/tfevents_reader.h), a second writer in the same
// folder (a resumed run) leaving the first file untouched, the error naming the folder when it
// cannot be made, and the trainer's events equal to its metrics.jsonl, across a kill and resume.
// Also the console line: steps/s and an ETA, and no MFU on the CPU backend.
#include "trainer/tensorboard.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "base/check.h"
#include "tests/trainer/tfevents_reader.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/train.h"
#include "tests/trainer/test_util.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;
using testing::read_tfevents;
using testing::TbFile;

fs::path test_dir(const std::string& name) { return testing::fresh_dir(name); }

using testing::error_of;
using testing::slurp;

TEST(TensorBoardTest, Crc32cOfKnownVectors) {
  // The check value of CRC-32C and the vectors of RFC 3720, B.4.
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  std::string zeros(32, '\0'), ones(32, '\xff'), up(32, ' '), down(32, ' ');
  for (int i = 0; i < 32; ++i) up[i] = (char)i, down[i] = (char)(31 - i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8a9136aau);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62a8ab43u);
  EXPECT_EQ(crc32c(up.data(), 32), 0x46dd794eu);
  EXPECT_EQ(crc32c(down.data(), 32), 0x113fdb5cu);
  // Continuing a CRC over a split buffer.
  EXPECT_EQ(crc32c("56789", 5, crc32c("1234", 4)), 0xe3069283u);
  // The mask: ((c >> 15) | (c << 17)) + 0xa282ead8.
  EXPECT_EQ(masked_crc32c("123456789", 9), 0xc78ab0e5u);
  EXPECT_EQ(masked_crc32c("", 0), 0xa282ead8u);
}

TEST(TensorBoardTest, TfrecordFramingOfKnownRecords) {
  // The empty record: length 0, the masked CRC of 8 zero bytes (0x07980329), no data, the masked
  // CRC of nothing (0xa282ead8), all little-endian.
  EXPECT_EQ(tfrecord_frame(""), std::string("\0\0\0\0\0\0\0\0\x29\x03\x98\x07\xd8\xea\x82\xa2", 16));
  const std::string r = tfrecord_frame("123456789");
  ASSERT_EQ(r.size(), 8u + 4 + 9 + 4);
  EXPECT_EQ(r.substr(0, 8), std::string("\x09\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(r.substr(12, 9), "123456789");
  EXPECT_EQ(r.substr(21), std::string("\xe5\xb0\x8a\xc7", 4));  // masked_crc32c("123456789")
  // Both CRCs as the independent reader computes them.
  EXPECT_EQ(r.substr(8, 4), tfrecord_frame("123456789").substr(8, 4));
  uint32_t len_crc;
  std::memcpy(&len_crc, r.data() + 8, 4);
  EXPECT_EQ(len_crc, testing::tfrecord_mask(testing::bitwise_crc32c(r.substr(0, 8))));
}

TEST(TensorBoardTest, AWrittenFileReadsBackEventByEvent) {
  const fs::path dir = test_dir("tb_write") / "tb";
  std::string path;
  {
    EventWriter w(dir.string(), 1);
    path = w.path();
    w.write_scalars(1, {{"loss", 3.25}, {"lr", 1e-3}, {"por", 0.0}});
    w.write_scalars(2, {{"loss", 3.0}, {"lr", 2e-3}, {"por", 0.5}});
  }
  EXPECT_EQ(fs::path(path).parent_path(), dir);
  EXPECT_TRUE(std::regex_match(fs::path(path).filename().string(),
                               std::regex("events\\.out\\.tfevents\\.[0-9]{10}\\..+")))
      << path;
  const TbFile f = read_tfevents(path);
  EXPECT_FALSE(f.torn);
  ASSERT_EQ(f.events.size(), 4u);
  EXPECT_EQ(f.events[0].file_version, "brain.Event:2");
  EXPECT_EQ(f.events[1].session_status, 1);  // START
  EXPECT_EQ(f.events[1].step, 1);
  const double now = (double)std::time(nullptr);
  for (const auto& e : f.events) {
    EXPECT_GT(e.wall_time, now - 60);
    EXPECT_LT(e.wall_time, now + 60);
  }
  EXPECT_EQ(f.events[2].step, 1);
  EXPECT_TRUE(f.events[2].has_summary);
  EXPECT_TRUE(f.events[2].has_simple_value_for_all);  // 0.0 too: a oneof member is always written
  using Values = std::vector<std::pair<std::string, float>>;
  EXPECT_EQ(f.events[2].values, (Values{{"loss", 3.25f}, {"lr", 1e-3f}, {"por", 0.0f}}));
  EXPECT_EQ(f.events[3].step, 2);
  EXPECT_EQ(f.events[3].values, (Values{{"loss", 3.0f}, {"lr", 2e-3f}, {"por", 0.5f}}));
}

TEST(TensorBoardTest, ASecondWriterOpensANewFileAndLeavesTheFirstUntouched) {
  const fs::path dir = test_dir("tb_resume") / "tb";
  std::string first_path;
  {
    EventWriter w(dir.string(), 1);
    first_path = w.path();
    for (int s = 1; s <= 5; ++s) w.write_scalars(s, {{"loss", 1.0 / s}});
  }
  // The first run was killed in the middle of a record.
  fs::resize_file(first_path, fs::file_size(first_path) - 3);
  const std::string before = slurp(first_path);
  std::string second_path;
  {
    EventWriter w(dir.string(), 4);  // resumed from the checkpoint of step 3
    second_path = w.path();
    for (int s = 4; s <= 6; ++s) w.write_scalars(s, {{"loss", 10.0 * s}});
  }
  EXPECT_NE(second_path, first_path);
  EXPECT_EQ(slurp(first_path), before);
  EXPECT_EQ(testing::tfevents_files(dir), (std::vector<fs::path>{first_path, second_path}));  // read in this order
  const TbFile first = read_tfevents(first_path);
  EXPECT_TRUE(first.torn);
  EXPECT_EQ(first.events.size(), 2u + 4);  // step 5's record was torn
  const TbFile second = read_tfevents(second_path);
  EXPECT_FALSE(second.torn);
  ASSERT_EQ(second.events.size(), 2u + 3);
  EXPECT_EQ(second.events[0].file_version, "brain.Event:2");
  EXPECT_EQ(second.events[1].session_status, 1);
  EXPECT_EQ(second.events[1].step, 4);
  // What TensorBoard shows: steps 1..3 of the first run, 4..6 of the second.
  const auto shown = testing::tensorboard_scalars(dir);
  ASSERT_EQ(shown.size(), 6u);
  for (int s = 1; s <= 6; ++s) EXPECT_EQ(shown.at(s).at("loss"), s <= 3 ? (float)(1.0 / s) : (float)(10.0 * s)) << s;
}

TEST(TensorBoardTest, AFolderThatCannotBeMadeIsAnErrorNamingIt) {
  const fs::path dir = test_dir("tb_blocked");
  std::ofstream(dir / "tb") << "a file where the folder goes";
  EXPECT_EQ(error_of([&] { EventWriter w((dir / "tb").string(), 1); }),
            (dir / "tb").string() + ": cannot create the TensorBoard folder (a file of that name is in the way)");
  EXPECT_EQ(error_of([&] { EventWriter w((dir / "tb" / "sub").string(), 1); }),
            (dir / "tb" / "sub").string() + ": cannot create the TensorBoard folder (Not a directory)");
}

std::vector<nlohmann::json> metrics(const fs::path& run_dir) { return testing::read_metrics(run_dir); }

// Every step of metrics.jsonl is in TensorBoard with these scalars, equal to the float32 rounding
// of the logged value, and TensorBoard shows no other step.
void expect_events_equal_metrics(const fs::path& run_dir) {
  const std::vector<nlohmann::json> ms = metrics(run_dir);
  const auto shown = testing::tensorboard_scalars(run_dir / "tb");
  ASSERT_EQ(shown.size(), ms.size());
  for (const nlohmann::json& m : ms) {
    const int64_t step = m["step"].get<int64_t>();
    ASSERT_TRUE(shown.count(step)) << "step " << step;
    const auto& tags = shown.at(step);
    std::vector<std::string> names;
    for (const auto& [tag, v] : tags) names.push_back(tag);
    EXPECT_EQ(names, (std::vector<std::string>{"executed_flops", "grad_norm", "loss", "lr", "mfu", "nll", "por",
                                               "skipped_steps", "tokens_per_s"}));
    for (const auto& [tag, v] : tags) EXPECT_EQ(v, (float)m[tag].get<double>()) << tag << " at step " << step;
  }
}

TEST(TensorBoardTest, TheTrainersEventsAreItsMetricsAcrossAKillAndResume) {
  const fs::path dir = test_dir("tb_train");
  RunConfig c = testing::tiny_run_config(dir);
  c.train.max_steps = 5;
  c.train.checkpoint_every = 3;
  c.train.final_checkpoint = false;  // killed after step 5, its newest checkpoint step 3
  c.validate();
  Trainer(c).run();
  expect_events_equal_metrics(c.run_dir);
  ASSERT_EQ(testing::tfevents_files(fs::path(c.run_dir) / "tb").size(), 1u);
  const fs::path first = testing::tfevents_files(fs::path(c.run_dir) / "tb")[0];
  const std::string before = slurp(first);

  c.train.max_steps = 6;
  c.train.resume = true;
  c.validate();
  Trainer resumed(c);
  ASSERT_EQ(resumed.start_step(), 3);
  resumed.run();
  EXPECT_EQ(slurp(first), before);
  const auto files = testing::tfevents_files(fs::path(c.run_dir) / "tb");
  ASSERT_EQ(files.size(), 2u);
  const TbFile second = read_tfevents(files[1]);
  ASSERT_EQ(second.events.size(), 2u + 3);
  EXPECT_EQ(second.events[1].session_status, 1);
  EXPECT_EQ(second.events[1].step, 4);
  EXPECT_EQ(second.events[2].step, 4);
  expect_events_equal_metrics(c.run_dir);  // steps 1..3 of the first run, 4..6 of the second
}

TEST(TensorBoardTest, ARunDirWhoseTbCannotBeMadeFailsNamingIt) {
  const fs::path dir = test_dir("tb_train_blocked");
  RunConfig c = testing::tiny_run_config(dir);
  fs::create_directories(c.run_dir);
  std::ofstream(fs::path(c.run_dir) / "tb") << "not a folder";
  // Refused when the trainer starts (run_dir's entries are checked then), before any step.
  EXPECT_EQ(error_of([&] { Trainer t(c); }),
            "test: run_dir '" + c.run_dir + "': " + (fs::path(c.run_dir) / "tb").string() +
                " exists and is not a folder (the trainer writes its TensorBoard events there): move it away");
}

TEST(TensorBoardTest, TheConsoleLineShowsStepsPerSecondAndAnEtaAndNoMfuOnTheCpu) {
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  const fs::path dir = test_dir("tb_console");
  RunConfig c = testing::tiny_run_config(dir);
  c.train.max_steps = 3;
  c.validate();
  Trainer(c).run();
  spdlog::set_default_logger(previous);
  const std::string text = log.str();
  const std::regex line("step [123]/3 \\| loss [0-9.]+ \\| nll [0-9.]+ \\| lr [0-9.e+-]+ \\| gnorm [0-9.]+ \\| [0-9.kM]+ tok/s \\| "
                        "[0-9.e+]+ steps/s \\| eta [0-9hms]+ \\| por [0-9.]+ \\| [0-9.]+s");
  int lines = 0;
  for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end; ++it) ++lines;
  EXPECT_EQ(lines, 3) << text;
  EXPECT_EQ(text.find("mfu"), std::string::npos) << text;
  EXPECT_NE(text.find("| eta 0s |"), std::string::npos) << text;  // the last step
}

}  // namespace
}  // namespace tt::trainer
