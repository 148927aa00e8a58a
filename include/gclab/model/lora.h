// LoRA on a frozen base and low-precision base weights, applied to a built transformer.
//
// Targets: every Linear inside the transformer's blocks — what AI Toolkit's LoRA network wraps for these
// families (for FLUX.1: 19 x 14 + 38 x 6 = 494 modules), embedders and the output layer excluded.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "gclab/model/transformer.h"

namespace gclab::model {

struct LoraOptions {
  int64_t rank = 16;    // network.linear
  double alpha = 16.0;  // network.linear_alpha
  double dropout = 0.0;
};

// Freezes every parameter, then adds an adapter to each target Linear. Returns the number of adapted
// modules. The adapters start as a no-op (lora_B = 0), so the model's output is unchanged.
int apply_lora(DiffusionTransformer& model, const LoraOptions& options);

// Stores every target Linear's (frozen) weight as `storage` — model.quantize: float8. Returns the bytes of
// weight storage saved.
int64_t set_base_weight_storage(DiffusionTransformer& model, WeightStorage storage);

// The adapter weights in AI Toolkit's / diffusers' LoRA naming:
//   transformer.<module path>.lora_A.weight  [rank, in]
//   transformer.<module path>.lora_B.weight  [out, rank]
// in `dtype` (save.dtype), with the rank and alpha in the metadata (ss_network_dim / ss_network_alpha,
// the keys kohya and AI Toolkit write).
std::vector<std::pair<std::string, torch::Tensor>> lora_state(DiffusionTransformer& model, torch::ScalarType dtype);
void save_lora(DiffusionTransformer& model, const std::filesystem::path& path, torch::ScalarType dtype,
               const LoraOptions& options, std::map<std::string, std::string> metadata = {});
// Loads adapter weights saved by save_lora (or AI Toolkit, same names) into a model with adapters applied.
// Every adapter of the model must be in the file with the same shape; throws std::runtime_error naming
// the first mismatch.
void load_lora(DiffusionTransformer& model, const std::filesystem::path& path);

// Loads base weights by diffusers name (a .safetensors file or a sharded *.index.json), converting dtype
// (and quantizing where a Linear stores float8). Every model parameter must be present with its shape;
// file tensors the model has no parameter for are returned (buffers, other components) so the caller can
// report them. Throws std::runtime_error naming the first missing or mismatched tensor.
std::vector<std::string> load_weights(DiffusionTransformer& model, const std::filesystem::path& path);
// Every parameter by name (float8 weights are stored dequantized in `dtype`).
std::vector<std::pair<std::string, torch::Tensor>> weights_state(DiffusionTransformer& model, torch::ScalarType dtype);

}  // namespace gclab::model
