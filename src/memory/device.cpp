#include "gclab/memory/device.h"

#include "gclab/memory/cpu_isa.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>
#include <torch/version.h>

namespace gclab::memory {

DeviceInfo describe_devices(int only) {
  DeviceInfo info;
  info.torch_version = TORCH_VERSION;
  info.cpu_threads = at::get_num_threads();
  info.cpu_isa = name_of(onednn_isa());
  info.cpu_rules_measured = cpu_rules_measured(2) && cpu_rules_measured(4);
#ifdef CUDA_VERSION
  info.cuda_compiled = true;
  info.cuda_version = std::to_string(CUDA_VERSION / 1000) + "." + std::to_string(CUDA_VERSION % 1000 / 10);
#endif
  // device_count() returns 0 (and does not throw) on a machine without a driver or GPU.
  const int count = static_cast<int>(c10::cuda::device_count());
  info.cuda_available = count > 0;
  for (int i = 0; i < count; ++i) {
    if (only >= 0 && i != only) continue;
    GpuInfo gpu;
    gpu.index = i;
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(i);
    gpu.name = prop->name;
    gpu.total_bytes = static_cast<std::int64_t>(prop->totalGlobalMem);
    gpu.compute_capability_major = prop->major;
    gpu.compute_capability_minor = prop->minor;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(i));
    std::size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
      gpu.free_bytes = static_cast<std::int64_t>(free_bytes);
    info.gpus.push_back(gpu);
  }
  return info;
}

}  // namespace gclab::memory
