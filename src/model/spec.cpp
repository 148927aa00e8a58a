#include "gclab/model/spec.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <stdexcept>

#include "gclab/model/family.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "gclab/config/user_error.h"
#include "gclab/io/safetensors.h"

namespace gclab::model {

namespace {

// Z-Image's adaLN input is min(width, 256) wide; the timestep MLP's middle is 1024 at every width
// (diffusers ZImageTransformer2DModel: TimestepEmbedder(min(dim, 256), mid_size=1024)).
int64_t zimage_adaln_dim(int64_t hidden) { return std::min<int64_t>(hidden, 256); }
// The features of one packed latent token (FLUX / Qwen-Image: 2x2 patches of every channel).
int64_t packed_features(const ModelSpec& s) { return s.latent_channels * s.patch * s.patch; }

// Full-size shapes from the reference configs: black-forest-labs/FLUX.1-dev transformer/config.json,
// ostris/Flex.1-alpha, Qwen/Qwen-Image, Tongyi-MAI/Z-Image-Turbo, stabilityai/stable-diffusion-3.5-large,
// facebookresearch/DiT (DiT_XL_2).
ModelSpec flux(const std::string& preset, int double_blocks, bool guidance, int64_t text_tokens) {
  ModelSpec s;
  s.preset = preset;
  s.family = Family::flux;
  s.hidden = 3072, s.heads = 24, s.head_dim = 128, s.mlp_hidden = 12288;
  s.double_blocks = double_blocks, s.single_blocks = 38;
  s.latent_channels = 16, s.out_channels = 16, s.patch = 2;
  s.text_dim = 4096, s.pooled_dim = 768, s.max_text_tokens = text_tokens, s.guidance_embed = guidance;
  s.rope_axes = {16, 56, 56}, s.rope_theta = 10000;
  return s;
}

ModelSpec qwen(const std::string& preset, bool edit) {
  ModelSpec s;
  s.preset = preset;
  s.family = Family::qwen_image;
  s.hidden = 3072, s.heads = 24, s.head_dim = 128, s.mlp_hidden = 12288;
  s.double_blocks = 60;
  s.latent_channels = 16, s.out_channels = 16, s.patch = 2;
  s.text_dim = 3584, s.max_text_tokens = 1024;
  s.rope_axes = {16, 56, 56}, s.rope_theta = 10000;
  s.edit = edit;
  if (edit) s.condition_area = 1024 * 1024, s.condition_text_rows = 1369 + 2;
  return s;
}

// Qwen-Image-Edit-2509 and -2511 (AI Toolkit's qwen_image_edit_plus: the diffusers Plus pipeline's
// CONDITION_IMAGE_SIZE, each control image numbered in the template).
ModelSpec qwen_edit_plus(const std::string& preset) {
  ModelSpec s = qwen(preset, true);
  s.condition_area = 384 * 384, s.edit_plus = true, s.condition_text_rows = 196 + 2 + 5;
  return s;
}

// Qwen/Qwen-Image-Edit-2511: 2509's shape; zero_cond_t (transformer/config.json) modulates the reference
// images' tokens with the embedding of t = 0.
ModelSpec qwen_edit_2511() {
  ModelSpec s = qwen_edit_plus("qwen-image-edit-2511");
  s.zero_cond_t = true;
  return s;
}

// ostris/Flex.2-preview: Flex.1's shape with a 196-feature input (x_embedder), the latent's 64 plus
// an inpainting latent, its mask and a control latent (AI Toolkit's flex2 model; DiffSynth's input_dim 196).
ModelSpec flex2() {
  ModelSpec s = flux("flex2", 8, true, 512);
  s.extra_input_features = 196 - packed_features(s);
  return s;
}

ModelSpec zimage(const std::string& preset) {
  ModelSpec s;
  s.preset = preset;
  s.family = Family::zimage;
  s.hidden = 3840, s.heads = 30, s.head_dim = 128, s.mlp_hidden = 10240;  // int(3840 / 3 * 8)
  s.single_blocks = 30, s.refiner_blocks = 2;
  s.latent_channels = 16, s.out_channels = 16, s.patch = 2;
  s.text_dim = 2560, s.max_text_tokens = 512;
  s.rope_axes = {32, 48, 48}, s.rope_theta = 256;
  s.adaln_dim = zimage_adaln_dim(s.hidden), s.t_embed_mid = 1024;
  return s;
}

ModelSpec sd35_large() {
  ModelSpec s;
  s.preset = "sd35-large";
  s.family = Family::sd3;
  s.hidden = 2432, s.heads = 38, s.head_dim = 64, s.mlp_hidden = 4 * 2432;
  s.double_blocks = 38;
  s.latent_channels = 16, s.out_channels = 16, s.patch = 2;
  s.text_dim = 4096, s.pooled_dim = 2048, s.max_text_tokens = 333;
  s.pos_embed_max = 192, s.sd3_base_size = 64;  // sample_size 128 / patch 2
  return s;
}

ModelSpec dit_xl2() {
  ModelSpec s;
  s.preset = "dit-xl2";
  s.family = Family::dit;
  s.hidden = 1152, s.heads = 16, s.head_dim = 72, s.mlp_hidden = 4 * 1152;
  s.single_blocks = 28;
  s.latent_channels = 4, s.out_channels = 8, s.patch = 2;  // SD VAE latents; learned sigma doubles the output
  s.num_classes = 1000;
  return s;
}

// Tiny presets: the same code at CPU-test size (width 128, 4 heads of 32, a few blocks).
ModelSpec tiny(const ModelSpec& full, const std::string& preset) {
  ModelSpec s = full;
  s.preset = preset;
  s.tiny = true;
  s.hidden = 128, s.heads = 4, s.head_dim = 32, s.mlp_hidden = 512;
  if (s.family == Family::flux) s.double_blocks = 2, s.single_blocks = 2, s.max_text_tokens = 32;
  if (s.family == Family::qwen_image) s.double_blocks = 2, s.max_text_tokens = 64;
  if (s.family == Family::zimage) s.single_blocks = 2, s.refiner_blocks = 1, s.mlp_hidden = 341, s.max_text_tokens = 64;
  if (s.family == Family::sd3) s.double_blocks = 3, s.max_text_tokens = 48, s.pos_embed_max = 64, s.sd3_base_size = 16;
  if (s.family == Family::dit) s.single_blocks = 2, s.num_classes = 10;
  if (s.text_dim) s.text_dim = 64;
  if (s.pooled_dim) s.pooled_dim = 32;
  if (!s.rope_axes.empty()) s.rope_axes = {8, 12, 12};
  if (s.family == Family::zimage) s.adaln_dim = zimage_adaln_dim(s.hidden);
  // A 112²-area control image: 128² -> the processor's 140² -> 25 tokens (+ 2 markers, + 5 numbered); its
  // reference latent from a 512²-area image (1024 tokens, four times a 256² bucket's, as 4096 are to 1024²).
  if (s.edit)
    s.condition_area = 112 * 112, s.condition_text_rows = 25 + 2 + (s.edit_plus ? 5 : 0), s.reference_area = 512 * 512;
  return s;
}

const std::map<std::string, ModelSpec>& presets() {
  static const std::map<std::string, ModelSpec> all = [] {
    std::map<std::string, ModelSpec> m;
    for (ModelSpec s :
         {flux("flux-dev", 19, true, 512), flux("flux-schnell", 19, false, 256), flux("flex1", 8, true, 512), flex2(),
          qwen_edit_2511(), qwen("qwen-image", false), qwen("qwen-image-edit", true),
          qwen_edit_plus("qwen-image-edit-2509"), zimage("zimage"), zimage("zimage-turbo"), sd35_large(), dit_xl2()})
      m[s.preset] = s;
    m["tiny-flux"] = tiny(m["flux-dev"], "tiny-flux");
    m["tiny-qwen-image"] = tiny(m["qwen-image"], "tiny-qwen-image");
    m["tiny-qwen-image-edit"] = tiny(m["qwen-image-edit"], "tiny-qwen-image-edit");
    m["tiny-zimage"] = tiny(m["zimage"], "tiny-zimage");
    m["tiny-sd3"] = tiny(m["sd35-large"], "tiny-sd3");
    m["tiny-dit"] = tiny(m["dit-xl2"], "tiny-dit");
    return m;
  }();
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
  ModelSpec s = it->second;
  s.divisibility = divisibility(s.family);
  return s;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const auto& [name, spec] : presets()) out.push_back(name);
  return out;
}

namespace {

// What a shape read from `source` implies beyond its own numbers, and that it is no preset's any more.
void shaped_by(ModelSpec& s, const std::filesystem::path& source) {
  if (s.family == Family::zimage) s.adaln_dim = zimage_adaln_dim(s.hidden);
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
  static const std::map<std::string, Family> classes = {{"FluxTransformer2DModel", Family::flux},
                                                        {"QwenImageTransformer2DModel", Family::qwen_image},
                                                        {"ZImageTransformer2DModel", Family::zimage},
                                                        {"SD3Transformer2DModel", Family::sd3},
                                                        {"DiTTransformer2DModel", Family::dit}};
  const auto it = classes.find(cls);
  if (it == classes.end() || it->second != s.family)
    throw UserError(local.config.string() + ": _class_name '" + cls + "' is not the " +
                    std::string(config::name_of(s.family)) + " transformer model.arch '" + s.arch + "' names");
  auto get = [&](const char* key, int64_t fallback) {
    return c.contains(key) && c[key].is_number() ? c[key].get<int64_t>() : fallback;
  };
  try {
    switch (s.family) {
      case Family::flux:
      case Family::qwen_image:
      case Family::sd3:
      case Family::dit:
        s.heads = get("num_attention_heads", s.heads);
        s.head_dim = get("attention_head_dim", s.head_dim);
        s.hidden = s.heads * s.head_dim;
        s.mlp_hidden = 4 * s.hidden;
        if (s.family == Family::dit)
          s.single_blocks = static_cast<int>(get("num_layers", s.single_blocks));
        else
          s.double_blocks = static_cast<int>(get("num_layers", s.double_blocks));
        if (s.family == Family::flux) s.single_blocks = static_cast<int>(get("num_single_layers", s.single_blocks));
        if (s.family == Family::qwen_image) s.zero_cond_t = c.value("zero_cond_t", false);
        if (s.family == Family::flux) {
          s.guidance_embed = c.value("guidance_embeds", s.guidance_embed);
          s.extra_input_features = get("in_channels", packed_features(s)) - packed_features(s);
        }
        s.text_dim = get("joint_attention_dim", s.text_dim);
        s.pooled_dim = get("pooled_projection_dim", s.pooled_dim);
        if (c.contains("axes_dims_rope")) s.rope_axes = c["axes_dims_rope"].get<std::vector<int64_t>>();
        if (s.family == Family::sd3) {
          s.pos_embed_max = get("pos_embed_max_size", s.pos_embed_max);
          s.sd3_base_size = get("sample_size", s.sd3_base_size * s.patch) / s.patch;
        }
        if (s.family == Family::dit) {
          s.latent_channels = get("in_channels", s.latent_channels);
          s.out_channels = get("out_channels", s.out_channels);
          s.num_classes = get("num_embeds_ada_norm", s.num_classes);
        }
        break;
      case Family::zimage:
        s.hidden = get("dim", s.hidden);
        s.heads = get("n_heads", s.heads);
        s.head_dim = s.hidden / s.heads;
        s.mlp_hidden = static_cast<int64_t>(static_cast<double>(s.hidden) / 3 * 8);  // int(dim / 3 * 8)
        s.single_blocks = static_cast<int>(get("n_layers", s.single_blocks));
        s.refiner_blocks = static_cast<int>(get("n_refiner_layers", s.refiner_blocks));
        s.text_dim = get("cap_feat_dim", s.text_dim);
        s.rope_theta = c.value("rope_theta", s.rope_theta);
        if (c.contains("axes_dims")) s.rope_axes = c["axes_dims"].get<std::vector<int64_t>>();
        break;
    }
  } catch (const nlohmann::json::exception& e) {
    throw UserError(local.config.string() + ": " + e.what());
  }
  if (s.hidden <= 0 || s.heads <= 0 || s.total_blocks() <= 0)
    throw UserError(local.config.string() + " gives no usable shape (width " + std::to_string(s.hidden) + ", " +
                    std::to_string(s.total_blocks()) + " blocks)");
  shaped_by(s, local.config);
}

// The shape a single diffusers-named weights file gives, from its tensors' shapes (no config.json).
void apply_tensor_shapes(ModelSpec& s, const std::filesystem::path& file) {
  const auto f = io::SafetensorsFile::open(file);
  auto dim = [&](const std::string& name, size_t d) -> int64_t {
    if (!f.contains(name))
      throw UserError(file.string() + " has no tensor " + name + " (a " + std::string(config::name_of(s.family)) +
                      " transformer in diffusers naming has one)");
    const auto& shape = f.entry(name).shape;
    if (d >= shape.size()) throw UserError(file.string() + ": " + name + " has too few dimensions");
    return shape[d];
  };
  auto count = [&](const std::string& prefix) {  // blocks "<prefix>.<N>." present: the largest N + 1
    int n = 0;
    for (const auto& e : f.entries())
      if (e.name.rfind(prefix + ".", 0) == 0) n = std::max(n, std::atoi(e.name.c_str() + prefix.size() + 1) + 1);
    return n;
  };
  for (const auto& e : f.entries())
    if (e.name.rfind("double_blocks.", 0) == 0 || e.name.rfind("model.diffusion_model.", 0) == 0 ||
        e.name.rfind("joint_blocks.", 0) == 0)
      throw UserError(file.string() + " holds " + e.name +
                      ": the original (BFL / Stability / ComfyUI) checkpoint layout. gclab loads diffusers-named "
                      "weights: a diffusers model folder, or convert the file once with diffusers' from_single_file "
                      "and save_pretrained");
  // FLUX and SD3 name their joint blocks and embedders alike (diffusers' MM-DiT).
  auto joint_blocks = [&] {
    s.head_dim = dim("transformer_blocks.0.attn.norm_q.weight", 0);
    s.mlp_hidden = dim("transformer_blocks.0.ff.net.0.proj.weight", 0);
    s.double_blocks = count("transformer_blocks");
    s.text_dim = dim("context_embedder.weight", 1);
    s.pooled_dim = dim("time_text_embed.text_embedder.linear_1.weight", 1);
  };
  switch (s.family) {
    case Family::flux:
      s.hidden = dim("x_embedder.weight", 0);
      s.extra_input_features = dim("x_embedder.weight", 1) - packed_features(s);
      joint_blocks();
      s.single_blocks = count("single_transformer_blocks");
      s.guidance_embed = f.contains("time_text_embed.guidance_embedder.linear_1.weight");
      break;
    case Family::qwen_image:
      s.hidden = dim("img_in.weight", 0);
      s.head_dim = dim("transformer_blocks.0.attn.norm_q.weight", 0);
      s.mlp_hidden = dim("transformer_blocks.0.img_mlp.net.0.proj.weight", 0);
      s.double_blocks = count("transformer_blocks");
      s.text_dim = dim("txt_in.weight", 1);
      break;
    case Family::zimage:
      s.hidden = dim("all_x_embedder.2-1.weight", 0);
      s.head_dim = dim("layers.0.attention.norm_q.weight", 0);
      s.mlp_hidden = dim("layers.0.feed_forward.w1.weight", 0);
      s.single_blocks = count("layers"), s.refiner_blocks = count("noise_refiner");
      s.text_dim = dim("cap_embedder.1.weight", 1);
      break;
    case Family::sd3:
      s.hidden = dim("pos_embed.proj.weight", 0);
      joint_blocks();
      if (f.contains("pos_embed.pos_embed"))
        s.pos_embed_max =
            static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(dim("pos_embed.pos_embed", 1)))));
      break;
    case Family::dit:
      throw UserError(file.string() +
                      ": a single DiT weights file carries no shape gclab reads; use a diffusers "
                      "folder (transformer/config.json beside the weights)");
  }
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

std::optional<LocalModel> local_model(const config::ModelConfig& model) {
  std::error_code ec;
  if (!model.name_or_path) return std::nullopt;
  const std::filesystem::path path = *model.name_or_path;
  if (std::filesystem::is_regular_file(path, ec)) {
    if (path.extension() != ".safetensors")
      throw UserError(
          "model.name_or_path '" + path.string() +
          "' is a file but not a .safetensors one (gclab reads safetensors weights, or a diffusers folder)");
    return LocalModel{{}, path, {}, {}, {}};
  }
  if (!std::filesystem::is_directory(path, ec)) return std::nullopt;
  return local_model_at(path, "model.name_or_path");
}

LocalModel local_model_at(const std::filesystem::path& dir, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  LocalModel m;
  if (fs::is_regular_file(dir / "vae" / "config.json", ec)) m.vae = dir / "vae";
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
  for (const fs::path& d : {dir / "transformer", dir})
    if (fs::is_regular_file(d / "config.json", ec)) {
      m.config = d / "config.json";
      for (const char* w : {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json"})
        if (fs::is_regular_file(d / w, ec)) m.weights = d / w;
      return m;
    }
  throw UserError(what + " '" + dir.string() +
                  "' is a folder but has no transformer/config.json (a diffusers model folder has one)");
}

int64_t image_tokens(const ModelSpec& spec, int64_t height, int64_t width) {
  const int64_t cell = 8 * spec.patch;
  return (height / cell) * (width / cell);
}

int64_t encoder_tokens(const ModelSpec& spec, int64_t prompt_tokens) {
  const int64_t n = std::max<int64_t>(prompt_tokens, 1);
  if (spec.family == Family::flux || spec.family == Family::sd3) return spec.max_text_tokens;
  if (spec.family == Family::qwen_image || spec.family == Family::zimage)
    return std::min(n, spec.max_text_tokens) + (spec.edit ? spec.condition_text_rows : 0);
  return 0;  // dit: a class label, no text sequence
}

int64_t sequence_rows(const ModelSpec& spec, int64_t pipeline_rows) {
  if (spec.family == Family::flux || spec.family == Family::sd3) return spec.max_text_tokens;
  if (spec.family == Family::dit) return 0;
  return std::max<int64_t>(pipeline_rows, 1);
}

int64_t text_tokens(const ModelSpec& spec, int64_t prompt_tokens) {
  const int64_t t = encoder_tokens(spec, prompt_tokens);
  return spec.family == Family::zimage ? (t + 31) / 32 * 32 : t;
}

int64_t reference_tokens(const ModelSpec& spec, int control_images) {
  if (!spec.edit || control_images <= 0) return 0;
  const auto side = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(spec.reference_area))));
  return control_images * image_tokens(spec, side, side);
}

}  // namespace gclab::model
