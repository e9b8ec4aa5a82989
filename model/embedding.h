// Input stage "token_embedding": the residual stream of a token batch, x (N, C) = wte[tokens].
// Parameters: model.embed_tokens.weight (V, C) (also the LM head's weight when tied). A lookup:
// no FLOPs. Backward adds the scatter of dx into the table's gradient.
#pragma once

#include <string>

#include "model/block.h"
#include "model/config.h"

namespace tt::model {

class EmbeddingKind final : public LayerKind {
 public:
  EmbeddingKind(const ModelConfig& cfg, ParamTable::Builder& b);

  std::string kind() const override { return "token_embedding"; }
  Flops flops(const Work&, Pass) const override { return Flops{}; }
  int64_t weight_offset() const { return wte_; }

  // x (N, C) = wte[batch.tokens].
  template <class E>
  void forward(E& e, const BatchView<E>& b, const typename E::Weight* w, typename E::Act* x) const {
    e.embedding_forward(x, b.tokens, w + wte_, b.N, C_, V_);
  }
  // g(wte) += scatter of dx (N, C).
  template <class E>
  void backward(E& e, const BatchView<E>& b, typename E::Param* g, const typename E::Act* dx) const {
    e.embedding_backward(g + wte_, dx, b.tokens, b.N, C_, V_);
  }

 private:
  int C_, V_;
  int64_t wte_;
};

}  // namespace tt::model
