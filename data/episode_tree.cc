// Episode -> prefix tree (see episode_tree.h).
#include "data/episode_tree.h"

#include <algorithm>
#include <map>
#include <utility>

#include "base/check.h"

namespace tt::data {
namespace {

Node make_node(int parent, std::vector<int32_t> tokens) {
  Node n;
  n.parent = parent;
  n.target_weight.assign(tokens.size(), 0.0);
  n.target_count.assign(tokens.size(), 0);
  n.tokens = std::move(tokens);
  return n;
}

}  // namespace

Tree episode_tree(const Episode& ep, int64_t episode_index, const ActionBins* bins, const EpisodeTreeSpec& spec) {
  const std::string what = str("episode '", ep.id, "'");
  if (spec.tokens_per_frame < 1) throw Error(str(what, ": tokens_per_frame ", spec.tokens_per_frame, ", expected >= 1"));
  if (spec.window < 0) throw Error(str(what, ": history window ", spec.window, ", expected 0 (full) or >= 1"));
  if (ep.instruction.empty()) throw Error(str(what, ": an empty instruction (the tree's root needs a token)"));
  // The placeholder ids mark the rows whose embeddings are replaced (a frame's slot, the state
  // row): an instruction or an action spelled with them would be taken for one.
  const bool has_state = ep.has_state();
  auto check_ids = [&](const std::vector<int32_t>& ids, const std::string& field) {
    if (!spec.check_placeholder_ids) return;
    for (size_t j = 0; j < ids.size(); ++j)
      if (ids[j] == spec.image_token || (has_state && ids[j] == spec.state_token)) {
        const bool image = ids[j] == spec.image_token;
        throw Error(str(what, ": ", field, "[", j, "] is ", ids[j], ", the ", image ? "image" : "state",
                        " placeholder id (vision.", image ? "image_token_index" : "state_token_index",
                        "); expected other ids"));
      }
  };
  check_ids(ep.instruction, "instruction");
  // Continuous actions are the vocabulary's last ids: an instruction token among them would read
  // as an action bin.
  if (bins && bins->dims() > 0)
    for (size_t j = 0; j < ep.instruction.size(); ++j)
      if (ep.instruction[j] >= bins->first_id())
        throw Error(str(what, ": instruction[", j, "] is ", ep.instruction[j], ", one of the continuous actions' ",
                        bins->bins, " bin ids (the vocabulary's last: ", bins->first_id(), "..", bins->vocab_size - 1,
                        "); expected instruction ids below ", bins->first_id(),
                        " (or fewer action bins: data.action_bins)"));
  for (size_t s = 0; s < ep.steps.size(); ++s) check_ids(ep.steps[s].action_ids, str("step ", s, ": action_ids"));
  Tree t;
  TreeMedia& out = t.media;
  out.tokens_per_frame = spec.tokens_per_frame;
  t.id = ep.id;
  t.nodes.push_back(make_node(-1, ep.instruction));
  const int T = (int)ep.steps.size();
  // Frames: one per (step, camera), in step order.
  std::vector<std::vector<int>> frame_of(T);
  for (int s = 0; s < T; ++s)
    for (int c = 0; c < (int)ep.steps[s].images.size(); ++c) {
      frame_of[s].push_back((int)out.frames.size());
      out.frames.push_back({episode_index, s, c, ep.steps[s].images[c], nullptr});
    }
  // The observation node of step s under parent p, made once (the trie: window histories share
  // the nodes of equal observation sequences).
  std::map<std::pair<int, int>, int> obs_node;  // (parent node, step) -> node
  auto observation = [&](int parent, int s) {
    auto it = obs_node.find({parent, s});
    if (it != obs_node.end()) return it->second;
    std::vector<int32_t> toks;
    const int node = (int)t.nodes.size();
    for (int f : frame_of[s]) {
      out.slots.push_back({node, (int)toks.size(), f});
      toks.insert(toks.end(), spec.tokens_per_frame, spec.image_token);
    }
    if (!ep.steps[s].state.empty()) {
      out.states.push_back({node, (int)toks.size(), ep.steps[s].state});
      toks.push_back(spec.state_token);
    }
    t.nodes.push_back(make_node(parent, std::move(toks)));
    obs_node[{parent, s}] = node;
    return node;
  };
  for (int s = 0; s < T; ++s) {
    const int first = spec.window == 0 ? 0 : std::max(0, s - spec.window + 1);
    int node = 0;
    for (int o = first; o <= s; ++o) node = observation(node, o);
    std::vector<int32_t> action;
    if (!ep.steps[s].action_ids.empty()) {
      action = ep.steps[s].action_ids;
    } else {
      if (!bins) throw Error(str(what, ": step ", s, " has a continuous action, but no action bins were given"));
      try {
        action = bins->encode(ep.steps[s].action);
      } catch (const Error& e) {
        throw Error(str(what, ": step ", s, ": ", e.what()));
      }
    }
    const int leaf = (int)t.nodes.size();
    t.nodes.push_back(make_node(node, action));
    Node& a = t.nodes[leaf];
    a.target_weight.assign(a.tokens.size(), 1.0);  // one path through each action token
    a.target_count.assign(a.tokens.size(), 1);
    // The path: its tokens' weights (the action's only).
    int64_t len = (int64_t)a.tokens.size();
    for (int p = node; p >= 0; p = t.nodes[p].parent) len += (int64_t)t.nodes[p].tokens.size();
    Path path;
    path.end_node = leaf;
    path.target_weight.assign(len, 0.0);
    for (size_t j = 0; j < a.tokens.size(); ++j) path.target_weight[len - a.tokens.size() + j] = 1.0;
    t.paths.push_back(std::move(path));
  }
  t.validate();
  return t;
}

std::vector<Tree> read_episode_trees(const std::string& path, int64_t vocab_size, const EpisodeTreeSpec& spec,
                                     int bins, ActionBins* bins_out) {
  const std::vector<Episode> eps = read_episodes(path, vocab_size);
  std::vector<std::vector<float>> actions;
  for (const Episode& ep : eps)
    for (const EpisodeStep& st : ep.steps)
      if (!st.action.empty()) actions.push_back(st.action);
  ActionBins fitted;
  if (!actions.empty()) {
    try {
      fitted = fit_action_bins(actions, vocab_size, bins);
    } catch (const Error& e) {
      throw Error(str(path, ": ", e.what()));
    }
    // The bins are the vocabulary's last ids: a placeholder among them would read as an action.
    const int64_t first_bin = vocab_size - bins;
    const bool has_state = eps.front().has_state();  // read_episodes: the episodes agree
    int32_t top = -1;  // the largest placeholder id the bins must miss
    if (spec.check_placeholder_ids)
      for (const int32_t id : {spec.image_token, has_state ? spec.state_token : spec.image_token})
        if (id < vocab_size) top = std::max(top, id);
    if (top >= first_bin) {
      const int64_t fit = vocab_size - 1 - top;  // bins above every placeholder id (at least 2 make sense)
      std::string fix = fit >= 2 ? str("use at most ", fit, " action bins (data.action_bins)") : "";
      if (first_bin > 0) fix += str(fix.empty() ? "use " : " or ", "placeholder ids below ", first_bin);
      if (fix.empty()) fix = str("use placeholder ids below ", vocab_size - 2, " and fewer action bins");
      throw Error(str(path, ": continuous actions take the last ", bins, " ids of the vocabulary of ", vocab_size, " (",
                      first_bin, "..", vocab_size - 1, "), which include the ",
                      top == spec.image_token ? "image" : "state", " placeholder id ", top, ": ", fix));
    }
  }
  std::vector<Tree> trees;
  trees.reserve(eps.size());
  for (size_t e = 0; e < eps.size(); ++e) {
    try {
      trees.push_back(episode_tree(eps[e], (int64_t)e, actions.empty() ? nullptr : &fitted, spec));
    } catch (const Error& err) {  // "episode 'id': ...": which file
      throw Error(str(path, ": ", err.what()));
    }
  }
  if (bins_out) *bins_out = fitted;
  return trees;
}

}  // namespace tt::data
