// Sweep files -> runs, resolved configs, SLURM array scripts, local runs (see sweep.h).
#include "trainer/sweep.h"

#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>

#include "distributed/launch.h"
#include "base/check.h"
#include "base/json.h"
#include "base/files.h"
#include "trainer/run_dir.h"
#include "trainer/yaml_doc.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kTopKeys = {"base", "run_dir", "set", "grid", "list", "slurm"};
const std::vector<std::string> kSlurmKeys = {"partition", "account", "time", "nodes", "gpus_per_node",
                                             "cpus_per_task", "sbatch"};

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string where_of(const std::string& source, const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  return m.is_null() ? source : str(source, ":", m.line + 1);
}

// A value as `--set` takes it: a scalar's text, a list in YAML flow style. A quoted scalar stays
// quoted (a string), so a number key refuses "3e-4" here as it does in a run config.
std::string value_text(const YAML::Node& n, const std::string& where, const std::string& key) {
  if (is_quoted_scalar(n)) {
    YAML::Emitter e;
    e << YAML::DoubleQuoted << n.Scalar();
    return e.c_str();
  }
  if (n.IsScalar()) return n.Scalar();
  if (n.IsSequence()) {
    YAML::Emitter e;
    e << YAML::Flow << n;
    return e.c_str();
  }
  throw Error(str(where, ": ", key, ": expected a value (a scalar or a short list), got ",
                  n.IsMap() ? "a mapping" : "null"));
}

// A parameter value with where it was written.
struct Value {
  std::string text;
  std::string where;
};
struct Param {
  std::string key;
  std::string where;  // of the key
  std::vector<Value> values;
};

std::string override_of(const std::string& key, const std::string& text) { return key + "=" + text; }

// The message of an error from a --set override, without its "--set k=v: " prefix.
std::string strip_set_prefix(const std::string& msg, const std::string& ov) {
  const std::string prefix = "--set " + ov + ": ";
  return msg.rfind(prefix, 0) == 0 ? msg.substr(prefix.size()) : msg;
}

constexpr size_t kMaxRunName = 240;  // bytes of a run's folder name (a file name holds 255)

// A run's config as to_yaml writes it, run_dir left out (what the run trains).
std::string described_config(trainer::RunConfig c) {
  c.run_dir.clear();
  return c.to_yaml();
}

std::vector<Param> parse_params(const YAML::Node& node, const std::string& section, const std::string& source,
                                bool values_are_lists) {
  std::vector<Param> out;
  if (node.IsNull()) return out;
  if (!node.IsMap())
    throw Error(str(where_of(source, node), ": ", section, ": expected a mapping of key paths (e.g. optim.lr: ",
                    values_are_lists ? "[1.0e-3, 3.0e-3]" : "1.0e-3", ")"));
  for (const auto& kv : node) {
    Param p;
    p.key = kv.first.Scalar();
    p.where = where_of(source, kv.first);
    if (p.key == "run_dir")  // each run's is the sweep's run_dir/<run name>
      throw Error(str(p.where, ": ", section, ": run_dir is the sweep's own (the top-level run_dir:); each run trains "
                                              "in run_dir/<run name>"));
    if (values_are_lists) {
      if (!kv.second.IsSequence() || kv.second.size() == 0)
        throw Error(str(where_of(source, kv.second), ": ", section, ": ", p.key, ": expected a non-empty list of values"));
      for (const YAML::Node& v : kv.second)
        p.values.push_back(Value{value_text(v, where_of(source, v), p.key), where_of(source, v)});
    } else {
      p.values.push_back(Value{value_text(kv.second, where_of(source, kv.second), p.key), where_of(source, kv.second)});
    }
    out.push_back(p);
  }
  return out;
}

int64_t slurm_int(const YAML::Node& n, const std::string& key, const std::string& source, int64_t min) {
  const std::string where = where_of(source, n);
  if (!n.IsScalar() || is_quoted_scalar(n))
    throw Error(str(where, ": slurm.", key, ": expected an integer (unquoted), got ",
                    n.IsScalar() ? "the quoted string \"" + n.Scalar() + "\"" : std::string("a non-scalar")));
  const std::string& s = n.Scalar();
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE || v < min) throw Error(str(where, ": slurm.", key, ": expected an integer >= ", min, ", got '", s, "'"));
  return v;
}

SlurmOptions parse_slurm(const YAML::Node& node, const std::string& source) {
  SlurmOptions o;
  if (node.IsNull()) return o;
  if (!node.IsMap()) throw Error(str(where_of(source, node), ": slurm: expected a mapping"));
  std::set<std::string> seen;
  for (const auto& kv : node) {
    const std::string key = kv.first.Scalar();
    const std::string where = where_of(source, kv.first);
    if (std::find(kSlurmKeys.begin(), kSlurmKeys.end(), key) == kSlurmKeys.end())
      throw Error(str(where, ": unknown key 'slurm.", key, "' (expected one of: ", join(kSlurmKeys, ", "), ")"));
    if (!seen.insert(key).second) throw Error(str(where, ": duplicate key 'slurm.", key, "'"));
    const YAML::Node& v = kv.second;
    auto text = [&] {
      if (!v.IsScalar()) throw Error(str(where_of(source, v), ": slurm.", key, ": expected a string"));
      const std::string s = v.Scalar();
      if (s.find('\n') != std::string::npos) throw Error(str(where_of(source, v), ": slurm.", key, ": one line expected"));
      return s;
    };
    if (key == "partition") o.partition = text();
    if (key == "account") o.account = text();
    if (key == "time") o.time = text();
    if (key == "nodes") o.nodes = slurm_int(v, key, source, 1);
    if (key == "gpus_per_node") o.gpus_per_node = slurm_int(v, key, source, 1);
    if (key == "cpus_per_task") o.cpus_per_task = slurm_int(v, key, source, 1);
    if (key == "sbatch") {
      if (!v.IsSequence()) throw Error(str(where_of(source, v), ": slurm.sbatch: expected a list of sbatch options"));
      for (const YAML::Node& line : v) {
        if (!line.IsScalar() || line.Scalar().find('\n') != std::string::npos)
          throw Error(str(where_of(source, line), ": slurm.sbatch: expected one sbatch option per entry"));
        o.sbatch.push_back(line.Scalar());
      }
    }
  }
  return o;
}

// "optim.lr" -> "lr", unless another varied key ends the same way.
std::vector<std::string> short_names(const std::vector<std::string>& keys) {
  std::map<std::string, int> count;
  auto leaf = [](const std::string& k) { return k.substr(k.rfind('.') + 1); };
  for (const std::string& k : keys) ++count[leaf(k)];
  std::vector<std::string> out;
  for (const std::string& k : keys) out.push_back(count[leaf(k)] > 1 ? k : leaf(k));
  return out;
}

std::string sanitize(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                      c == '-' || c == '+' || c == '_';
    if (keep) {
      out += c;
    } else if (!out.empty() && out.back() != '_' && c != ' ' && c != '[' && c != ']') {
      out += c == ',' ? ',' : '_';
    }
  }
  while (!out.empty() && (out.back() == '_' || out.back() == ',')) out.pop_back();
  return out.empty() ? "x" : out;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

Sweep parse_sweep_text(const std::string& yaml_text, const std::string& source, const std::string& base_dir) {
  YAML::Node root;
  try {
    root = load_one_document(yaml_text, source);
  } catch (const YAML::ParserException& e) {
    throw Error(str(source, ":", e.mark.line + 1, ": invalid YAML: ", e.msg));
  }
  if (!root.IsMap()) throw Error(str(source, ": expected a mapping with base: and grid: and/or list:"));
  std::map<std::string, YAML::Node> top;
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    const std::string where = where_of(source, kv.first);
    if (std::find(kTopKeys.begin(), kTopKeys.end(), key) == kTopKeys.end())
      throw Error(str(where, ": unknown key '", key, "' (expected one of: ", join(kTopKeys, ", "), ")"));
    if (top.count(key)) throw Error(str(where, ": duplicate key '", key, "'"));
    top[key] = kv.second;
  }
  Sweep sw;
  sw.source = source;
  if (!top.count("base") || !top["base"].IsScalar() || top["base"].Scalar().empty())
    throw Error(str(source, ": base: expected the path of the run config to sweep"));
  fs::path base = top["base"].Scalar();
  if (base.is_relative() && !base_dir.empty()) base = fs::path(base_dir) / base;
  sw.base = fs::absolute(base).lexically_normal().string();

  const std::vector<Param> fixed = top.count("set") ? parse_params(top["set"], "set", source, false) : std::vector<Param>{};
  const std::vector<Param> grid = top.count("grid") ? parse_params(top["grid"], "grid", source, true) : std::vector<Param>{};
  const std::vector<Param> list = top.count("list") ? parse_params(top["list"], "list", source, true) : std::vector<Param>{};
  sw.slurm = top.count("slurm") ? parse_slurm(top["slurm"], source) : SlurmOptions{};

  // A key at most once across set, grid and list.
  std::map<std::string, std::string> first_seen;
  for (const std::vector<Param>* group : {&fixed, &grid, &list})
    for (const Param& p : *group) {
      auto [it, fresh] = first_seen.emplace(p.key, p.where);
      if (!fresh) throw Error(str(p.where, ": key '", p.key, "' is already given at ", it->second));
    }
  for (const Param& p : list)
    if (p.values.size() != list.front().values.size())
      throw Error(str(p.where, ": list: ", p.key, " has ", p.values.size(), " values, but ", list.front().key, " has ",
                      list.front().values.size(), " (list entries are zipped: give them equal lengths)"));

  // Every key and value against the base config, so an error names the line it was written on.
  std::vector<std::string> set_overrides;
  for (const Param& p : fixed) {
    const std::string ov = override_of(p.key, p.values[0].text);
    try {
      trainer::load_config(sw.base, {ov});
    } catch (const Error& e) {
      throw Error(str(p.values[0].where, ": set: ", p.key, ": ", strip_set_prefix(e.what(), ov)));
    }
    set_overrides.push_back(ov);
  }
  trainer::RunConfig base_cfg;
  try {
    base_cfg = trainer::load_config(sw.base, set_overrides);
  } catch (const Error& e) {
    throw Error(str(source, ": base ", sw.base, ": ", e.what()));
  }
  for (const std::vector<Param>* group : {&grid, &list})
    for (const Param& p : *group)
      for (const Value& v : p.values) {
        std::vector<std::string> ovs = set_overrides;
        ovs.push_back(override_of(p.key, v.text));
        try {
          trainer::load_config(sw.base, ovs);
        } catch (const Error& e) {
          throw Error(str(v.where, ": ", group == &grid ? "grid" : "list", ": ", p.key, ": ",
                          strip_set_prefix(e.what(), ovs.back())));
        }
      }

  // run_dir: the sweep's (relative: to the working directory, as for run configs) or the base's.
  fs::path run_dir = base_cfg.run_dir;
  if (top.count("run_dir")) {
    if (!top["run_dir"].IsScalar() || top["run_dir"].Scalar().empty())
      throw Error(str(where_of(source, top["run_dir"]), ": run_dir: expected a folder"));
    run_dir = top["run_dir"].Scalar();
  }
  sw.run_dir = fs::absolute(run_dir).lexically_normal().string();

  // Runs: zipped list entries (or one empty entry) times the grid's cartesian product.
  constexpr size_t kMaxRuns = 100000;
  const size_t n_list = list.empty() ? 1 : list.front().values.size();
  size_t n_grid = 1;
  for (const Param& p : grid) {  // checked at each factor: the product of a large grid wraps size_t
    if (p.values.empty() || n_grid > kMaxRuns / p.values.size())
      throw Error(str(source, ": the grid has ", p.values.empty() ? "no" : "more than 100000", " runs (at ", p.key,
                      "); a sweep is limited to 1 to 100000"));
    n_grid *= p.values.size();
  }
  const size_t n_runs = n_list * n_grid;
  if (n_runs == 0 || n_runs > kMaxRuns) throw Error(str(source, ": ", n_runs, " runs; a sweep is limited to 1 to 100000"));
  std::vector<std::string> varied;
  for (const Param& p : list) varied.push_back(p.key);
  for (const Param& p : grid) varied.push_back(p.key);
  const std::vector<std::string> names = short_names(varied);
  const int width = (int)std::to_string(std::max<size_t>(n_runs - 1, 1)).size();
  std::unordered_multimap<size_t, size_t> seen;  // hash of a run's config (run_dir left out) -> its index
  for (size_t i = 0; i < n_runs; ++i) {
    SweepRun run;
    run.index = (int)i;
    const size_t li = i / n_grid;
    size_t gi = i % n_grid;
    for (const Param& p : list) run.params.emplace_back(p.key, p.values[li].text);
    std::vector<std::pair<std::string, std::string>> grid_params(grid.size());
    for (size_t k = grid.size(); k-- > 0;) {  // the last grid key varies fastest
      grid_params[k] = {grid[k].key, grid[k].values[gi % grid[k].values.size()].text};
      gi /= grid[k].values.size();
    }
    run.params.insert(run.params.end(), grid_params.begin(), grid_params.end());
    char idx[32];
    std::snprintf(idx, sizeof(idx), "%0*zu", width, i);
    run.name = idx;
    for (size_t k = 0; k < run.params.size(); ++k) run.name += "_" + names[k] + "-" + sanitize(run.params[k].second);
    if (run.name.size() > kMaxRunName) run.name.resize(kMaxRunName);  // a folder name; the index keeps it unique
    std::vector<std::string> ovs = set_overrides;
    std::string described;
    for (const auto& [k, v] : run.params) {
      ovs.push_back(override_of(k, v));
      described += (described.empty() ? "" : ", ") + k + "=" + v;
    }
    try {
      run.config = trainer::load_config(sw.base, ovs);
    } catch (const Error& e) {
      throw Error(str(source, ": run ", run.name, " (", described, "): ", e.what()));
    }
    run.config.run_dir = (fs::path(sw.run_dir) / run.name).string();
    // Two runs that train the same thing (a value listed twice, or 1e-3 and 0.001): an error.
    const std::string trained = described_config(run.config);
    const size_t h = std::hash<std::string>{}(trained);
    for (auto [it, end] = seen.equal_range(h); it != end; ++it)
      if (described_config(sw.runs[it->second].config) == trained)
        throw Error(str(source, ": runs ", sw.runs[it->second].name, " and ", run.name, " (", described,
                        ") train the same config; list each value once"));
    seen.emplace(h, sw.runs.size());
    sw.runs.push_back(std::move(run));
  }
  return sw;
}

Sweep load_sweep(const std::string& path) {
  return parse_sweep_text(read_text(path, "sweep file", size_t{16} << 20), path,
                          fs::absolute(fs::path(path)).parent_path().lexically_normal().string());
}

std::vector<std::string> write_run_configs(const Sweep& sweep) {
  std::vector<std::string> paths;
  for (const SweepRun& run : sweep.runs) {
    fs::create_directories(run.config.run_dir);
    const std::string path = (fs::path(run.config.run_dir) / "config.yaml").string();
    const std::string yaml = run.config.to_yaml();
    // A run's earlier config.yaml that says something else (the sweep file changed since) is what
    // its checkpoints and metrics were trained with: kept beside it, not overwritten. (Its first
    // line, the sweep file as it was named, does not count.)
    std::error_code ec;
    if (fs::exists(path, ec)) {
      const std::string old = read_text(path, "a run's config");
      const size_t nl = old.find('\n');
      if (nl != std::string::npos && old.substr(nl + 1) == yaml) {
        write_text_atomic(path, str("# sweep ", sweep.source, ", run ", run.name, "\n", yaml));
        paths.push_back(path);
        continue;
      }
      const std::string stamp = utc_stamp();
      std::string kept = str(path, ".replaced-", stamp);
      for (int k = 2; fs::exists(kept, ec); ++k) kept = str(path, ".replaced-", stamp, "-", k);
      fs::rename(path, kept, ec);
      if (ec) throw Error(str(path, ": cannot keep the earlier config as ", kept, ": ", ec.message()));
      spdlog::warn("sweep: {} differs from the sweep's run {}; the earlier one is kept as {}", path, run.name, kept);
    }
    write_text_atomic(path, str("# sweep ", sweep.source, ", run ", run.name, "\n", yaml));
    paths.push_back(path);
  }
  return paths;
}

std::string slurm_script(const Sweep& sweep, const std::string& binary) {
  const SlurmOptions& s = sweep.slurm;
  std::ostringstream o;
  o << "#!/bin/bash\n"
    << "# SLURM array job of the sweep " << sweep.source << ": " << sweep.runs.size()
    << " runs, one array task each (written by `treetrain sweep --mode slurm`).\n"
    << "# Each task trains one run on " << s.nodes << " node(s) x " << s.gpus_per_node
    << " GPU(s), one process per GPU: the srun tasks find each other through SLURM_PROCID, SLURM_NTASKS,\n"
    << "# SLURM_LOCALID and the first host of the step's node list; MASTER_PORT derives from the array\n"
    << "# task's own SLURM_JOB_ID (distributed/env.h). Submit with: sbatch <this file>\n"
    << "#SBATCH --job-name=" << sanitize(fs::path(sweep.source).stem().string()) << "\n"
    << "#SBATCH --array=0-" << sweep.runs.size() - 1 << "\n"
    << "#SBATCH --nodes=" << s.nodes << "\n"
    << "#SBATCH --ntasks-per-node=" << s.gpus_per_node << "\n"
    << "#SBATCH --gpus-per-node=" << s.gpus_per_node << "\n";
  if (s.cpus_per_task > 0) o << "#SBATCH --cpus-per-task=" << s.cpus_per_task << "\n";
  if (!s.partition.empty()) o << "#SBATCH --partition=" << s.partition << "\n";
  if (!s.account.empty()) o << "#SBATCH --account=" << s.account << "\n";
  if (!s.time.empty()) o << "#SBATCH --time=" << s.time << "\n";
  // sbatch reads a directive's value up to a space and expands its '%' patterns, and a line break
  // would end the directive: a run_dir with any of them would send the logs elsewhere.
  if (sweep.run_dir.find_first_of(" \t\r\n%'\"\\") != std::string::npos)
    throw Error(str("sweep: run_dir '", sweep.run_dir, "' has a space, quote, backslash, line break or '%', which ",
                    "#SBATCH --output cannot take; choose a run_dir without them for --mode slurm"));
  o << "#SBATCH --output=" << sweep.run_dir << "/slurm-%A_%a.out\n";
  for (const std::string& line : s.sbatch) o << "#SBATCH " << line << "\n";
  o << "set -euo pipefail\n"
    << "# NVLink SHARP (NVLS) multicast off: a program that uses it can put a host's GPUs out of\n"
    << "# service; NCCL then uses its ring/tree algorithms over NVLink.\n"
    << "export NCCL_NVLS_ENABLE=0\n"
    << "# A secret per array task and attempt: only its own srun tasks join its rendezvous\n"
    << "# (distributed/auth.h).\n"
    << "export TT_JOB_SECRET=\"$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')\"\n"
    << "configs=(\n";
  for (const SweepRun& run : sweep.runs)
    o << "  " << shell_quote((fs::path(run.config.run_dir) / "config.yaml").string()) << "\n";
  o << ")\n"
    << "config=\"${configs[$SLURM_ARRAY_TASK_ID]}\"\n"
    << "echo \"sweep task ${SLURM_ARRAY_TASK_ID}: ${config}\"\n"
    << "srun --kill-on-bad-exit=1 " << shell_quote(binary) << " train --config \"$config\"\n";
  return o.str();
}

RunResult read_result(const std::string& run_dir, const std::string& status) {
  RunResult r;
  r.status = status;
  std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  if (last.empty()) return r;
  const nlohmann::json j = parse_json_or_discarded(last);
  if (!j.is_object()) return r;
  if (!j.contains("step") || !j["step"].is_number()) return r;  // not a step's line
  r.has_metrics = true;
  r.step = j["step"].get<int64_t>();
  if (j.contains("loss") && j["loss"].is_number()) r.loss = j["loss"].get<double>();
  if (j.contains("tokens_per_s") && j["tokens_per_s"].is_number()) r.tokens_per_s = j["tokens_per_s"].get<double>();
  return r;
}

std::string results_table(const Sweep& sweep, const std::vector<RunResult>& results) {
  size_t name_w = 3, status_w = 6;
  for (size_t i = 0; i < sweep.runs.size(); ++i) {
    name_w = std::max(name_w, sweep.runs[i].name.size());
    if (i < results.size()) status_w = std::max(status_w, results[i].status.size());
  }
  // Padded columns, then the numbers (a fixed buffer would cut a long run name and its newline).
  auto pad = [](const std::string& v, size_t w) { return v + std::string(w > v.size() ? w - v.size() : 0, ' '); };
  std::ostringstream o;
  char buf[128];
  std::snprintf(buf, sizeof(buf), "  %8s  %10s  %12s\n", "step", "loss", "tokens/s");
  o << pad("run", name_w) << "  " << pad("status", status_w) << buf;
  for (size_t i = 0; i < sweep.runs.size(); ++i) {
    const RunResult r = i < results.size() ? results[i] : RunResult{"not run"};
    if (r.has_metrics)
      std::snprintf(buf, sizeof(buf), "  %8lld  %10.4f  %12.1f\n", (long long)r.step, r.loss, r.tokens_per_s);
    else
      std::snprintf(buf, sizeof(buf), "  %8s  %10s  %12s\n", "-", "-", "-");
    o << pad(sweep.runs[i].name, name_w) << "  " << pad(r.status, status_w) << buf;
  }
  return o.str();
}

std::vector<RunResult> run_local(const Sweep& sweep, const std::string& binary, int nproc) {
  const std::vector<std::string> configs = write_run_configs(sweep);
  std::vector<RunResult> results;
  for (size_t i = 0; i < sweep.runs.size(); ++i) {
    std::vector<std::string> argv = {binary};
    if (nproc > 1) {
      argv.insert(argv.end(), {"launch", "--nproc", std::to_string(nproc), "--"});
    }
    argv.insert(argv.end(), {"train", "--config", configs[i]});
    std::fprintf(stderr, "sweep: run %zu/%zu %s\n", i + 1, sweep.runs.size(), sweep.runs[i].name.c_str());
    // A run that fails before it writes a step leaves an earlier run's metrics.jsonl in its
    // run_dir (a fresh start over checkpoints, say): those are not this run's figures.
    const fs::path metrics = fs::path(sweep.runs[i].config.run_dir) / "metrics.jsonl";
    auto stamp = [&] {
      std::error_code ec;
      const auto t = fs::last_write_time(metrics, ec);
      const auto n = ec ? 0 : fs::file_size(metrics, ec);
      return ec ? std::make_pair(fs::file_time_type::min(), std::uintmax_t{0}) : std::make_pair(t, n);
    };
    const auto before = stamp();
    const int code = distributed::run_process(argv);
    const std::string status = code == 0 ? "ok" : str("failed (exit ", code, ")");
    const bool written = before.first == fs::file_time_type::min() || stamp() != before;
    results.push_back(written ? read_result(sweep.runs[i].config.run_dir, status) : RunResult{status});
  }
  return results;
}

}  // namespace tt::trainer
