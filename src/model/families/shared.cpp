// Helpers the family folders share (registry.h families_shared).
#include <nlohmann/json.hpp>

#include "gclab/model/registry.h"

namespace gclab::model::families_shared {

ModelSpec tiny(const ModelSpec& full, const std::string& preset) {
  ModelSpec s = full;
  s.preset = preset;
  s.tiny = true;
  s.hidden = 128, s.heads = 4, s.head_dim = 32, s.mlp_hidden = 512;
  if (s.text_dim) s.text_dim = 64;
  if (s.pooled_dim) s.pooled_dim = 32;
  if (!s.rope_axes.empty()) s.rope_axes = {8, 12, 12};
  return s;
}

int64_t packed_features(const ModelSpec& s) { return s.latent_channels * s.patch * s.patch; }

int64_t config_int(const nlohmann::json& c, const char* key, int64_t fallback) {
  return c.contains(key) && c[key].is_number() ? c[key].get<int64_t>() : fallback;
}

void read_mmdit_config(ModelSpec& s, const nlohmann::json& c) {
  s.heads = config_int(c, "num_attention_heads", s.heads);
  s.head_dim = config_int(c, "attention_head_dim", s.head_dim);
  s.hidden = s.heads * s.head_dim;
  s.mlp_hidden = 4 * s.hidden;
  s.text_dim = config_int(c, "joint_attention_dim", s.text_dim);
  s.pooled_dim = config_int(c, "pooled_projection_dim", s.pooled_dim);
  if (c.contains("axes_dims_rope")) s.rope_axes = c["axes_dims_rope"].get<std::vector<int64_t>>();
}

void read_joint_block_shapes(ModelSpec& s, const TensorShapes& t) {
  s.head_dim = t.dim("transformer_blocks.0.attn.norm_q.weight", 0);
  s.mlp_hidden = t.dim("transformer_blocks.0.ff.net.0.proj.weight", 0);
  s.double_blocks = t.count("transformer_blocks");
  s.text_dim = t.dim("context_embedder.weight", 1);
  s.pooled_dim = t.dim("time_text_embed.text_embedder.linear_1.weight", 1);
}

}  // namespace gclab::model::families_shared
