// transformers' CLIPTextModel and CLIPTextModelWithProjection (models/clip/modeling_clip.py): the CLIP text
// towers FLUX.1 (CLIP ViT-L/14, its pooled output) and SD3.5 (CLIP-L and OpenCLIP bigG with their
// projections, their penultimate hidden states) condition on. Token + learned position embeddings,
// pre-LayerNorm blocks of causal multi-head attention and an MLP (quick_gelu for ViT-L, gelu for bigG), a
// final LayerNorm; the pooled output is the final state at the end-of-text token. Parameters carry
// transformers' names with the `text_model.` prefix the published checkpoints use (transformers 5 saves a
// CLIPTextModel without it: both load); the Linears are gclab's (LoRA- and float8-capable).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gclab/nn/activation.h"

#include "gclab/nn/layers.h"

namespace gclab::text {

struct ClipTextConfig {
  int64_t vocab_size = 49408, hidden_size = 768, intermediate_size = 3072, num_hidden_layers = 12;
  int64_t num_attention_heads = 12, max_position_embeddings = 77, projection_dim = 768, eos_token_id = 2;
  nn::Activation hidden_act = nn::Activation::quick_gelu;
  double layer_norm_eps = 1e-5;
  bool with_projection = false;  // CLIPTextModelWithProjection: text_projection (no bias) on the pooled output

  // openai/clip-vit-large-patch14's text tower (FLUX.1's text_encoder; SD3.5's with its projection):
  // 123,060,480 parameters (+ 589,824 projection).
  static ClipTextConfig clip_l(bool with_projection = false);
  // OpenCLIP ViT-bigG/14's text tower with its projection (SD3.5's text_encoder_2): 694,659,840 parameters.
  static ClipTextConfig clip_g();
  // The same code at CPU-test size (width 32, 2 layers of 4 heads, projection 16, 1000 ids, 16 positions):
  // sized so the tiny presets' widths compose as the full ones do (FLUX: the pooled 32; SD3: the two
  // penultimate states side by side, 64 = T5's tiny width, the two projections, 32, and 16 + 32 T5 rows
  // = tiny-sd3's 48).
  static ClipTextConfig tiny(const ClipTextConfig& like);
  // A transformers config.json (CLIPTextConfig; `architectures` says whether it has the projection);
  // throws std::runtime_error naming what it cannot use.
  static ClipTextConfig from_json_file(const std::filesystem::path& path);
};

struct ClipTextOutput {
  torch::Tensor last_hidden_state;  // [B, T, hidden], after the final LayerNorm
  torch::Tensor penultimate;        // hidden_states[-2]: the second-to-last block's output (SD3 takes it)
  torch::Tensor pooled;             // [B, hidden]: last_hidden_state at the end-of-text token (pooler_output)
  torch::Tensor text_embeds;        // [B, projection_dim]: the projected pooled output (with projection only)
};

// One pre-LayerNorm block of CLIP's encoder (transformers' CLIPEncoderLayer, both towers'): multi-head
// attention and an MLP, each after its LayerNorm and added to the residual stream; its parameters registered
// on `owner` under `path` in transformers' names (self_attn.{q,k,v,out}_proj, layer_norm1, mlp.fc1 / fc2,
// layer_norm2).
class ClipEncoderLayer {
 public:
  ClipEncoderLayer(torch::nn::Module& owner, const std::string& path, int64_t width, int64_t intermediate,
                   const torch::TensorOptions& options);
  // h [B, T, width]; `mask` an additive attention mask or undefined (the vision tower attends everywhere).
  torch::Tensor forward(torch::Tensor h, const torch::Tensor& mask, int64_t heads, nn::Activation act, double eps);

 private:
  nn::Linear q_{nullptr}, k_{nullptr}, v_{nullptr}, out_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
  torch::Tensor ln1_w_, ln1_b_, ln2_w_, ln2_b_;
};

class ClipTextModelImpl : public torch::nn::Module {
 public:
  explicit ClipTextModelImpl(ClipTextConfig config, const torch::TensorOptions& options = {});
  // input_ids [B, T <= max_position_embeddings]; `attention_mask` [B, T] (1: a token, 0: padding) or
  // undefined (as FLUX's and SD3's pipelines call it).
  ClipTextOutput forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {});
  const ClipTextConfig& config() const { return config_; }

 private:
  ClipTextConfig config_;
  std::vector<std::shared_ptr<ClipEncoderLayer>> layers_;
  torch::Tensor token_embedding_, position_embedding_, final_norm_weight_, final_norm_bias_;
  nn::Linear text_projection_{nullptr};
};
TORCH_MODULE(ClipTextModel);

// Loads a transformers CLIPTextModel[WithProjection]'s weights (a .safetensors file, a sharded index, or a
// folder holding model.safetensors[.index.json]) by their names, with or without the `text_model.` prefix.
// Throws std::runtime_error naming the first missing or misshapen tensor; returns the unused names.
std::vector<std::string> load_clip_text_weights(ClipTextModelImpl& model, const std::filesystem::path& path);

// transformers' CLIPVisionModel (models/clip/modeling_clip.py): the image tower Wan 2.1's image-to-video
// models condition on (OpenCLIP ViT-H/14 as their `image_encoder`, its penultimate hidden states, 257 tokens
// of width 1280: diffusers' WanImageToVideoPipeline.encode_image). A Conv2d patch embedding without bias, a
// class token and learned positions, pre_layrnorm (transformers' spelling), the encoder layers without a
// mask, post_layernorm on the class token's state.
struct ClipVisionConfig {
  int64_t hidden_size = 768, intermediate_size = 3072, num_hidden_layers = 12, num_attention_heads = 12;
  int64_t image_size = 224, patch_size = 32, num_channels = 3;
  nn::Activation hidden_act = nn::Activation::quick_gelu;
  double layer_norm_eps = 1e-5;
  int64_t positions() const { return (image_size / patch_size) * (image_size / patch_size) + 1; }

  // Wan 2.1 I2V's image_encoder, OpenCLIP ViT-H/14 (hidden 1280, 32 layers of 16 heads, MLP 5120, gelu,
  // 224² in patches of 14: 257 tokens): 630,766,080 parameters (transformers' meta build).
  static ClipVisionConfig vit_h14();
  // CPU-test size: width 32, 2 layers of 4 heads, MLP 64, 32² in patches of 8 (17 tokens).
  static ClipVisionConfig tiny();
  // A transformers config.json (CLIPVisionConfig, or a CLIPConfig's vision_config); throws
  // std::runtime_error naming what it cannot use.
  static ClipVisionConfig from_json_file(const std::filesystem::path& path);
};

struct ClipVisionOutput {
  torch::Tensor last_hidden_state;  // [B, tokens, hidden]: the last layer's output (no final norm)
  torch::Tensor penultimate;        // hidden_states[-2]: the second-to-last layer's output (Wan I2V takes it)
  torch::Tensor pooled;             // post_layernorm of the class token's last state [B, hidden]
};

class ClipVisionModelImpl : public torch::nn::Module {
 public:
  explicit ClipVisionModelImpl(ClipVisionConfig config, const torch::TensorOptions& options = {});
  // pixel_values [B, 3, image_size, image_size], normalised as CLIPImageProcessor gives them.
  ClipVisionOutput forward(const torch::Tensor& pixel_values);
  const ClipVisionConfig& config() const { return config_; }

 private:
  ClipVisionConfig config_;
  std::vector<std::shared_ptr<ClipEncoderLayer>> layers_;
  torch::Tensor class_embedding_, patch_weight_, position_embedding_, pre_w_, pre_b_, post_w_, post_b_;
};
TORCH_MODULE(ClipVisionModel);

// Loads a transformers CLIPVisionModel's weights (file, sharded index or folder), by their names, with or
// without the `vision_model.` prefix (a CLIPVisionModelWithProjection's visual_projection is left unused).
std::vector<std::string> load_clip_vision_weights(ClipVisionModelImpl& model, const std::filesystem::path& path);

}  // namespace gclab::text
