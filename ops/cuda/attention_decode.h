// The attention primitive's decode mode, CUDA: a batch whose every row is its own one-token tree
// (a decode step: one new token per sequence). Row i attends to the external KV prefixes whose
// query range holds it, in list order, then to its own key; any number of prefixes (a shared
// prompt's cache rows visible to all of its samples, each sample's own generated rows visible to
// its row). The same function as ops/cuda/attention.h (and ops/cpu/attention.h) on such a batch:
// scale = 1 / sqrt(HS), grouped-query heads (query head h reads KV head h / (NH / NKV)), lse the
// natural log of the softmax denominator. Forward only: no gradients (prefix dk/dv are ignored).
//
// Work split (flash-decoding): each prefix is cut into chunks of keys and its rows into groups;
// a block computes one (chunk, row group, KV head)'s partial softmax (max, sum, weighted values
// for every query head of the group, on tensor cores) with the keys staged once in shared memory
// for all the group's rows; a second kernel merges a row's partials with its own key. Where every
// row group's partials fit one thread-block cluster (a batch-1 step up to ~2k context), the
// group's blocks merge them among themselves through distributed shared memory instead: one
// kernel, no partials in global memory (see cluster_size below).
// Memory-bound: every key row of a prefix is read once per row group.
//
// Launched with programmatic dependent launch (ops/cuda/kernel_util.cuh): the prefixes' K/V and
// the work tables are read before the wait for the previous kernel, so no kernel of the same
// chain may write them (a decode step stores its new rows outside the prefixes it reads; the
// tables are written by stream copies, which PDL does not overlap, and every forward starts with
// an ordinarily launched kernel).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "ops/cuda/attention.h"
#include "ops/cuda/bf16.h"
#include "ops/cuda/workspace.h"

namespace tt::cuda {

// Device bytes attention_decode_forward needs for this call's shapes and prefixes.
size_t attention_decode_workspace_bytes(const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS);

// out (N, NH, HS), lse (N, NH) overwritten; q (N, NH, HS); k, v (N, NKV, HS) the rows' own keys;
// ext[0..n_ext) as in attention.h (len >= 0, q ranges within [0, N)). HS 64, 128 or 256. Builds and
// uploads its work tables on every call (see AttentionDecodePlan to build them once per batch).
void attention_decode_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const ExternalKV* ext,
                              int n_ext, int N, int NH, int NKV, int HS, Workspace ws, cudaStream_t stream);

// Qwen3's q/k norm and RoPE in front of the attention (rmsnorm.h's qk_norm_rope_pair, the same
// values bit for bit): q (N, NH, HS) and k (N, NKV, HS) are written from q_pre and k_pre with
// their rstd, and with store_rows each row's k and v rows also go to row store_rows[n] of store_k
// and store_v (the KV cache). Taken only by clustered plans (cluster_size() > 0), where the
// cluster's blocks normalize their own rows and the first block of each stores them: one kernel
// fewer a layer.
struct DecodeQkNorm {
  bf16* q = nullptr;             // (N, NH, HS) out
  float* q_rstd = nullptr;       // (N NH) out
  const bf16* q_pre = nullptr;   // (N, NH, HS)
  const bf16* q_w = nullptr;     // (HS)
  bf16* k = nullptr;             // (N, NKV, HS) out
  float* k_rstd = nullptr;       // (N NKV) out
  const bf16* k_pre = nullptr;   // (N, NKV, HS)
  const bf16* k_w = nullptr;     // (HS)
  const float2* rope_cs = nullptr;  // (N, HS / 2), rope_table
  float eps = 0.f;
  float w_offset = 0.f;  // the norm's scale is w + w_offset
  bf16* store_k = nullptr;  // (rows, NKV, HS), with store_v and store_rows (N); null: no cache stores
  bf16* store_v = nullptr;
  const int32_t* store_rows = nullptr;
};

// The work tables of a decode step depend only on the shapes and the prefixes' lengths and query
// ranges, which every layer of a batch shares (only the prefixes' K/V pointers differ). A plan
// builds them on the host and uploads them once (build), then each layer's forward reuses them
// and passes its prefix pointers in the kernel's parameters (up to kDecodeByValue prefixes; more
// go through a table in the workspace, uploaded per call). No stream synchronisation happens
// between the layers of a step.
constexpr int kDecodeByValue = 96;
class AttentionDecodePlan {
 public:
  AttentionDecodePlan();
  ~AttentionDecodePlan();
  AttentionDecodePlan(AttentionDecodePlan&&) noexcept;
  AttentionDecodePlan& operator=(AttentionDecodePlan&&) noexcept;
  // Whether the plan holds the tables of these shapes, lengths and query ranges.
  bool matches(const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS) const;
  // Builds the tables for these arguments on the host (the prefix pointers are not kept).
  void make(const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS);
  // After make(): the size of the thread-block clusters that merge each row group's partials in
  // place (no merge kernel), or 0 when the merge kernel runs. Clustered when every row's partials
  // come from prefixes of one query range, the ranges (of prefixes holding keys) pairwise equal or
  // disjoint and covering every row, and a row group's chunks number at most 16 (8 where the device
  // cannot co-schedule more) with chunks of at most 128 keys: a batch-1 step up to ~2k context, a
  // batch of short separate prompts.
  int cluster_size() const;
  // Device bytes of the tables, and of the per-call workspace (partials; the pointer table past
  // kDecodeByValue prefixes), after make().
  size_t table_bytes() const;
  size_t workspace_bytes() const;
  // Copies the tables to `tables` (device, at least table_bytes()), enqueued on stream; the plan
  // then refers to them (keep them alive and unchanged while it is used).
  void upload(void* tables, cudaStream_t stream);
  struct Impl;

 private:
  friend void attention_decode_forward(bf16*, float*, const bf16*, const bf16*, const bf16*, const ExternalKV*, int,
                                       int, int, int, int, const AttentionDecodePlan&, Workspace, cudaStream_t);
  friend void attention_decode_forward(bf16*, float*, const DecodeQkNorm&, const bf16*, const ExternalKV*, int,
                                       int, int, int, int, const AttentionDecodePlan&, Workspace, cudaStream_t);
  std::unique_ptr<Impl> impl_;
};

// attention_decode_forward with a plan built for the same shapes, lengths and query ranges
// (checked), whose tables are on the device.
void attention_decode_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const ExternalKV* ext,
                              int n_ext, int N, int NH, int NKV, int HS, const AttentionDecodePlan& plan, Workspace ws,
                              cudaStream_t stream);

// attention_decode_forward of the rows that `norm` normalizes (q and k are its outputs; v as
// above). The plan must be clustered (checked).
void attention_decode_forward(bf16* out, float* lse, const DecodeQkNorm& norm, const bf16* v, const ExternalKV* ext,
                              int n_ext, int N, int NH, int NKV, int HS, const AttentionDecodePlan& plan, Workspace ws,
                              cudaStream_t stream);

}  // namespace tt::cuda
