#include "gclab/data/conditioner.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "gclab/config/user_error.h"
#include "gclab/data/image.h"
#include "gclab/io/safetensors.h"
#include "gclab/log/log.h"
#include "gclab/memory/placement.h"
#include "gclab/memory/tracker.h"

namespace gclab::data {

namespace fs = std::filesystem;

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

int64_t class_label_for(const std::string& caption, int64_t num_classes) {
  if (caption.empty()) return num_classes;
  return static_cast<int64_t>(fnv1a(caption) % static_cast<uint64_t>(num_classes));
}

TextEmbeddingCache::TextEmbeddingCache(std::unique_ptr<text::PromptEncoder> encoder, SequenceLength length,
                                       torch::Device device, bool cache, std::string encoders)
    : has_text_(encoder && encoder->slots() > 0),
      length_(std::move(length)),
      device_(device),
      cache_(cache),
      reads_conditions_(encoder && encoder->reads_conditions()),
      encoders_(std::move(encoders)),
      encoder_(std::move(encoder)) {}

namespace {

// What names a caption in the cache: its text, and its control files when the encoder reads them.
std::string cache_key(const Caption& c, bool conditions) {
  std::string key = c.text;
  if (conditions)
    for (const auto& f : c.control_files) key += "\x1f" + f.string();
  return key;
}

}  // namespace

text::ConditionImages TextEmbeddingCache::images_of(const Caption& caption) const {
  if (!reads_conditions_) return {};
  if (!caption.control_images.empty()) return caption.control_images;
  text::ConditionImages out;  // the control files at their own size, [0, 1]
  for (const auto& f : caption.control_files)
    out.push_back(decode_image_rgb(f).permute({2, 0, 1}).to(torch::kFloat).div(255));
  return out;
}

TextEmbedding TextEmbeddingCache::encode(const std::vector<Caption>& captions) {
  if (!has_text_) return {};
  // Each caption is encoded (and cached) at its own length, as AI Toolkit caches prompt embeddings; a batch
  // pads them with zeros to its longest (the encoder's padded rows are zeros too: the same values either
  // way). Once the encoder is unloaded, the row counts recorded when the captions were precomputed stand
  // in for the tokenizer (kept only while caching: an uncached run's captions are counted afresh).
  std::vector<int64_t> lengths;
  std::vector<std::string> keys;
  std::vector<text::ConditionImages> images(captions.size());
  for (size_t i = 0; i < captions.size(); ++i) {
    const Caption& c = captions[i];
    keys.push_back(cache_key(c, reads_conditions_));
    const auto it = token_counts_.find(keys.back());
    int64_t n = 0;
    if (it != token_counts_.end()) {
      n = it->second;
    } else if (!encoder_) {
      throw UserError("unload_text_encoder: the caption '" + c.text +
                      "' was not precomputed (use cache_text_embeddings without shuffle_tokens)");
    } else {
      images[i] = images_of(c);
      n = encoder_->rows(c.text, images[i]);
      if (cache_) token_counts_.emplace(keys.back(), n);
    }
    lengths.push_back(length_(std::max<int64_t>(n, 1)));
  }
  TextEmbedding out = collate(lengths, device_, [&](size_t i) {
    Caption c = captions[i];
    if (!images[i].empty()) c.control_images = images[i];  // decoded above: not again
    return embedding(c, keys[i], lengths[i]);
  });
  scratch_ = TextEmbedding{};  // the last caption's embedding is the batch's now, not held past it
  return out;
}

TextEmbedding TextEmbeddingCache::collate(const std::vector<int64_t>& lengths, torch::Device device,
                                          const std::function<TextEmbedding(size_t)>& embed) {
  TextEmbedding out;
  const int64_t length = *std::max_element(lengths.begin(), lengths.end());
  // Cached embeddings are padded and put side by side where they are, in host memory (a GPU run's
  // cat on the CPU), and the batch copied to the device; encoded ones on the device.
  std::vector<torch::Tensor> text, pooled, mask;
  bool host = true;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const TextEmbedding e = embed(i);
    host = host && memory::is_host_memory(e.text);
    std::optional<memory::HostScope> scope;
    if (host) scope.emplace();
    text.push_back(lengths[i] < length ? torch::constant_pad_nd(e.text, {0, 0, 0, length - lengths[i]}) : e.text);
    if (e.pooled.defined()) pooled.push_back(e.pooled);
    if (e.mask.defined())
      mask.push_back(lengths[i] < length ? torch::constant_pad_nd(e.mask, {0, length - lengths[i]}) : e.mask);
  }
  auto batch = [&](const std::vector<torch::Tensor>& rows) {
    std::optional<memory::HostScope> scope;
    if (host) scope.emplace();
    const torch::Tensor side_by_side = torch::cat(rows);
    scope.reset();
    return memory::to_device(side_by_side, device);
  };
  out.text = batch(text);
  if (!pooled.empty()) out.pooled = batch(pooled);
  if (!mask.empty()) out.mask = batch(mask);
  return out;
}

int64_t TextEmbeddingCache::cache_bytes() const {
  int64_t b = 0;
  for (const auto& [key, e] : cached_)
    for (const torch::Tensor* t : {&e.text, &e.pooled, &e.mask})
      if (t->defined()) b += static_cast<int64_t>(t->nbytes());
  return b;
}

namespace {

std::string fnv1a_hex(const std::string& s) {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(fnv1a(s)));
  return out;
}

}  // namespace

std::string TextEmbeddingCache::file_key(const Caption& c) const {
  // What identifies a cached embedding on disk: what names it in memory, and the encoders that made it.
  return encoders_ + "\n" + cache_key(c, reads_conditions_);
}

fs::path TextEmbeddingCache::cache_file(const Caption& c) const {
  if (!cache_ || c.image.empty()) return {};
  return c.image.parent_path() / "_t_e_cache" /
         (c.image.stem().string() + "_" + fnv1a_hex(file_key(c)) + ".safetensors");
}

const TextEmbedding& TextEmbeddingCache::embedding(const Caption& caption, const std::string& caption_key,
                                                   int64_t length) {
  const std::string key = std::to_string(length) + "|" + caption_key;
  auto it = cached_.find(key);
  if (it != cached_.end()) return it->second;
  // A dataset caption cached on disk (AI Toolkit's PromptEmbeds.save layout: text_embed [1, T, D],
  // pooled_embed [1, P]); a file whose key or rows do not match, or that does not read, is made again.
  const fs::path file = cache_file(caption);
  std::error_code ec;
  if (!file.empty() && fs::exists(file, ec)) {
    try {
      memory::HostScope host;  // read into host memory, as a GPU run's loader does: the batch's go to the device
      const auto f = io::SafetensorsFile::open(file);
      const auto m = f.metadata();
      if (m.count("gclab_key") && m.at("gclab_key") == file_key(caption) && f.contains("text_embed")) {
        TextEmbedding e{f.tensor("text_embed").clone(),
                        f.contains("pooled_embed") ? f.tensor("pooled_embed").clone() : torch::Tensor(),
                        f.contains("attention_mask") ? f.tensor("attention_mask").clone() : torch::Tensor()};
        if (e.text.dim() == 3 && e.text.size(1) == length && (!e.mask.defined() || e.mask.size(-1) == length)) {
          files_.insert(file);
          scratch_ = std::move(e);
          return scratch_;
        }
      }
    } catch (const io::SafetensorsError&) {
    }
  }
  if (!encoder_)
    throw UserError("unload_text_encoder: the caption '" + caption.text +
                    "' was not precomputed (use cache_text_embeddings without shuffle_tokens)");
  if (before_encode_) std::exchange(before_encode_, nullptr)();
  const text::PromptEmbedding p = encoder_->encode(caption.text, images_of(caption));
  TextEmbedding e{p.text.slice(1, 0, length), p.pooled, p.mask.defined() ? p.mask.slice(1, 0, length) : p.mask};
  if (e.text.size(1) < length) e.text = torch::constant_pad_nd(e.text, {0, 0, 0, length - e.text.size(1)});
  if (e.mask.defined() && e.mask.size(1) < length)
    e.mask = torch::constant_pad_nd(e.mask, {0, length - e.mask.size(1)});
  if (!cache_) {
    scratch_ = std::move(e);
    return scratch_;
  }
  // A copy of just these rows (a view would keep the encoder's whole padded output alive): on disk beside
  // the image, as AI Toolkit keeps cached text embeddings (_t_e_cache/) and brings each batch's to the
  // device; a sample prompt's, or one whose folder cannot be written, in host memory.
  {
    memory::HostScope host;
    e.text = e.text.to(torch::kCPU).clone();
    if (e.pooled.defined()) e.pooled = e.pooled.to(torch::kCPU).clone();
    if (e.mask.defined()) e.mask = e.mask.to(torch::kCPU).clone();
  }
  if (!file.empty()) {
    try {
      fs::create_directories(file.parent_path());
      std::vector<std::pair<std::string, torch::Tensor>> tensors{{"text_embed", e.text}};
      if (e.pooled.defined()) tensors.emplace_back("pooled_embed", e.pooled);
      if (e.mask.defined()) tensors.emplace_back("attention_mask", e.mask);  // PromptEmbeds.save's key
      io::save_safetensors(file, tensors, {{"gclab_key", file_key(caption)}});
      files_.insert(file);
      scratch_ = std::move(e);
      return scratch_;
    } catch (const std::exception& x) {
      log::warn(std::string("cache_text_embeddings: cannot write ") + file.string() + " (" + x.what() +
                "); the embedding stays in host memory");
    }
  }
  return cached_.emplace(key, std::move(e)).first->second;
}

}  // namespace gclab::data
