// Beyond one replica, on paper: what each of the estimate's world_size ranks holds when the training state is
// sharded across them, as DeepSpeed's ZeRO stages and PyTorch's FSDP shard it (Rajbhandari et al., "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models", 2020, §5; FSDP: Zhao et al., 2023, §3). gclab trains
// the first row (data parallelism, every rank a whole replica); the others are predictions for a user deciding
// whether a model has outgrown it.
//
//   none       DDP: each rank holds everything, and the gradient reducer's buckets beside the gradients.
//   optimizer  ZeRO-1: each rank keeps and updates the optimizer's state of its own trained tensors (dist::owners,
//              walked: what `gclab train --shard optimizer` holds); the gradients are whole,
//              reduced in buckets as DDP's; the updated weights are all-gathered, and the EMA is updated whole
//              (as `gclab train --shard optimizer` keeps it: rank 0's previews and saves read it).
//   grads      ZeRO-2: as optimizer, and each rank keeps its 1/N of the gradients: a bucket is reduce-scattered
//              as it fills, so one bucket is whole at a time.
//   full       FSDP / ZeRO-3: as grads, and each rank keeps its 1/N of every weight (the frozen base too) and of the
//              EMA; a block's
//              weights are all-gathered while it runs, the next one's prefetched (two blocks' weights whole at
//              once) and the block's gradients are whole until they are reduce-scattered.
// The activations are each rank's own whatever the sharding: a step's peak moves by the resident bytes' change.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "gclab/train/predict.h"

namespace gclab::train {

enum class Shard { none, optimizer, grads, full };

std::optional<Shard> parse_shard(const std::string& name);
const char* shard_name(Shard shard);

struct ShardedResident {
  Shard shard = Shard::none;
  int world_size = 1;
  // Per rank.
  int64_t weights = 0, gradients = 0, gradient_buckets = 0, optimizer = 0, ema = 0;
  int64_t gathered = 0;  // full: the blocks' weights and gradients whole while they run
  int64_t resident = 0;  // the estimate's resident bytes with these in place of its own
  // What a step's peak (resident + the step's own bytes) moves by: resident - the estimate's resident.
  int64_t change() const { return resident - unsharded; }
  int64_t unsharded = 0;
};

// The estimate's resident bytes under `shard`, for each of its world_size ranks. The optimizer's state and its
// update are never divided here: for any shard but none the estimate must be planned with the optimizer sharded
// (RunPlan::world.shard_optimizer: the rank's own tensors' state walked, as `train --shard optimizer` holds it;
// std::invalid_argument otherwise), and for none without.
ShardedResident shard_resident(const MemoryEstimate& e, Shard shard);
// A step's peak on each rank under the sharding: every phase moved by the resident bytes' change.
int64_t sharded_step_total(const StepEstimate& step, const ShardedResident& r);

}  // namespace gclab::train
