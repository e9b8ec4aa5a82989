// Readers for the rollouts and tree JSONL formats (see reader.h for the formats and contracts).
//
// Rollouts merge into a compressed prefix trie built top-down: a work item is a set of sequences
// that agree on their first d tokens and on token d; its node extends while they all continue
// with the same token and none ends, and the rest splits by the next token into children (in the
// order the sequences come in the record). Items are processed from a stack, so nodes are numbered
// in DFS preorder: parent[i] < i, and DFS order equals index order. Every token of every sequence
// is visited once per node it lies in, so building costs O(n_flat).
//
// Unknown fields of a record are ignored (real datasets carry rewards, metadata, ...), except a
// near miss of a field read there or a misplaced weight or mask (check_field_names): those would
// silently train without the mask or the weight. Duplicate keys are an error (base/json.h).
#include "data/reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <initializer_list>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>

#include "base/check.h"
#include "base/files.h"
#include "base/json.h"
#include "base/parallel.h"

namespace tt::data {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& where, const std::string& msg) { throw Error(where + ": " + msg); }

// The fields each level of a record reads (reader.h).
using FieldList = std::initializer_list<const char*>;
constexpr FieldList kRolloutsRecord = {"id", "sequences"}, kTreeRecord = {"id", "nodes"},
                    kTokensRecord = {"id", "tokens", "loss_mask", "weight"},
                    kSequence = {"tokens", "loss_mask", "weight"}, kNode = {"parent", "tokens", "loss_mask", "weight"};

// Edit distance (insertions, deletions, substitutions, adjacent swaps) between a and b, compared
// case-insensitively (a case change costs nothing); stops counting past 3.
int edit_distance(const std::string& a, const std::string& b) {
  if (a.size() > b.size() + 3 || b.size() > a.size() + 3) return 4;
  const auto lower = [](char c) { return (char)std::tolower((unsigned char)c); };
  std::vector<std::vector<int>> d(a.size() + 1, std::vector<int>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = (int)i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = (int)j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      const int cost = lower(a[i - 1]) != lower(b[j - 1]);
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1]))
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The fields of obj (`name`: its record path, e.g. "sequences[2]") that `read` does not hold are
// ignored, except where that would silently drop a mask or a weight: a near miss of a field read
// here (loss_mask within 2 edits, weight within 1, any field by case alone: "wieght", "Weight",
// "loss_masks"), and a weight or loss_mask at a level that does not read one (a rollouts record's
// "weight" weighs nothing; each sequence's does). Errors name both. "idx", "uid", "reward", "tokens"
// beside sequences stay metadata.
void check_field_names(const json& obj, FieldList read, const std::string& name, const std::string& where) {
  auto listed = [&](const std::string& key) {
    for (const char* f : read)
      if (key == f) return true;
    return false;
  };
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string& key = it.key();
    if (listed(key)) continue;
    if (key == "weight" || key == "loss_mask") {
      std::string fields;
      for (const char* f : read) fields += str(fields.empty() ? "" : ", ", f);
      fail(where, str(name, ": field \"", key, "\" is not read here (", name, " reads ", fields,
                      "); give it where it applies, e.g. to each sequence or node"));
    }
    for (const char* f : read) {
      const std::string field = f;
      const int within = field == "loss_mask" ? 2 : field == "weight" ? 1 : 0;
      if (edit_distance(key, field) <= within)
        fail(where, str(name, ": unknown field \"", key, "\"; did you mean \"", field,
                        "\"? (other unknown fields are ignored; this one is a near miss of a field the format reads)"));
    }
  }
}

json parse_object(const std::string& line, const std::string& where) {
  json rec;
  try {
    rec = parse_json_strict(line);
  } catch (const json::exception& e) {
    fail(where, str("invalid JSON (", e.what(), "), expected one JSON object per line"));
  } catch (const Error& e) {
    fail(where, e.what());
  }
  if (!rec.is_object()) fail(where, str("expected a JSON object, got ", rec.type_name()));
  return rec;
}

// "id" is optional (defaults to `where`); a string, or an integer written as its digits.
std::string parse_id(const json& rec, const std::string& where) {
  auto it = rec.find("id");
  if (it == rec.end()) return where;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number_integer()) return it->dump();
  fail(where, str("id: expected a string or an integer, got ", it->type_name()));
}

// An integer JSON value as int64; values above INT64_MAX (stored unsigned) clamp to INT64_MAX,
// which every range check rejects.
int64_t as_int64(const json& v) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > (uint64_t)std::numeric_limits<int64_t>::max())
    return std::numeric_limits<int64_t>::max();
  return v.get<int64_t>();
}

// obj["tokens"]: a non-empty array of integer ids in [0, vocab_size) (or [0, 2^31) when
// vocab_size <= 0). `name` is the record path of obj, e.g. "sequences[2]".
std::vector<int32_t> parse_tokens(const json& obj, const std::string& name, const std::string& where,
                                  int64_t vocab_size) {
  auto it = obj.find("tokens");
  if (it == obj.end()) fail(where, str(name, ": missing field \"tokens\" (expected an array of token ids)"));
  if (!it->is_array()) fail(where, str(name, ".tokens: expected an array of token ids, got ", it->type_name()));
  if (it->empty()) fail(where, str(name, ".tokens is empty, expected at least one token"));
  std::vector<int32_t> out;
  out.reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const json& v = (*it)[i];
    if (!v.is_number_integer())
      fail(where, str(name, ".tokens[", i, "]: expected an integer token id, got ", v.type_name(), " ", v.dump()));
    const int64_t t = as_int64(v);
    if (vocab_size > 0 && (t < 0 || t >= vocab_size))
      fail(where, str(name, ".tokens[", i, "] = ", v.dump(), " is outside the vocabulary, expected a token id in [0, ",
                      vocab_size, ")"));
    if (t < 0 || t > std::numeric_limits<int32_t>::max())
      fail(where, str(name, ".tokens[", i, "] = ", v.dump(), ", expected a token id in [0, 2^31)"));
    out.push_back((int32_t)t);
  }
  return out;
}

// obj["loss_mask"]: n values, each 0 or 1 (true/false also accepted); missing means all ones.
std::vector<uint8_t> parse_mask(const json& obj, const std::string& name, const std::string& where, size_t n) {
  auto it = obj.find("loss_mask");
  if (it == obj.end()) return std::vector<uint8_t>(n, 1);
  if (!it->is_array()) fail(where, str(name, ".loss_mask: expected an array of 0/1, got ", it->type_name()));
  if (it->size() != n)
    fail(where, str(name, ".loss_mask has ", it->size(), " entries, expected ", n, " (one per token)"));
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    const json& v = (*it)[i];
    if (v.is_boolean()) {
      out[i] = v.get<bool>() ? 1 : 0;
    } else if (v.is_number_integer() && (v.get<int64_t>() == 0 || v.get<int64_t>() == 1)) {
      out[i] = (uint8_t)v.get<int64_t>();
    } else {
      fail(where, str(name, ".loss_mask[", i, "] = ", v.dump(), ", expected 0 or 1"));
    }
  }
  return out;
}

// obj["weight"]: any finite number (negative for RL advantages, 0 for a path that only counts in
// the normaliser); missing means 1.
double parse_weight(const json& obj, const std::string& name, const std::string& where) {
  auto it = obj.find("weight");
  if (it == obj.end()) return 1.0;
  if (!it->is_number()) fail(where, str(name, ".weight: expected a number, got ", it->type_name()));
  double w = it->get<double>();
  if (!std::isfinite(w)) fail(where, str(name, ".weight = ", w, ", expected a finite number"));
  // Weights scale fp32 losses and gradients: one past fp32's range would be inf there.
  if (std::fabs(w) > (double)std::numeric_limits<float>::max())
    fail(where, str(name, ".weight = ", it->dump(), ", expected a number within fp32's range (|weight| <= 3.4e38)"));
  return w;
}

// The array field `key` of the record, required and non-empty.
const json& parse_array_field(const json& rec, const char* key, const char* expected, const std::string& where) {
  auto it = rec.find(key);
  if (it == rec.end()) fail(where, str("missing field \"", key, "\" (expected an array of ", expected, ")"));
  if (!it->is_array()) fail(where, str(key, ": expected an array of ", expected, ", got ", it->type_name()));
  if (it->empty()) fail(where, str(key, " is empty, expected at least one entry"));
  return *it;
}

// One rollouts sequence: tokens, per-token mask (mask[0] forced to 0) and weight.
struct Sequence {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  double weight = 1.0;
};

// Merges sequences that all start with the same token into one tree (see the file comment).
Tree build_trie(const std::vector<Sequence>& seqs, const std::vector<int>& members, std::string id) {
  Tree tree;
  tree.id = std::move(id);
  std::vector<int> end_node(seqs.size(), -1);

  struct Item {
    int parent;
    size_t depth;  // tokens shared before this node
    std::vector<int> members;
  };
  std::vector<Item> stack;
  stack.push_back({-1, 0, members});
  while (!stack.empty()) {
    Item item = std::move(stack.back());
    stack.pop_back();
    const int node_index = (int)tree.nodes.size();
    const Sequence& ref = seqs[item.members[0]];
    // All members have a token at `depth` and agree on it; extend while they continue alike.
    size_t end = item.depth + 1;
    for (;; ++end) {
      bool stop = false;
      for (int s : item.members) {
        const auto& t = seqs[s].tokens;
        if (t.size() == end || t[end] != ref.tokens[end]) {
          stop = true;
          break;
        }
      }
      if (stop) break;
    }
    Node node;
    node.parent = item.parent;
    node.tokens.assign(ref.tokens.begin() + item.depth, ref.tokens.begin() + end);
    node.target_weight.assign(end - item.depth, 0.0);
    node.target_count.assign(end - item.depth, 0);
    // Children keyed by their first token, in the order the sequences reach them.
    std::vector<Item> children;
    std::unordered_map<int32_t, size_t> child_of_token;
    for (int s : item.members) {
      const Sequence& seq = seqs[s];
      for (size_t j = item.depth; j < end; ++j) {
        if (seq.mask[j]) {
          node.target_weight[j - item.depth] += seq.weight;
          node.target_count[j - item.depth] += 1;
        }
      }
      if (seq.tokens.size() == end) {
        end_node[s] = node_index;
        continue;
      }
      auto [it, inserted] = child_of_token.emplace(seq.tokens[end], children.size());
      if (inserted) children.push_back({node_index, end, {}});
      children[it->second].members.push_back(s);
    }
    tree.nodes.push_back(std::move(node));
    // Reverse push: the first child is popped (and numbered) first, giving DFS preorder.
    for (auto c = children.rbegin(); c != children.rend(); ++c) stack.push_back(std::move(*c));
  }

  for (int s : members) {
    const Sequence& seq = seqs[s];
    Path path;
    path.end_node = end_node[s];
    path.target_weight.resize(seq.tokens.size());
    path.target_mask.resize(seq.tokens.size());
    for (size_t j = 0; j < seq.tokens.size(); ++j) {
      path.target_weight[j] = seq.mask[j] ? seq.weight : 0.0;
      path.target_mask[j] = j > 0 && seq.mask[j] ? 1 : 0;
    }
    tree.paths.push_back(std::move(path));
  }
  return tree;
}

}  // namespace

Format parse_format(const std::string& name, const std::string& context) {
  if (name == "rollouts") return Format::kRollouts;
  if (name == "tree") return Format::kTree;
  if (name == "tokens") return Format::kTokens;
  throw Error(str(context, ": unknown data format '", name, "', expected \"rollouts\", \"tree\" or \"tokens\""));
}

Tree parse_tokens_line(const std::string& line, const std::string& where, int64_t vocab_size) {
  const json rec = parse_object(line, where);
  check_field_names(rec, kTokensRecord, "record", where);
  std::vector<Sequence> seq(1);
  seq[0].tokens = parse_tokens(rec, "record", where, vocab_size);
  seq[0].mask = parse_mask(rec, "record", where, seq[0].tokens.size());
  seq[0].mask[0] = 0;  // nothing predicts the document's first token
  seq[0].weight = parse_weight(rec, "record", where);
  return build_trie(seq, {0}, parse_id(rec, where));
}

std::vector<Tree> parse_rollouts_trees(const std::string& line, const std::string& where, int64_t vocab_size) {
  const json rec = parse_object(line, where);
  check_field_names(rec, kRolloutsRecord, "record", where);
  std::string id = parse_id(rec, where);
  const json& arr = parse_array_field(rec, "sequences", "{tokens, loss_mask, weight} objects", where);
  std::vector<Sequence> seqs(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const std::string name = str("sequences[", i, "]");
    if (!arr[i].is_object())
      fail(where, str(name, ": expected an object {tokens, loss_mask, weight}, got ", arr[i].type_name()));
    check_field_names(arr[i], kSequence, name, where);
    seqs[i].tokens = parse_tokens(arr[i], name, where, vocab_size);
    seqs[i].mask = parse_mask(arr[i], name, where, seqs[i].tokens.size());
    seqs[i].mask[0] = 0;  // nothing predicts a sequence's first token
    seqs[i].weight = parse_weight(arr[i], name, where);
  }
  // One tree per distinct first token, in order of first appearance.
  std::vector<std::vector<int>> groups;
  std::unordered_map<int32_t, size_t> group_of_token;
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto [it, inserted] = group_of_token.emplace(seqs[i].tokens[0], groups.size());
    if (inserted) groups.emplace_back();
    groups[it->second].push_back((int)i);
  }
  std::vector<Tree> trees;
  for (size_t g = 0; g < groups.size(); ++g)
    trees.push_back(build_trie(seqs, groups[g], groups.size() == 1 ? id : str(id, "#", g)));
  return trees;
}

Tree parse_rollouts_line(const std::string& line, const std::string& where, int64_t vocab_size) {
  std::vector<Tree> trees = parse_rollouts_trees(line, where, vocab_size);
  if (trees.size() != 1)
    fail(where, str("the sequences start with ", trees.size(),
                    " different tokens, expected one shared first token (parse_rollouts_trees and read_trees "
                    "split such a group into one tree per first token)"));
  return std::move(trees[0]);
}

Tree parse_tree_line(const std::string& line, const std::string& where, int64_t vocab_size) {
  const json rec = parse_object(line, where);
  check_field_names(rec, kTreeRecord, "record", where);
  Tree tree;
  tree.id = parse_id(rec, where);
  const json& arr = parse_array_field(rec, "nodes", "{parent, tokens, loss_mask, weight} objects", where);
  const int n = (int)arr.size();
  std::vector<std::vector<uint8_t>> masks(n);
  std::vector<double> weights(n);
  tree.nodes.resize(n);
  for (int i = 0; i < n; ++i) {
    const std::string name = str("nodes[", i, "]");
    const json& obj = arr[i];
    if (!obj.is_object())
      fail(where, str(name, ": expected an object {parent, tokens, loss_mask, weight}, got ", obj.type_name()));
    check_field_names(obj, kNode, name, where);
    auto pit = obj.find("parent");
    if (pit == obj.end())
      fail(where, str(name, ": missing field \"parent\" (expected an earlier node index, or -1 for the root)"));
    if (!pit->is_number_integer())
      fail(where, str(name, ".parent: expected an integer node index, got ", pit->type_name(), " ", pit->dump()));
    const int64_t parent = as_int64(*pit);
    if (i == 0 && parent != -1) fail(where, str(name, ".parent = ", pit->dump(), ", expected -1 (node 0 is the root)"));
    if (i > 0 && parent == -1)
      fail(where, str(name, " is a second root (parent -1), expected exactly one root, node 0"));
    if (i > 0 && (parent < 0 || parent >= i))
      fail(where, str(name, ".parent = ", pit->dump(), ", expected an earlier node index in [0, ", i, ")"));
    Node& node = tree.nodes[i];
    node.parent = (int)parent;
    node.tokens = parse_tokens(obj, name, where, vocab_size);
    masks[i] = parse_mask(obj, name, where, node.tokens.size());
    weights[i] = parse_weight(obj, name, where);
  }
  masks[0][0] = 0;  // nothing predicts the root's first token

  // Paths are the root-to-leaf chains, one per leaf, in leaf index order. leaves[i] counts the
  // leaves under node i (children have larger indices, so one backward pass accumulates them).
  std::vector<int64_t> leaves(n, 0);
  std::vector<bool> has_child(n, false);
  for (int i = 1; i < n; ++i) has_child[tree.nodes[i].parent] = true;
  for (int i = n - 1; i >= 0; --i) {
    if (!has_child[i]) leaves[i] = 1;
    if (i > 0) leaves[tree.nodes[i].parent] += leaves[i];
  }
  for (int i = 0; i < n; ++i) {
    Node& node = tree.nodes[i];
    const size_t len = node.tokens.size();
    node.target_weight.resize(len);
    node.target_count.resize(len);
    for (size_t j = 0; j < len; ++j) {
      node.target_weight[j] = masks[i][j] ? (double)leaves[i] * weights[i] : 0.0;
      node.target_count[j] = masks[i][j] ? (int32_t)leaves[i] : 0;
    }
    if (has_child[i]) continue;
    Path path;
    path.end_node = i;
    std::vector<int> chain;
    for (int c = i; c >= 0; c = tree.nodes[c].parent) chain.push_back(c);
    for (auto c = chain.rbegin(); c != chain.rend(); ++c) {
      for (uint8_t m : masks[*c]) {
        path.target_weight.push_back(m ? weights[*c] : 0.0);
        path.target_mask.push_back(m && !path.target_mask.empty() ? 1 : 0);  // token 0 is never a target
      }
    }
    tree.paths.push_back(std::move(path));
  }
  return tree;
}

std::vector<Tree> read_trees(const std::string& path, Format format, int64_t vocab_size) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(str("data file '", path, "' is a folder, expected a JSONL file"));
  std::ifstream in(path);
  if (!in) throw Error(str("cannot open data file '", path, "'"));
  std::vector<Tree> trees;
  // Lines are parsed in batches of up to 64 MiB on the host's threads (parsing is the slow part),
  // their trees appended in line order; an error is the first bad line's, as one line at a time.
  std::vector<std::string> lines;
  std::vector<int64_t> numbers;
  size_t bytes = 0;
  auto parse_batch = [&] {
    std::vector<std::vector<Tree>> out(lines.size());
    parallel_for((int64_t)lines.size(), [&](int64_t i) {
      const std::string where = str(path, ":", numbers[i]);
      if (format == Format::kRollouts) out[i] = parse_rollouts_trees(lines[i], where, vocab_size);
      else if (format == Format::kTokens) out[i].push_back(parse_tokens_line(lines[i], where, vocab_size));
      else out[i].push_back(parse_tree_line(lines[i], where, vocab_size));
    });
    for (std::vector<Tree>& ts : out)
      for (Tree& t : ts) trees.push_back(std::move(t));
    lines.clear();
    numbers.clear();
    bytes = 0;
  };
  std::string line;
  // A line that cannot be read: the lines before it first (an error there comes first).
  auto next_line = [&](int64_t lineno) {
    try {
      return read_line(in, line, path, lineno, "one JSON object");
    } catch (...) {
      parse_batch();
      throw;
    }
  };
  for (int64_t lineno = 1; next_line(lineno); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    bytes += line.size();
    lines.push_back(std::move(line));
    numbers.push_back(lineno);
    if (bytes >= ((size_t)64 << 20)) parse_batch();
  }
  parse_batch();
  if (in.bad()) throw Error(str("error reading data file '", path, "'"));
  if (trees.empty()) throw Error(str(path, ": no records, expected one JSON object per line"));
  return trees;
}

}  // namespace tt::data
