#include "gclab/text/tokenizer.h"

#include <sentencepiece_processor.h>

#include <stdexcept>

namespace gclab::text {

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

TokenizedBatch T5Tokenizer::encode_batch(const std::vector<std::string>& texts, int64_t max_length) const {
  const auto n = static_cast<int64_t>(texts.size());
  TokenizedBatch b{torch::full({n, max_length}, pad_, torch::kLong), torch::zeros({n, max_length}, torch::kLong)};
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
