// Strict YAML -> RunConfig. Every key lives in one field table (kFields below): parsing, --set
// overrides and to_yaml() all walk it, so a key added there is parsed, overridable and written.
#include "trainer/config.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <variant>

#include "base/check.h"
#include "base/files.h"
#include "base/json.h"
#include "trainer/yaml_doc.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;

using Ref = std::variant<int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<std::string>*,
                         std::vector<int>*>;

struct Field {
  std::string key;                        // "train.max_steps"
  std::function<Ref(RunConfig&)> ref;     // where the value lives
  std::vector<std::string> allowed = {};  // enum values (strings only)
  bool is_path = false;                   // resolved against the config file's folder
};

#define TT_FIELD(key, member, ...) \
  Field { key, [](RunConfig& c) -> Ref { return &c.member; }, __VA_ARGS__ }

const std::vector<Field>& fields() {
  static const std::vector<Field> kFields = {
      TT_FIELD("run_dir", run_dir),
      TT_FIELD("device", device, {"auto", "cpu", "cuda"}),
      TT_FIELD("model.architecture", model.architecture, {"qwen3", "llama", "qwen3_5_text", "qwen3_next"}),
      TT_FIELD("model.vocab_size", model.vocab_size),
      TT_FIELD("model.hidden_size", model.hidden_size),
      TT_FIELD("model.intermediate_size", model.intermediate_size),
      TT_FIELD("model.num_hidden_layers", model.num_hidden_layers),
      TT_FIELD("model.num_attention_heads", model.num_attention_heads),
      TT_FIELD("model.num_key_value_heads", model.num_key_value_heads),
      TT_FIELD("model.head_dim", model.head_dim),
      TT_FIELD("model.rms_norm_eps", model.rms_norm_eps),
      TT_FIELD("model.rope_theta", model.rope_theta),
      TT_FIELD("model.partial_rotary_factor", model.partial_rotary_factor),
      TT_FIELD("model.tie_word_embeddings", model.tie_word_embeddings),
      TT_FIELD("model.initializer_range", model.initializer_range),
      TT_FIELD("model.max_position_embeddings", model.max_position_embeddings),
      TT_FIELD("model.layer_types", model.layer_types),
      TT_FIELD("model.linear_num_key_heads", model.linear_num_key_heads),
      TT_FIELD("model.linear_num_value_heads", model.linear_num_value_heads),
      TT_FIELD("model.linear_key_head_dim", model.linear_key_head_dim),
      TT_FIELD("model.linear_value_head_dim", model.linear_value_head_dim),
      TT_FIELD("model.linear_conv_kernel_dim", model.linear_conv_kernel_dim),
      TT_FIELD("model.num_experts", num_experts),
      TT_FIELD("model.init_from", init_from, {}, true),
      TT_FIELD("data.path", data.path, {}, true),
      TT_FIELD("data.format", data.format, {"rollouts", "tree", "tokens", "episodes"}),
      TT_FIELD("data.packing", data.packing, {"tree", "per_path"}),
      TT_FIELD("data.max_tokens_per_batch", data.max_tokens_per_batch),
      TT_FIELD("data.shuffle", data.shuffle),
      TT_FIELD("data.action_bins", data.action_bins),
      TT_FIELD("vision.hidden_size", model.vision.hidden_size),
      TT_FIELD("vision.intermediate_size", model.vision.intermediate_size),
      TT_FIELD("vision.num_hidden_layers", model.vision.num_hidden_layers),
      TT_FIELD("vision.num_attention_heads", model.vision.num_attention_heads),
      TT_FIELD("vision.num_channels", model.vision.num_channels),
      TT_FIELD("vision.image_size", model.vision.image_size),
      TT_FIELD("vision.patch_size", model.vision.patch_size),
      TT_FIELD("vision.hidden_act", model.vision.hidden_act, {"gelu_pytorch_tanh", "gelu"}),
      TT_FIELD("vision.layer_norm_eps", model.vision.layer_norm_eps),
      TT_FIELD("vision.freeze", model.vision.freeze),
      TT_FIELD("vision.projector_hidden_act", model.vision.projector_hidden_act, {"gelu", "gelu_pytorch_tanh"}),
      TT_FIELD("vision.image_token_index", model.vision.image_token_index),
      TT_FIELD("vision.vision_feature_layer", model.vision.vision_feature_layer),
      TT_FIELD("vision.state_dim", model.vision.state_dim),
      TT_FIELD("vision.state_token_index", model.vision.state_token_index),
      TT_FIELD("train.max_steps", train.max_steps),
      TT_FIELD("train.seed", train.seed),
      TT_FIELD("train.loss_norm", train.loss_norm, {"path_mean", "token_mean"}),
      TT_FIELD("train.grad_clip", train.grad_clip),
      TT_FIELD("train.grad_accum", train.grad_accum),
      TT_FIELD("train.resume", train.resume),
      TT_FIELD("train.log_every", train.log_every),
      TT_FIELD("train.checkpoint_every", train.checkpoint_every),
      TT_FIELD("train.keep_checkpoints", train.keep_checkpoints),
      TT_FIELD("train.final_checkpoint", train.final_checkpoint),
      TT_FIELD("train.gemm_autotune", train.gemm_autotune),
      TT_FIELD("train.gdn_products", train.gdn_products, {"exact", "bf16"}),
      TT_FIELD("train.on_nonfinite", train.on_nonfinite, {"stop", "skip_step"}),
      TT_FIELD("train.max_skipped_steps", train.max_skipped_steps),
      TT_FIELD("optim.lr", optim.lr),
      TT_FIELD("optim.beta1", optim.beta1),
      TT_FIELD("optim.beta2", optim.beta2),
      TT_FIELD("optim.eps", optim.eps),
      TT_FIELD("optim.weight_decay", optim.weight_decay),
      TT_FIELD("schedule.warmup_steps", schedule.warmup_steps),
      TT_FIELD("schedule.decay", schedule.decay, {"cosine", "linear", "constant"}),
      TT_FIELD("schedule.min_lr_ratio", schedule.min_lr_ratio),
      TT_FIELD("partition.capacity_tokens", partition.capacity_tokens),
      TT_FIELD("partition.recompute", partition.recompute),
      TT_FIELD("segments.length", segments.length),
      TT_FIELD("segments.tail", segments.tail),
      TT_FIELD("segments.tbptt", segments.tbptt),
      TT_FIELD("segments.long_range.layers", segments.long_range.layers),
      TT_FIELD("segments.long_range.heads", segments.long_range.heads),
      TT_FIELD("segments.long_range.retrieve", segments.long_range.retrieve),
      TT_FIELD("distributed.mode", distributed.mode, {"auto", "torchrun", "slurm", "off"}),
      TT_FIELD("distributed.comm", distributed.comm, {"auto", "cpu", "nccl"}),
      TT_FIELD("distributed.timeout_s", distributed.timeout_s),
      TT_FIELD("distributed.collective_timeout_s", distributed.collective_timeout_s),
  };
  return kFields;
}

#undef TT_FIELD

// optim.betas: [b1, b2] is accepted as input; to_yaml writes beta1 and beta2.
const char* const kBetasKey = "optim.betas";
// data.history: `full` or `{window: W}` (DataConfig::history_window).
const char* const kHistoryKey = "data.history";
const std::vector<std::string> kSections = {"model",    "vision",    "data",     "train",      "optim",
                                            "schedule", "partition", "segments", "distributed"};

const Field* find_field(const std::string& key) {
  for (const Field& f : fields())
    if (f.key == key) return &f;
  return nullptr;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// The keys one level below `section` ("" for the top level; "segments.long_range" for a
// subsection), as written in YAML, in field order.
std::vector<std::string> keys_of(const std::string& section) {
  std::vector<std::string> out;
  auto add = [&](const std::string& k) {
    if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  };
  for (const Field& f : fields()) {
    if (section.empty()) {
      if (f.key.find('.') == std::string::npos) add(f.key);
      continue;
    }
    if (f.key.size() <= section.size() + 1 || f.key.compare(0, section.size() + 1, section + ".") != 0) continue;
    const std::string rest = f.key.substr(section.size() + 1);
    add(rest.substr(0, rest.find('.')));
    if (f.key == "optim.beta2") add("betas");
    if (f.key == "data.shuffle") add("history");
  }
  if (section.empty()) out.insert(out.end(), kSections.begin(), kSections.end());
  return out;
}

// Whether `key` names a subsection (a mapping of further keys: segments.long_range).
bool is_subsection(const std::string& key) {
  for (const Field& f : fields())
    if (f.key.size() > key.size() + 1 && f.key.compare(0, key.size() + 1, key + ".") == 0) return true;
  return false;
}

std::string where_of(const std::string& source, const YAML::Node& node) {
  const YAML::Mark m = node.Mark();
  const std::string file = source.empty() ? "<config>" : source;
  if (m.is_null()) return file;
  return str(file, ":", m.line + 1);
}

// Where the value of a `key: value` pair was set: the value's line, or the key's for an empty
// value (yaml-cpp marks an empty value at the token after it, a line or more below).
std::string value_where(const std::string& source, const std::pair<YAML::Node, YAML::Node>& kv) {
  return where_of(source, kv.second.IsNull() ? kv.first : kv.second);
}

std::string describe(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "null";
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a list";
  // A long value is quoted by its start (an error message is no place for a pasted file).
  const std::string& v = n.Scalar();
  constexpr size_t kShown = 64;
  size_t cut = std::min(v.size(), kShown);
  while (cut < v.size() && cut > 0 && ((unsigned char)v[cut] & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
  const std::string shown = v.size() <= kShown ? v : v.substr(0, cut) + "...";
  const std::string more = v.size() <= kShown ? "" : str(" (", v.size(), " characters)");
  if (is_quoted_scalar(n)) return "the quoted string \"" + shown + "\"" + more;
  return "'" + shown + "'" + more;
}

[[noreturn]] void type_error(const std::string& where, const std::string& key, const std::string& expected,
                             const YAML::Node& n) {
  throw Error(str(where, ": ", key, ": expected ", expected, ", got ", describe(n)));
}

// Numbers and booleans are plain scalars: "3" in quotes is a string, and silently reading it as
// 3 would make `lr: "3e-4"` and `lr: 3e-4` mean the same while YAML tools disagree.
void check_unquoted(const YAML::Node& n, const std::string& key, const std::string& where,
                    const std::string& expected) {
  if (is_quoted_scalar(n))
    throw Error(str(where, ": ", key, ": expected ", expected, ", got ", describe(n), "; write it without quotes"));
}

bool all_digits(const std::string& s, size_t from) {
  if (from >= s.size()) return false;
  for (size_t k = from; k < s.size(); ++k)
    if (s[k] < '0' || s[k] > '9') return false;
  return true;
}

int64_t parse_int(const YAML::Node& n, const std::string& key, const std::string& where) {
  if (!n.IsScalar()) type_error(where, key, "an integer", n);
  check_unquoted(n, key, where, "an integer");
  const std::string& s = n.Scalar();
  if (!all_digits(s, (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0)) type_error(where, key, "an integer", n);
  errno = 0;
  const long long v = std::strtoll(s.c_str(), nullptr, 10);
  if (errno == ERANGE) throw Error(str(where, ": ", key, ": integer out of range: '", s, "'"));
  return v;
}

uint64_t parse_uint(const YAML::Node& n, const std::string& key, const std::string& where) {
  if (!n.IsScalar()) type_error(where, key, "a non-negative integer", n);
  check_unquoted(n, key, where, "a non-negative integer");
  const std::string& s = n.Scalar();
  if (!all_digits(s, (!s.empty() && s[0] == '+') ? 1 : 0)) type_error(where, key, "a non-negative integer", n);
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
  if (errno == ERANGE) throw Error(str(where, ": ", key, ": integer out of range: '", s, "'"));
  return v;
}

double parse_double(const YAML::Node& n, const std::string& key, const std::string& where) {
  if (!n.IsScalar()) type_error(where, key, "a number", n);
  check_unquoted(n, key, where, "a number");
  const std::string& s = n.Scalar();
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  // strtod also takes hex floats, "inf" and "nan"; a config number is finite and decimal.
  const bool plain = s.find_first_not_of("0123456789+-.eE") == std::string::npos;
  if (s.empty() || end != s.c_str() + s.size() || !plain || errno == ERANGE || !std::isfinite(v))
    type_error(where, key, "a number", n);
  return v;
}

bool parse_bool(const YAML::Node& n, const std::string& key, const std::string& where) {
  if (n.IsScalar()) {
    check_unquoted(n, key, where, "a boolean (true|false)");
    const std::string& s = n.Scalar();
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
  }
  type_error(where, key, "a boolean (true|false)", n);
}

// How the value of a field is written, exactly (doubles round-trip).
std::string format_double(double v) {
  char buf[64];
  for (int prec = 15; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  // Keep a number recognisable as a float where it prints like an integer.
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string format_value(const Ref& r) {
  struct {
    std::string operator()(int64_t* p) const { return std::to_string(*p); }
    std::string operator()(uint64_t* p) const { return std::to_string(*p); }
    std::string operator()(double* p) const { return format_double(*p); }
    std::string operator()(bool* p) const { return *p ? "true" : "false"; }
    std::string operator()(std::string* p) const { return *p; }
    std::string operator()(std::vector<int>* p) const {
      std::string out = "[";
      for (size_t i = 0; i < p->size(); ++i) out += (i ? ", " : "") + std::to_string((*p)[i]);
      return out + "]";
    }
    std::string operator()(std::vector<std::string>* p) const {
      YAML::Emitter e;  // a flow list of double-quoted strings: read back verbatim
      e.SetSeqFormat(YAML::Flow);
      e.SetStringFormat(YAML::DoubleQuoted);
      e << *p;
      return e.c_str();
    }
  } v;
  return std::visit(v, r);
}

// Origin of a value: the config file (paths resolve against base_dir) or a --set override.
struct Origin {
  std::string where;     // "file:line" or "--set k=v"
  std::string base_dir;  // "" for no path resolution
  bool from_cwd = false;  // relative paths resolve against the working directory (a --set value)
};

void set_field(RunConfig& cfg, const Field& f, const YAML::Node& n, const Origin& o) {
  const Ref r = f.ref(cfg);
  if (auto* p = std::get_if<int64_t*>(&r)) {
    **p = parse_int(n, f.key, o.where);
  } else if (auto* p = std::get_if<uint64_t*>(&r)) {
    **p = parse_uint(n, f.key, o.where);
  } else if (auto* p = std::get_if<double*>(&r)) {
    **p = parse_double(n, f.key, o.where);
  } else if (auto* p = std::get_if<bool*>(&r)) {
    **p = parse_bool(n, f.key, o.where);
  } else if (auto* p = std::get_if<std::vector<int>*>(&r)) {
    // A list of integers; null or [] is the empty list. Their range is the section's rule.
    (*p)->clear();
    if (n.IsNull()) return;
    if (!n.IsSequence()) type_error(o.where, f.key, "a list of integers", n);
    for (size_t k = 0; k < n.size(); ++k) {
      const int64_t v = parse_int(n[k], str(f.key, "[", k, "]"), o.where);
      if (v < INT32_MIN || v > INT32_MAX) throw Error(str(o.where, ": ", f.key, "[", k, "]: integer out of range"));
      (*p)->push_back((int)v);
    }
  } else if (auto* p = std::get_if<std::vector<std::string>*>(&r)) {
    // A list of strings; null or [] is the empty list. What the entries may be is the model's rule.
    (*p)->clear();
    if (n.IsNull()) return;
    if (!n.IsSequence()) type_error(o.where, f.key, "a list of strings", n);
    for (size_t k = 0; k < n.size(); ++k) {
      if (!n[k].IsScalar()) type_error(o.where, str(f.key, "[", k, "]"), "a string", n[k]);
      (*p)->push_back(n[k].Scalar());
    }
  } else {
    std::string* s = std::get<std::string*>(r);
    if (!f.allowed.empty()) {
      if (!n.IsScalar() || std::find(f.allowed.begin(), f.allowed.end(), n.Scalar()) == f.allowed.end())
        type_error(o.where, f.key, "one of " + join(f.allowed, "|"), n);
      *s = n.Scalar();
    } else if (n.IsNull()) {
      *s = "";
    } else if (n.IsScalar()) {
      *s = n.Scalar();
      if (f.is_path && !s->empty() && fs::path(*s).is_relative()) {
        std::string base = o.base_dir;
        if (o.from_cwd) {
          std::error_code ec;
          base = fs::current_path(ec).string();
          if (ec)
            throw Error(str(o.where, ": ", f.key, ": the relative path '", *s,
                            "' cannot be made absolute: the working directory: ", ec.message()));
        }
        if (!base.empty()) *s = (fs::path(base) / *s).lexically_normal().string();
      }
    } else {
      type_error(o.where, f.key, "a string", n);
    }
  }
}

void set_betas(RunConfig& cfg, const YAML::Node& n, const std::string& where) {
  if (n.IsSequence() && n.size() != 2)
    throw Error(str(where, ": ", kBetasKey, ": expected a list [beta1, beta2], got a list of ", n.size()));
  if (!n.IsSequence()) type_error(where, kBetasKey, "a list [beta1, beta2]", n);
  cfg.optim.beta1 = parse_double(n[0], "optim.betas[0]", where);
  cfg.optim.beta2 = parse_double(n[1], "optim.betas[1]", where);
  cfg.origin["optim.beta1"] = cfg.origin["optim.beta2"] = where;
}

// The model keys a run may set over model.init_from's config.json instead of agreeing with it:
// choices of training, not of the weights. vision.freeze (whether the tower trains) and
// vision.vision_feature_layer (which of the tower's hidden states feeds the projector: the
// checkpoint holds every layer's weights either way; validate() checks the value against the
// tower's layers).
bool init_from_overrides(const std::string& key) {
  return key == "vision.freeze" || key == "vision.vision_feature_layer";
}

// Parser state: which model keys were written (for the init_from agreement check).
struct ParseState {
  std::map<std::string, std::string> model_keys;  // key -> where it was set
};

void set_history(RunConfig& cfg, const YAML::Node& n, const std::string& where) {
  const char* expected = "full or {window: W} with W >= 1";
  if (n.IsScalar() && n.Scalar() == "full") {
    cfg.data.history_window = 0;
  } else if (n.IsMap() && n.size() == 1 && n["window"]) {
    const YAML::Node w = n["window"];
    int64_t v = 0;
    if (w.IsScalar()) check_unquoted(w, str(kHistoryKey, ".window"), where, "an integer >= 1");
    if (!w.IsScalar() || !YAML::convert<int64_t>::decode(w, v) || v < 1)
      type_error(where, str(kHistoryKey, ".window"), "an integer >= 1", w);
    cfg.data.history_window = v;
  } else {
    type_error(where, kHistoryKey, expected, n);
  }
  cfg.origin[kHistoryKey] = where;
}

void apply(RunConfig& cfg, const std::string& key, const YAML::Node& value, const Origin& o, ParseState& st) {
  if (key == kBetasKey) {
    set_betas(cfg, value, o.where);
    return;
  }
  if (key == kHistoryKey) {
    set_history(cfg, value, o.where);
    return;
  }
  const Field* f = find_field(key);
  TT_CHECK(f != nullptr, "no field ", key);
  set_field(cfg, *f, value, o);
  cfg.origin[key] = o.where;
  if ((key.rfind("model.", 0) == 0 && key != "model.init_from") ||
      (key.rfind("vision.", 0) == 0 && !init_from_overrides(key)))
    st.model_keys[key] = o.where;
}

void parse_section(RunConfig& cfg, const std::string& section, const YAML::Node& node, const std::string& source,
                   const std::string& base_dir, ParseState& st) {
  if (node.IsNull()) return;  // "train:" with nothing under it
  if (!node.IsMap()) throw Error(str(where_of(source, node), ": ", section, ": expected a mapping, got ", describe(node)));
  const std::vector<std::string> allowed = keys_of(section);
  std::set<std::string> seen;
  for (const auto& kv : node) {
    const std::string name = kv.first.Scalar();
    const std::string key = section + "." + name;
    const std::string where = where_of(source, kv.first);
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end())
      throw Error(str(where, ": unknown key '", key, "' (expected one of: ", join(allowed, ", "), ")"));
    if (!seen.insert(name).second) throw Error(str(where, ": duplicate key '", key, "'"));
    if (is_subsection(key)) {
      parse_section(cfg, key, kv.second, source, base_dir, st);
      continue;
    }
    apply(cfg, key, kv.second, Origin{value_where(source, kv), base_dir}, st);
  }
  if (seen.count("betas") && (seen.count("beta1") || seen.count("beta2")))
    throw Error(str(where_of(source, node), ": optim.betas and optim.beta1/beta2 both given; use one"));
}

void parse_document(RunConfig& cfg, const YAML::Node& root, const std::string& source, const std::string& base_dir,
                    ParseState& st) {
  if (root.IsNull()) return;
  if (!root.IsMap()) throw Error(str(where_of(source, root), ": expected a mapping of sections, got ", describe(root)));
  const std::vector<std::string> allowed = keys_of("");
  std::set<std::string> seen;
  for (const auto& kv : root) {
    const std::string name = kv.first.Scalar();
    const std::string where = where_of(source, kv.first);
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end())
      throw Error(str(where, ": unknown key '", name, "' (expected one of: ", join(allowed, ", "), ")"));
    if (!seen.insert(name).second) throw Error(str(where, ": duplicate key '", name, "'"));
    if (std::find(kSections.begin(), kSections.end(), name) != kSections.end()) {
      parse_section(cfg, name, kv.second, source, base_dir, st);
    } else {
      apply(cfg, name, kv.second, Origin{value_where(source, kv), base_dir}, st);
    }
  }
}

void apply_override(RunConfig& cfg, const std::string& ov, ParseState& st) {
  const std::string ctx = "--set " + ov;
  const size_t eq = ov.find('=');
  if (eq == std::string::npos || eq == 0) throw Error(str(ctx, ": expected KEY=VALUE, e.g. train.max_steps=10"));
  const std::string key = ov.substr(0, eq);
  const std::string text = ov.substr(eq + 1);
  if (key != kBetasKey && key != kHistoryKey && find_field(key) == nullptr) {
    const size_t dot = key.find('.');
    const std::string section = dot == std::string::npos ? "" : key.substr(0, dot);
    std::string hint;
    if (std::find(kSections.begin(), kSections.end(), section) != kSections.end())
      hint = " (expected one of: " + join(keys_of(section), ", ") + ")";
    else
      hint = " (sections: " + join(kSections, ", ") + "; top-level keys: run_dir, device)";
    throw Error(str(ctx, ": unknown key '", key, "'", hint));
  }
  YAML::Node value;
  try {
    value = load_one_document(text, ctx, ctx);
  } catch (const YAML::Exception& e) {
    throw Error(str(ctx, ": value is not valid YAML: ", e.msg));
  }
  // A relative path given here is relative to the working directory: made absolute now, so the
  // config.yaml a run or sweep writes (and a later load of it, against its own folder) still
  // points at it.
  apply(cfg, key, value, Origin{ctx, "", /*from_cwd=*/true}, st);
}

// model.layer_types as one entry per layer ([] is every layer full_attention), for comparison.
std::string explicit_layer_types(const model::ModelConfig& m, int64_t layers) {
  std::vector<std::string> v = m.layer_types;
  if (v.empty()) v.assign((size_t)std::max<int64_t>(layers, 0), "full_attention");
  return format_value(Ref(&v));
}

// With model.init_from, the model section comes from DIR/config.json; written keys must agree.
void resolve_init_from(RunConfig& cfg, const ParseState& st) {
  if (cfg.init_from.empty()) {
    // Out-of-range sizes are left to validate(), which names their bounds.
    const int64_t heads = cfg.model.num_attention_heads, hidden = cfg.model.hidden_size;
    const bool in_range = heads >= 1 && heads <= model::kMaxHeads && hidden >= 1 && hidden <= model::kMaxHiddenSize;
    if (!st.model_keys.count("model.head_dim") && in_range) {
      if (cfg.model.hidden_size % heads != 0)
        throw Error(str(
            cfg.where(cfg.origin.count("model.hidden_size") ? "model.hidden_size" : "model.num_attention_heads"),
            ": model.hidden_size (", cfg.model.hidden_size, ") is not a multiple of model.num_attention_heads (", heads,
            "), so model.head_dim cannot default to hidden_size / num_attention_heads: set model.head_dim"));
      cfg.model.head_dim = cfg.model.hidden_size / heads;
    }
    return;
  }
  const std::string file = (fs::path(cfg.init_from) / "config.json").string();
  std::ifstream in(file);
  if (!in) throw Error(str(file, ": cannot open (model.init_from: ", cfg.init_from, ")"));
  std::ostringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = parse_json_strict(text.str());
  } catch (const std::exception& e) {  // invalid JSON, a key named twice, nested too deep
    throw Error(str(file, ": invalid JSON: ", e.what()));
  }
  RunConfig from_hf = cfg;
  from_hf.model = model::ModelConfig::from_hf_json(j, file);
  for (const auto& [key, where] : st.model_keys) {
    const Field* f = find_field(key);
    std::string mine = format_value(f->ref(cfg));
    std::string theirs = format_value(f->ref(from_hf));
    if (key == "model.layer_types") {  // [] means every layer full_attention: compare the explicit lists
      mine = explicit_layer_types(cfg.model, from_hf.model.num_hidden_layers);
      theirs = explicit_layer_types(from_hf.model, from_hf.model.num_hidden_layers);
    }
    if (mine != theirs)
      throw Error(str(where, ": ", key, " = ", mine, " does not match ", theirs, " in ", file,
                      " (model.init_from); drop the key or make it agree"));
  }
  const model::VisionConfig written = cfg.model.vision;  // init_from_overrides' keys, where written
  cfg.model = from_hf.model;
  if (cfg.origin.count("vision.freeze")) cfg.model.vision.freeze = written.freeze;
  if (cfg.origin.count("vision.vision_feature_layer"))
    cfg.model.vision.vision_feature_layer = written.vision_feature_layer;
  for (const Field& f : fields())
    if ((f.key.rfind("model.", 0) == 0 || f.key.rfind("vision.", 0) == 0) && f.key != "model.init_from" &&
        !cfg.origin.count(f.key))
      cfg.origin[f.key] = file;
}

}  // namespace

std::string RunConfig::where(const std::string& key) const {
  auto it = origin.find(key);
  if (it != origin.end()) return it->second;
  return source.empty() ? "<config>" : source;
}

void RunConfig::validate() const {
  // A rule about `key` names where the key was set; a cross-field rule about a key left at its
  // default names where the other key was set (`also`).
  auto require = [&](bool ok, const std::string& key, const std::string& rule, const std::string& got,
                     const std::string& also = "") {
    if (ok) return;
    const std::string at = origin.count(key) || also.empty() ? where(key) : where(also);
    throw Error(str(at, ": ", key, " must be ", rule, " (got ", got, ")"));
  };
  auto in_set = [&](const std::string& key, const std::string& v, const std::vector<std::string>& allowed) {
    require(std::find(allowed.begin(), allowed.end(), v) != allowed.end(), key, "one of " + join(allowed, "|"),
            "'" + v + "'");
  };
  const auto i = [](int64_t v) { return std::to_string(v); };
  const auto d = [](double v) { return format_double(v); };
  require(!run_dir.empty(), "run_dir", "non-empty", "''");
  in_set("device", device, {"auto", "cpu", "cuda"});
  require(num_experts == 0, "model.num_experts", "0 (dense MLPs: mixture-of-experts layers are not supported)",
          i(num_experts));
  try {
    model.validate();
  } catch (const KeyError& e) {
    if (e.key().rfind("vision.", 0) == 0) throw Error(str(where(e.key()), ": ", e.detail()));
    throw Error(str(where("model." + e.key()), ": model.", e.detail()));
  }
  require(!data.path.empty(), "data.path", "set to a JSONL file", "''");
  in_set("data.format", data.format, {"rollouts", "tree", "tokens", "episodes"});
  require(data.format != "episodes" || model.vision.enabled(), "data.format",
          "rollouts or tree without a vision section (episodes need vision.num_hidden_layers >= 1 and the tower's "
          "sizes)", "'episodes'");
  if (!model.vision.enabled()) {  // a vision key without the tower it sizes would be ignored silently
    RunConfig mine = *this, defaults;
    for (const Field& f : fields())
      if (f.key.rfind("vision.", 0) == 0 && f.key != "vision.num_hidden_layers" &&
          format_value(f.ref(mine)) != format_value(f.ref(defaults)))
        throw Error(str(where(f.key), ": ", f.key, " = ", format_value(f.ref(mine)),
                        " has no effect: vision.num_hidden_layers is 0 (no vision tower); set it >= 1 for a VLA, or "
                        "drop the vision keys"));
  }
  require(data.history_window == 0 || data.format == "episodes", kHistoryKey,
          "full unless data.format is episodes", str("{window: ", data.history_window, "}"));
  // (Bins beyond the vocabulary are an error when continuous actions are read: data/actions.h.)
  require(data.action_bins >= 2 && data.action_bins <= (1 << 20), "data.action_bins", "in [2, 2^20]",
          i(data.action_bins));
  require(!model.vision.enabled() || partition.capacity_tokens == 0 ||
              partition.capacity_tokens >= model.vision.tokens_per_frame(),
          "partition.capacity_tokens",
          ">= " + i(model.vision.tokens_per_frame()) +
              ", the tokens of a frame ((vision.image_size / vision.patch_size)^2: a piece holds whole frames), or 0",
          i(partition.capacity_tokens), "vision.image_size");
  in_set("data.packing", data.packing, {"tree", "per_path"});
  require(data.max_tokens_per_batch >= 1 && data.max_tokens_per_batch <= kMaxTokensPerBatch,
          "data.max_tokens_per_batch", "in [1, " + i(kMaxTokensPerBatch) + "]", i(data.max_tokens_per_batch));
  // The per-head q/k norm runs N x num_attention_heads rows, an int32 count (model/config.h).
  const int64_t max_rows = kMaxTokensPerBatch / model.num_attention_heads;
  require(data.max_tokens_per_batch <= max_rows, "data.max_tokens_per_batch",
          "<= " + i(max_rows) + " with model.num_attention_heads " + i(model.num_attention_heads) +
              " (tokens x heads must stay below 2^31)",
          i(data.max_tokens_per_batch), "model.num_attention_heads");
  require(train.max_steps > 0 && train.max_steps <= kMaxSteps, "train.max_steps",
          train.max_steps < 1 ? "> 0" : "<= 2^53", i(train.max_steps));
  in_set("train.loss_norm", train.loss_norm, {"path_mean", "token_mean"});
  require(train.grad_clip >= 0 && std::isfinite(train.grad_clip), "train.grad_clip", ">= 0 (0 disables clipping)",
          d(train.grad_clip));
  require(train.grad_accum >= 1 && train.grad_accum <= kMaxGradAccum, "train.grad_accum",
          train.grad_accum < 1 ? ">= 1" : "<= " + i(kMaxGradAccum), i(train.grad_accum));
  require(train.log_every >= 1, "train.log_every", ">= 1", i(train.log_every));
  require(train.checkpoint_every >= 0, "train.checkpoint_every", ">= 0 (0: only at the end)", i(train.checkpoint_every));
  require(train.keep_checkpoints >= 0, "train.keep_checkpoints", ">= 0 (0 keeps all)", i(train.keep_checkpoints));
  in_set("train.on_nonfinite", train.on_nonfinite, {"stop", "skip_step"});
  in_set("train.gdn_products", train.gdn_products, {"exact", "bf16"});
  require(train.max_skipped_steps >= 0, "train.max_skipped_steps", ">= 0", i(train.max_skipped_steps));
  require(optim.lr > 0 && std::isfinite(optim.lr), "optim.lr", "> 0", d(optim.lr));
  require(optim.beta1 >= 0 && optim.beta1 < 1, "optim.beta1", "in [0, 1)", d(optim.beta1));
  require(optim.beta2 >= 0 && optim.beta2 < 1, "optim.beta2", "in [0, 1)", d(optim.beta2));
  require(optim.eps > 0 && std::isfinite(optim.eps), "optim.eps", "> 0", d(optim.eps));
  require(optim.weight_decay >= 0 && std::isfinite(optim.weight_decay), "optim.weight_decay", ">= 0",
          d(optim.weight_decay));
  require(schedule.warmup_steps >= 0 && schedule.warmup_steps <= kMaxSteps, "schedule.warmup_steps",
          schedule.warmup_steps < 0 ? ">= 0" : "<= 2^53", i(schedule.warmup_steps));
  in_set("schedule.decay", schedule.decay, {"cosine", "linear", "constant"});
  require(schedule.min_lr_ratio >= 0 && schedule.min_lr_ratio <= 1, "schedule.min_lr_ratio", "in [0, 1]",
          d(schedule.min_lr_ratio));
  const int64_t cap = partition.capacity_tokens;
  require(cap >= 0, "partition.capacity_tokens", ">= 0 (0: off)", i(cap));
  require(!partition.recompute || cap > 0, "partition.recompute",
          "false while partition.capacity_tokens is 0 (partitioning is off: no piece to recompute)", "true",
          "partition.capacity_tokens");
  if (cap > 0) {
    require(data.packing == "tree", "data.packing", "tree when partition.capacity_tokens > 0 (" + i(cap) + ")",
            "'" + data.packing + "'", "partition.capacity_tokens");
    require(cap <= data.max_tokens_per_batch, "partition.capacity_tokens",
            "<= data.max_tokens_per_batch (" + i(data.max_tokens_per_batch) + "): a piece must fit a micro-batch",
            i(cap), "data.max_tokens_per_batch");
  }
  try {
    segments.validate(model);
  } catch (const Error& e) {  // "segments.<key>: ..." names the key; place it where it was set
    const std::string msg = e.what();
    const std::string key = msg.substr(0, msg.find(':'));
    throw Error(str(where(find_field(key) ? key : "segments.length"), ": ", msg));
  }
  if (segments.enabled()) {
    const std::string len = i(segments.length);
    require(cap == 0, "partition.capacity_tokens",
            "0 with segments (segment pieces already bound a micro-batch: segments.length " + len + ")", i(cap),
            "segments.length");
  }
  in_set("distributed.mode", distributed.mode, {"auto", "torchrun", "slurm", "off"});
  in_set("distributed.comm", distributed.comm, {"auto", "cpu", "nccl"});
  require(distributed.timeout_s > 0 && distributed.timeout_s <= kMaxTimeoutS, "distributed.timeout_s",
          "in (0, " + d(kMaxTimeoutS) + "] seconds", d(distributed.timeout_s));
  require(distributed.collective_timeout_s > 0 && distributed.collective_timeout_s <= kMaxTimeoutS,
          "distributed.collective_timeout_s", "in (0, " + d(kMaxTimeoutS) + "] seconds",
          d(distributed.collective_timeout_s));
}

std::vector<std::string> RunConfig::warnings() const {
  std::vector<std::string> out;
  if (schedule.warmup_steps > train.max_steps)
    out.push_back(str(where(origin.count("schedule.warmup_steps") ? "schedule.warmup_steps" : "train.max_steps"),
                      ": schedule.warmup_steps (", schedule.warmup_steps, ") is longer than train.max_steps (",
                      train.max_steps, "): the learning rate rises to ", train.max_steps, "/", schedule.warmup_steps,
                      " of optim.lr and does not decay"));
  return out;
}

std::vector<std::pair<std::string, std::string>> RunConfig::values() const {
  RunConfig copy = *this;
  std::vector<std::pair<std::string, std::string>> out;
  for (const Field& f : fields()) out.emplace_back(f.key, format_value(f.ref(copy)));
  return out;
}

std::string RunConfig::to_yaml() const {
  RunConfig copy = *this;
  std::ostringstream out;
  out << "# treetrain resolved config\n";
  std::vector<std::string> open;  // the (sub)sections of the previous key
  for (const Field& f : fields()) {
    std::vector<std::string> parts;
    for (size_t a = 0, b; a <= f.key.size(); a = b + 1) {
      b = f.key.find('.', a);
      if (b == std::string::npos) b = f.key.size();
      parts.push_back(f.key.substr(a, b - a));
    }
    const std::vector<std::string> path(parts.begin(), parts.end() - 1);
    size_t common = 0;
    while (common < open.size() && common < path.size() && open[common] == path[common]) ++common;
    for (size_t d = common; d < path.size(); ++d) out << std::string(2 * d, ' ') << path[d] << ":\n";
    open = path;
    const Ref r = f.ref(copy);
    std::string v = format_value(r);
    if (std::holds_alternative<std::string*>(r)) {
      YAML::Emitter e;  // a double-quoted scalar is read back verbatim, whatever it contains
      e << YAML::DoubleQuoted << v;
      v = e.c_str();
    }
    out << std::string(2 * path.size(), ' ') << parts.back() << ": " << v << "\n";
    if (f.key == "data.shuffle")
      out << "  history: " << (data.history_window == 0 ? std::string("full") : str("{window: ", data.history_window, "}"))
          << "\n";
  }
  return out.str();
}

RunConfig parse_config_text(const std::string& yaml_text, const std::string& source,
                            const std::vector<std::string>& overrides, const std::string& base_dir) {
  RunConfig cfg;
  cfg.source = source;
  ParseState st;
  YAML::Node root;
  const std::string file = source.empty() ? "<config>" : source;
  try {
    root = load_one_document(yaml_text, file);  // (which drops a byte order mark)
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp stops at 500 levels of nesting and reports it as "bad file".
    throw Error(str(file, ":", e.mark.line + 1, ": invalid YAML: nested deeper than 500 levels (yaml-cpp's limit)"));
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) throw Error(str(file, ": invalid YAML: ", e.msg));
    throw Error(str(file, ":", e.mark.line + 1, ": invalid YAML: ", e.msg));
  }
  parse_document(cfg, root, source, base_dir, st);
  for (const std::string& ov : overrides) apply_override(cfg, ov, st);
  resolve_init_from(cfg, st);
  cfg.model.canonicalize();
  cfg.validate();
  return cfg;
}

// A config is a page of YAML; anything near this is not one (or a stream that never ends).
constexpr size_t kMaxConfigBytes = size_t{16} << 20;

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error(str(path, ": is a directory, expected a YAML config file"));
  const std::string text = read_text(path, "config file", kMaxConfigBytes);
  const std::string base = fs::absolute(fs::path(path)).parent_path().lexically_normal().string();
  return parse_config_text(text, path, overrides, base);
}

}  // namespace tt::trainer
