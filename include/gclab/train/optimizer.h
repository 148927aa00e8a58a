// AdamW (decoupled weight decay, as torch.optim.AdamW) with fp32 moments, and an 8-bit-state variant for
// `optimizer: adamw8bit`. Both keep their state as named tensors so a checkpoint can hold it (safetensors)
// and a resumed run continues bitwise.
//
// adamw8bit vs bitsandbytes: both quantize the moments block-wise (here 256 values per block) with a
// float32 scale per block, and dequantize-update-requantize every step. bitsandbytes maps the codes
// through its non-linear "dynamic" quantization table; gclab uses a linear code for the first moment
// (signed, absmax scale) and a linear code of sqrt(v) for the second (unsigned, max scale), which keeps
// the second moment's wide range in 8 bits. Memory is the same: 2 bytes of state per parameter instead of
// 8, plus 8 bytes per 256-value block.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "gclab/config/choices.h"

namespace gclab::train {

struct AdamWOptions {
  double weight_decay = 0.01;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One AdamW update of every parameter with a gradient, at learning rate lr.
  void step(double lr);
  void zero_grad();
  // State as named tensors ("step", "<param name>.exp_avg", ...), and back.
  virtual std::vector<std::pair<std::string, torch::Tensor>> state() const = 0;
  virtual void load_state(const std::map<std::string, torch::Tensor>& state) = 0;
  virtual int64_t state_bytes() const = 0;
  // What state_bytes() will be once every parameter has had an update (from shapes: works on meta).
  virtual int64_t expected_state_bytes() const = 0;
  int64_t steps() const { return steps_; }

 protected:
  Optimizer(std::vector<std::pair<std::string, torch::Tensor>> params, AdamWOptions o)
      : params_(std::move(params)), o_(o) {}
  // The moments of a parameter as float32 tensors the update may modify in place (zeros the first time),
  // and keeping them after the update: where the two variants differ.
  virtual std::pair<torch::Tensor, torch::Tensor> moments(const std::string& name, const torch::Tensor& param) = 0;
  virtual void keep(const std::string& name, const torch::Tensor& m, const torch::Tensor& v) = 0;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  AdamWOptions o_;
  int64_t steps_ = 0;
};

std::unique_ptr<Optimizer> make_optimizer(config::OptimizerKind kind,
                                          std::vector<std::pair<std::string, torch::Tensor>> params,
                                          const AdamWOptions& options);

// lr_scheduler: constant, constant_with_warmup (5% warm-up), linear (to 0), cosine (to 0).
double scheduled_lr(config::LrScheduler scheduler, double base_lr, int64_t step, int64_t total_steps);

// Clips the global gradient norm to max_norm (<= 0: no clipping); returns the norm before clipping. One
// host synchronisation whatever the number of tensors.
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace gclab::train
