#include "gclab/memory/placement.h"

#include "gclab/memory/tracker.h"

namespace gclab::memory {

at::Tensor to_device(const at::Tensor& t, const c10::Device& device, c10::ScalarType dtype) {
  if (!t.defined()) return t;
  const bool copy = device.is_cpu() && is_host_memory(t);
  return t.to(device, dtype, /*non_blocking=*/false, copy);
}

at::Tensor to_device(const at::Tensor& t, const c10::Device& device) {
  return t.defined() ? to_device(t, device, t.scalar_type()) : t;
}

at::Tensor to_host(const at::Tensor& t) {
  if (!t.defined()) return t;
  if (!t.device().is_cpu()) return t.to(c10::Device(c10::kCPU));
  if (!CpuMemoryTracker::installed() || is_host_memory(t)) return t;
  HostScope host;
  return t.clone();
}

}  // namespace gclab::memory
