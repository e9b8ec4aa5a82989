// Closing the loop (issue 17) through the binary: a tiny VLA trained on generated nav episodes;
// `treetrain eval --env nav` reports the model, the random policy and the zeroed-image model;
// `treetrain serve` answers sessions and survives every bad request (malformed JSON, unknown
// session, undecodable or wrongly sized image, bad state, an oversize line); and the reference
// client (scripts/nav_client.py, through `serve` and `nav-env`) reproduces eval's success rate
// and SPL for the same seeds.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "base/base64.h"
#include "data/image.h"
#include "tests/trainer/test_util.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using tt::trainer::testing::fresh_dir;
using tt::trainer::testing::slurp;

int sh(const std::string& cmd) {
  const int s = std::system(cmd.c_str());
  return WIFEXITED(s) ? WEXITSTATUS(s) : -1;
}

// A checkpoint trained for a few steps on generated nav episodes, made once.
const fs::path& trained_run() {
  static const fs::path run = [] {
    const fs::path dir = fresh_dir("nav_run");
    const std::string data = (dir / "episodes.jsonl").string();
    EXPECT_EQ(sh("trainer/treetrain generate --kind nav-episodes --out " + data + " --num-episodes 8 --seed 3 2>/dev/null"), 0);
    EXPECT_EQ(sh("trainer/treetrain --config configs/vla_quickstart.yaml --set run_dir=" + (dir / "run").string() +
                 " --set data.path=" + data + " --set train.max_steps=3 --set train.checkpoint_every=0 2>/dev/null"),
              0);
    return dir / "run";
  }();
  return run;
}

// `treetrain serve` as a child process; its port read from its first stdout line.
struct ServeProcess {
  pid_t pid = -1;
  int port = 0;
  explicit ServeProcess(const std::string& flags) {
    int p[2];
    EXPECT_EQ(pipe(p), 0);
    pid = fork();
    if (pid == 0) {
      dup2(p[1], 1);
      close(p[0]);
      const std::string cmd = "exec trainer/treetrain serve " + flags + " 2>/dev/null";
      execl("/bin/sh", "sh", "-c", cmd.c_str(), (char*)nullptr);
      _exit(127);
    }
    close(p[1]);
    FILE* f = fdopen(p[0], "r");
    char line[256] = {};
    if (fgets(line, sizeof line, f)) sscanf(line, "listening on 127.0.0.1:%d", &port);
    EXPECT_GT(port, 0) << line;
  }
  ~ServeProcess() {
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
  }
};

struct Client {
  int fd = -1;
  std::string buf;
  explicit Client(int port) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  }
  ~Client() { close(fd); }
  void send_raw(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += (size_t)n;
    }
  }
  // The next reply line ("" when the server closed the connection).
  std::string reply() {
    for (;;) {
      const size_t nl = buf.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return line;
      }
      char tmp[4096];
      const ssize_t n = recv(fd, tmp, sizeof tmp, 0);
      if (n <= 0) return "";
      buf.append(tmp, (size_t)n);
    }
  }
  json ask(const std::string& line) {
    send_raw(line + "\n");
    return json::parse(reply());
  }
};

// A base64 PNG of the environment's first frame (through nav-env, as the client gets it).
std::string frame_b64() {
  const fs::path dir = fresh_dir("nav_frame");
  sh("echo '{\"reset\": {\"seed\": 1, \"episode\": 0}}' | trainer/treetrain nav-env > " + (dir / "o").string());
  return json::parse(slurp(dir / "o")).at("image").get<std::string>();
}

// The GPU recipe (configs/vla_quickstart_gpu.yaml, device: cuda) loads and trains as shipped;
// here on the CPU for two steps of a small budget, and without a GPU `device: cuda` as written is
// the clear error, never a silent fall-back to the CPU.
TEST(NavServe, GpuRecipeLoadsAndTrains) {
  const fs::path dir = fresh_dir("nav_gpu_recipe");
  const std::string data = (dir / "episodes.jsonl").string();
  ASSERT_EQ(sh("trainer/treetrain generate --kind nav-episodes --out " + data + " --num-episodes 4 --seed 5 2>/dev/null"), 0);
  const std::string common = "trainer/treetrain --config configs/vla_quickstart_gpu.yaml --set run_dir=" +
                             (dir / "run").string() + " --set data.path=" + data + " --set train.max_steps=2";
  EXPECT_EQ(sh(common + " --set device=cpu --set data.max_tokens_per_batch=1024 2>/dev/null"), 0);
  EXPECT_TRUE(fs::exists(dir / "run" / "metrics.jsonl"));
  if (sh("nvidia-smi -L >/dev/null 2>&1") != 0) {
    const std::string log = (dir / "cuda.log").string();
    EXPECT_NE(sh(common + " --set run_dir=" + (dir / "run_cuda").string() + " 2>" + log), 0);
    EXPECT_NE(slurp(log).find("cuda"), std::string::npos) << slurp(log);
  }
}

TEST(NavServe, EvalReportsTheModelAndBothBaselines) {
  const fs::path dir = fresh_dir("nav_eval");
  ASSERT_EQ(sh("trainer/treetrain eval --env nav --checkpoint " + trained_run().string() +
               " --episodes 6 --seed 11 > " + (dir / "o").string() + " 2>/dev/null"),
            0);
  const json j = json::parse(slurp(dir / "o"));
  EXPECT_EQ(j.at("env"), "nav");
  EXPECT_EQ(j.at("episodes"), 6);
  for (const char* k : {"model", "random", "zeroed_images"}) {
    EXPECT_GE(j.at(k).at("success").get<double>(), 0.0) << k;
    EXPECT_LE(j.at(k).at("success").get<double>(), 1.0) << k;
    EXPECT_LE(j.at(k).at("spl").get<double>(), j.at(k).at("success").get<double>() + 1e-12) << k;
  }
  EXPECT_EQ(sh("trainer/treetrain eval --env maze --checkpoint x 2>/dev/null"), 2);
}

TEST(NavServe, BadRequestsGetErrorsAndNeverStopTheServer) {
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12 --max-message-bytes 65536");
  Client c(s.port);
  const std::string img = frame_b64();
  auto error_of = [&](const std::string& line) {
    const json r = c.ask(line);
    return r.contains("error") ? r.at("error").get<std::string>() : std::string("(no error) ") + r.dump();
  };
  EXPECT_NE(error_of("{not json").find("malformed JSON"), std::string::npos);
  EXPECT_NE(error_of("[1, 2]").find("a \"session\" string"), std::string::npos);
  EXPECT_NE(error_of(R"({"session": "a", "images": [")" + img + R"("]})").find("unknown session \"a\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"session": "a", "reset": true, "instruction": [99]})").find("token ids in [0, 16)"),
            std::string::npos);
  EXPECT_EQ(c.ask(R"({"session": "a", "reset": true, "instruction": [2, 4]})").at("ok"), true);
  EXPECT_NE(error_of(R"({"session": "a", "images": ["abc"]})").find("base64 of 3 characters"), std::string::npos);
  EXPECT_NE(error_of(R"({"session": "a", "images": ["AAAA"]})").find("not a PNG or JPEG"), std::string::npos);
  // A 4 x 4 PNG where the tower reads 16 x 16.
  tt::data::Image tiny;
  tiny.width = tiny.height = 4;
  tiny.rgb.assign(4 * 4 * 3, 100);
  const std::string small = tt::base64_encode(tt::data::encode_png(tiny));
  EXPECT_NE(error_of(R"({"session": "a", "images": [")" + small + R"("]})").find("4 x 4 pixels, expected 16 x 16"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"session": "a", "images": [")" + img + R"("], "state": [1.0]})")
                .find("\"state\" has 1 values, expected vision.state_dim = 0"),
            std::string::npos);
  // A good step after all of that.
  const json ok = c.ask(R"({"session": "a", "images": [")" + img + R"("]})");
  ASSERT_TRUE(ok.contains("action_ids")) << ok.dump();
  EXPECT_EQ(ok.at("step"), 0);
  EXPECT_GE(ok.at("action_ids")[0].get<int>(), 8);
  EXPECT_LT(ok.at("action_ids")[0].get<int>(), 12);
  // An oversize line: an error reply, then that connection closes; others carry on.
  c.send_raw(std::string(70000, 'x'));
  const json big = json::parse(c.reply());
  EXPECT_NE(big.at("error").get<std::string>().find("longer than 65536 bytes"), std::string::npos);
  EXPECT_EQ(c.reply(), "") << "the connection is closed";
  Client d(s.port);
  EXPECT_EQ(d.ask(R"({"session": "a", "images": [")" + img + R"("]})").at("step"), 1) << "the session lives on";
  EXPECT_EQ(d.ask(R"({"session": "a", "close": true})").at("ok"), true);
  EXPECT_NE(d.ask(R"({"session": "a", "close": true})").at("error").get<std::string>().find("unknown session"),
            std::string::npos);
}

// Continuous actions: a checkpoint with action_bins.json (configs/vla_tiny.yaml on toy episodes,
// 2-dim actions in 16 bins, a 2-value state) is served without --action-ids: two tokens among the
// last 16 ids, decoded into an action inside the bins' range.
TEST(NavServe, ContinuousActionsDecodeThroughTheCheckpointsBins) {
  const fs::path dir = fresh_dir("serve_continuous");
  const std::string data = (dir / "episodes.jsonl").string();
  ASSERT_EQ(sh("trainer/treetrain generate --kind toy-episodes --out " + data + " --num-episodes 3 --steps 3 2>/dev/null"), 0);
  ASSERT_EQ(sh("trainer/treetrain --config configs/vla_tiny.yaml --set run_dir=" + (dir / "run").string() +
               " --set data.path=" + data + " --set train.max_steps=2 --set train.checkpoint_every=0 2>/dev/null"),
            0);
  ServeProcess s("--checkpoint " + (dir / "run").string());
  Client c(s.port);
  tt::data::Image img;
  img.width = img.height = 16;
  img.rgb.assign(16 * 16 * 3, 30);
  const std::string b64 = tt::base64_encode(tt::data::encode_png(img));
  EXPECT_EQ(c.ask(R"({"session": "r", "reset": true, "instruction": [2, 3, 4]})").at("ok"), true);
  const json r = c.ask(R"({"session": "r", "images": [")" + b64 + R"("], "state": [0.5, 1.0]})");
  ASSERT_TRUE(r.contains("action")) << r.dump();
  ASSERT_EQ(r.at("tokens").size(), 2u);
  for (const json& t : r.at("tokens")) {
    EXPECT_GE(t.get<int>(), 64 - 16);
    EXPECT_LT(t.get<int>(), 64);
  }
  ASSERT_EQ(r.at("action").size(), 2u);
  for (const json& a : r.at("action")) {
    EXPECT_GE(a.get<double>(), -1.0 - 1e-6);  // the toy actions' range, [-1, 1]
    EXPECT_LE(a.get<double>(), 1.0 + 1e-6);
  }
  EXPECT_NE(c.ask(R"({"session": "r", "images": [")" + b64 + R"("]})").at("error").get<std::string>().find(
                "\"state\" has 0 values, expected vision.state_dim = 2"),
            std::string::npos);
}

TEST(NavServe, TheReferenceClientReproducesEval) {
  if (sh("python3 -c 'import json, socket' 2>/dev/null") != 0) GTEST_SKIP() << "no python3 on this machine";
  const fs::path dir = fresh_dir("nav_client");
  ASSERT_EQ(sh("trainer/treetrain eval --env nav --checkpoint " + trained_run().string() +
               " --episodes 8 --seed 21 > " + (dir / "eval").string() + " 2>/dev/null"),
            0);
  const json want = json::parse(slurp(dir / "eval")).at("model");
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12");
  ASSERT_EQ(sh("python3 scripts/nav_client.py --server 127.0.0.1:" + std::to_string(s.port) +
               " --treetrain trainer/treetrain --episodes 8 --seed 21 > " + (dir / "client").string()),
            0);
  const json got = json::parse(slurp(dir / "client"));
  EXPECT_EQ(got.at("success").get<double>(), want.at("success").get<double>());
  EXPECT_EQ(got.at("spl").get<double>(), want.at("spl").get<double>());
}

}  // namespace
