// A family's text pipeline as its diffusers pipeline runs it: which encoders (in the diffusers folder's slot
// order: text_encoder, text_encoder_2, ...), how it calls each one's tokenizer and encoder (template, cut,
// padding, mask, leading rows dropped) and how it composes what they return into the transformer's
// conditioning. Each family's is an object in its folder (the family's text_pipeline in model/registry.h); the shared
// PromptEncoder (text/prompt.h) builds the encoders and runs it, and predicts its memory by walking it.
#pragma once

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gclab/config/choices.h"
#include "gclab/text/encoder.h"

namespace gclab::text {

// How the pipeline calls one slot's tokenizer and encoder, chained as LibTorch's options are:
// PipelineCall().template_around(prefix, suffix).max_length(512).pad(true).mask(true).
struct PipelineCall {
  TORCH_ARG(std::string, prefix);          // the chat template before the prompt
  TORCH_ARG(std::string, suffix);          // and after it
  TORCH_ARG(int64_t, max_length) = 0;      // truncation (and padding when `pad`; 0: none)
  TORCH_ARG(bool, pad) = false;            // padding="max_length"
  TORCH_ARG(bool, mask) = false;           // the attention mask is passed to the encoder
  TORCH_ARG(int64_t, drop) = 0;            // leading rows the pipeline drops (a template's prefix)
  TORCH_ARG(int64_t, condition_area) = 0;  // edit models: control images read through the vision tower here
  TORCH_ARG(bool, numbered) = false;       // ... each after "Picture i: " (the Plus template)
  // A decoder's hidden states after these layers, side by side per token (TextEncoderBase::encode_layers;
  // the FLUX.2 pipelines' 10 / 20 / 30 or 9 / 18 / 27); empty: the encoder's own output.
  TORCH_ARG(std::vector<int64_t>, hidden_layers);
  // The pipeline calls the decoder's whole causal-LM class (FLUX.2's Mistral3ForConditionalGeneration /
  // Qwen3ForCausalLM), whose forward also makes the LM head's logits over every row while the hidden states
  // are held: made and dropped too (their bytes in the encode's peak).
  TORCH_ARG(bool, lm_logits) = false;

 public:
  PipelineCall& template_around(std::string before, std::string after) {
    prefix_ = std::move(before), suffix_ = std::move(after);
    return *this;
  }
};

struct PromptEmbedding {
  torch::Tensor text;    // [1, rows, text_width]
  torch::Tensor pooled;  // [1, pooled_width] or undefined
  // [1, rows]: 1 on the prompt's tokens (the tokenizer's attention mask), 0 on padding, where the pipeline
  // hands the transformer its padded rows with the mask (Chroma); undefined otherwise.
  torch::Tensor mask;
};

// What the pipeline is asked to serve: the transformer's widths and text length, an edit model's conditions.
struct PipelineTarget {
  int64_t text_width = 0;            // the width of the hidden states the transformer takes
  int64_t pooled_width = 0;          // and of its pooled vector (0: none)
  int64_t max_tokens = 0;            // the most text rows it takes (FLUX.1-dev 512, SD3.5 333, ...)
  int64_t condition_area = 0;        // edit models: control images through the vision tower at this area
  bool numbered_conditions = false;  // ... numbered "Picture i: " (the Plus template)
};

// Qwen's chat template around one user turn with add_generation_prompt (the Qwen tokenizers' own, which the
// Qwen-Image and Z-Image pipelines wrap prompts in).
constexpr const char* kQwenChatUser = "<|im_start|>user\n";
constexpr const char* kQwenChatAssistant = "<|im_end|>\n<|im_start|>assistant\n";

class TextPipeline {
 public:
  virtual ~TextPipeline() = default;
  // Its encoders, in slot order.
  virtual std::vector<config::TextEncoderKind> encoders() const = 0;
  // The widths (hidden, pooled) each slot's CPU-test encoder is built at so that the composition gives the
  // target's widths.
  virtual std::vector<TinyWidths> tiny_widths(const PipelineTarget& target) const = 0;
  // Whether encoders of these widths compose to the target's.
  virtual bool composes(const std::vector<TinyWidths>& built, const PipelineTarget& target) const = 0;
  // How it calls each slot of these built encoders; throws std::runtime_error where they cannot serve the
  // target (an edit template without a vision tower, no room for a slot's rows).
  virtual std::vector<PipelineCall> calls(const std::vector<const TextEncoderBase*>& encoders,
                                          const PipelineTarget& target) const = 0;
  // The prompt as the pipeline cleans it before its tokenizers (WanPipeline's prompt_clean); by default as
  // given.
  virtual std::string clean(const std::string& prompt) const { return prompt; }
  // The rows every prompt gives (padded to a fixed length); 0: as many as its tokens.
  virtual int64_t fixed_rows(const PipelineTarget& /*target*/) const { return 0; }
  // What it hands the transformer from what each slot returned (`valid`: each slot's real tokens). By
  // default the last slot's hidden states — only the real tokens' rows where its call masks padding, less
  // the rows the call drops — and the slots' pooled vectors side by side.
  virtual PromptEmbedding compose(const std::vector<EncodedText>& encoded, const std::vector<int64_t>& valid,
                                  const std::vector<PipelineCall>& calls, const PipelineTarget& target) const;
};

// A pipeline of one encoder whose hidden states are the transformer's text (Qwen-Image's, Z-Image's): its
// kind, the CPU-test encoder at the text width, and the default composition; a family gives its calls.
class OneEncoderPipeline : public TextPipeline {
 public:
  explicit OneEncoderPipeline(config::TextEncoderKind kind) : kind_(kind) {}
  std::vector<config::TextEncoderKind> encoders() const override { return {kind_}; }
  std::vector<TinyWidths> tiny_widths(const PipelineTarget& target) const override { return {{target.text_width, 0}}; }
  bool composes(const std::vector<TinyWidths>& built, const PipelineTarget& target) const override {
    return built[0].hidden == target.text_width;
  }

 private:
  config::TextEncoderKind kind_;
};

// One encoder on the prompt padded to the target's text length with the mask passed, then the real tokens'
// rows and zeros after them: every prompt the same length (WanPipeline's _get_t5_prompt_embeds: u[:v], then
// new_zeros up to max_sequence_length).
class ZeroPaddedPipeline : public OneEncoderPipeline {
 public:
  using OneEncoderPipeline::OneEncoderPipeline;
  std::vector<PipelineCall> calls(const std::vector<const TextEncoderBase*>& encoders,
                                  const PipelineTarget& target) const override;
  int64_t fixed_rows(const PipelineTarget& target) const override { return target.max_tokens; }
  PromptEmbedding compose(const std::vector<EncodedText>& encoded, const std::vector<int64_t>& valid,
                          const std::vector<PipelineCall>& calls, const PipelineTarget& target) const override;
};

}  // namespace gclab::text
