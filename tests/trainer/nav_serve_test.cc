// Closing the loop (issue 17) through the binary: a tiny VLA trained on generated nav episodes;
// `treetrain eval --env nav` reports the model, the random policy and the zeroed-image model;
// `treetrain serve` answers sessions and survives every bad request (malformed JSON or invalid
// UTF-8, unknown session or request, mistyped or unknown fields, undecodable or wrongly sized
// image, bad state, an oversize line, an instruction or a step past the context) with an error
// naming it, and such a request changes no session; a client that never reads its replies is
// dropped without stalling the others, one that pipelines takes turns with them, and the request
// bytes buffered across connections have a budget; "\r\n" line ends and a last line without its
// newline are taken; session names are escaped in the log; startup refuses action bins and
// action-token counts the model cannot serve; and the reference
// client (scripts/nav_client.py, through `serve` and `nav-env`) reproduces eval's success rate
// and SPL for the same seeds.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/base64.h"
#include "data/image.h"
#include "tests/trainer/test_util.h"
#include "trainer/checkpoint.h"

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

// A checkpoint with action_bins.json (configs/vla_tiny.yaml on toy episodes: 2-dim actions in 16
// bins of a 64-id vocabulary, a 2-value state), made once.
const fs::path& continuous_run() {
  static const fs::path run = [] {
    const fs::path dir = fresh_dir("serve_continuous");
    const std::string data = (dir / "episodes.jsonl").string();
    EXPECT_EQ(sh("trainer/treetrain generate --kind toy-episodes --out " + data + " --num-episodes 3 --steps 3 2>/dev/null"), 0);
    EXPECT_EQ(sh("trainer/treetrain --config configs/vla_tiny.yaml --set run_dir=" + (dir / "run").string() +
                 " --set data.path=" + data + " --set train.max_steps=2 --set train.checkpoint_every=0 2>/dev/null"),
              0);
    return dir / "run";
  }();
  return run;
}

// The newest checkpoint of `run` copied to a fresh folder without its trainer_state.json: a
// checkpoint that does not say how many cameras it was trained with (as a Hugging Face folder).
fs::path unlabelled_checkpoint(const fs::path& run, const std::string& name) {
  const fs::path dir = fresh_dir(name), ckpt = tt::trainer::latest_checkpoint(run.string());
  EXPECT_FALSE(ckpt.empty()) << run;
  fs::copy(ckpt, dir / "ckpt", fs::copy_options::recursive);
  fs::remove(dir / "ckpt" / "trainer_state.json");
  return dir / "ckpt";
}

// `treetrain serve` as a child process; its port read from its first stdout line.
struct ServeProcess {
  pid_t pid = -1;
  int port = 0;
  // log: where the server's stderr goes; shell: commands before it (a ulimit).
  explicit ServeProcess(const std::string& flags, const std::string& log = "/dev/null",
                        const std::string& shell = "") {
    int p[2];
    EXPECT_EQ(pipe(p), 0);
    pid = fork();
    if (pid == 0) {
      dup2(p[1], 1);
      close(p[0]);
      const std::string cmd = shell + "exec trainer/treetrain serve " + flags + " 2>" + log;
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

// The connection's next read is the end of the stream (0), not a reset (-1, ECONNRESET: the
// peer closed with bytes unread, which can discard replies still on their way).
void expect_end_of_stream(int fd) {
  char tmp[16];
  errno = 0;
  const ssize_t n = recv(fd, tmp, sizeof tmp, 0);
  EXPECT_EQ(n, 0) << "the end of the stream, got " << n << " (" << std::strerror(errno) << ")";
}

struct Client {
  int fd = -1;
  std::string buf;
  explicit Client(int port) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    const timeval wait{60, 0};  // a server that stops answering fails the test instead of hanging it
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
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
  // The next reply line ("" when the server closed the connection or answered nothing for 60 s).
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
    const std::string r = reply();
    if (r.empty()) return json{{"no reply", "the server closed the connection or stopped answering"}};
    return json::parse(r);
  }
  // The error a request gets (or what came instead).
  std::string error_of(const std::string& line) {
    const json r = ask(line);
    return r.contains("error") ? r.at("error").get<std::string>() : "(no error) " + r.dump();
  }
};

// The start of a request object naming session `name`: {"session": "name"
std::string str_session(const std::string& name) { return "{\"session\": \"" + name + "\""; }

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

// The longest context (2 instruction rows, then 16 rows a frame per step of --max-steps or of the
// window) must fit max_position_embeddings 1024: an error naming the flag and the limit before any
// rollout, never a run past the model's positions or a cache failure minutes later.
TEST(NavServe, EvalChecksTheContextAgainstTheModelsPositions) {
  const fs::path dir = fresh_dir("nav_eval_positions");
  const std::string eval = "trainer/treetrain eval --env nav --checkpoint " + trained_run().string() + " --episodes 1";
  const std::string ckpt = trained_run().string() + "/checkpoints/step_3";
  ASSERT_EQ(sh(eval + " --max-steps 1100 2> " + (dir / "e").string()), 1);
  EXPECT_EQ(slurp(dir / "e"), "error: --max-steps 1100 with the full history: the context of a step reaches 2 + 1100 x "
                              "16 = 17602 rows (the instruction, then 16 rows a frame), more than "
                              "max_position_embeddings 1024 of " + ckpt + "/config.json; expected --max-steps <= 63 or "
                              "--window W <= 63\n");
  ASSERT_EQ(sh(eval + " --max-steps 64 2> " + (dir / "e").string()), 1);
  EXPECT_NE(slurp(dir / "e").find("error: --max-steps 64 with the full history: the context of a step reaches 2 + 64 x "
                                  "16 = 1026 rows"),
            std::string::npos)
      << slurp(dir / "e");
  ASSERT_EQ(sh(eval + " --max-steps 100 --window 64 2> " + (dir / "e").string()), 1);
  EXPECT_NE(slurp(dir / "e").find("error: --window 64: the context of a step reaches 2 + 64 x 16 = 1026 rows"),
            std::string::npos)
      << slurp(dir / "e");
  EXPECT_NE(slurp(dir / "e").find("expected --window <= 63"), std::string::npos) << slurp(dir / "e");
  // At the limit it runs: 2 + 63 x 16 = 1010 rows.
  ASSERT_EQ(sh(eval + " --max-steps 63 > " + (dir / "o").string() + " 2>/dev/null"), 0);
  EXPECT_EQ(json::parse(slurp(dir / "o")).at("episodes"), 1);
}

// A run trained with segments (nav episodes deeper than segments.length 64, 16-row frames cut by
// its boundaries): eval runs the policy through the segment operator as training ran, whose
// positions stay below 64 + 32 however long the episode, so --max-steps 70 (past the 63 the
// unsegmented check above allows) runs. (serve builds its sessions' policies the same way.)
// A run trained with segments (of 64 rows, tail 32) and `extra` settings for two steps, in
// fresh_dir(name); its training log beside it (train_log).
fs::path segmented_run(const std::string& name, const std::string& extra) {
  const fs::path dir = fresh_dir(name);
  const std::string data = (dir / "episodes.jsonl").string();
  EXPECT_EQ(sh("trainer/treetrain generate --kind nav-episodes --out " + data + " --num-episodes 4 --seed 5 2>/dev/null"), 0);
  EXPECT_EQ(sh("trainer/treetrain --config configs/vla_quickstart.yaml --set run_dir=" + (dir / "run").string() +
               " --set data.path=" + data + " --set train.max_steps=2 --set train.checkpoint_every=0"
               " --set segments.length=64 --set segments.tail=32" + extra + " > " + (dir / "train_log").string() +
               " 2>&1"),
            0)
      << slurp(dir / "train_log");
  return dir / "run";
}

// Made once each: segments alone, and with retrieval (the one KV head of layer 1 long-range, 2
// pairs retrieved).
const fs::path& segments_run() {
  static const fs::path run = segmented_run("nav_segments", "");
  return run;
}
const fs::path& retrieval_run() {
  static const fs::path run =
      segmented_run("nav_retrieval", " --set segments.long_range.layers=[1] --set segments.long_range.heads=[0]"
                                     " --set segments.long_range.retrieve=2");
  return run;
}

// One session's context in bytes, from the startup log of a server of `flags`.
int64_t session_bytes(const std::string& flags) {
  const fs::path log = fresh_dir("serve_session_bytes") / "serve.log";
  const int rc = sh("timeout 30 trainer/treetrain serve " + flags + " --max-requests 0 > /dev/null 2> " + log.string());
  const std::string text = slurp(log);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find(" bytes together at most (3/4 of the "), std::string::npos) << text;
  const size_t at = text.find("a session's context takes ");
  EXPECT_NE(at, std::string::npos) << text;
  return at == std::string::npos ? 0 : std::stoll(text.substr(at + 26));
}

TEST(NavServe, ARunTrainedWithSegmentsIsEvaluatedThroughThem) {
  const fs::path dir = segments_run().parent_path();
  EXPECT_NE(slurp(dir / "train_log").find("train segment by segment"), std::string::npos) << slurp(dir / "train_log");
  ASSERT_EQ(sh("trainer/treetrain eval --env nav --checkpoint " + (dir / "run").string() +
               " --episodes 1 --max-steps 70 > " + (dir / "o").string() + " 2> " + (dir / "e").string()),
            0)
      << slurp(dir / "e");
  const json j = json::parse(slurp(dir / "o"));
  EXPECT_EQ(j.at("episodes"), 1);
  // The two-step model never reaches the goal: its episode runs past the 63 steps' 1,010 rows.
  EXPECT_GT(j.at("mean_steps").get<double>(), 63.0);
  EXPECT_NE(slurp(dir / "e").find("history full, segments of 64 tail 32"), std::string::npos) << slurp(dir / "e");
  // serve builds its sessions' policies the same way: an instruction longer than the model's 1,024
  // positions is taken (segments bound the positions, not the path), and steps are answered.
  ServeProcess s("--checkpoint " + (dir / "run").string() + " --action-ids 8:12");
  Client c(s.port);
  std::string ins;
  for (int i = 0; i < 1100; ++i) ins += (i ? ", " : "") + std::to_string(2 + i % 9);
  const json r = c.ask(R"({"session": "a", "reset": true, "instruction": [)" + ins + "]}");
  ASSERT_EQ(r.value("ok", false), true) << r.dump();
  const std::string img = frame_b64();
  for (int step = 0; step < 2; ++step) {
    const json a = c.ask(R"({"session": "a", "images": [")" + img + R"("]})");
    ASSERT_TRUE(a.contains("action_ids")) << a.dump();
    EXPECT_EQ(a.at("step"), step);
  }
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
  // A key named twice: an error, not the last value silently.
  EXPECT_EQ(error_of(R"({"session": "a", "session": "zz", "reset": true, "instruction": [2]})"),
            "malformed JSON: duplicate key \"session\": a JSON object names each key once (a second value would "
            "silently replace the first)");
  // Nested 30k levels deep (under --max-message-bytes; 100k overflowed the stack quoting it in the
  // reply): an error, the session goes on.
  const std::string deep = std::string(30000, '[') + std::string(30000, ']');
  EXPECT_EQ(error_of(R"({"session": "a", "reset": )" + deep + "}"),
            "malformed JSON: arrays and objects nested deeper than 256 levels");
  EXPECT_EQ(error_of(R"({"session": "a", "reset": true, "instruction": [2, )" + deep + "]}"),
            "malformed JSON: arrays and objects nested deeper than 256 levels");
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
  // One image a camera, as many as the policy was trained with (the checkpoint says: 1).
  const std::string state_file = (fs::path(tt::trainer::latest_checkpoint(trained_run().string())) /
                                  "trainer_state.json").string();
  EXPECT_EQ(error_of(R"({"session": "a", "images": [")" + img + R"(", ")" + img + R"("]})"),
            "2 images, expected 1 (one a camera, as the policy was trained: " + state_file + "'s data.cameras)");
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
  ServeProcess s("--checkpoint " + continuous_run().string());
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

// A checkpoint that does not say how many cameras it was trained with (no trainer_state.json, as
// a Hugging Face folder): any count is served, the same in every step of a session.
TEST(NavServe, ASessionKeepsItsFirstStepsCameraCount) {
  ServeProcess s("--checkpoint " + unlabelled_checkpoint(continuous_run(), "serve_cameras").string());
  Client c(s.port);
  tt::data::Image img;
  img.width = img.height = 16;
  img.rgb.assign(16 * 16 * 3, 30);
  const std::string b64 = tt::base64_encode(tt::data::encode_png(img));
  const std::string two = R"({"session": "r", "images": [")" + b64 + R"(", ")" + b64 + R"("], "state": [0.5, 1.0]})";
  const std::string one = R"({"session": "r", "images": [")" + b64 + R"("], "state": [0.5, 1.0]})";
  EXPECT_EQ(c.ask(R"({"session": "r", "reset": true, "instruction": [2, 3, 4]})").at("ok"), true);
  EXPECT_EQ(c.ask(two).at("step"), 0);
  EXPECT_EQ(c.error_of(one), "1 images, but this session's earlier steps had 2 (one a camera); reset the session to "
                             "change cameras");
  EXPECT_EQ(c.ask(two).at("step"), 1);
  EXPECT_EQ(c.ask(R"({"session": "r", "reset": true, "instruction": [2, 3, 4]})").at("ok"), true);
  EXPECT_EQ(c.ask(one).at("step"), 0);
}

// A 16 x 16 PNG, base64, of one grey level.
std::string grey_png_b64(int level) {
  tt::data::Image img;
  img.width = img.height = 16;
  img.rgb.assign(16 * 16 * 3, (uint8_t)level);
  return tt::base64_encode(tt::data::encode_png(img));
}

// `treetrain serve FLAGS` when it refuses to start: its exit code and its stderr (a server that
// starts anyway is stopped after 30 s: exit code 124).
std::pair<int, std::string> serve_startup(const std::string& flags) {
  const fs::path dir = fresh_dir("serve_startup");
  const int rc = sh("timeout 30 trainer/treetrain serve " + flags + " > /dev/null 2> " + (dir / "log").string());
  return {rc, slurp(dir / "log")};
}

// Whether a reply has come on the client's connection (read without waiting).
bool replied(Client& c) {
  for (char tmp[4096];;) {
    const ssize_t n = recv(c.fd, tmp, sizeof tmp, MSG_DONTWAIT);
    if (n <= 0) break;
    c.buf.append(tmp, (size_t)n);
  }
  return c.buf.find('\n') != std::string::npos;
}

// A reset of 50,000 instruction tokens (segments leave an instruction no bound) goes in
// --reset-piece-rows tokens a turn: while it does, another client's steps are answered, its
// session counts toward --max-sessions without being open yet, and once it is through it steps.
// A connection that closes (a reset) during its reset drops it: the session is never opened and
// its place is free again.
TEST(NavServe, ALongResetTakesTurnsWithOtherClients) {
  const fs::path log = fresh_dir("serve_long_reset") / "serve.log";
  ServeProcess s("--checkpoint " + segments_run().string() + " --action-ids 8:12 --max-sessions 2 --reset-piece-rows 64",
                 log.string());
  const std::string img = frame_b64(), step = R"(", "images": [")" + img + R"("]})";
  Client b(s.port);
  EXPECT_EQ(b.ask(R"({"session": "b", "reset": true, "instruction": [2, 4]})").at("ok"), true);
  std::string ins;
  for (int i = 0; i < 50000; ++i) ins += (i ? "," : "") + std::to_string(2 + i % 9);
  const std::string long_reset = R"(", "reset": true, "instruction": [)" + ins + "]}\n";
  auto a = std::make_unique<Client>(s.port);
  a->send_raw(R"({"session": "long)" + long_reset);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the server reads the line
  EXPECT_NE(b.error_of(R"({"session": "third", "reset": true, "instruction": [2]})").find("too many sessions (2"),
            std::string::npos);
  EXPECT_EQ(b.error_of(R"({"session": "long)" + step), "unknown session \"long\" (reset it first)");
  const std::string twice = b.error_of(R"({"session": "long", "reset": true, "instruction": [2]})");
  EXPECT_EQ(twice.rfind("session \"long\" is being reset by another request (50000 instruction tokens, from "
                        "127.0.0.1:", 0),
            0u)
      << twice;
  EXPECT_NE(twice.find("); wait for its reply"), std::string::npos) << twice;
  for (int t = 0; t < 3; ++t) EXPECT_EQ(b.ask(R"({"session": "b)" + step).value("step", -1), t);
  EXPECT_FALSE(replied(*a)) << "the other client's requests were answered while the long reset went in";
  const json r = json::parse(a->reply());
  EXPECT_EQ(r.value("ok", false), true) << r.dump();
  EXPECT_EQ(a->ask(R"({"session": "long)" + step).value("step", -1), 0);
  EXPECT_NE(slurp(log).find("serve: session \"long\" reset: 50000 instruction tokens in 782 pieces of "
                            "--reset-piece-rows 64"),
            std::string::npos)
      << slurp(log);
  // A reset whose connection goes away is dropped (a's connection closed first: --max-sessions
  // bounds the connections too).
  a.reset();
  EXPECT_EQ(b.ask(R"({"session": "b", "close": true})").at("ok"), true);
  {
    Client gone(s.port);
    const linger rst{1, 0};  // close() resets the connection
    setsockopt(gone.fd, SOL_SOCKET, SO_LINGER, &rst, sizeof rst);
    gone.send_raw(R"({"session": "gone)" + long_reset);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_NE(b.error_of(R"({"session": "third", "reset": true, "instruction": [2]})").find("too many sessions (2"),
              std::string::npos);
  }
  json third;
  for (int tries = 0; tries < 100; ++tries) {  // the server sees the reset, and frees the place
    third = b.ask(R"({"session": "third", "reset": true, "instruction": [2]})");
    if (third.value("ok", false)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(third.value("ok", false), true) << third.dump();
  EXPECT_EQ(b.error_of(R"({"session": "gone)" + step), "unknown session \"gone\" (reset it first)");
  EXPECT_NE(slurp(log).find("serve: session \"gone\"'s reset dropped after "), std::string::npos) << slurp(log);
}

// The sessions' contexts hold at most --max-cache-bytes together: with room for two and a half,
// a third session's reset is refused (naming the bytes and the flag) and changes nothing, a
// session's own reset (its fresh context in place of its old) is taken, also in pieces while the
// other session steps, and closing one makes room. A limit below one session's context stops the
// server at startup.
TEST(NavServe, TheSessionsContextsHaveABudget) {
  const fs::path log = fresh_dir("serve_cache_budget") / "serve.log";
  const int64_t each = session_bytes("--checkpoint " + trained_run().string() + " --action-ids 8:12");
  ASSERT_GT(each, 0);
  const int64_t budget = 2 * each + each / 2;
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12 --reset-piece-rows 1 "
                 "--max-cache-bytes " + std::to_string(budget),
                 log.string());
  Client c(s.port);
  const std::string img = frame_b64(), step = R"(", "images": [")" + img + R"("]})";
  for (const char* name : {"a", "b"})
    EXPECT_EQ(c.ask(str_session(name) + R"(, "reset": true, "instruction": [2, 5]})").at("ok"), true);
  EXPECT_EQ(c.error_of(R"({"session": "c", "reset": true, "instruction": [2, 5]})"),
            "reset of session \"c\" refused: the sessions' contexts hold " + std::to_string(2 * each) +
                " bytes (2 sessions open, 0 resets under way) and this one's takes " + std::to_string(each) +
                " more, past the limit of " + std::to_string(budget) +
                " bytes (--max-cache-bytes); close sessions, or raise --max-cache-bytes");
  EXPECT_EQ(c.error_of(R"({"session": "c)" + step), "unknown session \"c\" (reset it first)");
  EXPECT_EQ(c.ask(R"({"session": "a)" + step).at("step"), 0);
  EXPECT_EQ(c.ask(R"({"session": "a", "reset": true, "instruction": [2, 6]})").at("ok"), true);
  EXPECT_EQ(c.ask(R"({"session": "a)" + step).at("step"), 0);
  // While "a" is reset again (1,008 pieces of one row: both its contexts held, the limit counting
  // one), "b" steps: its context does not grow, so nothing is past the limit.
  {
    Client other(s.port);
    other.send_raw(json{{"session", "a"}, {"reset", true}, {"instruction", std::vector<int>(1008, 3)}}.dump() + "\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (int t = 0; t < 2; ++t) EXPECT_EQ(c.ask(R"({"session": "b)" + step).value("step", -1), t);
    EXPECT_FALSE(replied(other)) << "b stepped while a's reset went in";
    EXPECT_EQ(json::parse(other.reply()).value("ok", false), true);
  }
  EXPECT_EQ(c.ask(R"({"session": "b", "close": true})").at("ok"), true);
  EXPECT_EQ(c.ask(R"({"session": "c", "reset": true, "instruction": [2, 5]})").at("ok"), true);
  const auto [rc, err] = serve_startup("--checkpoint " + trained_run().string() + " --action-ids 8:12 "
                                       "--max-cache-bytes " + std::to_string(each - 1));
  EXPECT_EQ(rc, 1) << err;
  EXPECT_NE(err.find("serve: the sessions' contexts may hold " + std::to_string(each - 1) +
                     " bytes (--max-cache-bytes), less than one session's " + std::to_string(each) +
                     " bytes (1024 rows of context); expected at least that"),
            std::string::npos)
      << err;
}

// A session's idle time counts from its reset's reply, not from the reset's start: a reset longer
// than --session-idle-s leaves a session that steps.
TEST(NavServe, ASessionsIdleTimeCountsFromItsResetsReply) {
  ServeProcess s("--checkpoint " + segments_run().string() + " --action-ids 8:12 --reset-piece-rows 1 --session-idle-s 1");
  Client c(s.port);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c.ask(json{{"session", "a"}, {"reset", true}, {"instruction", std::vector<int>(20000, 3)}}.dump()).at("ok"),
            true);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(took, 1.2) << "the reset is to take longer than --session-idle-s";
  const json r = c.ask(R"({"session": "a", "images": [")" + frame_b64() + R"("]})");
  EXPECT_EQ(r.value("step", -1), 0) << r.dump();
}

// With retrieval a context grows with its path: a reset whose pool grows past --max-cache-bytes is
// stopped with an error naming how far it got, opens no session and leaves the room it took.
TEST(NavServe, AResetWhosePoolOutgrowsTheLimitStops) {
  const std::string flags = "--checkpoint " + retrieval_run().string() + " --action-ids 8:12";
  const int64_t each = session_bytes(flags);
  ASSERT_GT(each, 0);
  ServeProcess s(flags + " --max-cache-bytes " + std::to_string(2 * each));
  Client c(s.port);
  const std::string e =
      c.error_of(json{{"session", "r"}, {"reset", true}, {"instruction", std::vector<int>(20000, 3)}}.dump());
  EXPECT_EQ(e.rfind("reset of session \"r\" stopped after ", 0), 0u) << e;
  EXPECT_NE(e.find(" of its 20000 instruction tokens: the sessions' contexts hold "), std::string::npos) << e;
  EXPECT_NE(e.find(" bytes with it (with retrieval a context grows with its path), past the limit of " +
                   std::to_string(2 * each) + " bytes (--max-cache-bytes)"),
            std::string::npos)
      << e;
  EXPECT_EQ(c.error_of(R"({"session": "r", "close": true})"), "unknown session \"r\" (reset it first)");
  for (const char* name : {"a", "b"})
    EXPECT_EQ(c.ask(str_session(name) + R"(, "reset": true, "instruction": [2, 5]})").value("ok", false), true) << name;
  // Steps grow a session's pool until the contexts pass the limit (by one step's growth); its steps
  // are then refused, and a reset of it, which shrinks it, goes through.
  ServeProcess t(flags + " --max-cache-bytes " + std::to_string(each + 40000));
  Client x(t.port);
  EXPECT_EQ(x.ask(R"({"session": "x", "reset": true, "instruction": [2, 5, 3]})").value("ok", false), true);
  const std::string step = R"({"session": "x", "images": [")" + frame_b64() + R"("]})";
  std::string refused;
  for (int i = 0; i < 300 && refused.empty(); ++i) {
    const json r = x.ask(step);
    if (r.contains("error")) refused = r.at("error").get<std::string>();
  }
  EXPECT_EQ(refused.rfind("step of session \"x\" refused: the sessions' contexts hold ", 0), 0u) << refused;
  EXPECT_EQ(x.ask(R"({"session": "x", "reset": true, "instruction": [2, 5, 3]})").value("ok", false), true);
  EXPECT_EQ(x.ask(step).value("step", -1), 0);
}

// --max-requests (the tests' stop) counts a reset under way: it is answered before the server
// stops, and no line past the count is started.
TEST(NavServe, AResetUnderWayIsAnsweredBeforeMaxRequestsStops) {
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12 --reset-piece-rows 1 --max-requests 2");
  Client a(s.port), b(s.port);
  a.send_raw(json{{"session", "a"}, {"reset", true}, {"instruction", std::vector<int>(500, 3)}}.dump() + "\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  b.send_raw("{}\n{}\n");
  EXPECT_EQ(json::parse(a.reply()).value("ok", false), true);
  EXPECT_EQ(b.error_of(""), "expected a JSON object with a \"session\" string");
  EXPECT_EQ(b.reply(), "") << "the second line is past --max-requests";
  // An eviction's reply that takes the count while a reset is under way (20,000 pieces with
  // segments: seconds): the reset is answered all the same.
  ServeProcess t("--checkpoint " + segments_run().string() + " --action-ids 8:12 --reset-piece-rows 1 "
                 "--max-requests 1 --max-message-bytes 100000 --max-buffered-bytes 150000");
  Client hold(t.port);
  hold.send_raw(R"({"session": ")" + std::string(65000, 'y'));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Client c(t.port);
  c.send_raw(json{{"session", "c"}, {"reset", true}, {"instruction", std::vector<int>(20000, 3)}}.dump() + "\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::vector<std::unique_ptr<Client>> fill;  // the budget fills: one of the long lines is evicted
  for (const int bytes : {70000, 30000, 1}) {
    fill.push_back(std::make_unique<Client>(t.port));
    fill.back()->send_raw(R"({"session": ")" + std::string(bytes, 'z'));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string r = c.reply();
  ASSERT_FALSE(r.empty()) << "the reset under way is answered";
  EXPECT_EQ(json::parse(r).value("ok", false), true) << r;
}

// With the request budget full, a connection whose requests wait behind its reset holds them
// until the reset is through, so it is the one closed when it holds the most (not a smaller
// unfinished line elsewhere); its reset is dropped.
TEST(NavServe, AConnectionBehindItsResetIsEvictedWhenItHoldsTheMost) {
  const fs::path log = fresh_dir("serve_evict_reset") / "serve.log";
  ServeProcess s("--checkpoint " + segments_run().string() +
                     " --action-ids 8:12 --reset-piece-rows 1 --max-message-bytes 60000 --max-buffered-bytes 100000",
                 log.string());
  Client a(s.port), b(s.port);
  // 20,000 pieces: seconds, while the rest takes a few reads
  a.send_raw(json{{"session", "a"}, {"reset", true}, {"instruction", std::vector<int>(20000, 3)}}.dump() + "\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  a.send_raw(R"({"session": ")" + std::string(58000, 'x'));
  b.send_raw(R"({"session": ")" + std::string(15000, 'y'));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Client c(s.port);
  c.send_raw(R"({"session": ")" + std::string(50000, 'z'));  // waits to read: the budget is full
  EXPECT_EQ(a.error_of(""), "the requests buffered across all connections reached the server's limit of 100000 "
                            "bytes (--max-buffered-bytes) and this connection's requests waiting behind its reset "
                            "were the most bytes; closing the connection");
  for (Client* other : {&b, &c}) {  // served on: their lines, once whole, are answered
    other->send_raw("\"}");
    EXPECT_EQ(other->error_of("").rfind("\"session\" of ", 0), 0u);  // a name past 256 bytes: answered
  }
  EXPECT_NE(slurp(log).find("serve: session \"a\"'s reset dropped after "), std::string::npos) << slurp(log);
}

// Invalid UTF-8 in a request is malformed JSON, answered (the parse error's quote of the bytes
// made valid), and the server serves on.
TEST(NavServe, InvalidUtf8IsAnErrorAndTheServerServesOn) {
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12");
  Client c(s.port);
  for (const std::string bad : {"{\"session\":\"\xff\"}", "{\"session\": \"a\xc3\x28\"}"}) {
    const std::string e = c.error_of(bad);
    EXPECT_EQ(e.rfind("malformed JSON: ", 0), 0u) << e;
    EXPECT_NE(e.find("ill-formed UTF-8 byte"), std::string::npos) << e;
  }
  EXPECT_EQ(c.error_of("\xfe\xff").rfind("malformed JSON: ", 0), 0u);
  EXPECT_EQ(c.ask(R"({"session": "a", "reset": true, "instruction": [2, 4]})").at("ok"), true);
  EXPECT_EQ(c.ask(R"({"session": "a", "images": [")" + frame_b64() + R"("]})").at("step"), 0);
}

// A client that pipelines requests and never reads the replies is disconnected (with a log line)
// once its unsent replies pass --max-message-bytes; another client is answered all along.
TEST(NavServe, AClientThatNeverReadsIsDroppedAndNeverStallsOthers) {
  const fs::path dir = fresh_dir("serve_non_reader");
  const std::string log = (dir / "log").string();
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12 --max-message-bytes 65536", log);
  Client greedy(s.port);
  const timeval wait{20, 0};  // a server that stops reading leaves send() failing with EAGAIN
  setsockopt(greedy.fd, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof wait);
  // Lines of 1000 bytes, each a malformed-JSON error of about 600 bytes: 64 MB sent at most.
  const std::string line = "\"" + std::string(998, 'a') + "\n";
  std::string burst;
  for (int i = 0; i < 64; ++i) burst += line;
  int send_errno = 0;
  std::thread sender([&] {
    for (int64_t sent = 0; sent < ((int64_t)64 << 20);) {
      size_t off = 0;
      while (off < burst.size()) {
        const ssize_t n = send(greedy.fd, burst.data() + off, burst.size() - off, MSG_NOSIGNAL);
        if (n <= 0) {
          send_errno = errno;
          return;
        }
        off += (size_t)n;
      }
      sent += (int64_t)burst.size();
    }
  });
  sender.join();
  EXPECT_TRUE(send_errno == EPIPE || send_errno == ECONNRESET)
      << "the server should close the connection, not stop reading it: " << std::strerror(send_errno);
  Client other(s.port);
  EXPECT_EQ(other.ask(R"({"session": "b", "reset": true, "instruction": [2, 4]})").at("ok"), true);
  EXPECT_EQ(other.ask(R"({"session": "b", "images": [")" + frame_b64() + R"("]})").at("step"), 0);
  EXPECT_NE(slurp(log).find("replies unsent (it does not read them"), std::string::npos) << slurp(log);
}

// At most --max-sessions connections at once (each may buffer --max-message-bytes): one more is
// told so and closed as a served connection is, with the end of the stream after the error, not a
// reset (its request, sent at once, is unread when the server closes: closing at once failed
// here whenever the request arrived first, the usual order, not a certain one); refused or
// closed connections still lingering hold no slot: once one closes, a new one is served.
TEST(NavServe, ConnectionsPastTheLimitAreRefused) {
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12 --max-sessions 2");
  auto client = std::make_unique<Client>(s.port);
  Client second(s.port);
  EXPECT_EQ(client->ask(R"({"session": "a", "reset": true, "instruction": [2, 4]})").at("ok"), true);
  EXPECT_EQ(second.ask(R"({"session": "b", "reset": true, "instruction": [2, 4]})").at("ok"), true);
  const std::string limit = "the server holds 2 connections, its limit (--max-sessions 2); try again when one closes";
  Client third(s.port);  // kept open (not closing its side): the server's end lingers
  EXPECT_EQ(third.ask(R"({"session": "c", "reset": true, "instruction": [2, 4]})").at("error"), limit);
  expect_end_of_stream(third.fd);
  client.reset();  // closes
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Client fourth(s.port);  // (sessions outlive connections: a and b are the two this limit allows)
  EXPECT_EQ(fourth.ask(R"({"session": "a", "reset": true, "instruction": [2, 4]})").at("ok"), true);
  Client fifth(s.port);  // second and fourth are the two
  EXPECT_EQ(fifth.ask(R"({"session": "c", "reset": true, "instruction": [2, 4]})").at("error"), limit);
}

// --max-message-bytes holds however the stream is split into reads: a whole line past it, sent
// at once with its newline, is refused as a line without one is (error, then the end of the
// stream); a line of exactly the limit (its "\r\n" aside) is answered.
TEST(NavServe, AWholeLinePastTheLimitIsRefused) {
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12 --max-message-bytes 1024");
  const std::string reset = R"({"session": "a", "reset": true, "instruction": [2, 4]})";
  Client ok(s.port);
  EXPECT_EQ(ok.ask(reset + std::string(1024 - reset.size(), ' ') + "\r").at("ok"), true);
  Client c(s.port);
  c.send_raw(reset + std::string(1100 - reset.size(), ' ') + "\n");
  EXPECT_EQ(json::parse(c.reply()).at("error"), "message longer than 1024 bytes; closing the connection");
  expect_end_of_stream(c.fd);
  // Flags whose sum would overflow are refused, not taken.
  const auto [rc, log] = serve_startup("--checkpoint " + trained_run().string() +
                                       " --action-ids 8:12 --max-message-bytes 9223372036854775807 "
                                       "--max-buffered-bytes 1024");
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find("--max-buffered-bytes 1024: less than --max-message-bytes 9223372036854775807 + 2"),
            std::string::npos)
      << log;
}

// Under a descriptor limit too low for --max-sessions (ulimit -n 160 here, hard and soft), the
// server serves as many sessions as fit (3 descriptors each, 64 spare: 32), says so at start,
// and refuses the connection past them with its reply instead of leaving it in the backlog.
TEST(NavServe, ADescriptorLimitLowersMaxSessions) {
  const fs::path log = fresh_dir("serve_fd_limit") / "serve.log";
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12", log.string(), "ulimit -n 160; ");
  EXPECT_NE(slurp(log).find("serve: --max-sessions 1024 needs about 3136 file descriptors, but the process may open "
                            "160 (ulimit -n; hard limit 160): serving at most 32 sessions"),
            std::string::npos)
      << slurp(log);
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 32; ++i) {
    clients.push_back(std::make_unique<Client>(s.port));
    EXPECT_EQ(clients.back()->ask(str_session("s" + std::to_string(i)) + R"(, "reset": true, "instruction": [2]})")
                  .at("ok"),
              true)
        << i;
  }
  Client refused(s.port);
  EXPECT_EQ(json::parse(refused.reply()).at("error"),
            "the server holds 32 connections, its limit (--max-sessions 32); try again when one closes");
}

// Refused connections linger in room of their own: with --max-sessions 1 and a refused client
// lingering (it keeps its socket open), a served connection the server closes (a line past
// --max-message-bytes, its bytes unread) still ends with its error and the end of the stream,
// not a reset.
TEST(NavServe, RefusedConnectionsLeaveServedOnesRoomToLinger) {
  ServeProcess s("--checkpoint " + trained_run().string() +
                 " --action-ids 8:12 --max-sessions 1 --max-message-bytes 1024");
  Client served(s.port);
  EXPECT_EQ(served.ask(R"({"session": "a", "reset": true, "instruction": [2, 4]})").at("ok"), true);
  Client refused(s.port);
  EXPECT_EQ(json::parse(refused.reply()).at("error"),
            "the server holds 1 connections, its limit (--max-sessions 1); try again when one closes");
  served.send_raw(std::string(200000, 'x'));
  EXPECT_EQ(json::parse(served.reply()).at("error"),
            "message longer than 1024 bytes without a newline; closing the connection");
  expect_end_of_stream(served.fd);
}

// The request bytes buffered across all connections are at most 16 x --max-message-bytes (1 MiB
// here): of 17 clients each holding 65,000 bytes of a line, the last finds the budget full, so one
// holding the longest unfinished line is told so and closed (one is enough: the 17 hold 56,424
// bytes more than the budget); the other 16 are served on (their lines, once whole, are
// answered), and so is a client of short requests beside them. The bytes answered are given back: the 16 hold 65,000 bytes each again, and none
// is refused.
TEST(NavServe, RequestsBufferedAcrossConnectionsHaveABudget) {
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12 --max-message-bytes 65536");
  std::vector<std::unique_ptr<Client>> holders;
  for (int i = 0; i < 17; ++i) {
    holders.push_back(std::make_unique<Client>(s.port));
    holders.back()->send_raw(std::string(65000, 'x'));
  }
  // The refused one is the only one with anything to read: wait for it, then a moment for others.
  std::vector<pollfd> fds;
  for (const auto& h : holders) fds.push_back({h->fd, POLLIN, 0});
  ASSERT_GT(poll(fds.data(), fds.size(), 60000), 0) << "no client was refused";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(poll(fds.data(), fds.size(), 0), 1) << "exactly one client is refused";
  size_t refused = 0;
  while (!(fds[refused].revents & POLLIN)) ++refused;
  EXPECT_EQ(json::parse(holders[refused]->reply()).at("error"),
            "the requests buffered across all connections reached the server's limit of 1048576 bytes (16 x "
            "--max-message-bytes) and this connection's unfinished line was the longest; closing the connection");
  EXPECT_EQ(holders[refused]->reply(), "") << "the connection is closed";
  Client c(s.port);
  EXPECT_EQ(c.ask(R"({"session": "a", "reset": true, "instruction": [2, 4]})").at("ok"), true);
  EXPECT_EQ(c.ask(R"({"session": "a", "images": [")" + frame_b64() + R"("]})").at("step"), 0);
  for (size_t i = 0; i < holders.size(); ++i) {
    if (i == refused) continue;
    EXPECT_EQ(holders[i]->error_of("").rfind("malformed JSON: ", 0), 0u) << i;
  }
  for (size_t i = 0; i < holders.size(); ++i)
    if (i != refused) holders[i]->send_raw(std::string(65000, 'y'));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (size_t i = 0; i < holders.size(); ++i) {
    if (i == refused) continue;
    EXPECT_EQ(holders[i]->error_of("").rfind("malformed JSON: ", 0), 0u) << i << ": not refused";
  }
}

// A client's pipelined requests are answered 16 a turn at most (a reset in pieces of
// --reset-piece-rows ends its connection's turn), each turn also serving the others: a request
// another client sends once a burst of 30 resets (one read of the server's; each reset a
// 1008-token instruction's prefill in four pieces, tens of ms) is being answered gets its reply
// before the burst's last; and every line of the burst is answered, in order.
TEST(NavServe, APipeliningClientTakesTurnsWithOthers) {
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12");
  Client other(s.port);  // connected first: it comes first in each turn
  EXPECT_EQ(other.ask(R"({"session": "b", "reset": true, "instruction": [2, 4]})").at("ok"), true);
  Client burst(s.port);
  std::string ins, lines;
  for (int i = 0; i < 1008; ++i) ins += (i ? "," : "") + std::to_string(2 + i % 8);
  for (int i = 0; i < 30; ++i)
    lines += R"({"session":"p)" + std::to_string(i) + R"(","reset":true,"instruction":[)" + ins + "]}\n";
  ASSERT_LE(lines.size(), 65536u) << "the burst is one read of the server's";
  burst.send_raw(lines);
  EXPECT_EQ(json::parse(burst.reply()).at("session"), "p0");
  EXPECT_EQ(other.ask(R"({"session": "b", "close": true})").at("ok"), true);
  // The burst's replies sent before the other client's: the first turn's 16 (a reply or so more
  // if this thread read late).
  int before = 1;
  for (char tmp[65536];;) {
    const ssize_t n = recv(burst.fd, tmp, sizeof tmp, MSG_DONTWAIT);
    if (n <= 0) break;
    burst.buf.append(tmp, (size_t)n);
  }
  for (char ch : burst.buf) before += ch == '\n';
  EXPECT_LT(before, 30);
  for (int i = 1; i < 30; ++i) {
    const json r = json::parse(burst.reply());
    EXPECT_EQ(r.at("session"), "p" + std::to_string(i)) << r.dump();
    EXPECT_EQ(r.value("ok", false), true) << r.dump();
  }
}

// A connection the server closes with the client's bytes still unread (a line past
// --max-message-bytes) ends with its error reply and then the end of the stream, not a reset
// (which can discard that reply on its way): the server shuts its sending side and drops what the
// client still sends until the client closes.
TEST(NavServe, AClosedConnectionEndsWithItsReplyNotAReset) {
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12 --max-message-bytes 1024");
  Client c(s.port);
  c.send_raw(std::string(200000, 'x'));  // the server stops reading past 1,024 bytes
  EXPECT_EQ(json::parse(c.reply()).at("error"),
            "message longer than 1024 bytes without a newline; closing the connection");
  expect_end_of_stream(c.fd);
  Client other(s.port);  // and the server carries on
  EXPECT_EQ(other.ask(R"({"session": "a", "reset": true, "instruction": [2, 4]})").at("ok"), true);
}

// A last request without its newline is answered once the client shuts down its sending side,
// then the connection closes.
TEST(NavServe, ALastLineWithoutANewlineIsAnsweredAtShutdown) {
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12");
  Client c(s.port);
  c.send_raw("{\"session\": \"a\", \"reset\": true, \"instruction\": [2, 4]}\n{\"session\": \"a\", \"images\": [\"" +
             frame_b64() + "\"]}");
  ASSERT_EQ(shutdown(c.fd, SHUT_WR), 0);
  EXPECT_EQ(json::parse(c.reply()).at("ok"), true);
  const std::string last = c.reply();
  ASSERT_FALSE(last.empty()) << "the last line is answered";
  EXPECT_EQ(json::parse(last).at("step"), 0) << last;
  EXPECT_EQ(c.reply(), "") << "the connection is closed";
  Client d(s.port);  // a whole line, then a "\r\n" one, before the shutdown: no reply for the empty one
  d.send_raw("{\"session\": \"a\", \"close\": true}\n\r");
  ASSERT_EQ(shutdown(d.fd, SHUT_WR), 0);
  EXPECT_EQ(json::parse(d.reply()).at("ok"), true);
  EXPECT_EQ(d.reply(), "") << "the connection is closed";
}

// "\r\n" line ends (a CRLF client's) are newlines: the "\r" is dropped, and a line that held only
// it is empty, skipped as an empty "\n" line is (no reply).
TEST(NavServe, CrlfLineEndsAreNewlines) {
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12");
  Client c(s.port);
  c.send_raw("\r\n\n\r\n{\"session\": \"a\", \"reset\": true, \"instruction\": [2, 4]}\r\n\r\n");
  EXPECT_EQ(c.reply(), R"({"ok":true,"session":"a"})");
  c.send_raw("{\"session\": \"a\", \"images\": [\"" + frame_b64() + "\"]}\r\n");
  EXPECT_EQ(json::parse(c.reply()).at("step"), 0);
  EXPECT_EQ(c.error_of("{\"session\": \"a\", \"close\": 1}\r"), "\"close\" is number 1, expected the boolean true");
}

// A session name with a newline and a terminal escape is quoted JSON-escaped in the log: it
// cannot forge a log line or colour the terminal.
TEST(NavServe, SessionNamesAreEscapedInTheLog) {
  const fs::path log = fresh_dir("serve_log_names") / "serve.log";
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12 --session-idle-s 1", log.string());
  Client c(s.port);
  const std::string name = R"(a\nserve: forged\u001b[31m\")";  // as the JSON request writes it
  EXPECT_EQ(c.ask(R"({"session": ")" + name + R"(", "reset": true, "instruction": [2, 4]})").at("ok"), true);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_NE(c.error_of(R"({"session": ")" + name + R"(", "close": true})").find("was closed after 1"),
            std::string::npos);
  const std::string text = slurp(log);
  EXPECT_NE(text.find("serve: session \"" + name + "\" closed after 1"), std::string::npos) << text;
  EXPECT_EQ(text.find("\nserve: forged"), std::string::npos) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
}

// A reset that fails (an instruction longer than the context) creates no session and leaves an
// existing one as it was: its next step is the step it would have been.
TEST(NavServe, AFailedResetChangesNothing) {
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12");
  Client c(s.port);
  const std::string img = frame_b64(), step = R"(", "images": [")" + img + R"("]})";
  json longer = {{"session", "a"}, {"reset", true}, {"instruction", std::vector<int>(2000, 2)}};
  const std::string too_long =
      "instruction of 2000 tokens exceeds the policy's context: 1024 rows (min(max_position_embeddings, 16384)) "
      "hold at most 1008 instruction tokens beside one step's 16 observation rows and 1 action token(s)";
  EXPECT_EQ(c.error_of(longer.dump()), too_long);
  EXPECT_EQ(c.error_of(R"({"session": "a)" + step), "unknown session \"a\" (reset it first)");
  longer["instruction"] = std::vector<int>(1009, 2);
  EXPECT_NE(c.error_of(longer.dump()).find("instruction of 1009 tokens exceeds"), std::string::npos);
  longer["instruction"] = std::vector<int>(1008, 2);
  EXPECT_EQ(c.ask(longer.dump()).at("ok"), true) << "the longest instruction that leaves room for a step";
  EXPECT_EQ(c.ask(R"({"session": "a)" + step).at("step"), 0);
  // "b" steps, fails a reset, steps again; "ref" takes the same steps without the failed reset.
  for (const char* name : {"b", "ref"})
    EXPECT_EQ(c.ask(str_session(name) + R"(, "reset": true, "instruction": [2, 5]})").at("ok"), true);
  EXPECT_EQ(c.ask(R"({"session": "b)" + step).at("step"), 0);
  EXPECT_EQ(c.ask(R"({"session": "ref)" + step).at("step"), 0);
  longer["session"] = "b";
  longer["instruction"] = std::vector<int>(2000, 2);
  EXPECT_EQ(c.error_of(longer.dump()), too_long);
  EXPECT_NE(c.error_of(R"({"session": "b", "reset": true, "instruction": [2, 99]})").find("token ids in [0, 16)"),
            std::string::npos);
  const json b = c.ask(R"({"session": "b)" + step), ref = c.ask(R"({"session": "ref)" + step);
  EXPECT_EQ(b.at("step"), 1) << b.dump();
  EXPECT_EQ(b.at("action_ids"), ref.at("action_ids"));
}

// A session unused for --session-idle-s is closed (its context freed, named in the log); a
// request naming it says so, and a reset opens it again. One that is used stays open.
TEST(NavServe, UnusedSessionsCloseAfterTheIdleTime) {
  const fs::path log = fresh_dir("serve_idle") / "serve.log";
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12 --session-idle-s 2 --max-sessions 2",
                 log.string());
  Client c(s.port);
  const std::string img = frame_b64(), step = R"(", "images": [")" + img + R"("]})";
  for (const char* name : {"used", "idle"})
    EXPECT_EQ(c.ask(str_session(name) + R"(, "reset": true, "instruction": [2, 5]})").at("ok"), true);
  EXPECT_NE(c.error_of(R"({"session": "third", "reset": true, "instruction": [2]})")
                .find("too many sessions (2, --max-sessions); close one first, or wait for one to go unused for 2 s"),
            std::string::npos);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_EQ(c.ask(R"({"session": "used)" + step).at("step"), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  // "idle" went unused for 2.5 s (closed at about 2), "used" for 1.3 s.
  const std::string e = c.error_of(R"({"session": "idle)" + step);
  EXPECT_EQ(e.rfind("session \"idle\" was closed after 2", 0), 0u) << e;
  EXPECT_NE(e.find(" s unused (--session-idle-s 2); reset it"), std::string::npos) << e;
  EXPECT_EQ(c.ask(R"({"session": "used)" + step).at("step"), 1);
  EXPECT_EQ(c.ask(R"({"session": "idle", "reset": true, "instruction": [2, 5]})").at("ok"), true);
  EXPECT_EQ(c.ask(R"({"session": "idle)" + step).at("step"), 0);
  EXPECT_EQ(c.ask(R"({"session": "never", "close": true})").at("error"), "unknown session \"never\" (reset it first)");
  EXPECT_NE(slurp(log).find("serve: session \"idle\" closed after 2"), std::string::npos) << slurp(log);
}

// A step the context cannot hold fails and leaves the session as it was: its next steps are a
// reference session's. The trained policy has one camera; a copy of its checkpoint that does not
// say so (unlabelled_checkpoint) takes 63 frames in a session's first step, where 17 instruction
// tokens and 63 x 16 frame rows need 1025 rows, one past the context of 1024.
TEST(NavServe, AFailedStepLeavesTheSessionAsItWas) {
  ServeProcess s("--checkpoint " + unlabelled_checkpoint(trained_run(), "failed_step").string() +
                 " --action-ids 8:12 --window 2");
  Client c(s.port);
  const std::string img = frame_b64(), other = grey_png_b64(90);
  std::string many;
  for (int i = 0; i < 63; ++i) many += std::string(i ? ", " : "") + "\"" + img + "\"";
  const std::string instruction = "[2, 3, 4, 5, 6, 7, 2, 3, 4, 5, 6, 7, 2, 3, 4, 5, 6]";
  for (const char* name : {"w", "ref"})
    EXPECT_EQ(c.ask(str_session(name) + R"(, "reset": true, "instruction": )" + instruction + "}").at("ok"), true);
  const std::string e = c.error_of(R"({"session": "w", "images": [)" + many + "]}");
  EXPECT_NE(e.find("policy: the step needs 1025 rows (its context and 0 fed-back action tokens), more than the "
                   "context of 1024 rows"),
            std::string::npos)
      << e;
  EXPECT_NE(c.error_of(R"({"session": "w", "images": [")" + img + R"("], "state": [1.0]})").find("state_dim = 0"),
            std::string::npos);
  for (const std::string& frame : {img, other, img, other}) {
    const json w = c.ask(R"({"session": "w", "images": [")" + frame + R"("]})");
    const json r = c.ask(R"({"session": "ref", "images": [")" + frame + R"("]})");
    ASSERT_TRUE(w.contains("action_ids")) << w.dump();
    EXPECT_EQ(w.at("step"), r.at("step"));
    EXPECT_EQ(w.at("action_ids"), r.at("action_ids"));
  }
}

// Values outside float range, session names past 256 bytes, wrongly sized images whose header
// alone tells (a PNG claiming 16384 x 16384 is refused without decoding 800 MB), unknown
// requests and mistyped fields: each error names what was wrong and what was expected, and the
// session's state is unchanged (its next step is step 0).
TEST(NavServe, BadFieldsAreNamedAndChangeNothing) {
  ServeProcess s("--checkpoint " + continuous_run().string());
  Client c(s.port);
  const std::string img = grey_png_b64(30);
  EXPECT_EQ(c.ask(R"({"session": "r", "reset": true, "instruction": [2, 3, 4]})").at("ok"), true);
  const std::string step = R"({"session": "r", "images": [")" + img + R"("], )";
  EXPECT_EQ(c.error_of(step + R"("state": [1e39, 0.2]})"),
            "\"state\"[0] = 1e+39, expected a finite 32-bit float (|x| <= 3.40282e+38)");
  EXPECT_EQ(c.error_of(step + R"("state": [0.5, -1e300]})"),
            "\"state\"[1] = -1e+300, expected a finite 32-bit float (|x| <= 3.40282e+38)");
  EXPECT_EQ(c.error_of(step + R"("state": [0.5, "x"]})"), "\"state\"[1] is string, expected a number");
  // A PNG whose header claims 16384 x 16384: the signature, IHDR's length and type, then the size.
  std::string huge = tt::data::encode_png([] {
    tt::data::Image i;
    i.width = i.height = 2;
    i.rgb.assign(12, 0);
    return i;
  }());
  for (int at : {16, 20}) {
    huge[at] = 0;
    huge[at + 1] = 0;
    huge[at + 2] = 0x40;
    huge[at + 3] = 0;
  }
  uint32_t crc = 0xFFFFFFFFu;  // IHDR's checksum over its type and data
  for (int i = 12; i < 29; ++i) {
    crc ^= (uint8_t)huge[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  crc = ~crc;
  for (int i = 0; i < 4; ++i) huge[29 + i] = (char)(crc >> (24 - 8 * i));
  EXPECT_EQ(c.error_of(R"({"session": "r", "images": [")" + tt::base64_encode(huge) + R"("], "state": [0.5, 0.2]})"),
            "images[0]: 16384 x 16384 pixels, expected 16 x 16 (the tower's vision.image_size)");
  const std::string name(257, 's');
  EXPECT_EQ(c.error_of(R"({"session": ")" + name + R"(", "reset": true, "instruction": [2]})"),
            "\"session\" of 257 bytes, expected at most 256");
  EXPECT_EQ(c.ask(R"({"session": ")" + name.substr(1) + R"(", "reset": true, "instruction": [2]})").at("ok"), true);
  EXPECT_EQ(c.error_of(R"({"session": "", "reset": true, "instruction": [2]})"),
            "\"session\" must be a non-empty string (at most 256 bytes)");
  EXPECT_EQ(c.error_of(R"({"session": "", "close": true})"),
            "\"session\" must be a non-empty string (at most 256 bytes)");
  EXPECT_EQ(c.error_of(R"({"session": "r", "act": true})"),
            "a request without \"reset\": true, \"images\" or \"close\": true (its keys: act, session)");
  EXPECT_EQ(c.error_of(R"({"session": "nobody", "step": 1})"),
            "a request without \"reset\": true, \"images\" or \"close\": true (its keys: session, step)");
  EXPECT_EQ(c.error_of(R"({"session": "r", "reset": "yes", "instruction": [2]})"),
            "\"reset\" is string \"yes\", expected the boolean true");
  EXPECT_EQ(c.error_of(R"({"session": "r", "close": 1})"), "\"close\" is number 1, expected the boolean true");
  EXPECT_EQ(c.error_of(R"({"session": "r", "reset": true, "instruction": [2], "images": []})"),
            "a request with more than one of \"reset\": true, \"images\" or \"close\": true (its keys: images, "
            "instruction, reset, session)");
  EXPECT_EQ(c.error_of(step + R"("state": [0.5, 0.2], "stat": [1]})"),
            "unknown key \"stat\" beside \"images\" (expected \"session\", \"images\", \"state\", \"reset\", \"close\")");
  const json ok = c.ask(step + R"("state": [0.5, 0.2]})");
  ASSERT_TRUE(ok.contains("action")) << ok.dump();
  EXPECT_EQ(ok.at("step"), 0) << "no bad request took a step";
}

// Startup checks: action_bins.json's vocab_size must be the model's, and the action tokens (with
// one step's rows) must fit the context; a continuous checkpoint's tokens are its bins' dims.
TEST(NavServe, StartupRefusesBinsAndActionTokensThatDoNotFit) {
  const fs::path dir = fresh_dir("serve_bad_bins");
  fs::path ckpt;  // the checkpoint folder, copied and served as a folder (a run_dir's checks its files' sizes)
  for (const auto& e : fs::recursive_directory_iterator(continuous_run()))
    if (e.path().filename() == "action_bins.json") ckpt = e.path().parent_path();
  ASSERT_FALSE(ckpt.empty());
  fs::copy(ckpt, dir / "ckpt", fs::copy_options::recursive);
  const fs::path bins = dir / "ckpt" / "action_bins.json";
  json b = json::parse(slurp(bins));
  ASSERT_EQ(b.at("vocab_size"), 64);
  b["vocab_size"] = 80;
  std::ofstream(bins) << b.dump();
  const auto [rc, log] = serve_startup("--checkpoint " + (dir / "ckpt").string());
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find(bins.string() + ": vocab_size 80, but the model's config.json has vocab_size 64"),
            std::string::npos)
      << log;
  // --action-ids is for discrete action ids: with the checkpoint's bins it is an error, not ids the
  // model never took as actions.
  const auto [rc1, log1] = serve_startup("--checkpoint " + continuous_run().string() + " --action-ids 8:12");
  EXPECT_EQ(rc1, 1) << log1;
  EXPECT_NE(log1.find("error: --action-ids 8:12: the checkpoint has " +
                      (fs::path(tt::trainer::latest_checkpoint(continuous_run().string())) / "action_bins.json").string() +
                      " (continuous actions, decoded through its bins); leave --action-ids and --action-tokens out"),
            std::string::npos)
      << log1;
  for (const char* n : {"3", "1"}) {  // given, it must be the bins' dimensions (1 is no longer the flag's absence)
    const auto [rc2, log2] = serve_startup("--checkpoint " + continuous_run().string() + " --action-tokens " + n);
    EXPECT_EQ(rc2, 1) << log2;
    EXPECT_NE(log2.find(std::string("--action-tokens ") + n + ": the checkpoint's action_bins.json decodes 2 tokens"),
              std::string::npos)
        << log2;
  }
  for (const char* n : {"1009", "3000000"}) {
    const auto [rc3, log3] = serve_startup("--checkpoint " + trained_run().string() + " --action-ids 8:12 --action-tokens " + n);
    EXPECT_EQ(rc3, 1) << log3;
    EXPECT_NE(log3.find(std::string("--action-tokens ") + n + ": one step's 16 observation rows and " + n +
                        " action tokens do not fit the context of 1024 rows (min(max_position_embeddings, 16384)) "
                        "beside an instruction; expected at most 1008 action tokens"),
              std::string::npos)
        << log3;
  }
  // The most that fit: served, with a one-token instruction.
  ServeProcess s("--checkpoint " + trained_run().string() + " --action-ids 8:12 --action-tokens 1008");
  Client c(s.port);
  EXPECT_NE(c.error_of(R"({"session": "x", "reset": true, "instruction": [2, 3]})").find("at most 1 instruction tokens"),
            std::string::npos);
  EXPECT_EQ(c.ask(R"({"session": "x", "reset": true, "instruction": [2]})").at("ok"), true);
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
