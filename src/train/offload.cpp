#include "gclab/train/offload.h"

#include <random>

#include "gclab/memory/tracker.h"
#include "gclab/nn/layers.h"

namespace gclab::train {

Offloaded offload_layers(torch::nn::Module& root, double share, uint64_t seed, const torch::Device& device) {
  // Host placement: pinned CPU memory beside a GPU (the copies to the device can then be asynchronous); on a
  // CPU run a copy the tracker counts as host memory; on the meta device the shapes stay where they are.
  auto to_host = [&device](const torch::Tensor& t) -> torch::Tensor {
    if (device.is_meta()) return t;
    if (device.is_cuda()) return t.to(torch::kCPU).pin_memory();
    memory::HostScope host;
    return t.clone();
  };
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  Offloaded out;
  for (auto& [path, linear] : nn::named_linears(root)) {
    ++out.linears;
    if (uniform(rng) > share) continue;
    linear->offload(to_host);
    ++out.offloaded;
  }
  out.host_bytes = nn::offloaded_bytes(root);
  return out;
}

}  // namespace gclab::train
