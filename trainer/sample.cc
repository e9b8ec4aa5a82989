// `treetrain sample` (see sample.h).
#include "trainer/sample.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/check.h"
#include "base/files.h"
#include "base/json.h"
#include "model/decoder.h"
#include "model/hf_io.h"
#include "model/segments.h"
#include "trainer/backend.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

int64_t parse_int(const std::string& key, const std::string& v) {
  size_t used = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty()) throw Error(str("--set ", key, "=", v, ": expected an integer"));
  return x;
}

// An int-valued key: in [0, INT_MAX], never narrowed.
int parse_small_int(const std::string& key, const std::string& v) {
  const int64_t x = parse_int(key, v);
  if (x < 0 || x > INT32_MAX) throw Error(str("--set ", key, "=", v, ": ", x, " is out of range [0, 2147483647]"));
  return (int)x;
}

// A list value: "1,2", "[1, 2]" or "[]" (none), each entry through parse(key, entry); an empty
// entry ("1,,2") is an error.
template <class Parse>
auto parse_list(const std::string& key, const std::string& given, Parse parse) {
  std::string value = given;
  if (!value.empty() && value.front() == '[' && value.back() == ']') value = value.substr(1, value.size() - 2);
  std::vector<decltype(parse(key, value))> out;
  if (value.find_first_not_of(' ') == std::string::npos) return out;
  std::stringstream ss(value + ",");  // every entry ends in a comma: a trailing empty one shows
  for (std::string x; std::getline(ss, x, ',');) {
    x.erase(0, x.find_first_not_of(' '));
    x.erase(x.find_last_not_of(' ') + 1);
    if (x.empty()) throw Error(str("--set ", key, "=", given, ": an empty entry, expected integers separated by commas"));
    out.push_back(parse(key, x));
  }
  return out;
}

std::vector<int> parse_int_list(const std::string& key, const std::string& value) {
  return parse_list(key, value, parse_small_int);
}

// Applies --set KEY=VALUE to the model config and the sampling options.
void apply_sets(const std::vector<std::string>& sets, model::ModelConfig* cfg, model::SamplingOptions* opt,
                model::SegmentConfig* seg) {
  for (const std::string& s : sets) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos) throw Error(str("--set ", s, ": expected KEY=VALUE"));
    const std::string key = s.substr(0, eq), value = s.substr(eq + 1);
    if (key == "model.max_position_embeddings") {
      cfg->max_position_embeddings = parse_int(key, value);
    } else if (key == "model.eos_token_id") {
      // The ids config.json may hold: each in [0, vocab_size).
      cfg->eos_token_id.clear();
      for (const int64_t x : parse_list(key, value, parse_int)) {
        if (x < 0 || x >= cfg->vocab_size)
          throw Error(str("--set ", key, "=", value, ": eos_token_id ", x, " outside vocab_size ", cfg->vocab_size,
                          " (expected ids in [0, ", cfg->vocab_size, "))"));
        cfg->eos_token_id.push_back(x);
      }
    } else if (key == "sample.max_batch_tokens") {
      opt->max_batch_tokens = parse_int(key, value);
    } else if (key == "segments.length") {
      seg->length = parse_int(key, value);
    } else if (key == "segments.tail") {
      seg->tail = parse_int(key, value);
    } else if (key == "segments.long_range.layers") {
      seg->long_range.layers = parse_int_list(key, value);
    } else if (key == "segments.long_range.heads") {
      seg->long_range.heads = parse_int_list(key, value);
    } else if (key == "segments.long_range.retrieve") {
      seg->long_range.retrieve = parse_int(key, value);
    } else {
      throw Error(str("--set ", key, ": unknown key for 'sample' (expected model.max_position_embeddings, "
                      "model.eos_token_id, sample.max_batch_tokens or segments.{length, tail, long_range.layers, "
                      "long_range.heads, long_range.retrieve})"));
    }
  }
}

// Generation on backend E, through the segment operator when segments are on.
template <class E>
std::vector<model::Completion> run_on(const model::ModelConfig& cfg, const std::string& dir,
                                      const model::SegmentConfig& seg, const std::vector<model::Prompt>& prompts,
                                      const model::SamplingOptions& opt, model::GenerateStats* st) {
  const std::unique_ptr<model::Decoder<E>> m = load_inference_model<E>(cfg, dir);
  return seg.enabled() ? model::generate_segmented(*m, seg, prompts, opt, st) : model::generate(*m, prompts, opt, st);
}

// --out: a file path (not a folder) in a folder this process may write in, not a file of the
// checkpoint being read.
void check_writable(const std::string& out, const std::string& checkpoint) {
  std::error_code ec;
  const std::string target = flag_write_target("--out", out, Links::kFollow);  // a link's file; no folder or FIFO
  const fs::path parent = fs::path(target).parent_path();
  const fs::path in = fs::weakly_canonical(checkpoint, ec), at = fs::weakly_canonical(fs::absolute(target, ec), ec);
  bool inside = false;
  for (fs::path p = at.parent_path(); !ec && !in.empty() && p.has_relative_path(); p = p.parent_path())
    inside = inside || p == in;
  if (inside && fs::exists(at, ec))
    throw Error(str("--out ", out, ": a file of the checkpoint folder ", checkpoint,
                    " being read (the completions would replace it); write them to a new file"));
  if (!parent.empty() && !fs::is_directory(parent, ec)) throw Error(str("--out ", out, ": no folder ", parent.string()));
  const std::string folder = parent.empty() ? "." : parent.string();
  if (::access(folder.c_str(), W_OK) != 0)
    throw Error(str("--out ", out, ": cannot write in folder ", folder, ": ", std::strerror(errno)));
}

// The CPU generation's KV cache is allocated whole before the first token (model/generate.h: the
// largest group of prompts, each prompt's rows plus --num-samples x --max-new-tokens): more bytes
// than the machine has is an error naming the flags, before the model loads.
void check_host_memory(const model::ModelConfig& cfg, const std::vector<model::Prompt>& prompts,
                       const model::SamplingOptions& opt) {
  int64_t attention_layers = 0;
  for (const model::LayerSpec& l : cfg.layer_specs()) attention_layers += l.mixer == "full_attention";
  const double row_bytes = 2.0 * (double)attention_layers * (double)cfg.num_key_value_heads * (double)cfg.head_dim *
                           (double)sizeof(float);  // K and V
  auto rows_of = [&](size_t k) { return (double)prompts[k].tokens.size() + (double)opt.num_samples * opt.max_new_tokens; };
  double most = 0;  // the largest group's rows, grouped as generate() groups them
  for (size_t i = 0; i < prompts.size();) {
    double rows = 0;
    size_t j = i;
    while (j < prompts.size() && (j == i || rows + rows_of(j) <= (double)opt.max_batch_tokens)) rows += rows_of(j++);
    most = std::max(most, rows);
    i = j;
  }
  const double need = most * row_bytes;
  const double have = (double)::sysconf(_SC_PHYS_PAGES) * (double)::sysconf(_SC_PAGE_SIZE);
  if (have > 0 && need > have)
    throw Error(str("sample: the KV cache of ", (int64_t)most, " rows (a prompt's tokens + --num-samples ",
                    opt.num_samples, " x --max-new-tokens ", opt.max_new_tokens, ") needs ", need / (1 << 30),
                    " GiB, more than this machine's ", have / (1 << 30), " GiB; lower --num-samples or "
                    "--max-new-tokens"));
}

}  // namespace

model::ModelConfig read_checkpoint_config(const std::string& dir) {
  model::ModelConfig cfg = model::read_hf_config(dir);
  model::check_hf_weight_shapes(dir, cfg, model::param_table(cfg));
  return cfg;
}

template <class E>
std::unique_ptr<model::Decoder<E>> load_inference_model(const model::ModelConfig& cfg, const std::string& dir) {
  model::DecoderOptions o;
  o.inference = true;
  auto m = std::make_unique<model::Decoder<E>>(cfg, o);
  std::vector<float> host(m->num_params(), 0.0f);
  model::load_hf_weights(dir, cfg, m->params_info(), host.data());
  // A NaN or inf weight would turn into NaN logits and an arbitrary token (or action) per step.
  for (const model::ParamInfo& p : m->params_info())
    for (int64_t i = 0; i < p.numel; ++i)
      if (!std::isfinite(host[p.offset + i]))
        throw Error(str(dir, ": weight ", model::hf_tensor_name(cfg, p.name), " element ", i, " is ",
                        host[p.offset + i], ", expected finite weights"));
  m->set_params(host.data());
  return m;
}

template std::unique_ptr<model::Decoder<model::CpuExec<float>>> load_inference_model(const model::ModelConfig&,
                                                                                     const std::string&);
template std::unique_ptr<model::Decoder<model::CudaExec>> load_inference_model(const model::ModelConfig&,
                                                                               const std::string&);

int checkpoint_history_window(const std::string& dir) {
  const fs::path yaml = fs::path(dir) / "config.yaml";
  return fs::exists(yaml) ? (int)load_config(yaml.string(), {}).data.history_window : 0;
}

model::SegmentConfig checkpoint_segments(const std::string& dir) {
  const fs::path yaml = fs::path(dir) / "config.yaml";
  return fs::exists(yaml) ? load_config(yaml.string(), {}).segments : model::SegmentConfig{};
}

std::string resolve_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (fs::is_regular_file(fs::path(dir) / "config.json", ec)) return dir;
  if (fs::is_directory(fs::path(dir) / "checkpoints", ec)) {
    // The newest valid step folder; newer ones that are not valid (a truncated or half-written
    // save) are skipped, and said.
    std::string newest;
    std::vector<std::pair<std::string, std::string>> newer_invalid;  // (path, what is wrong)
    for (const auto& [step, path] : step_folders(dir)) {
      std::string why;
      try {
        why = checkpoint_problem(path);
      } catch (const Error& e) {  // a newer format version
        why = e.what();
      }
      if (why.empty()) {
        newest = path;
        newer_invalid.clear();
      } else {
        newer_invalid.emplace_back(path, why);
      }
    }
    if (!newest.empty()) {
      for (const auto& [path, why] : newer_invalid)
        spdlog::warn("--checkpoint {}: skipping {}, newer than {} but not a valid checkpoint: {}", dir, path, newest,
                     why);
      return newest;
    }
    const std::string invalid = invalid_checkpoints_summary(dir);
    if (invalid.empty())
      throw Error(str("--checkpoint ", dir, ": a run_dir without checkpoints (", checkpoints_dir(dir), " is empty)"));
    throw Error(str("--checkpoint ", dir, ": a run_dir with ", invalid));
  }
  throw Error(str("--checkpoint ", dir, ": expected a checkpoint or Hugging Face directory (with config.json) or a "
                  "run_dir (with checkpoints/)"));
}

std::vector<model::Prompt> read_prompts(const std::string& path, int64_t vocab_size) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error(str(path, ": is a folder, expected a JSONL file of prompts (--prompts)"));
  std::ifstream in(path);
  if (!in) throw Error(str(path, ": cannot open (--prompts)"));
  std::vector<model::Prompt> out;
  std::string line;
  for (int64_t n = 1; read_line(in, line, path, n, "one prompt (a JSON object)"); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = str(path, ":", n);
    json j;
    try {
      j = parse_json_strict(line);
    } catch (const std::exception& e) {  // invalid JSON, or a key named twice
      throw Error(str(where, ": invalid JSON: ", e.what()));
    }
    if (!j.is_object()) throw Error(str(where, ": expected an object {\"id\": ..., \"tokens\": [...]}"));
    model::Prompt p;
    p.id = where;
    if (j.contains("id")) {
      if (j["id"].is_string()) p.id = j["id"].get<std::string>();
      else if (j["id"].is_number_integer()) p.id = std::to_string(j["id"].get<int64_t>());
      else throw Error(str(where, ": id: ", j["id"].dump(), ", expected a string or an integer"));
    }
    if (!j.contains("tokens") || !j["tokens"].is_array() || j["tokens"].empty())
      throw Error(str(where, ": tokens: expected a non-empty list of token ids"));
    for (const json& t : j["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        throw Error(str(where, ": tokens: ", t.dump(), " is not a token id"));
      if (vocab_size > 0 && t.get<int64_t>() >= vocab_size)
        throw Error(str(where, ": tokens: ", t.dump(), " is outside the model's vocab_size ", vocab_size,
                        " (expected ids in [0, ", vocab_size, "))"));
      p.tokens.push_back((int32_t)t.get<int64_t>());
    }
    out.push_back(std::move(p));
  }
  if (out.empty()) throw Error(str(path, ": no prompts (--prompts)"));
  return out;
}

std::string completions_jsonl(const std::vector<model::Prompt>& prompts, const std::vector<model::Completion>& done,
                              int num_samples) {
  std::string out;
  for (size_t i = 0; i < done.size(); ++i) {
    const model::Completion& c = done[i];
    json j;
    j["id"] = c.id;
    if (num_samples == 1) {
      j["tokens"] = c.samples[0].tokens;
      j["logprobs"] = c.samples[0].logprobs;
      j["finish_reason"] = c.samples[0].finish;
    } else {
      json seqs = json::array();
      for (const model::Sample& s : c.samples) {
        std::vector<int32_t> tokens = prompts[i].tokens;
        tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
        std::vector<int> mask(prompts[i].tokens.size(), 0);
        mask.resize(tokens.size(), 1);
        seqs.push_back(json{{"tokens", tokens},
                            {"loss_mask", mask},
                            {"weight", 1.0},
                            {"logprobs", s.logprobs},
                            {"finish_reason", s.finish}});
      }
      j["sequences"] = seqs;
    }
    out += j.dump() + "\n";
  }
  return out;
}

int64_t run_sample(const SampleCommand& c) {
  model::SamplingOptions opt = c.sampling;
  const std::string dir = resolve_checkpoint(c.checkpoint);
  model::ModelConfig cfg = read_checkpoint_config(dir);
  model::SegmentConfig seg = checkpoint_segments(dir);
  apply_sets(c.sets, &cfg, &opt, &seg);
  try {
    cfg.validate();
    seg.validate(cfg);
    opt.validate();
  } catch (const Error& e) {  // a value a --set gave: the message names that flag
    const std::string msg = e.what();
    for (const std::string& set : c.sets) {
      const std::string key = set.substr(0, set.find('=')), leaf = key.substr(key.rfind('.') + 1);
      if (msg.rfind(key + ":", 0) == 0 || msg.rfind(leaf + ":", 0) == 0 || msg.rfind("model config: " + leaf + " ", 0) == 0)
        throw Error(str("--set ", set, ": ", msg));
    }
    throw;
  }
  for (int64_t id : cfg.eos_token_id) opt.eos.push_back((int32_t)id);
  for (int32_t id : opt.stop)
    if (id >= cfg.vocab_size)
      throw Error(str("--stop ", id, ": outside vocab_size ", cfg.vocab_size, " of ", dir, " (expected ids in [0, ",
                      cfg.vocab_size, "))"));
  const std::vector<model::Prompt> prompts = read_prompts(c.prompts, cfg.vocab_size);
  if (!c.out.empty() && same_file(c.out, c.prompts))
    throw Error(str("--out ", c.out, ": the --prompts file itself; the completions would replace the prompts (write "
                    "them to another file)"));
  if (!c.out.empty()) check_writable(c.out, dir);  // fail before the work if the output cannot be written
  int64_t num_params = 0;
  for (const model::ParamInfo& p : model::param_table(cfg)) num_params += p.numel;
  const int gpu = resolve_device(c.device, cfg);
  if (gpu < 0 && !seg.enabled()) check_host_memory(cfg, prompts, opt);
  if (seg.enabled())
    spdlog::info("sample: segments of {} tokens, tail {}, {} long-range layers retrieving {}", seg.length, seg.tail,
                 seg.long_range.layers.size(), seg.long_range.retrieve);
  spdlog::info("sample: {} prompts from {}, model {} ({} layers, vocab {}) on {}, {} samples each, up to {} new tokens",
               prompts.size(), c.prompts, dir, cfg.num_hidden_layers, cfg.vocab_size, gpu < 0 ? "cpu" : "cuda",
               opt.num_samples, opt.max_new_tokens);
  const auto t0 = std::chrono::steady_clock::now();
  model::GenerateStats st;
  std::vector<model::Completion> done;
  std::string text;
  try {
    done = gpu < 0 ? run_on<model::CpuExec<float>>(cfg, dir, seg, prompts, opt, &st)
                   : run_on<model::CudaExec>(cfg, dir, seg, prompts, opt, &st);
    text = completions_jsonl(prompts, done, opt.num_samples);
  } catch (const std::bad_alloc&) {
    throw Error(str("sample: out of memory for the model (", num_params, " parameters) and ", prompts.size(),
                    " prompts x --num-samples ", opt.num_samples, " x --max-new-tokens ", opt.max_new_tokens,
                    " (their KV cache and completions); lower --num-samples or --max-new-tokens, or split --prompts"));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (c.out.empty()) {
    std::cout << text << std::flush;
  } else {
    write_text_atomic(c.out, text, Links::kFollow);
  }
  spdlog::info("sample: {} prefill rows, {} decode rows in {} forwards, {:.2f} s{}", st.prefill_rows, st.decode_rows,
               st.forwards, s, c.out.empty() ? "" : ", written to " + c.out);
  return (int64_t)prompts.size();
}

}  // namespace tt::trainer
