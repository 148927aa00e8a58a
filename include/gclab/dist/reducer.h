// Gradients averaged across the ranks while the backward still runs, as DDP's reducer does: the trained tensors
// in buckets (reverse order of registration, so the blocks' backward fills them first; one dtype each, 25 MiB),
// each bucket's average started as soon as its last gradient is accumulated (a post-accumulate-grad hook on
// every tensor, the same in a checkpointed block: its recompute's gradients reach the leaves through the
// engine's AccumulateGrad as any other). Buckets start strictly in order on every rank, so the collectives
// match; a bucket whose gradients did not all come (a tensor no micro-batch reached) starts at finish().
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "gclab/dist/process_group.h"

namespace gclab::dist {

class GradientReducer {
 public:
  static constexpr int64_t kBucketBytes = 25 << 20;
  // `trained` in registration order (the forward's); hooks are set on each; the buckets' buffers are
  // allocated now, on the tensors' device (what buffer_bytes counts).
  // Without a group (`gclab bench` / `fit` as one rank of a world: its figures a rank's) the buckets are held and
  // nothing is averaged: no hooks, finish() does nothing.
  GradientReducer(ProcessGroup* group, std::vector<at::Tensor> trained, int64_t bucket_bytes = kBucketBytes);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // The next backward's gradients are the step's last (its last micro-batch's, with nothing added after): the
  // hooks start each bucket's average as it fills. Without arm() they do nothing, and finish() averages all.
  void arm();
  // Starts the buckets not started yet, waits for all, and writes each tensor's average into its gradient. A
  // tensor with no gradient on any rank keeps none (an optimizer skips it, as torch's skip None).
  void finish();
  // The buckets' buffers for these trained tensors: one element per tensor beyond its gradient (whether this
  // rank has one), in its dtype — what a rank holds beside its gradients under DDP.
  static int64_t buffer_bytes(const std::vector<at::Tensor>& trained, int64_t bucket_bytes = kBucketBytes);
  int buckets() const { return static_cast<int>(buckets_.size()); }
  int started_during_backward() const { return started_early_; }  // of the step under way, before finish()

 private:
  struct Bucket {
    std::vector<size_t> members;   // indices into trained_
    std::vector<int64_t> offsets;  // each member's first element in `flat`
    at::Tensor flat;               // the gradients, then one flag per member (1: this rank had one)
    int filled = 0;
    std::unique_ptr<Pending> pending;
  };
  friend struct ReadyHook;
  void ready(size_t tensor);
  void start(Bucket& b);
  void copy_in(Bucket& b, size_t k);
  ProcessGroup* group_;
  std::vector<at::Tensor> trained_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> where_;  // per tensor: its bucket and its place among the members
  size_t next_ = 0;                               // the next bucket to start
  bool armed_ = false;
  int started_early_ = 0;
};

// ZeRO-1's partition: each trained tensor's owning rank — contiguous runs in registration order, each rank about
// 1/size of the bytes (a tensor is not split). The same on every rank; the rule the run and its walk follow.
std::vector<int> owners(const std::vector<at::Tensor>& trained, int size);

// The buckets a reducer makes of tensors of these sizes and dtypes, in reverse order, each of one dtype and at
// most `bucket_bytes` (a tensor larger alone); the rule both the reducer and buffer_bytes follow.
std::vector<std::vector<size_t>> plan_buckets(const std::vector<at::Tensor>& trained, int64_t bucket_bytes);

}  // namespace gclab::dist
