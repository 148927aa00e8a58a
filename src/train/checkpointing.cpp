#include "gclab/train/checkpointing.h"

#include <stdexcept>

#include "gclab/memory/flops.h"

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

ModelCheckpointing::BlockProbe ModelCheckpointing::probe_blocks(const model::ModelInputs& probe,
                                                                const std::function<int64_t()>& live,
                                                                ckpt::BlockMode mode) {
  BlockProbe out;
  const size_t n = wrappers_.size();
  out.kept_bytes.assign(n, 0);
  out.input_bytes.assign(n, 0);
  out.forward_flops.assign(n, 0);
  out.adapter_flops.assign(n, 0);
  out.recomputed_flops.assign(n, 0);
  out.recomputed_bytes.assign(n, 0);
  // The block calls and modes as they were, put back however the forward ends (an out-of-memory error, an op
  // the meta device cannot run).
  struct Restore {
    ModelCheckpointing& self;
    std::vector<ckpt::BlockMode> modes;
    ~Restore() {
      self.model_.set_block_caller(
          [s = &self](size_t index, const model::Tensors& inputs) { return s->wrappers_[index]->forward(inputs); });
      for (size_t i = 0; i < modes.size(); ++i) self.wrappers_[i]->set_mode(modes[i]);
    }
  } restore{*this, {}};
  for (auto& w : wrappers_) restore.modes.push_back(w->mode()), w->set_mode(mode);
  model_.set_block_caller([&](size_t i, const model::Tensors& inputs) {
    const int64_t before = live();
    memory::FlopCount flops;
    model::Tensors outputs = wrappers_[i]->forward(inputs);
    out.forward_flops[i] += flops.total();
    out.adapter_flops[i] += flops.adapters();
    out.recomputed_flops[i] += flops.recomputed();
    out.recomputed_bytes[i] += flops.recomputed_bytes();
    int64_t fresh_output = 0;
    for (const auto& o : outputs) {
      bool is_input = false;
      for (const auto& x : inputs) is_input = is_input || o.is_same(x);
      if (!is_input) fresh_output += static_cast<int64_t>(o.nbytes());
    }
    out.kept_bytes[i] = live() - before - fresh_output;
    // A block's hidden streams are its first inputs, one per output ({img, txt, temb, ...} -> {img, txt}); the
    // rest (the conditioning vector, rotary tables) are the same tensors for every block. A block that keeps
    // nothing (nothing in it needs a gradient: Z-Image's refiners under LoRA) keeps nothing checkpointed.
    if (out.kept_bytes[i] > 0)
      for (size_t k = 0; k < outputs.size() && k < inputs.size(); ++k)
        out.input_bytes[i] += static_cast<int64_t>(inputs[k].nbytes());
    return outputs;
  });
  // A model of several experts runs one a forward: each expert's blocks are measured in a forward of their own.
  for (size_t e = 0; e < model_.expert_count(); ++e) {
    model::ModelInputs in = probe;
    if (model_.expert_count() > 1) in.expert = static_cast<int>(e);
    torch::Tensor prediction = model_.forward(in);  // the graph (and what it keeps) is freed on return
  }
  return out;
}

}  // namespace gclab::train
