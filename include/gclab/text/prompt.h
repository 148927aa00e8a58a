// A family's prompt encoding as its diffusers pipeline does it: the family's text encoders (in slot order:
// text_encoder, text_encoder_2, ...), their tokenizers called as the pipeline calls them, and how the
// pipeline composes what they return —
//   FLUX.1 / Flex (CLIP-L, T5): T5's last hidden states over max_sequence_length padded tokens (512 for dev;
//     no attention mask), CLIP-L's pooled output over 77;
//   SD3.5 (CLIP-L, bigG, T5): both CLIPs' penultimate states side by side, zero-padded to T5's width, then
//     T5's rows (77 + 256); pooled = both projected pooled outputs side by side;
//   Qwen-Image (Qwen2.5-VL): the prompt in its chat template, the last hidden states with the template's 34
//     prefix tokens dropped (up to 1024 rows after them);
//   Z-Image (Qwen3): the prompt in Qwen3's chat template padded to 512 with a mask, hidden_states[-2] at
//     the real tokens only.
// Encoders come from local transformers folders when given, else random at the real shape — or, for a tiny
// preset or a transformer whose widths the real encoders do not give, at CPU-test size sized to its widths.
// Tokenizers: T5's SentencePiece model when its folder has one; otherwise the hashing stand-in.
#pragma once

#include <torch/types.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gclab/config/choices.h"
#include "gclab/nn/layers.h"
#include "gclab/text/encoder.h"
#include "gclab/text/tokenizer.h"

namespace gclab::text {

using Composition = config::TextComposition;

struct PromptEncoderOptions {
  Composition composition = Composition::none;    // how the family's pipeline composes the encoders
  std::vector<config::TextEncoderKind> kinds;     // the family's encoders, in slot order (empty: no text)
  bool tiny = false;                              // a tiny preset: CPU-test encoders
  int64_t text_width = 0;                         // the width of the hidden states the transformer takes
  int64_t pooled_width = 0;                       // and of its pooled vector (0: none)
  int64_t max_tokens = 0;                         // the most text rows it takes (FLUX.1-dev 512, SD3.5 333, ...)
  std::vector<std::filesystem::path> encoders;    // per slot: a local transformers folder, or empty: random
  std::vector<std::filesystem::path> tokenizers;  // per slot: a local tokenizer folder, or empty: hashing
  torch::TensorOptions options;                   // where the encoders live, in what dtype (kMeta: count only,
                                                  // the folders' config.json read, no weights)
  // quantize_te, per slot: how the encoder's Linear weights are stored (model::text_encoder_storage: which
  // encoders AI Toolkit quantizes); missing or nullopt: the encoder's dtype.
  std::vector<std::optional<nn::WeightStorage>> linear_storage;
  // Edit models (model::ModelSpec's facts): the control images go through Qwen2.5-VL's vision tower at this
  // area (0: a text-only pipeline), numbered "Picture i: " in the Plus template.
  int64_t condition_area = 0;
  bool numbered_conditions = false;
};

struct PromptEmbedding {
  torch::Tensor text;    // [1, rows, text_width]
  torch::Tensor pooled;  // [1, pooled_width] or undefined
};

// How the pipeline calls one slot's tokenizer and encoder.
struct PipelineCall {
  std::string prefix, suffix;  // the chat template around the prompt
  int64_t max_length = 0;      // truncation (and padding when `pad`)
  bool pad = false;            // padding="max_length"
  bool mask = false;           // the attention mask is passed to the encoder
  int64_t drop = 0;            // leading rows the pipeline drops (Qwen-Image: the template's prefix)
  int64_t condition_area = 0;  // edit models: control images read through the vision tower at this area
  bool numbered = false;       // ... each after "Picture i: " (the Plus template)
};

// A control image as the edit pipelines condition on it: [3, H, W] with values in [0, 1].
using ConditionImages = std::vector<torch::Tensor>;

// What encoding one prompt holds at its peak (text/memory.h's walks, slot by slot).
struct EncodePrediction {
  std::vector<int64_t> tokens;  // per slot: the ids its encoder runs on (template and padding included)
  std::vector<int64_t> bytes;   // per slot: its encode's peak above what was live
  int64_t peak_bytes = 0;       // the whole prompt: each slot's peak beside what the slots before it returned,
                                // and the composition
};

class PromptEncoder {
 public:
  // Throws std::runtime_error for an encoder folder or tokenizer it cannot use, or widths that do not
  // compose to the transformer's.
  explicit PromptEncoder(const PromptEncoderOptions& options);

  // How many text rows the pipeline gives this prompt (before the transformer pads them), with an edit
  // model's control images (their sizes count).
  int64_t rows(const std::string& prompt, const ConditionImages& conditions = {}) const;
  // One prompt's embedding as the pipeline gives it, under no_grad, on the encoders' device; an edit
  // model reads its control images through the vision tower (none: the template's lone <|image_pad|>
  // stays a text token, as QwenImageEditPipeline without an image).
  PromptEmbedding encode(const std::string& prompt, const ConditionImages& conditions = {});
  // Slot `slot`'s tokens for the prompt, as the pipeline calls its tokenizer (template, cut, padding); an
  // edit model's image-token runs at the control images' lengths.
  TokenizedBatch tokenize(size_t slot, const std::string& prompt, const ConditionImages& conditions = {}) const;
  // The peak bytes of encode(prompt, conditions) above what was live, predicted (the conditions' sizes only
  // are read: [3, H, W] tensors, on the meta device or not). `device`: the kernels' (cpu, threads); the dtype
  // and quantize_te are the encoders' own.
  EncodePrediction predict_encode(const std::string& prompt, const ConditionImages& conditions,
                                  const EncodeMemoryOptions& device) const;
  // The same for a caption of `prompt_tokens` tokens (in the template, cut and padded as the pipeline does)
  // with `square_conditions` square control images.
  EncodePrediction predict_encode(int64_t prompt_tokens, int square_conditions,
                                  const EncodeMemoryOptions& device) const;
  // Whether the control images change the embedding (an edit model's vision tower).
  bool reads_conditions() const { return !slots_.empty() && slots_.back().call.condition_area > 0; }

  size_t slots() const { return slots_.size(); }
  TextEncoderBase& encoder(size_t slot) { return *slots_.at(slot).encoder; }
  const TextEncoderBase& encoder(size_t slot) const { return *slots_.at(slot).encoder; }
  const PipelineCall& call(size_t slot) const { return slots_.at(slot).call; }
  const Tokenizer& tokenizer(size_t slot) const { return *slots_.at(slot).tokenizer; }
  bool random_weights(size_t slot) const { return slots_.at(slot).random; }
  bool hashing_tokenizer(size_t slot) const { return slots_.at(slot).hashing; }
  // Parameters and buffers as stored (all slots, or one).
  int64_t weight_bytes() const;
  int64_t weight_bytes(size_t slot) const;
  // Moves every encoder (low_vram: to the host between encodes).
  void to(torch::Device device);

  // How each encoder came to be held, in the order they were built (a load's memory walk): built whole in
  // its dtype, then its Linears stored as quantize_te asks, one at a time — as AI Toolkit's loaders move
  // each encoder to the device and quantize it there.
  struct LoadStep {
    int64_t built_bytes = 0;      // the encoder as built (random, or its folder's weights)
    nn::StorageChange quantized;  // quantize_te's walk on top (nothing without it)
  };
  const std::vector<LoadStep>& load_steps() const { return load_steps_; }

 private:
  struct Slot {
    std::shared_ptr<TextEncoderBase> encoder;
    std::unique_ptr<Tokenizer> tokenizer;
    PipelineCall call;
    bool random = true, hashing = true;
  };
  // An edit model's control image as encode() processes it: its size, the condition size AI Toolkit resizes
  // it to, the size the Qwen2VL processor then resizes that to (multiples of 28).
  struct ConditionShape {
    int64_t height = 0, width = 0, condition_height = 0, condition_width = 0, processed_height = 0, processed_width = 0;
  };
  std::vector<ConditionShape> condition_shapes(const ConditionImages& conditions) const;
  EncodePrediction predict(const std::vector<int64_t>& tokens, const std::vector<ConditionShape>& conditions,
                           const EncodeMemoryOptions& device) const;
  std::vector<Slot> slots_;
  std::vector<LoadStep> load_steps_;
  int64_t text_width_ = 0;
  EncodeMemoryOptions memory_;   // the encoders' dtype, for the predictions
  std::vector<bool> quantized_;  // per slot: its Linears dequantize per call (quantize_te)
  int64_t fixed_rows_ = 0;       // FLUX, SD3: every prompt gives the padded rows; 0: as many as its tokens
};

// The hashing stand-in for `encoder`'s tokenizer: its vocabulary and special tokens.
HashingVocabulary hashing_vocabulary(const TextEncoderBase& encoder);

}  // namespace gclab::text
