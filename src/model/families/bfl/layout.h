// What the families in Black Forest Labs' layout (AI Toolkit's Chroma and FLUX.2 copies, bfl/blocks.h) share
// beyond the blocks: their files' names, the order AI Toolkit's LoRA network makes the blocks' Linears in, and
// how a shape is read from a file or a folder gclab wrote. Private to the family folders.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "gclab/model/registry.h"

namespace gclab::model::bfl {

// The blocks' Linears in their modules' order (a block's index written "*"): double blocks' image stream,
// then text stream (qkv, proj, mlp.0, mlp.2), single blocks' linear1, linear2.
std::vector<std::string> block_linear_order();

// A file holding `key` in diffusers' names or ComfyUI's prefix: what it is, for a `model` loaded from BFL
// files like `example` ("lodestones' Chroma1-Base.safetensors"); empty for a BFL key.
std::string foreign_layout(const std::string& key, const std::string& model, const std::string& example);

// A folder's config.json: read (width, heads, text width, block counts) only where gclab wrote it (a full
// fine-tune's save, its weights in BFL's names); else `refusal`, a UserError — AI Toolkit loads these models
// from one file.
void read_gclab_folder(ModelSpec& spec, const nlohmann::json& config, const std::string& refusal);

// The shape a BFL file's tensors give: width, text width, head width, MLP width, block counts.
void read_tensor_shapes(ModelSpec& spec, const TensorShapes& tensors);

}  // namespace gclab::model::bfl
