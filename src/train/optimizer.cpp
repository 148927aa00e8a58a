#include "gclab/train/optimizer.h"

#include <cmath>
#include <stdexcept>

namespace gclab::train {

void Optimizer::step(double lr) {
  torch::NoGradGuard no_grad;
  ++steps_;
  const double bc1 = 1 - std::pow(o_.beta1, static_cast<double>(steps_));
  const double bc2 = 1 - std::pow(o_.beta2, static_cast<double>(steps_));
  std::vector<std::string> names;
  std::vector<torch::Tensor> p, g, m, v;
  for (auto& [name, param] : params_) {
    if (!param.grad().defined()) continue;
    auto [m_i, v_i] = moments(name, param);
    names.push_back(name), p.push_back(param), g.push_back(param.grad()), m.push_back(m_i), v.push_back(v_i);
  }
  if (p.empty()) return;
  // torch.optim.AdamW's update, step for step, as multi-tensor (foreach) kernels: a handful of launches a
  // step on CUDA instead of a dozen per parameter. Decoupled decay, moments, bias-corrected step.
  at::_foreach_mul_(p, 1 - lr * o_.weight_decay);
  at::_foreach_mul_(m, o_.beta1);
  at::_foreach_add_(m, g, 1 - o_.beta1);
  at::_foreach_mul_(v, o_.beta2);
  at::_foreach_addcmul_(v, g, g, 1 - o_.beta2);
  std::vector<torch::Tensor> denom = at::_foreach_sqrt(v);
  at::_foreach_div_(denom, std::sqrt(bc2));
  at::_foreach_add_(denom, o_.eps);
  at::_foreach_addcdiv_(p, m, denom, -lr / bc1);
  for (size_t i = 0; i < names.size(); ++i) keep(names[i], m[i], v[i]);
}

void Optimizer::zero_grad() {
  for (auto& [name, p] : params_) p.mutable_grad() = torch::Tensor();
}

namespace {

// fp32 moments: torch.optim.AdamW's update, step for step.
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<std::pair<std::string, torch::Tensor>> params, AdamWOptions o) : Optimizer(std::move(params), o) {}

  std::pair<torch::Tensor, torch::Tensor> moments(const std::string& name, const torch::Tensor& p) override {
    auto& mv = moments_[name];
    if (!mv.first.defined()) mv = {torch::zeros_like(p), torch::zeros_like(p)};
    return mv;  // the stored tensors themselves: the update is in place
  }
  void keep(const std::string&, const torch::Tensor&, const torch::Tensor&) override {}
  std::vector<std::pair<std::string, torch::Tensor>> state() const override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    out.emplace_back("step", torch::tensor(steps_));
    for (const auto& [name, mv] : moments_) {
      out.emplace_back(name + ".exp_avg", mv.first);
      out.emplace_back(name + ".exp_avg_sq", mv.second);
    }
    return out;
  }
  void load_state(const std::map<std::string, torch::Tensor>& s) override {
    steps_ = s.at("step").item<int64_t>();
    for (auto& [name, p] : params_) {
      const auto m = s.find(name + ".exp_avg"), v = s.find(name + ".exp_avg_sq");
      if (m != s.end() && v != s.end())
        moments_[name] = {m->second.to(p.device()).clone(), v->second.to(p.device()).clone()};
    }
  }
  int64_t state_bytes() const override {
    int64_t b = 0;
    for (const auto& [name, mv] : moments_) b += mv.first.nbytes() + mv.second.nbytes();
    return b;
  }
  int64_t expected_state_bytes() const override {
    int64_t b = 0;
    for (const auto& [name, p] : params_) b += 2 * static_cast<int64_t>(p.nbytes());  // two moments like p
    return b;
  }

 private:
  std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> moments_;
};

// 8-bit moments, block-wise (see optimizer.h).
class AdamW8bit : public Optimizer {
 public:
  AdamW8bit(std::vector<std::pair<std::string, torch::Tensor>> params, AdamWOptions o)
      : Optimizer(std::move(params), o) {}
  static constexpr int64_t kBlock = 256;

  struct Quantized {
    torch::Tensor codes;  // int8 (m) or uint8 (sqrt v), padded to whole blocks
    torch::Tensor scale;  // float32 per block
  };

  std::pair<torch::Tensor, torch::Tensor> moments(const std::string& name, const torch::Tensor& p) override {
    const auto it = state_.find(name);
    if (it == state_.end()) return {torch::zeros_like(p), torch::zeros_like(p)};
    return {dequantize(it->second.first, p, true), dequantize(it->second.second, p, false)};
  }
  void keep(const std::string& name, const torch::Tensor& m, const torch::Tensor& v) override {
    state_[name] = {quantize(m, true), quantize(v, false)};
  }
  std::vector<std::pair<std::string, torch::Tensor>> state() const override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    out.emplace_back("step", torch::tensor(steps_));
    for (const auto& [name, s] : state_) {
      out.emplace_back(name + ".exp_avg.codes", s.first.codes);
      out.emplace_back(name + ".exp_avg.scale", s.first.scale);
      out.emplace_back(name + ".exp_avg_sq.codes", s.second.codes);
      out.emplace_back(name + ".exp_avg_sq.scale", s.second.scale);
    }
    return out;
  }
  void load_state(const std::map<std::string, torch::Tensor>& s) override {
    steps_ = s.at("step").item<int64_t>();
    for (auto& [name, p] : params_) {
      auto get = [&](const std::string& k) { return s.at(name + k).to(p.device()).clone(); };
      if (s.count(name + ".exp_avg.codes"))
        state_[name] = {{get(".exp_avg.codes"), get(".exp_avg.scale")},
                        {get(".exp_avg_sq.codes"), get(".exp_avg_sq.scale")}};
    }
  }
  int64_t expected_state_bytes() const override {
    int64_t b = 0;
    for (const auto& [name, p] : params_) {
      const int64_t blocks = (p.numel() + kBlock - 1) / kBlock;
      b += 2 * (blocks * kBlock + blocks * 4);  // two moments: a byte a value (padded) and a float32 scale a block
    }
    return b;
  }
  int64_t state_bytes() const override {
    int64_t b = 0;
    for (const auto& [name, s] : state_)
      b += s.first.codes.nbytes() + s.first.scale.nbytes() + s.second.codes.nbytes() + s.second.scale.nbytes();
    return b;
  }

 private:
  static torch::Tensor blocks(const torch::Tensor& x) {
    const int64_t n = x.numel(), padded = (n + kBlock - 1) / kBlock * kBlock;
    return torch::constant_pad_nd(x.reshape({-1}), {0, padded - n}).reshape({-1, kBlock});
  }
  static Quantized quantize(const torch::Tensor& x, bool is_signed) {
    if (is_signed) {
      const torch::Tensor b = blocks(x), scale = b.abs().amax(1).clamp_min(1e-30);
      return {(b / scale.unsqueeze(1) * 127).round().to(torch::kChar), scale};
    }
    const torch::Tensor b = blocks(x).sqrt(), scale = b.amax(1).clamp_min(1e-30);
    return {(b / scale.unsqueeze(1) * 255).round().to(torch::kByte), scale};
  }
  static torch::Tensor dequantize(const Quantized& q, const torch::Tensor& like, bool is_signed) {
    torch::Tensor b = q.codes.to(torch::kFloat) * q.scale.unsqueeze(1) / (is_signed ? 127.0 : 255.0);
    if (!is_signed) b = b.square();
    return b.reshape({-1}).narrow(0, 0, like.numel()).reshape(like.sizes()).to(like.scalar_type());
  }

  std::map<std::string, std::pair<Quantized, Quantized>> state_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(config::OptimizerKind kind,
                                          std::vector<std::pair<std::string, torch::Tensor>> params,
                                          const AdamWOptions& options) {
  switch (kind) {
    case config::OptimizerKind::adamw8bit:
      return std::unique_ptr<Optimizer>(new AdamW8bit(std::move(params), options));
    case config::OptimizerKind::adamw:
      break;
  }
  return std::unique_ptr<Optimizer>(new AdamW(std::move(params), options));
}

double scheduled_lr(config::LrScheduler scheduler, double base_lr, int64_t step, int64_t total_steps) {
  using config::LrScheduler;
  const double progress = total_steps > 0 ? static_cast<double>(step) / static_cast<double>(total_steps) : 0.0;
  switch (scheduler) {
    case LrScheduler::constant:
      return base_lr;
    case LrScheduler::constant_with_warmup: {
      const double warmup = std::max(1.0, 0.05 * static_cast<double>(total_steps));
      return base_lr * std::min(1.0, (static_cast<double>(step) + 1) / warmup);
    }
    case LrScheduler::linear:
      return base_lr * std::max(0.0, 1.0 - progress);
    case LrScheduler::cosine:
      return base_lr * 0.5 * (1 + std::cos(std::acos(-1.0) * std::min(progress, 1.0)));
  }
  return base_lr;
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> squares;
  for (const auto& p : params)
    if (p.grad().defined()) squares.push_back(p.grad().to(torch::kDouble).pow(2).sum());
  if (squares.empty()) return 0.0;
  const double norm = std::sqrt(torch::stack(squares).sum().item<double>());
  if (max_norm > 0 && norm > max_norm) {
    const double factor = max_norm / (norm + 1e-6);
    for (const auto& p : params)
      if (p.grad().defined()) p.grad().mul_(factor);
  }
  return norm;
}

}  // namespace gclab::train
