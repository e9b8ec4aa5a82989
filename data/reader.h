// Readers for treetrain's input formats (JSONL, one record per line).
//
// rollouts: {"id": ..., "sequences": [{"tokens": [...], "loss_mask": [...], "weight": 1.0}, ...]}
//   The sequences of a group merge into a prefix tree at token granularity; each node is a maximal
//   shared segment. loss_mask[i] = 1 makes token i a target (predicted from the tokens before it);
//   token 0 is never a target; a missing mask means every token but the first is a target; weight
//   (default 1) multiplies the sequence's token losses.
// tree: {"id": ..., "nodes": [{"parent": -1, "tokens": [...], "loss_mask": [...], "weight": 1.0}, ...]}
//   Nodes already form a tree (node 0 the root, parent an earlier node). A path is each
//   root-to-leaf chain; a node's weight multiplies the losses of that node's targets on every path
//   through it; its loss_mask defaults to all ones (the root's first token is never a target).
//
// Errors (bad JSON, missing or mistyped field, token outside [0, vocab_size), empty sequence or
// node, mask length mismatch, parent not an earlier node) throw tt::Error naming file:line.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tree.h"

namespace tt::data {

enum class Format { kRollouts, kTree };

// "rollouts" | "tree"; throws tt::Error naming `context` for anything else.
Format parse_format(const std::string& name, const std::string& context);

// One JSONL line to a tree. `where` is "file:line" for errors. vocab_size <= 0 skips the range check.
Tree parse_rollouts_line(const std::string& line, const std::string& where, int64_t vocab_size);
Tree parse_tree_line(const std::string& line, const std::string& where, int64_t vocab_size);

// Every tree of a file (blank lines are skipped).
std::vector<Tree> read_trees(const std::string& path, Format format, int64_t vocab_size);

}  // namespace tt::data
