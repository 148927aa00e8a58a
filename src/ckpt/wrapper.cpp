#include "gclab/ckpt/wrapper.h"

#include <stdexcept>

namespace gclab::ckpt {

CheckpointWrapperImpl::CheckpointWrapperImpl(std::shared_ptr<Block> block, std::string name)
    : block_(register_module("block", std::move(block))) {
  options_.name = std::move(name);
}

std::vector<torch::Tensor> CheckpointWrapperImpl::trainable_parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& p : block_->parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

std::vector<torch::Tensor> CheckpointWrapperImpl::forward(const std::vector<torch::Tensor>& inputs) {
  static const SubBlockRunner plain = [](SubBlock, const BlockFn& fn, const std::vector<torch::Tensor>& in) {
    return fn(in);
  };
  switch (mode_) {
    case BlockMode::None:
      return block_->forward_block(inputs, plain);
    case BlockMode::Full:
    case BlockMode::Offload:
    case BlockMode::SelectiveOps: {
      CheckpointOptions options = options_;
      options.offload_inputs = mode_ == BlockMode::Offload;
      options.save_ops = mode_ == BlockMode::SelectiveOps;
      Block* block = block_.get();
      return checkpoint([block](const std::vector<torch::Tensor>& in) { return block->forward_block(in, plain); },
                        inputs, trainable_parameters(), options);
    }
    case BlockMode::SelectiveAttn:
    case BlockMode::SelectiveMlp: {
      const SubBlock target = mode_ == BlockMode::SelectiveAttn ? SubBlock::attn : SubBlock::mlp;
      const std::vector<torch::Tensor> params = trainable_parameters();
      CheckpointOptions options = options_;
      options.name = options_.name + "." + name_of(target);
      const SubBlockRunner selective = [&](SubBlock kind, const BlockFn& fn, const std::vector<torch::Tensor>& in) {
        return kind == target ? checkpoint(fn, in, params, options) : fn(in);
      };
      return block_->forward_block(inputs, selective);
    }
  }
  throw std::logic_error("unknown block mode");
}

void apply_checkpoint_policy(std::vector<CheckpointWrapper>& blocks, const CheckpointPolicy& policy) {
  const int count = static_cast<int>(blocks.size());
  for (int i = 0; i < count; ++i) blocks[i]->set_mode(policy.mode_for(i, count));
}

}  // namespace gclab::ckpt
