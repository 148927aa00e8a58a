// Counting the meta device: a network run on meta tensors allocates nothing, but every tensor it makes —
// an op's output, a C++ expression's temporary, what autograd saves for the backward — still goes through
// the meta device's allocator (c10::GetAllocator(kMeta)). A MetaCount installs a counting allocator there
// while it lives (MetaAllocatorScope; it hands out no memory, as the default one) and reads, like the tracking
// allocator on a real device, the bytes live now and the highest count since it began: the network's own forward walked
// op by op, on shapes alone.
//
// Ops without a meta kernel in LibTorch's C++ (no Python meta registrations here) are given one where the
// networks use them (nn/meta_kernels.h: the fused attention, LayerNorm, GroupNorm, the convolution, ...),
// each allocating what its device kernel allocates.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gclab::memory {

// The counting allocator on the meta device while one of these lives (nested: the outermost installs it,
// and its end puts back the allocator that was there), so that a process holds it only while a walk runs.
// Every MetaCount holds one; so does a meta-device Session (train/session.h) for its life, its model's
// tensors being allocated — and freed inside its walks — through the counter.
class MetaAllocatorScope {
 public:
  MetaAllocatorScope();
  ~MetaAllocatorScope();
  MetaAllocatorScope(const MetaAllocatorScope&) = delete;
  MetaAllocatorScope& operator=(const MetaAllocatorScope&) = delete;
};

// `target`: the device kind whose kernels the walk stands for (the meta kernels allocate what that
// device's would: nn/meta_kernels.h, the checkpoint's offload). Counts nest (a walk inside a walk: the
// quantization's peak priced while a meta model loads): the inner one counts from where it starts, and the
// outer one's peak still sees everything. One thread at a time.
class MetaCount {
 public:
  // Counts from now: live() and peak() are relative to the bytes live on meta at this point.
  explicit MetaCount(c10::DeviceType target = c10::kCPU);
  ~MetaCount();
  MetaCount(const MetaCount&) = delete;
  MetaCount& operator=(const MetaCount&) = delete;
  int64_t live() const;
  int64_t peak() const;  // the most live() has been since construction or reset_peak()
  void reset_peak();

 private:
  MetaAllocatorScope installed_;
  int64_t base_ = 0, outer_peak_ = 0;
  c10::DeviceType previous_;
};

// Whether meta tensor `t` stands for host memory: allocated by the counting allocator while a
// memory::HostScope lived on its thread (the loader's batches, a cache's entries, as a walk makes them). Such
// allocations are left out of every count, as host memory is out of a device's.
bool is_meta_host_memory(const at::Tensor& t);

// The device kind a meta walk stands for (the innermost MetaCount's target; the CPU outside any).
c10::DeviceType meta_target();

// A kernel's own temporaries on the meta device: `bytes` allocated and freed at once (a counted spike).
void meta_spike(int64_t bytes);

// An op the walk met that has no meta kernel (its name, "aten::where.self"): recorded by run_walk.
void record_meta_gap(const c10::NotImplementedError& e);
// The ops recorded since the last call (each once), and forgets them.
std::vector<std::string> take_meta_gaps();

// Runs `walk`, code on meta tensors. An op with no meta kernel (LibTorch's meta fallback raises
// c10::NotImplementedError) ends the walk, not the program: the op is recorded (take_meta_gaps) and what the
// counts saw before it stands, a lower bound of the walk's peak. Returns whether the walk ran to its end.
template <class Walk>
bool run_walk(Walk&& walk) {
  try {
    walk();
    return true;
  } catch (const c10::NotImplementedError& e) {
    record_meta_gap(e);
    return false;
  }
}

// The peak of `run` — code run on meta tensors made before it, without a graph (an inference: an encode, a
// decode, a quantization) — above what was live when it started, walked for `target`'s kernels (run_walk:
// up to an op without a meta kernel).
template <class Run>
int64_t inference_peak(c10::DeviceType target, Run&& run) {
  at::NoGradGuard no_grad;
  MetaCount count(target);
  run_walk(std::forward<Run>(run));
  return count.peak();
}

}  // namespace gclab::memory
