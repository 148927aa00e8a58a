#include "gclab/train/state_file.h"

#include "gclab/config/yaml_json.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <regex>

#include <ATen/cuda/CUDAGeneratorImpl.h>

#include <nlohmann/json.hpp>

#include "gclab/config/user_error.h"
#include "gclab/io/safetensors.h"
#include "gclab/log/log.h"
#include "gclab/model/diffusers_config.h"
#include "gclab/model/experts.h"
#include "gclab/model/lora.h"
#include "gclab/model/registry.h"
#include "gclab/train/aitk_resume.h"

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
      {"optimizer.", [](Session& s) { return s.optimizer_state(); },
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
      // A model of several experts: the stage its micro-batches draw from, and how many it has had (AI
      // Toolkit starts a resumed run at the first stage again: gclab resumes where the run was).
      {"stage.",
       [](Session& s) {
         Named out;
         if (s.model().expert_count() > 1) {
           const auto [stage, steps] = s.stage();
           out = {{"index", torch::tensor(static_cast<int64_t>(stage))}, {"steps", torch::tensor(steps)}};
         }
         return out;
       },
       [](Session& s, const ByName& in, const std::string&) {
         if (in.count("index") && in.count("steps"))
           s.set_stage(static_cast<size_t>(in.at("index").item<int64_t>()), in.at("steps").item<int64_t>());
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
    // A save a killed run left half-written (io::save_safetensors' temporary name): the folder is this run's
    // alone (RunFolderLock), so nothing writes it now.
    if (f.rfind(name_, 0) == 0 && f.find(".safetensors.tmp-") != std::string::npos) {
      log::info("removing " + entry.path().string() + ", a save an earlier run did not finish");
      fs::remove(entry.path(), ec);
    }
  }
  std::sort(step_saves_.begin(), step_saves_.end());
}

fs::path RunSaves::weights_path(const std::string& stem) const {
  return diffusers_folder_ ? dir_ / stem : dir_ / (stem + ".safetensors");
}

fs::path RunSaves::save(Session& session, int64_t step, bool final) {
  auto scope = session.phase(Phase::save);
  const config::ProcessConfig& config = session.config();
  // Nothing is written (and no good save rotated away) where the weights would not be finite as saved: NaN,
  // inf, or beyond save.dtype's range (a float16 save of weights an exploding update left above 65504).
  // (aminmax: two scalars per tensor, no copy of it; a NaN anywhere makes both NaN.)
  const torch::ScalarType dtype_saved = save_dtype(config);
  const double largest = dtype_saved == torch::kHalf ? 65504.0
                         : dtype_saved == torch::kBFloat16
                             ? static_cast<double>(std::numeric_limits<c10::BFloat16>::max())
                             : static_cast<double>(std::numeric_limits<float>::max());
  // The trained tensors (the state) and, with EMA, the EMA's (the weights file): read where they are.
  std::vector<std::pair<std::string, torch::Tensor>> written = session.trained();
  for (const auto& [name, e] : session.ema()) written.emplace_back(name + " (EMA)", e);
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, p] : written) {
      const auto [lo, hi] = torch::aminmax(p);
      const double low = lo.item<double>(), high = hi.item<double>();
      if (std::isfinite(low) && std::isfinite(high) && -low <= largest && high <= largest) continue;
      const auto newest = newest_state();
      throw NonFiniteStop("the trained weights are not finite in save.dtype " +
                          std::string(c10::toString(save_dtype(config))) + " at step " + std::to_string(step) + " (" +
                          name + "): not saved; the saves made before are intact" +
                          (newest ? " (the newest: " + newest->string() + ")" : "") +
                          ". Lower train.lr, or check the data and the dtype");
    }
  }
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
  std::vector<fs::path> files{weights};  // a model of several experts': a file each (model::save_lora)
  writing(weights, [&] {
    session.with_ema_weights([&] {
      const std::map<std::string, std::string> meta = weights_metadata(session, step);
      if (config.network) {
        files = model::save_lora(session.model(), weights, dtype, session.lora(), meta,
                                 config.network->split_multistage_loras);
      } else if (diffusers_folder_) {
        // A model of several experts: each in its own folder, transformer/, transformer_2/, ...
        // (Wan2214bModel.save_model, wan22_14b_model.py:437-450).
        auto* experts = dynamic_cast<model::ExpertTransformers*>(&session.model());
        for (size_t i = 0; i < session.model().expert_count(); ++i) {
          model::DiffusionTransformer& m = experts ? experts->expert(i) : session.model();
          const fs::path transformer = weights / model::expert_folder(i);
          io::save_sharded_safetensors(transformer, "diffusion_pytorch_model", model::weights_state(m, dtype));
          std::ofstream(transformer / "config.json") << model::diffusers_config_json(m.spec());
        }
      } else {
        io::save_safetensors(weights, model::weights_state(session.model(), dtype), meta);
      }
    });
  });
  // AI Toolkit removes `files[:-max_step_saves_to_keep]` (BaseSDTrainProcess.py:460-470): 0 removes none.
  // Each expert's file goes with its save. AI Toolkit keeps max_step_saves_to_keep x 2 LoRA files where they
  // are split (max_step_saves_to_keep_multiplier, wan22_14b_model.py:220-229; BaseSDTrainProcess.py:460-466
  // counts files): as many saves with both experts' files, twice as many with one expert's.
  const auto suffixes = model::family_of(session.spec().family).expert_lora_suffixes(session.spec());
  if (files.empty()) throw SaveError("the LoRA save wrote no file: no adapter belongs to an expert");
  const bool split = config.network && config.network->split_multistage_loras && !suffixes.empty();
  const int keep = split ? keep_ * 2 / static_cast<int>(files.size()) : keep_;
  while (keep > 0 && static_cast<int>(step_saves_.size()) > keep) {
    std::error_code ec;
    fs::remove_all(step_saves_.front().first, ec);
    for (const auto& suffix : suffixes) fs::remove(model::expert_lora_path(step_saves_.front().first, suffix), ec);
    fs::remove(step_saves_.front().second, ec);
    step_saves_.erase(step_saves_.begin());
  }
  for (const auto& file : files) log::info("saved " + file.string());
  return files.front();
}

std::vector<fs::path> RunSaves::states() const {
  std::error_code ec;
  std::vector<fs::path> out;
  if (!fs::is_directory(dir_, ec)) return out;
  const std::regex pattern(std::regex_replace(name_, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
                           R"(_(\d{9})\.state\.safetensors)");
  for (const auto& entry : fs::directory_iterator(dir_, ec))
    if (std::regex_match(entry.path().filename().string(), pattern)) out.push_back(entry.path());
  std::sort(out.begin(), out.end());  // the step's nine digits: oldest first
  return out;
}

std::optional<fs::path> RunSaves::newest_state() const {
  const auto all = states();
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::optional<int64_t> RunSaves::resume(Session& session) {
  // The newest state whose every tensor reads; a damaged newer one is named and passed over (nothing of it
  // reaches the session: it is read whole before any section is restored).
  const std::vector<fs::path> all_states = states();
  std::optional<fs::path> found;
  ByName all;
  for (auto it = all_states.rbegin(); it != all_states.rend() && !found; ++it) {
    try {
      const auto file = io::SafetensorsFile::open(*it);
      all = file.tensors();
      if (!all.count("step")) throw std::runtime_error("no `step` tensor");
      found = *it;
    } catch (const std::exception& e) {
      log::warn("not resuming from " + it->string() + ": it does not read (" + e.what() +
                "); trying the save before it. Move that file away to silence this");
    }
  }
  if (!found) {
    // No gclab state: the folder may be one AI Toolkit wrote (its newest LoRA save, training_info's step,
    // optimizer.pt), resumed as AI Toolkit resumes it.
    if (const auto step = resume_from_aitk(session, dir_, name_)) return step;
    if (!all_states.empty())
      log::warn("no save in " + dir_.string() + " reads whole: starting at step 0 (the damaged files are kept)");
    return std::nullopt;
  }
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

RunFolderLock::RunFolderLock(const fs::path& dir) {
  fs::create_directories(dir);
  const fs::path file = dir / ".gclab.lock";
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw UserError("cannot open " + file.string() + ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    std::string holder(32, '\0');
    const ssize_t n = ::pread(fd_, holder.data(), holder.size(), 0);
    holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
    ::close(fd_);
    fd_ = -1;
    throw UserError(dir.string() + " is in use by another gclab train" +
                    (holder.empty() ? std::string() : " (pid " + holder + ")") +
                    ": wait for it to end, or give this run another `name` or `training_folder`");
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    // the pid is only for the message a second run prints
  }
}

RunFolderLock::~RunFolderLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

}  // namespace gclab::train
