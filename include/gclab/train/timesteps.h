// The timesteps a training batch draws, as AI Toolkit draws them (BaseSDTrainProcess.
// process_general_training_batch, prepare_scheduler and prepare_timesteps_indices): the family's flow-match
// scheduler lays out num_train_timesteps timesteps for the batch (set_train_timesteps, by timestep_type and,
// for a dynamic schedule, the batch's image tokens), each sample picks one by index (content_or_style within
// min/max_denoising_steps), and `weighted` / linear_timesteps weight the loss by that index.
#pragma once

#include <optional>
#include <utility>

#include <torch/types.h>

#include "gclab/config/config.h"
#include "gclab/model/flow_schedule.h"

namespace gclab::train {

struct TimestepDraw {
  torch::Tensor index;   // [B] long: the position in the grid (0 the noisiest)
  torch::Tensor t;       // [B] float: timestep / 1000, the sigma x_t = (1 - t) x0 + t noise is made with
  torch::Tensor weight;  // [B] float: the per-sample loss weight (ones unless weighted)
  torch::Tensor next_t;  // next_sample: [B] the following grid point's t, where the loss trains; else undefined
};

class TimestepSampler {
 public:
  TimestepSampler(const model::FlowSchedule& schedule, const config::TrainConfig& train);

  // set_train_timesteps: the grid of timesteps (0 ... 1000 scale, descending), float32. sigmoid and
  // lognorm_blend draw theirs from the global generator, as AI Toolkit does every batch.
  torch::Tensor grid(int64_t image_tokens) const;
  // One batch's draw (global generator), on the CPU. `stage`: a model of several experts' (boundary_max,
  // boundary_min) for this micro-batch, which replaces min/max_denoising_steps with the grid's indices
  // between them (BaseSDTrainProcess.py:1230-1245: searchsorted over the ascending grid).
  TimestepDraw draw(int64_t batch, int64_t image_tokens,
                    const std::optional<std::pair<double, double>>& stage = std::nullopt) const;
  // The loss weight of each grid index (ones when the loss is not weighted).
  torch::Tensor weights(const torch::Tensor& index) const;

  // The timestep type the grid is laid out by: linear_timesteps(2) and one_step force the linear grid,
  // next_sample the family's shift over next_sample_timesteps points.
  config::TimestepType grid_type() const;

 private:
  model::FlowSchedule schedule_;
  config::TimestepType type_;
  config::ContentOrStyle content_or_style_;
  int64_t n_, num_train_timesteps_, min_index_, max_index_;  // n_: the grid's points
  bool bell_, half_bell_;
};

}  // namespace gclab::train
