#include "gclab/model/registry.h"

#include <stdexcept>
#include <string>

namespace gclab::model {

// Each family's folder defines one of these (src/model/families/<name>/).
const ModelFamily& flux_family();
const ModelFamily& qwen_image_family();
const ModelFamily& zimage_family();
const ModelFamily& sd3_family();
const ModelFamily& dit_family();
const ModelFamily& wan_family();
const ModelFamily& chroma_family();
const ModelFamily& flux2_family();

namespace {

std::vector<const ModelFamily*>& registered() {
  static std::vector<const ModelFamily*> all = {
      &flux_family(), &qwen_image_family(), &zimage_family(), &sd3_family(),
      &dit_family(),  &wan_family(),        &chroma_family(), &flux2_family(),
  };
  return all;
}

}  // namespace

const std::vector<const ModelFamily*>& families() { return registered(); }

std::string ModelFamily::foreign_layout(const std::string& key) const {
  for (const char* prefix : {"double_blocks.", "model.diffusion_model.", "joint_blocks."})
    if (key.rfind(prefix, 0) == 0)
      return "the original (BFL / Stability / ComfyUI) checkpoint layout. gclab loads diffusers-named weights: a "
             "diffusers model folder, or convert the file once with diffusers' from_single_file and save_pretrained";
  return {};
}

void register_family(const ModelFamily& family) {
  for (const ModelFamily* f : registered())
    if (f->id() == family.id())
      throw std::logic_error("register_family: family '" + family.id().name() + "' is registered already");
  registered().push_back(&family);
}

const ModelFamily& family_of(Family id) {
  for (const ModelFamily* f : families())
    if (f->id() == id) return *f;
  throw std::logic_error("family_of: family '" + id.name() + "' is not registered");
}

}  // namespace gclab::model
