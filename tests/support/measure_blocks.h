// Measures what each block of a model keeps for its backward, with the tracking allocator: the test of
// the activation ledger and the models benchmark share it.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>

#include "gclab/memory/tracker.h"
#include "gclab/model/transformer.h"
#include "gclab/nn/layers.h"

namespace gclab::testing {

using model::DiffusionTransformer;
using model::Family;
using model::ModelInputs;
using model::Tensors;

inline std::string kind_of(model::Family family, const std::string& name, bool last) {
  if (family == model::Family("flux")) return name.rfind("single", 0) == 0 ? "single" : "double";
  if (family == model::Family("qwen_image")) return "double";
  if (family == model::Family("zimage"))
    return name.rfind("noise", 0) == 0 ? "noise refiner" : name.rfind("context", 0) == 0 ? "context refiner" : "single";
  if (family == model::Family("sd3")) return last ? "joint (last)" : "joint";
  return "dit";
}

// Bytes each block keeps after its forward, measured: the block runs alone on inputs captured from a
// full forward, requiring grad as in training (hidden streams always, the conditioning vector in full
// training only, rotary tables never).
inline std::map<std::string, int64_t> measure_saved_bytes(DiffusionTransformer& m, const ModelInputs& in, bool lora) {
  std::vector<Tensors> captured(m.blocks().size());
  m.set_block_caller([&](size_t i, const Tensors& x) {
    captured[i] = x;
    return m.blocks()[i]->forward(x);
  });
  {
    torch::NoGradGuard no_grad;
    m.forward(in);
  }
  m.set_block_caller({});
  const model::Family family = m.spec().family;
  std::map<std::string, int64_t> kept;
  memory::CpuMemoryTracker tracker;
  for (size_t i = 0; i < captured.size(); ++i) {
    const std::string& name = m.block_names()[i];
    const size_t streams =
        family == model::Family("dit") || family == model::Family("zimage") || name.rfind("single", 0) == 0 ? 1 : 2;
    const bool has_cond = !(family == model::Family("zimage") && name.rfind("context", 0) == 0);
    // Under LoRA a block without adapters, fed by frozen modules only (Z-Image's refiners: AI Toolkit puts
    // adapters on its `layers` alone), needs no gradient: it keeps nothing.
    bool adapted = false;
    for (auto& [path, linear] : nn::named_linears(*m.blocks()[i])) adapted = adapted || linear->has_lora();
    const bool trained = !lora || adapted;
    Tensors x;
    for (size_t k = 0; k < captured[i].size(); ++k) {
      const bool needs_grad = trained && (k < streams || (has_cond && k == streams && !lora));
      x.push_back(captured[i][k].detach().clone().requires_grad_(needs_grad));
    }
    const int64_t before = tracker.stats().live_bytes;
    const Tensors out = m.blocks()[i]->forward(x);
    int64_t out_bytes = 0;
    for (const auto& t : out) {
      bool is_input = false;
      for (const auto& t_in : x) is_input = is_input || t.is_same(t_in);
      if (!is_input) out_bytes += static_cast<int64_t>(t.nbytes());
    }
    kept[kind_of(family, name, i + 1 == captured.size())] = tracker.stats().live_bytes - before - out_bytes;
  }
  return kept;
}

}  // namespace gclab::testing
