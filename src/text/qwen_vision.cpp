#include "gclab/text/qwen_vision.h"

#include <string>

namespace gclab::text {

QwenVisionConfig QwenVisionConfig::tiny(int64_t out_hidden) {
  QwenVisionConfig c;
  c.depth = 2, c.hidden_size = 32, c.intermediate_size = 64, c.num_heads = 4, c.out_hidden_size = out_hidden;
  return c;
}

QwenVisionTowerImpl::QwenVisionTowerImpl(const QwenVisionConfig& c, const torch::TensorOptions& options) : config_(c) {
  const int64_t d = c.hidden_size;
  auto patch = register_module("patch_embed", std::make_shared<torch::nn::Module>());
  patch->register_module("proj", std::make_shared<torch::nn::Module>())
      ->register_parameter(
          "weight", torch::randn({d, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}, options) * 0.02,
          /*requires_grad=*/false);
  auto blocks = register_module("blocks", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < c.depth; ++i) {
    auto b = blocks->register_module(std::to_string(i), std::make_shared<torch::nn::Module>());
    b->register_module("norm1", nn::RMSNorm(d, 1e-6, true, options));
    b->register_module("norm2", nn::RMSNorm(d, 1e-6, true, options));
    auto attn = b->register_module("attn", std::make_shared<torch::nn::Module>());
    attn->register_module("qkv", nn::Linear(d, 3 * d, true, options));
    attn->register_module("proj", nn::Linear(d, d, true, options));
    auto mlp = b->register_module("mlp", std::make_shared<torch::nn::Module>());
    mlp->register_module("gate_proj", nn::Linear(d, c.intermediate_size, true, options));
    mlp->register_module("up_proj", nn::Linear(d, c.intermediate_size, true, options));
    mlp->register_module("down_proj", nn::Linear(c.intermediate_size, d, true, options));
    blocks_.push_back(b);
  }
  const int64_t merged = d * c.spatial_merge_size * c.spatial_merge_size;
  auto merger = register_module("merger", std::make_shared<torch::nn::Module>());
  merger->register_module("ln_q", nn::RMSNorm(d, 1e-6, true, options));
  auto mlp = merger->register_module("mlp", std::make_shared<torch::nn::Module>());
  mlp->register_module("0", nn::Linear(merged, merged, true, options));
  mlp->register_module("2", nn::Linear(merged, c.out_hidden_size, true, options));
  for (auto& p : parameters()) p.set_requires_grad(false);
}

}  // namespace gclab::text
