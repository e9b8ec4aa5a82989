// VLA compatibility probe (issue 16), driven by scripts/device/vla_parity.py on a machine with
// transformers: our VLA checkpoints are LlavaForConditionalGeneration checkpoints (the SigLIP
// tower, the LLaVA projector, the decoder as text_config) and transformers' load here.
//
//   vla_parity_tool export DIR SEED TOKENS PIXELS OUT [LAYER]
//                                                       a fresh tiny VLA saved as DIR (HF layout,
//                                                       F32; LAYER: its vision_feature_layer, -1 if
//                                                       absent) and our fp64 logits of the sequence
//   vla_parity_tool import DIR TOKENS PIXELS OUT        our logits from an HF directory
//   vla_parity_tool grad DIR TOKENS PIXELS OUTDIR       the gradient of the mean cross entropy of
//                                                       every non-image next token (transformers'
//                                                       labels with image positions -100), saved as
//                                                       an HF directory of gradients
// TOKENS: ids (1,2,3); each run of tokens_per_frame image_token_index ids is one frame slot, the
// frames in order. PIXELS: (frames, 3, S, S) little-endian float32, as the processor's
// pixel_values. OUT: logits (T, V) as float32.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "base/check.h"
#include "data/packing.h"
#include "model/decoder.h"
#include "model/hf_io.h"

namespace {

std::vector<int32_t> parse_tokens(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  return out;
}

// The sequence as one causal chain whose image-token runs are frame slots; with_targets: every
// next token that is not an image token, weight 1 (the caller scales by 1 / count).
tt::data::PackedBatch chain(const tt::model::ModelConfig& cfg, const std::vector<int32_t>& tokens,
                            const std::string& pixels, bool with_targets) {
  tt::data::PackedBatch b;
  const int n = (int)tokens.size(), P = (int)cfg.vision.tokens_per_frame(), S = (int)cfg.vision.image_size;
  const int32_t image = (int32_t)cfg.vision.image_token_index;
  b.n_tokens = n;
  b.tokens = tokens;
  for (int i = 0; i < n; ++i) {
    b.pos.push_back(i);
    b.subtree_end.push_back(n);
  }
  b.node_start = {0};
  b.node_len = {n};
  b.node_parent = {-1};
  b.tree_start = {0, n};
  b.tokens_per_frame = P;
  for (int i = 0; i < n;) {
    if (tokens[i] != image) {
      ++i;
      continue;
    }
    for (int j = i; j < i + P; ++j)
      TT_CHECK(j < n && tokens[j] == image, "image-token run at ", i, " is shorter than ", P, " tokens");
    b.slot_row.push_back(i);
    b.slot_frame.push_back((int32_t)b.frames.size());
    b.frames.push_back(tt::data::FrameRef{});
    i += P;
  }
  std::ifstream in(pixels, std::ios::binary);
  b.image_size = S;
  b.pixels.resize(b.frames.size() * 3 * (size_t)S * S);
  in.read(reinterpret_cast<char*>(b.pixels.data()), (std::streamsize)(b.pixels.size() * sizeof(float)));
  TT_CHECK(in.gcount() == (std::streamsize)(b.pixels.size() * sizeof(float)), pixels, ": expected ", b.frames.size(),
           " frames of 3 x ", S, " x ", S, " float32 values");
  if (with_targets)
    for (int i = 1; i < n; ++i)
      if (tokens[i] != image) {
        b.tgt_src.push_back(i - 1);
        b.tgt_tok.push_back(tokens[i]);
        b.tgt_w.push_back(1.0);
      }
  return b;
}

void write_logits(tt::model::Model<double>& m, const tt::data::PackedBatch& b, const std::string& path) {
  const std::vector<double> logits = m.infer(b, tt::model::InferRequest::all_logits()).logits;
  std::vector<float> out(logits.begin(), logits.end());
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(out.data()), (std::streamsize)(out.size() * sizeof(float)));
  if (!f) throw tt::Error(tt::str(path, ": cannot write logits"));
}

tt::model::ModelConfig tiny_vla() {
  tt::model::ModelConfig c;
  c.architecture = "qwen3";
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.intermediate_size = 160;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rope_theta = 1000000.0;
  c.initializer_range = 0.1;
  tt::model::VisionConfig& v = c.vision;
  v.hidden_size = 32;
  v.intermediate_size = 48;
  v.num_hidden_layers = 2;
  v.num_attention_heads = 2;
  v.image_size = 8;
  v.patch_size = 4;  // 4 tokens a frame
  v.image_token_index = 95;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "export" && (argc == 7 || argc == 8)) {
      tt::model::ModelConfig cfg = tiny_vla();
      if (argc == 8) cfg.vision.vision_feature_layer = std::stoll(argv[7]);
      cfg.validate();
      tt::model::Model<double> m(cfg);
      m.init(std::stoull(argv[3]));
      tt::model::save_hf(argv[2], m, "F32");
      tt::model::load_hf_weights(argv[2], m);  // what transformers reads: the F32-rounded weights
      write_logits(m, chain(cfg, parse_tokens(argv[4]), argv[5], false), argv[6]);
      return 0;
    }
    if (mode == "import" && argc == 6) {
      tt::model::Model<double> m(tt::model::read_hf_config(argv[2]));
      tt::model::load_hf_weights(argv[2], m);
      write_logits(m, chain(m.config(), parse_tokens(argv[3]), argv[4], false), argv[5]);
      return 0;
    }
    if (mode == "grad" && argc == 6) {
      tt::model::Model<double> m(tt::model::read_hf_config(argv[2]));
      tt::model::load_hf_weights(argv[2], m);
      const tt::data::PackedBatch b = chain(m.config(), parse_tokens(argv[3]), argv[4], true);
      m.zero_grad();
      m.forward(b, 1.0 / (double)b.tgt_src.size());
      m.backward();
      tt::model::save_hf(argv[5], m.config(), m.params_info(), m.grads(), "F32");
      return 0;
    }
    std::cerr << "usage: vla_parity_tool export DIR SEED TOKENS PIXELS OUT [LAYER] | import DIR TOKENS PIXELS OUT | "
                 "grad DIR TOKENS PIXELS OUTDIR\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
