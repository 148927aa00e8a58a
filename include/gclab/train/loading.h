// The model's load as AI Toolkit's loaders do it, and what it holds. A Session builds the transformer,
// quantizes it where the arch's loader does (model::TransformerLoading: on the device, or in host memory
// under model.low_vram or block by block), builds the text encoders on the device and quantizes them there,
// and moves the transformer to the device before them or after — walking the same steps on the modules'
// sizes (LoadMemory), so a meta build predicts what a real one measures.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <string>

#include "gclab/memory/live_set.h"
#include "gclab/nn/layers.h"
#include "gclab/train/plan.h"

namespace gclab::train {

enum class Residence { device, host };

// `t` placed in `where` for a run on `device`: on a GPU run host memory is the CPU's (pinned when asked, for
// asynchronous copies to the device); on a CPU run a copy the tracker counts as host memory
// (memory::HostScope) or as the device's; on the meta device `t` itself.
torch::Tensor place(const torch::Tensor& t, Residence where, const torch::Device& device, bool pinned = false);
// Moves every parameter and buffer of `module` to `where` (place), the old copy freed as it goes.
void move_module(torch::nn::Module& module, Residence where, const torch::Device& device);
// The bytes of `module`'s largest parameter.
int64_t largest_parameter_bytes(const torch::nn::Module& module);

// What a model's load held on the device and in host memory: the walk of its steps on the modules' sizes
// (above what was live before it), and on a real run what the meter measured.
struct LoadMemory {
  memory::LiveSet device, host;  // predicted
  bool quantized_on_host = false;
  bool at_first_use = false;  // the transformer left in host memory at the load's end (LoadPlan::at_first_use)
  std::optional<int64_t> measured_device_peak_bytes, measured_host_peak_bytes;  // real runs
  // A module built in its dtype, quantized (its walk), or moved from one side to the other.
  void built(Residence where, int64_t bytes) { side(where).alloc(bytes); }
  void quantized(Residence where, const nn::StorageChange& change) {
    side(where).spike(change.peak_above_bytes);
    side(where).alloc(change.net_bytes);
  }
  // A module built in host memory with its parameters drawn on the device one at a time (nn::DrawOnDevice):
  // the device holds the largest of them for a moment.
  void staged(int64_t largest_parameter_bytes) { device.spike(largest_parameter_bytes); }
  void moved(Residence to, int64_t bytes) {
    side(to).alloc(bytes);
    side(to == Residence::device ? Residence::host : Residence::device).free(bytes);
  }

 private:
  memory::LiveSet& side(Residence where) { return where == Residence::device ? device : host; }
};

// The load's walk for a plan: the load's own steps run on the meta device (a Session of the plan stopped
// after its load: the transformer and the text encoders built as the plan loads them — dtype, quantization
// and where it happens, the text encoders' offloading, the order), each recording its modules' sizes as it
// runs. What a Session's load holds, predicted, and what what-if advice re-plans.
LoadMemory predict_load(const RunPlan& plan);

}  // namespace gclab::train
