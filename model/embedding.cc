// Input stage "token_embedding" (see embedding.h).
#include "model/embedding.h"

namespace tt::model {

EmbeddingKind::EmbeddingKind(const ModelConfig& cfg, ParamTable::Builder& b)
    : LayerKind(-1, ParamSlice{}), C_((int)cfg.hidden_size), V_((int)cfg.vocab_size) {
  b.begin_block("model.embed_tokens");
  const int i = b.add("model.embed_tokens.weight", {cfg.vocab_size, cfg.hidden_size}, ParamRole::kMatrix);
  wte_ = b.offset(i);
  b.end_block();
  slice_ = ParamSlice{"model.embed_tokens", i, i + 1};
}

}  // namespace tt::model
