#include "gclab/text/tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>
#include <string>

namespace gclab::text {

std::vector<int64_t> HashingTokenizer::encode(const std::string& text, int64_t max_length) const {
  std::vector<int64_t> ids;
  if (v_.bos >= 0) ids.push_back(v_.bos);
  const auto range = static_cast<uint64_t>(std::max<int64_t>(v_.end_id - v_.first_id, 1));
  auto add = [&](const std::string& piece) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : piece) h = (h ^ static_cast<unsigned char>(std::tolower(c))) * 1099511628211ull;
    ids.push_back(v_.first_id + static_cast<int64_t>(h % range));
  };
  auto letter = [](unsigned char c) { return std::isalpha(c) || c >= 0x80; };
  auto mark = [&](unsigned char c) { return !letter(c) && !std::isdigit(c) && !std::isspace(c); };
  auto starts = [&](size_t i, const char* s) {
    for (size_t k = 0; s[k]; ++k)
      if (i + k >= text.size() || std::tolower(static_cast<unsigned char>(text[i + k])) != s[k]) return false;
    return true;
  };
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (text.compare(i, 2, "<|") == 0) {
      const size_t end = text.find("|>", i + 2);
      if (end != std::string::npos) {
        add(text.substr(i, end + 2 - i));
        i = end + 2;
        continue;
      }
    }
    size_t j = i + 1;
    if (c == '\'') {  // the English contractions both regexes keep whole: 's 't 're 've 'm 'll 'd
      for (const char* k : {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"})
        if (starts(i, k)) j = std::max(j, i + std::char_traits<char>::length(k));
    }
    if (j > i + 1) {
      add(text.substr(i, j - i));
    } else if (letter(c)) {  // a run of letters
      while (j < text.size() && letter(static_cast<unsigned char>(text[j]))) ++j;
      add(text.substr(i, j - i));
    } else if (mark(c)) {  // a run of other visible characters
      while (j < text.size() && mark(static_cast<unsigned char>(text[j])) && text.compare(j, 2, "<|") != 0) ++j;
      add(text.substr(i, j - i));
    } else if (std::isdigit(c) || c == '\n') {  // each digit, each newline
      add(std::string(1, static_cast<char>(c)));
    } else if (v_.space_tokens) {
      // Qwen's regex keeps a space that no word or mark takes: before a digit, or ending the text (as the
      // text before a special token does).
      while (j < text.size() && text[j] != '\n' && std::isspace(static_cast<unsigned char>(text[j]))) ++j;
      if (j == text.size() || std::isdigit(static_cast<unsigned char>(text[j])) || text.compare(j, 2, "<|") == 0)
        add(" ");
    }
    i = j;
  }
  const int64_t keep = max_length > 0 ? max_length - (v_.eos >= 0 ? 1 : 0) : -1;
  if (keep >= 0 && static_cast<int64_t>(ids.size()) > keep) ids.resize(static_cast<size_t>(std::max<int64_t>(keep, 0)));
  if (v_.eos >= 0) ids.push_back(v_.eos);
  return ids;
}

T5Tokenizer::T5Tokenizer(const std::filesystem::path& path)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const std::filesystem::path file = std::filesystem::is_directory(path) ? path / "spiece.model" : path;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) throw std::runtime_error(file.string() + ": no such file");
  const auto status = sp_->Load(file.string());
  if (!status.ok()) throw std::runtime_error(file.string() + ": not a SentencePiece model (" + status.ToString() + ")");
  // T5's special tokens as its tokenizer sets them: <pad> 0, </s> 1 (the model's own ids when it has them).
  if (sp_->eos_id() >= 0) eos_ = sp_->eos_id();
  if (sp_->pad_id() >= 0) pad_ = sp_->pad_id();
}

T5Tokenizer::~T5Tokenizer() = default;
T5Tokenizer::T5Tokenizer(T5Tokenizer&&) noexcept = default;
T5Tokenizer& T5Tokenizer::operator=(T5Tokenizer&&) noexcept = default;

int64_t T5Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }

std::vector<int64_t> T5Tokenizer::encode(const std::string& text, int64_t max_length) const {
  std::vector<int> pieces;
  const auto status = sp_->Encode(text, &pieces);
  if (!status.ok()) throw std::runtime_error("SentencePiece could not encode a caption: " + status.ToString());
  std::vector<int64_t> ids(pieces.begin(), pieces.end());
  if (max_length > 0 && static_cast<int64_t>(ids.size()) > max_length - 1)
    ids.resize(std::max<int64_t>(0, max_length - 1));
  ids.push_back(eos_);
  return ids;
}

TokenizedBatch Tokenizer::encode_batch(const std::vector<std::string>& texts, int64_t max_length) const {
  const auto n = static_cast<int64_t>(texts.size());
  TokenizedBatch b{torch::full({n, max_length}, pad_id(), torch::kLong), torch::zeros({n, max_length}, torch::kLong)};
  auto ids = b.input_ids.accessor<int64_t, 2>();
  auto mask = b.attention_mask.accessor<int64_t, 2>();
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int64_t> row = encode(texts[static_cast<size_t>(i)], max_length);
    for (size_t t = 0; t < row.size(); ++t)
      ids[i][static_cast<int64_t>(t)] = row[t], mask[i][static_cast<int64_t>(t)] = 1;
  }
  return b;
}

}  // namespace gclab::text
