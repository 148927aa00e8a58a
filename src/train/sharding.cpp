#include "gclab/train/sharding.h"

#include <algorithm>
#include <stdexcept>

#include "gclab/dist/reducer.h"

namespace gclab::train {

std::optional<Shard> parse_shard(const std::string& name) {
  for (Shard s : {Shard::none, Shard::optimizer, Shard::grads, Shard::full})
    if (name == shard_name(s)) return s;
  return std::nullopt;
}

const char* shard_name(Shard shard) {
  switch (shard) {
    case Shard::none:
      return "none";
    case Shard::optimizer:
      return "optimizer";
    case Shard::grads:
      return "grads";
    case Shard::full:
      return "full";
  }
  return "none";
}

ShardedResident shard_resident(const MemoryEstimate& e, Shard shard) {
  ShardedResident r;
  r.shard = shard;
  r.world_size = std::max(1, e.world_size);
  const int64_t n = r.world_size;
  auto slice = [n](int64_t bytes) { return (bytes + n - 1) / n; };  // the largest rank's share
  r.weights = shard == Shard::full ? slice(e.weight_bytes) : e.weight_bytes;
  r.gradients = shard == Shard::grads || shard == Shard::full ? slice(e.gradient_bytes) : e.gradient_bytes;
  r.gradient_buckets = shard == Shard::grads || shard == Shard::full
                           ? std::min(e.gradient_bucket_bytes, dist::GradientReducer::kBucketBytes)
                           : e.gradient_bucket_bytes;
  if ((shard != Shard::none) != e.optimizer_sharded)
    throw std::invalid_argument(std::string("shard ") + shard_name(shard) + ": the estimate must be planned " +
                                (e.optimizer_sharded ? "without" : "with") + " the optimizer's state sharded");
  r.optimizer = e.optimizer_bytes;  // walked: the rank's own tensors' state under any sharding
  r.ema = shard == Shard::full ? slice(e.ema_bytes) : e.ema_bytes;  // the EMA is updated whole until FSDP
  if (shard == Shard::full) r.gathered = 2 * e.largest_block_weight_bytes + e.largest_block_trained_bytes;
  r.unsharded = e.resident_bytes;
  r.resident = e.resident_bytes - (e.weight_bytes - r.weights) - (e.gradient_bytes - r.gradients) -
               (e.gradient_bucket_bytes - r.gradient_buckets) - (e.ema_bytes - r.ema) + r.gathered;
  return r;
}

int64_t sharded_step_total(const StepEstimate& step, const ShardedResident& r) {
  int64_t total = 0;
  for (const auto& [phase, bytes] : step.phases) total = std::max(total, bytes + r.change());
  return total;
}

}  // namespace gclab::train
