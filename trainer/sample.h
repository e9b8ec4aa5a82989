// `treetrain sample`: generation from a checkpoint (model/generate.h), prompts and completions
// as JSONL.
//
//   treetrain sample --checkpoint DIR --prompts FILE [--max-new-tokens N] [--temperature T]
//                    [--top-p P] [--num-samples K] [--seed S] [--stop ID,...] [--device auto|cpu|cuda]
//                    [--set KEY=VALUE ...] [--out FILE]
//
// DIR: a Hugging Face layout directory (config.json + model.safetensors, F32 or BF16: a run's
// checkpoint folder, or a model transformers wrote), or a run_dir (its newest checkpoint). The
// model is loaded for inference only (on the GPU its bf16 weights and nothing else).
// FILE: one prompt a line, {"id": ..., "tokens": [...]} ("id" a string or integer, default
// "file:line"). Output (FILE or stdout, one line per prompt, in order):
//   K = 1: {"id", "tokens" (generated), "logprobs", "finish_reason"}
//   K > 1: a rollouts line {"id", "sequences": [{"tokens": prompt + generated, "loss_mask": 0 on
//          the prompt and 1 on the generated tokens, "weight": 1.0 (for the user's reward or
//          advantage), "logprobs", "finish_reason"}, ...]} that `treetrain train` reads as it is
//          (data.format: rollouts: the K sequences share the prompt and form one tree).
// --set keys: model.max_position_embeddings, model.eos_token_id (ids, comma-separated; empty for
// none), sample.max_batch_tokens (cache rows per group of prompts), segments.length, .tail,
// .long_range.layers, .long_range.heads, .long_range.retrieve.
// Segments: a checkpoint of a run trained with a segments section (its config.yaml) generates
// with the same segment operator (model/segments.h: prefill segment by segment, decode inside
// the open segment, a new segment every segments.length tokens), on the CPU so far; --set can
// turn segments on for any model (segments.length) or change them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/generate.h"
#include "model/segment_config.h"

namespace tt::trainer {

struct SampleCommand {
  std::string checkpoint;
  std::string prompts;
  std::string out;  // empty: stdout
  std::string device = "auto";
  model::SamplingOptions sampling;  // eos comes from the model's config
  std::vector<std::string> sets;
};

// Runs the command; returns the number of prompts. Throws tt::Error naming the file, line or flag.
int64_t run_sample(const SampleCommand& cmd);

// The HF directory DIR names (itself, or a run_dir's newest checkpoint).
std::string resolve_checkpoint(const std::string& dir);
// config.json of HF directory `dir`, with its weights' names and shapes checked against it from
// the safetensors headers (model::check_hf_weight_shapes): what sample, eval and serve read first,
// so weights of other shapes are named before anything of config.json's sizes is allocated or
// estimated.
model::ModelConfig read_checkpoint_config(const std::string& dir);
// An inference-only model of `cfg` (read_checkpoint_config) holding the weights of HF directory
// `dir` (on the GPU, its bf16 weights only): what sample, eval and serve run. E: CpuExec<float> or
// CudaExec.
template <class E>
std::unique_ptr<model::Decoder<E>> load_inference_model(const model::ModelConfig& cfg, const std::string& dir);
// data.history of the run that wrote checkpoint `dir` (its config.yaml): the window, 0 for the full
// history or for a directory without a config.yaml (a model transformers wrote).
int checkpoint_history_window(const std::string& dir);
// The segments section of the run that wrote checkpoint `dir` (off without a config.yaml).
model::SegmentConfig checkpoint_segments(const std::string& dir);
// Reads the prompts JSONL; errors name file:line (a token id >= vocab_size among them, when given).
std::vector<model::Prompt> read_prompts(const std::string& path, int64_t vocab_size = 0);
// The output lines (see the file comment), each ending in a newline.
std::string completions_jsonl(const std::vector<model::Prompt>& prompts, const std::vector<model::Completion>& done,
                              int num_samples);

}  // namespace tt::trainer
