// How an AI Toolkit `model` block names its architecture when `arch` is not written. Which archs gclab
// models, and their facts, are the model part's (model/family.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace gclab::config {

// What AI Toolkit's ModelConfig would call the arch: `arch` (tag after ':' dropped), else the legacy
// is_* switches, else nothing. gclab additionally infers from a well-known `name_or_path`: the modelled
// families' names come from the model registry (model::infer_arch_from_name); this table knows only AI
// Toolkit's archs gclab does not model, to say so.
struct ArchGuess {
  std::string arch;    // may be unsupported (e.g. "wan21", "lumina2")
  std::string reason;  // "model.arch", "model.is_flux", "model.name_or_path"
};
std::optional<ArchGuess> infer_arch_from_name(const std::string& name_or_path);

}  // namespace gclab::config
