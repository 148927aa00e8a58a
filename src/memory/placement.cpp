#include "gclab/memory/placement.h"

#include "gclab/memory/meta_count.h"
#include "gclab/memory/tracker.h"

namespace gclab::memory {

at::Tensor to_device(const at::Tensor& t, const c10::Device& device, c10::ScalarType dtype) {
  if (!t.defined()) return t;
  // The CPU's (and a walk's) host and device tensors share a device: a host tensor is copied.
  const bool copy = (device.is_cpu() || device.is_meta()) && is_host_memory(t);
  return t.to(device, dtype, /*non_blocking=*/false, copy);
}

at::Tensor to_device(const at::Tensor& t, const c10::Device& device) {
  return t.defined() ? to_device(t, device, t.scalar_type()) : t;
}

at::Tensor to_host(const at::Tensor& t) {
  if (!t.defined()) return t;
  if (t.is_meta()) {  // a walk's: a copy standing for host memory
    if (is_host_memory(t)) return t;
    HostScope host;
    return t.clone();
  }
  if (!t.device().is_cpu()) return t.to(c10::Device(c10::kCPU));
  if (!CpuMemoryTracker::installed() || is_host_memory(t)) return t;
  HostScope host;
  return t.clone();
}

at::Tensor to_cpu(const at::Tensor& t) {
  if (!t.defined() || !t.is_meta()) return t.defined() ? t.cpu() : t;
  if (meta_target() == c10::kCPU || is_host_memory(t)) return t;
  HostScope host;
  return t.clone();
}

CpuWork::CpuWork() {
  if (meta_target() != c10::kCPU) host_.emplace();
}

}  // namespace gclab::memory
