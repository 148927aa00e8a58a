// Where a GPU run keeps a tensor, emulated on the CPU. A GPU run's data loader builds its batches in host
// memory and the step copies them to the device; the latent cache lives in host memory. On a CPU run both
// sides are the same memory, and the tracker tells them apart by HostScope (tracker.h): these helpers make
// the copies a GPU run makes, so the CPU's device bytes are the GPU's (the loader's prefetched batches and
// the latent cache are host memory there too, not part of any phase's device peak).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <optional>

#include "gclab/memory/tracker.h"

namespace gclab::memory {

// Whether `t`'s memory is host memory as the CPU tracker counts it (allocated under a HostScope).
bool is_host_memory(const at::Tensor& t);
// `t` on `device` in `dtype`, as a GPU run holds it: on CUDA t.to(device, dtype); on the CPU (or meta) a copy
// counted as device memory when `t` is host memory, else t.to(dtype).
at::Tensor to_device(const at::Tensor& t, const c10::Device& device, c10::ScalarType dtype);
at::Tensor to_device(const at::Tensor& t, const c10::Device& device);
// `t` in host memory: a CPU copy of a device tensor; on the CPU a copy under HostScope unless `t` is host
// memory already (or no tracker is installed, where the two are not told apart); on meta a copy standing for
// host memory (meta_count.h) unless `t` stands for it already.
at::Tensor to_host(const at::Tensor& t);

// `t` where a run does CPU-side work on it (an image's conversion, a processor's resize): t.cpu() — a GPU
// run's copy to host memory, the CPU's own tensor. On meta, the same for the device the walk stands for
// (meta_count.h's meta_target()): a copy standing for host memory for a GPU, `t` itself for the CPU.
at::Tensor to_cpu(const at::Tensor& t);

// The CPU-side work of a run (preprocessing between to_cpu and to_device): while one lives, a walk standing
// for a GPU run counts what this thread allocates as host memory (a HostScope), as the GPU run's work is in
// host memory; a CPU run's (and its walk's) is its device's memory, and there it does nothing. The walk's
// target is the process's (meta_target), the scope this thread's: one thread walks at a time.
class CpuWork {
 public:
  CpuWork();
  CpuWork(const CpuWork&) = delete;
  CpuWork& operator=(const CpuWork&) = delete;

 private:
  std::optional<HostScope> host_;
};

}  // namespace gclab::memory
