#include "model/families/bfl/layout.h"

#include "gclab/config/user_error.h"

namespace gclab::model::bfl {

std::vector<std::string> block_linear_order() {
  return {"double_blocks.*.img_attn.qkv", "double_blocks.*.img_attn.proj", "double_blocks.*.img_mlp.0",
          "double_blocks.*.img_mlp.2",    "double_blocks.*.txt_attn.qkv",  "double_blocks.*.txt_attn.proj",
          "double_blocks.*.txt_mlp.0",    "double_blocks.*.txt_mlp.2",     "single_blocks.*.linear1",
          "single_blocks.*.linear2"};
}

std::string foreign_layout(const std::string& key, const std::string& model, const std::string& example) {
  if (key.rfind("transformer_blocks.", 0) != 0 && key.rfind("model.diffusion_model.", 0) != 0) return {};
  return "a diffusers-named or ComfyUI-prefixed " + model + " file. gclab loads " + model +
         " as AI Toolkit does: the Black Forest Labs names of " + example + " (double_blocks.N.img_attn.qkv, ...)";
}

void read_gclab_folder(ModelSpec& s, const nlohmann::json& c, const std::string& refusal) {
  if (!c.contains("_gclab_preset")) throw UserError(refusal);
  families_shared::read_mmdit_config(s, c);
  s.double_blocks = static_cast<int>(families_shared::config_int(c, "num_layers", s.double_blocks));
  s.single_blocks = static_cast<int>(families_shared::config_int(c, "num_single_layers", s.single_blocks));
}

void read_tensor_shapes(ModelSpec& s, const TensorShapes& t) {
  s.hidden = t.dim("img_in.weight", 0);
  s.text_dim = t.dim("txt_in.weight", 1);
  s.head_dim = t.dim("double_blocks.0.img_attn.norm.query_norm.scale", 0);
  s.mlp_hidden = t.dim("double_blocks.0.img_mlp.2.weight", 1);
  s.double_blocks = t.count("double_blocks");
  s.single_blocks = t.count("single_blocks");
}

}  // namespace gclab::model::bfl
