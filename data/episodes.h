// Robot and navigation episodes, the VLA data format (issue 16): JSONL, one episode a line:
//   {"id": ..., "instruction": [token ids],
//    "steps": [{"images": ["frames/0001.png", ...], "state": [floats], "action": [floats]}, ...]}
// `images` are PNG or JPEG files relative to the JSONL's folder, one per camera and the same count
// every step; `state` is optional (the same length every step when present); `action` is a
// continuous vector (the same length every step), or `action_ids: [ints]` replaces it for
// discrete actions. read_episodes checks the structure and that every image file exists (it
// decodes none: data/image.h does, per batch); any problem is a tt::Error naming file:line, the
// step and the field, and what was expected (NaN or infinite values included).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace tt::data {

struct EpisodeStep {
  std::vector<std::string> images;  // resolved paths, one per camera
  std::vector<float> state;         // empty: none
  std::vector<float> action;        // continuous actions, or empty
  std::vector<int32_t> action_ids;  // discrete actions, or empty
};

struct Episode {
  std::string id;
  std::vector<int32_t> instruction;
  std::vector<EpisodeStep> steps;
  bool has_state() const {  // the episodes of one file agree (read_episodes)
    for (const EpisodeStep& s : steps)
      if (!s.state.empty()) return true;
    return false;
  }
};

// One line; `where` is "file:line", `dir` the folder image paths are relative to. vocab_size > 0
// bounds the instruction's token ids and the discrete action ids.
Episode parse_episode_line(const std::string& line, const std::string& where, const std::string& dir,
                           int64_t vocab_size);

// Every non-empty line of a file; also checks that all episodes agree on cameras, state length and
// the action kind and length (an error names the first line that differs).
std::vector<Episode> read_episodes(const std::string& path, int64_t vocab_size);

// The folder the generators (treetrain generate --kind toy-episodes | nav-episodes) write an
// episodes file's frames to, beside it and named after it: "<stem>_frames" (data/a.jsonl ->
// "a_frames"), so two datasets generated into one folder keep their own frames. Image paths in
// the file are relative to its folder ("a_frames/0_0.png").
std::string generated_frames_folder(const std::string& jsonl_path);

// The output of a generator: the episodes JSONL at `path` and its frames folder
// (generated_frames_folder), written to temporaries beside them and moved into place by commit(),
// so a generator that fails (or is stopped) leaves an earlier dataset at `path` whole.
class GeneratedEpisodes {
 public:
  explicit GeneratedEpisodes(const std::string& path);
  ~GeneratedEpisodes();  // removes the temporaries unless commit() ran
  GeneratedEpisodes(const GeneratedEpisodes&) = delete;
  GeneratedEpisodes& operator=(const GeneratedEpisodes&) = delete;
  std::ostream& jsonl() { return out_; }
  // Frame (episode e, step t): the name the JSONL records ("<stem>_frames/e_t.png") and the file to
  // write it to now.
  std::string frame_name(int64_t e, int t) const;
  std::string frame_file(const std::string& name) const;
  void commit();

 private:
  std::string path_, tmp_, folder_, tmp_folder_;  // folder_: relative to dir_
  std::filesystem::path dir_;
  std::ofstream out_;
  bool done_ = false;
};

}  // namespace tt::data
