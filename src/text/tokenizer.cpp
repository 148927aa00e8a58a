#include "gclab/text/tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>

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
  auto word = [](unsigned char c) { return std::isalnum(c) || c >= 0x80; };
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
    if (word(c)) {
      size_t j = i;
      while (j < text.size() && word(static_cast<unsigned char>(text[j]))) ++j;
      add(text.substr(i, j - i));
      i = j;
    } else {
      if (c == '\n' || !std::isspace(c)) add(std::string(1, static_cast<char>(c)));
      ++i;
    }
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
