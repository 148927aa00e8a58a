#include "gclab/train/optimizer.h"

#include <cmath>
#include <stdexcept>

namespace gclab::train {

using config::OptimizerKind;

namespace {

enum class Rule { AdamW, Adam, Lion, Sgd };

Rule rule_of(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::adamw:
    case OptimizerKind::adamw8bit:
      return Rule::AdamW;
    case OptimizerKind::adam:
    case OptimizerKind::adam8bit:
      return Rule::Adam;
    case OptimizerKind::lion:
    case OptimizerKind::lion8bit:
      return Rule::Lion;
    case OptimizerKind::sgd:
      break;
  }
  return Rule::Sgd;
}

bool eight_bit(OptimizerKind k) {
  return k == OptimizerKind::adamw8bit || k == OptimizerKind::adam8bit || k == OptimizerKind::lion8bit;
}

// The moments a rule keeps, by name; `signed` moments may be negative (the second moment is not).
struct MomentSpec {
  const char* name;
  bool is_signed;
};
std::vector<MomentSpec> moments_of(Rule r) {
  switch (r) {
    case Rule::AdamW:
    case Rule::Adam:
      return {{"exp_avg", true}, {"exp_avg_sq", false}};
    case Rule::Lion:
      return {{"exp_avg", true}};
    case Rule::Sgd:
      break;
  }
  return {};
}

}  // namespace

// Where the moments live between steps. get() gives float32 tensors the update may modify in place
// (zeros the first time); put() keeps them after the update.
class MomentStorage {
 public:
  explicit MomentStorage(std::vector<MomentSpec> specs) : specs_(std::move(specs)) {}
  virtual ~MomentStorage() = default;
  virtual torch::Tensor get(const std::string& param, size_t moment, const torch::Tensor& like) = 0;
  virtual void put(const std::string& param, size_t moment, const torch::Tensor& value) = 0;
  virtual std::vector<std::pair<std::string, torch::Tensor>> state() const = 0;
  virtual void load(const std::map<std::string, torch::Tensor>& state, const std::string& param,
                    const torch::Tensor& like) = 0;
  virtual int64_t bytes() const = 0;
  virtual int64_t expected_bytes(const torch::Tensor& param) const = 0;
  size_t count() const { return specs_.size(); }

 protected:
  std::string key(const std::string& param, size_t moment) const { return param + "." + specs_[moment].name; }
  std::vector<MomentSpec> specs_;
};

namespace {

class Float32Moments : public MomentStorage {
 public:
  using MomentStorage::MomentStorage;
  torch::Tensor get(const std::string& param, size_t moment, const torch::Tensor& like) override {
    auto& t = tensors_[key(param, moment)];
    if (!t.defined()) t = torch::zeros_like(like);
    return t;  // the stored tensor itself: the update is in place
  }
  void put(const std::string&, size_t, const torch::Tensor&) override {}
  std::vector<std::pair<std::string, torch::Tensor>> state() const override {
    return {tensors_.begin(), tensors_.end()};
  }
  void load(const std::map<std::string, torch::Tensor>& s, const std::string& param,
            const torch::Tensor& like) override {
    for (size_t m = 0; m < count(); ++m)
      if (const auto it = s.find(key(param, m)); it != s.end())
        tensors_[key(param, m)] = it->second.to(like.device()).clone();
  }
  int64_t bytes() const override {
    int64_t b = 0;
    for (const auto& [k, t] : tensors_) b += static_cast<int64_t>(t.nbytes());
    return b;
  }
  int64_t expected_bytes(const torch::Tensor& p) const override {
    return static_cast<int64_t>(count()) * static_cast<int64_t>(p.nbytes());
  }

 private:
  std::map<std::string, torch::Tensor> tensors_;
};

class BlockwiseInt8Moments : public MomentStorage {
 public:
  using MomentStorage::MomentStorage;
  static constexpr int64_t kBlock = 256;

  torch::Tensor get(const std::string& param, size_t moment, const torch::Tensor& like) override {
    const auto it = stored_.find(key(param, moment));
    if (it == stored_.end()) return torch::zeros_like(like);
    return dequantize(it->second, like, specs_[moment].is_signed);
  }
  void put(const std::string& param, size_t moment, const torch::Tensor& value) override {
    stored_[key(param, moment)] = quantize(value, specs_[moment].is_signed);
  }
  std::vector<std::pair<std::string, torch::Tensor>> state() const override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& [k, q] : stored_) out.emplace_back(k + ".codes", q.codes), out.emplace_back(k + ".scale", q.scale);
    return out;
  }
  void load(const std::map<std::string, torch::Tensor>& s, const std::string& param,
            const torch::Tensor& like) override {
    for (size_t m = 0; m < count(); ++m) {
      const std::string k = key(param, m);
      if (s.count(k + ".codes"))
        stored_[k] = {s.at(k + ".codes").to(like.device()).clone(), s.at(k + ".scale").to(like.device()).clone()};
    }
  }
  int64_t bytes() const override {
    int64_t b = 0;
    for (const auto& [k, q] : stored_) b += static_cast<int64_t>(q.codes.nbytes() + q.scale.nbytes());
    return b;
  }
  int64_t expected_bytes(const torch::Tensor& p) const override {
    const int64_t blocks = (p.numel() + kBlock - 1) / kBlock;
    return static_cast<int64_t>(count()) * (blocks * kBlock + blocks * 4);  // a byte a value, a float32 a block
  }

 private:
  struct Quantized {
    torch::Tensor codes;  // int8 (signed) or uint8 (sqrt of an unsigned moment), padded to whole blocks
    torch::Tensor scale;  // float32 per block
  };
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
  std::map<std::string, Quantized> stored_;
};

}  // namespace

OptimizerOptions default_options(OptimizerKind kind) {
  OptimizerOptions o;
  switch (rule_of(kind)) {
    case Rule::Lion:  // lion-pytorch: betas (0.9, 0.99), weight_decay 0
      o.beta2 = 0.99, o.weight_decay = 0;
      break;
    case Rule::Adam:  // torch.optim.Adam: weight_decay 0
    case Rule::Sgd:   // torch.optim.SGD: weight_decay 0
      o.weight_decay = 0;
      break;
    case Rule::AdamW:  // torch.optim.AdamW: weight_decay 0.01
      break;
  }
  return o;
}

Optimizer::Optimizer(OptimizerKind kind, std::vector<std::pair<std::string, torch::Tensor>> params,
                     const OptimizerOptions& options)
    : kind_(kind), params_(std::move(params)), o_(options) {
  auto specs = moments_of(rule_of(kind));
  if (eight_bit(kind))
    moments_ = std::make_unique<BlockwiseInt8Moments>(std::move(specs));
  else
    moments_ = std::make_unique<Float32Moments>(std::move(specs));
}

Optimizer::~Optimizer() = default;

void Optimizer::step(double lr) {
  torch::NoGradGuard no_grad;
  ++steps_;
  std::vector<std::string> names;
  std::vector<torch::Tensor> p, g;
  std::vector<std::vector<torch::Tensor>> m(moments_->count());
  for (auto& [name, param] : params_) {
    if (!param.grad().defined()) continue;
    names.push_back(name), p.push_back(param), g.push_back(param.grad());
    for (size_t k = 0; k < m.size(); ++k) m[k].push_back(moments_->get(name, k, param));
  }
  if (p.empty()) return;
  // Multi-tensor (foreach) kernels: a handful of launches a step on CUDA, not a dozen per parameter.
  const double wd = o_.weight_decay, b1 = o_.beta1, b2 = o_.beta2;
  switch (rule_of(kind_)) {
    case Rule::AdamW:
    case Rule::Adam: {  // torch.optim.AdamW / Adam, step for step
      const double bc1 = 1 - std::pow(b1, static_cast<double>(steps_));
      const double bc2 = 1 - std::pow(b2, static_cast<double>(steps_));
      if (rule_of(kind_) == Rule::AdamW)
        at::_foreach_mul_(p, 1 - lr * wd);  // decoupled decay
      else if (wd != 0)
        g = at::_foreach_add(g, p, wd);  // L2: the decay joins the gradient
      at::_foreach_mul_(m[0], b1);
      at::_foreach_add_(m[0], g, 1 - b1);
      at::_foreach_mul_(m[1], b2);
      at::_foreach_addcmul_(m[1], g, g, 1 - b2);
      std::vector<torch::Tensor> denom = at::_foreach_sqrt(m[1]);
      at::_foreach_div_(denom, std::sqrt(bc2));
      at::_foreach_add_(denom, o_.eps);
      at::_foreach_addcdiv_(p, m[0], denom, -lr / bc1);
      break;
    }
    case Rule::Lion: {  // lion-pytorch's update_fn
      at::_foreach_mul_(p, 1 - lr * wd);
      std::vector<torch::Tensor> update = at::_foreach_mul(m[0], b1);
      at::_foreach_add_(update, g, 1 - b1);
      for (auto& u : update) u.sign_();
      at::_foreach_add_(p, update, -lr);
      at::_foreach_mul_(m[0], b2);
      at::_foreach_add_(m[0], g, 1 - b2);
      break;
    }
    case Rule::Sgd: {  // torch.optim.SGD, no momentum
      if (wd != 0) g = at::_foreach_add(g, p, wd);
      at::_foreach_add_(p, g, -lr);
      break;
    }
  }
  for (size_t i = 0; i < names.size(); ++i)
    for (size_t k = 0; k < m.size(); ++k) moments_->put(names[i], k, m[k][i]);
}

void Optimizer::zero_grad() {
  for (auto& [name, p] : params_) p.mutable_grad() = torch::Tensor();
}

std::vector<std::pair<std::string, torch::Tensor>> Optimizer::state() const {
  auto out = moments_->state();
  out.emplace_back("step", torch::tensor(steps_));
  return out;
}

void Optimizer::load_state(const std::map<std::string, torch::Tensor>& s) {
  if (const auto it = s.find("step"); it != s.end()) steps_ = it->second.item<int64_t>();
  for (auto& [name, p] : params_) moments_->load(s, name, p);
}

int64_t Optimizer::state_bytes() const { return moments_->bytes(); }

int64_t Optimizer::expected_state_bytes() const {
  int64_t b = 0;
  for (const auto& [name, p] : params_) b += moments_->expected_bytes(p);
  return b;
}

std::unique_ptr<Optimizer> make_optimizer(OptimizerKind kind, std::vector<std::pair<std::string, torch::Tensor>> params,
                                          const OptimizerOptions& options) {
  return std::make_unique<Optimizer>(kind, std::move(params), options);
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
