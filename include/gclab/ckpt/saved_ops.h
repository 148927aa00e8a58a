// Op-level selective recomputation (checkpoint_policy selective:ops), torchtitan's op-level selective AC
// written for LibTorch: inside a checkpointed block the outputs of the matmuls and of attention are kept, and
// the backward recomputes only the cheap ops between them (norms, modulation, activations, RoPE).
//
// The checkpoint's forward (ckpt::checkpoint with CheckpointOptions::save_ops) runs the block with a
// SavedOps recording: each op that can be replayed (a Linear's matmul, nn::attention) runs and records its
// outputs under its site. The checkpoint keeps them with the block's inputs (save_for_backward: released
// when its backward has run). Its backward runs the block again with the SavedOps replaying: each recorded op
// does not run but hands back what it recorded, wrapped in an autograd function whose backward is the op's
// own (nn/meta_kernels.cpp: ReplayedLinear, ReplayedAttention). An op whose output was changed
// in place after it ran, or that the device cannot replay, records nothing and runs again.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace gclab::ckpt {

class SavedOps {
 public:
  // The SavedOps recording (or replaying) on this thread, or null: only code inside a selective:ops block's
  // forward (recompute) sees one.
  static SavedOps* recording();
  static SavedOps* replaying();

  // Recording: `outputs` as the next call at `site` (a Linear, the attention function) left them; none: the
  // call is not kept (it runs again).
  void record(const void* site, std::vector<at::Tensor> outputs);
  // Replaying: what the next call at `site` recorded (empty: run it).
  std::vector<at::Tensor> take(const void* site);

  // After recording: drops what was changed in place since it was recorded (its value at the call is gone)
  // and what shares memory with one of the block's `outputs` (the caller may change those in place), and returns
  // the kept tensors in order, for the checkpoint to save. A dropped call runs again in the recompute (its
  // FLOPs were counted as run once: memory/flops.h).
  std::vector<at::Tensor> finish_recording(const std::vector<at::Tensor>& outputs);
  // Before replaying: the recorded tensors as the checkpoint's backward unpacked them (finish_recording's order).
  void start_replaying(const std::vector<at::Tensor>& kept);

 private:
  struct Call {
    const void* site = nullptr;
    std::vector<at::Tensor> outputs;
    std::vector<int64_t> versions;  // each output's version counter when recorded
    size_t count = 0;               // outputs kept (for start_replaying)
  };
  std::vector<Call> calls_;
  std::map<const void*, size_t> next_;  // replaying: the next call per site, as an index among that site's
  friend class SavedOpsScope;
};

// Makes `ops` this thread's recording (or replaying) SavedOps while it lives.
class SavedOpsScope {
 public:
  SavedOpsScope(SavedOps* ops, bool replay);
  ~SavedOpsScope();
  SavedOpsScope(const SavedOpsScope&) = delete;
  SavedOpsScope& operator=(const SavedOpsScope&) = delete;

 private:
  SavedOps* outer_recording_;
  SavedOps* outer_replaying_;
};

}  // namespace gclab::ckpt
