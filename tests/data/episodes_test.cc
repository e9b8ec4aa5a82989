// The episodes JSONL format (data/episodes.h): a good file reads with its image paths resolved
// against the file's folder; every bad input is an error naming file:line, the step and the field.
#include "data/episodes.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/check.h"

namespace tt::data {
namespace {

namespace fs = std::filesystem;

fs::path dir_for(const std::string& name) {
  const char* d = std::getenv("TEST_TMPDIR");
  const fs::path p = (d ? fs::path(d) : fs::temp_directory_path()) / name;
  fs::remove_all(p);
  fs::create_directories(p / "frames");
  for (const char* f : {"a.png", "b.png", "c.jpg"}) std::ofstream(p / "frames" / f) << "x";
  return p;
}

std::string error_of(const fs::path& file, const std::string& text) {
  std::ofstream(file) << text;
  try {
    read_episodes(file.string(), 100);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Episodes, ReadsStepsAndResolvesImages) {
  const fs::path d = dir_for("episodes_good");
  const fs::path f = d / "ep.jsonl";
  std::ofstream(f) << R"({"id": "e0", "instruction": [1, 2, 3], "steps": [)"
                   << R"({"images": ["frames/a.png"], "state": [0.5, -1], "action": [0.1, 0.2]},)"
                   << R"({"images": ["frames/b.png"], "state": [0, 1], "action": [0.3, -0.4]}]})" << "\n\n"
                   << R"({"id": 7, "instruction": [4], "steps": [{"images": ["frames/c.jpg"], "state": [1, 2], )"
                   << R"("action": [1, 2]}]})" << "\n";
  const std::vector<Episode> eps = read_episodes(f.string(), 100);
  ASSERT_EQ(eps.size(), 2u);
  EXPECT_EQ(eps[0].id, "e0");
  EXPECT_EQ(eps[0].instruction, (std::vector<int32_t>{1, 2, 3}));
  ASSERT_EQ(eps[0].steps.size(), 2u);
  EXPECT_EQ(eps[0].steps[1].images[0], (d / "frames" / "b.png").string());
  EXPECT_EQ(eps[0].steps[0].state, (std::vector<float>{0.5f, -1.0f}));
  EXPECT_EQ(eps[0].steps[1].action, (std::vector<float>{0.3f, -0.4f}));
  EXPECT_EQ(eps[1].id, "7");
}

TEST(Episodes, BadInputNamesFileLineStepAndField) {
  const fs::path d = dir_for("episodes_bad");
  const fs::path f = d / "ep.jsonl";
  const std::string w = f.string() + ":1";
  const std::string head = R"({"id": "e", "instruction": [1], "steps": [)";
  const std::string s0 = R"({"images": ["frames/a.png"], "action": [0.1, 0.2]})";
  EXPECT_EQ(error_of(f, head + s0 + "]}"), "");
  EXPECT_EQ(error_of(f, head + R"({"images": ["frames/missing.png"], "action": [0.1]}]})"),
            w + ": step 0: field \"images\"[0]: no image file " + (d / "frames" / "missing.png").string());
  // A NUL inside the name (which a path would cut short: "frames/a.png" here) is no file name.
  EXPECT_EQ(error_of(f, head + R"({"images": ["frames/a.png\u0000.jpg"], "action": [0.1]}]})"),
            w + ": step 0: field \"images\"[0]: expected a file name, got \"frames/a.png\\u0000.jpg\"");
  EXPECT_EQ(error_of(f, head + s0 + R"(, {"images": ["frames/b.png"], "action": [0.1]}]})"),
            w + ": step 1: the action has 1 values, expected 2 values (as step 0)");
  EXPECT_EQ(error_of(f, head + s0 + R"(, {"images": ["frames/a.png", "frames/b.png"], "action": [1, 2]}]})"),
            w + ": step 1: 2 images, expected 1 (one per camera, as step 0)");
  EXPECT_EQ(error_of(f, head + R"({"images": ["frames/a.png"], "action": [0.1, 1e999]}]})").rfind(w + ": invalid JSON", 0),
            0u);
  EXPECT_EQ(error_of(f, head + R"({"images": ["frames/a.png"], "action": [0.1, "nan"]}]})"),
            w + ": step 0: field \"action\"[1]: expected a number, got \"nan\"");
  EXPECT_EQ(error_of(f, head + R"({"images": ["frames/a.png"], "action": [0.1], "action_ids": [3]}]})"),
            w + ": step 0: expected exactly one of \"action\" (continuous) and \"action_ids\" (discrete), got both");
  EXPECT_EQ(error_of(f, head + R"({"images": ["frames/a.png"], "action_ids": [300]}]})"),
            w + ": step 0: field \"action_ids\"[0]: expected a token id in [0, 100), got 300");
  EXPECT_EQ(error_of(f, R"({"id": "e", "instruction": [1], "steps": []})"),
            w + ": field \"steps\": expected a non-empty list of steps, got []");
  EXPECT_EQ(error_of(f, R"({"id": "e", "steps": [)" + s0 + "]}"), w + ": missing field \"instruction\"");
  EXPECT_EQ(error_of(f, head + R"({"images": ["frames/a.png"], "state": [1e39], "action": [0.1, 0.2]}]})"),
            w + ": step 0: field \"state\"[0]: expected a number within fp32's range (|x| <= 3e38), got 1e+39");
  // Episodes of one file agree on cameras, state and action.
  EXPECT_EQ(error_of(f, head + s0 + "]}\n" + head + R"({"images": ["frames/a.png"], "action": [1, 2, 3]}]})"),
            f.string() + ":2: episode 'e' has 1 cameras, 0 state values and 3 action values; the file's first "
                         "episode has 1, 0 and 2 action values");
  EXPECT_EQ(error_of(f, "\n\n"), f.string() + ": no episodes");
  try {
    read_episodes((d / "absent.jsonl").string(), 100);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), (d / "absent.jsonl").string() + ": cannot open the episodes file");
  }
}

}  // namespace
}  // namespace tt::data
