#include "gclab/model/family.h"

#include <deque>

#include "gclab/config/arch.h"
#include "gclab/config/user_error.h"
#include "gclab/model/registry.h"

namespace gclab::model {

const std::vector<ArchFacts>& supported_archs() {
  // Listed again when a family registers; the earlier lists stay, so an ArchFacts* handed out stays valid.
  static std::deque<std::vector<ArchFacts>> lists;
  static size_t listed_families = 0;
  if (lists.empty() || listed_families != families().size()) {
    std::vector<ArchFacts> out;
    for (const bool tiny : {false, true})  // every family's own archs, then the tiny ones
      for (const ModelFamily* f : families())
        for (const ArchFacts& a : f->archs())
          if (a.tiny == tiny) out.push_back(a);
    lists.push_back(std::move(out));
    listed_families = families().size();
  }
  return lists.back();
}

const ArchFacts* find_arch(const std::string& name) {
  for (const auto& a : supported_archs())
    if (a.name == name) return &a;
  return nullptr;
}

std::optional<config::ArchGuess> infer_arch_from_name(const std::string& name_or_path) {
  const ArchFacts* best = nullptr;
  size_t longest = 0;
  for (const ArchFacts& a : supported_archs())
    for (const std::string& name : a.names)
      if (name.size() > longest && name_or_path.find(name) != std::string::npos) best = &a, longest = name.size();
  if (best) return config::ArchGuess{best->name, "model.name_or_path"};
  return config::infer_arch_from_name(name_or_path);
}

TransformerLoading transformer_loading(const std::string& arch) {
  const ArchFacts* a = find_arch(arch);
  return a ? a->loading : TransformerLoading::on_device_unless_low_vram;
}

bool low_vram_quantizes_in_host_memory(const std::string& arch) {
  const TransformerLoading l = transformer_loading(arch);
  return l == TransformerLoading::on_device_unless_low_vram ||
         l == TransformerLoading::parked_while_text_encoders_load || l == TransformerLoading::experts_in_turn;
}

bool quantizes_in_host_memory(const config::ModelConfig& model) {
  return transformer_loading(model.arch) == TransformerLoading::per_block ||
         (low_vram_quantizes_in_host_memory(model.arch) && model.low_vram);
}

TextEncoderQuantization text_encoder_quantization(const ModelSpec& spec) {
  return family_of(spec.family).text_encoder_quantization(spec);
}

bool training_bypasses_guidance(const ModelSpec& spec, const config::TrainConfig& train) {
  return !spec.guidance_embed || family_of(spec.family).bypasses_guidance(spec, train);
}

std::string supported_arch_list() {
  std::string out;
  for (const auto& a : supported_archs()) out += (out.empty() ? "" : ", ") + a.name;
  return out;
}

bool low_vram_tiles_previews(const ModelSpec& spec) { return family_of(spec.family).low_vram_tiles_previews(spec); }

std::vector<config::TextEncoderKind> text_encoders(const ModelSpec& spec) {
  const auto pipeline = family_of(spec.family).text_pipeline(spec);
  return pipeline ? pipeline->encoders() : std::vector<config::TextEncoderKind>{};
}

text::PipelineTarget text_target(const ModelSpec& spec) { return family_of(spec.family).text_target(spec); }

std::string text_encoder_folder(size_t slot) {
  return slot == 0 ? "text_encoder" : "text_encoder_" + std::to_string(slot + 1);
}

std::string tokenizer_folder(size_t slot) { return slot == 0 ? "tokenizer" : "tokenizer_" + std::to_string(slot + 1); }

std::optional<size_t> text_encoder_slot(const std::string& name) {
  for (size_t slot = 0; slot < kTextEncoderSlots; ++slot)
    if (name == text_encoder_folder(slot)) return slot;
  return std::nullopt;
}

void check_config(config::ProcessConfig& c, config::Diagnostics& d) {
  auto error = [&](const std::string& path, const std::string& message) {
    d.error(path, c.source.where(path), message);
  };
  if (c.model.arch.empty()) return;  // the config part already said it is missing
  const ArchFacts* arch = find_arch(c.model.arch);
  // A legacy switch names only the family (is_flux: "some FLUX"); AI Toolkit then loads whatever model
  // name_or_path holds — Flex.1 with 8 double blocks, Flex.2 — so the name picks the arch within the family.
  if (arch && c.arch_from_legacy_switch && c.model.name_or_path) {
    const auto guess = infer_arch_from_name(*c.model.name_or_path);
    const ArchFacts* named = guess ? find_arch(guess->arch) : nullptr;
    if (named && named->family == arch->family && named != arch) {
      c.model.arch = named->name;
      arch = named;
    }
  }
  if (!arch) {
    error("model.arch",
          "architecture '" + c.model.arch + "' is not modelled by gclab yet; supported: " + supported_arch_list());
    return;
  }
  if (!c.model.arch_tag.empty() && c.model.arch_tag != arch->variant_keyword)
    d.warning("model.arch", c.source.where("model.arch"),
              "the tag ':" + c.model.arch_tag + "' names no other shape of " + arch->name +
                  " (AI Toolkit drops it too); model.name_or_path and the " + arch->name + " preset decide");
  // model.model_kwargs: Flex.2's model class reads them (flex2.py:75-81); the others ignore them.
  const config::ModelKwargs& k = c.model.model_kwargs;
  const config::ModelKwargs none;
  const bool kwargs_set = k.invert_inpaint_mask_chance != none.invert_inpaint_mask_chance ||
                          k.inpaint_dropout != none.inpaint_dropout || k.control_dropout != none.control_dropout ||
                          k.inpaint_random_chance != none.inpaint_random_chance || k.random_blur_mask ||
                          k.random_dialate_mask || k.do_random_inpainting;
  const ModelSpec preset = spec_by_preset(arch->preset);
  if (const std::string changed = family_of(preset.family).resolve_model_config(c.model); !changed.empty())
    if (c.model.quantize) d.warning("model.qtype", c.source.where("model.qtype"), changed);
  const ModelFamily& family = family_of(preset.family);
  if (!preset.expert_boundaries.empty() && family.trained_experts(preset, k).empty())
    error("model.model_kwargs", "leave none of " + arch->name + "'s " +
                                    std::to_string(preset.expert_boundaries.size()) +
                                    " experts to train: let at least one train");
  if ((!k.train_high_noise || !k.train_low_noise) && preset.expert_boundaries.empty())
    d.warning("model.model_kwargs", c.source.where("model.model_kwargs"),
              "train_high_noise / train_low_noise have no effect for arch " + arch->name +
                  ": they choose between the high- and low-noise experts of a two-expert model");
  if (k.match_target_res && !preset.raw_references)
    d.warning("model.model_kwargs", c.source.where("model.model_kwargs"),
              "match_target_res has no effect for arch " + arch->name +
                  " in gclab: it sizes the raw reference images of the models that take them (FLUX.2)");
  if (kwargs_set && !family_of(preset.family).controls_as_channels(preset))
    d.warning(
        "model.model_kwargs", c.source.where("model.model_kwargs"),
        "has no effect for arch " + arch->name + ": AI Toolkit's Flex.2 model class is the one that reads these keys");
  if (!c.model.name_or_path && !arch->tiny)
    d.warning("model.name_or_path", c.source.where("model.name_or_path"),
              "not set; the " + arch->name + " preset starts from random weights");
  // A dataset's resolution need not be a multiple of the arch's divisibility: AI Toolkit takes it as the
  // buckets' target area (toolkit/buckets.py get_bucket_for_image_size), as gclab's buckets do
  // (data::bucket_for); a square image trains at the largest square bucket within it (train::step_cells).
}

namespace {

config::LoadResult checked(config::LoadResult r) {
  if (r.config) {
    check_config(*r.config, r.diagnostics);
    if (r.diagnostics.has_errors()) r.as_read = std::move(r.config), r.config.reset();
  } else if (r.as_read) {
    check_config(*r.as_read, r.diagnostics);
  } else if (!r.arch_in_text.empty() && !find_arch(r.arch_in_text)) {
    // The YAML did not parse; still tell the user whether fixing it would lead anywhere.
    r.diagnostics.error("model.arch", "",
                        "this config names model.arch '" + r.arch_in_text +
                            "', which gclab does not model yet (supported: " + supported_arch_list() + ")");
  }
  return r;
}

}  // namespace

namespace {

config::LoadOptions with_registry(config::LoadOptions options) {
  if (!options.infer_arch) options.infer_arch = [](const std::string& name) { return infer_arch_from_name(name); };
  return options;
}

}  // namespace

config::LoadResult load_config_file(const std::string& path, const config::LoadOptions& options) {
  return checked(config::load_config_file(path, with_registry(options)));
}

config::LoadResult load_config_text(const std::string& text, const std::string& source_name,
                                    const config::LoadOptions& options) {
  return checked(config::load_config_text(text, source_name, with_registry(options)));
}

}  // namespace gclab::model
