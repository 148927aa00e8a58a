// The optimizers AI Toolkit offers for these models, each with its real update rule and state size, as
// two independent choices: the *rule* (AdamW, Adam, Lion, SGD) and where its moments are *stored* (float32,
// or block-wise 8-bit for the `...8bit` spellings). State is kept as named tensors so a checkpoint can
// hold it (safetensors) and a resumed run continues bitwise.
//
//   adamw      torch.optim.AdamW: decoupled weight decay, bias-corrected moments (2 x 4 bytes a parameter)
//   adam       torch.optim.Adam: weight decay added to the gradient (L2), otherwise as AdamW
//   lion       lion-pytorch's Lion: p -= lr (sign(b1 m + (1 - b1) g) + wd p); m = b2 m + (1 - b2) g (4 bytes)
//   adafactor  AI Toolkit's Adafactor (toolkit/optimizers/adafactor.py, from transformers'): second moments
//              factored into a row and a column vector for matrices (full for vectors), update clipped to
//              RMS 1, lr external (relative_step off, as AI Toolkit sets it); optional beta1 first moment;
//              float32 moments and stochastic rounding for bfloat16 weights
//   prodigy    prodigyopt's Prodigy: Adam moments scaled by an estimated distance d, plus the initial
//              weights p0 and the accumulator s (4 x 4 bytes a parameter); lr is a multiplier of d
//              (AI Toolkit raises a configured lr below 0.1 to 1.0)
//   sgd        torch.optim.SGD without momentum: p -= lr (g + wd p) (no state)
//   ...8bit    bitsandbytes' AdamW8bit / Adam8bit / Lion8bit (AI Toolkit's choice for these spellings): the
//              same rule (Adam8bit's weight decay decoupled, as bitsandbytes applies it), each moment of a
//              parameter with 4096 values or more stored as a byte a value into bitsandbytes' dynamic map
//              (signed for m, unsigned for v) with a float32 absmax per block of 256; smaller parameters keep
//              float32 moments. Every step dequantizes, updates in float32 and requantizes to the nearest
//              code, with no host synchronisation.
// The unquantized rules keep their moments in the parameter's dtype, as torch's optimizers do (bfloat16 in a
// bfloat16 full fine-tune); Adafactor's are float32.
#pragma once

#include <torch/types.h>

#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gclab/config/choices.h"
#include "gclab/config/config.h"

namespace gclab::train {

// bitsandbytes' create_dynamic_map(signed): the 256 sorted float32 values an 8-bit moment code stands for
// (times its block's absmax).
torch::Tensor dynamic_quantization_map(bool is_signed);

struct OptimizerOptions {
  double weight_decay = 0.01;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  // adafactor: eps is its eps[0] (1e-30, added to g^2); eps2 the parameter-scale floor (eps[1]).
  bool scale_parameter = false;
  double clip_threshold = 1.0, decay_rate = -0.8, eps2 = 1e-3;
  std::optional<double> adafactor_beta1;
  // prodigy
  double d0 = 1e-6, d_coef = 1.0, growth_rate = std::numeric_limits<double>::infinity();
  std::optional<double> beta3;  // default sqrt(beta2)
  bool use_bias_correction = false, safeguard_warmup = false, decouple = true;
};

// The defaults of each optimizer's own reference implementation as AI Toolkit constructs it (Lion:
// betas 0.9/0.99, no weight decay; SGD, Adafactor, Prodigy: no weight decay; Prodigy: eps 1e-6, which
// AI Toolkit passes; Adam/AdamW: torch's), used for what the config does not set.
OptimizerOptions default_options(config::OptimizerKind kind);
// The options a config's train block gives: the optimizer's defaults, then what optimizer_params sets
// (`given` says whether a key was written, for keys with a default in the config struct).
OptimizerOptions options_from(const config::TrainConfig& train, const std::function<bool(const char*)>& given);
// The learning rate the optimizer is handed for the configured one: Prodigy's lr multiplies its own
// estimate, and AI Toolkit raises a configured lr below 0.1 to 1.0 (toolkit/optimizer.py).
double optimizer_lr(config::OptimizerKind kind, double configured_lr);

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
  // What the optimizer holds, walked on the meta device (memory/meta_count.h) rather than written down: a
  // fresh optimizer of this kind and options — or of `kind` at its defaults, what a switch would hold — on
  // meta copies of the named parameters (those a step's backward reaches: a parameter without a gradient
  // gets no state, as in torch.optim), with meta gradients, runs step() twice, the first making its state.
  // `state_bytes`: the state after them; `step_bytes`: the most clip_grad_norm and the second step (as every
  // step after the first) hold above the parameters, gradients and state. `target`: the device kind the
  // walk stands for.
  struct Walk {
    int64_t state_bytes = 0, step_bytes = 0;
  };
  Walk walk(const std::set<std::string>& names, std::optional<config::OptimizerKind> kind = std::nullopt,
            c10::DeviceType target = c10::kCPU) const;
  int64_t steps() const { return steps_; }
  std::set<std::string> names() const;  // the parameters' names

  // AI Toolkit's Adafactor sums a bfloat16 parameter's micro-batch gradients in float32 and rounds the sum
  // back stochastically (toolkit/optimizers/optimizer_utils.py, stochastic_grad_accummulation, a
  // post-accumulate-grad hook): before a later micro-batch's backward set_gradients_aside() takes those
  // gradients out, and accumulate() adds the new ones to them after it. Both hold the two sets at once, as
  // the hook does.
  bool accumulates_stochastically() const;
  std::vector<torch::Tensor> set_gradients_aside();
  void accumulate(std::vector<torch::Tensor> aside);

 private:
  // The update of `params` (each with a gradient) by the optimizer's rule, their moments stored after;
  // `count`: their own updates so far, this one included (torch's per-parameter state["step"]).
  void update(const std::vector<std::pair<std::string, torch::Tensor>>& params, double lr, int64_t count);
  void adafactor_step(std::vector<torch::Tensor>& p, const std::vector<torch::Tensor>& g,
                      std::vector<std::vector<torch::Tensor>>& m, double lr, int64_t count);
  // `first`: which parameters are updated for the first time (their state initialised: p0).
  void prodigy_step(std::vector<torch::Tensor>& p, const std::vector<torch::Tensor>& g,
                    std::vector<std::vector<torch::Tensor>>& m, double lr, const std::vector<bool>& first);

  config::OptimizerKind kind_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  OptimizerOptions o_;
  std::unique_ptr<MomentStorage> moments_;
  int64_t steps_ = 0;
  // Each parameter's own updates (a parameter without a gradient at a step is skipped, as torch's optimizers
  // skip it: a model of several experts trains one expert's adapters at a time); absent: steps_.
  std::map<std::string, int64_t> updates_;
  int64_t updates_of(const std::string& name) const;
  // Prodigy's running estimates (its param_group's d, d_max, d_numerator), part of the state.
  double prodigy_d_ = 0, prodigy_d_max_ = 0, prodigy_d_numerator_ = 0;
};

// The 8-bit optimizer with the same rule (adamw8bit for adamw, ...); nullopt for one that has none.
std::optional<config::OptimizerKind> eight_bit_twin(config::OptimizerKind kind);

std::unique_ptr<Optimizer> make_optimizer(config::OptimizerKind kind,
                                          std::vector<std::pair<std::string, torch::Tensor>> params,
                                          const OptimizerOptions& options);

// The learning rate of the update after `step` earlier ones, as AI Toolkit's schedulers give it
// (toolkit/scheduler.py, built with total_iters = train.steps): constant; constant_with_warmup (diffusers'
// get_constant_schedule_with_warmup: step / warmup, 1000 steps unless lr_scheduler_params says, so the
// first update has lr 0); linear (torch LinearLR: from start_factor 1/3 of lr up to lr at the last step);
// cosine (warm-up, then half a cosine from lr to eta_min over cosine_decay_steps).
double scheduled_lr(config::LrScheduler scheduler, const config::LrSchedulerParams& params, double base_lr,
                    int64_t step, int64_t total_steps);

// AI Toolkit's copy_stochastic for a bfloat16 target (toolkit/optimizers/optimizer_utils.py,
// copy_stochastic_bf16): the float32 source rounded to one of its two bfloat16 neighbours at random, up with
// the probability of the dropped part (unbiased); any other pair of dtypes a plain copy.
void copy_stochastic(torch::Tensor& target, const torch::Tensor& source);

// Clips the global gradient norm to max_norm as torch.nn.utils.clip_grad_norm_ does: every gradient times
// min(1, max_norm / (norm + 1e-6)), so max_norm 0 zeroes them (AI Toolkit's max_grad_norm: 0); nullopt only
// measures. Returns the norm before clipping. One host synchronisation whatever the number of tensors.
// `total`, when given, turns this process's sum of squares into the whole model's (ZeRO-1: the ranks' own
// tensors' sums, summed across them); it is called whether or not any parameter here has a gradient.
double clip_grad_norm(const std::vector<torch::Tensor>& params, std::optional<double> max_norm,
                      const std::function<double(double)>& total = {});

}  // namespace gclab::train
