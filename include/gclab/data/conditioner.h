// Text embeddings for batches of captions through the text encoder, or from the cache of precomputed ones
// (cache_text_embeddings), on the device. The model decides the sequence length a prompt gets (FLUX pads
// to 512, Z-Image to a multiple of 32, ...): it is passed in as a function of the prompt's token count.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gclab/data/text_encoder.h"

namespace gclab::data {

class TextEmbeddingCache {
 public:
  using SequenceLength = std::function<int64_t(int64_t prompt_tokens)>;
  // encoder: nullopt for a family without text (DiT).
  TextEmbeddingCache(std::optional<TextEncoderOptions> encoder, SequenceLength length, torch::Device device,
                     bool cache);

  // [B, T, D] text (and [B, P] pooled) for the captions, padded to one length.
  TextEmbedding encode(const std::vector<std::string>& captions);
  // unload_text_encoder: everything needed was precomputed; the encoder's memory is returned.
  void unload() { encoder_.reset(); }
  int64_t encoder_bytes() const { return encoder_ ? encoder_->parameter_bytes() : 0; }
  int64_t cache_bytes() const;
  bool has_text() const { return has_text_; }

 private:
  const TextEmbedding& embedding(const std::string& caption, int64_t length);

  bool has_text_;
  SequenceLength length_;
  torch::Device device_;
  bool cache_;
  std::unique_ptr<TextEncoder> encoder_;
  std::map<std::string, TextEmbedding> cached_;
  std::map<std::string, int64_t> token_counts_;  // each caption's token count, kept past unloading
  TextEmbedding scratch_;
};

// DiT is class-conditional: a caption picks a class by hash; an empty caption is the null class.
int64_t class_label_for(const std::string& caption, int64_t num_classes);

}  // namespace gclab::data
