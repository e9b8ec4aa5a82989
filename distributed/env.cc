// Launcher environments -> DistEnv (see env.h).
#include "distributed/env.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "base/check.h"
#include "distributed/auth.h"

namespace tt::distributed {
namespace {

bool is_set(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v != nullptr && v[0] != '\0';
}

std::string require(const EnvLookup& env, const char* name, const std::string& why) {
  const char* v = env(name);
  if (v == nullptr || v[0] == '\0') throw Error(str("distributed: environment variable ", name, " is not set (", why, ")"));
  return v;
}

int parse_int(const std::string& s, const char* name, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi)
    throw Error(str("distributed: ", name, "='", s, "': expected an integer in [", lo, ", ", hi, "]"));
  return (int)v;
}

int int_var(const EnvLookup& env, const char* name, long lo, long hi, const std::string& why) {
  return parse_int(require(env, name, why), name, lo, hi);
}

void check_rank(const DistEnv& e, const char* rank_var, const char* world_var) {
  if (e.rank >= e.world_size)
    throw Error(str("distributed: ", rank_var, "=", e.rank, " is not below ", world_var, "=", e.world_size));
  if (e.local_rank >= e.local_world_size && e.local_world_size > 1)
    throw Error(str("distributed: local rank ", e.local_rank, " is not below the local world size ", e.local_world_size));
}

DistEnv from_torchrun(const EnvLookup& env) {
  DistEnv e;
  e.source = "torchrun";
  const std::string why = "torchrun-style launch: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT";
  e.world_size = int_var(env, "WORLD_SIZE", 1, 1 << 20, why);
  e.rank = int_var(env, "RANK", 0, (1 << 20) - 1, why);
  e.local_rank = int_var(env, "LOCAL_RANK", 0, (1 << 20) - 1, why);
  e.local_world_size = is_set(env, "LOCAL_WORLD_SIZE") ? int_var(env, "LOCAL_WORLD_SIZE", 1, 1 << 20, why) : 1;
  if (e.world_size > 1) {
    e.master_addr = require(env, "MASTER_ADDR", why);
    e.master_port = int_var(env, "MASTER_PORT", 1, 65535, why);
  }
  check_rank(e, "RANK", "WORLD_SIZE");
  return e;
}

DistEnv from_slurm(const EnvLookup& env) {
  DistEnv e;
  e.source = "slurm";
  const std::string why = "SLURM launch: run treetrain under srun, one task per GPU";
  const char* world_var = is_set(env, "SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
  e.world_size = int_var(env, world_var, 1, 1 << 20, why);
  e.rank = int_var(env, "SLURM_PROCID", 0, (1 << 20) - 1, why);
  e.local_rank = int_var(env, "SLURM_LOCALID", 0, (1 << 20) - 1, why);
  // "8" or "8(x2),4": the count of this node is not needed, only an upper bound for messages.
  e.local_world_size = 1;
  check_rank(e, "SLURM_PROCID", world_var);
  if (e.world_size == 1) return e;
  if (is_set(env, "MASTER_ADDR")) {
    e.master_addr = env("MASTER_ADDR");
  } else {
    const char* list_var = is_set(env, "SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
    const std::string list = require(env, list_var, why + " (the master is the first host of the node list)");
    std::vector<std::string> hosts;
    try {
      hosts = expand_nodelist(list);
    } catch (const Error& err) {
      throw Error(str("distributed: ", list_var, ": ", err.what()));
    }
    e.master_addr = hosts.front();
  }
  if (is_set(env, "MASTER_PORT")) {
    e.master_port = int_var(env, "MASTER_PORT", 1, 65535, why);
  } else {
    const std::string job = require(env, "SLURM_JOB_ID", why + " (the default MASTER_PORT derives from it)");
    e.master_port = 20000 + parse_int(job, "SLURM_JOB_ID", 0, INT_MAX) % 10000;
  }
  return e;
}

// One bracket group's body "01-03,7" -> "01","02","03","7".
// More hosts than any job has: a list past it is a mistake (or a bomb: n[0-99999][0-99999]).
constexpr int64_t kMaxHosts = 1 << 17;

[[noreturn]] void too_many_hosts(const std::string& list) {
  throw Error(str("host list '", list.substr(0, 200), list.size() > 200 ? "..." : "", "' names more than ", kMaxHosts,
                  " hosts"));
}

std::vector<std::string> expand_ranges(const std::string& body, const std::string& list) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= body.size()) {
    const size_t comma = std::min(body.find(',', i), body.size());
    const std::string item = body.substr(i, comma - i);
    const size_t dash = item.find('-');
    auto digits = [&](const std::string& s) {
      if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos)
        throw Error(str("bad range '", item, "' in host list '", list, "' (expected N or N-M with digits)"));
      return std::strtoll(s.c_str(), nullptr, 10);
    };
    if (dash == std::string::npos) {
      digits(item);
      out.push_back(item);
    } else {
      const std::string lo_s = item.substr(0, dash), hi_s = item.substr(dash + 1);
      const long long lo = digits(lo_s), hi = digits(hi_s);
      if (hi < lo) throw Error(str("bad range '", item, "' in host list '", list, "' (upper bound below lower)"));
      if (hi - lo > 100000) throw Error(str("range '", item, "' in host list '", list, "' is too long"));
      if ((int64_t)out.size() + (hi - lo + 1) > kMaxHosts) too_many_hosts(list);
      for (long long v = lo; v <= hi; ++v) {
        std::string s = std::to_string(v);
        if (s.size() < lo_s.size()) s.insert(0, lo_s.size() - s.size(), '0');
        out.push_back(s);
      }
    }
    i = comma + 1;
  }
  return out;
}

// The first of the job id variables that is set; at most 256 printable characters.
void read_job_id(const EnvLookup& env, DistEnv* e) {
  for (const char* name : {"TT_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"}) {
    if (!is_set(env, name)) continue;
    const std::string id = env(name);
    bool printable = id.size() <= 256;
    for (unsigned char c : id) printable &= c >= ' ' && c < 0x7f;
    if (!printable)
      throw Error(str("distributed: ", name, ": expected a job id of at most 256 printable characters, got ",
                      id.size(), " bytes"));
    e->job_id = id;
    e->job_id_var = name;
    return;
  }
}

// TT_JOB_SECRET: printable, at least 16 characters (the launchers make 32 random hex digits; a
// secret a person chooses is only as strong as its choice).
void read_secret(const EnvLookup& env, DistEnv* e) {
  const char* v = env("TT_JOB_SECRET");
  if (v == nullptr) return;
  if (v[0] == '\0') {  // set but empty (a failed $(...) in a job script): not "no authentication"
    if (!e->distributed()) return;  // one process: no rendezvous to secure
    throw Error(str("distributed: TT_JOB_SECRET is set but empty; expected ", auth::kMinSecretChars,
                    " to 1024 printable characters (for example 32 random hex digits), or leave it unset"));
  }
  const std::string s = v;
  bool printable = s.size() >= auth::kMinSecretChars && s.size() <= 1024;
  for (unsigned char c : s) printable &= c > ' ' && c < 0x7f;
  if (!printable)
    throw Error(str("distributed: TT_JOB_SECRET: expected ", auth::kMinSecretChars,
                    " to 1024 printable characters without spaces (for example 32 random hex digits), got ", s.size(),
                    " characters that are not"));
  e->secret = s;
}

}  // namespace

std::string DistEnv::describe() const {
  return str("rank ", rank, "/", world_size, " on host ", host.empty() ? "?" : host, " (local rank ", local_rank, ")");
}

DistEnv read_env(const std::string& mode, const EnvLookup& lookup) {
  DistEnv e;
  if (mode == "torchrun") {
    e = from_torchrun(lookup);
  } else if (mode == "slurm") {
    e = from_slurm(lookup);
  } else if (mode == "auto") {
    if (is_set(lookup, "WORLD_SIZE")) {
      e = from_torchrun(lookup);
    } else if (is_set(lookup, "SLURM_PROCID") && is_set(lookup, "SLURM_STEP_NUM_TASKS")) {
      e = from_slurm(lookup);
    } else if (is_set(lookup, "RANK") && std::string(lookup("RANK")) != "0") {
      // Rank 3 of an unknown world would train alone, as if it were the whole job.
      throw Error(str("distributed: environment variable RANK is ", lookup("RANK"),
                      " but WORLD_SIZE is not set (a torchrun-style launch sets both; distributed.mode: off trains "
                      "as one process whatever they say)"));
    }
  } else if (mode != "off") {
    throw Error(str("distributed.mode: expected one of auto|torchrun|slurm|off, got '", mode, "'"));
  }
  read_job_id(lookup, &e);
  read_secret(lookup, &e);
  e.host = hostname();
  return e;
}

DistEnv read_env(const std::string& mode) {
  return read_env(mode, [](const char* name) -> const char* { return std::getenv(name); });
}

std::vector<std::string> expand_nodelist(const std::string& list) {
  if (list.empty()) throw Error("empty host list");
  // Split at the commas outside brackets.
  std::vector<std::string> names;
  int depth = 0;
  std::string cur;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) throw Error(str("unbalanced brackets in host list '", list, "'"));
    if (c == ',' && depth == 0) {
      names.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) throw Error(str("unbalanced brackets in host list '", list, "'"));
  names.push_back(cur);

  std::vector<std::string> hosts;
  for (const std::string& name : names) {
    if (name.empty()) throw Error(str("empty host name in host list '", list, "'"));
    std::vector<std::string> partial = {""};
    size_t i = 0;
    while (i < name.size()) {
      const size_t open = name.find('[', i);
      const std::string literal = name.substr(i, open == std::string::npos ? std::string::npos : open - i);
      for (std::string& p : partial) p += literal;
      if (open == std::string::npos) break;
      const size_t close = name.find(']', open);
      const std::string body = name.substr(open + 1, close - open - 1);
      if (body.empty()) throw Error(str("empty brackets in host list '", list, "'"));
      const std::vector<std::string> values = expand_ranges(body, list);
      if ((double)hosts.size() + (double)partial.size() * (double)values.size() > (double)kMaxHosts)
        too_many_hosts(list);
      std::vector<std::string> next;
      for (const std::string& p : partial)
        for (const std::string& v : values) next.push_back(p + v);
      partial.swap(next);
      i = close + 1;
    }
    hosts.insert(hosts.end(), partial.begin(), partial.end());
  }
  return hosts;
}

std::string hostname() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "unknown-host";
  return buf;
}

int pick_device(int local_rank, int local_world_size, int visible) {
  if (visible < 1) throw Error(str("distributed: local rank ", local_rank, " sees no GPU"));
  if (visible == 1) return 0;
  if (local_rank < visible) return local_rank;
  throw Error(str("distributed: local rank ", local_rank, " (of ", local_world_size, " on this host) sees only ",
                  visible, " GPUs; run one process per GPU, or bind one GPU per task (srun --gpus-per-task=1)"));
}

}  // namespace tt::distributed
