// Gradient checkpointing applied to a built transformer from outside, as torchtitan's apply_ac does:
// each of the model's blocks is put in a gclab::ckpt::CheckpointWrapper and the model's one block call
// site is routed through the wrappers. The model code knows nothing of it.
#pragma once

#include <vector>

#include "gclab/ckpt/policy.h"
#include "gclab/ckpt/wrapper.h"
#include "gclab/memory/tracker.h"
#include "gclab/model/transformer.h"

namespace gclab::train {

class ModelCheckpointing {
 public:
  // Wraps the blocks (mode off) and routes the model's block calls through them for this object's life.
  explicit ModelCheckpointing(model::DiffusionTransformer& model);
  ~ModelCheckpointing();
  ModelCheckpointing(const ModelCheckpointing&) = delete;
  ModelCheckpointing& operator=(const ModelCheckpointing&) = delete;

  // Switches every block's mode from the policy; may be called again between steps. A budget policy
  // must be resolved to blocks:[...] first (select_blocks_for_budget on measured block footprints).
  void apply(const ckpt::CheckpointPolicy& policy);
  std::vector<ckpt::CheckpointWrapper>& wrappers() { return wrappers_; }

  // budget:BYTES made concrete: a probe forward (grad on, nothing checkpointed) on `probe` measures what
  // each block keeps for backward and what its hidden-stream inputs take (live bytes from `meter`), then
  // select_blocks_for_budget picks the fewest blocks to checkpoint. Returns the blocks:[...] policy.
  struct BudgetProbe {
    std::vector<int64_t> kept_bytes, input_bytes;
    ckpt::CheckpointPolicy policy;
  };
  BudgetProbe resolve_budget(const model::ModelInputs& probe, int64_t budget_bytes, const memory::MemoryMeter& meter);

 private:
  model::DiffusionTransformer& model_;
  std::vector<ckpt::CheckpointWrapper> wrappers_;
};

}  // namespace gclab::train
