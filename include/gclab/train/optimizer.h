// The optimizers AI Toolkit offers for these models, each with its real update rule and state size, as
// two independent choices: the *rule* (AdamW, Adam, Lion, SGD) and where its moments are *stored* (float32,
// or block-wise 8-bit for the `...8bit` spellings). State is kept as named tensors so a checkpoint can
// hold it (safetensors) and a resumed run continues bitwise.
//
//   adamw      torch.optim.AdamW: decoupled weight decay, bias-corrected moments (2 x 4 bytes a parameter)
//   adam       torch.optim.Adam: weight decay added to the gradient (L2), otherwise as AdamW
//   lion       lion-pytorch's Lion: p -= lr (sign(b1 m + (1 - b1) g) + wd p); m = b2 m + (1 - b2) g (4 bytes)
//   sgd        torch.optim.SGD without momentum: p -= lr (g + wd p) (no state)
//   ...8bit    the same rule, moments stored block-wise (256 values a block, a float32 scale each) in one
//              byte: 2 bytes of state a parameter for Adam, 1 for Lion, plus 8 (or 4) bytes a block.
//
// 8-bit vs bitsandbytes: both quantize the moments block-wise and dequantize-update-requantize every step.
// bitsandbytes maps codes through its non-linear "dynamic" table; gclab uses a linear code for the first
// moment (signed, absmax scale) and a linear code of sqrt(v) for the second (unsigned, max scale), which
// keeps the second moment's wide range in 8 bits. The memory is the same.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gclab/config/choices.h"

namespace gclab::train {

struct OptimizerOptions {
  double weight_decay = 0.01;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
};

// The defaults of each optimizer's own reference implementation (Lion: betas 0.9/0.99, no weight decay;
// SGD: no weight decay; Adam/AdamW: torch's), used for what the config does not set.
OptimizerOptions default_options(config::OptimizerKind kind);

class MomentStorage;

class Optimizer {
 public:
  Optimizer(config::OptimizerKind kind, std::vector<std::pair<std::string, torch::Tensor>> params,
            const OptimizerOptions& options);
  ~Optimizer();
  // One update of every parameter with a gradient, at learning rate lr (multi-tensor kernels).
  void step(double lr);
  void zero_grad();
  // State as named tensors ("step", "<param name>.exp_avg", ...), and back.
  std::vector<std::pair<std::string, torch::Tensor>> state() const;
  void load_state(const std::map<std::string, torch::Tensor>& state);
  int64_t state_bytes() const;
  // What state_bytes() will be once every parameter has had an update (from shapes: works on meta).
  int64_t expected_state_bytes() const;
  int64_t steps() const { return steps_; }

 private:
  config::OptimizerKind kind_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  OptimizerOptions o_;
  std::unique_ptr<MomentStorage> moments_;
  int64_t steps_ = 0;
};

std::unique_ptr<Optimizer> make_optimizer(config::OptimizerKind kind,
                                          std::vector<std::pair<std::string, torch::Tensor>> params,
                                          const OptimizerOptions& options);

// lr_scheduler: constant, constant_with_warmup (5% warm-up), linear (to 0), cosine (to 0).
double scheduled_lr(config::LrScheduler scheduler, double base_lr, int64_t step, int64_t total_steps);

// Clips the global gradient norm to max_norm (<= 0: no clipping); returns the norm before clipping. One
// host synchronisation whatever the number of tensors.
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace gclab::train
