// Applying a checkpoint policy to a built model, the way torchtitan's apply_ac wraps blocks: the model
// code calls its blocks and knows nothing of checkpointing; each block sits in a CheckpointWrapper whose
// mode can be switched at run time.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <vector>

#include "gclab/ckpt/checkpoint.h"
#include "gclab/ckpt/policy.h"
#include "gclab/ckpt/sub_block.h"

namespace gclab::ckpt {

// Runs one sub-block (SubBlock::attn, ::mlp) of a block. A block's forward calls its sub-blocks through
// this, so selective policies can checkpoint one of them. The plain runner just calls fn(inputs).
using SubBlockRunner = std::function<std::vector<torch::Tensor>(SubBlock kind, const BlockFn& fn,
                                                                const std::vector<torch::Tensor>& inputs)>;

// What a model block provides to be wrapped: its forward over tensors, sub-blocks through `run`.
class Block : public torch::nn::Module {
 public:
  virtual std::vector<torch::Tensor> forward_block(const std::vector<torch::Tensor>& inputs,
                                                   const SubBlockRunner& run) = 0;
};

class CheckpointWrapperImpl : public torch::nn::Module {
 public:
  CheckpointWrapperImpl(std::shared_ptr<Block> block, std::string name);

  std::vector<torch::Tensor> forward(const std::vector<torch::Tensor>& inputs);

  void set_mode(BlockMode mode) { mode_ = mode; }
  BlockMode mode() const { return mode_; }
  CheckpointOptions& options() { return options_; }
  const std::string& name() const { return options_.name; }
  Block& block() { return *block_; }

 private:
  std::vector<torch::Tensor> trainable_parameters() const;

  std::shared_ptr<Block> block_;
  BlockMode mode_ = BlockMode::None;
  CheckpointOptions options_;
};
TORCH_MODULE(CheckpointWrapper);

// Sets each wrapper's mode from the policy (block i of the list is block i of the policy). A budget
// policy must first be turned into blocks:[...] from measurements; see select_blocks_for_budget.
void apply_checkpoint_policy(std::vector<CheckpointWrapper>& blocks, const CheckpointPolicy& policy);

}  // namespace gclab::ckpt
