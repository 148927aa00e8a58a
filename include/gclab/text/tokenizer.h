// Tokenizers, read from a model folder's tokenizer*/ files. T5's: the SentencePiece model (spiece.model)
// through Debian's libsentencepiece, as transformers' T5Tokenizer encodes a caption: the pieces' ids, then
// </s>; cut to the pipeline's max_sequence_length (the </s> kept last) and padded with <pad> to it, as
// FLUX's and SD3's pipelines call it (padding="max_length", truncation=True).
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace gclab::text {

struct TokenizedBatch {
  torch::Tensor input_ids;       // [B, length] int64
  torch::Tensor attention_mask;  // [B, length] int64: 1 for a token, 0 for padding
};

class T5Tokenizer {
 public:
  // `path`: a spiece.model file, or a folder holding one (tokenizer_2/, tokenizer_3/). Throws
  // std::runtime_error naming the file when it is missing or not a SentencePiece model.
  explicit T5Tokenizer(const std::filesystem::path& path);
  ~T5Tokenizer();
  T5Tokenizer(T5Tokenizer&&) noexcept;
  T5Tokenizer& operator=(T5Tokenizer&&) noexcept;

  // A caption's ids with </s>, cut to max_length (0: no limit) keeping </s> last; no padding.
  std::vector<int64_t> encode(const std::string& text, int64_t max_length = 0) const;
  // Captions padded (and cut) to max_length.
  TokenizedBatch encode_batch(const std::vector<std::string>& texts, int64_t max_length) const;
  int64_t eos_id() const { return eos_; }
  int64_t pad_id() const { return pad_; }
  int64_t vocab_size() const;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int64_t eos_ = 1, pad_ = 0;
};

}  // namespace gclab::text
