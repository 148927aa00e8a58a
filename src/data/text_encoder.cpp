#include "gclab/data/text_encoder.h"

#include <cctype>
#include <cmath>

namespace gclab::data {

TextEncoder::TextEncoder(const TextEncoderOptions& options) : o_(options) {
  // Its own generator: building the encoder never moves the training RNG.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o_.seed);
  auto randn = [&](std::vector<int64_t> shape, double std) {
    return at::normal(0.0, std, shape, gen, torch::TensorOptions().dtype(torch::kFloat));
  };
  const int64_t d = o_.width;
  embedding_ = randn({o_.vocabulary, d}, 1.0);
  positions_ = randn({o_.max_tokens, d}, 0.1);
  for (int64_t l = 0; l < o_.layers; ++l)
    layers_.push_back({randn({3 * d, d}, 1.0 / std::sqrt(d)), randn({d, d}, 1.0 / std::sqrt(d)),
                       randn({4 * d, d}, 1.0 / std::sqrt(d)), randn({d, 4 * d}, 1.0 / std::sqrt(4 * d))});
  out_proj_ = randn({o_.text_dim, d}, 1.0 / std::sqrt(d));
  if (o_.pooled_dim > 0) pooled_proj_ = randn({o_.pooled_dim, d}, 1.0 / std::sqrt(d));
}

std::vector<int64_t> TextEncoder::tokenize(const std::string& caption) const {
  std::vector<int64_t> ids;
  std::string word;
  auto flush = [&] {
    if (word.empty()) return;
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : word) h = (h ^ c) * 1099511628211ull;
    ids.push_back(2 + static_cast<int64_t>(h % static_cast<uint64_t>(o_.vocabulary - 2)));
    word.clear();
  };
  for (unsigned char c : caption) {
    if (std::isalnum(c) || c >= 0x80)
      word += static_cast<char>(std::tolower(c));
    else
      flush();
  }
  flush();
  ids.push_back(1);
  return ids;
}

TextEmbedding TextEncoder::encode(const std::vector<std::string>& captions, int64_t length) {
  torch::NoGradGuard no_grad;
  const int64_t b = static_cast<int64_t>(captions.size()), d = o_.width;
  const int64_t n = std::min(length, o_.max_tokens);
  torch::Tensor ids = torch::zeros({b, n}, torch::kLong), mask = torch::zeros({b, n}, torch::kBool);
  for (int64_t i = 0; i < b; ++i) {
    const auto tok = tokenize(captions[static_cast<size_t>(i)]);
    for (int64_t j = 0; j < n && j < static_cast<int64_t>(tok.size()); ++j) {
      ids[i][j] = tok[static_cast<size_t>(j)];
      mask[i][j] = true;
    }
  }
  torch::Tensor x = embedding_.index_select(0, ids.reshape({-1})).reshape({b, n, d}) + positions_.narrow(0, 0, n);
  // Padding positions are never attended to; every row has its end token, so no row is empty.
  const torch::Tensor attn_mask = mask.unsqueeze(1).unsqueeze(1).expand({b, 1, n, n});
  for (const auto& layer : layers_) {
    const torch::Tensor h = at::layer_norm(x, {d});
    auto qkv = torch::nn::functional::linear(h, layer[0]).chunk(3, -1);
    auto heads = [&](const torch::Tensor& t) { return t.reshape({b, n, 4, d / 4}).transpose(1, 2); };
    const torch::Tensor a = at::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), attn_mask)
                                .transpose(1, 2)
                                .reshape({b, n, d});
    x = x + torch::nn::functional::linear(a, layer[1]);
    const torch::Tensor m = torch::gelu(torch::nn::functional::linear(at::layer_norm(x, {d}), layer[2]), "tanh");
    x = x + torch::nn::functional::linear(m, layer[3]);
  }
  x = at::layer_norm(x, {d}) * mask.unsqueeze(-1);
  TextEmbedding out;
  out.text = torch::nn::functional::linear(x, out_proj_);
  if (pooled_proj_.defined()) {
    const torch::Tensor mean = x.sum(1) / mask.sum(1, true).clamp_min(1);
    out.pooled = torch::nn::functional::linear(mean, pooled_proj_);
  }
  return out;
}

int64_t TextEncoder::parameter_bytes() const {
  int64_t bytes = embedding_.nbytes() + positions_.nbytes() + out_proj_.nbytes();
  if (pooled_proj_.defined()) bytes += pooled_proj_.nbytes();
  for (const auto& l : layers_)
    for (const auto& t : l) bytes += t.nbytes();
  return static_cast<int64_t>(bytes);
}

}  // namespace gclab::data
