#include "gclab/train/state_file.h"

#include "gclab/config/yaml_json.h"

#include <algorithm>
#include <functional>
#include <map>
#include <regex>

#include <ATen/cuda/CUDAGeneratorImpl.h>

#include <nlohmann/json.hpp>

#include "gclab/io/safetensors.h"
#include "gclab/log/log.h"
#include "gclab/model/diffusers_config.h"
#include "gclab/model/lora.h"

#include <fstream>

namespace gclab::train {

namespace fs = std::filesystem;

namespace {

using Named = std::vector<std::pair<std::string, torch::Tensor>>;
using ByName = std::map<std::string, torch::Tensor>;

at::Generator cuda_generator(const torch::Device& device) {
  return at::cuda::detail::getDefaultCUDAGenerator(device.has_index() ? device.index() : c10::DeviceIndex{-1});
}

// The state file, section by section: each prefix, what is written under it, and how it is read back.
// Together they are what a bitwise resume needs: trained tensors, optimizer state, EMA, and the RNG.
struct StateSection {
  const char* prefix;
  std::function<Named(Session&)> write;
  std::function<void(Session&, const ByName&, const std::string& file)> read;
};

const std::vector<StateSection>& state_sections() {
  static const std::vector<StateSection> sections = {
      {"param.", [](Session& s) { return s.trained(); },
       [](Session& s, const ByName& in, const std::string& file) {
         torch::NoGradGuard no_grad;
         for (const auto& [n, p] : s.trained()) {
           const auto it = in.find(n);
           if (it == in.end() || it->second.sizes() != p.sizes())
             throw UserError(file + " does not match this model (" + n + "); was it written by another config?");
           p.copy_(it->second);
         }
       }},
      {"optimizer.", [](Session& s) { return s.optimizer().state(); },
       [](Session& s, const ByName& in, const std::string&) { s.optimizer().load_state(in); }},
      {"ema.",
       [](Session& s) {
         Named out(s.ema().begin(), s.ema().end());
         return out;
       },
       [](Session& s, const ByName& in, const std::string&) {
         torch::NoGradGuard no_grad;
         for (auto& [n, e] : s.ema())
           if (in.count(n)) e.copy_(in.at(n));
       }},
      // The CPU generator, and on CUDA the device's: noise and timesteps are drawn there.
      {"rng.",
       [](Session& s) {
         Named out{{"cpu", at::detail::getDefaultCPUGenerator().get_state()}};
         if (s.device().is_cuda()) out.emplace_back("cuda", cuda_generator(s.device()).get_state());
         return out;
       },
       [](Session& s, const ByName& in, const std::string&) {
         at::Generator cpu = at::detail::getDefaultCPUGenerator();
         if (in.count("cpu")) cpu.set_state(in.at("cpu").clone());
         if (s.device().is_cuda() && in.count("cuda")) cuda_generator(s.device()).set_state(in.at("cuda").clone());
       }},
  };
  return sections;
}

// The weights file's metadata as AI Toolkit writes it (BaseSDTrainProcess.update_training_metadata,
// BaseSDTrainProcess.py:388-409, then toolkit/metadata.py get_meta_for_safetensors: values that are not text
// as JSON): training_info, ss_base_model_version (the family's get_base_model_version), ss_output_name (the
// job's name), ss_tag_frequency with a trigger word (for AUTOMATIC1111), software — gclab's here, where AI
// Toolkit names itself — and gclab_step, each JSON as Python's json.dumps writes it (the ss_ keys go into
// the sshs hashes); under them the config's `meta` block (the job's meta,
// BaseProcess.py:22, with "[name]" already the job's name as get_meta_for_safetensors makes it, its values
// that are not text as JSON). The sshs_* hashes are added where the LoRA is written (model::add_model_hashes).
std::map<std::string, std::string> weights_metadata(const Session& session, int64_t step) {
  const config::ProcessConfig& config = session.config();
  const std::string trigger = config.trigger_word.value_or("");
  std::map<std::string, std::string> meta = {
      {"gclab_step", std::to_string(step)},
      {"training_info", config::python_json({{"step", step}, {"epoch", session.epoch()}})},
      {"ss_base_model_version", session.plan().family->base_model_version(config.model.arch)},
      {"ss_output_name", config.name},
      {"software", config::python_json({{"name", "gclab"}, {"version", GCLAB_VERSION}})}};
  if (!trigger.empty()) meta["ss_tag_frequency"] = config::python_json({{"1_" + trigger, {{trigger, 1}}}});
  for (const auto& [key, value] : config::meta_entries(config))
    meta.emplace(key, value);  // update_training_metadata's keys win over the block's (add_meta)
  return meta;
}

// Every failure to write ends as a SaveError that says which file, why, and what to do.
template <class F>
void writing(const fs::path& file, F&& write) {
  try {
    write();
  } catch (const std::exception& e) {
    throw SaveError("could not write " + file.string() + ": " + e.what() +
                    ". Free space on that disk (or fix its permissions), or point training_folder elsewhere, then "
                    "continue with --resume; the previous save is intact");
  }
}

}  // namespace

RunSaves::RunSaves(fs::path dir, std::string name, int keep, bool diffusers_folder)
    : dir_(std::move(dir)), name_(std::move(name)), keep_(keep), diffusers_folder_(diffusers_folder) {
  std::error_code ec;
  const std::string suffix = ".state.safetensors";
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string f = entry.path().filename().string();
    if (f.size() > suffix.size() && f.compare(f.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        f.rfind(name_ + "_", 0) == 0)
      step_saves_.emplace_back(weights_path(f.substr(0, f.size() - suffix.size())), entry.path());
  }
  std::sort(step_saves_.begin(), step_saves_.end());
}

fs::path RunSaves::weights_path(const std::string& stem) const {
  return diffusers_folder_ ? dir_ / stem : dir_ / (stem + ".safetensors");
}

fs::path RunSaves::save(Session& session, int64_t step, bool final) {
  auto scope = session.phase(Phase::save);
  const config::ProcessConfig& config = session.config();
  const fs::path weights = weights_path(final ? name_ : name_ + "_" + step_tag(step));
  if (!final) {
    Named state;
    for (const auto& section : state_sections())
      for (auto& [n, t] : section.write(session)) state.emplace_back(section.prefix + n, t);
    state.emplace_back("step", torch::tensor(step));
    const fs::path state_file = dir_ / (name_ + "_" + step_tag(step) + ".state.safetensors");
    writing(state_file, [&] {
      io::save_safetensors(state_file, state, {{"step", std::to_string(step)}, {"preset", session.spec().preset}});
    });
    step_saves_.emplace_back(weights, state_file);
  }
  const auto dtype = save_dtype(config);
  writing(weights, [&] {
    session.with_ema_weights([&] {
      const std::map<std::string, std::string> meta = weights_metadata(session, step);
      if (config.network) {
        model::save_lora(session.model(), weights, dtype, session.lora(), meta);
      } else if (diffusers_folder_) {
        const fs::path transformer = weights / "transformer";
        io::save_sharded_safetensors(transformer, "diffusion_pytorch_model",
                                     model::weights_state(session.model(), dtype));
        std::ofstream(transformer / "config.json") << model::diffusers_config_json(session.spec());
      } else {
        io::save_safetensors(weights, model::weights_state(session.model(), dtype), meta);
      }
    });
  });
  // AI Toolkit removes `files[:-max_step_saves_to_keep]` (BaseSDTrainProcess.py:460-470): 0 removes none.
  while (keep_ > 0 && static_cast<int>(step_saves_.size()) > keep_) {
    std::error_code ec;
    fs::remove_all(step_saves_.front().first, ec);
    fs::remove(step_saves_.front().second, ec);
    step_saves_.erase(step_saves_.begin());
  }
  log::info("saved " + weights.string());
  return weights;
}

std::optional<fs::path> RunSaves::newest_state() const {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return std::nullopt;
  const std::regex pattern(std::regex_replace(name_, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
                           R"(_(\d{9})\.state\.safetensors)");
  std::optional<fs::path> best;
  std::string best_step;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (std::regex_match(file, m, pattern) && m[1].str() > best_step) best_step = m[1].str(), best = entry.path();
  }
  return best;
}

std::optional<int64_t> RunSaves::resume(Session& session) {
  const auto found = newest_state();
  if (!found) return std::nullopt;
  const auto file = io::SafetensorsFile::open(*found);
  const ByName all = file.tensors();
  for (const auto& section : state_sections()) {
    const std::string prefix = section.prefix;
    ByName part;
    for (const auto& [k, v] : all)
      if (k.rfind(prefix, 0) == 0) part[k.substr(prefix.size())] = v;
    section.read(session, part, found->string());
  }
  const int64_t step = all.at("step").item<int64_t>();
  log::info("resumed from " + found->string() + " at step " + std::to_string(step));
  return step;
}

}  // namespace gclab::train
