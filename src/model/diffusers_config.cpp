#include "gclab/model/diffusers_config.h"

#include <nlohmann/json.hpp>

namespace gclab::model {

std::string diffusers_config_json(const ModelSpec& s) {
  using json = nlohmann::ordered_json;
  json c;
  const int64_t packed = s.latent_channels * s.patch * s.patch;  // FLUX / Qwen-Image take 2x2-packed latents
  switch (s.family) {
    case Family::flux:
      c = {{"_class_name", "FluxTransformer2DModel"},
           {"attention_head_dim", s.head_dim},
           {"axes_dims_rope", s.rope_axes},
           {"guidance_embeds", s.guidance_embed},
           {"in_channels", packed + s.extra_input_features},  // Flex.2: 196
           {"out_channels", packed},
           {"joint_attention_dim", s.text_dim},
           {"num_attention_heads", s.heads},
           {"num_layers", s.double_blocks},
           {"num_single_layers", s.single_blocks},
           {"patch_size", 1},
           {"pooled_projection_dim", s.pooled_dim}};
      break;
    case Family::qwen_image:
      c = {{"_class_name", "QwenImageTransformer2DModel"},
           {"attention_head_dim", s.head_dim},
           {"axes_dims_rope", s.rope_axes},
           {"guidance_embeds", false},
           {"in_channels", packed},
           {"joint_attention_dim", s.text_dim},
           {"num_attention_heads", s.heads},
           {"num_layers", s.double_blocks},
           {"out_channels", s.out_channels},
           {"patch_size", s.patch},
           {"zero_cond_t", s.zero_cond_t}};
      break;
    case Family::zimage:
      c = {{"_class_name", "ZImageTransformer2DModel"},
           {"all_patch_size", {s.patch}},
           {"all_f_patch_size", {1}},
           {"in_channels", s.latent_channels},
           {"dim", s.hidden},
           {"n_layers", s.single_blocks},
           {"n_refiner_layers", s.refiner_blocks},
           {"n_heads", s.heads},
           {"n_kv_heads", s.heads},
           {"norm_eps", 1e-5},
           {"qk_norm", true},
           {"cap_feat_dim", s.text_dim},
           {"rope_theta", s.rope_theta},
           {"t_scale", 1000.0},
           {"axes_dims", s.rope_axes},
           {"axes_lens", {1536, 512, 512}}};
      break;
    case Family::sd3:
      c = {{"_class_name", "SD3Transformer2DModel"},
           {"sample_size", s.sd3_base_size * s.patch},
           {"patch_size", s.patch},
           {"in_channels", s.latent_channels},
           {"num_layers", s.double_blocks},
           {"attention_head_dim", s.head_dim},
           {"num_attention_heads", s.heads},
           {"joint_attention_dim", s.text_dim},
           {"caption_projection_dim", s.hidden},
           {"pooled_projection_dim", s.pooled_dim},
           {"out_channels", s.out_channels},
           {"pos_embed_max_size", s.pos_embed_max},
           {"qk_norm", "rms_norm"}};
      break;
    case Family::dit:
      c = {{"_class_name", "DiTTransformer2DModel"},
           {"num_attention_heads", s.heads},
           {"attention_head_dim", s.head_dim},
           {"in_channels", s.latent_channels},
           {"out_channels", s.out_channels},
           {"num_layers", s.single_blocks},
           {"sample_size", 32},
           {"patch_size", s.patch},
           {"num_embeds_ada_norm", s.num_classes}};
      break;
  }
  c["_gclab_preset"] = s.preset;
  return c.dump(2) + "\n";
}

}  // namespace gclab::model
