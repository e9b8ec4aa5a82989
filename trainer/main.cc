// treetrain: train a model on tree-structured data, report dataset statistics, generate data.
// The only place that exits: tt::Error -> "error: <msg>", exit 1; bad usage -> exit 2.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "data/reader.h"
#include "trainer/attention_bench.h"
#include "data/packing.h"
#include "data/stats.h"
#include "data/episode_tree.h"
#include "data/episodes.h"
#include "data/toy_episodes.h"
#include "data/nav_env.h"
#include "trainer/eval.h"
#include "trainer/serve.h"
#include "base/base64.h"
#include "data/synthetic.h"
#include "distributed/env.h"
#include "distributed/launch.h"
#include "trainer/sweep.h"
#include "base/check.h"
#include "base/files.h"
#include "base/json.h"
#include "base/omp_env.h"
#include "trainer/config.h"
#include "trainer/sample.h"
#include "trainer/train.h"

namespace {

const char* const kUsage = R"(usage:
  treetrain [train] --config FILE [--set KEY=VALUE ...]
      Train as the YAML config says. --set overrides one key (e.g. --set train.max_steps=50);
      repeatable. Keys and their meaning: trainer/config.h.
  treetrain stats --data FILE --format rollouts|tree|tokens|episodes [--vocab-size V] [--capacity C]
                  [--tokens-per-frame 196] [--window W] [--action-bins 256]
      Print one JSON object of dataset statistics (trees, paths, n_tree, n_flat, por, ...). With
      --capacity, its "partition" object holds the cost of partitioning every tree into pieces of
      at most C tokens (pieces, tokens_with_gateways, tokens_naive, peak_tokens, ...). --format
      episodes (robot/navigation episodes, data/episodes.h) counts each episode as its tree
      (--tokens-per-frame rows per image, --window W observations of history, 0 = all; needs
      --vocab-size; continuous actions become --action-bins bins per dimension, as
      data.action_bins, at most --vocab-size) and adds episodes, unique_frames, frame_occurrences
      and frame_reuse; its --capacity is at least --tokens-per-frame (a piece holds whole frames),
      and its "partition" object adds "frames": the tower's runs whole and partitioned.
  treetrain generate --kind rollouts|comb --out FILE [--num-trees N] [--vocab-size V] [--seed S]
                     [--prompt-len N] [--turns N] [--turn-len N] [--branches N] [--branch-turns N]
                     [--prefix-len N] [--steps N] [--history-len N] [--leaf-len N]
      Write synthetic tree-structured JSONL (rollouts format for rollouts, tree format for comb).
      rollouts takes --prompt-len, --turns, --turn-len, --branches, --branch-turns; comb takes
      --prefix-len, --steps, --history-len, --leaf-len. At most 2^28 tokens a tree (a rollouts
      group's sequences written out) and 2^31 tokens a file.
  treetrain generate --kind toy-episodes --out FILE [--num-episodes 32] [--steps 8] [--image-size 16]
                     [--seed 1]
      Write robot episodes (data.format: episodes) with PNG frames in <stem>_frames/ beside FILE
      (out/a.jsonl: out/a_frames/): a bright square per frame whose place is the step's 2-dim
      continuous action (configs/vla_tiny.yaml).
  treetrain generate --kind nav-episodes --out FILE [--num-episodes 200] [--seed 1] [--noise 0.2]
                     [--image-size 16] [--size 5] [--landmarks 3] [--walls 2] [--max-steps 24]
      Write expert episodes of the built-in navigation environment (data/nav_env.h) with their PNG
      frames (in <stem>_frames/ beside FILE): the shortest path's action per step (discrete
      action_ids 8..11: stop, forward, left, right); --noise: the probability of executing a random
      move instead (labels stay the expert's), so the data covers states off the path.
  treetrain eval --env nav --checkpoint DIR [--episodes 50] [--seed 7777] [--size 5] [--landmarks 3]
                 [--walls 2] [--max-steps 24] [--window W]
      Closed-loop rollouts of a trained VLA in the navigation environment on layouts of --seed
      (held out from generate's): prints JSON with success rate and SPL of the model, a random
      policy and the model with every frame black. The longest context (the instruction and a
      frame per step of --max-steps, or of the --window last steps) must fit the model's
      max_position_embeddings.
  treetrain serve --checkpoint DIR [--port 0] [--host 127.0.0.1] [--action-ids FIRST:END]
                  [--action-tokens 1] [--window W] [--max-sessions 1024] [--session-idle-s 3600]
                  [--max-message-bytes 16777216] [--max-buffered-bytes 16 x max-message-bytes]
                  [--reset-piece-rows 256] [--max-cache-bytes 3/4 of the memory available]
      A VLA policy server: JSON lines over TCP, sessions with reset / images (base64 PNG or JPEG)
      / close, answered by the action (trainer/serve.h); prints "listening on HOST:PORT" first.
      A session unused for --session-idle-s seconds is closed (0: never). At most --max-sessions
      sessions and as many connections at once (one more is told so and closed); requests
      buffered across them at most --max-buffered-bytes (when it is full, the connection with the
      longest unfinished line is told so and closed). A reset's instruction goes in
      --reset-piece-rows tokens a turn, other clients answered between pieces; the sessions'
      contexts hold at most --max-cache-bytes together (a reset or step past it is refused).
      Continuous actions decode with the checkpoint's action_bins.json; discrete ones need
      --action-ids (the nav environment's: 8:12).
  treetrain nav-env [--size 5] [--landmarks 3] [--walls 2] [--max-steps 24] [--image-size 16]
      The navigation environment over stdin/stdout JSON lines (scripts/nav_client.py drives it).
  treetrain generate --kind published-example --out FILE   (no other flags: a fixed shape)
      Write the one-tree navigation comb with the totals of the published partitioning example
      (tree format, vocab 32000; docs/PARTITIONING.md).
  treetrain sample --checkpoint DIR --prompts FILE [--max-new-tokens 128] [--temperature 1]
                   [--top-p 1] [--num-samples 1] [--seed 0] [--stop ID,...] [--device auto|cpu|cuda]
                   [--set KEY=VALUE ...] [--out FILE]
      Generate from a checkpoint or Hugging Face directory (or a run_dir's newest checkpoint) with
      the KV cache: prompts are JSONL lines {"id": ..., "tokens": [...]}; temperature 0 is greedy;
      a sample stops at --max-new-tokens, a --stop id or the model's eos_token_id. Writes one JSON
      line per prompt to FILE (or stdout): with one sample its tokens and logprobs, with K > 1 a
      rollouts line (prompt masked, weight 1.0 for your reward) that `treetrain train` reads.
      --set keys: model.max_position_embeddings, model.eos_token_id, sample.max_batch_tokens,
      segments.length, .tail, .long_range.{layers,heads,retrieve} (trainer/sample.h); a run
      trained with segments samples with them (the same segment operator; cpu or cuda).
  treetrain launch --nproc N [--master-port P] [--master-addr A] [--program PATH] -- <treetrain args>
      Start N local ranks of `treetrain <args>` (data parallelism, distributed/README.md) with RANK,
      WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set (a free port unless --master-port);
      their output is prefixed "[rank r] ". When one fails, the others are stopped and launch
      exits 1 naming it. --program runs PATH instead of treetrain.
  treetrain sweep --config SWEEP.yaml [--mode local|slurm] [--out FILE] [--nproc N] [--binary PATH]
      Expand a sweep (distributed/sweep.h: base config, grid: and list: of key paths) into runs,
      each with its own run_dir and resolved config.yaml. --mode local (default) trains them one
      after another (--nproc N ranks each) and prints a table of their final step, loss and
      tokens/s; --mode slurm writes a SLURM array script to FILE (running --binary, default this
      treetrain).
  treetrain bench attention --data FILE --format rollouts|tree [--vocab-size V] [--heads 16]
                  [--kv-heads 16] [--head-dim 128] [--iters 10] [--warmup 3] [--dump PREFIX]
      Time the CUDA tree attention (forward + backward) on the trees of FILE, tree-packed into one
      batch, and print one JSON object: medians in ms, visible pairs, TFLOP/s of visible pairs
      (14 x head_dim x heads FLOPs per pair). --dump writes PREFIXsubtree_end.npy and PREFIXpos.npy
      for scripts/device/attention_compare.py (FlexAttention and SDPA on the same layout).
  treetrain --help

Relative paths on the command line are relative to the working directory (under `bazel run`,
the directory it was started from). Exit codes: 0 done, 1 an error, 2 a usage error, 3 training
stopped on a non-finite loss, gradient, weight or optimizer state (train.on_nonfinite).
)";

struct UsageError {
  std::string msg;
};

// Prints "error: <msg>" as exactly one line: control characters in the message (a path or a data
// id holding a newline, a trailing newline of a library's text) are written escaped, and the line
// goes out in one write after what stdout holds, so a log or a launcher's rank prefix never splits
// it.
void print_error(const std::string& msg, const std::string& after = "") {
  std::string line = "error: ";
  size_t end = msg.size();
  while (end > 0 && (msg[end - 1] == '\n' || msg[end - 1] == '\r' || msg[end - 1] == ' ')) --end;
  for (size_t i = 0; i < end; ++i) {
    const unsigned char c = (unsigned char)msg[i];
    if (c == '\n') {
      line += "\\n";
    } else if (c == '\r') {
      line += "\\r";
    } else if (c < 0x20 && c != '\t') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      line += buf;
    } else {
      line += (char)c;
    }
  }
  line += "\n" + after;
  std::cout.flush();
  std::fflush(stdout);
  std::cerr << line << std::flush;
}

// --name value / --name=value flags after the subcommand; --set may repeat.
struct Args {
  std::map<std::string, std::string> flags;
  std::vector<std::string> sets;
};

Args parse_flags(const std::vector<std::string>& argv, const std::vector<std::string>& known, const std::string& cmd) {
  Args a;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg.rfind("--", 0) != 0) throw UsageError{"unexpected argument '" + arg + "' for '" + cmd + "'"};
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (std::find(known.begin(), known.end(), name) == known.end())
      throw UsageError{"unknown flag --" + name + " for '" + cmd + "'"};
    if (eq == std::string::npos) {
      if (i + 1 >= argv.size()) throw UsageError{"--" + name + " needs a value"};
      // A value that is itself a flag is a forgotten value (a file really named so: --name=--x).
      if (argv[i + 1].rfind("--", 0) == 0 && argv[i + 1].size() > 2)
        throw UsageError{"--" + name + " needs a value, got the flag " + argv[i + 1] +
                         " (a value starting with -- goes as --" + name + "=VALUE)"};
      value = argv[++i];
    }
    if (name == "set") {
      a.sets.push_back(value);
    } else {
      if (a.flags.count(name)) throw UsageError{"--" + name + " given twice"};
      a.flags[name] = value;
    }
  }
  return a;
}

const std::string& required(const Args& a, const std::string& name) {
  auto it = a.flags.find(name);
  if (it == a.flags.end()) throw UsageError{"missing --" + name};
  if (it->second.empty()) throw UsageError{"--" + name + ": expected a value, got an empty string"};
  return it->second;
}

// An optional flag's value (not empty, as required's), or `fallback` when it is not given.
std::string optional(const Args& a, const std::string& name, const std::string& fallback) {
  return a.flags.count(name) ? required(a, name) : fallback;
}

// s as a whole base-10 integer (an optional '-', then digits only: no spaces, no '+'); false when
// it is not one or does not fit int64.
bool parse_int64(const std::string& s, int64_t* v) {
  const char* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data(), end, *v);
  return !s.empty() && ec == std::errc() && ptr == end;
}

// What is wrong with an integer flag's value that parse_int64 refused: digits too many for int64,
// or not an integer at all.
std::string int_problem(const std::string& s) {
  const size_t digits = s.find_first_not_of("0123456789", s.rfind('-', 0) == 0 ? 1 : 0);
  if (digits == std::string::npos && s.size() > (s[0] == '-' ? 1u : 0u))
    return "'" + s + "' is out of range (a 64-bit integer: " +
           (s[0] == '-' ? "at least -9223372036854775808)" : "at most 9223372036854775807)");
  return "expected an integer, got '" + s + "'";
}

int64_t int_flag(const Args& a, const std::string& name, int64_t def) {
  auto it = a.flags.find(name);
  if (it == a.flags.end()) return def;
  int64_t v = 0;
  if (!parse_int64(it->second, &v)) throw UsageError{"--" + name + ": " + int_problem(it->second)};
  return v;
}

// An integer flag that must lie in [lo, hi] when given (absent: def). `note` follows the range in
// the error, e.g. " (0: the full history)".
int64_t int_flag(const Args& a, const std::string& name, int64_t def, int64_t lo, int64_t hi,
                 const std::string& note = "") {
  auto it = a.flags.find(name);
  if (it == a.flags.end()) return def;
  int64_t v = 0;
  if (!parse_int64(it->second, &v) || v < lo || v > hi)
    throw UsageError{tt::str("--", name, ": expected an integer in [", lo, ", ", hi, "]", note, ", got '", it->second,
                             "'")};
  return v;
}

// The folder of an --out file, created if missing; an error names --out and why it cannot be.
void make_out_parent(const std::string& out) {
  const std::filesystem::path parent = std::filesystem::path(out).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec || !std::filesystem::is_directory(parent))
    throw tt::Error(tt::str("--out ", out, ": cannot create its folder ", parent.string(), ": ",
                            ec ? ec.message() : std::string("it exists and is not a folder")));
}

// The same for an int field: the range is an int's, so nothing is narrowed.
int int32_flag(const Args& a, const std::string& name, int def, int lo, int hi, const std::string& note = "") {
  return (int)int_flag(a, name, def, lo, hi, note);
}

constexpr int kIntMax = INT_MAX;
constexpr int64_t kMaxVocab = int64_t{1} << 31;  // token ids are int32

int run_train(const std::vector<std::string>& argv) {
  const Args a = parse_flags(argv, {"config", "set"}, "train");
  const tt::trainer::RunConfig cfg = tt::trainer::load_config(required(a, "config"), a.sets);
  // Data parallelism: rank 0 speaks for the job; the other ranks log warnings and errors only.
  const tt::distributed::DistEnv env = tt::distributed::read_env(cfg.distributed.mode);
  if (env.rank > 0) spdlog::set_level(spdlog::level::warn);
  spdlog::info("config {}: run_dir {}", cfg.source, cfg.run_dir);
  if (env.rank <= 0)
    for (const std::string& w : cfg.warnings()) spdlog::warn("{}", w);
  try {
    tt::trainer::Trainer trainer(cfg);
    trainer.run();
  } catch (const tt::Error& e) {
    // Every error of a distributed run names its host and rank (once).
    const std::string tag = env.describe();
    if (!env.distributed() || std::string(e.what()).find(tag) != std::string::npos) throw;
    if (dynamic_cast<const tt::trainer::NonFiniteError*>(&e)) throw tt::trainer::NonFiniteError(tag + ": " + e.what());
    throw tt::Error(tag + ": " + e.what());
  }
  return 0;
}

// stats --format episodes: each episode as its tree (data/episode_tree.h), with the frame counts.
int run_episode_stats(const Args& a, const std::string& path) {
  if (!a.flags.count("vocab-size"))
    throw UsageError{"--vocab-size: expected the model's vocabulary (>= 2) for --format episodes"};
  const int64_t vocab = int_flag(a, "vocab-size", 0, 2, kMaxVocab, " (the model's vocabulary)");
  tt::data::EpisodeTreeSpec spec;
  spec.check_placeholder_ids = false;  // stats does not know the model's placeholder ids
  spec.tokens_per_frame = int32_flag(a, "tokens-per-frame", 196, 1, 1 << 16, " (rows an image takes)");
  const int64_t capacity = int_flag(a, "capacity", 0);
  if (a.flags.count("capacity") && capacity < spec.tokens_per_frame)
    throw UsageError{tt::str("--capacity: expected at least --tokens-per-frame (", spec.tokens_per_frame,
                             ") tokens: a piece holds whole frames; got '", a.flags.at("capacity"), "'")};
  spec.window = int32_flag(a, "window", 0, 0, kIntMax, " (0: the full history)");
  // data.action_bins's default, so the counts are those of a training run's.
  const int bins = int32_flag(a, "action-bins", (int)tt::trainer::DataConfig{}.action_bins, 2, 1 << 20);
  const std::vector<tt::data::Tree> trees = tt::data::read_episode_trees(path, vocab, spec, bins, nullptr);
  int64_t frames = 0, occurrences = 0;
  for (const tt::data::Tree& t : trees) {
    frames += (int64_t)t.media.frames.size();
    occurrences += t.frame_occurrences();
  }
  nlohmann::json j = tt::data::tree_stats(trees);
  j["episodes"] = trees.size();
  j["unique_frames"] = frames;
  j["frame_occurrences"] = occurrences;          // in the tree's observation nodes
  j["frame_reuse"] = frames > 0 ? (double)occurrences / (double)frames : 0.0;
  j["tokens_per_frame"] = spec.tokens_per_frame;
  j["history_window"] = spec.window;
  if (capacity > 0) j["partition"] = tt::data::partition_stats(trees, capacity);
  std::cout << j.dump() << std::endl;
  return 0;
}

int run_stats(const std::vector<std::string>& argv) {
  const Args a =
      parse_flags(argv, {"data", "format", "vocab-size", "capacity", "tokens-per-frame", "window", "action-bins"}, "stats");
  const std::string& path = required(a, "data");
  const std::string& fmt = required(a, "format");
  if (fmt != "rollouts" && fmt != "tree" && fmt != "tokens" && fmt != "episodes")
    throw UsageError{tt::str("--format: expected rollouts, tree, tokens or episodes, got '", fmt, "'")};
  if (fmt == "episodes") return run_episode_stats(a, path);
  if (a.flags.count("tokens-per-frame") || a.flags.count("window"))
    throw UsageError{"--tokens-per-frame and --window are for --format episodes"};
  if (a.flags.count("action-bins")) throw UsageError{"--action-bins is for --format episodes"};
  const tt::data::Format format = tt::data::parse_format(required(a, "format"), "--format");
  const int64_t capacity = int_flag(a, "capacity", 0);
  if (a.flags.count("capacity") && capacity < 1) throw UsageError{"--capacity: expected a positive number of tokens"};
  // Absent: no vocabulary check; given, it bounds every token id.
  const int64_t vocab = int_flag(a, "vocab-size", 0, 1, kMaxVocab, " (absent: token ids unchecked)");
  const auto trees = tt::data::read_trees(path, format, vocab);
  nlohmann::json j = tt::data::tree_stats(trees);
  if (capacity > 0) j["partition"] = tt::data::partition_stats(trees, capacity);
  std::cout << j.dump() << std::endl;
  return 0;
}

int run_bench(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] != "attention") throw UsageError{"bench: expected 'bench attention'"};
  const std::vector<std::string> rest(argv.begin() + 1, argv.end());
  const Args a = parse_flags(rest, {"data", "format", "vocab-size", "heads", "kv-heads", "head-dim", "iters", "warmup",
                                    "dump"},
                             "bench attention");
  const std::string& path = required(a, "data");
  tt::trainer::AttentionBenchOptions opt;
  opt.heads = int32_flag(a, "heads", opt.heads, 1, 1 << 16);
  opt.kv_heads = int32_flag(a, "kv-heads", opt.kv_heads, 1, 1 << 16);
  opt.head_dim = int32_flag(a, "head-dim", opt.head_dim, 1, 1 << 16);
  opt.iters = int32_flag(a, "iters", opt.iters, 1, 1 << 20);
  opt.warmup = int32_flag(a, "warmup", opt.warmup, 0, 1 << 20);
  const int64_t vocab = int_flag(a, "vocab-size", 0, 1, kMaxVocab, " (absent: token ids unchecked)");
  const auto trees = tt::data::read_trees(path, tt::data::parse_format(required(a, "format"), "--format"), vocab);
  std::vector<const tt::data::Tree*> ptrs;
  for (const auto& t : trees) ptrs.push_back(&t);
  const tt::data::PackedBatch batch = tt::data::pack(ptrs, tt::data::Packing::kTree);
  const auto dump = a.flags.find("dump");
  if (dump != a.flags.end()) tt::trainer::dump_layout_npy(batch, dump->second);
  std::cout << tt::trainer::to_json(tt::trainer::bench_attention(batch, path, opt)) << std::endl;
  return 0;
}

double float_flag(const Args& a, const std::string& name, double def);

// The nav environment's flags (generate --kind nav-episodes, eval --env nav).
tt::data::NavSpec nav_spec_flags(const Args& a) {
  tt::data::NavSpec s;
  auto get = [&](const char* name, int& field, int lo, int hi) { field = int32_flag(a, name, field, lo, hi); };
  get("size", s.size, 3, 64);
  get("landmarks", s.landmarks, 3, 4);
  get("walls", s.walls, 0, s.size * s.size / 4);
  get("max-steps", s.max_steps, 1, 100000);
  if (a.flags.count("image-size")) get("image-size", s.image_size, 4, 1024);
  return s;
}

int run_eval(const std::vector<std::string>& argv) {
  const Args a = parse_flags(argv, {"env", "checkpoint", "episodes", "seed", "size", "landmarks", "walls", "max-steps",
                                    "window", "device"},
                             "eval");
  spdlog::set_default_logger(spdlog::stderr_color_mt("treetrain-eval"));  // stdout: the JSON result
  if (required(a, "env") != "nav") throw UsageError{"--env: expected nav (the built-in navigation environment)"};
  tt::trainer::NavEvalOptions o;
  o.checkpoint = required(a, "checkpoint");
  o.episodes = int_flag(a, "episodes", o.episodes, 1, 1 << 24);
  o.seed = (uint64_t)int_flag(a, "seed", (int64_t)o.seed, 0, INT64_MAX);
  o.spec = nav_spec_flags(a);
  o.window = int32_flag(a, "window", -1, -1, kIntMax, " (0: the full history; -1 or absent: the checkpoint's)");
  const auto dev = a.flags.find("device");
  if (dev != a.flags.end() && dev->second != "auto" && dev->second != "cpu")
    throw UsageError{"--device: the closed-loop policy runs on the cpu backend only so far (expected auto or cpu)"};
  std::cout << tt::trainer::to_json(tt::trainer::run_nav_eval(o)) << std::endl;
  return 0;
}

int run_serve(const std::vector<std::string>& argv) {
  const Args a = parse_flags(argv, {"checkpoint", "host", "port", "window", "action-ids", "action-tokens",
                                    "max-message-bytes", "max-buffered-bytes", "max-sessions", "session-idle-s",
                                    "max-requests", "device", "reset-piece-rows", "max-cache-bytes"},
                             "serve");
  spdlog::set_default_logger(spdlog::stderr_color_mt("treetrain-serve"));  // stdout: the "listening on" line
  tt::trainer::ServeOptions o;
  o.checkpoint = required(a, "checkpoint");
  o.host = optional(a, "host", o.host);
  o.port = int32_flag(a, "port", 0, 0, 65535, " (0: any free port)");
  o.window = int32_flag(a, "window", -1, -1, kIntMax, " (0: the full history; -1 or absent: the checkpoint's)");
  if (a.flags.count("action-ids")) {
    // Each field whole digits in range: 0 <= FIRST < END <= 2^31 - 1.
    const std::string& v = a.flags.at("action-ids");
    const size_t colon = v.find(':');
    int64_t first = -1, end = -1;
    const bool ok = colon != std::string::npos && v.find(':', colon + 1) == std::string::npos &&
                    std::all_of(v.begin(), v.end(), [](char c) { return c == ':' || (c >= '0' && c <= '9'); }) &&
                    parse_int64(v.substr(0, colon), &first) && parse_int64(v.substr(colon + 1), &end) &&
                    first < end && end <= INT32_MAX;
    if (!ok)
      throw UsageError{"--action-ids: expected FIRST:END (ids FIRST .. END - 1, 0 <= FIRST < END <= 2147483647), e.g. "
                       "8:12, got '" + v + "'"};
    o.action_first = (int32_t)first;
    o.action_end = (int32_t)end;
  }
  // Absent: 0, the checkpoint's count (1 discrete, the bins' dimensions continuous); serve checks
  // a given count against the context and the bins.
  o.action_tokens = int32_flag(a, "action-tokens", 0, 1, kIntMax);
  o.max_message_bytes = int_flag(a, "max-message-bytes", o.max_message_bytes, 1024, INT64_MAX);
  o.max_buffered_bytes = int_flag(a, "max-buffered-bytes", -1, 1024, INT64_MAX, " (absent: 16 x --max-message-bytes)");
  o.max_sessions = int32_flag(a, "max-sessions", o.max_sessions, 1, kIntMax);
  o.session_idle_s = float_flag(a, "session-idle-s", o.session_idle_s);
  if (o.session_idle_s < 0 || o.session_idle_s > 1e9)
    throw UsageError{"--session-idle-s: expected seconds in [0, 1e9] (0: sessions never close for going unused), got '" +
                     a.flags.at("session-idle-s") + "'"};
  o.max_requests = int_flag(a, "max-requests", -1, -1, INT64_MAX, " (-1 or absent: until killed)");
  o.reset_piece_rows = int_flag(a, "reset-piece-rows", o.reset_piece_rows, 1, INT32_MAX);
  o.max_cache_bytes = int_flag(a, "max-cache-bytes", -1, 0, INT64_MAX, " (absent: 3/4 of the memory available)");
  const auto dev = a.flags.find("device");
  if (dev != a.flags.end() && dev->second != "auto" && dev->second != "cpu")
    throw UsageError{"--device: the closed-loop policy runs on the cpu backend only so far (expected auto or cpu)"};
  tt::trainer::run_serve(o);
  return 0;
}

// Field `name` of a nav-env request: an integer (not 1.7, not 1e30) in [lo, hi].
uint64_t nav_int_field(const nlohmann::json& j, const char* name, uint64_t lo, uint64_t hi) {
  if (!j.contains(name)) throw tt::Error(tt::str("\"", name, "\": missing"));
  const nlohmann::json& v = j.at(name);
  // Non-negative JSON integers parse as unsigned; -1, 1.7 and 1e30 do not.
  if (!v.is_number_unsigned() || v.get<uint64_t>() < lo || v.get<uint64_t>() > hi)
    throw tt::Error(tt::str("\"", name, "\": ", v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                            ", expected an integer in [", lo, ", ", hi, "]"));
  return v.get<uint64_t>();
}

// The navigation environment over stdin / stdout, JSON lines (the reference client drives it):
//   {"reset": {"seed": S, "episode": e}} -> {"instruction": [...], "image": base64 PNG, "done": false}
//   {"step": a}                          -> {"image": ..., "done": bool, "success": bool, "spl": x, "steps": n}
int run_nav_env(const std::vector<std::string>& argv) {
  const Args a = parse_flags(argv, {"image-size", "size", "landmarks", "walls", "max-steps"}, "nav-env");
  const tt::data::NavSpec spec = nav_spec_flags(a);
  std::unique_ptr<tt::data::NavEnv> env;
  std::string line;
  for (int64_t n = 1; tt::read_line(std::cin, line, "<stdin>", n, "one JSON request", size_t{1} << 20); ++n) {
    nlohmann::json out;
    try {
      const nlohmann::json j = tt::parse_json_strict(line);
      // One request a line, its keys exactly: a second one would be dropped without a word.
      if (!j.is_object() || j.size() != 1 || !(j.contains("reset") || j.contains("step")))
        throw tt::Error("expected {\"reset\": {...}} or {\"step\": action}, one of them alone");
      if (j.contains("reset")) {
        const nlohmann::json& r = j.at("reset");
        if (!r.is_object()) throw tt::Error("reset: expected {\"seed\": S, \"episode\": e}");
        for (const auto& [key, value] : r.items())
          if (key != "seed" && key != "episode")
            throw tt::Error("reset: unknown key \"" + key + "\" (expected seed and episode)");
        const uint64_t seed = nav_int_field(r, "seed", 0, UINT64_MAX);
        const int64_t episode = (int64_t)nav_int_field(r, "episode", 0, INT64_MAX);
        env = std::make_unique<tt::data::NavEnv>(spec, tt::data::nav_layout_seed(seed, episode));
        out["instruction"] = env->instruction();
      } else {
        if (!env) throw tt::Error("step before reset");
        env->step((int)nav_int_field(j, "step", 0, tt::data::kNavActions - 1));
      }
      out["done"] = env->done();
      out["image"] = tt::base64_encode(tt::data::encode_png(env->render()));
      out["success"] = env->success();
      out["spl"] = env->spl();
      out["steps"] = env->steps_taken();
    } catch (const std::exception& e) {
      out = {{"error", e.what()}};
    }
    // An error text may quote invalid UTF-8 of the line: replaced, so the reply is still a line.
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  }
  return 0;
}

int run_generate(const std::vector<std::string>& argv) {
  // The flags each kind takes besides --kind and --out; any other is an error naming it.
  const std::map<std::string, std::vector<std::string>> takes = {
      {"rollouts", {"num-trees", "vocab-size", "seed", "prompt-len", "turns", "turn-len", "branches", "branch-turns"}},
      {"comb", {"num-trees", "vocab-size", "seed", "prefix-len", "steps", "history-len", "leaf-len"}},
      {"published-example", {}},
      {"toy-episodes", {"num-episodes", "steps", "image-size", "seed"}},
      {"nav-episodes", {"num-episodes", "seed", "noise", "image-size", "size", "landmarks", "walls", "max-steps"}}};
  std::vector<std::string> known = {"kind", "out"};
  for (const auto& [k, names] : takes)
    for (const std::string& name : names)
      if (std::find(known.begin(), known.end(), name) == known.end()) known.push_back(name);
  const Args a = parse_flags(argv, known, "generate");
  const std::string& kind = required(a, "kind");
  if (kind == "episodes")  // the synthetic navigation combs were once --kind episodes
    throw UsageError{"--kind: 'episodes' names the robot-episode data format, not a synthetic kind; the synthetic "
                     "navigation combs are --kind comb (expected rollouts|comb|published-example|toy-episodes|nav-episodes)"};
  if (!takes.count(kind))
    throw UsageError{"--kind: expected rollouts|comb|published-example|toy-episodes|nav-episodes, got '" + kind + "'"};
  const std::vector<std::string>& mine = takes.at(kind);
  for (const auto& [name, value] : a.flags) {
    if (name == "kind" || name == "out" || std::find(mine.begin(), mine.end(), name) != mine.end()) continue;
    if (mine.empty()) throw UsageError{"--kind " + kind + " has a fixed shape; drop --" + name};
    std::string list;
    for (size_t i = 0; i < mine.size(); ++i)
      list += (i == 0 ? "" : i + 1 == mine.size() ? " and " : ", ") + ("--" + mine[i]);
    throw UsageError{"--kind " + kind + " takes " + list + "; drop --" + name};
  }
  const std::string& out = required(a, "out");
  const bool episodes = kind == "toy-episodes" || kind == "nav-episodes";  // frames named beside the file
  tt::flag_write_target("--out", out, episodes ? tt::Links::kRefuse : tt::Links::kFollow);  // before anything is made
  make_out_parent(out);
  if (kind == "published-example") {
    const tt::data::SyntheticSpec s = tt::data::published_example_spec();
    tt::data::write_jsonl(s, out);
    spdlog::info("wrote the published-example tree (comb: prefix {}, {} steps of {} + {} tokens, vocab {}) to {} "
                 "(--format tree)",
                 s.prefix_len, s.steps, s.history_len, s.leaf_len, s.vocab_size, out);
    return 0;
  }
  if (kind == "toy-episodes") {
    tt::data::ToyEpisodeSpec t;
    t.num_episodes = int32_flag(a, "num-episodes", t.num_episodes, 1, 4096);
    t.steps = int32_flag(a, "steps", t.steps, 1, 4096);
    t.image_size = int32_flag(a, "image-size", t.image_size, t.square + 1, 4096);
    t.seed = (uint64_t)int_flag(a, "seed", (int64_t)t.seed, 0, INT64_MAX);
    const int64_t frames = tt::data::write_toy_episodes(t, out);
    spdlog::info("wrote {} toy episodes of {} steps ({} PNG frames of {} x {} in {}) to {} (data.format: episodes)",
                 t.num_episodes, t.steps, frames, t.image_size, t.image_size,
                 (std::filesystem::path(out).parent_path() / tt::data::generated_frames_folder(out)).string(), out);
    return 0;
  }
  if (kind == "nav-episodes") {
    const tt::data::NavSpec spec = nav_spec_flags(a);
    const int64_t n = int_flag(a, "num-episodes", 200, 1, 1 << 24);
    const int64_t seed = int_flag(a, "seed", 1, 0, INT64_MAX);
    const double noise = float_flag(a, "noise", 0.2);
    if (noise < 0 || noise >= 1) throw UsageError{"--noise: expected a probability in [0, 1)"};
    const int64_t frames = tt::data::write_nav_episodes(spec, n, (uint64_t)seed, noise, out);
    spdlog::info("wrote {} expert nav episodes ({} frames of {} x {}, room {}x{}, {} landmarks, noise {}) to {} "
                 "(data.format: episodes)",
                 n, frames, spec.image_size, spec.image_size, spec.size, spec.size, spec.landmarks, noise, out);
    return 0;
  }
  tt::data::SyntheticSpec s;
  s.kind = kind;
  // Each field up to 2^30, at least what data/synthetic.h's check_spec asks (the totals it bounds).
  auto get = [&](const char* name, int& field, int lo = 1) { field = int32_flag(a, name, field, lo, 1 << 30); };
  get("num-trees", s.num_trees);
  get("vocab-size", s.vocab_size, 2);
  s.seed = (uint64_t)int_flag(a, "seed", (int64_t)s.seed, 0, INT64_MAX);
  get("prompt-len", s.prompt_len);
  get("turns", s.turns);
  get("turn-len", s.turn_len);
  get("branches", s.branches);
  get("branch-turns", s.branch_turns, 0);
  get("prefix-len", s.prefix_len);
  get("steps", s.steps);
  get("history-len", s.history_len);
  get("leaf-len", s.leaf_len);
  tt::data::write_jsonl(s, out);
  spdlog::info("wrote {} {} trees (vocab {}, seed {}) to {} (--format {})", s.num_trees, s.kind, s.vocab_size, s.seed,
               out, s.kind == "rollouts" ? "rollouts" : "tree");
  return 0;
}

double float_flag(const Args& a, const std::string& name, double def) {
  auto it = a.flags.find(name);
  if (it == a.flags.end()) return def;
  const std::string& s = it->second;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    throw UsageError{"--" + name + ": expected a number, got '" + s + "'"};
  return v;
}

int run_sample(const std::vector<std::string>& argv) {
  const Args a = parse_flags(argv,
                             {"checkpoint", "prompts", "max-new-tokens", "temperature", "top-p", "num-samples", "seed",
                              "stop", "device", "set", "out"},
                             "sample");
  // The completions may go to stdout: the log goes to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("treetrain-sample"));
  tt::trainer::SampleCommand c;
  c.checkpoint = required(a, "checkpoint");
  c.prompts = required(a, "prompts");
  c.out = optional(a, "out", c.out);
  c.device = optional(a, "device", c.device);
  c.sets = a.sets;
  tt::model::SamplingOptions& o = c.sampling;
  o.max_new_tokens = int32_flag(a, "max-new-tokens", o.max_new_tokens, 1, 1 << 24);
  o.num_samples = int32_flag(a, "num-samples", o.num_samples, 1, 1 << 16);
  o.temperature = float_flag(a, "temperature", o.temperature);
  o.top_p = float_flag(a, "top-p", o.top_p);
  o.seed = (uint64_t)int_flag(a, "seed", 0, 0, INT64_MAX);
  if (a.flags.count("stop")) {  // ids below the model's vocab_size: run_sample checks them
    std::stringstream ss(a.flags.at("stop"));
    for (std::string id; std::getline(ss, id, ',');) {
      int64_t v = -1;
      if (!parse_int64(id, &v) || v < 0 || v > INT32_MAX)
        throw UsageError{"--stop: expected token ids separated by commas, got '" + a.flags.at("stop") + "'"};
      o.stop.push_back((int32_t)v);
    }
  }
  tt::trainer::run_sample(c);
  return 0;
}

int run_launch(const std::vector<std::string>& argv) {
  const auto dash = std::find(argv.begin(), argv.end(), "--");
  if (dash == argv.end()) throw UsageError{"launch: expected -- before the arguments of the ranks"};
  const Args a = parse_flags(std::vector<std::string>(argv.begin(), dash),
                             {"nproc", "master-port", "master-addr", "program"}, "launch");
  tt::distributed::LaunchOptions o;
  int64_t nproc = 0;
  if (!a.flags.count("nproc") || !parse_int64(a.flags.at("nproc"), &nproc) || nproc < 1 || nproc > 1024)
    throw UsageError{"launch: --nproc N (1..1024) is required"};
  o.nproc = (int)nproc;
  o.master_port = int32_flag(a, "master-port", 0, 0, 65535, " (0: a free port)");
  o.master_addr = optional(a, "master-addr", o.master_addr);
  o.program = optional(a, "program", o.program);
  o.args.assign(dash + 1, argv.end());
  if (o.args.empty()) throw UsageError{"launch: nothing to run after --"};
  tt::distributed::launch(o);
  return 0;
}

int run_sweep(const std::vector<std::string>& argv) {
  const Args a = parse_flags(argv, {"config", "mode", "out", "nproc", "binary"}, "sweep");
  const std::string mode = a.flags.count("mode") ? a.flags.at("mode") : "local";
  if (mode != "local" && mode != "slurm") throw UsageError{"--mode: expected local|slurm, got '" + mode + "'"};
  const int nproc = int32_flag(a, "nproc", 1, 1, 1024, " (ranks per run)");
  const tt::trainer::Sweep sweep = tt::trainer::load_sweep(required(a, "config"));
  const std::string binary = optional(a, "binary", tt::distributed::self_executable());
  if (mode == "slurm") {
    if (a.flags.count("nproc"))
      throw UsageError{"--nproc is for --mode local; a SLURM job runs slurm.gpus_per_node ranks a node (the sweep file)"};
    const std::string& out = required(a, "out");
    const std::string script = tt::trainer::slurm_script(sweep, binary);  // its errors before anything is written
    // The script replaces --out: never one of the sweep's own inputs (a run's config.yaml may not
    // exist yet: same_file compares canonical names too).
    std::vector<std::pair<std::string, std::string>> inputs = {{"the sweep file", required(a, "config")},
                                                               {"the base config", sweep.base}};
    for (const tt::trainer::SweepRun& run : sweep.runs) {
      inputs.emplace_back("the data of run " + run.name, run.config.data.path);
      inputs.emplace_back("a run's config", run.config.run_dir + "/config.yaml");
    }
    for (const auto& [what, path] : inputs) {
      if (tt::same_file(out, path))
        throw tt::Error(tt::str("--out ", out, ": ", what, " (", path, "); the SLURM script would replace it (write it to "
                            "another file)"));
    }
    tt::flag_write_target("--out", out, tt::Links::kFollow);  // before the run configs are written
    tt::trainer::write_run_configs(sweep);
    make_out_parent(out);
    tt::write_text_atomic(out, script, tt::Links::kFollow);
    std::filesystem::permissions(out, std::filesystem::perms::owner_exec, std::filesystem::perm_options::add);
    for (const tt::trainer::SweepRun& run : sweep.runs) std::cout << run.config.run_dir << "/config.yaml\n";
    spdlog::info("sweep: {} runs; their configs are written; submit the array job with: sbatch {}", sweep.runs.size(), out);
    return 0;
  }
  if (a.flags.count("out")) throw UsageError{"--out is for --mode slurm"};
  const std::vector<tt::trainer::RunResult> results = tt::trainer::run_local(sweep, binary, nproc);
  std::cout << tt::trainer::results_table(sweep, results) << std::flush;
  int failed = 0;
  for (const tt::trainer::RunResult& r : results) failed += r.status != "ok";
  if (failed > 0) throw tt::Error(tt::str("sweep: ", failed, " of ", results.size(), " runs failed (see the table)"));
  return 0;
}

// The command's exit status; errors are thrown.
int run_command(std::vector<std::string> args) {
  if (args.empty()) throw UsageError{"no command"};
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kUsage;
    return 0;
  }
  for (const std::string& a : args) {
    if (a == "--") break;  // the arguments of `launch`'s ranks
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    }
  }
  std::string cmd = "train";
  if (args[0].rfind("--", 0) != 0) {
    cmd = args[0];
    args.erase(args.begin());
  }
  if (cmd == "train") return run_train(args);
  if (cmd == "stats") return run_stats(args);
  if (cmd == "bench") return run_bench(args);
  if (cmd == "generate") return run_generate(args);
  if (cmd == "sample") return run_sample(args);
  if (cmd == "eval") return run_eval(args);
  if (cmd == "serve") return run_serve(args);
  if (cmd == "nav-env") return run_nav_env(args);
  if (cmd == "launch") return run_launch(args);
  if (cmd == "sweep") return run_sweep(args);
  throw UsageError{"unknown command '" + cmd + "'"};
}

}  // namespace

int main(int argc, char** argv) {
  // First of all: libgomp has read its environment already; re-execute once with passive waiting
  // and a share of the host's CPUs per local rank, unless the user set them (base/omp_env.h).
  tt::reexec_with_omp_defaults(argv);
  // Under `bazel run` the process starts in the runfiles tree; relative paths mean the user's folder.
  if (const char* wd = std::getenv("BUILD_WORKING_DIRECTORY")) {
    if (::chdir(wd) != 0) {
      std::fprintf(stderr, "error: cannot enter BUILD_WORKING_DIRECTORY %s: %s\n", wd, std::strerror(errno));
      return 1;
    }
  }
  int rc = 1;
  try {
    rc = run_command(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const UsageError& e) {
    print_error(e.msg, std::string("\n") + kUsage);
    rc = 2;
  } catch (const tt::trainer::NonFiniteError& e) {
    print_error(e.what());
    rc = 3;
  } catch (const tt::Error& e) {
    print_error(e.what());
    rc = 1;
  } catch (const std::exception& e) {
    print_error(e.what());
    rc = 1;
  }
  // What a command printed (stats' JSON, sample's completions) must have arrived: a full disk
  // under a redirection is an error, not exit 0 (after another error its exit status stands).
  std::cout.flush();
  if (rc == 0 && (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout))) {
    print_error("standard output: a write failed (a full disk?); what this command printed is incomplete");
    return 1;
  }
  return rc;
}
