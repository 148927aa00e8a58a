// A family's prompt encoding as its diffusers pipeline does it: the family's text pipeline (text/pipeline.h,
// an object in its folder: which encoders, how the pipeline calls their tokenizers and encoders, how it
// composes what they return — FLUX.1's T5 rows and CLIP-L's pooled vector, SD3.5's two CLIPs beside T5,
// Qwen-Image's and Z-Image's chat templates), run over encoders built here.
// Encoders come from local transformers folders when given, else random at the real shape — or, for a tiny
// preset or a transformer whose widths the real encoders do not give, at CPU-test size sized to its widths.
// Tokenizers: T5's SentencePiece model when its folder has one, CLIP's or Qwen's BPE files when given;
// otherwise the hashing stand-in.
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
#include "gclab/text/pipeline.h"
#include "gclab/text/tokenizer.h"

namespace gclab::text {

struct PromptEncoderOptions {
  std::shared_ptr<const TextPipeline> pipeline;   // the family's (null: no text, DiT's class labels)
  PipelineTarget target;                          // what the transformer takes from it
  bool tiny = false;                              // a tiny preset: CPU-test encoders
  std::vector<std::filesystem::path> encoders;    // per slot: a local transformers folder, or empty: random
  std::vector<std::filesystem::path> tokenizers;  // per slot: a local tokenizer folder, or empty: hashing
  torch::TensorOptions options;                   // where the encoders live, in what dtype (kMeta: count only,
                                                  // the folders' config.json read, no weights)
  // quantize_te, per slot: how the encoder's Linear weights are stored (model::text_encoder_storage: which
  // encoders AI Toolkit quantizes); missing or nullopt: the encoder's dtype.
  std::vector<std::optional<nn::WeightStorage>> linear_storage;
};

// A control image as the edit pipelines condition on it: [3, H, W] with values in [0, 1].
using ConditionImages = std::vector<torch::Tensor>;

// What encoding one prompt holds at its peak (PromptEncoder::encode walked, slot by slot).
struct EncodePrediction {
  std::vector<int64_t> tokens;          // per slot: the ids its encoder runs on (template and padding included)
  std::vector<int64_t> bytes;           // per slot: the prompt's peak while it encodes (above what was live
                                        // before the prompt: what the slots before it returned included)
  int64_t peak_bytes = 0;               // the whole prompt: each slot's peak beside what the slots before it returned,
                                        // and the composition
  c10::ScalarType dtype = c10::kFloat;  // the embedding's, as the composition's walk gives it
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
  // The peak bytes of encode(prompt, conditions) above what was live: encode's own slots walked on the
  // encoders' meta twins, the control images as a run's come (float, host memory; only their sizes are read:
  // [3, H, W] tensors, on the meta device or not). `device`: the kernels' (cpu, threads); the dtype
  // and quantize_te are the encoders' own.
  EncodePrediction predict_encode(const std::string& prompt, const ConditionImages& conditions,
                                  const EncodeMemoryOptions& device) const;
  // The same for a caption of `prompt_tokens` tokens (in the template, cut and padded as the pipeline does)
  // with `square_conditions` square control images.
  EncodePrediction predict_encode(int64_t prompt_tokens, int square_conditions,
                                  const EncodeMemoryOptions& device) const;
  // Whether the control images change the embedding (an edit model's vision tower).
  bool reads_conditions() const { return !slots_.empty() && slots_.back().call.condition_area() > 0; }

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
  std::vector<PipelineCall> calls() const;
  // Slot `slot`'s encode of its tokens `t` (and an edit model's control images) on `encoder`: the slot's own
  // or, in a walk, its meta twin.
  EncodedText encode_slot(size_t slot, TextEncoderBase& encoder, const TokenizedBatch& t,
                          const ConditionImages& conditions) const;
  // encode()'s slots on the meta encoders, walked (the conditions' sizes only are read).
  EncodePrediction predict(const std::vector<TokenizedBatch>& tokens, const ConditionImages& conditions,
                           const EncodeMemoryOptions& device) const;
  // The encoders a walk runs: a meta build's own (as its Session stored them: quantized, layer-offloaded —
  // their offload ring slots then change as a run's do), else each slot's meta twin in its dtype, stored as
  // quantize_te asks, built once (what is done to the real encoders after construction, layer offloading
  // included, is not in them).
  const std::vector<std::shared_ptr<TextEncoderBase>>& meta_encoders() const;
  std::vector<Slot> slots_;
  std::vector<LoadStep> load_steps_;
  std::shared_ptr<const TextPipeline> pipeline_;
  PipelineTarget target_;
  c10::ScalarType dtype_ = c10::kFloat;                         // the encoders' (their meta twins')
  std::vector<std::optional<nn::WeightStorage>> storage_;       // per slot: quantize_te's storage of its Linears
  mutable std::vector<std::shared_ptr<TextEncoderBase>> meta_;  // meta_encoders()
  int64_t fixed_rows_ = 0;  // the pipeline's fixed_rows: every prompt gives the padded rows; 0: its tokens
};

// The hashing stand-in for `encoder`'s tokenizer: its vocabulary and special tokens.
HashingVocabulary hashing_vocabulary(const TextEncoderBase& encoder);

}  // namespace gclab::text
