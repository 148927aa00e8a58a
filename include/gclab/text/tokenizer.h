// Tokenizers, read from a model folder's tokenizer*/ files, behind one interface. T5's: the SentencePiece
// model (spiece.model) through Debian's libsentencepiece, as transformers' T5Tokenizer encodes a caption: the
// pieces' ids, then </s>; cut to the pipeline's max_sequence_length (the </s> kept last) and padded with
// <pad> to it, as FLUX's and SD3's pipelines call it (padding="max_length", truncation=True). Without
// tokenizer files (random weights), a hashing tokenizer gives ids in the encoder's vocabulary with the same
// special tokens and about the real token counts.
#pragma once

#include <torch/types.h>

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

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // A text's ids with the tokenizer's own special tokens (CLIP: <|startoftext|> ... <|endoftext|>; T5: ...
  // </s>; Qwen: none), cut to max_length (0: no limit) keeping the closing token last; no padding.
  virtual std::vector<int64_t> encode(const std::string& text, int64_t max_length = 0) const = 0;
  virtual int64_t pad_id() const = 0;
  // Texts padded with pad_id() (and cut) to max_length; the mask marks the tokens.
  TokenizedBatch encode_batch(const std::vector<std::string>& texts, int64_t max_length) const;
};

// The stand-in for a tokenizer without its files: pre-tokens as the real byte-level tokenizers (Qwen's and
// CLIP's regexes) split them — a special token written <|name|>, an English contraction ('s 't 're 've 'm
// 'll 'd), a run of letters, each digit, a run of other visible characters, each newline — lower-cased and
// hashed (FNV-1a) into [first_id, end_id); `bos` before and `eos` after them when set (>= 0). The chat
// templates' prefixes come out at the real tokenizer's counts: Qwen-Image's 34 tokens, the edit
// pipelines' 64 (their prompt_template_encode_start_idx).
struct HashingVocabulary {
  int64_t first_id = 0, end_id = 0;
  int64_t bos = -1, eos = -1, pad = 0;
  // Qwen's regex: a space before a digit or at the end of the text is a token of its own ("Picture 1: "
  // before <|vision_start|> is 5 tokens); CLIP's drops every space.
  bool space_tokens = false;
};

class HashingTokenizer : public Tokenizer {
 public:
  explicit HashingTokenizer(const HashingVocabulary& vocabulary) : v_(vocabulary) {}
  std::vector<int64_t> encode(const std::string& text, int64_t max_length = 0) const override;
  int64_t pad_id() const override { return v_.pad; }

 private:
  HashingVocabulary v_;
};

class T5Tokenizer : public Tokenizer {
 public:
  // `path`: a spiece.model file, or a folder holding one (tokenizer_2/, tokenizer_3/). Throws
  // std::runtime_error naming the file when it is missing or not a SentencePiece model.
  explicit T5Tokenizer(const std::filesystem::path& path);
  ~T5Tokenizer();
  T5Tokenizer(T5Tokenizer&&) noexcept;
  T5Tokenizer& operator=(T5Tokenizer&&) noexcept;

  // A caption's ids with </s>, cut to max_length (0: no limit) keeping </s> last; no padding.
  std::vector<int64_t> encode(const std::string& text, int64_t max_length = 0) const override;
  int64_t eos_id() const { return eos_; }
  int64_t pad_id() const override { return pad_; }
  int64_t vocab_size() const;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int64_t eos_ = 1, pad_ = 0;
};

}  // namespace gclab::text
