// Byte-level BPE, as Hugging Face's tokenizers library runs it (the BPE model of CLIP's and Qwen's
// tokenizers): a pre-token's UTF-8 bytes become GPT-2's printable byte alphabet (bytes_to_unicode), an
// optional end-of-word suffix goes on the last symbol (CLIP: "</w>"), then the merges of merges.txt are
// applied lowest rank first and the symbols looked up in vocab.json (an unknown one: the unk id). The
// text rules around it (Unicode normalization, lower-casing, the pre-tokenizer's regex) go through ICU
// (Debian's libicu) in src/text/bpe.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gclab/text/tokenizer.h"

namespace gclab::text {

class ByteLevelBpe {
 public:
  // Throws std::runtime_error naming the file when vocab.json or merges.txt is missing or malformed.
  ByteLevelBpe(const std::filesystem::path& vocab_json, const std::filesystem::path& merges_txt,
               std::string end_of_word_suffix, const std::string& unk_token);
  // The same from a tokenizer.json's model: its vocab and its merges (ranked in order); `ignore_merges`: a
  // pre-token the vocabulary holds whole is that token (the tokenizers library's BPE.ignore_merges).
  ByteLevelBpe(std::unordered_map<std::string, int64_t> vocab,
               const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
               const std::string& unk_token = "");
  // Appends the ids of one pre-token (UTF-8).
  void encode_piece(const std::string& piece, std::vector<int64_t>& out) const;
  // The id of a token written in the byte alphabet (a special token's text); -1 when absent.
  int64_t id(const std::string& token) const;
  int64_t size() const { return static_cast<int64_t>(vocab_.size()); }

 private:
  std::unordered_map<std::string, int64_t> vocab_;
  std::map<std::pair<std::string, std::string>, int64_t> ranks_;
  std::string suffix_;
  int64_t unk_ = -1;
  bool ignore_merges_ = false;
  std::vector<std::string> byte_symbol_;  // byte -> its printable symbol (UTF-8)
};

// CLIP's tokenizer as transformers 5 builds CLIPTokenizer: NFC, runs of whitespace to one space, lower case;
// pre-tokens by `<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+`;
// byte-level BPE with "</w>"; <|startoftext|> ... <|endoftext|> around them, cut keeping both. Pads with
// tokenizer_config.json's pad_token (CLIP-L: <|endoftext|>; SD3's bigG tokenizer: "!").
class ClipTokenizer : public Tokenizer {
 public:
  // `folder`: a tokenizer folder with vocab.json and merges.txt (tokenizer_config.json optional).
  explicit ClipTokenizer(const std::filesystem::path& folder);
  std::vector<int64_t> encode(const std::string& text, int64_t max_length = 0) const override;
  int64_t pad_id() const override { return pad_; }
  int64_t vocab_size() const { return bpe_.size(); }

 private:
  ByteLevelBpe bpe_;
  int64_t bos_ = 0, eos_ = 0, pad_ = 0;
  std::vector<std::pair<std::string, int64_t>> specials_;  // matched in the text before normalizing
};

// Qwen's tokenizer (Qwen2.5-VL's and Qwen3's) as transformers 5 builds Qwen2Tokenizer: NFC; pre-tokens by
// Qwen's regex (contractions, letters with one leading non-letter, single digits, punctuation runs, line
// breaks, spaces), the text between matches kept; byte-level BPE without a suffix; no tokens added around
// the text. The added tokens (tokenizer_config.json's added_tokens_decoder: <|im_start|>, <|im_end|>, ...)
// are matched in the text first. Cut at max_length; pads with pad_token (<|endoftext|>).
class QwenTokenizer : public Tokenizer {
 public:
  explicit QwenTokenizer(const std::filesystem::path& folder);
  std::vector<int64_t> encode(const std::string& text, int64_t max_length = 0) const override;
  int64_t pad_id() const override { return pad_; }

 private:
  ByteLevelBpe bpe_;
  std::vector<std::pair<std::string, int64_t>> added_;
  int64_t pad_ = 0;
};

// A byte-level BPE tokenizer that a tokenizers-library tokenizer.json alone describes (Mistral-Small-3.1's
// "tekken" tokenizer as transformers ships it: no vocab.json / merges.txt): the BPE model's vocab, merges and
// ignore_merges and unk_token (byte_fallback and dropout refused); the pre-tokenizer's Split regex (isolated)
// before a ByteLevel step without a regex of its own (or ByteLevel with GPT-2's); no normalizer or NFC; the
// added tokens matched in the text first (lstrip / rstrip / single_word refused); the post-processor not run. The chat
// templates write their special tokens (<s>, [INST]), so none is added around the text. Cut at max_length;
// pads with tokenizer_config.json's pad_token (else "<pad>"). A file it cannot follow is refused naming the
// part (std::runtime_error).
class TokenizerJsonBpe : public Tokenizer {
 public:
  explicit TokenizerJsonBpe(const std::filesystem::path& folder);
  ~TokenizerJsonBpe() override;
  std::vector<int64_t> encode(const std::string& text, int64_t max_length = 0) const override;
  int64_t pad_id() const override { return pad_; }

 private:
  struct Rules;
  std::unique_ptr<ByteLevelBpe> bpe_;
  std::unique_ptr<Rules> rules_;
  std::vector<std::pair<std::string, int64_t>> added_;
  int64_t pad_ = 0;
};

// Whether `folder` holds only a tokenizer.json (no vocab.json / merges.txt beside it).
bool has_tokenizer_json_only(const std::filesystem::path& folder);

// Whether `folder` holds a byte-level BPE tokenizer's files (vocab.json and merges.txt).
bool has_bpe_files(const std::filesystem::path& folder);

}  // namespace gclab::text
