// Gradient checkpointing applied to a built transformer from outside, as torchtitan's apply_ac does:
// each of the model's blocks is put in a gclab::ckpt::CheckpointWrapper and the model's one block call
// site is routed through the wrappers. The model code knows nothing of it.
#pragma once

#include <functional>
#include <vector>

#include "gclab/ckpt/policy.h"
#include "gclab/ckpt/wrapper.h"
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
  // must be resolved to blocks:[...] first (select_blocks_for_budget on the walked block footprints).
  void apply(const ckpt::CheckpointPolicy& policy);
  std::vector<ckpt::CheckpointWrapper>& wrappers() { return wrappers_; }

  // What each block keeps for its backward and what its hidden-stream inputs take (what a checkpointed block
  // keeps instead: a block's first inputs, one per output — TransformerBlock's convention; nothing for a
  // block that keeps nothing), from one forward on `probe` with grad on and nothing checkpointed, `live` reading the
  // bytes live on the model's device — the tracking allocator's on a CPU or GPU, a MetaCount's on the meta
  // device (the walk: Session::block_activations). The modes applied before are applied again after.
  // Under another `mode` (every block in it), what each block leaves live, and the FLOPs its forward runs
  // (of them its adapters') and of them those its backward runs again (memory/flops.h).
  struct BlockProbe {
    std::vector<int64_t> kept_bytes, input_bytes;
    std::vector<double> forward_flops, adapter_flops, recomputed_flops;
    std::vector<int64_t> recomputed_bytes;  // on the meta device: FlopCount::recomputed_bytes
  };
  BlockProbe probe_blocks(const model::ModelInputs& probe, const std::function<int64_t()>& live,
                          ckpt::BlockMode mode = ckpt::BlockMode::None);

 private:
  model::DiffusionTransformer& model_;
  std::vector<ckpt::CheckpointWrapper> wrappers_;
};

}  // namespace gclab::train
