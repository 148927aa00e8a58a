#include "gclab/train/loading.h"

#include "gclab/memory/tracker.h"

namespace gclab::train {

void move_module(torch::nn::Module& module, Residence where, const torch::Device& device) {
  if (device.is_meta()) return;
  torch::NoGradGuard no_grad;
  auto move = [&](torch::Tensor& t) {
    if (!t.defined()) return;
    if (device.is_cuda()) {
      t.set_data(t.to(where == Residence::host ? torch::Device(torch::kCPU) : device));
      return;
    }
    std::optional<memory::HostScope> host;
    if (where == Residence::host) host.emplace();
    t.set_data(t.clone());
  };
  for (auto& p : module.parameters()) move(p);
  for (auto& b : module.buffers()) move(b);
}

}  // namespace gclab::train
