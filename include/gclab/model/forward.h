// One forward pass on named inputs, for checking gclab's numerics against a reference implementation
// (`gclab forward`). Inputs and outputs are safetensors files of named tensors:
//   latents [B, C, H/8, W/8] (a video family's [B, C, F', H/8, W/8]), timestep [B] (flow time in [0, 1]), text [B, T,
//   text_dim] (alias encoder_hidden_states), pooled [B, pooled_dim] (alias pooled_projections), guidance [B],
//   class_labels [B] (int64), reference_latents.0, .1, ... (edit models)
// The output file holds `prediction`, shaped like latents (DiT: twice the channels).
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "gclab/model/transformer.h"

namespace gclab::model {

// Reads the named inputs from a safetensors file, checking that the family's required ones are present
// with the right rank and width; throws std::runtime_error naming what is wrong.
ModelInputs read_model_inputs(const ModelSpec& spec, const std::filesystem::path& path, const torch::Device& device,
                              torch::ScalarType dtype);
// The inputs as a file (the names above), for tests and reference runs.
std::vector<std::pair<std::string, torch::Tensor>> model_inputs_state(const ModelInputs& in);
// The spec as safetensors metadata (string values), so a reference implementation can rebuild the shapes.
std::map<std::string, std::string> spec_metadata(const ModelSpec& spec);

}  // namespace gclab::model
