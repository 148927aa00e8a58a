// Gradient checkpointing for LibTorch (the reentrant design, as a torch::autograd::Function).
//
// forward:  runs the block with grad off and keeps only its inputs (and the RNG / autocast state);
// backward: re-runs the block with grad on from those inputs and differentiates it, returning the
//           gradients of the inputs and of the block's trainable parameters to the autograd engine.
//
// Correct where Python's reentrant checkpoint is not: parameters get gradients even when no input
// requires grad (frozen base + LoRA), and torch::autograd::grad works through a checkpointed region.
// This header needs LibTorch only; link gclab_ckpt.
#pragma once

#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gclab::ckpt {

// A block as a function of its tensor inputs. Anything else it needs (masks, flags, sizes) it captures.
using BlockFn = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

struct CheckpointOptions {
  std::string name = "block";     // named in determinism errors
  bool preserve_rng = true;       // replay dropout's random numbers in the recompute
  bool determinism_check = true;  // recomputed outputs must match the forward's shape/dtype/device
  bool offload_inputs = false;    // keep the saved inputs in host memory (pinned when on CUDA)
  // Keep the outputs of the block's matmuls and attention too, and replay them in the recompute
  // (selective:ops; ckpt/saved_ops.h): the backward runs again only what lies between them.
  bool save_ops = false;

  CheckpointOptions& with_name(std::string n) {
    name = std::move(n);
    return *this;
  }
  CheckpointOptions& with_preserve_rng(bool v) {
    preserve_rng = v;
    return *this;
  }
  CheckpointOptions& with_determinism_check(bool v) {
    determinism_check = v;
    return *this;
  }
  CheckpointOptions& with_offload_inputs(bool v) {
    offload_inputs = v;
    return *this;
  }
  CheckpointOptions& with_save_ops(bool v) {
    save_ops = v;
    return *this;
  }
};

// Runs `fn(inputs)` checkpointed. `params` must list every trainable tensor the block reads that is not
// among `inputs` (a module's parameters()); their gradients flow through the checkpoint. With grad
// mode off, or when nothing requires grad, this is a plain call of fn.
std::vector<torch::Tensor> checkpoint(const BlockFn& fn, const std::vector<torch::Tensor>& inputs,
                                      const std::vector<torch::Tensor>& params, const CheckpointOptions& options = {});

// Raised when a recompute does not reproduce the forward (shape, dtype, device or output count).
class NondeterministicRecompute : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace gclab::ckpt
