// Which model architectures gclab models, how an AI Toolkit `model` block names them, and the
// bucket divisibility AI Toolkit uses for each (see DESIGN.md section 4).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace gclab::config {

struct ArchInfo {
  std::string name;       // gclab's arch id, AI Toolkit spelling where AI Toolkit has one
  std::string family;     // flux | qwen_image | zimage | sd3 | dit
  int divisibility = 16;  // bucket sides are multiples of this (AI Toolkit's per-model value)
  bool tiny = false;      // a CPU-test-size model of the family
};

// Every arch gclab accepts in `model.arch`, in the order they are listed to users.
const std::vector<ArchInfo>& supported_archs();
std::optional<ArchInfo> find_arch(const std::string& name);
// "flux, flex1, flex2, qwen_image, ..." for error messages.
std::string supported_arch_list();

// What AI Toolkit's ModelConfig would call the arch: `arch` (tag after ':' dropped), else the legacy
// is_* switches, else nothing. gclab additionally infers from a well-known `name_or_path`.
struct ArchGuess {
  std::string arch;    // may be unsupported (e.g. "wan21", "lumina2")
  std::string reason;  // "model.arch", "model.is_flux", "model.name_or_path"
};
std::optional<ArchGuess> infer_arch_from_name(const std::string& name_or_path);

}  // namespace gclab::config
