// Hugging Face compatibility probe, driven by scripts/device/hf_parity.py on a machine with
// transformers: `export` writes a freshly initialised model as an HF directory plus the logits we
// compute for a token sequence; `import` loads an HF directory written by transformers and writes
// our logits for the sequence. The script compares both with transformers' own logits.
//
//   hf_parity_tool export DIR ARCH TIED SEED TOKENS OUT   (ARCH qwen3|llama|qwen3_5_text|qwen3_next,
//                                                         TIED 0|1, TOKENS 1,2,3; qwen3_5_text and
//                                                         qwen3_next: 3 GDN : 1 attention)
//   hf_parity_tool import DIR TOKENS OUT
//   hf_parity_tool step DIR TOKENS LR OUTDIR (one AdamW step on the mean token cross entropy, as
//                                          transformers' labels=input_ids; OUTDIR: the HF weights after)
//   hf_parity_tool greedy DIR TOKENS N OUT  (fp64 greedy generation of N tokens with the KV cache,
//                                          eos ignored: OUT gets one JSON line {"tokens": [...],
//                                          "gaps": [top-1 minus top-2 logit at each step]})
// OUT receives the logits (T, V) as little-endian float32 (export, import).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "data/packing.h"
#include "model/decoder.h"
#include "model/generate.h"
#include "model/hf_io.h"
#include "ops/cpu/adamw.h"
#include "base/check.h"

namespace {

std::vector<int32_t> parse_tokens(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  return out;
}

// One sequence as a single-node tree: a plain causal batch.
tt::data::PackedBatch chain(const std::vector<int32_t>& tokens) {
  tt::data::PackedBatch b;
  const int n = (int)tokens.size();
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
  return b;
}

void write_logits(tt::model::Model<double>& m, const tt::data::PackedBatch& b, const std::string& path) {
  const std::vector<double> logits = m.infer(b, tt::model::InferRequest::all_logits()).logits;
  std::vector<float> out(logits.begin(), logits.end());
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(out.data()), (std::streamsize)(out.size() * sizeof(float)));
  if (!f) throw tt::Error(tt::str(path, ": cannot write logits"));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "export" && argc == 8) {
      tt::model::ModelConfig cfg;
      cfg.architecture = argv[3];
      cfg.vocab_size = 96;
      cfg.hidden_size = 64;
      cfg.intermediate_size = 160;
      cfg.num_hidden_layers = 2;
      cfg.num_attention_heads = 4;
      cfg.num_key_value_heads = 2;
      cfg.head_dim = 16;
      cfg.rope_theta = 1000000.0;
      cfg.tie_word_embeddings = std::string(argv[4]) == "1";
      cfg.initializer_range = 0.1;
      if (cfg.qwen3_5()) {  // qwen3_5_text, qwen3_next: 3 Gated DeltaNet layers : 1 gated attention
        cfg.num_hidden_layers = 4;
        cfg.layer_types = {"linear_attention", "linear_attention", "linear_attention", "full_attention"};
        cfg.partial_rotary_factor = 0.25;
        cfg.linear_num_key_heads = 2;
        cfg.linear_num_value_heads = 4;
        cfg.linear_key_head_dim = 16;
        cfg.linear_value_head_dim = 16;
        cfg.linear_conv_kernel_dim = 4;
      }
      tt::model::Model<double> m(cfg);
      m.init(std::strtoull(argv[5], nullptr, 10));
      tt::model::save_hf(argv[2], m, "F32");
      // Reload what was written so the logits come from exactly the saved (F32) weights.
      tt::model::load_hf_weights(argv[2], m);
      const auto b = chain(parse_tokens(argv[6]));
      write_logits(m, b, argv[7]);
      return 0;
    }
    if (mode == "import" && argc == 5) {
      tt::model::Model<double> m(tt::model::read_hf_config(argv[2]));
      tt::model::load_hf_weights(argv[2], m);
      const auto b = chain(parse_tokens(argv[3]));
      write_logits(m, b, argv[4]);
      return 0;
    }
    if (mode == "greedy" && argc == 6) {
      tt::model::ModelConfig cfg = tt::model::read_hf_config(argv[2]);
      cfg.eos_token_id.clear();
      tt::model::Model<double> m(cfg);
      tt::model::load_hf_weights(argv[2], m);
      const std::vector<int32_t> prompt = parse_tokens(argv[3]);
      tt::model::SamplingOptions o;
      o.temperature = 0;
      o.max_new_tokens = std::atoi(argv[4]);
      const std::vector<tt::model::Completion> c = tt::model::generate(m, {{"p", prompt}}, o);
      const std::vector<int32_t>& gen = c[0].samples[0].tokens;
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), gen.begin(), gen.end());
      const std::vector<double> logits = m.infer(chain(seq), tt::model::InferRequest::all_logits()).logits;
      const int V = (int)cfg.vocab_size;
      std::ofstream f(argv[5]);
      f << "{\"tokens\": [";
      for (size_t j = 0; j < gen.size(); ++j) f << (j ? ", " : "") << gen[j];
      f << "], \"gaps\": [";
      for (size_t j = 0; j < gen.size(); ++j) {
        const double* row = logits.data() + (prompt.size() + j - 1) * V;
        double top = -1e300, second = -1e300;
        for (int v = 0; v < V; ++v) {
          if (row[v] > top) second = top, top = row[v];
          else if (row[v] > second) second = row[v];
        }
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.17g", top - second);
        f << (j ? ", " : "") << buf;
      }
      f << "]}\n";
      if (!f) throw tt::Error(tt::str(argv[5], ": cannot write"));
      return 0;
    }
    if (mode == "step" && argc == 6) {
      // One training step as transformers takes it with labels = input_ids: the mean cross
      // entropy of tokens[1:], then AdamW (betas 0.9/0.999, eps 1e3, no weight decay, step 1: with
      // eps far above every |g| the update lr g / (|g| + eps) is nearly linear in the gradient).
      tt::model::Model<double> m(tt::model::read_hf_config(argv[2]));
      tt::model::load_hf_weights(argv[2], m);
      const std::vector<int32_t> toks = parse_tokens(argv[3]);
      tt::data::PackedBatch b = chain(toks);
      for (int i = 1; i < (int)toks.size(); ++i) {
        b.tgt_src.push_back(i - 1);
        b.tgt_tok.push_back(toks[i]);
        b.tgt_w.push_back(1.0);
      }
      m.zero_grad();
      m.forward_backward(b, 1.0 / (double)(toks.size() - 1));
      std::vector<double> mom((size_t)m.num_params(), 0.0), vel((size_t)m.num_params(), 0.0);
      tt::cpu::AdamWParams p;
      p.lr = std::strtod(argv[4], nullptr);
      p.beta1 = 0.9;
      p.beta2 = 0.999;
      p.eps = 1e3;
      p.weight_decay = 0;
      p.step = 1;
      tt::cpu::adamw_update(m.params(), m.grads(), mom.data(), vel.data(), m.num_params(), p);
      tt::model::save_hf(argv[5], m, "F32");
      return 0;
    }
    std::cerr << "usage: hf_parity_tool export DIR ARCH TIED SEED TOKENS OUT | import DIR TOKENS OUT | "
                 "greedy DIR TOKENS N OUT | step DIR TOKENS LR OUTDIR\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
