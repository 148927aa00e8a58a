#include "gclab/train/loading.h"

#include "gclab/memory/tracker.h"

namespace gclab::train {

torch::Tensor place(const torch::Tensor& t, Residence where, const torch::Device& device, bool pinned) {
  if (device.is_meta()) return t;
  if (device.is_cuda()) {
    if (where == Residence::device) return t.to(device);
    const torch::Tensor host = t.to(torch::kCPU);
    return pinned ? host.pin_memory() : host;
  }
  std::optional<memory::HostScope> host;
  if (where == Residence::host) host.emplace();
  return t.clone();
}

void move_module(torch::nn::Module& module, Residence where, const torch::Device& device) {
  if (device.is_meta()) return;
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) p.set_data(place(p, where, device));
  for (auto& b : module.buffers())
    if (b.defined()) b.set_data(place(b, where, device));
}

int64_t largest_parameter_bytes(const torch::nn::Module& module) {
  int64_t largest = 0;
  for (const auto& p : module.parameters()) largest = std::max(largest, static_cast<int64_t>(p.nbytes()));
  return largest;
}

}  // namespace gclab::train
