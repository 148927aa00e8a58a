#include "gclab/train/checkpointing.h"

#include <stdexcept>

namespace gclab::train {

namespace {

// A model block seen as a checkpointable block: the same forward, the same sub-block runner type.
class BlockAdapter : public ckpt::Block {
 public:
  explicit BlockAdapter(std::shared_ptr<model::TransformerBlock> block)
      : block_(register_module("block", std::move(block))) {}
  std::vector<torch::Tensor> forward_block(const std::vector<torch::Tensor>& inputs,
                                           const ckpt::SubBlockRunner& run) override {
    return block_->forward_block(inputs, run);
  }

 private:
  std::shared_ptr<model::TransformerBlock> block_;
};

}  // namespace

ModelCheckpointing::ModelCheckpointing(model::DiffusionTransformer& model) : model_(model) {
  for (size_t i = 0; i < model.blocks().size(); ++i)
    wrappers_.emplace_back(std::make_shared<BlockAdapter>(model.blocks()[i]), model.block_names()[i]);
  model_.set_block_caller([this](size_t index, const model::Tensors& inputs) { return wrappers_[index]->forward(inputs); });
}

ModelCheckpointing::~ModelCheckpointing() { model_.set_block_caller({}); }

void ModelCheckpointing::apply(const ckpt::CheckpointPolicy& policy) {
  if (policy.kind == ckpt::CheckpointPolicy::Kind::Budget)
    throw std::invalid_argument("checkpoint policy '" + policy.to_string() +
                                "' must be resolved to blocks:[...] from a probe step before it is applied");
  ckpt::apply_checkpoint_policy(wrappers_, policy);
}

}  // namespace gclab::train
