// The parameter table: every parameter of a decoder with its Hugging Face name and shape, its
// place in one flat buffer, and the block (input stage, layer kind, head) that owns it.
//
// The blocks build the table (ParamTable::Builder): each block opens a slice, adds its tensors in
// the order it reads them, and keeps the returned indices. Everything that walks parameters reads
// the table instead of re-deriving the layout: the optimizer (ParamInfo::decay), checkpoints and
// HF I/O (names, shapes, offsets), gradient-ready notification (a block's slice is final once its
// backward is enqueued) and FLOP counting (the blocks' own counts). Offsets are in elements of
// the flat buffer; the table is the same for every backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tt::model {

// What a tensor is, which fixes its initialisation and whether weight decay applies.
enum class ParamRole {
  kMatrix,      // a projection or embedding: normal(0, initializer_range), weight decay
  kNormWeight,  // an RMSNorm scale (and a Gated DeltaNet dt_bias): ones, no weight decay
  kLogDecay,    // a Gated DeltaNet A_log: log(A), A uniform in (0, 16] (HF's init), no weight decay
  kZeroNorm,    // a zero-centred RMSNorm scale (Qwen3.5: the layer applies 1 + w): zeros, no weight decay
  kBias,        // a Linear's or LayerNorm's bias (the vision tower, the projector): zeros, no weight decay
};

struct ParamInfo {
  std::string name;            // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // Hugging Face shape, e.g. (q_out, hidden)
  int64_t offset = 0;          // into the flat buffer
  int64_t numel = 0;
  bool decay = true;           // weight decay applies (matrices), not to norm weights
  ParamRole role = ParamRole::kMatrix;
  // false: frozen (vision.freeze, or a tower layer past vision.vision_feature_layer): backward
  // writes no gradient and the optimizer leaves it as it is.
  bool trainable = true;
};

// The tensors of one block: entries [begin, end) of the table.
struct ParamSlice {
  std::string block;  // "model.embed_tokens", "model.layers.3.self_attn", "model.layers.3.mlp", "head"
  int begin = 0, end = 0;
};

class ParamTable {
 public:
  // Adds tensors for one block at a time; sizes are checked (no int64 overflow).
  class Builder {
   public:
    explicit Builder(ParamTable& t) : t_(t) {}
    void begin_block(const std::string& block);
    // Adds a tensor to the open block; returns its index in the table.
    int add(const std::string& name, std::vector<int64_t> shape, ParamRole role);
    // Marks the tensors added so far from index `first` on as frozen (ParamInfo::trainable).
    void freeze_from(int first);
    // Tensors added so far (the index the next add returns).
    int size() const { return t_.size(); }
    // Offset in the flat buffer of the tensor with index i.
    int64_t offset(int i) const { return t_.entries_[i].offset; }
    void end_block();

   private:
    ParamTable& t_;
    bool open_ = false;
  };

  const std::vector<ParamInfo>& entries() const { return entries_; }
  const std::vector<ParamSlice>& slices() const { return slices_; }
  const ParamInfo& operator[](int i) const { return entries_[i]; }
  int size() const { return (int)entries_.size(); }
  int64_t num_params() const { return total_; }
  // Index of a tensor by name, or -1.
  int find(const std::string& name) const;

 private:
  std::vector<ParamInfo> entries_;
  std::vector<ParamSlice> slices_;
  int64_t total_ = 0;
};

}  // namespace tt::model
