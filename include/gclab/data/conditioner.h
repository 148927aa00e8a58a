// Text embeddings for batches of captions through the family's text encoders (text::PromptEncoder), or from
// the cache of precomputed ones (cache_text_embeddings), on the device. The model decides the sequence
// length a prompt gets (FLUX's 512, Qwen-Image up to 1024, ...): it is passed in as a function of the rows
// the pipeline gives the prompt.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gclab/text/prompt.h"

namespace gclab::data {

// A caption as the pipeline encodes it, with what an edit model's text encoder reads beside it: its control
// images ([3, H, W] in [0, 1]), given, or decoded from `control_files` when needed. The files name them in
// the cache (an edit model's embedding depends on the caption and its control images). `image`: the
// dataset image the caption belongs to — a cached embedding of it goes to disk beside it, as AI Toolkit's
// (empty: a sample prompt, kept in memory).
struct Caption {
  std::string text;
  std::vector<std::filesystem::path> control_files;
  text::ConditionImages control_images;
  std::filesystem::path image;
};

struct TextEmbedding {
  torch::Tensor text;    // [B, T, text width]
  torch::Tensor pooled;  // [B, pooled width] or undefined
  torch::Tensor mask;    // [B, T] the prompts' tokens 1, padding 0 (text::PromptEmbedding::mask) or undefined
};

class TextEmbeddingCache {
 public:
  using SequenceLength = std::function<int64_t(int64_t prompt_rows)>;
  // encoder: null for a family without text (DiT). The embeddings are given on `device`. `cache`: every
  // caption's embedding is kept once encoded — a dataset caption's in `_t_e_cache/` beside its image (the
  // file named by the image's stem and a hash of what made the embedding: the caption, its control files
  // and `encoders`, which names the encoders and their weights), the others in host memory.
  TextEmbeddingCache(std::unique_ptr<text::PromptEncoder> encoder, SequenceLength length, torch::Device device,
                     bool cache, std::string encoders = {});

  // [B, T, D] text (and [B, P] pooled) for the captions, padded to one length.
  TextEmbedding encode(const std::vector<Caption>& captions);
  // What encode does with the captions' embeddings: each one's (`embed(i)`: encoded now, or from the cache,
  // `lengths[i]` rows) in turn, padded with zero rows to the longest, the earlier ones kept while the next
  // is made; then side by side on `device`. The memory model walks it with the encoders' predicted
  // embeddings (train/predict.cpp).
  static TextEmbedding collate(const std::vector<int64_t>& lengths, torch::Device device,
                               const std::function<TextEmbedding(size_t)>& embed);
  // Called once, right before the encoder next runs (a caption neither in memory nor on disk); null clears it.
  void before_first_encode(std::function<void()> f) { before_encode_ = std::move(f); }
  // unload_text_encoder: everything needed was precomputed; the encoder's memory is returned.
  void unload() { encoder_.reset(); }
  int64_t encoder_bytes() const { return encoder_ ? encoder_->weight_bytes() : 0; }
  text::PromptEncoder* encoder() { return encoder_.get(); }
  // The precomputed embeddings held in host memory (only each batch's go to the device), and the files
  // written or reused in _t_e_cache/.
  int64_t cache_bytes() const;
  std::vector<std::filesystem::path> cache_files() const { return {files_.begin(), files_.end()}; }
  // Where a dataset caption's embedding is kept on disk (empty: not a dataset caption).
  std::filesystem::path cache_file(const Caption& caption) const;
  bool has_text() const { return has_text_; }

 private:
  const TextEmbedding& embedding(const Caption& caption, const std::string& key, int64_t length);
  text::ConditionImages images_of(const Caption& caption) const;
  std::string file_key(const Caption& caption) const;

  bool has_text_;
  SequenceLength length_;
  torch::Device device_;
  bool cache_;
  bool reads_conditions_;  // an edit model's encoder: control images change the embedding
  std::string encoders_;   // what made the embeddings, in the cache files' key
  std::set<std::filesystem::path> files_;
  std::unique_ptr<text::PromptEncoder> encoder_;
  std::map<std::string, TextEmbedding> cached_;
  std::map<std::string, int64_t> token_counts_;  // each caption's row count, kept past unloading
  TextEmbedding scratch_;
  std::function<void()> before_encode_;
};

// DiT is class-conditional: a caption picks a class by hash; an empty caption is the null class.
int64_t class_label_for(const std::string& caption, int64_t num_classes);

}  // namespace gclab::data
