// The `transformer/config.json` diffusers writes for each family's transformer class, from a ModelSpec:
// what a full fine-tune saved with `save.save_format: diffusers` carries beside its weights. Keys and
// values follow the reference configs (black-forest-labs/FLUX.1-dev, Qwen/Qwen-Image,
// Tongyi-MAI/Z-Image-Turbo, stabilityai/stable-diffusion-3.5-large, facebook/DiT-XL-2-256).
#pragma once

#include <string>

#include "gclab/model/spec.h"

namespace gclab::model {

// The JSON text of the config (2-space indented).
std::string diffusers_config_json(const ModelSpec& spec);

}  // namespace gclab::model
