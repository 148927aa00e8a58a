// Counting the matmul FLOPs a forward runs, as the code runs (on any device; on the meta device the walk's
// forward counts the same): each nn Linear adds 2·rows·in·out for its weight and its adapters, attention
// 4·B·H·Sq·Skv·D (the scores and the weighted sum) — the rules written once, where the ops are called
// (LinearImpl::forward, nn::attention); an adapter's Linears are counted apart as well (model FLOPs, as MFU
// counts them, leave them out). What runs inside a checkpointed region's forward (ckpt::checkpoint:
// the same computation again in the backward) is also counted as `recomputed`, so a forward under a
// checkpoint policy tells what its backward will run again (but for the ops a selective:ops checkpoint keeps:
// NotRecomputed). Element-wise ops are not counted.
#pragma once

#include <cstdint>

namespace gclab::memory {

// Counts on this thread while it lives (nested: every live count sees the FLOPs).
class FlopCount {
 public:
  FlopCount();
  ~FlopCount();
  FlopCount(const FlopCount&) = delete;
  FlopCount& operator=(const FlopCount&) = delete;
  double total() const { return total_; }
  double recomputed() const { return recomputed_; }
  double adapters() const { return adapters_; }  // of total(): LoRA / recovery / assistant adapters'
  // The bytes the recomputed ops write (every tensor a checkpoint's forward makes on the meta device): what the
  // element-wise ops between the matmuls cost a recompute, which FLOPs do not see (selective:ops recomputes
  // only those). Counted on the meta device only (the walk's counting allocator: meta_count.h).
  int64_t recomputed_bytes() const { return recomputed_bytes_; }

 private:
  friend void add_flops(double flops, bool adapter);
  friend void add_written_bytes(int64_t bytes);
  FlopCount* outer_;
  double total_ = 0, recomputed_ = 0, adapters_ = 0;
  int64_t recomputed_bytes_ = 0;
};

// Whether a FlopCount lives on this thread (an op need not work out its FLOPs otherwise).
bool counting_flops();

// An op's FLOPs (`adapter`: an adapter's, beside a Linear's weight), to every FlopCount alive on this thread
// (nothing when none is).
void add_flops(double flops, bool adapter = false);

// A tensor of `bytes` made (the meta device's counting allocator calls it): to every FlopCount alive on this
// thread as recomputed bytes, inside a RecomputedRegion.
void add_written_bytes(int64_t bytes);

// While one lives, the FLOPs run are recomputed ones (a checkpoint's forward).
class RecomputedRegion {
 public:
  RecomputedRegion();
  ~RecomputedRegion();
  RecomputedRegion(const RecomputedRegion&) = delete;
  RecomputedRegion& operator=(const RecomputedRegion&) = delete;
};

// While one lives inside a RecomputedRegion, the FLOPs run are not recomputed ones: an op whose output a
// selective:ops checkpoint keeps (ckpt/saved_ops.h) runs once.
class NotRecomputed {
 public:
  NotRecomputed();
  ~NotRecomputed();
  NotRecomputed(const NotRecomputed&) = delete;
  NotRecomputed& operator=(const NotRecomputed&) = delete;

 private:
  int outer_;
};

}  // namespace gclab::memory
