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

#include <torch/torch.h>

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

struct PromptEncoderOptions {
  config::Family family = config::Family::flux;     // whose pipeline composes the encoders
  std::vector<config::TextEncoderKind> kinds;       // the family's encoders, in slot order (empty: no text)
  bool tiny = false;                                // a tiny preset: CPU-test encoders
  int64_t text_width = 0;                           // the width of the hidden states the transformer takes
  int64_t pooled_width = 0;                         // and of its pooled vector (0: none)
  int64_t max_tokens = 0;                           // the most text rows it takes (FLUX.1-dev 512, SD3.5 333, ...)
  std::vector<std::filesystem::path> encoders;      // per slot: a local transformers folder, or empty: random
  std::vector<std::filesystem::path> tokenizers;    // per slot: a local tokenizer folder, or empty: hashing
  torch::TensorOptions options;                     // where the encoders live, in what dtype (kMeta: count only,
                                                    // the folders' config.json read, no weights)
  std::optional<nn::WeightStorage> linear_storage;  // quantize_te: how every Linear weight is stored
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
};

class PromptEncoder {
 public:
  // Throws std::runtime_error for an encoder folder or tokenizer it cannot use, or widths that do not
  // compose to the transformer's.
  explicit PromptEncoder(const PromptEncoderOptions& options);

  // How many text rows the pipeline gives this prompt (before the transformer pads them).
  int64_t rows(const std::string& prompt) const;
  // One prompt's embedding as the pipeline gives it, under no_grad, on the encoders' device.
  PromptEmbedding encode(const std::string& prompt);
  // Slot `slot`'s tokens for the prompt, as the pipeline calls its tokenizer (template, cut, padding).
  TokenizedBatch tokenize(size_t slot, const std::string& prompt) const;

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

 private:
  struct Slot {
    std::shared_ptr<TextEncoderBase> encoder;
    std::unique_ptr<Tokenizer> tokenizer;
    PipelineCall call;
    bool random = true, hashing = true;
  };
  std::vector<Slot> slots_;
  int64_t text_width_ = 0;
  int64_t fixed_rows_ = 0;  // FLUX, SD3: every prompt gives the padded rows; 0: as many as its tokens
};

// The hashing stand-in for `encoder`'s tokenizer: its vocabulary and special tokens.
HashingVocabulary hashing_vocabulary(const TextEncoderBase& encoder);

}  // namespace gclab::text
