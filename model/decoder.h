// The decoder, written once: input stage -> list of residual blocks -> final norm + LM head,
// generic over the execution backend E (model/exec.h). The CPU reference (Model<T> =
// Decoder<CpuExec<T>>) and the GPU model (CudaModel = Decoder<CudaExec>) are two instances of
// this loop.
//
// Architecture (backend-independent) turns a config into the kinds and the parameter table: the
// token embedding, per layer its mixer (layer_types: full_attention) and its SwiGLU MLP, and the
// head. It also answers the FLOP API (Architecture::flops) that MFU, the load balancer and the
// benchmarks use.
//
// Forward modes (Mode): kTrain saves what backward needs into a caller-owned Activations (so
// several forwards can be alive at once: the chain of partition pieces) and computes the loss;
// kNoGrad (infer()) saves nothing, keeping one block's working set at a time, and returns the loss
// and/or logits of chosen rows. Both read the same carry (external KV prefixes per layer).
//
// Gradient contract: backward() accumulates (+=) into grads(). On a backend with
// kHeadGradInForward (the GPU) the training forward already accumulates the LM head's part, so
// every training forward must be followed by exactly one backward; on the CPU the head's gradient
// is taken in backward and a backward may be repeated on the same activations (adding the same
// gradient again). The batch is copied to the backend by forward(): it need not outlive the call.
//
// Parameters, gradients and (GPU) the bf16 working copy are flat buffers in table order on the
// backend's memory. The trainer, the optimizer and checkpoints read them through the table.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/packing.h"
#include "model/attention.h"
#include "model/block.h"
#include "model/config.h"
#include "model/embedding.h"
#include "model/exec_cpu.h"
#include "model/exec_cuda.h"
#include "model/lm_head.h"
#include "model/mlp.h"
#include "model/param_table.h"
#include "model/vision.h"

namespace tt::model {

// The kinds of a config and its parameter table.
class Architecture {
 public:
  explicit Architecture(const ModelConfig& cfg);  // cfg.layer_specs()
  // A decoder whose layers may differ from what the config alone describes (e.g. layers with and
  // without q/k norm).
  Architecture(const ModelConfig& cfg, const std::vector<LayerSpec>& layers);

  const ModelConfig& config() const { return cfg_; }
  const std::vector<LayerSpec>& layers() const { return layers_; }
  const ParamTable& table() const { return table_; }
  const EmbeddingKind& input() const { return *input_; }
  // Two per decoder layer, in order: the mixer, then the MLP.
  const std::vector<std::unique_ptr<LayerKind>>& blocks() const { return blocks_; }
  const LmHeadKind& head() const { return *head_; }
  // The media stage (vision tower, projector, state projection), or null without vision.
  const VisionKind* vision() const { return vision_.get(); }
  int num_layers() const { return (int)layers_.size(); }
  // Model and executed FLOPs of a batch's work: the sum over the input stage, blocks and head.
  Flops flops(const Work& w, Pass p) const;

 private:
  ModelConfig cfg_;
  std::vector<LayerSpec> layers_;
  ParamTable table_;
  std::unique_ptr<EmbeddingKind> input_;
  std::vector<std::unique_ptr<LayerKind>> blocks_;
  std::unique_ptr<LmHeadKind> head_;
  std::unique_ptr<VisionKind> vision_;
};

// The parameter table of a config (Architecture(cfg).table().entries()).
std::vector<ParamInfo> param_table(const ModelConfig& cfg);

template <class E>
class Decoder;

// The saved activations and batch metadata of one forward, on the backend's memory; reused
// across forwards (the buffer only grows). Move-only.
template <class E>
class Activations {
 public:
  Activations() = default;
  Activations(Activations&&) = default;
  Activations& operator=(Activations&&) = default;
  int n_tokens() const { return n_; }

 private:
  friend class Decoder<E>;
  typename E::Buffer buf_;
  Mode mode_ = Mode::kTrain;
  int n_ = 0, n_rows_ = 0, n_tgt_ = 0;
  int R_ = 1;  // head rows per chunk
  bool pending_ = false;  // a training forward whose backward has not run
  bool trained_ = false;  // a training forward was run on these activations
  bool kept_ = false;     // the last backward left the saved activations intact (again = true)
  bool loss_backward_ = false;  // a backward with the batch's loss ran on these activations
  double loss_scale_ = 1.0;
  const Carry<E>* carry_ = nullptr;
  std::vector<HeadChunk> chunks_;
  BatchView<E> view_;
  double* loss_ = nullptr;
  std::vector<char*> xs_;     // residual stream buffers: training B + 1 (block b reads b), no-grad 2
  std::vector<char*> saved_;  // (B) each block's saved region (no-grad: one shared region)
  char* head_saved_ = nullptr;
  const int32_t* logit_rows_ = nullptr;  // no-grad: the rows whose logits infer() returns
  int n_logit_rows_ = 0;
  const CacheWrite<E>* cache_ = nullptr;  // no-grad: where the attention layers store K/V rows
  const int32_t* store_rows_ = nullptr;   // (N) their rows, on the backend's memory
  // The media stage's region (model/vision.h) and the sizes its last forward had.
  typename E::Buffer vision_buf_;
  int vision_frames_ = 0, vision_states_ = 0;
  int64_t vision_moves_ = 0;  // rows the frame slots cover
  BatchView<E> vision_view_;  // the tower's view of the last forward's frames
  // Backwards with `again` stash the media rows' gradients here (Acc) for the last one, which
  // runs the stage's backward once on their sum (VisionKind::stash_grad).
  typename E::Buffer vision_stash_;
  bool vision_stashed_ = false;
  const uint64_t* sample_keys_ = nullptr;  // no-grad with sampling: (n_logit_rows) keys
  int32_t* sample_tokens_ = nullptr;       // and the draws' outputs
  double* sample_logprobs_ = nullptr;
};

struct DecoderOptions {
  // Bytes of logits one LM-head chunk may hold (0: the backend's default, E::kDefaultHeadChunkBytes).
  int64_t head_chunk_bytes = 0;
  // The layers (empty: the config's layer_specs()).
  std::vector<LayerSpec> layers;
  // Inference only: the weights the ops read and nothing else (on the GPU the bf16 copy: no fp32
  // master weights, no gradients); training calls are errors.
  bool inference = false;
};

// What infer() computes: the loss of the batch's targets and/or the logits of some rows.
struct InferRequest {
  bool loss = true;
  enum class Rows { kNone, kAll, kTargets, kList } rows = Rows::kNone;
  std::vector<int32_t> list;  // with Rows::kList: packed row indices
  // Instead of the rows' logits, a token drawn on the backend from each (ops/cpu/sampling.h:
  // greedy at temperature 0, else the Gumbel-max draw with the row's key) and its log-probability.
  bool sample = false;
  double temperature = 0;
  std::vector<uint64_t> keys;  // (rows) one per row, in row order
  // The batch's tokens are the draws of the forward enqueued before this one, row r's token its
  // draw r: they stay on the backend (Decoder::infer_enqueue). That forward drew one token per row
  // of this batch, of the same shape (a decode step after a decode step); batch.tokens stands in
  // (valid ids, not read).
  bool tokens_from_draws = false;

  // The logits of every packed row, no loss.
  static InferRequest all_logits() { return InferRequest{false, Rows::kAll, {}}; }
};
// What a forward's loss is: loss_scale * sum_t w_t ce_t, and the unweighted NLL sum
// sum_t cnt_t ce_t (cnt_t: the paths that make target t one; divided by the targets over the
// flattened paths, n_flat_targets, it is the mean token NLL, whatever the weights' signs).
struct Losses {
  double loss = 0;
  double nll_sum = 0;
};

struct InferResult {
  double loss = 0;               // loss_scale 1: sum_t w_t ce_t (0 without targets or unrequested)
  double nll_sum = 0;            // sum_t cnt_t ce_t (with the loss)
  std::vector<int32_t> rows;     // the rows whose logits (or draws) follow
  std::vector<double> logits;    // (rows.size(), V), unless the request samples
  std::vector<int32_t> tokens;   // (rows.size()) with sample
  std::vector<double> logprobs;  // (rows.size()) with sample
  double enqueue_s = 0;  // host seconds from the call to the first wait for the backend (GPU: the
                         // launches; what a step costs the host besides waiting)
};

// Gradient readiness (data-parallel overlap, distributed/buckets.h): backward() calls it with a
// half-open range [begin, end) of table indices as soon as every write of that backward to those
// parameters' gradients is enqueued on the backend's stream. Order: the head's slice (the final
// norm and an untied LM head), then each decoder layer's slices (its blocks) from the last layer
// to the first, the input embedding last; every parameter exactly once per backward, also for an
// empty batch. It
// runs on the calling thread between launches: it must only enqueue work, never wait.
using GradReadyFn = std::function<void(int begin, int end)>;

// The losses of several training forwards read with one wait, so that the host goes on to the
// next batch while the device runs one (a loss read waits for everything enqueued before it):
// add() enqueues a forward's two sums into a page-locked slot of its own (slots are allocated once
// and reused: allocating page-locked memory may wait for the device), take() waits once and gives
// each forward's losses in the order added (so sums over them are a loop of losses() calls', bit
// for bit). Decoder::piece_losses() is one the schedulers of pieces share.
template <class E>
class LossReader {
 public:
  void add(Decoder<E>& model, const Activations<E>& acts);  // defined after Decoder
  std::vector<Losses> take(E& e) {
    std::vector<Losses> out;
    if (n_ == 0) return out;
    e.record(fence_);
    e.wait(fence_);
    for (size_t i = 0; i < n_; ++i) {
      const double* sums = reinterpret_cast<const double*>(slots_[i]->host.data());
      out.push_back(Losses{slots_[i]->scale * sums[0], sums[1]});
    }
    n_ = 0;
    return out;
  }
  Losses total(E& e) {  // the sums of take()'s, in order
    Losses l;
    for (const Losses& x : take(e)) l.loss += x.loss, l.nll_sum += x.nll_sum;
    return l;
  }
  void clear() { n_ = 0; }  // drops what was added and not taken

 private:
  struct Slot {
    typename E::PinnedBuffer host;
    double scale = 0;
  };
  std::vector<std::unique_ptr<Slot>> slots_;
  size_t n_ = 0;
  typename E::Fence fence_;
};

template <class E>
class Decoder {
 public:
  using Act = typename E::Act;
  using Acc = typename E::Acc;
  using Param = typename E::Param;
  using Weight = typename E::Weight;

  // Throws tt::Error for a config the backend cannot run (E::check_model).
  explicit Decoder(const ModelConfig& cfg, const DecoderOptions& options = {},
                   const typename E::Options& exec_options = {});
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;
  ~Decoder();

  const ModelConfig& config() const { return arch_.config(); }
  const Architecture& architecture() const { return arch_; }
  const ParamTable& table() const { return arch_.table(); }
  const std::vector<ParamInfo>& params_info() const { return arch_.table().entries(); }
  int64_t num_params() const { return arch_.table().num_params(); }
  E& exec() { return exec_; }
  const E& exec() const { return exec_; }

  bool inference() const { return options_.inference; }

  // Flat buffers (num_params) on the backend's memory, in table order (an inference model on the
  // GPU has neither params() nor grads(): null).
  Param* params() { return reinterpret_cast<Param*>(params_.data()); }
  const Param* params() const { return reinterpret_cast<const Param*>(params_.data()); }
  Param* grads() { return reinterpret_cast<Param*>(grads_.data()); }
  const Param* grads() const { return reinterpret_cast<const Param*>(grads_.data()); }
  Weight* weights();  // what the ops read: params() itself, or its rounded copy
  // The parameter `name` (params() + its offset); throws tt::Error for an unknown name.
  Param* param(const std::string& name);

  // Deterministic initialisation (model/init.h): matrices normal(0, initializer_range), norm
  // weights ones.
  void init(uint64_t seed);
  void zero_grad();
  // Host copies (num_params); set_params also refreshes the working copy. An inference model
  // takes fp32 host values for its weights (rounded to bf16 on the GPU) and returns them widened.
  void set_params(const Param* host);
  std::vector<Param> params_host() const;
  // Parameters [offset, offset + n) into host dst (waits): a device's weights read a piece at a time.
  void params_slice_host(int64_t offset, int64_t n, Param* dst) const;
  std::vector<Param> grads_host() const;
  // Re-derives the working copy after params() changed on the backend (no-op on the CPU).
  void refresh_weights();

  // Training forward on caller-owned activations: saves what backward needs and the loss
  // (loss_scale * sum_t w_t ce_t, read by loss()). carry: one entry per layer of external KV
  // prefixes (null: none); it must stay alive until backward.
  void forward(const data::PackedBatch& batch, double loss_scale, Activations<E>& acts,
               const Carry<E>* carry = nullptr);
  // grads += d(loss)/d(params) of the last training forward on acts; relay: gradients of this
  // batch's own carry rows from readers outside it (export_carry's entries with dk/dv set), or null.
  // with_loss false: the batch's own loss is left out, only the relayed gradients flow back (a
  // segment's truncated-BPTT columns, model/segments.h); on the backends that take the head's
  // gradient in forward (kHeadGradInForward) it must follow the one backward with the loss.
  // again: another backward will run on these activations, so this one leaves them intact (on
  // the GPU the MLP, which takes its gate/up gradients in their saved buffers, recomputes them);
  // the media stage (vision tower, projector, state projection) then takes its gradients once, in
  // the last backward (again = false), from the media rows' gradients of all of them summed.
  void backward(Activations<E>& acts, const Carry<E>* relay = nullptr, const GradReadyFn& on_ready = nullptr,
                bool with_loss = true, bool again = false);
  // loss_scale * sum_t w_t ce_t of the last forward on acts (waits for the backend).
  double loss(const Activations<E>& acts) const;
  // The loss and the unweighted NLL sum of the last forward on acts (one read; waits).
  Losses losses(const Activations<E>& acts) const;
  // The same without waiting: enqueues the copy of the two sums into host[0], host[1] (page-locked
  // memory, E::PinnedBuffer; on the host once a Fence recorded after it has passed) and returns the
  // forward's loss_scale: losses() = {scale * host[0], host[1]}.
  double enqueue_losses(const Activations<E>& acts, double* host);
  // The rows a forward on acts offers to readers outside the batch, per layer (dk/dv null).
  Carry<E> export_carry(const Activations<E>& acts) const;
  // Elements per row of layer l's carry-gradient accumulators (dk and dv each).
  int64_t carry_row_elems(int layer) const;
  // Layer l's recurrent state and conv context elements (LayerKind::recurrent_state_elems; 0, 0
  // for a layer without recurrent state).
  int64_t recurrent_state_elems(int layer) const;
  int64_t conv_context_elems(int layer) const;

  // The pair on the model's own activations.
  double forward(const data::PackedBatch& batch, double loss_scale);  // returns the loss
  void backward(const GradReadyFn& on_ready = nullptr);
  double forward_backward(const data::PackedBatch& batch, double loss_scale, const GradReadyFn& on_ready = nullptr);

  // The rows the LM head ran on in the last forward on acts (sources of targets, ascending), and
  // where the backend keeps them (the CPU), the training forward's logits of those rows
  // (n_rows, V); a tt::Error on a backend that keeps none.
  std::vector<int32_t> saved_head_rows(const Activations<E>& acts) const;
  std::vector<double> saved_logits(const Activations<E>& acts) const;

  // No-grad forward: saves nothing, touches no gradient. carry: external KV prefixes per layer
  // (the inference cache's rows this batch reads); cache: where each attention layer stores the
  // batch's own K/V rows (null: nowhere).
  InferResult infer(const data::PackedBatch& batch, const InferRequest& request, const Carry<E>* carry = nullptr,
                    const CacheWrite<E>* cache = nullptr);
  // infer() of a request that samples, in two halves, so the host prepares and launches the next
  // forward while the backend runs this one: infer_enqueue() returns once the forward and the
  // copies of its draws (and loss) to the host are enqueued; infer_collect() waits for the oldest
  // forward in flight and returns its result. At most kMaxInFlight forwards in flight; infer()
  // with any in flight is an error. The carry and cache write need not outlive infer_enqueue().
  static constexpr int kMaxInFlight = 2;
  void infer_enqueue(const data::PackedBatch& batch, const InferRequest& request, const Carry<E>* carry = nullptr,
                     const CacheWrite<E>* cache = nullptr);
  InferResult infer_collect();
  int in_flight() const { return in_flight_n_; }
  // Waits for the backend and drops every forward in flight and the draws a next forward could
  // take (after an error mid-generation: infer() works again). Never throws.
  void infer_abandon() noexcept;

  // Sum of squares of every gradient, fp64 accumulation (waits for the backend).
  double grad_sum_squares();
  // The loss reader the piece schedulers (partitioned.h, segments.h) use, one call at a time.
  LossReader<E>& piece_losses() { return piece_losses_; }

 private:
  // logit_rows: a no-grad forward's rows for logits() (null: none, or all of them); logit_count:
  // how many rows logits() will take (sizes the head chunk).
  void run_forward(const data::PackedBatch& batch, double loss_scale, Mode mode, Activations<E>& acts,
                   const Carry<E>* carry, const std::vector<int32_t>* logit_rows, int logit_count, bool want_loss,
                   const CacheWrite<E>* cache = nullptr, const std::vector<uint64_t>* sample_keys = nullptr,
                   bool tokens_from_draws = false, const int32_t* fed_draws = nullptr, int fed_count = 0);
  void require_training(const char* what) const;
  // The media stage's forward into the input rows x0, and its backward from the decoder's dx.
  void vision_forward(const data::PackedBatch& batch, Activations<E>& a, Act* x0);
  void vision_backward(Activations<E>& a);
  void vision_stash(Activations<E>& a);
  VisionCall<E> vision_grad_call(Activations<E>& a);  // the media stage's backward on dx
  void ensure_scratch(int N, int R);
  BlockCall<E> call(const Activations<E>& a, int b) const;
  HeadCall<E> head_call(const Activations<E>& a) const;
  static size_t bytes_of(int64_t n) { return sizeof(Param) * (size_t)n; }

  Architecture arch_;
  DecoderOptions options_;
  E exec_;
  std::vector<std::unique_ptr<Block<E>>> blocks_;
  std::vector<std::unique_ptr<Block<E>>> vision_blocks_;  // the tower's blocks (with vision)
  typename E::Buffer params_, weights_, grads_;
  typename E::Buffer scratch_;  // backward's dx and Acc sum, the blocks' and the head's scratch
  int scratch_n_ = -1, scratch_R_ = -1;
  char* dx_ = nullptr;
  char* sum_ = nullptr;
  char* block_scratch_ = nullptr;
  char* head_scratch_ = nullptr;
  std::vector<char> staging_;  // host image of a batch's metadata
  Activations<E> own_;         // forward(batch, scale) / backward()
  Activations<E> infer_acts_;  // infer()'s working set
  // Sampling forwards in flight (infer_enqueue), a ring of kMaxInFlight: the draws' (and the
  // loss's) host copies land in `host` once `done` is passed, tokens at byte 0, logprobs at
  // logprobs_at(), the two loss sums (loss scale 1) after them.
  struct InFlight {
    std::vector<int32_t> rows;
    int count = 0;
    bool loss = false;
    double enqueue_s = 0;
    typename E::PinnedBuffer host;
    typename E::Fence done;
    size_t logprobs_at() const { return (sizeof(int32_t) * (size_t)count + 7) / 8 * 8; }
    size_t loss_at() const { return logprobs_at() + sizeof(double) * (size_t)count; }
  };
  InFlight in_flight_[kMaxInFlight];
  int in_flight_first_ = 0, in_flight_n_ = 0;
  // Where the last forward on infer_acts_ left its draws (null: it drew none) and how many.
  const int32_t* last_draws_ = nullptr;
  int last_draw_count_ = 0;
  LossReader<E> piece_losses_;
};

template <class E>
void LossReader<E>::add(Decoder<E>& model, const Activations<E>& acts) {
  if (n_ == slots_.size()) {  // a slot is kept only once its buffer is allocated
    auto slot = std::make_unique<Slot>();
    model.exec().ensure_pinned(slot->host, 2 * sizeof(double));
    slots_.push_back(std::move(slot));
  }
  Slot& s = *slots_[n_];
  s.scale = model.enqueue_losses(acts, reinterpret_cast<double*>(s.host.data()));
  ++n_;
}

// Bytes a training decoder takes on its backend: its parameter buffers (master weights, the
// working copy, gradients) and, for micro-batches of `tokens` packed tokens, the saved activations
// and scratch of a forward and backward (every row a target source: the most the head may hold;
// with a vision tower, every row in a frame slot of its own frame: the most the tower may hold).
struct MemoryEstimate {
  int64_t weights = 0, grads = 0, activations = 0;
  int64_t total() const { return weights + grads + activations; }
};
template <class E>
MemoryEstimate estimate_training_memory(const ModelConfig& cfg, int64_t tokens, const DecoderOptions& options = {});

template <class T>
using Model = Decoder<CpuExec<T>>;
using CudaModel = Decoder<CudaExec>;

}  // namespace tt::model
