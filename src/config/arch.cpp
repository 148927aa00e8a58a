#include "gclab/config/arch.h"

namespace gclab::config {

const std::vector<ArchInfo>& supported_archs() {
  // Divisibility as AI Toolkit sets it per model (DESIGN.md section 4): FLUX.1 / Flex / Qwen-Image / SD3
  // pack 2x2 latent patches of an 8x VAE and round to 32; Z-Image and DiT to 16.
  static const std::vector<ArchInfo> archs = {
      {"flux", "flux", 32, false},
      {"flex1", "flux", 32, false},
      {"flex2", "flux", 32, false},
      {"qwen_image", "qwen_image", 32, false},
      {"qwen_image_edit", "qwen_image", 32, false},
      {"qwen_image_edit_plus", "qwen_image", 32, false},
      {"zimage", "zimage", 16, false},
      {"sd3", "sd3", 32, false},
      {"dit", "dit", 16, false},
      {"tiny-flux", "flux", 32, true},
      {"tiny-qwen-image", "qwen_image", 32, true},
      {"tiny-qwen-image-edit", "qwen_image", 32, true},
      {"tiny-zimage", "zimage", 16, true},
      {"tiny-sd3", "sd3", 32, true},
      {"tiny-dit", "dit", 16, true},
  };
  return archs;
}

std::optional<ArchInfo> find_arch(const std::string& name) {
  for (const auto& a : supported_archs())
    if (a.name == name) return a;
  return std::nullopt;
}

std::string supported_arch_list() {
  std::string out;
  for (const auto& a : supported_archs()) {
    if (!out.empty()) out += ", ";
    out += a.name;
  }
  return out;
}

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
