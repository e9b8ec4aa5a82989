// Episode -> prefix tree (issue 16): root = the instruction; an observation node per step (one
// slot of `tokens_per_frame` image-token rows per camera frame, then one state-token row when the
// episode has state); step t's action tokens are a leaf off its last observation node, so no
// step sees a later frame or any step's ground-truth action. Each step is one path (its own
// training sample): instruction, its observation history, its action; the loss is on the action
// tokens only (the first is predicted by the observation's last row, a branch point).
//
// History: `window` 0 is the full history (the steps' contexts are prefixes of each other: a
// comb); window W > 0 shows step t the instruction and observations t-W+1..t, so contexts stop
// being prefixes and the tree branches where they differ (a trie over the observation sequence).
// A frame is identified by (episode, step, camera): the tree lists each once (Tree::media.frames)
// however many observation nodes show it (window histories repeat frames), and media.slots says
// which rows of which node are which frame's slot, so a vision tower runs once per frame and its
// gradient sums over every node that shows it. The state row (media.states) is the observation
// node's last row, after its frames. Actions: continuous ones through ActionBins
// (data/actions.h), discrete ids as they are.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/actions.h"
#include "data/episodes.h"
#include "data/tree.h"

namespace tt::data {

struct EpisodeTreeSpec {
  int tokens_per_frame = 4;  // the tower's tokens per image (196 for a SigLIP-base 224/16)
  int32_t image_token = 0;   // the id in the image slots' rows (their embeddings are replaced)
  int32_t state_token = 1;   // the id of the state row (its embedding comes from the state projection)
  int window = 0;            // 0: full history; W > 0: the last W observations
  // The ids are the model's placeholders: an instruction or a discrete action that uses one (the
  // state id only where the episode has states) is an error. false: stand-ins (stats), unchecked.
  bool check_placeholder_ids = true;
};

// `bins` is required for continuous actions (and ignored for discrete ones). Throws tt::Error
// naming the episode for a bad spec or an action the bins cannot encode.
// The tree carries its frames, slots and state rows in Tree::media.
Tree episode_tree(const Episode& ep, int64_t episode_index, const ActionBins* bins, const EpisodeTreeSpec& spec);

// Every episode of a JSONL file (read_episodes) as its tree, episode index = line order. Continuous
// actions are binned with `bins` bins per dimension fitted on the file's actions, returned in
// *bins_out (dims() == 0 for discrete actions).
std::vector<Tree> read_episode_trees(const std::string& path, int64_t vocab_size, const EpisodeTreeSpec& spec,
                                     int bins, ActionBins* bins_out);

}  // namespace tt::data
