#include "gclab/config/arch.h"

namespace gclab::config {

std::optional<ArchGuess> infer_arch_from_name(const std::string& name_or_path) {
  // AI Toolkit's archs that gclab does not model (yet), so a config naming one is told so; a modelled
  // family's names are its folder's (ArchFacts::names, model::infer_arch_from_name).
  static const std::vector<std::pair<std::string, std::string>> known = {
      {"Lumina-Image", "lumina2"}, {"OmniGen2", "omnigen2"},        {"Wan2.1", "wan21"},
      {"Wan2.2", "wan22"},         {"stable-diffusion-xl", "sdxl"},
  };
  for (const auto& [needle, arch] : known)
    if (name_or_path.find(needle) != std::string::npos) return ArchGuess{arch, "model.name_or_path"};
  return std::nullopt;
}

}  // namespace gclab::config
