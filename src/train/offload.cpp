#include "gclab/train/offload.h"

#include <random>

#include "gclab/nn/layers.h"
#include "gclab/train/loading.h"

namespace gclab::train {

Offloaded offload_layers(torch::nn::Module& root, double share, uint64_t seed, const torch::Device& device,
                         const std::shared_ptr<nn::OffloadRings>& rings) {
  // Pinned beside a GPU: the copies to the device can then be asynchronous.
  auto to_host = [&device](const torch::Tensor& t) { return place(t, Residence::host, device, /*pinned=*/true); };
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  Offloaded out;
  for (auto& [path, linear] : nn::named_linears(root)) {
    ++out.linears;
    if (uniform(rng) > share) continue;
    linear->offload(to_host, rings);
    ++out.offloaded;
  }
  out.host_bytes = nn::offloaded_bytes(root);
  return out;
}

}  // namespace gclab::train
