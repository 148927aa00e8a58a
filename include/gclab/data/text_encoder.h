// The stand-in for a text encoder: a hashing tokenizer (lower-cased words, FNV-1a into a fixed
// vocabulary) and a small transformer with fixed random weights (2 layers, width 256), projected to the
// family's text width; its mean over real tokens, projected, is the pooled vector. Deterministic: the
// same caption always gives the same embedding, different captions different ones, so a model can learn
// the mapping. Frozen, like a real text encoder during LoRA training.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace gclab::data {

struct TextEncoderOptions {
  int64_t text_dim = 64;   // the transformer's context width (FLUX: 4096)
  int64_t pooled_dim = 0;  // 0: no pooled vector
  int64_t vocabulary = 8192;
  int64_t width = 256;
  int64_t layers = 2;
  int64_t max_tokens = 1024;
  uint64_t seed = 1234;
};

struct TextEmbedding {
  torch::Tensor text;    // [B, T, text_dim]
  torch::Tensor pooled;  // [B, pooled_dim] or undefined
};

class TextEncoder {
 public:
  explicit TextEncoder(const TextEncoderOptions& options);
  // Token ids of a caption (1 = end of text; no padding).
  std::vector<int64_t> tokenize(const std::string& caption) const;
  // Embeddings for captions, padded or cut to `length` tokens.
  TextEmbedding encode(const std::vector<std::string>& captions, int64_t length);
  int64_t parameter_bytes() const;

 private:
  TextEncoderOptions o_;
  torch::Tensor embedding_, positions_, out_proj_, pooled_proj_;
  std::vector<std::vector<torch::Tensor>> layers_;  // per layer: qkv, proj, fc1, fc2
};

}  // namespace gclab::data
