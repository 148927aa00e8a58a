#include "gclab/train/aitk_resume.h"

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <regex>
#include <stdexcept>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/import_read.h>

#include <nlohmann/json.hpp>

#include "gclab/io/safetensors.h"
#include "gclab/log/log.h"
#include "gclab/model/lora.h"
#include "gclab/model/registry.h"
#include "gclab/train/optimizer.h"
#include "gclab/train/session.h"

namespace gclab::train {

namespace fs = std::filesystem;
using config::OptimizerKind;

namespace {

bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

// A path's "first .<N>." written ".*.", as diffusers_linear_order lists them, and that N (0 without one).
std::pair<std::string, int64_t> block_pattern(const std::string& path) {
  static const std::regex index(R"(\.(\d+)\.)");
  std::smatch m;
  if (!std::regex_search(path, m, index)) return {path, 0};
  return {m.prefix().str() + ".*." + m.suffix().str(), std::stoll(m[1].str())};
}

// One parameter's entry in the pickled state: its keys, bitsandbytes' FSDP wrapper opened
// (bitsandbytes/optim/optimizer.py: state_dict puts state1, qmap1, absmax1, ... under
// "__bnb_optimizer_quant_state__"; older versions keep them at the top).
std::map<std::string, c10::IValue> entry_of(const c10::IValue& v) {
  std::map<std::string, c10::IValue> out;
  if (!v.isGenericDict()) return out;
  for (const auto& e : v.toGenericDict()) {
    if (!e.key().isString()) continue;
    if (e.key().toStringRef() == "__bnb_optimizer_quant_state__" && e.value().isGenericDict()) {
      for (const auto& q : e.value().toGenericDict())
        if (q.key().isString()) out[q.key().toStringRef()] = q.value();
    } else {
      out[e.key().toStringRef()] = e.value();
    }
  }
  return out;
}

torch::Tensor tensor_at(const std::map<std::string, c10::IValue>& entry, const std::string& key,
                        const std::string& param) {
  const auto it = entry.find(key);
  if (it == entry.end() || !it->second.isTensor())
    throw std::runtime_error("no `" + key + "` tensor for " + param + " (the state of another optimizer?)");
  return it->second.toTensor();
}

void expect_shape(const torch::Tensor& t, c10::IntArrayRef sizes, const std::string& what) {
  if (t.sizes() != sizes)
    throw std::runtime_error(what + " has shape " + c10::str(t.sizes()) + ", the trained parameter's " +
                             c10::str(sizes) + " (another rank or model?)");
}

// A bitsandbytes moment (state1 / state2) as gclab's DynamicInt8Moments keeps it: float32 below
// min_8bit_size = 4096 values, otherwise uint8 codes into the dynamic map with a float32 absmax per 256.
void eight_bit_moment(const std::map<std::string, c10::IValue>& entry, int slot, bool is_signed,
                      const std::string& name, const std::string& moment, const torch::Tensor& p,
                      std::map<std::string, torch::Tensor>& out) {
  const std::string n = std::to_string(slot);
  const torch::Tensor state = tensor_at(entry, "state" + n, name);
  const std::string what = name + "'s state" + n;
  expect_shape(state.numel() == p.numel() ? state.reshape(p.sizes()) : state, p.sizes(), what);
  const bool small = p.numel() < 4096;
  if (small) {
    if (state.scalar_type() != torch::kFloat)
      throw std::runtime_error(what + " is " + std::string(c10::toString(state.scalar_type())) +
                               ", bitsandbytes keeps float32 for a parameter under 4096 values");
    out[name + "." + moment] = state.reshape(p.sizes()).clone();
    return;
  }
  if (state.scalar_type() != torch::kByte)
    throw std::runtime_error(what + " is " + std::string(c10::toString(state.scalar_type())) +
                             ", not bitsandbytes' 8-bit codes (min_8bit_size other than 4096?)");
  const torch::Tensor qmap = tensor_at(entry, "qmap" + n, name);
  if (!torch::equal(qmap.to(torch::kFloat), dynamic_quantization_map(is_signed)))
    throw std::runtime_error(name + "'s qmap" + n + " is not bitsandbytes' dynamic map");
  const torch::Tensor absmax = tensor_at(entry, "absmax" + n, name);
  const int64_t blocks = (p.numel() + 255) / 256;
  if (absmax.numel() != blocks)
    throw std::runtime_error(name + "'s absmax" + n + " holds " + std::to_string(absmax.numel()) + " blocks, not " +
                             std::to_string(blocks) + " of 256 (another block size?)");
  out[name + "." + moment + ".codes"] = state.reshape(p.sizes()).clone();
  out[name + "." + moment + ".absmax"] = absmax.reshape({blocks}).to(torch::kFloat).clone();
}

}  // namespace

std::optional<fs::path> newest_aitk_save(const fs::path& dir, const std::string& name) {
  std::error_code ec;
  std::optional<fs::path> newest;
  struct timespec newest_time {};
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string f = entry.path().filename().string();
    if (f.rfind(name, 0) != 0) continue;
    const bool folder = entry.is_directory(ec);
    if (!folder && !ends_with(f, ".safetensors") && !ends_with(f, ".pt")) continue;
    if (ends_with(f, ".state.safetensors") || f.find(".safetensors.tmp-") != std::string::npos) continue;
    bool excluded = false;
    for (const std::string word : {"_LoRA", "_refiner", "_t2i", "_cn"})
      excluded =
          excluded || (name.find(word) == std::string::npos && entry.path().string().find(word) != std::string::npos);
    if (excluded) continue;
    struct stat st {};
    if (::stat(entry.path().c_str(), &st) != 0) continue;
    const auto later = [](const timespec& a, const timespec& b) {
      return a.tv_sec != b.tv_sec ? a.tv_sec > b.tv_sec : a.tv_nsec > b.tv_nsec;
    };
    const bool tie = st.st_ctim.tv_sec == newest_time.tv_sec && st.st_ctim.tv_nsec == newest_time.tv_nsec;
    if (!newest || later(st.st_ctim, newest_time) || (tie && entry.path() > *newest))
      newest = entry.path(), newest_time = st.st_ctim;
  }
  return newest;
}

std::vector<std::pair<std::string, torch::Tensor>> aitk_parameter_order(Session& session) {
  const std::vector<std::string> order = model::family_of(session.spec().family).diffusers_linear_order();
  if (order.empty())
    throw std::runtime_error("gclab does not know diffusers' module order for " + session.spec().preset +
                             "'s family, which gives AI Toolkit's parameter order");
  std::map<std::string, size_t> rank;
  for (size_t i = 0; i < order.size(); ++i) rank.emplace(order[i], i);
  std::map<std::string, torch::Tensor> trained(session.trained().begin(), session.trained().end());
  // The sort key: the block list's first entry (its place among the model's modules), the block's index,
  // the Linear's place in the block.
  std::vector<std::pair<std::tuple<size_t, int64_t, size_t>, std::string>> linears;
  for (auto& [path, linear] : model::named_linears(session.model())) {
    if (!linear->has_lora()) continue;
    const auto [pattern, index] = block_pattern(path);
    const auto it = rank.find(pattern);
    if (it == rank.end()) throw std::runtime_error(path + " is not among diffusers' Linears as gclab lists them");
    const std::string group = pattern.substr(0, pattern.find(".*."));
    size_t first = it->second;
    for (size_t i = 0; i < order.size(); ++i)
      if (order[i].rfind(group + ".*.", 0) == 0 || order[i] == group) {
        first = i;
        break;
      }
    linears.push_back({{first, index, it->second}, path});
  }
  std::sort(linears.begin(), linears.end());
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [key, path] : linears)
    for (const std::string part : {".lora_A.weight", ".lora_B.weight"}) {  // lora_down, then lora_up
      const auto it = trained.find(path + part);
      if (it == trained.end()) throw std::runtime_error(path + part + " is not trained");
      out.emplace_back(it->first, it->second);
    }
  if (out.size() != trained.size())
    throw std::runtime_error("this run trains parameters besides the LoRA adapters' (" +
                             std::to_string(trained.size() - out.size()) + ")");
  return out;
}

std::map<std::string, torch::Tensor> read_aitk_optimizer_state(
    const fs::path& file, OptimizerKind kind, const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  if (kind == OptimizerKind::adafactor || kind == OptimizerKind::prodigy)
    throw std::runtime_error("gclab does not read " + std::string(config::name_of(kind)) +
                             "'s optimizer state from AI Toolkit");
  c10::IValue root;
  try {  // torch.save's zip format; tensors saved on CUDA come to the CPU (torch.load's map_location)
    caffe2::serialize::PyTorchStreamReader reader{file.string()};
    root = torch::jit::readArchiveAndTensors("data", "", "", std::nullopt, std::nullopt, at::Device(at::kCPU), reader);
  } catch (const std::exception& e) {
    throw std::runtime_error("not a torch.save file gclab reads (" + std::string(e.what()).substr(0, 200) + ")");
  }
  if (!root.isGenericDict()) throw std::runtime_error("not an optimizer's state_dict");
  const c10::impl::GenericDict dict = root.toGenericDict();
  if (!dict.contains("state") || !dict.contains("param_groups"))
    throw std::runtime_error("not an optimizer's state_dict (no state / param_groups)");
  // torch.optim.Optimizer.load_state_dict: the groups' "params" in order are the parameters in order.
  std::vector<int64_t> ids;
  for (const c10::IValue& group : dict.at("param_groups").toList())
    for (const c10::IValue& id : group.toGenericDict().at("params").toList()) ids.push_back(id.toInt());
  if (ids.size() != params.size())
    throw std::runtime_error("it holds " + std::to_string(ids.size()) + " parameters, this run trains " +
                             std::to_string(params.size()) + " (another rank, model or network_kwargs?)");
  const c10::impl::GenericDict state = dict.at("state").toGenericDict();
  std::map<std::string, torch::Tensor> out;
  int64_t steps = -1;
  for (size_t i = 0; i < ids.size(); ++i) {
    const c10::IValue key(ids[i]);
    if (!state.contains(key)) continue;  // no update reached it: no state, as in torch.optim
    const auto entry = entry_of(state.at(key));
    const auto& [name, p] = params[i];
    if (const auto it = entry.find("step"); it != entry.end()) {
      const int64_t s = it->second.isTensor()   ? static_cast<int64_t>(it->second.toTensor().item<double>())
                        : it->second.isDouble() ? static_cast<int64_t>(it->second.toDouble())
                                                : it->second.toInt();
      steps = std::max(steps, s);
    }
    switch (kind) {
      case OptimizerKind::adamw:
      case OptimizerKind::adam:
      case OptimizerKind::lion: {
        if (entry.count("state1"))
          throw std::runtime_error("it holds bitsandbytes' 8-bit state; this run's optimizer is " +
                                   std::string(config::name_of(kind)));
        for (const std::string m : {"exp_avg", "exp_avg_sq"}) {
          if (m == "exp_avg_sq" && kind == OptimizerKind::lion) continue;
          const torch::Tensor t = tensor_at(entry, m, name);
          expect_shape(t, p.sizes(), name + "'s " + m);
          out[name + "." + m] = t.to(p.scalar_type()).clone();
        }
        break;
      }
      case OptimizerKind::adamw8bit:
      case OptimizerKind::adam8bit:
      case OptimizerKind::lion8bit:
        if (entry.count("exp_avg"))
          throw std::runtime_error("it holds torch's float moments (exp_avg); this run's optimizer is " +
                                   std::string(config::name_of(kind)));
        eight_bit_moment(entry, 1, true, name, "exp_avg", p, out);
        if (kind != OptimizerKind::lion8bit) eight_bit_moment(entry, 2, false, name, "exp_avg_sq", p, out);
        break;
      case OptimizerKind::sgd:
        for (const auto& [k, v] : entry)
          if (v.isTensor() && k != "step")
            throw std::runtime_error("it holds `" + k + "` for " + name + "; SGD without momentum keeps none");
        break;
      case OptimizerKind::adafactor:
      case OptimizerKind::prodigy:
        break;
    }
  }
  if (steps >= 0) out["step"] = torch::tensor(steps);
  return out;
}

std::optional<int64_t> resume_from_aitk(Session& session, const fs::path& dir, const std::string& name) {
  const auto save = newest_aitk_save(dir, name);
  if (!save) return std::nullopt;
  const std::string file = save->string();
  if (!session.config().network) {
    log::warn("not resuming from " + file +
              ": gclab resumes a full fine-tune only from its own state; starting at "
              "step 0");
    return std::nullopt;
  }
  std::error_code ec;
  if (fs::is_directory(*save, ec) || save->extension() != ".safetensors") {
    log::warn("not resuming from " + file +
              " (AI Toolkit's newest save): not a LoRA .safetensors file gclab reads; "
              "starting at step 0");
    return std::nullopt;
  }
  // The LoRA's values become the trained parameters (all or nothing: a file that does not fit leaves the
  // fresh adapters as they were), and the EMA starts from them.
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> before;
    for (const auto& [n, p] : session.trained()) before.push_back(p.detach().clone());
    try {
      model::load_lora(session.model(), *save);
    } catch (const std::exception& e) {
      for (size_t i = 0; i < before.size(); ++i) session.trained()[i].second.copy_(before[i]);
      log::warn("not resuming from " + file + " (AI Toolkit's newest save): " + e.what() + "; starting at step 0");
      return std::nullopt;
    }
    const std::map<std::string, torch::Tensor> trained(session.trained().begin(), session.trained().end());
    for (auto& [n, e] : session.ema()) e.copy_(trained.at(n));
  }
  // load_training_state_from_metadata (BaseSDTrainProcess.py:867-888): training_info's step; none, step 0.
  int64_t step = 0;
  const auto meta = io::SafetensorsFile::open(*save).metadata();
  if (const auto it = meta.find("training_info"); it != meta.end()) {
    const auto info = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
    if (info.is_object() && info.contains("step") && info["step"].is_number_integer())
      step = info["step"].get<int64_t>();
  }
  // optimizer.pt (BaseSDTrainProcess.py:2188-2215): loaded when it maps, else a fresh state.
  std::string optimizer = "a fresh optimizer state (no optimizer.pt)";
  const fs::path optimizer_file = dir / "optimizer.pt";
  if (fs::exists(optimizer_file, ec)) {
    try {
      for (auto& [path, linear] : model::named_linears(session.model()))
        if (linear->has_lora() && linear->lora_scale() != 1.0)
          throw std::runtime_error("the adapters run at alpha / rank " + std::to_string(linear->lora_scale()) +
                                   ", AI Toolkit's at 1 (network.use_linear_alpha)");
      session.optimizer().load_state(
          read_aitk_optimizer_state(optimizer_file, session.config().train.optimizer, aitk_parameter_order(session)));
      optimizer = "optimizer state from " + optimizer_file.string();
    } catch (const std::exception& e) {
      log::warn("not loading " + optimizer_file.string() + ": " + e.what() + "; a fresh optimizer state");
      optimizer = "a fresh optimizer state";
    }
  }
  log::info("resumed from " + file + " (AI Toolkit's save) at step " + std::to_string(step) + "; " + optimizer);
  return step;
}

}  // namespace gclab::train
