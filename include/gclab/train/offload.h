// model.layer_offloading as AI Toolkit applies it (toolkit/memory_management/manager.py, MemoryManager.attach,
// called by the model loaders with layer_offloading_transformer_percent / _text_encoder_percent): every
// Linear of the component, in module order, is offloaded unless a uniform draw exceeds the share
// (`random.random() > offload_percent` skips it; here the draw is seeded by training_seed, so a run and its
// meta build choose the same Linears). An offloaded Linear keeps its frozen weight in host memory — pinned
// on a GPU, counted as host bytes by the CPU tracker — and brings it to the device per call
// (nn::Linear::offload). Norms, embeddings and the trained LoRA stay on the device.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>

#include "gclab/nn/layers.h"

namespace gclab::train {

struct Offloaded {
  int linears = 0;         // Linears in the component
  int offloaded = 0;       // of which offloaded
  int64_t host_bytes = 0;  // what they keep in host memory
};

// `rings`: the Session's, where the weights brought stay.
Offloaded offload_layers(torch::nn::Module& root, double share, uint64_t seed, const torch::Device& device,
                         const std::shared_ptr<nn::OffloadRings>& rings);

}  // namespace gclab::train
