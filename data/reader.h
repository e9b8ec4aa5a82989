// Readers for treetrain's input formats (JSONL, one record per line).
//
// rollouts: {"id": ..., "sequences": [{"tokens": [...], "loss_mask": [...], "weight": 1.0}, ...]}
//   The sequences of a group merge into a prefix tree at token granularity; each node is a maximal
//   shared segment, split where sequences diverge and where a sequence ends inside a longer one
//   (every sequence ends at a node end). loss_mask[i] = 1 makes token i a target (predicted from
//   the tokens before it); token 0 is never a target; a missing mask means every token but the
//   first is a target; weight (default 1, any finite number: RL advantages are negative as often as
//   not) multiplies the sequence's token losses, and the mask alone decides what is a target (a
//   weight of 0 keeps its targets, which count in token_mean's normaliser). Each sequence is
//   one Path, in record order (identical sequences are separate paths). Nodes are numbered in DFS
//   preorder, children in the order the sequences first reach them. Sequences that do not share
//   their first token cannot form one tree: the group becomes one tree per distinct first token,
//   with ids "<id>#0", "<id>#1", ... in order of first appearance (a group with one first token
//   keeps its id).
// tree: {"id": ..., "nodes": [{"parent": -1, "tokens": [...], "loss_mask": [...], "weight": 1.0}, ...]}
//   Nodes already form a tree (node 0 the only root, parent an earlier node). A path is each
//   root-to-leaf chain, in leaf index order; a node's weight (any finite number) multiplies the
//   losses of that node's targets on every path through it; its loss_mask defaults to all ones
//   (the root's first token is never a target).
// tokens: {"id": ..., "tokens": [...], "loss_mask": [...], "weight": 1.0}
//   One long document a line (segment-level training: model/segments.h): a one-path tree, its
//   mask and weight as a rollouts sequence's. Its segments stay together in one micro-batch
//   order (a document is never shuffled apart).
// "id" is optional (a string or an integer; default "file:line"); unknown fields are ignored,
// except a near miss of a field read at that level ("wieght", "loss_masks", "Weight": an error
// naming both) and a weight or loss_mask where that level reads none (a rollouts record's); an
// object that names a key twice is an error.
//
// Errors (bad JSON, missing or mistyped field, token outside [0, vocab_size), empty sequence or
// node, mask length mismatch, mask value other than 0/1 (true/false also accepted), non-finite
// weight, parent not an earlier node, second root) throw tt::Error
// "file:line: <field>: <what was found>, expected <what>".
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tree.h"

namespace tt::data {

enum class Format { kRollouts, kTree, kTokens };

// "rollouts" | "tree" | "tokens"; throws tt::Error naming `context` for anything else.
Format parse_format(const std::string& name, const std::string& context);

// One JSONL line to a tree. `where` is "file:line" for errors. vocab_size <= 0 skips the range
// check (token ids must still lie in [0, 2^31)). parse_rollouts_line throws when the group's
// sequences start with different tokens (several trees); parse_rollouts_trees returns them all.
Tree parse_rollouts_line(const std::string& line, const std::string& where, int64_t vocab_size);
std::vector<Tree> parse_rollouts_trees(const std::string& line, const std::string& where, int64_t vocab_size);
Tree parse_tree_line(const std::string& line, const std::string& where, int64_t vocab_size);
Tree parse_tokens_line(const std::string& line, const std::string& where, int64_t vocab_size);

// Every tree of a file, in file order (blank lines are skipped; a rollouts group whose sequences
// start with different tokens gives several trees). A file without records is an error.
std::vector<Tree> read_trees(const std::string& path, Format format, int64_t vocab_size);

}  // namespace tt::data
