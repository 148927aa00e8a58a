#include "gclab/model/lora.h"

#include <set>
#include <stdexcept>

#include "gclab/io/safetensors.h"

namespace gclab::model {

namespace {

// The Linears inside the blocks, with their full path in the model ("transformer_blocks.0.attn.to_q").
std::vector<std::pair<std::string, Linear>> target_linears(DiffusionTransformer& model) {
  std::vector<std::pair<std::string, Linear>> out;
  for (size_t b = 0; b < model.blocks().size(); ++b)
    for (auto& [path, linear] : named_linears(*model.blocks()[b]))
      out.emplace_back(model.block_names()[b] + "." + path, linear);
  return out;
}

}  // namespace

int apply_lora(DiffusionTransformer& model, const LoraOptions& options) {
  for (auto& p : model.parameters()) p.set_requires_grad(false);
  int count = 0;
  for (auto& [path, linear] : target_linears(model)) {
    linear->add_lora(options.rank, options.alpha, options.dropout);
    ++count;
  }
  return count;
}

int64_t set_base_weight_storage(DiffusionTransformer& model, WeightStorage storage) {
  int64_t saved = 0;
  for (auto& [path, linear] : target_linears(model)) {
    const int64_t before = static_cast<int64_t>(linear->weight.nbytes());
    linear->set_weight_storage(storage);
    saved += before - static_cast<int64_t>(linear->weight.nbytes());
  }
  return saved;
}

std::vector<std::pair<std::string, torch::Tensor>> lora_state(DiffusionTransformer& model, torch::ScalarType dtype) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& [path, linear] : target_linears(model)) {
    if (!linear->has_lora()) continue;
    for (const auto& p : linear->named_parameters())
      if (p.key().rfind("lora_", 0) == 0)
        out.emplace_back("transformer." + path + "." + p.key(), p.value().detach().to(dtype));
  }
  return out;
}

void save_lora(DiffusionTransformer& model, const std::filesystem::path& path, torch::ScalarType dtype,
               const LoraOptions& options, std::map<std::string, std::string> metadata) {
  const auto tensors = lora_state(model, dtype);
  if (tensors.empty()) throw std::runtime_error("save_lora: the model has no LoRA adapters");
  metadata["format"] = "pt";
  metadata["ss_network_dim"] = std::to_string(options.rank);
  metadata["ss_network_alpha"] = std::to_string(options.alpha);
  metadata["gclab_preset"] = model.spec().preset;
  io::save_safetensors(path, tensors, metadata);
}

void load_lora(DiffusionTransformer& model, const std::filesystem::path& path) {
  const auto file = io::SafetensorsFile::open(path);
  torch::NoGradGuard no_grad;
  for (auto& [module_path, linear] : target_linears(model)) {
    if (!linear->has_lora()) continue;
    for (auto& p : linear->named_parameters()) {
      if (p.key().rfind("lora_", 0) != 0) continue;
      const std::string name = "transformer." + module_path + "." + p.key();
      if (!file.contains(name)) throw std::runtime_error(path.string() + ": no tensor " + name);
      const torch::Tensor t = file.tensor(name);
      if (t.sizes() != p.value().sizes())
        throw std::runtime_error(path.string() + ": " + name + " has shape " + c10::str(t.sizes()) + ", the model's " +
                                 c10::str(p.value().sizes()) + " (another rank or model?)");
      p.value().copy_(t);
    }
  }
}

std::vector<std::string> load_weights(DiffusionTransformer& model, const std::filesystem::path& path) {
  const auto tensors = io::load_safetensors(path);
  std::set<std::string> used;
  std::vector<std::string> problems;  // every missing or misshapen tensor; the first is named in the error
  auto check = [&](const std::string& name, const torch::Tensor& wanted) -> const torch::Tensor* {
    const auto it = tensors.find(name);
    if (it == tensors.end()) {
      problems.push_back("missing " + name);
      return nullptr;
    }
    if (it->second.sizes() != wanted.sizes()) {
      problems.push_back(name + " has shape " + c10::str(it->second.sizes()) + ", the model needs " +
                         c10::str(wanted.sizes()));
      return nullptr;
    }
    used.insert(name);
    return &it->second;
  };
  torch::NoGradGuard no_grad;
  // Linear weights go through the Linear, which keeps its storage (float8 quantizes what it loads).
  std::set<std::string> linear_weights;
  for (auto& [module_path, linear] : named_linears(model)) {
    const std::string name = module_path + ".weight";
    linear_weights.insert(name);
    if (const torch::Tensor* t = check(name, linear->weight)) linear->set_weight(*t);
  }
  for (auto& p : model.named_parameters()) {
    if (linear_weights.count(p.key()) || p.key().find(".lora_") != std::string::npos) continue;
    if (const torch::Tensor* t = check(p.key(), p.value())) p.value().copy_(*t);
  }
  if (!problems.empty())
    throw std::runtime_error(
        path.string() + ": " + problems.front() +
        (problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) + " more missing or misshapen tensors)"
                             : std::string()));
  std::vector<std::string> unused;
  for (const auto& [name, t] : tensors)
    if (!used.count(name)) unused.push_back(name);
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
