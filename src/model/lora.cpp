#include "gclab/model/lora.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>

#include <regex>
#include <set>
#include <stdexcept>

#include "gclab/io/safetensors.h"
#include "gclab/io/sha256.h"
#include "gclab/model/experts.h"
#include "gclab/model/registry.h"

namespace gclab::model {

namespace {

// The Linears AI Toolkit puts adapters on (LoRASpecialNetwork.create_modules, toolkit/lora_special.py:
// 484-573), by their full path in the model ("transformer_blocks.0.attn.to_q"): with transformer_only (its
// default) those of the blocks the model class names (registry.h lora_block_names; every block when it
// names none), else every Linear; none whose name — "transformer.<path>", PEFT's prefix — contains an
// ignore_if_contains word; with only_if_contains only those whose name (or that name with '.' as "$$",
// lora_name) contains one of its words.
std::vector<std::pair<std::string, Linear>> target_linears(DiffusionTransformer& model, const LoraOptions& o) {
  const std::vector<std::string> names = family_of(model.spec().family).lora_block_names();
  auto contains_any = [](const std::string& text, const std::vector<std::string>& words) {
    return std::any_of(words.begin(), words.end(),
                       [&](const std::string& w) { return text.find(w) != std::string::npos; });
  };
  std::vector<std::pair<std::string, Linear>> candidates;
  if (o.transformer_only) {
    for (size_t b = 0; b < model.blocks().size(); ++b) {
      const std::string& block = model.block_names()[b];
      if (!names.empty() && !contains_any(block, names)) continue;
      for (auto& [path, linear] : named_linears(*model.blocks()[b]))
        candidates.emplace_back(block + "." + path, linear);
    }
  } else {
    candidates = named_linears(model);
  }
  std::vector<std::pair<std::string, Linear>> out;
  for (auto& [path, linear] : candidates) {
    if (!o.within.empty() &&
        std::none_of(o.within.begin(), o.within.end(), [&](const std::string& w) { return path.rfind(w, 0) == 0; }))
      continue;
    // One expert trained: its paths as the expert's own (network_path).
    const std::string clean =
        "transformer." +
        (o.within.size() == 1 && path.rfind(o.within[0], 0) == 0 ? path.substr(o.within[0].size()) : path);
    if (contains_any(clean, o.ignore_if_contains)) continue;
    if (!o.only_if_contains.empty() && !contains_any(clean, o.only_if_contains) &&
        !contains_any(std::regex_replace(clean, std::regex("\\."), "$$$$"), o.only_if_contains))
      continue;
    out.emplace_back(path, linear);
  }
  return out;
}

// The Linears that have an adapter, by their full path.
std::vector<std::pair<std::string, Linear>> adapted_linears(DiffusionTransformer& model) {
  std::vector<std::pair<std::string, Linear>> out;
  for (auto& [path, linear] : named_linears(model))
    if (linear->has_lora()) out.emplace_back(path, linear);
  return out;
}

// A model of several experts of which one has adapters: that expert's prefix ("transformer_2."), under which
// AI Toolkit names the adapters of the one WanTransformer3DModel it then trains (get_model_to_train,
// wan22_14b_model.py:594-609); empty otherwise. network_path: a module path under it as that expert's own.
std::string single_expert_prefix(DiffusionTransformer& model) {
  if (model.expert_count() < 2) return {};
  std::set<std::string> experts;
  for (auto& [p, linear] : adapted_linears(model)) experts.insert(p.substr(0, p.find('.') + 1));
  return experts.size() == 1 ? *experts.begin() : std::string();
}
std::string network_path(const std::string& prefix, const std::string& path) {
  return !prefix.empty() && path.rfind(prefix, 0) == 0 ? path.substr(prefix.size()) : path;
}

// The scale lora_state folds into lora_B: the adapter's own alpha / rank.
double fold_scale(const Linear& linear) { return linear->lora_scale(); }

}  // namespace

void add_model_hashes(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> ss;
  for (const auto& [key, value] : metadata)
    if (key.rfind("ss_", 0) == 0) ss[key] = value;
  const std::string bytes = io::serialize_safetensors(tensors, ss);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  metadata["sshs_model_hash"] = io::sha256_hex(std::string_view(bytes).substr(8 + header));
  const std::string_view legacy = bytes.size() > 0x100000 ? std::string_view(bytes).substr(0x100000, 0x10000) : "";
  metadata["sshs_legacy_hash"] = io::sha256_hex(legacy).substr(0, 8);
}

LoraOptions lora_options(const config::NetworkConfig& network) {
  LoraOptions o;
  o.rank = network.linear.value_or(16);
  // AI Toolkit: PEFT format for FLUX, SD3 and the transformer models, "no alpha for peft": alpha = rank
  // (toolkit/lora_special.py, LoRASpecialNetwork.__init__). linear_alpha only with gclab's key.
  o.alpha = network.use_linear_alpha ? network.linear_alpha.value_or(network.alpha) : static_cast<double>(o.rank);
  o.dropout = network.dropout.value_or(0.0);
  o.transformer_only = network.transformer_only;
  o.only_if_contains = network.network_kwargs.only_if_contains;
  o.ignore_if_contains = network.network_kwargs.ignore_if_contains;
  return o;
}

int apply_lora(DiffusionTransformer& model, const LoraOptions& options) {
  for (auto& p : model.parameters()) p.set_requires_grad(false);
  int count = 0;
  for (auto& [path, linear] : target_linears(model, options)) {
    linear->add_lora(options.rank, options.alpha, options.dropout);
    ++count;
  }
  return count;
}

void set_lora_multiplier(DiffusionTransformer& model, double multiplier) {
  for (auto& [path, linear] : adapted_linears(model))
    if (linear->has_lora()) linear->set_lora_multiplier(multiplier);
}

int64_t set_base_weight_storage(DiffusionTransformer& model, WeightStorage storage) {
  int64_t saved = 0;
  for (auto& [path, linear] : named_linears(model)) {
    const int64_t before = static_cast<int64_t>(linear->weight.nbytes());
    linear->set_weight_storage(storage);
    saved += before - static_cast<int64_t>(linear->weight.nbytes());
  }
  return saved;
}

std::vector<std::pair<std::string, torch::Tensor>> lora_state(DiffusionTransformer& model, torch::ScalarType dtype) {
  const ModelFamily& family = family_of(model.spec().family);
  const std::string prefix = single_expert_prefix(model);
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& [path, linear] : adapted_linears(model)) {
    if (!linear->has_lora()) continue;
    for (const auto& p : linear->named_parameters()) {
      if (p.key().rfind("lora_", 0) != 0) continue;
      torch::Tensor t = p.value().detach();
      if (p.key().rfind("lora_B", 0) == 0) t = t * fold_scale(linear);
      out.emplace_back(family.lora_file_key(network_path(prefix, path)) + "." + p.key(), t.to(dtype));
    }
  }
  return out;
}

std::vector<std::filesystem::path> save_lora(DiffusionTransformer& model, const std::filesystem::path& path,
                                             torch::ScalarType dtype, const LoraOptions& options,
                                             std::map<std::string, std::string> metadata, bool split_experts) {
  const auto tensors = lora_state(model, dtype);
  if (tensors.empty()) throw std::runtime_error("save_lora: the model has no LoRA adapters");
  std::vector<std::string> targets;
  const std::string prefix = single_expert_prefix(model);
  for (auto& [module_path, linear] : adapted_linears(model))
    if (linear->has_lora()) targets.push_back(network_path(prefix, module_path));
  const nlohmann::json peft = {{"transformer.r", options.rank},
                               {"transformer.lora_alpha", options.rank},  // alpha / rank is folded into lora_B
                               {"transformer.target_modules", targets}};
  metadata["format"] = "pt";
  metadata["lora_adapter_metadata"] = peft.dump();
  metadata["ss_network_dim"] = std::to_string(options.rank);
  metadata["ss_network_alpha"] = std::to_string(options.rank);
  metadata["gclab_linear_alpha"] = std::to_string(options.alpha);
  metadata["gclab_preset"] = model.spec().preset;
  add_model_hashes(tensors, metadata);  // of every adapter, split or not (network_mixins.py:652-658)
  const std::vector<std::string> suffixes = family_of(model.spec().family).expert_lora_suffixes(model.spec());
  if (!split_experts || suffixes.size() != model.expert_count() || model.expert_count() < 2) {
    io::save_safetensors(path, tensors, metadata);
    return {path};
  }
  // Wan2214bModel.save_lora (wan22_14b_model.py:452-493): each expert's adapters, ".transformer_<i>." cut
  // from their keys, in <name><suffix>.safetensors; an expert without adapters writes no file. One expert
  // trained: every key is its own already (network_path), all in its file.
  std::set<size_t> adapted;
  for (auto& [p, linear] : adapted_linears(model))
    for (size_t e = 0; e < suffixes.size(); ++e)
      if (p.rfind(expert_name(e) + ".", 0) == 0) adapted.insert(e);
  std::vector<std::filesystem::path> written;
  for (size_t e = 0; e < suffixes.size(); ++e) {
    const std::string infix = "." + expert_name(e) + ".";
    std::vector<std::pair<std::string, torch::Tensor>> part;
    for (const auto& [key, t] : tensors)
      if (adapted.size() == 1 && adapted.count(e))
        part.emplace_back(key, t);
      else if (const size_t at = key.find(infix); at != std::string::npos)
        part.emplace_back(key.substr(0, at) + "." + key.substr(at + infix.size()), t);
    if (part.empty()) continue;
    written.push_back(expert_lora_path(path, suffixes[e]));
    io::save_safetensors(written.back(), part, metadata);
  }
  return written;
}

std::filesystem::path expert_lora_path(const std::filesystem::path& path, const std::string& suffix) {
  std::filesystem::path out = path;
  out.replace_filename(path.stem().string() + suffix + path.extension().string());
  return out;
}

namespace {

// A model of several experts and one of its experts' LoRA files (<name><suffix>.safetensors): each expert's
// file beside it, the expert's index with it; empty for any other model or file.
std::vector<std::pair<size_t, std::filesystem::path>> expert_files(DiffusionTransformer& model,
                                                                   const std::filesystem::path& path) {
  const auto suffixes = family_of(model.spec().family).expert_lora_suffixes(model.spec());
  if (model.expert_count() < 2 || suffixes.size() != model.expert_count()) return {};
  const std::string stem = path.stem().string();
  for (const auto& suffix : suffixes) {
    if (stem.size() <= suffix.size() || stem.compare(stem.size() - suffix.size(), std::string::npos, suffix) != 0)
      continue;
    std::filesystem::path base = path;
    base.replace_filename(stem.substr(0, stem.size() - suffix.size()) + path.extension().string());
    std::vector<std::pair<size_t, std::filesystem::path>> out;
    for (size_t e = 0; e < suffixes.size(); ++e) out.emplace_back(e, expert_lora_path(base, suffixes[e]));
    return out;
  }
  return {};
}

}  // namespace

void load_lora(DiffusionTransformer& model, const std::filesystem::path& path) {
  // One file per expert (Wan2214bModel.load_lora, wan22_14b_model.py:495-545): each expert that has
  // adapters from its own file.
  if (const auto files = expert_files(model, path); !files.empty()) {
    auto& experts = dynamic_cast<ExpertTransformers&>(model);
    for (const auto& [e, file] : files) {
      bool adapted = false;
      for (auto& [module, linear] : named_linears(experts.expert(e))) adapted = adapted || linear->has_lora();
      if (adapted) load_lora(experts.expert(e), file);
    }
    return;
  }
  const auto file = io::SafetensorsFile::open(path);
  const ModelFamily& family = family_of(model.spec().family);
  const std::string prefix = single_expert_prefix(model);
  torch::NoGradGuard no_grad;
  for (auto& [module_path, linear] : adapted_linears(model)) {
    if (!linear->has_lora()) continue;
    for (auto& p : linear->named_parameters()) {
      if (p.key().rfind("lora_", 0) != 0) continue;
      // The family's key, or PEFT's (a file gclab wrote before it followed AI Toolkit's renaming).
      std::string name = family.lora_file_key(network_path(prefix, module_path)) + "." + p.key();
      if (!file.contains(name) && file.contains("transformer." + module_path + "." + p.key()))
        name = "transformer." + module_path + "." + p.key();
      if (!file.contains(name)) throw std::runtime_error(path.string() + ": no tensor " + name);
      const torch::Tensor t = file.tensor(name);
      if (t.sizes() != p.value().sizes())
        throw std::runtime_error(path.string() + ": " + name + " has shape " + c10::str(t.sizes()) + ", the model's " +
                                 c10::str(p.value().sizes()) + " (another rank or model?)");
      p.value().copy_(p.key().rfind("lora_B", 0) == 0 ? t / fold_scale(linear) : t);
    }
  }
}

namespace {

// PEFT's global alpha and rank from diffusers' `lora_adapter_metadata` (keys with or without the
// "transformer." prefix): the scale alpha / r every module of the file gets.
std::optional<double> peft_scale(const std::map<std::string, std::string>& metadata) {
  const auto it = metadata.find("lora_adapter_metadata");
  if (it == metadata.end()) return std::nullopt;
  const auto j = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  for (const std::string prefix : {"transformer.", ""}) {
    const auto r = j.find(prefix + "r"), a = j.find(prefix + "lora_alpha");
    if (r != j.end() && a != j.end() && r->is_number() && a->is_number() && r->get<double>() > 0)
      return a->get<double>() / r->get<double>();
  }
  return std::nullopt;
}

}  // namespace

LoraFile read_lora_file(DiffusionTransformer& model, const std::filesystem::path& path) {
  // A model of several experts and one of its experts' files (<name>_high_noise.safetensors): every expert's
  // file beside it, each read against its expert (Wan2214bModel.load_lora, wan22_14b_model.py:495-545).
  if (const auto files = expert_files(model, path); !files.empty()) {
    auto& experts = dynamic_cast<ExpertTransformers&>(model);
    LoraFile out;
    for (const auto& [e, file] : files) {
      if (!std::filesystem::exists(file)) continue;  // an expert that did not train
      LoraFile part = read_lora_file(experts.expert(e), file);
      for (auto& [module, m] : part.modules) {
        // Each file's own alpha / r on its modules (one file_scale does not hold two files').
        if (!m.alpha && part.file_scale) m.alpha = *part.file_scale * static_cast<double>(m.down.size(0));
        out.modules[expert_name(e) + "." + module] = std::move(m);
      }
    }
    if (out.modules.empty()) throw std::runtime_error(path.string() + ": none of the experts' files exists");
    return out;
  }
  const auto file = io::SafetensorsFile::open(path);
  // Every Linear by its diffusers path, and by that path with '.' as '_' (kohya names).
  std::map<std::string, Linear> by_path;
  std::map<std::string, std::string> by_kohya, by_file_key;  // and by the key the family's files give it
  const ModelFamily& family = family_of(model.spec().family);
  for (auto& [module_path, linear] : named_linears(model)) {
    by_path.emplace(module_path, linear);
    by_kohya[std::regex_replace(module_path, std::regex("\\."), "_")] = module_path;
    by_file_key[family.lora_file_key(module_path)] = module_path;
  }
  static const std::regex keyed(R"(^(.+)\.(lora_A|lora_B|alpha)(?:\.default)?(?:\.weight)?$)");
  static const std::regex peft(
      R"(^(?:transformer\.|diffusion_model\.|base_model\.model\.)?(.+)\.(lora_A|lora_B)(?:\.default)?\.weight$)");
  static const std::regex peft_alpha(R"(^(?:transformer\.|diffusion_model\.)?(.+)\.alpha$)");
  static const std::regex kohya(R"(^lora_(?:transformer|unet)_(.+)\.(lora_down|lora_up|alpha)(?:\.weight)?$)");
  LoraFile out;
  std::vector<std::string> unplaced;
  for (const auto& entry : file.entries()) {
    const std::string& name = entry.name;
    std::smatch m;
    if (std::regex_match(name, m, kohya)) {
      const auto it = by_kohya.find(m[1].str());
      if (it == by_kohya.end()) {
        unplaced.push_back(name);
        continue;
      }
      LoraFileModule& a = out.modules[it->second];
      if (m[2] == "alpha")
        a.alpha = file.tensor(name).item<double>();
      else
        (m[2] == "lora_down" ? a.down : a.up) = file.tensor(name);
    } else if (std::regex_match(name, m, keyed) && by_file_key.count(m[1].str())) {
      LoraFileModule& a = out.modules[by_file_key.at(m[1].str())];
      if (m[2] == "alpha")
        a.alpha = file.tensor(name).item<double>();
      else
        (m[2] == "lora_A" ? a.down : a.up) = file.tensor(name);
    } else if (std::regex_match(name, m, peft) && by_path.count(m[1].str())) {
      (m[2] == "lora_A" ? out.modules[m[1].str()].down : out.modules[m[1].str()].up) = file.tensor(name);
    } else if (std::regex_match(name, m, peft_alpha) && by_path.count(m[1].str())) {
      out.modules[m[1].str()].alpha = file.tensor(name).item<double>();
    } else {
      unplaced.push_back(name);
    }
  }
  if (!unplaced.empty())
    throw std::runtime_error(
        path.string() + ": " + std::to_string(unplaced.size()) + " tensor(s) name no Linear of this " +
        model.spec().preset + " model, e.g. " + unplaced.front() +
        " (gclab reads LoRAs named by diffusers' module paths — PEFT/diffusers or kohya naming — or as AI Toolkit "
        "saves this family's (its lora_A / lora_B keys); a LoRA "
        "for another model, or for the original BFL checkpoint layout, does not apply)");
  for (const auto& [module_path, a] : out.modules) {
    if (!a.down.defined() || !a.up.defined())
      throw std::runtime_error(path.string() + ": " + module_path + " has only one of its two LoRA matrices");
    const auto shape = by_path.at(module_path)->weight_shape();
    const int64_t rank = a.down.size(0);
    if (a.down.dim() != 2 || a.up.dim() != 2 || a.up.size(1) != rank || a.up.size(0) != shape[0] ||
        a.down.size(1) != shape[1])
      throw std::runtime_error(path.string() + ": " + module_path + "'s LoRA is " + c10::str(a.up.sizes()) + " x " +
                               c10::str(a.down.sizes()) + ", the Linear is " + c10::str(shape));
  }
  if (out.modules.empty()) throw std::runtime_error(path.string() + ": holds no LoRA matrices");
  out.file_scale = peft_scale(file.metadata());
  return out;
}

namespace {

// A file module's scale: its alpha / rank, else the file's PEFT alpha / r, else 1.
double module_scale(const LoraFile& file, const LoraFileModule& a) {
  return a.alpha ? *a.alpha / static_cast<double>(a.down.size(0)) : file.file_scale.value_or(1.0);
}

// Adds each module's update, times `scale`, into its Linear's weight; calls `also` with it after.
int merge_into_base(DiffusionTransformer& model, const LoraFile& file, double scale,
                    const std::function<void(Linear&, const LoraFileModule&, double)>& also = {}) {
  std::map<std::string, Linear> by_path;
  for (auto& [module_path, linear] : named_linears(model)) by_path.emplace(module_path, linear);
  torch::NoGradGuard no_grad;
  for (const auto& [module_path, a] : file.modules) {
    Linear& linear = by_path.at(module_path);
    const double s = module_scale(file, a);
    if (!linear->weight.is_meta()) {
      const torch::Tensor w = linear->effective_weight(torch::kFloat);
      linear->set_weight(w + scale * s * torch::mm(a.up.to(torch::kFloat), a.down.to(torch::kFloat)));
    }
    if (also) also(linear, a, s);
  }
  return static_cast<int>(file.modules.size());
}

}  // namespace

int merge_lora_file(DiffusionTransformer& model, const std::filesystem::path& path, double scale) {
  return merge_into_base(model, read_lora_file(model, path), scale);
}

int attach_assistant_adapter(DiffusionTransformer& model, const std::filesystem::path& path, torch::ScalarType dtype) {
  return merge_into_base(model, read_lora_file(model, path), 1.0,
                         [&](Linear& linear, const LoraFileModule& a, double s) {
                           const auto o = linear->weight.options().dtype(dtype);
                           linear->add_assistant_adapter(a.down.to(o), a.up.to(o), s);
                         });
}

void set_assistant_adapters(DiffusionTransformer& model, double multiplier,
                            const std::function<torch::Tensor(const torch::Tensor&)>& place) {
  for (auto& [path, linear] : named_linears(model))
    if (linear->has_assistant_adapter()) {
      linear->place_assistant_adapter(place);
      linear->set_assistant_multiplier(multiplier);
    }
}

std::vector<std::string> load_weights(DiffusionTransformer& model, const std::filesystem::path& path) {
  io::TensorMatcher file(io::load_safetensors(path), path.string());
  torch::NoGradGuard no_grad;
  // Linear weights go through the Linear, which keeps its storage (float8 quantizes what it loads).
  std::set<std::string> linear_weights;
  for (auto& [module_path, linear] : named_linears(model)) {
    const std::string name = module_path + ".weight";
    linear_weights.insert(name);
    if (const torch::Tensor* t = file.take(name, linear->weight_shape())) linear->set_weight(*t);
  }
  for (auto& p : model.named_parameters()) {
    if (linear_weights.count(p.key()) || p.key().find(".lora_") != std::string::npos) continue;
    if (const torch::Tensor* t = file.take(p.key(), p.value().sizes())) p.value().copy_(*t);
  }
  return file.finish();
}

std::vector<std::string> load_weights(DiffusionTransformer& model, const std::filesystem::path& path,
                                      const std::vector<std::filesystem::path>& expert_weights) {
  auto* experts = dynamic_cast<ExpertTransformers*>(&model);
  if (!experts || expert_weights.empty()) return load_weights(model, path);
  std::vector<std::string> unused;
  for (size_t i = 0; i < experts->expert_count(); ++i) {
    const std::filesystem::path& file = i == 0 ? path : i - 1 < expert_weights.size() ? expert_weights[i - 1] : "";
    if (file.empty())
      throw std::runtime_error("no weights for " + expert_name(i) + " (a " + expert_folder(i) +
                               "/ folder beside transformer/): the model has " +
                               std::to_string(experts->expert_count()) + " experts");
    for (auto& name : load_weights(experts->expert(i), file)) unused.push_back(expert_name(i) + "." + name);
  }
  return unused;
}

std::vector<std::pair<std::string, torch::Tensor>> weights_state(DiffusionTransformer& model, torch::ScalarType dtype) {
  std::map<std::string, torch::Tensor> dequantized;
  for (auto& [path, linear] : named_linears(model)) dequantized[path + ".weight"] = linear->effective_weight(dtype);
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : model.named_parameters()) {
    if (p.key().find("lora_") != std::string::npos) continue;
    const auto it = dequantized.find(p.key());
    out.emplace_back(p.key(), it != dequantized.end() ? it->second.detach() : p.value().detach().to(dtype));
  }
  return out;
}

}  // namespace gclab::model
