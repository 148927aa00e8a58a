// Text embeddings for batches of captions through the family's text encoders (text::PromptEncoder), or from
// the cache of precomputed ones (cache_text_embeddings), on the device. The model decides the sequence
// length a prompt gets (FLUX's 512, Qwen-Image up to 1024, ...): it is passed in as a function of the rows
// the pipeline gives the prompt.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gclab/text/prompt.h"

namespace gclab::data {

struct TextEmbedding {
  torch::Tensor text;    // [B, T, text width]
  torch::Tensor pooled;  // [B, pooled width] or undefined
};

class TextEmbeddingCache {
 public:
  using SequenceLength = std::function<int64_t(int64_t prompt_rows)>;
  // encoder: null for a family without text (DiT). The embeddings are given on `device`.
  TextEmbeddingCache(std::unique_ptr<text::PromptEncoder> encoder, SequenceLength length, torch::Device device,
                     bool cache);

  // [B, T, D] text (and [B, P] pooled) for the captions, padded to one length.
  TextEmbedding encode(const std::vector<std::string>& captions);
  // unload_text_encoder: everything needed was precomputed; the encoder's memory is returned.
  void unload() { encoder_.reset(); }
  int64_t encoder_bytes() const { return encoder_ ? encoder_->weight_bytes() : 0; }
  text::PromptEncoder* encoder() { return encoder_.get(); }
  // The precomputed embeddings, held in host memory (only each batch's go to the device).
  int64_t cache_bytes() const;
  bool has_text() const { return has_text_; }

 private:
  const TextEmbedding& embedding(const std::string& caption, int64_t length);

  bool has_text_;
  SequenceLength length_;
  torch::Device device_;
  bool cache_;
  std::unique_ptr<text::PromptEncoder> encoder_;
  std::map<std::string, TextEmbedding> cached_;
  std::map<std::string, int64_t> token_counts_;  // each caption's row count, kept past unloading
  TextEmbedding scratch_;
};

// DiT is class-conditional: a caption picks a class by hash; an empty caption is the null class.
int64_t class_label_for(const std::string& caption, int64_t num_classes);

}  // namespace gclab::data
