#include "gclab/config/arch.h"

namespace gclab::config {

std::optional<ArchGuess> infer_arch_from_name(const std::string& name_or_path) {
  // Checked in order: the more specific name first (Qwen-Image-Edit-2509 before Qwen-Image-Edit).
  static const std::vector<std::pair<std::string, std::string>> known = {
      {"Qwen-Image-Edit-2509", "qwen_image_edit_plus"},
      {"Qwen-Image-Edit", "qwen_image_edit"},
      {"Qwen-Image", "qwen_image"},
      {"Flex.2", "flex2"},
      {"Flex.1", "flex1"},
      {"FLUX.1", "flux"},
      {"Z-Image", "zimage"},
      {"stable-diffusion-3", "sd3"},
      {"DiT-XL", "dit"},
      {"Lumina-Image", "lumina2"},
      {"OmniGen2", "omnigen2"},
      {"Wan2.1", "wan21"},
      {"Wan2.2", "wan22"},
      {"stable-diffusion-xl", "sdxl"},
  };
  for (const auto& [needle, arch] : known)
    if (name_or_path.find(needle) != std::string::npos) return ArchGuess{arch, "model.name_or_path"};
  return std::nullopt;
}

}  // namespace gclab::config
