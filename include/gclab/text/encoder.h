// A family's text encoder as its pipeline uses it (config::TextEncoderKind): built at the real shape (or its
// CPU-test size), from a transformers folder's config.json and weights when there is one, and run on token
// ids to what the pipeline takes from it. One interface for CLIP and T5 (and, next, Qwen2.5-VL / Qwen3).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gclab/config/choices.h"
#include "gclab/text/memory.h"
#include "gclab/text/qwen_vision.h"

namespace gclab::text {

struct EncodedText {
  torch::Tensor hidden_states;  // [B, T, width]: what the pipeline conditions on (undefined: not used)
  torch::Tensor pooled;         // [B, width]: the pooled vector the pipeline uses (undefined: none)
};

class TextEncoderBase : public torch::nn::Module {
 public:
  // input_ids [B, T]; attention_mask [B, T] (1 token, 0 padding) or undefined (attend everywhere).
  virtual EncodedText encode(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {}) = 0;
  virtual config::TextEncoderKind kind() const = 0;
  // The longest input the pipeline gives it (CLIP: 77; T5: 512 for FLUX.1-dev, 256 for SD3.5 and schnell).
  virtual int64_t max_positions() const = 0;
  virtual int64_t vocab_size() const = 0;  // token ids run from 0 to vocab_size - 1
  // The widths of what encode returns: hidden_states' last axis and pooled's (0: not returned).
  virtual int64_t hidden_width() const = 0;
  virtual int64_t pooled_width() const = 0;
  // Encoders that read images beside the text (Qwen2.5-VL: its vision tower's tokens replace each run of
  // image_token_id in input_ids, and the positions become multimodal). The others throw.
  virtual bool takes_images() const { return false; }
  virtual EncodedText encode_with_images(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                         const QwenVisionInput& images);
  virtual int64_t image_token_id() const { return -1; }
  // A decoder's hidden states after the layers `layers` (transformers' output_hidden_states indices: 0 the
  // embeddings, i layer i's output) side by side per token, [B, T, layers x width]: torch.stack(dim=1), then
  // "b c l d -> b l (c d)" (the FLUX.2 pipelines' text). `lm_logits`: the causal-LM class's logits over every
  // row made (and dropped) while they are held (PipelineCall::lm_logits). The decoders give them; the others
  // throw.
  virtual EncodedText encode_layers(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                    const std::vector<int64_t>& layers, bool lm_logits = false);
  virtual int64_t layer_count() const { return 0; }  // a decoder's layers (0: not a decoder)
  virtual const QwenVisionConfig* vision_config() const { return nullptr; }
  // The same encoder (its config, its vision tower or none) on the meta device in `dtype`, its Linears as
  // built: what a memory walk runs in its place (PromptEncoder::predict_encode).
  virtual std::shared_ptr<TextEncoderBase> meta_twin(c10::ScalarType dtype) const = 0;
};

// The peak bytes above what was live while encode runs on `batch` inputs of `tokens` ids (no images), walked
// on the encoder's meta twin in the options' dtype (quantized_linears: its Linears qfloat8), for the options'
// kernels (text/memory.h).
int64_t predicted_encode_bytes(const TextEncoderBase& encoder, int64_t batch, int64_t tokens, bool masked,
                               const EncodeMemoryOptions& options = {});

// The widths a tiny encoder is built at instead of its preset's (0: the preset's): the hidden width (CLIP,
// T5's d_model, Qwen) and CLIP's projection — so a transformer of any width gets encoders it can take.
struct TinyWidths {
  int64_t hidden = 0, projection = 0;
};

// What the full-size encoder of `kind` returns: hidden_width() and pooled_width() of its preset.
TinyWidths preset_widths(config::TextEncoderKind kind);

struct LoadedTextEncoder {
  std::shared_ptr<TextEncoderBase> encoder;
  bool random = false;              // no weights were loaded
  std::vector<std::string> unused;  // tensors in the weights the encoder does not use
};

// The encoder of `kind` at its real shape (`tiny`: the same code at CPU-test size), with `folder`'s
// config.json in place of the preset and its weights loaded when `folder` is given (a transformers folder,
// or a .safetensors file); random weights from the global generator otherwise. `options` places it
// (torch::kMeta: a full-size build without memory; `load_weights` false: the folder's config.json only);
// `widths` sizes a tiny one. `vision_tower` false leaves out Qwen2.5-VL's vision tower, as AI Toolkit's Qwen-Image
// loader drops it for the text-only pipeline (`text_encoder.model.visual = None` unless the model class sets
// `_qwen_image_keep_visual`, as the edit models do); its tensors in the folder are then reported unused.
// Throws std::runtime_error for a config or weights it cannot use.
LoadedTextEncoder build_text_encoder(config::TextEncoderKind kind, bool tiny, const std::filesystem::path& folder = {},
                                     const torch::TensorOptions& options = {}, bool load_weights = true,
                                     const TinyWidths& widths = {}, bool vision_tower = true);

}  // namespace gclab::text
