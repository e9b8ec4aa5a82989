// The decoder loop (see decoder.h): architecture, buffers, the training and no-grad forward, and
// the exact reverse.
//
// An Activations buffer is carved (256-byte aligned regions, model/carve.h) into the batch
// metadata first (tokens, pos, subtree_end, node ranges, head rows, targets, logit rows: one host
// image, one copy), the loss, the attention layout and rope storage, the residual stream (B + 1
// buffers in training, block b reading buffer b; two in turn without gradients), each block's
// saved region (one shared region without gradients) and the head's. The decoder's scratch holds
// what one backward (or one head chunk) needs at a time: the residual gradient dx, the Acc sum
// buffer (also the forward's GEMM output before a residual add), the largest block scratch and the
// head chunk. Every buffer grows to the largest batch seen and is then reused.
#include "model/decoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "base/check.h"
#include "model/carve.h"
#include "model/gdn.h"
#include "model/init.h"

namespace tt::model {

Architecture::Architecture(const ModelConfig& cfg) : Architecture(cfg, cfg.layer_specs()) {}

Architecture::Architecture(const ModelConfig& cfg, const std::vector<LayerSpec>& layers) : cfg_(cfg), layers_(layers) {
  cfg_.validate();
  TT_CHECK((int64_t)layers_.size() == cfg_.num_hidden_layers, "model: ", layers_.size(),
           " layer specs for num_hidden_layers = ", cfg_.num_hidden_layers);
  ParamTable::Builder b(table_);
  input_ = std::make_unique<EmbeddingKind>(cfg_, b);
  for (int l = 0; l < (int)layers_.size(); ++l) {
    const LayerSpec& s = layers_[l];
    if (s.mixer == "linear_attention") {
      blocks_.push_back(std::make_unique<GdnKind>(cfg_, l, b));
    } else {
      TT_CHECK(s.mixer == "full_attention", "model: layer ", l, " has mixer '", s.mixer,
               "', expected full_attention or linear_attention");
      blocks_.push_back(std::make_unique<AttentionKind>(cfg_, s, l, b));
    }
    blocks_.push_back(std::make_unique<MlpKind>(cfg_, l, b));
  }
  head_ = std::make_unique<LmHeadKind>(cfg_, input_->weight_offset(), b);
  if (cfg_.vision.enabled()) vision_ = std::make_unique<VisionKind>(cfg_, b);
}

Flops Architecture::flops(const Work& w, Pass p) const {
  Flops f = input_->flops(w, p);
  for (const auto& k : blocks_) f += k->flops(w, p);
  f += head_->flops(w, p);
  if (vision_) f += vision_->flops(w, p);
  return f;
}

std::vector<ParamInfo> param_table(const ModelConfig& cfg) { return Architecture(cfg).table().entries(); }

Work Work::of(const data::PackedBatch& batch) {
  Work w;
  w.tokens = batch.n_tokens;
  w.visible_pairs = batch.visible_pairs;
  std::vector<int32_t> rows(batch.tgt_src.begin(), batch.tgt_src.end());
  std::sort(rows.begin(), rows.end());
  w.head_rows = std::unique(rows.begin(), rows.end()) - rows.begin();
  w.frames = (int64_t)batch.frames.size();
  w.state_rows = (int64_t)batch.state_row.size();
  return w;
}

namespace {

// The one place that turns a layer kind into its block on backend E.
template <class E>
std::unique_ptr<Block<E>> make_block(const LayerKind& k) {
  if (auto* a = dynamic_cast<const AttentionKind*>(&k)) return std::make_unique<BlockOf<AttentionKind, E>>(*a);
  if (auto* m = dynamic_cast<const MlpKind*>(&k)) return std::make_unique<BlockOf<MlpKind, E>>(*m);
  if constexpr (E::kHybridOps)
    if (auto* g = dynamic_cast<const GdnKind*>(&k)) return std::make_unique<BlockOf<GdnKind, E>>(*g);
  if constexpr (E::kVisionOps) {
    if (auto* v = dynamic_cast<const SiglipAttentionKind*>(&k))
      return std::make_unique<BlockOf<SiglipAttentionKind, E>>(*v);
    if (auto* v = dynamic_cast<const SiglipMlpKind*>(&k)) return std::make_unique<BlockOf<SiglipMlpKind, E>>(*v);
  }
  throw Error(str("model: layer kind '", k.kind(), "' has no block on the ", E::kName, " backend"));
}

// The regions of an Activations buffer (see the file comment).
template <class E>
struct ActsLayout {
  // Metadata (one host image, bytes [0, meta_bytes)).
  int32_t* tokens;
  int32_t* pos;
  int32_t* subtree_end;
  int32_t* node_start;
  int32_t* node_len;
  int32_t* node_parent;
  int32_t* head_rows;
  int32_t* tgt_src;  // indexes head_rows; targets stably sorted by it
  int32_t* tgt_tok;
  double* tgt_w;
  double* tgt_c;  // the targets' path counts, the unweighted NLL's weights
  int32_t* logit_rows;
  int32_t* store_rows;
  uint64_t* sample_keys;
  size_t meta_bytes;
  int32_t* sample_tokens;
  double* sample_logprobs;
  double* loss;
  char* layout;
  char* recurrent;  // the recurrent layers' chunk plan (E::plan_recurrent), when the model has any
  char* rope;
  std::vector<char*> xs;
  std::vector<char*> saved;
  char* head_saved;
  size_t total;

  ActsLayout(const Architecture& arch, const std::vector<std::unique_ptr<Block<E>>>& blocks, Mode mode, int N,
             int num_nodes, int n_rows, int n_tgt, int n_logit, int n_store, int n_sample, char* base) {
    const int64_t n = N, C = arch.config().hidden_size;
    Carver c{base};
    tokens = c.take<int32_t>(n);
    pos = c.take<int32_t>(n);
    subtree_end = c.take<int32_t>(n);
    node_start = c.take<int32_t>(num_nodes);
    node_len = c.take<int32_t>(num_nodes);
    node_parent = c.take<int32_t>(num_nodes);
    head_rows = c.take<int32_t>(n_rows);
    tgt_src = c.take<int32_t>(n_tgt);
    tgt_tok = c.take<int32_t>(n_tgt);
    tgt_w = c.take<double>(n_tgt);
    tgt_c = c.take<double>(n_tgt);
    logit_rows = c.take<int32_t>(n_logit);
    store_rows = c.take<int32_t>(n_store);
    sample_keys = c.take<uint64_t>(n_sample);
    meta_bytes = c.bytes();
    sample_tokens = c.take<int32_t>(n_sample);
    sample_logprobs = c.take<double>(n_sample);
    loss = c.take<double>(2);  // sum_t w_t ce_t, sum_t cnt_t ce_t
    layout = c.take_bytes(E::layout_bytes(N));
    recurrent = c.take_bytes(arch.config().has_linear_attention() ? E::recurrent_plan_bytes(N, num_nodes) : 0);
    rope = c.take_bytes(E::rope_bytes(N, (int)arch.config().head_dim));
    const int B = (int)blocks.size();
    const bool train = mode == Mode::kTrain;
    for (int i = 0; i < (train ? B + 1 : 2); ++i) xs.push_back(c.take_bytes(sizeof(typename E::Act) * n * C));
    if (train) {
      for (const auto& b : blocks) saved.push_back(c.take_bytes(b->saved_bytes(N)));
    } else {
      size_t most = 0;
      for (const auto& b : blocks) most = std::max(most, b->saved_bytes(N));
      saved.assign(B, c.take_bytes(most));
    }
    head_saved = c.take_bytes(arch.head().template saved_bytes<E>(N, n_rows, mode));
    total = c.bytes();
  }
};

}  // namespace

template <class E>
Decoder<E>::Decoder(const ModelConfig& cfg, const DecoderOptions& options, const typename E::Options& exec_options)
    : arch_(cfg, options.layers.empty() ? cfg.layer_specs() : options.layers), options_(options), exec_(exec_options) {
  E::check_model(arch_.config());
  TT_CHECK(options_.head_chunk_bytes >= 0, "DecoderOptions: head_chunk_bytes must be >= 0");
  if (options_.head_chunk_bytes == 0) options_.head_chunk_bytes = E::kDefaultHeadChunkBytes;
  for (const auto& k : arch_.blocks()) blocks_.push_back(make_block<E>(*k));
  if (arch_.vision())
    for (const auto& k : arch_.vision()->tower()) vision_blocks_.push_back(make_block<E>(*k));
  const int64_t P = num_params();
  const bool master = !(E::kSeparateWeights && options_.inference);  // an fp32 master copy
  if (master) {
    exec_.ensure(params_, bytes_of(P));
    exec_.zero(params_.data(), bytes_of(P));
  }
  if (!options_.inference) {
    exec_.ensure(grads_, bytes_of(P));
    exec_.zero(grads_.data(), bytes_of(P));
  }
  if (E::kSeparateWeights) {
    exec_.ensure(weights_, sizeof(Weight) * (size_t)P);
    exec_.zero(weights_.data(), sizeof(Weight) * (size_t)P);
  }
  refresh_weights();
  exec_.sync();
}

template <class E>
Decoder<E>::~Decoder() {
  exec_.sync();
}

template <class E>
typename E::Weight* Decoder<E>::weights() {
  if constexpr (E::kSeparateWeights) {
    return reinterpret_cast<Weight*>(weights_.data());
  } else {
    return params();
  }
}

template <class E>
typename E::Param* Decoder<E>::param(const std::string& name) {
  const int i = table().find(name);
  if (i < 0)
    throw Error(str("model: unknown parameter \"", name, "\" for architecture ", config().architecture,
                    config().tie_word_embeddings ? " (tied embeddings)" : ""));
  return params() + table()[i].offset;
}

template <class E>
void Decoder<E>::require_training(const char* what) const {
  TT_CHECK(!options_.inference, "model: ", what, " on an inference-only model (it keeps no gradients",
           E::kSeparateWeights ? " and no fp32 master weights" : "", ")");
}

template <class E>
void Decoder<E>::init(uint64_t seed) {
  typename E::Buffer temp;  // an inference model on the GPU draws into a temporary fp32 copy
  Param* base = params();
  if (!params_.data()) {
    exec_.ensure(temp, bytes_of(num_params()));
    base = reinterpret_cast<Param*>(temp.data());
  }
  for (const ParamInfo& p : params_info()) {
    Param* w = base + p.offset;
    switch (p.role) {
      case ParamRole::kNormWeight: exec_.fill(w, p.numel, 1.0f); break;
      case ParamRole::kZeroNorm:
      case ParamRole::kBias: exec_.fill(w, p.numel, 0.0f); break;
      case ParamRole::kLogDecay: {  // log of uniform (0, 16], from the tensor's own stream
        SplitMix64 rng{param_init_seed(seed, p.name)};
        std::vector<Param> host(p.numel);
        for (Param& x : host) x = (Param)std::log(16.0 * (1.0 - rng.uniform()));
        exec_.upload(w, host.data(), sizeof(Param) * host.size());
        break;
      }
      case ParamRole::kMatrix:
        exec_.init_normal(w, p.numel, param_init_seed(seed, p.name), config().initializer_range);
        break;
    }
  }
  if constexpr (E::kSeparateWeights) exec_.to_weights(weights(), base, num_params());
  exec_.sync();
}

template <class E>
void Decoder<E>::zero_grad() {
  require_training("zero_grad");
  exec_.zero(grads_.data(), bytes_of(num_params()));
}

template <class E>
void Decoder<E>::set_params(const Param* host) {
  if constexpr (E::kSeparateWeights) {
    if (!params_.data()) {  // inference on the GPU: the bf16 weights only
      exec_.upload_weights(weights(), host, num_params());
      return;
    }
  }
  exec_.upload(params_.data(), host, bytes_of(num_params()));
  refresh_weights();
  exec_.sync();
}

template <class E>
std::vector<typename E::Param> Decoder<E>::params_host() const {
  std::vector<Param> out(num_params());
  params_slice_host(0, num_params(), out.data());
  return out;
}

template <class E>
void Decoder<E>::params_slice_host(int64_t offset, int64_t n, Param* dst) const {
  TT_CHECK(offset >= 0 && n >= 0 && offset <= num_params() - n, "params_slice_host: [", offset, ", ", offset, " + ",
           n, ") is outside the ", num_params(), " parameters");
  if constexpr (E::kSeparateWeights) {
    if (!params_.data()) {
      exec_.download_weights(dst, reinterpret_cast<const Weight*>(weights_.data()) + offset, n);
      return;
    }
  }
  exec_.download(dst, params() + offset, bytes_of(n));
}

template <class E>
std::vector<typename E::Param> Decoder<E>::grads_host() const {
  require_training("grads_host");
  std::vector<Param> out(num_params());
  exec_.download(out.data(), grads_.data(), bytes_of(num_params()));
  return out;
}

template <class E>
void Decoder<E>::refresh_weights() {
  if constexpr (E::kSeparateWeights) {
    if (params_.data()) exec_.to_weights(weights(), params(), num_params());
  }
}

template <class E>
void Decoder<E>::ensure_scratch(int N, int R) {
  if (N <= scratch_n_ && R <= scratch_R_) return;
  scratch_n_ = std::max(N, scratch_n_);
  scratch_R_ = std::max(R, scratch_R_);
  const int64_t n = scratch_n_, C = config().hidden_size;
  size_t block = 0;
  for (const auto& b : blocks_) block = std::max(block, b->scratch_bytes(scratch_n_));
  const LmHeadKind& h = arch_.head();
  const size_t head = std::max(h.template scratch_bytes<E>(scratch_R_, Mode::kTrain),
                               h.template scratch_bytes<E>(scratch_R_, Mode::kNoGrad));
  const auto layout = [&](char* base) {
    Carver c{base};
    dx_ = reinterpret_cast<char*>(c.take<Act>(n * C));
    sum_ = reinterpret_cast<char*>(c.take<typename E::Acc>(n * C));
    block_scratch_ = c.take_bytes(block);
    head_scratch_ = c.take_bytes(head);
    return c.bytes();
  };
  exec_.ensure(scratch_, layout(nullptr));
  layout(scratch_.data());
}

template <class E>
BlockCall<E> Decoder<E>::call(const Activations<E>& a, int b) const {
  BlockCall<E> c;
  c.mode = a.mode_;
  c.batch = &a.view_;
  c.w = const_cast<Decoder*>(this)->weights();
  c.g = const_cast<Decoder*>(this)->grads();
  c.saved = a.saved_[b];
  c.scratch = block_scratch_;
  c.dx = reinterpret_cast<Act*>(dx_);
  c.sum = reinterpret_cast<typename E::Acc*>(sum_);
  const int layer = blocks_[b]->spec().layer();
  c.carry = a.carry_ ? &(*a.carry_)[layer] : nullptr;
  return c;
}

template <class E>
HeadCall<E> Decoder<E>::head_call(const Activations<E>& a) const {
  HeadCall<E> h;
  h.mode = a.mode_;
  h.batch = &a.view_;
  h.w = const_cast<Decoder*>(this)->weights();
  h.g = const_cast<Decoder*>(this)->grads();
  h.saved = a.head_saved_;
  h.scratch = head_scratch_;
  h.x = reinterpret_cast<const Act*>(a.xs_[a.mode_ == Mode::kTrain ? blocks_.size() : blocks_.size() % 2]);
  h.dx = reinterpret_cast<Act*>(dx_);
  h.loss = a.loss_;
  h.loss_scale = a.loss_scale_;
  h.chunks = &a.chunks_;
  h.R = a.R_;
  return h;
}

template <class E>
void Decoder<E>::run_forward(const data::PackedBatch& batch, double loss_scale, Mode mode, Activations<E>& a,
                             const Carry<E>* carry, const std::vector<int32_t>* logit_rows, int logit_count,
                             bool want_loss, const CacheWrite<E>* cache, const std::vector<uint64_t>* sample_keys,
                             bool tokens_from_draws, const int32_t* fed_draws, int fed_count) {
  const ModelConfig& cfg = config();
  if (mode == Mode::kTrain) require_training("a training forward");
  data::check_packed_batch(batch, cfg.vocab_size);
  if (!arch_.vision() && (!batch.slot_row.empty() || !batch.state_row.empty()))
    throw Error(str("model: the batch has ", batch.slot_row.size(), " frame slots and ", batch.state_row.size(),
                    " state rows, but the model has no vision section (vision.num_hidden_layers is 0)"));
  if (arch_.vision()) arch_.vision()->check_batch(batch);
  const int L = arch_.num_layers();
  const int N = batch.n_tokens, n_tgt = (int)batch.tgt_src.size(), num_nodes = batch.num_nodes();
  // Every row its own one-token tree: a decode step (the backend may serve it with other kernels).
  bool singletons = num_nodes == N;
  for (int n = 0; singletons && n < num_nodes; ++n) singletons = batch.node_parent[n] < 0;
  TT_CHECK(carry == nullptr || (int)carry->size() == L, "model: a carry of ", carry ? carry->size() : 0,
           " layers, expected one entry per layer (", L, ")");
  if (carry) {
    const int most = E::max_external_kv(singletons);
    for (int l = 0; l < L; ++l)
      TT_CHECK((int)(*carry)[l].kv.size() <= most, "model: layer ", l, " reads ", (*carry)[l].kv.size(),
               " external KV prefixes; the ", E::kName, " attention reads at most ", most,
               singletons ? "" : " (outside a decode batch)");
  }
  TT_CHECK(cache == nullptr || mode == Mode::kNoGrad, "model: a cache write needs a no-grad forward");
  if (cache) {
    TT_CHECK((int)cache->rows.size() == N && (int)cache->k.size() == L && (int)cache->v.size() == L &&
                 (cache->q.empty() || (int)cache->q.size() == L),
             "model: a cache write of ", cache->rows.size(), " rows and ", cache->k.size(), " layers, expected ", N,
             " rows and ", L, " layers");
  }
  const int n_store = cache ? N : 0;
  const int n_sample = sample_keys ? (int)sample_keys->size() : 0;
  TT_CHECK(n_sample == 0 || n_sample == logit_count, "model: ", n_sample, " sampling keys for ", logit_count, " rows");
  if (logit_rows)
    for (int32_t r : *logit_rows) TT_CHECK(r >= 0 && r < N, "model: logits of row ", r, " of a batch of ", N, " rows");

  // Head rows (sources of targets, ascending) and the targets stably sorted by them.
  std::vector<int32_t> head_rows(batch.tgt_src.begin(), batch.tgt_src.end());
  std::sort(head_rows.begin(), head_rows.end());
  head_rows.erase(std::unique(head_rows.begin(), head_rows.end()), head_rows.end());
  const int n_rows = (int)head_rows.size();
  std::vector<int32_t> compact(N, -1);
  for (int r = 0; r < n_rows; ++r) compact[head_rows[r]] = r;
  std::vector<int> order(n_tgt);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return batch.tgt_src[x] < batch.tgt_src[y]; });
  std::vector<int32_t> sorted_src(n_tgt);
  for (int t = 0; t < n_tgt; ++t) sorted_src[t] = compact[batch.tgt_src[order[t]]];
  const int n_logit = logit_rows ? (int)logit_rows->size() : 0;

  a.mode_ = mode;
  a.n_ = N;
  a.n_rows_ = n_rows;
  a.n_tgt_ = n_tgt;
  a.loss_scale_ = loss_scale;
  a.carry_ = carry;
  a.cache_ = cache;
  a.pending_ = mode == Mode::kTrain;
  a.trained_ = mode == Mode::kTrain;
  a.kept_ = false;
  a.loss_backward_ = false;
  const LmHeadKind& head = arch_.head();
  a.R_ = head.template chunk_rows<E>(options_.head_chunk_bytes, std::max({n_rows, logit_count, 1}));
  a.chunks_ = LmHeadKind::plan_chunks(n_rows, a.R_, sorted_src);

  const ActsLayout<E> size(arch_, blocks_, mode, N, num_nodes, n_rows, n_tgt, n_logit, n_store, n_sample, nullptr);
  exec_.ensure(a.buf_, size.total);
  const ActsLayout<E> r(arch_, blocks_, mode, N, num_nodes, n_rows, n_tgt, n_logit, n_store, n_sample, a.buf_.data());
  a.loss_ = r.loss;
  a.xs_ = r.xs;
  a.saved_ = r.saved;
  a.head_saved_ = r.head_saved;
  a.logit_rows_ = n_logit ? r.logit_rows : nullptr;
  a.n_logit_rows_ = n_logit;
  a.store_rows_ = n_store ? r.store_rows : nullptr;
  a.sample_keys_ = n_sample ? r.sample_keys : nullptr;
  a.sample_tokens_ = n_sample ? r.sample_tokens : nullptr;
  a.sample_logprobs_ = n_sample ? r.sample_logprobs : nullptr;
  if (tokens_from_draws) {
    // The draws of the forward before, still where it left them: the same shape carves the same
    // buffer the same way, and this forward's sampling overwrites them only after the embedding.
    TT_CHECK(batch.slot_row.empty() && batch.state_row.empty(),
             "model: tokens_from_draws on a batch with media (frame slots or state rows)");
    TT_CHECK(fed_draws != nullptr && fed_count == N,
             "model: tokens_from_draws needs the forward before to have drawn one token per row of this batch (", N,
             " rows; it drew ", fed_draws ? fed_count : 0, ")");
    TT_CHECK(r.sample_tokens == fed_draws, "model: tokens_from_draws: the forward before drew ", fed_count,
             " tokens, but into the layout of a batch of another shape (the same rows, keys, cache writes and "
             "logit rows are needed)");
  }
  exec_.zero(r.loss, 2 * sizeof(double));
  a.view_ = BatchView<E>{};
  a.view_.N = N;
  if (N == 0) {
    exec_.profile_gap();
    return;
  }

  // The metadata's host image, at the same offsets as on the backend; one copy.
  {
    if (staging_.size() < r.meta_bytes) staging_.resize(r.meta_bytes);
    const ActsLayout<E> img(arch_, blocks_, mode, N, num_nodes, n_rows, n_tgt, n_logit, n_store, n_sample,
                            staging_.data());
    if (!tokens_from_draws) std::copy(batch.tokens.begin(), batch.tokens.end(), img.tokens);
    std::copy(batch.pos.begin(), batch.pos.end(), img.pos);
    std::copy(batch.subtree_end.begin(), batch.subtree_end.end(), img.subtree_end);
    std::copy(batch.node_start.begin(), batch.node_start.end(), img.node_start);
    std::copy(batch.node_len.begin(), batch.node_len.end(), img.node_len);
    std::copy(batch.node_parent.begin(), batch.node_parent.end(), img.node_parent);
    std::copy(head_rows.begin(), head_rows.end(), img.head_rows);
    for (int t = 0; t < n_tgt; ++t) {
      img.tgt_src[t] = sorted_src[t];
      img.tgt_tok[t] = batch.tgt_tok[order[t]];
      img.tgt_w[t] = batch.tgt_w[order[t]];
      img.tgt_c[t] = batch.tgt_cnt.empty() ? 1.0 : (double)batch.tgt_cnt[order[t]];
    }
    if (n_logit) std::copy(logit_rows->begin(), logit_rows->end(), img.logit_rows);
    if (n_store) std::copy(cache->rows.begin(), cache->rows.end(), img.store_rows);
    if (n_sample) std::copy(sample_keys->begin(), sample_keys->end(), img.sample_keys);
    exec_.upload(a.buf_.data(), staging_.data(), r.meta_bytes);
  }
  BatchView<E>& v = a.view_;
  v.tokens = r.tokens;
  if (tokens_from_draws) v.tokens = r.sample_tokens;
  v.pos = r.pos;
  v.layout = exec_.make_layout(N, num_nodes, r.node_start, r.node_len, r.node_parent, r.subtree_end, singletons,
                               r.layout);
  if (cfg.has_linear_attention())
    exec_.plan_recurrent(v.layout, N, num_nodes, batch.node_start.data(), batch.node_len.data(),
                         batch.node_parent.data(), r.node_start, r.node_len, r.node_parent, r.pos, r.subtree_end,
                         r.recurrent);
  v.rope = exec_.make_rope(r.pos, N, (int)cfg.head_dim, cfg.rope_theta, r.rope);
  if constexpr (E::kHybridOps) v.rope.rotary_dim = cfg.rotary_dim() == cfg.head_dim ? 0 : cfg.rotary_dim();
  v.n_rows = n_rows;
  v.head_rows = r.head_rows;
  v.targets.src = r.tgt_src;
  v.targets.tok = r.tgt_tok;
  v.targets.w = r.tgt_w;
  v.targets.n_tgt = n_tgt;
  v.targets.c = r.tgt_c;
  v.targets.c_loss = r.loss + 1;
  ensure_scratch(N, a.R_);

  arch_.input().forward(exec_, v, weights(), reinterpret_cast<Act*>(a.xs_[0]));
  a.vision_frames_ = a.vision_states_ = 0;
  a.vision_moves_ = 0;
  if (arch_.vision()) vision_forward(batch, a, reinterpret_cast<Act*>(a.xs_[0]));
  const int B = (int)blocks_.size();
  for (int b = 0; b < B; ++b) {
    BlockCall<E> c = call(a, b);
    const bool train = mode == Mode::kTrain;
    c.x_in = reinterpret_cast<const Act*>(a.xs_[train ? b : b % 2]);
    c.x_out = reinterpret_cast<Act*>(a.xs_[train ? b + 1 : (b + 1) % 2]);
    if (cache) {
      const int layer = blocks_[b]->spec().layer();
      c.store_k = cache->k[layer];
      c.store_v = cache->v[layer];
      c.store_rows = a.store_rows_;
      if (!cache->q.empty()) c.store_q = cache->q[layer];
      if (!cache->state.empty()) {
        c.store_state = cache->state[layer];
        c.store_conv = cache->conv[layer];
        c.store_slot = &cache->state_slot;
      }
    }
    blocks_[b]->forward(exec_, c);
  }
  HeadCall<E> h = head_call(a);
  if (!want_loss) h.loss = nullptr;
  head.forward(exec_, h);
  exec_.profile_gap();
}

template <class E>
void Decoder<E>::forward(const data::PackedBatch& batch, double loss_scale, Activations<E>& acts,
                         const Carry<E>* carry) {
  run_forward(batch, loss_scale, Mode::kTrain, acts, carry, nullptr, 0, /*want_loss=*/true);
}

template <class E>
void Decoder<E>::backward(Activations<E>& a, const Carry<E>* relay, const GradReadyFn& on_ready, bool with_loss,
                          bool again) {
  require_training("backward");
  if constexpr (E::kBackwardConsumesSaved) {
    TT_CHECK(a.pending_ || a.kept_, "model: backward() without a preceding training forward() on these activations "
             "(or after a backward that did not keep them: again = false)");
  } else {
    TT_CHECK(a.trained_ && a.mode_ == Mode::kTrain,
             "model: backward() without a preceding training forward() on these activations");
  }
  if constexpr (E::kHeadGradInForward) {  // the forward took the loss's head gradient once
    TT_CHECK(with_loss ? !a.loss_backward_ : a.loss_backward_, "model: on the ", E::kName,
             " backend (the head's gradient is taken in forward) a forward's activations get exactly one backward "
             "with the loss, before any without it");
  }
  const int L = arch_.num_layers();
  TT_CHECK(relay == nullptr || (int)relay->size() == L, "model: relayed carry gradients for ",
           relay ? relay->size() : 0, " layers, expected one entry per layer (", L, ")");
  a.pending_ = false;
  a.kept_ = again;
  a.loss_backward_ = a.loss_backward_ || with_loss;
  const ParamTable& t = table();
  if (a.n_ == 0) {
    if (on_ready) on_ready(0, t.size());
    return;
  }
  const LmHeadKind& head = arch_.head();
  if (with_loss) {
    head.backward(exec_, head_call(a));
  } else {
    exec_.zero(dx_, sizeof(Act) * (size_t)a.n_ * (size_t)config().hidden_size);
  }
  if (on_ready) on_ready(head.params().begin, head.params().end);
  int layer_end = 0;  // the end of the current layer's parameter slices
  for (int b = (int)blocks_.size() - 1; b >= 0; --b) {
    BlockCall<E> c = call(a, b);
    c.x_in = reinterpret_cast<const Act*>(a.xs_[b]);
    const int layer = blocks_[b]->spec().layer();
    c.relay = relay ? &(*relay)[layer] : nullptr;
    c.keep_saved = again;
    if (b + 1 == (int)blocks_.size() || blocks_[b + 1]->spec().layer() != layer)
      layer_end = blocks_[b]->spec().params().end;
    blocks_[b]->backward(exec_, c);
    // A decoder layer's gradients are final once its first block's backward is enqueued.
    if (on_ready && (b == 0 || blocks_[b - 1]->spec().layer() != layer))
      on_ready(blocks_[b]->spec().params().begin, layer_end);
  }
  if (arch_.vision()) {  // reads and clears the media rows of dx
    if (again) {
      vision_stash(a);  // the last backward runs the stage once, on the sum
    } else {
      vision_backward(a);
    }
  }
  arch_.input().backward(exec_, a.view_, grads(), reinterpret_cast<const Act*>(dx_));
  exec_.profile_gap();
  if (on_ready) on_ready(arch_.input().params().begin, arch_.input().params().end);
  if (on_ready && arch_.vision()) on_ready(arch_.vision()->begin(), arch_.vision()->end());
}

template <class E>
void Decoder<E>::vision_forward(const data::PackedBatch& batch, Activations<E>& a, Act* x0) {
  if constexpr (E::kVisionOps) {
    const VisionKind& vk = *arch_.vision();
    a.vision_frames_ = (int)batch.frames.size();
    a.vision_moves_ = batch.media_slot_rows();
    a.vision_stashed_ = false;
    a.vision_states_ = (int)batch.state_row.size();
    if (a.vision_moves_ == 0 && a.vision_states_ == 0) return;
    exec_.ensure(a.vision_buf_, vk.bytes<E>(vision_blocks_, a.mode_, a.vision_frames_, a.vision_moves_,
                                            a.vision_states_));
    VisionCall<E> c;
    c.mode = a.mode_;
    c.w = weights();
    c.tower = &vision_blocks_;
    c.x = x0;
    c.tower_view = &a.vision_view_;
    exec_.begin_vision();
    vk.forward(exec_, c, batch, a.vision_buf_.data());
    exec_.end_vision();
  } else {
    (void)batch, (void)a, (void)x0;
    throw Error(str("model: the vision stage has no ", E::kName, " kernels yet"));
  }
}

template <class E>
VisionCall<E> Decoder<E>::vision_grad_call(Activations<E>& a) {
  VisionCall<E> c;
  c.mode = Mode::kTrain;
  c.w = weights();
  c.g = grads();
  c.tower = &vision_blocks_;
  c.dx = reinterpret_cast<Act*>(dx_);
  c.tower_view = &a.vision_view_;
  return c;
}

template <class E>
void Decoder<E>::vision_stash(Activations<E>& a) {
  if constexpr (E::kVisionOps) {
    if (a.vision_moves_ == 0 && a.vision_states_ == 0) return;
    const size_t bytes = sizeof(Acc) * (size_t)(a.vision_moves_ + a.vision_states_) * (size_t)config().hidden_size;
    if (!a.vision_stashed_) {
      exec_.ensure(a.vision_stash_, bytes);
      exec_.zero(a.vision_stash_.data(), bytes);
      a.vision_stashed_ = true;
    }
    const VisionCall<E> c = vision_grad_call(a);
    arch_.vision()->stash_grad(exec_, c, a.vision_buf_.data(), a.vision_frames_, a.vision_moves_, a.vision_states_,
                               reinterpret_cast<Acc*>(a.vision_stash_.data()));
  } else {
    (void)a;
  }
}

template <class E>
void Decoder<E>::vision_backward(Activations<E>& a) {
  if constexpr (E::kVisionOps) {
    if (a.vision_moves_ == 0 && a.vision_states_ == 0) return;
    const VisionCall<E> c = vision_grad_call(a);
    if (a.vision_stashed_) {  // the earlier backwards' media-row gradients (again = true)
      arch_.vision()->unstash_grad(exec_, c, a.vision_buf_.data(), a.vision_frames_, a.vision_moves_,
                                   a.vision_states_, reinterpret_cast<const Acc*>(a.vision_stash_.data()));
      a.vision_stashed_ = false;
    }
    exec_.begin_vision();
    arch_.vision()->backward(exec_, c, a.vision_buf_.data(), a.vision_frames_, a.vision_moves_, a.vision_states_);
    exec_.end_vision();
  } else {
    (void)a;
  }
}

template <class E>
double Decoder<E>::loss(const Activations<E>& a) const {
  return losses(a).loss;
}

template <class E>
Losses Decoder<E>::losses(const Activations<E>& a) const {
  if (a.n_ == 0 || !a.loss_) return Losses{};
  double sums[2] = {0, 0};
  exec_.download(sums, a.loss_, sizeof sums);
  return Losses{a.loss_scale_ * sums[0], sums[1]};
}

template <class E>
double Decoder<E>::enqueue_losses(const Activations<E>& a, double* host) {
  host[0] = host[1] = 0;
  if (a.n_ == 0 || !a.loss_) return 0;
  exec_.download_async(host, a.loss_, 2 * sizeof(double));
  return a.loss_scale_;
}

template <class E>
Carry<E> Decoder<E>::export_carry(const Activations<E>& a) const {
  TT_CHECK(a.trained_ && a.mode_ == Mode::kTrain && a.n_ > 0,
           "model: export_carry needs a training forward of a non-empty batch on these activations");
  Carry<E> out(arch_.num_layers());
  for (size_t b = 0; b < blocks_.size(); ++b)
    blocks_[b]->export_carry(a.saved_[b], a.n_, out[blocks_[b]->spec().layer()]);
  return out;
}

namespace {
// f(block) summed over the blocks of decoder layer `layer`.
template <class E, class F>
int64_t layer_sum(const std::vector<std::unique_ptr<Block<E>>>& blocks, int layer, F f) {
  int64_t n = 0;
  for (const auto& b : blocks)
    if (b->spec().layer() == layer) n += f(*b);
  return n;
}
}  // namespace

template <class E>
int64_t Decoder<E>::recurrent_state_elems(int layer) const {
  return layer_sum(blocks_, layer, [](const Block<E>& b) { return b.spec().recurrent_state_elems(); });
}

template <class E>
int64_t Decoder<E>::conv_context_elems(int layer) const {
  return layer_sum(blocks_, layer, [](const Block<E>& b) { return b.spec().conv_context_elems(); });
}

template <class E>
int64_t Decoder<E>::carry_row_elems(int layer) const {
  return layer_sum(blocks_, layer, [](const Block<E>& b) { return b.carry_row_elems(); });
}

template <class E>
double Decoder<E>::forward(const data::PackedBatch& batch, double loss_scale) {
  forward(batch, loss_scale, own_, nullptr);
  return loss(own_);
}

template <class E>
void Decoder<E>::backward(const GradReadyFn& on_ready) {
  backward(own_, nullptr, on_ready);
}

template <class E>
double Decoder<E>::forward_backward(const data::PackedBatch& batch, double loss_scale, const GradReadyFn& on_ready) {
  forward(batch, loss_scale, own_, nullptr);
  backward(own_, nullptr, on_ready);
  return loss(own_);
}

namespace {

// The packed rows a request reads logits or draws from (all: every row, left empty).
std::vector<int32_t> request_rows(const data::PackedBatch& batch, const InferRequest& req, bool& all) {
  std::vector<int32_t> rows;
  all = false;
  switch (req.rows) {
    case InferRequest::Rows::kNone: break;
    case InferRequest::Rows::kAll: all = true; break;
    case InferRequest::Rows::kTargets:
      rows.assign(batch.tgt_src.begin(), batch.tgt_src.end());
      std::sort(rows.begin(), rows.end());
      rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
      break;
    case InferRequest::Rows::kList: rows = req.list; break;
  }
  return rows;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

template <class E>
InferResult Decoder<E>::infer(const data::PackedBatch& batch, const InferRequest& req, const Carry<E>* carry,
                              const CacheWrite<E>* cache) {
  TT_CHECK(in_flight_n_ == 0, "model: infer() with ", in_flight_n_, " forwards in flight; infer_collect() them first");
  if (req.sample) {
    infer_enqueue(batch, req, carry, cache);
    return infer_collect();
  }
  TT_CHECK(!req.tokens_from_draws, "model: tokens_from_draws needs a request that samples");
  last_draws_ = nullptr;
  bool all = false;
  std::vector<int32_t> rows = request_rows(batch, req, all);
  const auto t0 = std::chrono::steady_clock::now();
  const int count = all ? batch.n_tokens : (int)rows.size();
  run_forward(batch, 1.0, Mode::kNoGrad, infer_acts_, carry, all || rows.empty() ? nullptr : &rows, count, req.loss,
              cache);
  InferResult out;
  if (req.loss) {
    out.enqueue_s = seconds_since(t0);
    const Losses l = losses(infer_acts_);
    out.loss = l.loss;
    out.nll_sum = l.nll_sum;
  }
  const int N = batch.n_tokens;
  if (all) {
    rows.resize(N);
    std::iota(rows.begin(), rows.end(), 0);
  }
  if (!rows.empty() && N > 0) {
    const int V = arch_.head().vocab();
    out.logits.resize(rows.size() * (size_t)V);
    HeadCall<E> h = head_call(infer_acts_);
    arch_.head().logits(exec_, h, all ? nullptr : infer_acts_.logit_rows_, (int)rows.size(), out.logits.data());
    exec_.profile_gap();
  }
  out.rows = std::move(rows);
  return out;
}

template <class E>
void Decoder<E>::infer_enqueue(const data::PackedBatch& batch, const InferRequest& req, const Carry<E>* carry,
                               const CacheWrite<E>* cache) {
  TT_CHECK(req.sample, "model: infer_enqueue takes a request that samples (InferRequest::sample)");
  TT_CHECK(in_flight_n_ < kMaxInFlight, "model: ", kMaxInFlight, " forwards in flight; infer_collect() one first");
  bool all = false;
  std::vector<int32_t> rows = request_rows(batch, req, all);
  const auto t0 = std::chrono::steady_clock::now();
  const int N = batch.n_tokens;
  const int count = all ? N : (int)rows.size();
  TT_CHECK((int)req.keys.size() == count, "model: infer samples ", count, " rows with ", req.keys.size(), " keys");
  // The last draws are taken (or passed over) once: whatever happens below, no later forward
  // reads them (a failed forward may have enqueued its own sampling over them).
  const int32_t* fed = last_draws_;
  const int fed_count = last_draws_ ? last_draw_count_ : 0;
  last_draws_ = nullptr;
  last_draw_count_ = 0;
  run_forward(batch, 1.0, Mode::kNoGrad, infer_acts_, carry, all || rows.empty() ? nullptr : &rows, count, req.loss,
              cache, &req.keys, req.tokens_from_draws, fed, fed_count);
  InFlight& f = in_flight_[(in_flight_first_ + in_flight_n_) % kMaxInFlight];
  f.count = N > 0 ? count : 0;
  f.loss = req.loss && N > 0;
  exec_.ensure_pinned(f.host, f.loss_at() + 2 * sizeof(double));
  const Activations<E>& a = infer_acts_;
  if (f.count > 0) {
    HeadCall<E> h = head_call(a);
    arch_.head().sample(exec_, h, all ? nullptr : a.logit_rows_, count, req.temperature, a.sample_keys_,
                        a.sample_tokens_, a.sample_logprobs_);
    exec_.download_async(f.host.data(), a.sample_tokens_, sizeof(int32_t) * (size_t)f.count);
    exec_.download_async(f.host.data() + f.logprobs_at(), a.sample_logprobs_, sizeof(double) * (size_t)f.count);
  }
  if (f.loss) exec_.download_async(f.host.data() + f.loss_at(), a.loss_, 2 * sizeof(double));
  exec_.record(f.done);
  exec_.profile_gap();
  if (all) {
    rows.resize(N);
    std::iota(rows.begin(), rows.end(), 0);
  }
  f.rows = std::move(rows);
  last_draws_ = f.count > 0 ? a.sample_tokens_ : nullptr;
  last_draw_count_ = f.count;
  f.enqueue_s = seconds_since(t0);
  ++in_flight_n_;
}

template <class E>
void Decoder<E>::infer_abandon() noexcept {
  try {
    exec_.sync();
  } catch (...) {  // a backend error is the caller's to see on its next call
  }
  for (InFlight& f : in_flight_) f.rows.clear();
  in_flight_first_ = in_flight_n_ = 0;
  last_draws_ = nullptr;
  last_draw_count_ = 0;
}

template <class E>
InferResult Decoder<E>::infer_collect() {
  TT_CHECK(in_flight_n_ > 0, "model: infer_collect() with no forward in flight");
  InFlight& f = in_flight_[in_flight_first_];
  exec_.wait(f.done);
  InferResult out;
  out.tokens.resize(f.count);
  out.logprobs.resize(f.count);
  if (f.count > 0) {
    std::memcpy(out.tokens.data(), f.host.data(), sizeof(int32_t) * (size_t)f.count);
    std::memcpy(out.logprobs.data(), f.host.data() + f.logprobs_at(), sizeof(double) * (size_t)f.count);
  }
  if (f.loss) {
    double sums[2];
    std::memcpy(sums, f.host.data() + f.loss_at(), sizeof sums);
    out.loss = sums[0];  // infer's loss scale is 1
    out.nll_sum = sums[1];
  }
  out.rows = std::move(f.rows);
  out.enqueue_s = f.enqueue_s;
  in_flight_first_ = (in_flight_first_ + 1) % kMaxInFlight;
  --in_flight_n_;
  return out;
}

template <class E>
std::vector<int32_t> Decoder<E>::saved_head_rows(const Activations<E>& a) const {
  std::vector<int32_t> rows(a.n_rows_);
  if (a.n_rows_) exec_.download(rows.data(), a.view_.head_rows, sizeof(int32_t) * rows.size());
  return rows;
}

template <class E>
std::vector<double> Decoder<E>::saved_logits(const Activations<E>& a) const {
  TT_CHECK(a.trained_, "model: saved_logits needs a training forward on these activations");
  if (a.n_rows_ == 0) return {};
  return arch_.head().saved_logits(exec_, head_call(a));
}

template <class E>
double Decoder<E>::grad_sum_squares() {
  require_training("grad_sum_squares");
  return exec_.sum_squares(grads(), num_params());
}

template <class E>
MemoryEstimate estimate_training_memory(const ModelConfig& cfg, int64_t tokens, const DecoderOptions& options) {
  const Architecture arch(cfg, options.layers.empty() ? cfg.layer_specs() : options.layers);
  std::vector<std::unique_ptr<Block<E>>> blocks;
  for (const auto& k : arch.blocks()) blocks.push_back(make_block<E>(*k));
  const int64_t P = arch.table().num_params();
  MemoryEstimate m;
  m.weights = P * (int64_t)sizeof(typename E::Param) + (E::kSeparateWeights ? P * (int64_t)sizeof(typename E::Weight) : 0);
  m.grads = P * (int64_t)sizeof(typename E::Param);
  const int N = (int)std::min<int64_t>(tokens, INT32_MAX);
  const ActsLayout<E> acts(arch, blocks, Mode::kTrain, N, N, N, N, 0, 0, 0, nullptr);
  size_t scratch = 0;
  for (const auto& b : blocks) scratch = std::max(scratch, b->scratch_bytes(N));
  const int64_t chunk = options.head_chunk_bytes > 0 ? options.head_chunk_bytes : E::kDefaultHeadChunkBytes;
  const int R = arch.head().template chunk_rows<E>(chunk, std::max(N, 1));
  const int64_t C = cfg.hidden_size;
  m.activations = (int64_t)acts.total + (int64_t)scratch +
                  (int64_t)arch.head().template scratch_bytes<E>(R, Mode::kTrain) +
                  N * C * (int64_t)(sizeof(typename E::Act) + sizeof(typename E::Acc));
  if constexpr (E::kVisionOps) {
    if (const VisionKind* vk = arch.vision()) {
      // The media stage at its largest for N rows: every row in a frame slot, each slot its own
      // frame (per_path packing), a state row per observation; and a part of a frame at either end
      // (a segment piece of one path: data::plan_segments cuts slots at its boundaries; a piece of
      // a tree whose branches cross the next boundary inside slots shows one more a branch, not
      // counted here), and the media rows' stashed gradients (segment columns, backward's again).
      std::vector<std::unique_ptr<Block<E>>> tower;
      for (const auto& k : vk->tower()) tower.push_back(make_block<E>(*k));
      const int slots = N / vk->tokens_per_frame();
      m.activations +=
          (int64_t)vk->bytes<E>(tower, Mode::kTrain, slots + 2, N, vk->state_dim() > 0 ? slots : 0) +
          N * C * (int64_t)sizeof(typename E::Acc);
    }
  }
  return m;
}

template MemoryEstimate estimate_training_memory<CpuExec<float>>(const ModelConfig&, int64_t, const DecoderOptions&);
template MemoryEstimate estimate_training_memory<CpuExec<double>>(const ModelConfig&, int64_t, const DecoderOptions&);
template MemoryEstimate estimate_training_memory<CudaExec>(const ModelConfig&, int64_t, const DecoderOptions&);

template class Decoder<CpuExec<float>>;
template class Decoder<CpuExec<double>>;
template class Decoder<CudaExec>;

}  // namespace tt::model
