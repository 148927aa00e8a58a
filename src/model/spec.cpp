#include "gclab/model/spec.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <stdexcept>

#include "gclab/data/buckets.h"
#include "gclab/model/experts.h"
#include "gclab/model/family.h"
#include "gclab/model/registry.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "gclab/config/user_error.h"
#include "gclab/io/safetensors.h"

namespace gclab::model {

namespace {

// Every family's presets by name (registry.h).
const std::map<std::string, ModelSpec>& presets() {
  static std::map<std::string, ModelSpec> all;
  static size_t listed_families = 0;
  if (all.empty() || listed_families != families().size()) {  // again when a family registers
    all.clear();
    for (const ModelFamily* f : families())
      for (const ModelSpec& s : f->presets()) all[s.preset] = s;
    listed_families = families().size();
  }
  return all;
}

bool contains(const std::string& text, const std::string& needle) {
  std::string a = text, b = needle;
  std::transform(a.begin(), a.end(), a.begin(), ::tolower);
  std::transform(b.begin(), b.end(), b.begin(), ::tolower);
  return a.find(b) != std::string::npos;
}

}  // namespace

ModelSpec spec_by_preset(const std::string& preset) {
  const auto it = presets().find(preset);
  if (it == presets().end()) throw std::invalid_argument("unknown model preset '" + preset + "'");
  return it->second;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const auto& [name, spec] : presets()) out.push_back(name);
  return out;
}

namespace {

// What a shape read from `source` implies beyond its own numbers, and that it is no preset's any more.
void shaped_by(ModelSpec& s, const std::filesystem::path& source) {
  family_of(s.family).complete_shape(s);
  s.preset = s.preset + " (shape from " + source.string() + ")";
  s.tiny = false;
}

// The shape a diffusers transformer config.json gives, over the arch's preset (diffusers' own key names).
void apply_diffusers_config(ModelSpec& s, const LocalModel& local) {
  nlohmann::json c;
  {
    std::ifstream in(local.config);
    c = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }
  if (c.is_discarded() || !c.is_object()) throw UserError(local.config.string() + " is not a JSON object");
  const std::string cls = c.value("_class_name", "");
  const ModelFamily& family = family_of(s.family);
  if (cls != family.diffusers_class())
    throw UserError(local.config.string() + ": _class_name '" + cls + "' is not the " + s.family.name() +
                    " transformer model.arch '" + s.arch + "' names");
  try {
    family.read_diffusers_config(s, c);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(local.config.string() + ": " + e.what());
  }
  if (s.hidden <= 0 || s.heads <= 0 || s.total_blocks() <= 0)
    throw UserError(local.config.string() + " gives no usable shape (width " + std::to_string(s.hidden) + ", " +
                    std::to_string(s.total_blocks()) + " blocks)");
  shaped_by(s, local.config);
}

// A weights file's tensor shapes for the family's reader (registry.h).
class FileShapes final : public TensorShapes {
 public:
  FileShapes(const io::SafetensorsFile& f, const std::filesystem::path& file, Family family)
      : f_(f), file_(file), family_(family) {}
  bool contains(const std::string& name) const override { return f_.contains(name); }
  int64_t dim(const std::string& name, size_t d) const override {
    if (!f_.contains(name))
      throw UserError(file_.string() + " has no tensor " + name + " (a " + std::string(family_.name()) +
                      " transformer in diffusers naming has one)");
    const auto& shape = f_.entry(name).shape;
    if (d >= shape.size()) throw UserError(file_.string() + ": " + name + " has too few dimensions");
    return shape[d];
  }
  int count(const std::string& prefix) const override {
    int n = 0;
    for (const auto& e : f_.entries())
      if (e.name.rfind(prefix + ".", 0) == 0) n = std::max(n, std::atoi(e.name.c_str() + prefix.size() + 1) + 1);
    return n;
  }
  std::string file() const override { return file_.string(); }

 private:
  const io::SafetensorsFile& f_;
  std::filesystem::path file_;
  Family family_;
};

// The shape a single diffusers-named weights file gives, from its tensors' shapes (no config.json).
void apply_tensor_shapes(ModelSpec& s, const std::filesystem::path& file) {
  const auto f = io::SafetensorsFile::open(file);
  for (const auto& e : f.entries())
    if (const std::string what = family_of(s.family).foreign_layout(e.name); !what.empty())
      throw UserError(file.string() + " holds " + e.name + ": " + what);
  family_of(s.family).read_tensor_shapes(s, FileShapes(f, file, s.family));
  if (s.hidden <= 0 || s.head_dim <= 0 || s.hidden % s.head_dim != 0 || s.total_blocks() <= 0)
    throw UserError(file.string() + " gives no usable shape (width " + std::to_string(s.hidden) + ", head width " +
                    std::to_string(s.head_dim) + ", " + std::to_string(s.total_blocks()) + " blocks)");
  s.heads = s.hidden / s.head_dim;
  int64_t rope = 0;
  for (int64_t a : s.rope_axes) rope += a;
  if (!s.rope_axes.empty() && rope != s.head_dim)
    throw UserError(file.string() + ": heads " + std::to_string(s.head_dim) +
                    " wide, but the rotary axes a weights file cannot say are the preset's (" + std::to_string(rope) +
                    " wide); put it in a diffusers folder with the transformer's config.json");
  shaped_by(s, file);
}

}  // namespace

ModelSpec spec_for(const config::ProcessConfig& config) {
  ModelSpec s = spec_for(config.model);
  if (s.raw_references) {
    bool any = false;
    for (const auto& d : config.datasets) any = any || !d.control_path.empty();
    if (config.sample)
      for (const auto& p : config.sample->samples) any = any || !p.control_images().empty();
    s.reference_tokens = any;
  }
  return s;
}

ModelSpec spec_for(const config::ModelConfig& model) {
  const ArchFacts* arch = find_arch(model.arch);
  if (!arch)
    throw std::invalid_argument("model.arch '" + model.arch +
                                "' is not modelled by gclab (supported: " + supported_arch_list() + ")");
  const bool variant =
      !arch->variant_keyword.empty() &&
      (model.arch_tag == arch->variant_keyword || contains(model.name_or_path.value_or(""), arch->variant_keyword));
  ModelSpec s = spec_by_preset(variant ? arch->variant_preset : arch->preset);
  s.arch = arch->name;
  if (const auto local = local_model(model)) {
    if (local->config.empty())
      apply_tensor_shapes(s, local->weights);
    else
      apply_diffusers_config(s, *local);
  }
  return s;
}

namespace {

// What a model folder holds beside its transformer: vae/, image_encoder/, image_processor/, the text encoders'
// and tokenizers' folders.
void companion_folders(const std::filesystem::path& dir, LocalModel& m) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(dir / "vae" / "config.json", ec)) m.vae = dir / "vae";
  if (fs::is_regular_file(dir / "image_encoder" / "config.json", ec)) m.image_encoder = dir / "image_encoder";
  if (fs::is_directory(dir / "image_processor", ec)) m.image_processor = dir / "image_processor";
  for (size_t i = 0; i < kTextEncoderSlots; ++i)
    if (fs::is_regular_file(dir / text_encoder_folder(i) / "config.json", ec)) {
      m.text_encoders.resize(i + 1);
      m.text_encoders[i] = dir / text_encoder_folder(i);
    }
  for (size_t i = 0; i < kTextEncoderSlots; ++i)
    if (fs::is_directory(dir / tokenizer_folder(i), ec)) {
      m.tokenizers.resize(i + 1);
      m.tokenizers[i] = dir / tokenizer_folder(i);
    }
}

}  // namespace

std::optional<LocalModel> local_model(const config::ModelConfig& model) {
  std::error_code ec;
  if (!model.name_or_path) return std::nullopt;
  const std::filesystem::path path = *model.name_or_path;
  if (std::filesystem::is_regular_file(path, ec)) {
    if (path.extension() != ".safetensors")
      throw UserError(
          "model.name_or_path '" + path.string() +
          "' is a file but not a .safetensors one (gclab reads safetensors weights, or a diffusers folder)");
    LocalModel single;
    single.weights = path;
    return single;
  }
  if (!std::filesystem::is_directory(path, ec)) return std::nullopt;
  // A BFL-layout folder as AI Toolkit's class reads it: the arch's transformer file there wins (a Hub snapshot
  // holds a diffusers transformer/ beside it); a folder with neither it nor a config.json is refused.
  const ArchFacts* arch = find_arch(model.arch);
  if (arch && !arch->transformer_file.empty()) {
    if (std::filesystem::is_regular_file(path / arch->transformer_file, ec)) {
      LocalModel bfl;
      companion_folders(path, bfl);  // a Hub snapshot's text_encoder/, tokenizer/, vae/
      bfl.weights = path / arch->transformer_file;
      if (!arch->autoencoder_file.empty() && std::filesystem::is_regular_file(path / arch->autoencoder_file, ec))
        bfl.vae = path / arch->autoencoder_file, bfl.vae_over_vae_path = true;
      return bfl;
    }
    if (!std::filesystem::exists(path / "config.json", ec) &&
        !std::filesystem::exists(path / "transformer" / "config.json", ec))
      throw UserError("model.name_or_path '" + path.string() + "' is a folder without " + arch->transformer_file +
                      " (the file AI Toolkit's " + arch->name + " class reads there) or a diffusers config.json");
  }
  LocalModel m = local_model_at(path, "model.name_or_path");
  if (arch && !arch->autoencoder_file.empty() && std::filesystem::is_regular_file(path / arch->autoencoder_file, ec))
    m.vae = path / arch->autoencoder_file, m.vae_over_vae_path = true;  // the class takes it wherever it is
  return m;
}

LocalModel local_model_at(const std::filesystem::path& dir, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  LocalModel m;
  companion_folders(dir, m);
  for (const fs::path& d : {dir / "transformer", dir})
    if (fs::is_regular_file(d / "config.json", ec)) {
      m.config = d / "config.json";
      for (const char* w : {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json"})
        if (fs::is_regular_file(d / w, ec)) m.weights = d / w;
      // A pipeline of several experts: transformer_2/, ... beside transformer/ (expert_folder).
      for (size_t i = 1; d != dir && fs::is_directory(dir / expert_folder(i), ec); ++i) {
        m.expert_weights.emplace_back();
        for (const char* w : {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json"})
          if (fs::is_regular_file(dir / expert_folder(i) / w, ec)) m.expert_weights.back() = dir / expert_folder(i) / w;
      }
      return m;
    }
  throw UserError(what + " '" + dir.string() +
                  "' is a folder but has no transformer/config.json (a diffusers model folder has one)");
}

std::vector<int64_t> latent_shape(const ModelSpec& spec, const SampleShape& x) {
  const int64_t s = spec.latent_spatial;
  if (!takes_frames(spec)) {
    if (x.frames != 1)
      throw std::invalid_argument(spec.preset + " is an image model: a sample has one frame, not " +
                                  std::to_string(x.frames));
    return {x.batch, spec.latent_channels, x.height / s, x.width / s};
  }
  return {x.batch, spec.latent_channels, latent_frames(spec, x.frames), x.height / s, x.width / s};
}

int64_t image_tokens(const ModelSpec& spec, const SampleShape& x) {
  const int64_t cell = spec.latent_spatial * spec.patch;
  return (latent_frames(spec, x.frames) / spec.patch_frames) * (x.height / cell) * (x.width / cell);
}

int64_t encoder_tokens(const ModelSpec& spec, int64_t prompt_tokens) {
  return family_of(spec.family).encoder_tokens(spec, std::max<int64_t>(prompt_tokens, 1));
}

int64_t sequence_rows(const ModelSpec& spec, int64_t pipeline_rows) {
  return family_of(spec.family).sequence_rows(spec, pipeline_rows);
}

int64_t text_tokens(const ModelSpec& spec, int64_t prompt_tokens) {
  return family_of(spec.family).text_tokens(spec, encoder_tokens(spec, prompt_tokens));
}

std::pair<int64_t, int64_t> preview_reference_size(const ModelSpec& spec, int64_t image_width, int64_t image_height,
                                                   int64_t width, int64_t height) {
  if (spec.reference_area == 0) return {width, height};
  if (spec.raw_references) {  // the pipeline's encode_image_refs at its default limit, reference_area (1024²)
    const data::BucketResolution r =
        data::raw_reference_size({static_cast<int>(image_width), static_cast<int>(image_height)}, spec.reference_area)
            .cropped;
    return {r.width, r.height};
  }
  const bool preview_aspect = trains_references_at_image_size(spec);
  const data::BucketResolution r = data::reference_size({static_cast<int>(preview_aspect ? width : image_width),
                                                         static_cast<int>(preview_aspect ? height : image_height)},
                                                        spec.divisibility, spec.reference_area);
  return {r.width, r.height};
}

int64_t preview_reference_tokens(const ModelSpec& spec, int control_images, int64_t height, int64_t width) {
  if (!spec.reference_tokens || control_images <= 0) return 0;
  // A square control image; a raw one (FLUX.2's) of the preview's size.
  const auto [w, h] = spec.raw_references ? preview_reference_size(spec, width, height, width, height)
                                          : preview_reference_size(spec, 1, 1, width, height);
  return control_images * image_tokens(spec, {1, 1, h, w});
}

std::pair<int64_t, int64_t> training_reference_size(const ModelSpec& spec, int64_t width, int64_t height,
                                                    bool at_image_size) {
  if (at_image_size || trains_references_at_image_size(spec)) return {width, height};
  if (spec.raw_references) {  // a control image of the training image's size, as the estimate assumes it
    const data::BucketResolution r =
        data::raw_reference_size({static_cast<int>(width), static_cast<int>(height)}, spec.reference_area).cropped;
    return {r.width, r.height};
  }
  const data::BucketResolution r =
      data::reference_size({static_cast<int>(width), static_cast<int>(height)}, spec.divisibility, spec.reference_area);
  return {r.width, r.height};
}

StepTokens step_tokens(const ModelSpec& spec, const SampleShape& shape, int64_t text) {
  return {image_tokens(spec, shape) + reference_tokens(spec, spec.reference_tokens ? 1 : 0, shape.height, shape.width),
          text > 0 ? text : text_tokens(spec, kNominalCaptionTokens)};
}

int64_t reference_tokens(const ModelSpec& spec, int control_images, int64_t height, int64_t width) {
  if (spec.reference_tokens && control_images > 0 && trains_references_at_image_size(spec))
    return control_images * image_tokens(spec, {1, 1, height, width});
  if (spec.reference_tokens && control_images > 0 && spec.raw_references) {
    const auto [w, h] = training_reference_size(spec, width, height);
    return control_images * image_tokens(spec, {1, 1, h, w});
  }
  return preview_reference_tokens(spec, control_images, height, width);
}

}  // namespace gclab::model
