#include "gclab/train/timesteps.h"

#include <algorithm>

namespace gclab::train {

using config::TimestepType;

namespace {

const float kWeighingScheme[] = {
#include "aitk_weighing_scheme.inc"
};

// AI Toolkit's bell over grid indices (CustomFlowMatchEulerDiscreteScheduler.__init__): y = exp(-2 ((x - n/2)
// / n)^2), less its minimum, scaled to mean 1; the half bell holds its second half at the maximum.
torch::Tensor bell(int64_t n, bool half) {
  const torch::Tensor x = torch::arange(n, torch::kFloat);
  const torch::Tensor y = torch::exp(-2 * torch::square((x - n / 2.0) / n));
  const torch::Tensor shifted = y - y.min();
  torch::Tensor w = shifted * (static_cast<double>(n) / shifted.sum());
  if (half) w.narrow(0, n / 2, n - n / 2).fill_(w.narrow(0, n / 2, n - n / 2).max());
  return w;
}

// toolkit/basic.py value_map.
torch::Tensor value_map(const torch::Tensor& v, double in_min, double in_max, double out_min, double out_max) {
  return (v - in_min) * (out_max - out_min) / (in_max - in_min) + out_min;
}

}  // namespace

TimestepSampler::TimestepSampler(const model::FlowSchedule& schedule, const config::TrainConfig& train)
    : schedule_(schedule),
      type_(train.timestep_type),
      content_or_style_(train.content_or_style),
      n_(train.timestep_type == TimestepType::next_sample ? train.next_sample_timesteps : train.num_train_timesteps),
      // "clip min max indicies"
      num_train_timesteps_(train.num_train_timesteps),
      min_index_(std::max(train.min_denoising_steps, 0)),
      max_index_(std::min<int64_t>(train.max_denoising_steps, train.num_train_timesteps - 1)),
      bell_(train.linear_timesteps),
      half_bell_(train.linear_timesteps2) {}

TimestepType TimestepSampler::grid_type() const { return bell_ || half_bell_ ? TimestepType::linear : type_; }

torch::Tensor TimestepSampler::grid(int64_t image_tokens) const {
  const auto f = torch::TensorOptions().dtype(torch::kFloat);
  switch (grid_type()) {
    case TimestepType::linear:
    case TimestepType::weighted:
    case TimestepType::one_step:
      return torch::linspace(1000, 1, n_, f);
    case TimestepType::sigmoid:
      return std::get<0>(torch::sort((1 - torch::sigmoid(torch::randn({n_}, f))) * 1000, 0, true));
    case TimestepType::shift:
    case TimestepType::flux_shift:
    case TimestepType::lumina2_shift:
    case TimestepType::next_sample: {
      // One branch for the three, by the scheduler's config: linspace over its sigma range, then shifted.
      const double hi = schedule_.sigma_max() * static_cast<double>(schedule_.num_train_timesteps);
      const double lo = schedule_.sigma_min() * static_cast<double>(schedule_.num_train_timesteps);
      const torch::Tensor sigmas = torch::linspace(hi, lo, n_, torch::kDouble) / schedule_.num_train_timesteps;
      return (schedule_.shift_sigmas(sigmas, image_tokens).to(torch::kFloat) * schedule_.num_train_timesteps);
    }
    case TimestepType::lognorm_blend: {
      // 75% LogNormal(0, 0.333) draws as (1 - x / max x) 1000, 25% linear, sorted descending, as integers.
      const int64_t k = static_cast<int64_t>(static_cast<double>(n_) * 0.75);
      const torch::Tensor x = torch::exp(torch::randn({k}, f) * 0.333);
      const torch::Tensor t1 = (1 - x / x.max()) * 1000;
      const torch::Tensor t2 = torch::linspace(1000, 1, static_cast<int64_t>(static_cast<double>(n_) * 0.25), f);
      const torch::Tensor all = std::get<0>(torch::sort(torch::cat({t1, t2}), 0, true));
      return all.to(torch::kInt).to(torch::kFloat);
    }
  }
  return torch::linspace(1000, 1, n_, f);
}

torch::Tensor TimestepSampler::weights(const torch::Tensor& index) const {
  if (type_ == TimestepType::weighted) {
    const int64_t table = static_cast<int64_t>(sizeof(kWeighingScheme) / sizeof(kWeighingScheme[0]));
    const torch::Tensor w = torch::from_blob(const_cast<float*>(kWeighingScheme), {table}, torch::kFloat);
    return w.index_select(0, index.clamp_max(table - 1));
  }
  if (half_bell_) return bell(n_, true).index_select(0, index);
  if (bell_) return bell(n_, false).index_select(0, index);
  return torch::ones({index.size(0)});
}

TimestepDraw TimestepSampler::draw(int64_t batch, int64_t image_tokens,
                                   const std::optional<std::pair<double, double>>& stage) const {
  const torch::Tensor timesteps = grid(image_tokens);
  const auto i64 = torch::TensorOptions().dtype(torch::kLong);
  int64_t min_index = min_index_, max_index = max_index_;
  if (stage) {
    // lo, hi: the grid points at or above boundary_max, above boundary_min (descending grid, ascending copy).
    const torch::Tensor ascending = torch::flip(timesteps, {0});
    const int64_t n = ascending.size(0);
    auto search = [&](double boundary, bool right) {
      return torch::searchsorted(ascending, torch::tensor(boundary * 1000, torch::kFloat), false, right)
          .item<int64_t>();
    };
    const int64_t lo = n - search(stage->first, false), hi = n - search(stage->second, true);
    min_index = hi > lo ? lo - 1 : 0;
    max_index = hi > lo ? hi - 1 : 999;
    min_index = std::max<int64_t>(min_index, 0);
    max_index = std::min<int64_t>(max_index, num_train_timesteps_ - 1);
  }
  TimestepDraw d;
  if (type_ == TimestepType::next_sample) {
    // randint(0, n - 2): "-1 for 0 idx, -1 so we can step"; min/max_denoising_steps do not apply.
    d.index = torch::randint(0, n_ - 2, {batch}, i64);
    d.next_t = timesteps.index_select(0, d.index + 1) / 1000;
  } else if (type_ == TimestepType::one_step) {
    d.index = torch::zeros({batch}, i64);
  } else if (content_or_style_ == config::ContentOrStyle::balanced) {
    d.index = min_index == max_index ? torch::full({batch}, min_index, i64)
                                     : torch::randint(min_index, max_index, {batch}, i64);
  } else {
    // Cubic sampling (diffusers' training scripts): content favours the early, noisy indices, style the late.
    const torch::Tensor u = torch::rand({batch});
    const torch::Tensor cube = u.pow(3);
    const torch::Tensor raw =
        (content_or_style_ == config::ContentOrStyle::content ? cube : 1 - cube) * static_cast<double>(n_);
    d.index =
        value_map(raw, 0, static_cast<double>(n_ - 1), static_cast<double>(min_index), static_cast<double>(max_index))
            .to(torch::kLong)
            .clamp(min_index, max_index);
  }
  d.t = timesteps.index_select(0, d.index) / 1000;
  d.weight = weights(d.index);
  return d;
}

}  // namespace gclab::train
