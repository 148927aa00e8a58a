// transformers' T5EncoderModel (models/t5/modeling_t5.py): the encoder half of T5 v1.1, the text encoder
// FLUX.1 (text_encoder_2) and SD3.5 (text_encoder_3) condition on — and UMT5EncoderModel
// (models/umt5/modeling_umt5.py), Wan's, the same with a bias per block. Pre-norm blocks of self-attention
// without scaling, whose scores carry a learned bias per head over bucketed relative positions (computed by
// the first block, shared by all), and a gated GELU feed-forward (wi_0 through the activation, times wi_1,
// then wo); RMS norms without bias (the variance in float32). Parameters carry transformers' names
// (shared.weight, encoder.block.N.layer.0.SelfAttention.q.weight, ...), so a text_encoder_2/ folder loads
// unchanged; the Linears are gclab's (LoRA- and float8-capable).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gclab/nn/activation.h"

namespace gclab::text {

struct T5Config {
  int64_t vocab_size = 32128, d_model = 4096, d_kv = 64, d_ff = 10240, num_layers = 24, num_heads = 64;
  int64_t relative_attention_num_buckets = 32, relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  bool gated = true;  // feed_forward_proj "gated-gelu" (v1.1) vs "relu" (the original T5)
  // UMT5 (transformers' UMT5EncoderModel, model_type "umt5"): every block's attention has its own
  // relative_attention_bias, where T5's first block computes one bias for all.
  bool bias_per_layer = false;
  nn::Activation dense_act_fn = nn::Activation::gelu_tanh;  // "gelu_new"

  // google/t5-v1_1-xxl's encoder, as FLUX.1 and SD3.5 ship it: 4,762,310,656 parameters.
  static T5Config xxl() { return {}; }
  // google/umt5-xxl's encoder, as the Wan pipelines ship it (text_encoder/): T5-XXL's shape with its
  // 256,384-id vocabulary and a bias per block.
  static T5Config umt5_xxl();
  // The same code at CPU-test size (width 64, 2 blocks of 4 heads, 1000 ids).
  static T5Config tiny();
  // A transformers config.json (T5Config); throws std::runtime_error naming what it cannot use.
  static T5Config from_json_file(const std::filesystem::path& path);
};

class T5EncoderImpl : public torch::nn::Module {
 public:
  // `options` places the parameters (torch::kMeta: a full-size build without memory).
  explicit T5EncoderImpl(T5Config config, const torch::TensorOptions& options = {});
  // input_ids [B, T] -> last_hidden_state [B, T, d_model]. `attention_mask` [B, T] (1: a token, 0:
  // padding) hides padded keys; undefined attends to every position (as FLUX's and SD3's pipelines call it).
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {});
  const T5Config& config() const { return config_; }

 private:
  T5Config config_;
  struct Block;
  std::vector<std::shared_ptr<Block>> blocks_;
  torch::Tensor shared_, final_norm_;
  // [1, heads, T, T] from one block's relative_attention_bias table
  torch::Tensor position_bias(const torch::Tensor& table, int64_t length, const torch::Device& device) const;
};
TORCH_MODULE(T5Encoder);

// Loads a transformers T5EncoderModel's weights (a .safetensors file, a sharded index, or a folder holding
// model.safetensors[.index.json]) by their names; the tied embedding may be stored as shared.weight or
// encoder.embed_tokens.weight. Throws std::runtime_error naming the first missing or misshapen tensor;
// returns the names the encoder does not use.
std::vector<std::string> load_t5_weights(T5EncoderImpl& encoder, const std::filesystem::path& path);

}  // namespace gclab::text
