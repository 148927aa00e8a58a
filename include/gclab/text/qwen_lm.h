// The decoder language models two families condition on, run as encoders (no cache, no head): transformers'
// Qwen3Model (Z-Image's text_encoder, Qwen3-4B) and the language model of Qwen2_5_VLForConditionalGeneration
// (Qwen-Image's text_encoder, Qwen2.5-VL-7B, on the text path; its vision tower is not built yet). Pre-norm
// blocks of causal grouped-query attention with rotary positions (RMS-normed queries and keys per head in
// Qwen3; biased q/k/v projections in Qwen2.5) and a SwiGLU MLP; RMS norms in float32. Parameters carry
// transformers' names (Qwen3Model: layers.N.self_attn.q_proj.weight; Qwen2.5-VL: model.layers.N...), and
// the other layouts of the same tensors load too.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gclab/nn/layers.h"
#include "gclab/text/qwen_vision.h"

namespace gclab::text {

// Mistral3ForConditionalGeneration's Pixtral vision tower and its multimodal projector, held resident beside
// the language model as the checkpoint's model holds them and never run (FLUX.2-dev reads text only): the
// patch convolution, 24 pre-norm blocks of SwiGLU and bias-free attention, the projector's norm, 2 x 2 patch
// merger and two Linears into the text width (transformers' PixtralVisionModel, Mistral3MultiModalProjector).
struct PixtralResidentConfig {
  int64_t hidden_size = 1024, intermediate_size = 4096, num_hidden_layers = 24, patch_size = 14, channels = 3;
  int64_t spatial_merge_size = 2;
  bool projector_bias = false;  // multimodal_projector_bias
  static PixtralResidentConfig tiny();
};

struct QwenLmConfig {
  std::string model_type = "qwen3";  // transformers' (qwen3, qwen2_5_vl, mistral3 / mistral)
  int64_t vocab_size = 151936, hidden_size = 2560, intermediate_size = 9728, num_hidden_layers = 36;
  int64_t num_attention_heads = 32, num_key_value_heads = 8, head_dim = 128;
  double rms_norm_eps = 1e-6, rope_theta = 1000000.0;
  bool qk_norm = true;          // Qwen3: q_norm / k_norm over each head
  bool attention_bias = false;  // Qwen2.5: q/k/v with biases (o_proj without)
  std::string prefix;           // where the checkpoint keeps the layers: "" (Qwen3Model), "model." (Qwen2.5-VL)
  // Qwen2.5-VL's multimodal rotary positions: how many of the head's frequencies follow the token's
  // (frame, row, column) position ([16, 24, 24] of 64); empty: one position per token (Qwen3).
  std::vector<int64_t> mrope_section;
  int64_t image_token_id = 151655;  // <|image_pad|>: where the vision tower's tokens go
  // What the checkpoint's model holds beside the language model (Qwen2_5_VLForConditionalGeneration: the
  // vision tower and an untied LM head; resident with it, unused by the text path).
  std::optional<QwenVisionConfig> vision;
  std::optional<PixtralResidentConfig> pixtral;  // Mistral3: the Pixtral tower and projector (memory only)
  bool lm_head = false;

  // Qwen/Qwen3-4B as Z-Image ships it (Qwen3Model): 4,022,468,096 parameters.
  static QwenLmConfig qwen3_4b();
  // Qwen/Qwen3-8B as FLUX.2 klein 9B's pipeline loads it (Qwen3ForCausalLM, its LM head untied): 8,190,735,360.
  static QwenLmConfig qwen3_8b();
  // Mistral-Small-3.1-24B-Instruct-2503's language model as FLUX.2-dev's pipeline loads it (in
  // Mistral3ForConditionalGeneration, with its Pixtral tower and untied LM head): MistralModel is this code
  // without the per-head q/k norms, RMS eps 1e-5, rotary theta 1e9; 22,901,314,560 parameters (24,011,361,280
  // with the tower, the projector and the head).
  static QwenLmConfig mistral_small_31();
  // Qwen2.5-VL-7B-Instruct's language model as Qwen-Image ships it: 7,070,619,136 parameters (without the
  // vision tower and the LM head).
  static QwenLmConfig qwen25_vl_7b();
  // The same code at CPU-test size (width 64, 2 layers, 4 heads over 2 key/value heads of 16, 1000 ids).
  static QwenLmConfig tiny(const QwenLmConfig& like);
  // A transformers config.json (qwen3, qwen2_5_vl or mistral3 with its text_config, mistral); throws std::runtime_error
  // naming what it cannot use.
  static QwenLmConfig from_json_file(const std::filesystem::path& path);
};

struct QwenLmOutput {
  torch::Tensor last_hidden_state;  // hidden_states[-1]: after the final norm
  torch::Tensor penultimate;        // hidden_states[-2]: the second-to-last layer's output (Z-Image takes it)
  // With keep_hidden_states: transformers' output_hidden_states, every one kept to the end (0 the embeddings,
  // i layer i's output, the last after the final norm).
  std::vector<torch::Tensor> hidden_states;
};

class QwenLmImpl : public torch::nn::Module {
 public:
  explicit QwenLmImpl(QwenLmConfig config, const torch::TensorOptions& options = {});
  // input_ids [B, T]; attention_mask [B, T] (1 token, 0 padding: padded keys hidden) or undefined; rotary
  // positions 0..T-1 (as transformers' text-only forward; the pipelines pad on the right).
  QwenLmOutput forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                       bool keep_hidden_states = false);
  // From the input embeddings [B, T, hidden], with `positions` [3, B, T] (Qwen2.5-VL's frame / row /
  // column positions, qwen_mrope_positions) or [B, T].
  QwenLmOutput forward_embeds(const torch::Tensor& inputs_embeds, const torch::Tensor& positions,
                              const torch::Tensor& attention_mask = {}, bool keep_hidden_states = false);
  torch::Tensor embed(const torch::Tensor& input_ids) const;
  // A tied LM head's logits (Qwen3ForCausalLM with tie_word_embeddings): the states times the embedding.
  torch::Tensor tied_logits(const torch::Tensor& hidden) const { return torch::linear(hidden, embed_); }
  const QwenLmConfig& config() const { return config_; }

 private:
  QwenLmConfig config_;
  struct Layer;
  std::vector<std::shared_ptr<Layer>> layers_;
  torch::Tensor embed_, norm_;
};
TORCH_MODULE(QwenLm);

// The Pixtral tower and projector's parameters by transformers' names under one module (vision_tower.*,
// multi_modal_projector.*), their Linears as nn::Linear so that a quantized load stores them as it stores
// the language model's; `text_hidden` is the projector's output width.
std::shared_ptr<torch::nn::Module> pixtral_resident(const PixtralResidentConfig& config, int64_t text_hidden,
                                                    const torch::TensorOptions& options = {});

// Qwen2_5_VLModel.get_rope_index for images: text tokens count on by one from the previous run's largest
// position, each run of `image_token_id` tokens (one image, `image_tokens[i]` of them: its merged rows x
// columns) takes (start, start + row, start + column) and the text after it starts at start + max(rows,
// columns). Only the masked-in tokens are counted (padding keeps 0). Returns [3, B, T] int64; throws
// std::invalid_argument when the image-token runs do not match the images.
torch::Tensor qwen_mrope_positions(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                   int64_t image_token_id, const torch::Tensor& grid_thw, int64_t spatial_merge_size);

// Qwen2_5_VLModel.forward with pixel_values: the tower's tokens scattered into the embeddings where the
// image tokens are, and the multimodal positions. `input_ids` may sit on the CPU while the model is elsewhere
// (the memory walk's meta model: the positions are made from the ids' values on the CPU in any case).
QwenLmOutput qwen_forward_with_images(QwenLmImpl& model, QwenVisionTowerImpl& tower, const torch::Tensor& input_ids,
                                      const torch::Tensor& attention_mask, const QwenVisionInput& images);

// Loads the weights by transformers' names, with or without the `model.` prefix (and Qwen2.5-VL's
// `model.language_model.` layout); the vision tower and the LM head in the same files are reported unused.
std::vector<std::string> load_qwen_lm_weights(QwenLmImpl& model, const std::filesystem::path& path);

}  // namespace gclab::text
