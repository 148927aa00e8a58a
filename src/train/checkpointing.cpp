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
  model_.set_block_caller(
      [this](size_t index, const model::Tensors& inputs) { return wrappers_[index]->forward(inputs); });
}

ModelCheckpointing::~ModelCheckpointing() { model_.set_block_caller({}); }

void ModelCheckpointing::apply(const ckpt::CheckpointPolicy& policy) {
  if (policy.kind == ckpt::CheckpointPolicy::Kind::Budget)
    throw std::invalid_argument("checkpoint policy '" + policy.to_string() +
                                "' must be resolved to blocks:[...] from a probe step before it is applied");
  ckpt::apply_checkpoint_policy(wrappers_, policy);
}

ModelCheckpointing::BudgetProbe ModelCheckpointing::resolve_budget(const model::ModelInputs& probe,
                                                                   int64_t budget_bytes,
                                                                   const memory::MemoryMeter& meter) {
  BudgetProbe out;
  const size_t n = wrappers_.size();
  out.kept_bytes.assign(n, 0);
  out.input_bytes.assign(n, 0);
  for (auto& w : wrappers_) w->set_mode(ckpt::BlockMode::None);
  model_.set_block_caller([&](size_t i, const model::Tensors& inputs) {
    const int64_t before = meter.stats().live_bytes;
    model::Tensors outputs = wrappers_[i]->forward(inputs);
    int64_t fresh_output = 0;
    for (const auto& o : outputs) {
      bool is_input = false;
      for (const auto& x : inputs) is_input = is_input || o.is_same(x);
      if (!is_input) fresh_output += static_cast<int64_t>(o.nbytes());
    }
    out.kept_bytes[i] = meter.stats().live_bytes - before - fresh_output;
    // Hidden streams are the token-sized inputs ([B, S, D]); tables and vectors are shared by all blocks.
    for (const auto& x : inputs)
      if (x.dim() >= 3) out.input_bytes[i] += static_cast<int64_t>(x.nbytes());
    return outputs;
  });
  {
    torch::Tensor prediction = model_.forward(probe);  // the graph (and what it keeps) is freed on return
  }
  model_.set_block_caller(
      [this](size_t index, const model::Tensors& inputs) { return wrappers_[index]->forward(inputs); });
  out.policy = ckpt::CheckpointPolicy::only_blocks(
      ckpt::select_blocks_for_budget(out.kept_bytes, out.input_bytes, budget_bytes));
  return out;
}

}  // namespace gclab::train
