// A transformer-like block stack for checkpoint tests and the micro-benchmark: pre-norm attention and
// MLP sub-blocks with residuals, dropout, frozen base weights and trainable LoRA-style adapters — the
// cases where checkpointing bites real users. Weights are filled deterministically from a seed.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "gclab/ckpt/wrapper.h"

namespace gclab::testing {

struct ToyBlockOptions {
  int64_t width = 64;
  int64_t heads = 4;
  int64_t mlp_ratio = 4;
  int64_t lora_rank = 4;
  double dropout = 0.1;
  bool frozen_base = true;  // base weights frozen, adapters trained (LoRA); false: everything trained
};

// y = x + attn(norm1(x));  out = y + mlp(norm2(y))
class ToyBlock : public gclab::ckpt::Block {
 public:
  explicit ToyBlock(const ToyBlockOptions& o) : o_(o) {
    norm1 = register_module("norm1",
                            torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.width}).elementwise_affine(false)));
    norm2 = register_module("norm2",
                            torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.width}).elementwise_affine(false)));
    qkv = register_module("qkv", torch::nn::Linear(o.width, 3 * o.width));
    proj = register_module("proj", torch::nn::Linear(o.width, o.width));
    fc1 = register_module("fc1", torch::nn::Linear(o.width, o.mlp_ratio * o.width));
    fc2 = register_module("fc2", torch::nn::Linear(o.mlp_ratio * o.width, o.width));
    // LoRA-style adapters on the query projection and the first MLP layer; up starts non-zero so the
    // adapter path contributes to the output from step one (gradients reach both factors).
    q_down = register_parameter("q_lora_down", torch::randn({o.lora_rank, o.width}) * 0.1);
    q_up = register_parameter("q_lora_up", torch::randn({o.width, o.lora_rank}) * 0.1);
    fc1_down = register_parameter("fc1_lora_down", torch::randn({o.lora_rank, o.width}) * 0.1);
    fc1_up = register_parameter("fc1_lora_up", torch::randn({o.mlp_ratio * o.width, o.lora_rank}) * 0.1);
    if (o.frozen_base) {
      for (auto* m : {qkv.ptr().get(), proj.ptr().get(), fc1.ptr().get(), fc2.ptr().get()})
        for (auto& p : m->parameters()) p.set_requires_grad(false);
    }
  }

  std::vector<torch::Tensor> forward_block(const std::vector<torch::Tensor>& inputs,
                                           const gclab::ckpt::SubBlockRunner& run) override {
    torch::Tensor x = inputs.at(0);
    const auto attn =
        run(gclab::ckpt::SubBlock::attn,
            [this](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{attention(in[0])}; }, {x});
    torch::Tensor y = x + attn[0];
    const auto mlp_out =
        run(gclab::ckpt::SubBlock::mlp,
            [this](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{mlp(in[0])}; }, {y});
    return {y + mlp_out[0]};
  }

  torch::Tensor attention(const torch::Tensor& x) {
    const auto b = x.size(0), n = x.size(1), d = o_.width, h = o_.heads;
    torch::Tensor hx = norm1(x);
    torch::Tensor qkv_out = qkv(hx);
    auto chunks = qkv_out.chunk(3, -1);
    torch::Tensor q = chunks[0] + torch::nn::functional::linear(torch::nn::functional::linear(hx, q_down), q_up);
    auto heads = [&](const torch::Tensor& t) { return t.view({b, n, h, d / h}).transpose(1, 2); };
    torch::Tensor a = at::scaled_dot_product_attention(heads(q), heads(chunks[1]), heads(chunks[2]));
    a = a.transpose(1, 2).reshape({b, n, d});
    return torch::dropout(proj(a), o_.dropout, is_training());
  }

  torch::Tensor mlp(const torch::Tensor& y) {
    torch::Tensor hy = norm2(y);
    torch::Tensor h1 = fc1(hy) + torch::nn::functional::linear(torch::nn::functional::linear(hy, fc1_down), fc1_up);
    h1 = torch::gelu(h1, "tanh");
    h1 = torch::dropout(h1, o_.dropout, is_training());
    return fc2(h1);
  }

  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
  torch::Tensor q_down, q_up, fc1_down, fc1_up;

 private:
  ToyBlockOptions o_;
};

// L blocks, each in a CheckpointWrapper (policy switchable at run time).
struct ToyStack {
  std::vector<gclab::ckpt::CheckpointWrapper> blocks;

  ToyStack(int num_blocks, const ToyBlockOptions& o, uint64_t seed) {
    torch::manual_seed(seed);
    for (int i = 0; i < num_blocks; ++i)
      blocks.emplace_back(std::make_shared<ToyBlock>(o), "blocks." + std::to_string(i));
  }
  void to(torch::Device device) {
    for (auto& b : blocks) b->to(device);
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : blocks) x = b->forward({x})[0];
    return x;
  }
  std::vector<torch::Tensor> trainable() const {
    std::vector<torch::Tensor> out;
    for (const auto& b : blocks)
      for (const auto& p : b->parameters())
        if (p.requires_grad()) out.push_back(p);
    return out;
  }
  void zero_grad() {
    for (auto& p : trainable()) p.mutable_grad() = torch::Tensor();
  }
  std::vector<torch::Tensor> grads() const {
    std::vector<torch::Tensor> out;
    for (const auto& p : trainable()) out.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    return out;
  }
};

}  // namespace gclab::testing
