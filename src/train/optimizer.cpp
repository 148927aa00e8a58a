#include "gclab/train/optimizer.h"

#include "gclab/memory/meta_count.h"
#include "gclab/nn/meta_kernels.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace gclab::train {

using config::OptimizerKind;

// The moments a rule keeps, by name; `signed` moments may be negative (the second moment is not). Outside
// the anonymous namespace: MomentStorage, declared in the header, holds them.
enum class MomentShape { param, row, col, unfactored };
struct MomentSpec {
  const char* name;
  bool is_signed;
  MomentShape shape = MomentShape::param;
  // float32 whatever the parameter's dtype (Adafactor's: it casts the gradient to float32 before its state
  // is made from it, AI Toolkit's toolkit/optimizers/adafactor.py:264-265, 283-292); otherwise the
  // parameter's dtype, as torch's optimizers make theirs (zeros_like(p)).
  bool float32 = false;
};

namespace {

enum class Rule { AdamW, Adam, Lion, Adafactor, Prodigy, Sgd };

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
    case OptimizerKind::adafactor:
      return Rule::Adafactor;
    case OptimizerKind::prodigy:
      return Rule::Prodigy;
    case OptimizerKind::sgd:
      break;
  }
  return Rule::Sgd;
}

bool eight_bit(OptimizerKind k) {
  return k == OptimizerKind::adamw8bit || k == OptimizerKind::adam8bit || k == OptimizerKind::lion8bit;
}

// Which parameters a moment exists for, and its shape: like the parameter, or Adafactor's factored
// row / column vectors of a matrix (and its full second moment of anything with fewer than 2 dims).
std::vector<MomentSpec> moments_of(Rule r, const OptimizerOptions& o) {
  switch (r) {
    case Rule::AdamW:
    case Rule::Adam:
      return {{"exp_avg", true}, {"exp_avg_sq", false}};
    case Rule::Lion:
      return {{"exp_avg", true}};
    case Rule::Adafactor: {
      std::vector<MomentSpec> m = {{"exp_avg_sq_row", false, MomentShape::row, true},
                                   {"exp_avg_sq_col", false, MomentShape::col, true},
                                   {"exp_avg_sq", false, MomentShape::unfactored, true}};
      if (o.adafactor_beta1) m.push_back({"exp_avg", true, MomentShape::param, true});
      return m;
    }
    case Rule::Prodigy:
      return {{"exp_avg", true}, {"exp_avg_sq", false}, {"s", true}, {"p0", true}};
    case Rule::Sgd:
      break;
  }
  return {};
}

// The moment's shape for parameter p, or nothing when the moment does not exist for it.
std::optional<std::vector<int64_t>> moment_sizes(MomentShape shape, const torch::Tensor& p) {
  const auto s = p.sizes().vec();
  const bool factored = s.size() >= 2;
  switch (shape) {
    case MomentShape::param:
      return s;
    case MomentShape::row:  // grad_shape[:-1]
      if (!factored) return std::nullopt;
      return std::vector<int64_t>(s.begin(), s.end() - 1);
    case MomentShape::col: {  // grad_shape[:-2] + grad_shape[-1:]
      if (!factored) return std::nullopt;
      std::vector<int64_t> c(s.begin(), s.end() - 2);
      c.push_back(s.back());
      return c;
    }
    case MomentShape::unfactored:
      if (factored) return std::nullopt;
      return s;
  }
  return std::nullopt;
}

}  // namespace

torch::Tensor dynamic_quantization_map(bool is_signed) {
  // bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): for exponents 10^-6 ... 10^0,
  // the midpoints of linspace(0.1, 1) (2^i + 1 points signed, 2^(i+1) + 1 unsigned), mirrored when signed;
  // then 0 and 1, sorted. Computed in float32 as there.
  std::vector<torch::Tensor> parts;
  for (int i = 0; i < 7; ++i) {
    const int64_t items = is_signed ? (int64_t{1} << i) + 1 : (int64_t{1} << (i + 1)) + 1;
    const torch::Tensor b = torch::linspace(0.1, 1, items, torch::kFloat);
    const torch::Tensor means = (b.narrow(0, 0, items - 1) + b.narrow(0, 1, items - 1)) / 2.0;
    const double scale = std::pow(10.0, -6 + i);
    parts.push_back(means * scale);
    if (is_signed) parts.push_back(means * -scale);
  }
  parts.push_back(torch::tensor({0.0f, 1.0f}));
  return std::get<0>(torch::sort(torch::cat(parts)));
}

// Where the moments live between steps. get() gives tensors (the parameter's dtype, or float32 where the
// rule keeps float32 moments or they are 8-bit) the update may modify in place
// (zeros the first time, shaped as the moment is for that parameter); put() keeps them after the update.
class MomentStorage {
 public:
  explicit MomentStorage(std::vector<MomentSpec> specs) : specs_(std::move(specs)) {}
  virtual ~MomentStorage() = default;
  // The moment for `param` (undefined when it has none of this kind: Adafactor's factored moments).
  torch::Tensor get(const std::string& param, size_t moment, const torch::Tensor& p) {
    const auto sizes = moment_sizes(specs_[moment].shape, p);
    return sizes ? get_sized(param, moment, *sizes, p.options().dtype(dtype(moment, p))) : torch::Tensor();
  }
  torch::ScalarType dtype(size_t moment, const torch::Tensor& p) const {
    return specs_[moment].float32 ? torch::kFloat : p.scalar_type();
  }
  virtual torch::Tensor get_sized(const std::string& param, size_t moment, const std::vector<int64_t>& sizes,
                                  const torch::TensorOptions& options) = 0;
  virtual void put(const std::string& param, size_t moment, const torch::Tensor& value) = 0;
  virtual std::vector<std::pair<std::string, torch::Tensor>> state() const = 0;
  virtual void load(const std::map<std::string, torch::Tensor>& state, const std::string& param,
                    const torch::Tensor& like) = 0;
  virtual int64_t bytes() const = 0;
  size_t count() const { return specs_.size(); }

 protected:
  std::string key(const std::string& param, size_t moment) const { return param + "." + specs_[moment].name; }
  std::vector<MomentSpec> specs_;
};

namespace {

class Float32Moments : public MomentStorage {
 public:
  using MomentStorage::MomentStorage;
  torch::Tensor get_sized(const std::string& param, size_t moment, const std::vector<int64_t>& sizes,
                          const torch::TensorOptions& options) override {
    auto& t = tensors_[key(param, moment)];
    if (!t.defined()) t = torch::zeros(sizes, options);
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

 private:
  std::map<std::string, torch::Tensor> tensors_;
};

// bitsandbytes' 8-bit optimizer state (Optimizer2State / Optimizer1State, block-wise): a parameter with
// fewer than min_8bit_size = 4096 values keeps float32 moments; a larger one keeps each moment as uint8 codes
// into the dynamic map (create_dynamic_map: signed for the first moment, unsigned for the second), with one
// float32 absmax per block of 256. Between steps a moment is dequantized (code x absmax), updated in float32,
// and requantized against its new block maxima to the nearest code (optimizer_update_8bit_blockwise).
class DynamicInt8Moments : public MomentStorage {
 public:
  explicit DynamicInt8Moments(std::vector<MomentSpec> specs) : MomentStorage(specs), small_(std::move(specs)) {}
  static constexpr int64_t kBlock = 256, kMin8bitSize = 4096;

  torch::Tensor get_sized(const std::string& param, size_t moment, const std::vector<int64_t>& sizes,
                          const torch::TensorOptions& options) override {
    if (c10::multiply_integers(sizes) < kMin8bitSize)
      return small_.get_sized(param, moment, sizes, options.dtype(torch::kFloat));
    const auto it = stored_.find(key(param, moment));
    if (it == stored_.end()) return torch::zeros(sizes, options.dtype(torch::kFloat));
    const int64_t n = it->second.codes.numel();
    torch::Tensor values = nn::lookup(code(specs_[moment].is_signed, options.device()).values,
                                      it->second.codes.reshape({-1}).to(torch::kLong));
    values = torch::constant_pad_nd(values, {0, blocks(n) * kBlock - n}).reshape({-1, kBlock});
    return (values * it->second.absmax.unsqueeze(1)).reshape({-1}).narrow(0, 0, n).reshape(sizes);
  }
  void put(const std::string& param, size_t moment, const torch::Tensor& value) override {
    if (value.numel() < kMin8bitSize) return;  // small_ was updated in place
    const int64_t n = value.numel();
    const torch::Tensor padded =
        torch::constant_pad_nd(value.reshape({-1}).to(torch::kFloat), {0, blocks(n) * kBlock - n})
            .reshape({-1, kBlock});
    const torch::Tensor absmax = nn::abs(padded).amax(1);
    const torch::Tensor scaled = (padded * (1.0 / absmax.clamp_min(1e-38)).unsqueeze(1)).clamp(-1, 1).reshape({-1});
    // The nearest code: the sorted map's midpoints bound each code's interval (a tie goes to the lower).
    const torch::Tensor codes =
        nn::bucketize(scaled.narrow(0, 0, n), code(specs_[moment].is_signed, value.device()).bounds).to(torch::kByte);
    stored_[key(param, moment)] = {codes.reshape(value.sizes()), absmax};
  }
  std::vector<std::pair<std::string, torch::Tensor>> state() const override {
    std::vector<std::pair<std::string, torch::Tensor>> out = small_.state();
    for (const auto& [k, q] : stored_)
      out.emplace_back(k + ".codes", q.codes), out.emplace_back(k + ".absmax", q.absmax);
    return out;
  }
  void load(const std::map<std::string, torch::Tensor>& s, const std::string& param,
            const torch::Tensor& like) override {
    small_.load(s, param, like);
    for (size_t m = 0; m < count(); ++m) {
      const std::string k = key(param, m);
      if (s.count(k + ".codes"))
        stored_[k] = {s.at(k + ".codes").to(like.device()).clone(), s.at(k + ".absmax").to(like.device()).clone()};
    }
  }
  int64_t bytes() const override {
    int64_t b = small_.bytes();
    for (const auto& [k, q] : stored_) b += static_cast<int64_t>(q.codes.nbytes() + q.absmax.nbytes());
    return b;
  }

 private:
  struct Quantized {
    torch::Tensor codes;   // uint8, the parameter's shape
    torch::Tensor absmax;  // float32 per block of 256
  };
  struct Code {
    torch::Tensor values, bounds;  // the 256 sorted values, and the 255 midpoints between them
  };
  static int64_t blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }
  // The map on `device`, built once per device.
  const Code& code(bool is_signed, const torch::Device& device) {
    Code& c = codes_[{is_signed, device.str()}];
    if (!c.values.defined()) {
      c.values = dynamic_quantization_map(is_signed).to(device);
      c.bounds = (c.values.narrow(0, 0, 255) + c.values.narrow(0, 1, 255)) / 2;
    }
    return c;
  }
  Float32Moments small_;  // parameters under bitsandbytes' min_8bit_size keep float32 moments
  std::map<std::string, Quantized> stored_;
  std::map<std::pair<bool, std::string>, Code> codes_;
};

// A scalar the update reads on the host; on the meta device, where values do not exist, 1 (the walk's
// memory does not depend on it: Optimizer::walk).
double host_value(const torch::Tensor& t) { return t.is_meta() ? 1.0 : t.item<double>(); }

}  // namespace

OptimizerOptions default_options(OptimizerKind kind) {
  OptimizerOptions o;
  switch (rule_of(kind)) {
    case Rule::Lion:  // lion-pytorch: betas (0.9, 0.99), weight_decay 0
      o.beta2 = 0.99, o.weight_decay = 0;
      break;
    case Rule::Adafactor:  // eps (1e-30, 1e-3), weight_decay 0
      o.eps = 1e-30, o.weight_decay = 0;
      break;
    case Rule::Prodigy:  // prodigyopt: weight_decay 0; AI Toolkit passes eps=1e-6
      o.eps = 1e-6, o.weight_decay = 0;
      break;
    case Rule::Adam:  // torch.optim.Adam: weight_decay 0; AI Toolkit passes eps=1e-6 (toolkit/optimizer.py)
      o.weight_decay = 0, o.eps = 1e-6;
      break;
    case Rule::Sgd:  // torch.optim.SGD: weight_decay 0
      o.weight_decay = 0;
      break;
    case Rule::AdamW:  // torch.optim.AdamW: weight_decay 0.01; AI Toolkit passes eps=1e-6, 8-bit too
      o.eps = 1e-6;
      break;
  }
  return o;
}

OptimizerOptions options_from(const config::TrainConfig& train, const std::function<bool(const char*)>& given) {
  OptimizerOptions opt = default_options(train.optimizer);
  const config::OptimizerParams& c = train.optimizer_params;
  if (given("train.optimizer_params.weight_decay")) opt.weight_decay = c.weight_decay;
  if (given("train.optimizer_params.betas")) opt.beta1 = c.betas.at(0), opt.beta2 = c.betas.at(1);
  if (given("train.optimizer_params.eps")) opt.eps = c.eps;
  opt.scale_parameter = c.scale_parameter.value_or(opt.scale_parameter);
  opt.clip_threshold = c.clip_threshold.value_or(opt.clip_threshold);
  opt.decay_rate = c.decay_rate.value_or(opt.decay_rate);
  if (c.beta1) opt.adafactor_beta1 = c.beta1;
  opt.d0 = c.d0.value_or(opt.d0);
  opt.d_coef = c.d_coef.value_or(opt.d_coef);
  opt.growth_rate = c.growth_rate.value_or(opt.growth_rate);
  if (c.beta3) opt.beta3 = c.beta3;
  opt.use_bias_correction = c.use_bias_correction.value_or(opt.use_bias_correction);
  opt.safeguard_warmup = c.safeguard_warmup.value_or(opt.safeguard_warmup);
  opt.decouple = c.decouple.value_or(opt.decouple);
  return opt;
}

double optimizer_lr(OptimizerKind kind, double configured_lr) {
  return kind == OptimizerKind::prodigy && configured_lr < 0.1 ? 1.0 : configured_lr;
}

Optimizer::Optimizer(OptimizerKind kind, std::vector<std::pair<std::string, torch::Tensor>> params,
                     const OptimizerOptions& options)
    : kind_(kind), params_(std::move(params)), o_(options), prodigy_d_(options.d0), prodigy_d_max_(options.d0) {
  auto specs = moments_of(rule_of(kind), options);
  if (eight_bit(kind))
    moments_ = std::make_unique<DynamicInt8Moments>(std::move(specs));
  else
    moments_ = std::make_unique<Float32Moments>(std::move(specs));
}

Optimizer::~Optimizer() = default;

int64_t Optimizer::updates_of(const std::string& name) const {
  const auto it = updates_.find(name);
  return it == updates_.end() ? steps_ : it->second;
}

void Optimizer::step(double lr) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> with_grad;
  for (auto& [name, param] : params_)
    if (param.grad().defined()) with_grad.emplace_back(name, param);
  // Each parameter's own count, kept only where it differs from the optimizer's (the usual step, every
  // parameter with a gradient and none behind, touches nothing).
  if (with_grad.size() != params_.size() || !updates_.empty()) {
    std::map<std::string, int64_t> counts;  // each parameter's updates after this step
    for (auto& [name, param] : params_) counts[name] = updates_of(name) + (param.grad().defined() ? 1 : 0);
    updates_.clear();
    for (const auto& [name, count] : counts)
      if (count != steps_ + 1) updates_[name] = count;
  }
  ++steps_;
  if (with_grad.empty()) return;
  // 8-bit moments are dequantized, updated and requantized one parameter at a time, as bitsandbytes' fused
  // kernel updates each parameter in place: the dequantized float32 copies never exist for all at once.
  if (eight_bit(kind_)) {
    for (const auto& one : with_grad) update({one}, lr, updates_of(one.first));
    return;
  }
  if (rule_of(kind_) == Rule::Prodigy) {  // one group: its d over every parameter with a gradient
    update(with_grad, lr, steps_);
    return;
  }
  // The parameters by their own update counts (one group unless some skipped steps).
  std::map<int64_t, std::vector<std::pair<std::string, torch::Tensor>>> by_count;
  for (const auto& one : with_grad) by_count[updates_of(one.first)].push_back(one);
  for (const auto& [count, group] : by_count) update(group, lr, count);
}

void Optimizer::update(const std::vector<std::pair<std::string, torch::Tensor>>& params, double lr, int64_t count) {
  std::vector<std::string> names;
  std::vector<torch::Tensor> p, g;
  std::vector<std::vector<torch::Tensor>> m(moments_->count());
  for (const auto& [name, param] : params) {
    names.push_back(name), p.push_back(param), g.push_back(param.grad());
    for (size_t k = 0; k < m.size(); ++k) m[k].push_back(moments_->get(name, k, param));
  }
  // Multi-tensor (foreach) kernels: a handful of launches a step on CUDA, not a dozen per parameter.
  const double wd = o_.weight_decay, b1 = o_.beta1, b2 = o_.beta2;
  switch (rule_of(kind_)) {
    case Rule::AdamW:
    case Rule::Adam: {  // torch.optim.AdamW / Adam, step for step
      const double bc1 = 1 - std::pow(b1, static_cast<double>(count));
      const double bc2 = 1 - std::pow(b2, static_cast<double>(count));
      if (rule_of(kind_) == Rule::AdamW || eight_bit(kind_))  // bitsandbytes decouples Adam8bit's decay too
        at::_foreach_mul_(p, 1 - lr * wd);                    // decoupled decay
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
    case Rule::Adafactor:
      adafactor_step(p, g, m, lr, count);
      break;
    case Rule::Prodigy: {
      std::vector<bool> first;
      for (const auto& name : names) first.push_back(updates_of(name) == 1);
      prodigy_step(p, g, m, lr, first);
      break;
    }
    case Rule::Sgd: {  // torch.optim.SGD, no momentum
      if (wd != 0) g = at::_foreach_add(g, p, wd);
      at::_foreach_add_(p, g, -lr);
      break;
    }
  }
  for (size_t i = 0; i < names.size(); ++i)
    for (size_t k = 0; k < m.size(); ++k)
      if (m[k][i].defined()) moments_->put(names[i], k, m[k][i]);
}

// AI Toolkit's Adafactor.step, relative_step off (its setting): per parameter, beta2_t = 1 - t^decay_rate;
// v <- beta2_t v + (1 - beta2_t)(g^2 + eps) (factored: row and column means, recombined as row / mean(row) x
// col); u = g / sqrt(v), divided by max(1, RMS(u) / clip_threshold), times lr (times max(eps2, RMS(p)) with
// scale_parameter); optional first moment of u; decay; p -= u. A bfloat16 parameter is updated as a float32
// copy (`p_data_fp32`), its gradient and moments in float32, and rounded back stochastically (adafactor.py:
// 261-262, 301-305, 359-361, copy_stochastic).
void Optimizer::adafactor_step(std::vector<torch::Tensor>& p, const std::vector<torch::Tensor>& g,
                               std::vector<std::vector<torch::Tensor>>& m, double lr, int64_t count) {
  const double beta2t = 1.0 - std::pow(static_cast<double>(count), o_.decay_rate);
  auto rms = [](const torch::Tensor& t) { return t.norm(2) / std::sqrt(static_cast<double>(t.numel())); };
  for (size_t i = 0; i < p.size(); ++i) {
    const bool low_precision = p[i].scalar_type() != torch::kFloat;
    torch::Tensor w = low_precision ? p[i].to(torch::kFloat) : p[i];
    // As the reference holds them: the float32 gradient (a copy for a bfloat16 one), the update and the
    // float32 weights live to the end of the parameter's turn.
    const torch::Tensor grad = g[i].to(torch::kFloat);
    torch::Tensor &row = m[0][i], &col = m[1][i], &full = m[2][i];
    torch::Tensor update = grad.square().add_(o_.eps);
    if (row.defined()) {
      row.mul_(beta2t).add_(update.mean(-1), 1.0 - beta2t);
      col.mul_(beta2t).add_(update.mean(-2), 1.0 - beta2t);
      const torch::Tensor r_factor = (row / row.mean(-1, true)).rsqrt_().unsqueeze(-1);
      update = r_factor.mul(col.unsqueeze(-2).rsqrt()).mul_(grad);
    } else {
      full.mul_(beta2t).add_(update, 1.0 - beta2t);
      update = full.rsqrt().mul_(grad);
    }
    update.div_((rms(update) / o_.clip_threshold).clamp_(1.0));
    // lr as a tensor when scaled by the parameter's RMS: no host synchronisation.
    const torch::Tensor step_lr =
        o_.scale_parameter ? rms(w).clamp_min(o_.eps2) * lr : torch::full({}, lr, update.options());
    update.mul_(step_lr);
    if (o_.adafactor_beta1) {
      torch::Tensor& exp_avg = m[3][i];
      exp_avg.mul_(*o_.adafactor_beta1).add_(update, 1.0 - *o_.adafactor_beta1);
      update = exp_avg;
    }
    if (o_.weight_decay != 0) w.add_(w * step_lr * -o_.weight_decay);
    w.sub_(update);
    if (low_precision) copy_stochastic(p[i], w);
  }
}

// prodigyopt's Prodigy.step (one parameter group), with the sums over parameters taken on the device
// and read once: d grows to d_coef * sum_k <g_k, p0 - p_k> (weighted) / |s|_1 and scales Adam's moments.
void Optimizer::prodigy_step(std::vector<torch::Tensor>& p, const std::vector<torch::Tensor>& g,
                             std::vector<std::vector<torch::Tensor>>& m, double lr, const std::vector<bool>& first) {
  std::vector<torch::Tensor>&exp_avg = m[0], &exp_avg_sq = m[1], &s = m[2], &p0 = m[3];
  const double b1 = o_.beta1, b2 = o_.beta2, b3 = o_.beta3.value_or(std::sqrt(b2));
  const double k = static_cast<double>(steps_ - 1);
  const double bias_correction =
      o_.use_bias_correction ? std::sqrt(1 - std::pow(b2, k + 1)) / (1 - std::pow(b1, k + 1)) : 1.0;
  const double d = prodigy_d_, dlr = d * lr * bias_correction;
  std::vector<torch::Tensor> grads = g;
  if (o_.weight_decay != 0 && !o_.decouple) grads = at::_foreach_add(g, p, o_.weight_decay);
  std::vector<torch::Tensor> numerators, denominators;
  for (size_t i = 0; i < p.size(); ++i) {
    if (first[i]) p0[i].copy_(p[i]);  // state initialisation: the weights it started from
    numerators.push_back(nn::dot(grads[i].flatten().to(torch::kDouble), (p0[i] - p[i]).flatten().to(torch::kDouble)));
  }
  at::_foreach_mul_(exp_avg, b1);
  at::_foreach_add_(exp_avg, grads, d * (1 - b1));
  at::_foreach_mul_(exp_avg_sq, b2);
  at::_foreach_addcmul_(exp_avg_sq, grads, grads, d * d * (1 - b2));
  at::_foreach_mul_(s, b3);
  at::_foreach_add_(s, grads, o_.safeguard_warmup ? (d / o_.d0) * d : (d / o_.d0) * dlr);
  for (const auto& si : s) denominators.push_back(nn::abs(si).sum().to(torch::kDouble));
  // One read of the two sums for the whole step.
  torch::Tensor sums = torch::stack({torch::stack(numerators).sum(), torch::stack(denominators).sum()});
  if (!sums.is_meta()) sums = sums.cpu();
  const double d_numerator = prodigy_d_numerator_ * b3 + (d / o_.d0) * dlr * host_value(sums[0]);
  const double d_denom = host_value(sums[1]);
  if (d_denom == 0) return;  // prodigyopt: nothing to learn from yet
  if (lr > 0) {
    const double d_hat = o_.d_coef * d_numerator / d_denom;
    if (prodigy_d_ == o_.d0) prodigy_d_ = std::max(prodigy_d_, d_hat);
    prodigy_d_max_ = std::max(prodigy_d_max_, d_hat);
    prodigy_d_ = std::min(prodigy_d_max_, prodigy_d_ * o_.growth_rate);
  }
  prodigy_d_numerator_ = d_numerator;
  // As prodigyopt: eps scaled by the new d, the step by this step's dlr.
  std::vector<torch::Tensor> denom = at::_foreach_sqrt(exp_avg_sq);
  at::_foreach_add_(denom, prodigy_d_ * o_.eps);
  if (o_.weight_decay != 0 && o_.decouple) at::_foreach_mul_(p, 1 - o_.weight_decay * dlr);
  at::_foreach_addcdiv_(p, exp_avg, denom, -dlr);
}

void Optimizer::zero_grad() {
  for (auto& [name, p] : params_) p.mutable_grad() = torch::Tensor();
}

std::vector<std::pair<std::string, torch::Tensor>> Optimizer::state() const {
  auto out = moments_->state();
  out.emplace_back("step", torch::tensor(steps_));
  for (const auto& [name, count] : updates_) out.emplace_back("step." + name, torch::tensor(count));
  if (rule_of(kind_) == Rule::Prodigy)
    out.emplace_back("prodigy", torch::tensor({prodigy_d_, prodigy_d_max_, prodigy_d_numerator_}, torch::kDouble));
  return out;
}

void Optimizer::load_state(const std::map<std::string, torch::Tensor>& s) {
  if (const auto it = s.find("step"); it != s.end()) steps_ = it->second.item<int64_t>();
  updates_.clear();
  for (const auto& [name, p] : params_)
    if (const auto it = s.find("step." + name); it != s.end()) updates_[name] = it->second.item<int64_t>();
  if (const auto it = s.find("prodigy"); it != s.end()) {
    const torch::Tensor v = it->second.to(torch::kDouble);
    prodigy_d_ = v[0].item<double>(), prodigy_d_max_ = v[1].item<double>(), prodigy_d_numerator_ = v[2].item<double>();
  }
  for (auto& [name, p] : params_) moments_->load(s, name, p);
}

int64_t Optimizer::state_bytes() const { return moments_->bytes(); }

std::set<std::string> Optimizer::names() const {
  std::set<std::string> out;
  for (const auto& [name, p] : params_) out.insert(name);
  return out;
}

std::optional<OptimizerKind> eight_bit_twin(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::adamw:
      return OptimizerKind::adamw8bit;
    case OptimizerKind::adam:
      return OptimizerKind::adam8bit;
    case OptimizerKind::lion:
      return OptimizerKind::lion8bit;
    default:
      return std::nullopt;
  }
}

Optimizer::Walk Optimizer::walk(const std::set<std::string>& names, std::optional<OptimizerKind> kind,
                                c10::DeviceType target) const {
  memory::MetaCount count(target);
  std::vector<std::pair<std::string, torch::Tensor>> copies;
  std::vector<torch::Tensor> params;
  for (const auto& [name, p] : params_) {
    if (!names.count(name)) continue;
    torch::Tensor copy = torch::empty(p.sizes(), p.options().device(torch::kMeta));
    copy.mutable_grad() = torch::empty_like(copy);
    copies.emplace_back(name, copy), params.push_back(copy);
  }
  Optimizer fresh(kind.value_or(kind_), std::move(copies), kind ? default_options(*kind) : o_);
  const int64_t held = count.live();  // the parameters and their gradients
  Walk w;
  memory::run_walk([&] { fresh.step(1e-4); });
  w.state_bytes = count.live() - held;
  const int64_t before = count.live();
  count.reset_peak();
  memory::run_walk([&] {
    clip_grad_norm(params, 1.0);
    fresh.step(1e-4);
  });
  w.step_bytes = count.peak() - before;
  return w;
}

void copy_stochastic(torch::Tensor& target, const torch::Tensor& source) {
  if (target.scalar_type() != torch::kBFloat16 || source.scalar_type() != torch::kFloat) {
    target.copy_(source);
    return;
  }
  // copy_stochastic_bf16: a random 16-bit integer added to the float32's bits, the low 16 bits masked off:
  // the magnitude rounds up with the probability of the part bfloat16 cannot hold.
  torch::Tensor bits = torch::randint_like(source, 0, 1 << 16, source.options().dtype(torch::kInt));
  bits.add_(source.view(torch::kInt)).bitwise_and_(-65536);
  target.copy_(bits.view(torch::kFloat));
}

bool Optimizer::accumulates_stochastically() const {
  if (rule_of(kind_) != Rule::Adafactor) return false;
  for (const auto& [name, p] : params_)
    if (p.scalar_type() == torch::kBFloat16) return true;
  return false;
}

std::vector<torch::Tensor> Optimizer::set_gradients_aside() {
  std::vector<torch::Tensor> aside(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i].second;
    if (p.scalar_type() != torch::kBFloat16 || !p.grad().defined()) continue;
    aside[i] = p.grad();
    p.mutable_grad() = torch::Tensor();
  }
  return aside;
}

void Optimizer::accumulate(std::vector<torch::Tensor> aside) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size() && i < aside.size(); ++i) {
    if (!aside[i].defined()) continue;
    torch::Tensor& p = params_[i].second;
    if (p.grad().defined()) {
      const torch::Tensor sum = aside[i].to(torch::kFloat).add_(p.grad().to(torch::kFloat));
      copy_stochastic(aside[i], sum);
    }
    p.mutable_grad() = aside[i];
  }
}

std::unique_ptr<Optimizer> make_optimizer(OptimizerKind kind, std::vector<std::pair<std::string, torch::Tensor>> params,
                                          const OptimizerOptions& options) {
  return std::make_unique<Optimizer>(kind, std::move(params), options);
}

double scheduled_lr(config::LrScheduler scheduler, const config::LrSchedulerParams& params, double base_lr,
                    int64_t step, int64_t total_steps) {
  using config::LrScheduler;
  const double k = static_cast<double>(step), total = static_cast<double>(std::max<int64_t>(total_steps, 1));
  switch (scheduler) {
    case LrScheduler::constant:  // ConstantLR(factor=1.0)
      return base_lr;
    case LrScheduler::constant_with_warmup: {
      const double warmup = params.num_warmup_steps.value_or(1000);
      return k < warmup ? base_lr * k / std::max(1.0, warmup) : base_lr;
    }
    case LrScheduler::linear: {  // LinearLR(total_iters = steps): factor moves linearly, then holds
      const double start = params.start_factor.value_or(1.0 / 3.0), end = params.end_factor.value_or(1.0);
      return base_lr * (start + (end - start) * std::min(k, total) / total);
    }
    case LrScheduler::cosine: {  // torch CosineAnnealingLR(T_max = steps, eta_min): no warm-up
      const double eta_min = params.eta_min.value_or(0.0);
      return eta_min + (base_lr - eta_min) * 0.5 * (1.0 + std::cos(std::acos(-1.0) * std::min(k, total) / total));
    }
  }
  return base_lr;
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, std::optional<double> max_norm,
                      const std::function<double(double)>& total) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> squares;
  for (const auto& p : params)
    if (p.grad().defined()) squares.push_back(p.grad().to(torch::kDouble).pow(2).sum());
  double sum = squares.empty() ? 0.0 : host_value(torch::stack(squares).sum());
  if (total) sum = total(sum);
  if (squares.empty() && !total) return 0.0;
  const double norm = std::sqrt(sum);
  // torch's clip_coef = max_norm / (norm + 1e-6), clamped to 1: a no-op below the norm.
  if (const double factor = max_norm ? *max_norm / (norm + 1e-6) : 1.0; factor < 1.0)
    for (const auto& p : params)
      if (p.grad().defined()) p.grad().mul_(factor);
  return norm;
}

}  // namespace gclab::train
