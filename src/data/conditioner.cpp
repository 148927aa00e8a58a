#include "gclab/data/conditioner.h"

#include <algorithm>

#include "gclab/config/user_error.h"

namespace gclab::data {

int64_t class_label_for(const std::string& caption, int64_t num_classes) {
  if (caption.empty()) return num_classes;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : caption) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h % static_cast<uint64_t>(num_classes));
}

TextEmbeddingCache::TextEmbeddingCache(std::unique_ptr<text::PromptEncoder> encoder, SequenceLength length,
                                       torch::Device device, bool cache)
    : has_text_(encoder && encoder->slots() > 0),
      length_(std::move(length)),
      device_(device),
      cache_(cache),
      encoder_(std::move(encoder)) {}

TextEmbedding TextEmbeddingCache::encode(const std::vector<std::string>& captions) {
  TextEmbedding out;
  if (!has_text_) return out;
  // Each caption is encoded (and cached) at its own length, as AI Toolkit caches prompt embeddings; a batch
  // pads them with zeros to its longest (the encoder's padded rows are zeros too: the same values either
  // way). Once the encoder is unloaded, the row counts recorded when the captions were precomputed stand
  // in for the tokenizer (kept only while caching: an uncached run's captions are counted afresh).
  std::vector<int64_t> lengths;
  for (const auto& c : captions) {
    const auto it = token_counts_.find(c);
    int64_t n = 0;
    if (it != token_counts_.end()) {
      n = it->second;
    } else if (!encoder_) {
      throw UserError("unload_text_encoder: the caption '" + c +
                      "' was not precomputed (use cache_text_embeddings without shuffle_tokens)");
    } else {
      n = encoder_->rows(c);
      if (cache_) token_counts_.emplace(c, n);
    }
    lengths.push_back(length_(std::max<int64_t>(n, 1)));
  }
  const int64_t length = *std::max_element(lengths.begin(), lengths.end());
  std::vector<torch::Tensor> text, pooled;
  for (size_t i = 0; i < captions.size(); ++i) {
    const auto& e = embedding(captions[i], lengths[i]);
    text.push_back(lengths[i] < length ? torch::constant_pad_nd(e.text, {0, 0, 0, length - lengths[i]}) : e.text);
    if (e.pooled.defined()) pooled.push_back(e.pooled);
  }
  out.text = torch::cat(text).to(device_);
  if (!pooled.empty()) out.pooled = torch::cat(pooled).to(device_);
  return out;
}

int64_t TextEmbeddingCache::cache_bytes() const {
  int64_t b = 0;
  for (const auto& [key, e] : cached_)
    b += static_cast<int64_t>(e.text.nbytes()) + (e.pooled.defined() ? static_cast<int64_t>(e.pooled.nbytes()) : 0);
  return b;
}

const TextEmbedding& TextEmbeddingCache::embedding(const std::string& caption, int64_t length) {
  const std::string key = std::to_string(length) + "|" + caption;
  auto it = cached_.find(key);
  if (it != cached_.end()) return it->second;
  if (!encoder_)
    throw UserError("unload_text_encoder: the caption '" + caption +
                    "' was not precomputed (use cache_text_embeddings without shuffle_tokens)");
  const text::PromptEmbedding p = encoder_->encode(caption);
  TextEmbedding e{p.text.slice(1, 0, length), p.pooled};
  if (e.text.size(1) < length) e.text = torch::constant_pad_nd(e.text, {0, 0, 0, length - e.text.size(1)});
  if (!cache_) {
    scratch_ = std::move(e);
    return scratch_;
  }
  // A copy of just these rows in host memory (a view would keep the encoder's whole padded output alive):
  // AI Toolkit keeps cached text embeddings on disk (_t_e_cache/) and brings each batch's to the device.
  e.text = e.text.to(torch::kCPU).clone();
  if (e.pooled.defined()) e.pooled = e.pooled.to(torch::kCPU).clone();
  return cached_.emplace(key, std::move(e)).first->second;
}

}  // namespace gclab::data
