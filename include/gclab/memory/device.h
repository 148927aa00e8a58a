// What this process can run on: the LibTorch it was built with, whether that build has CUDA, and the
// GPUs it sees with their memory. `gclab info` prints it; reports and benchmarks record it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gclab::memory {

struct GpuInfo {
  int index = 0;
  std::string name;
  std::int64_t total_bytes = 0;
  std::int64_t free_bytes = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
};

struct DeviceInfo {
  std::string torch_version;    // the LibTorch this binary was compiled against
  bool cuda_compiled = false;   // LibTorch built with CUDA (true for the PyPI wheel)
  std::string cuda_version;     // CUDA runtime the build uses, e.g. "13.0"; empty without CUDA
  bool cuda_available = false;  // a driver and at least one GPU are present right now
  std::vector<GpuInfo> gpus;
  int cpu_threads = 0;              // intra-op threads LibTorch uses on the CPU
  std::string cpu_isa;              // the ISA oneDNN dispatches for (memory/cpu_isa.h)
  bool cpu_rules_measured = false;  // the CPU kernels' memory rules measured on it, bf16 included
};

// `only`: that GPU alone (>= 0), so that a data-parallel rank makes no CUDA context on the others' GPUs.
DeviceInfo describe_devices(int only = -1);

}  // namespace gclab::memory
