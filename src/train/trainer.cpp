#include "gclab/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "gclab/config/arch.h"
#include "gclab/config/byte_size.h"
#include "gclab/config/loader.h"
#include "gclab/data/image.h"
#include "gclab/data/text_encoder.h"
#include "gclab/io/safetensors.h"
#include "gclab/log/log.h"
#include "gclab/memory/tracker.h"
#include "gclab/model/lora.h"
#include "gclab/sample/sampler.h"
#include "gclab/train/checkpointing.h"
#include "gclab/train/flow.h"
#include "gclab/train/loader.h"
#include "gclab/train/model_setup.h"
#include "gclab/train/oom_report.h"
#include "gclab/train/optimizer.h"

namespace gclab::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string step_tag(int64_t step) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%09lld", static_cast<long long>(step));
  return buf;
}

std::string duration_text(double s) {
  const int64_t t = static_cast<int64_t>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600), static_cast<long long>(t / 60 % 60));
  else std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  return buf;
}

torch::ScalarType save_dtype(const std::string& name) {
  if (name == "float16" || name == "fp16") return torch::kHalf;
  if (name == "bfloat16" || name == "bf16") return torch::kBFloat16;
  if (name == "float32" || name == "fp32") return torch::kFloat;
  throw std::invalid_argument("save.dtype '" + name + "' is not supported (float16, bf16, float32)");
}

// DiT is class-conditional: a caption picks a class by hash; an empty caption is the null class.
int64_t class_label_for(const std::string& caption, int64_t num_classes) {
  if (caption.empty()) return num_classes;
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : caption) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h % static_cast<uint64_t>(num_classes));
}

// Text embeddings for captions, through the encoder or the cache of precomputed ones.
class Conditioner {
 public:
  Conditioner(const model::ModelSpec& spec, torch::Device device, bool cache)
      : spec_(spec), device_(device), cache_(cache) {
    if (spec.text_dim) encoder_ = std::make_unique<data::TextEncoder>(data::TextEncoderOptions{spec.text_dim, spec.pooled_dim});
  }

  model::ModelInputs inputs_for(const std::vector<std::string>& captions) {
    model::ModelInputs in;
    const int64_t b = static_cast<int64_t>(captions.size());
    if (spec_.text_dim) {
      std::vector<torch::Tensor> text, pooled;
      const int64_t length = length_for(captions);
      for (const auto& c : captions) {
        const auto& e = embedding(c, length);
        text.push_back(e.text);
        if (e.pooled.defined()) pooled.push_back(e.pooled);
      }
      in.text = torch::cat(text).to(device_);
      if (!pooled.empty()) in.pooled = torch::cat(pooled).to(device_);
    }
    if (spec_.guidance_embed) in.guidance = torch::ones({b}, torch::TensorOptions().device(device_));  // as AI Toolkit trains FLUX-dev
    if (spec_.num_classes) {
      std::vector<int64_t> labels;
      for (const auto& c : captions) labels.push_back(class_label_for(c, spec_.num_classes));
      in.class_labels = torch::tensor(labels).to(device_);
    }
    return in;
  }
  // With unload_text_encoder: everything needed was precomputed; the encoder's memory is returned.
  void unload() { encoder_.reset(); }
  int64_t encoder_bytes() const { return encoder_ ? encoder_->parameter_bytes() : 0; }
  bool loaded() const { return encoder_ != nullptr; }

 private:
  int64_t length_for(const std::vector<std::string>& captions) const {
    int64_t longest = 1;
    if (encoder_)
      for (const auto& c : captions) longest = std::max<int64_t>(longest, static_cast<int64_t>(encoder_->tokenize(c).size()));
    return model::text_tokens(spec_, longest);
  }
  const data::TextEmbedding& embedding(const std::string& caption, int64_t length) {
    const std::string key = std::to_string(length) + "|" + caption;
    auto it = cached_.find(key);
    if (it != cached_.end()) return it->second;
    if (!encoder_)
      throw std::invalid_argument("unload_text_encoder: the caption '" + caption +
                                  "' was not precomputed (use cache_text_embeddings without shuffle_tokens)");
    data::TextEmbedding e = encoder_->encode({caption}, length);
    if (!cache_) {
      scratch_ = std::move(e);
      return scratch_;
    }
    return cached_.emplace(key, std::move(e)).first->second;
  }

  model::ModelSpec spec_;
  torch::Device device_;
  bool cache_;
  std::unique_ptr<data::TextEncoder> encoder_;
  std::map<std::string, data::TextEmbedding> cached_;
  data::TextEmbedding scratch_;
};

struct TrainState {
  std::vector<std::pair<std::string, torch::Tensor>> trainable;  // name, parameter
  std::map<std::string, torch::Tensor> ema;
};

}  // namespace

torch::Device resolve_device(const std::string& name) {
  if (name == "auto") return torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  torch::Device device(torch::kCPU);
  try {
    device = torch::Device(name);
  } catch (const c10::Error&) {
    throw std::invalid_argument("device '" + name + "' is not a device name (auto, cpu, cuda, cuda:0, ...)");
  }
  if (device.is_cuda() && !torch::cuda::is_available())
    throw std::invalid_argument("device '" + name + "' asks for CUDA, which this machine does not have; use device: cpu "
                                "(or auto), or --set device=cpu");
  if (device.is_cuda() && device.has_index() && device.index() >= static_cast<int>(torch::cuda::device_count()))
    throw std::invalid_argument("device '" + name + "': this machine has " + std::to_string(torch::cuda::device_count()) +
                                " CUDA device(s)");
  return device;
}

std::optional<fs::path> newest_state(const fs::path& dir, const std::string& name) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  const std::regex pattern(std::regex_replace(name, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
                           R"(_(\d{9})\.state\.safetensors)");
  std::optional<fs::path> best;
  std::string best_step;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (std::regex_match(file, m, pattern) && m[1].str() > best_step) best_step = m[1].str(), best = entry.path();
  }
  return best;
}

TrainSummary train(const config::ProcessConfig& config, const TrainOptions& options) {
  const auto t_start = Clock::now();
  const config::TrainConfig& tc = config.train;
  TrainSummary summary;

  // ---- settings ---------------------------------------------------------------------------------
  const model::ModelSpec spec = model::spec_for(config.model);
  const auto arch = config::find_arch(config.model.arch);
  const int divisibility = arch ? arch->divisibility : 16;
  if (tc.gradient_accumulation > 1 && tc.gradient_accumulation_steps > 1)
    throw std::invalid_argument("train.gradient_accumulation and train.gradient_accumulation_steps are mutually "
                                "exclusive (as in AI Toolkit); set one");
  const int accumulation = std::max({1, tc.gradient_accumulation, tc.gradient_accumulation_steps});
  const bool bf16 = tc.dtype == "bf16" || tc.dtype == "bfloat16";
  if (!bf16 && tc.dtype != "fp32" && tc.dtype != "float32")
    throw std::invalid_argument("train.dtype '" + tc.dtype + "' is not supported (bf16 = bf16 autocast, fp32)");
  const torch::Device device = resolve_device(config.device);
  const uint64_t seed = static_cast<uint64_t>(config.training_seed.value_or(42));
  if (device.is_cpu()) model::check_fits_in_host_memory(spec, "gclab train");
  const ckpt::CheckpointPolicy policy = ckpt::CheckpointPolicy::parse(tc.checkpoint_policy);
  const torch::ScalarType weights_dtype = save_dtype(config.save.dtype);
  sample_timesteps(tc.timestep_type, 1, torch::kCPU);  // rejects an unknown type now (the seed is set below)

  summary.output_dir = fs::path(config.training_folder) / config.name;
  fs::create_directories(summary.output_dir / "samples");
  std::ofstream(summary.output_dir / "config.resolved.yaml") << config::to_yaml(config);
  log::add_file((summary.output_dir / "log.txt").string());
  struct LogFileScope {
    ~LogFileScope() { log::remove_files(); }
  } log_file_scope;

  // ---- memory: exact accounting on the CPU, the allocator's statistics on CUDA; the emulated cap -------
  std::optional<memory::CpuMemoryTracker> cpu_tracker;
  if (device.is_cpu() && !memory::CpuMemoryTracker::installed()) cpu_tracker.emplace(config.vram_cap.bytes);
  memory::MemoryMeter meter(device);
  if (!device.is_cpu() && config.vram_cap.bytes > 0) meter.set_cap(config.vram_cap.bytes);
  memory::PhaseMeter phases(meter);
  std::string current_phase = "setup";
  auto phase = [&](const char* name) {
    current_phase = name;
    return phases.phase(name);
  };

  // ---- data ---------------------------------------------------------------------------------------
  std::vector<data::ImageItem> items;
  std::vector<config::DatasetConfig> datasets = config.datasets;
  if (datasets.empty()) throw data::DataError("no datasets: add a `datasets` entry with a folder_path");
  int skipped = 0;
  for (size_t d = 0; d < datasets.size(); ++d) {
    auto scan = data::scan_dataset(datasets[d], static_cast<int>(d));
    for (const auto& w : scan.warnings) log::warn(w);
    skipped += scan.skipped_images + scan.skipped_captions;
    log::info("datasets[" + std::to_string(d) + "]: " + std::to_string(scan.items.size()) + " images from " +
              *datasets[d].folder_path);
    items.insert(items.end(), scan.items.begin(), scan.items.end());
    if (tc.cache_text_embeddings && datasets[d].shuffle_tokens) {
      log::warn("datasets[" + std::to_string(d) + "]: shuffle_tokens is ignored with cache_text_embeddings (as in AI Toolkit)");
      datasets[d].shuffle_tokens = false;
    }
  }
  if (skipped > 0) log::warn(std::to_string(skipped) + " file(s) skipped in all (see the warnings above)");
  const data::LatentCodec codec(spec.latent_channels);
  Conditioner conditioner(spec, device, tc.cache_text_embeddings);

  // ---- model: built, LoRA / quantized as configured; checkpointing applied from outside ------------------
  torch::manual_seed(seed);
  TrainingModel built = build_training_model(config, spec, device);
  auto model = built.model;
  const model::LoraOptions lora = built.lora;
  const int lora_modules = built.lora_modules;
  ModelCheckpointing checkpointing(*model);
  ckpt::CheckpointPolicy applied = policy;
  if (policy.kind == ckpt::CheckpointPolicy::Kind::Budget) {
    // Probe the largest square resolution at the largest batch: the worst case the run will meet.
    int largest = 0, batch_max = tc.batch_size;
    for (const auto& d : datasets) {
      for (int r : d.resolution) largest = std::max(largest, r);
      batch_max = std::max(batch_max, d.batch_size.value_or(tc.batch_size));
    }
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    const torch::Tensor rng_before = generator.get_state();  // the probe's random inputs leave no trace
    const auto probe = checkpointing.resolve_budget(
        model->example_inputs(batch_max, largest, largest, 0, torch::TensorOptions().device(device)), policy.budget_bytes,
        meter);
    generator.set_state(rng_before);
    applied = probe.policy;
    int64_t kept = 0;
    for (auto b : probe.kept_bytes) kept += b;
    log::info("checkpoint policy " + policy.to_string() + ": a probe step at " + std::to_string(largest) + "², batch " +
              std::to_string(batch_max) + " measured " + config::format_bytes(kept) + " of block activations; applying " +
              applied.to_string());
  }
  checkpointing.apply(applied);

  TrainState state;
  for (const auto& p : model->named_parameters())
    if (p.value().requires_grad()) state.trainable.emplace_back(p.key(), p.value());
  int64_t trainable = 0;
  for (const auto& [n, p] : state.trainable) trainable += p.numel();
  log::info(spec.preset + ": " + std::to_string(model::parameter_count(*model)) + " parameters, " +
            std::to_string(trainable) + " trained" +
            (lora_modules ? " (LoRA rank " + std::to_string(lora.rank) + " on " + std::to_string(lora_modules) + " modules)" : "") +
            "; checkpoint policy " + applied.to_string() + "; " + device.str() + (bf16 ? ", bf16 autocast" : ", fp32"));

  AdamWOptions adam;
  adam.weight_decay = tc.optimizer_params.weight_decay;
  adam.beta1 = tc.optimizer_params.betas.size() > 0 ? tc.optimizer_params.betas[0] : 0.9;
  adam.beta2 = tc.optimizer_params.betas.size() > 1 ? tc.optimizer_params.betas[1] : 0.999;
  adam.eps = tc.optimizer_params.eps;
  auto optimizer = make_optimizer(tc.optimizer, state.trainable, adam);
  scheduled_lr(tc.lr_scheduler, tc.lr, 0, tc.steps);  // rejects an unknown scheduler before any work
  if (tc.ema_config.use_ema)
    for (const auto& [n, p] : state.trainable) state.ema[n] = p.detach().clone();

  // ---- resume ------------------------------------------------------------------------------------
  int64_t start_step = 0;
  if (options.resume) {
    const auto found = newest_state(summary.output_dir, config.name);
    if (!found) {
      log::warn("--resume: no checkpoint in " + summary.output_dir.string() + "; starting at step 0");
    } else {
      const auto file = io::SafetensorsFile::open(*found);
      std::map<std::string, torch::Tensor> s = file.tensors();
      torch::NoGradGuard no_grad;
      for (auto& [n, p] : state.trainable) {
        const auto it = s.find("param." + n);
        if (it == s.end() || it->second.sizes() != p.sizes())
          throw std::invalid_argument(found->string() + " does not match this model (" + n +
                                      "); was it written by another config?");
        p.copy_(it->second);
      }
      std::map<std::string, torch::Tensor> opt;
      for (const auto& [k, v] : s)
        if (k.rfind("optimizer.", 0) == 0 || k.find(".exp_avg") != std::string::npos) opt[k] = v;
      optimizer->load_state(opt);
      for (auto& [n, e] : state.ema)
        if (s.count("ema." + n)) e.copy_(s.at("ema." + n));
      start_step = s.at("step").item<int64_t>();
      torch::Tensor rng = s.at("rng.cpu").clone();
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      gen.set_state(rng);
      log::info("resumed from " + found->string() + " at step " + std::to_string(start_step));
    }
  }
  summary.start_step = start_step;
  summary.end_step = start_step;

  // ---- previews ----------------------------------------------------------------------------------
  std::vector<config::SampleItem> prompts;
  if (config.sample && !tc.disable_sampling) prompts = config.sample->samples;
  auto run_samples = [&](int64_t step) {
    if (prompts.empty()) return;
    auto scope = phase("sample");
    const auto& sc = *config.sample;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto& item = prompts[i];
      const int width = item.width.value_or(sc.width), height = item.height.value_or(sc.height);
      sample::SampleOptions so;
      so.latent_height = height / divisibility * divisibility / 8;
      so.latent_width = width / divisibility * divisibility / 8;
      so.steps = item.sample_steps.value_or(sc.sample_steps);
      so.guidance_scale = item.guidance_scale.value_or(sc.guidance_scale);
      so.seed = item.seed.value_or(sc.seed + (sc.walk_seed ? static_cast<int64_t>(i) : 0));
      so.autocast_bf16 = bf16;
      const auto cond = conditioner.inputs_for({item.prompt});
      const auto uncond = conditioner.inputs_for({item.neg.value_or(sc.neg)});
      const torch::Tensor z = sample::euler_sample(*model, cond, uncond, so);
      const torch::Tensor image = data::to_rgb_uint8(codec.decode(z.cpu())[0]);
      const fs::path file = summary.output_dir / "samples" / (config.name + "_" + step_tag(step) + "_" + std::to_string(i) + ".png");
      data::write_png(file, image);
      summary.samples.push_back(file);
    }
    log::info("step " + std::to_string(step) + ": " + std::to_string(prompts.size()) + " sample(s) written to " +
              (summary.output_dir / "samples").string());
  };
  if (tc.cache_text_embeddings) {  // precompute what the run will ask for, then (optionally) unload
    for (const auto& item : items) {
      std::mt19937_64 unused(0);
      auto ds = datasets[static_cast<size_t>(item.dataset)];
      ds.caption_dropout_rate = 0;
      conditioner.inputs_for({data::process_caption(item.caption, ds, config.trigger_word, unused)});
    }
    conditioner.inputs_for({""});
    for (const auto& p : prompts) {
      conditioner.inputs_for({p.prompt});
      conditioner.inputs_for({p.neg.value_or(config.sample->neg)});
    }
    if (tc.unload_text_encoder) conditioner.unload();
  } else if (tc.unload_text_encoder) {
    log::warn("train.unload_text_encoder needs cache_text_embeddings; the text encoder stays loaded");
  }

  // ---- saving ------------------------------------------------------------------------------------
  std::vector<std::pair<fs::path, fs::path>> step_saves;  // (weights, state), oldest first
  for (const auto& entry : fs::directory_iterator(summary.output_dir)) {
    const std::string f = entry.path().filename().string();
    const std::string suffix = ".state.safetensors";
    if (f.size() > suffix.size() && f.compare(f.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        f.rfind(config.name + "_", 0) == 0) {
      const std::string stem = f.substr(0, f.size() - suffix.size());
      step_saves.emplace_back(summary.output_dir / (stem + ".safetensors"), entry.path());
    }
  }
  std::sort(step_saves.begin(), step_saves.end());
  auto with_ema = [&](const std::function<void()>& fn) {
    if (state.ema.empty()) return fn();
    std::map<std::string, torch::Tensor> live;
    torch::NoGradGuard no_grad;
    for (auto& [n, p] : state.trainable) live[n] = p.detach().clone(), p.copy_(state.ema.at(n));
    fn();
    for (auto& [n, p] : state.trainable) p.copy_(live.at(n));
  };
  auto save = [&](int64_t step, bool final) {
    auto scope = phase("save");
    const std::string stem = final ? config.name : config.name + "_" + step_tag(step);
    const fs::path weights = summary.output_dir / (stem + ".safetensors");
    // The state: trained tensors in fp32, optimizer, EMA, step and RNG — what a bitwise resume needs.
    std::vector<std::pair<std::string, torch::Tensor>> s;
    for (const auto& [n, p] : state.trainable) s.emplace_back("param." + n, p);
    for (auto& kv : optimizer->state()) s.push_back(kv);
    for (const auto& [n, e] : state.ema) s.emplace_back("ema." + n, e);
    s.emplace_back("step", torch::tensor(step));
    s.emplace_back("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
    const fs::path state_file = summary.output_dir / (config.name + "_" + step_tag(step) + ".state.safetensors");
    io::save_safetensors(state_file, s, {{"step", std::to_string(step)}, {"preset", spec.preset}});
    with_ema([&] {
      if (config.network)
        model::save_lora(*model, weights, weights_dtype, lora, {{"gclab_step", std::to_string(step)}});
      else
        io::save_safetensors(weights, model::weights_state(*model, weights_dtype), {{"gclab_step", std::to_string(step)}});
    });
    summary.saves.push_back(weights);
    if (!final) {
      step_saves.emplace_back(weights, state_file);
      while (static_cast<int>(step_saves.size()) > std::max(1, config.save.max_step_saves_to_keep)) {
        std::error_code ec;
        fs::remove(step_saves.front().first, ec);
        fs::remove(step_saves.front().second, ec);
        step_saves.erase(step_saves.begin());
      }
    }
    log::info("saved " + weights.string());
  };

  // ---- the loop ----------------------------------------------------------------------------------
  LoaderOptions lo;
  lo.batch_size = tc.batch_size;
  lo.divisibility = divisibility;
  lo.seed = seed;
  lo.trigger_word = config.trigger_word;
  BatchLoader loader(items, datasets, codec, lo, start_step * accumulation);
  std::ofstream metrics(summary.output_dir / "metrics.jsonl", std::ios::app);
  StepOptions so;
  so.timestep_type = tc.timestep_type;
  so.loss_scale = 1.0 / accumulation;
  so.autocast_bf16 = bf16;
  const bool sampling = !prompts.empty();
  const int sample_every = config.sample ? std::max(1, config.sample->sample_every) : 0;
  if (sampling && start_step == 0 && !tc.skip_first_sample) run_samples(0);
  const int64_t report_every = options.progress_in_place ? 1 : std::max<int64_t>(1, tc.steps / 20);
  const auto loop_start = Clock::now();
  std::map<std::string, int64_t> run_peaks;  // per phase, over the run
  int64_t step = start_step;
  // What is live, by category, for reports and metrics.
  auto weight_bytes = [&] {
    int64_t b = 0;
    for (const auto& p : model->parameters()) b += static_cast<int64_t>(p.nbytes());
    for (const auto& t : model->buffers()) b += static_cast<int64_t>(t.nbytes());
    return b;
  };
  auto gradient_bytes = [&] {
    int64_t b = 0;
    for (const auto& [n, p] : state.trainable)
      if (p.grad().defined()) b += static_cast<int64_t>(p.grad().nbytes());
    return b;
  };
  std::map<std::string, int64_t> last_step_peaks;
  std::string bucket;
  int batch = 0, consecutive_ooms = 0;
  bool warned_controls = false;
  for (; step < tc.steps; ++step) {
    if (options.stop_requested && options.stop_requested->load()) {
      summary.interrupted = true;
      break;
    }
    try {
    const auto t_step = Clock::now();
    const double lr = scheduled_lr(tc.lr_scheduler, tc.lr, step, tc.steps);
    double loss_sum = 0, wait_s = 0;
    for (int micro = 0; micro < accumulation; ++micro) {
      const auto t_wait = Clock::now();
      LoadedBatch lb;
      {
        auto scope = phase("data");
        lb = loader.next();
      }
      wait_s += seconds_since(t_wait);
      for (const auto& w : loader.take_warnings()) log::warn(w);
      bucket = lb.bucket.key();
      batch = static_cast<int>(lb.latents.size(0));
      MicroBatch mb;
      {
        auto scope = phase("text");
        mb.conditioning = conditioner.inputs_for(lb.captions);
      }
      mb.x0 = lb.latents.to(device);
      if (!lb.references.empty()) {
        if (spec.edit) {
          for (const auto& r : lb.references) mb.conditioning.reference_latents.push_back(r.to(device));
        } else if (!warned_controls) {
          log::warn(spec.preset + " is not an edit model; the datasets' control images are not used");
          warned_controls = true;
        }
      }
      mb.noise = torch::randn_like(mb.x0);
      mb.t = sample_timesteps(tc.timestep_type, mb.x0.size(0), device);
      torch::Tensor loss;
      {
        auto scope = phase("forward");
        loss = flow_matching_loss(*model, mb, so);
      }
      {
        auto scope = phase("backward");
        (loss * so.loss_scale).backward();
      }
      loss_sum += loss.item<double>();
    }
    double grad_norm = 0;
    int64_t step_gradient_bytes = 0;
    {
      auto scope = phase("optimizer");
      std::vector<torch::Tensor> params;
      for (const auto& [n, p] : state.trainable) params.push_back(p);
      grad_norm = clip_grad_norm(params, tc.max_grad_norm);
      step_gradient_bytes = gradient_bytes();
      optimizer->step(lr);
      optimizer->zero_grad();
      if (!state.ema.empty()) {
        torch::NoGradGuard no_grad;
        for (auto& [n, p] : state.trainable) state.ema[n].mul_(tc.ema_config.ema_decay).add_(p, 1 - tc.ema_config.ema_decay);
      }
    }
    const double loss = loss_sum / accumulation, step_s = seconds_since(t_step);
    summary.losses.push_back(loss);
    summary.data_wait_s += wait_s;
    summary.step_s += step_s;
    summary.end_step = step + 1;
    // Previews and saves belong to this step (their phase peaks go in its metrics line).
    const bool last = step + 1 == tc.steps;
    const std::string step_bucket = bucket;
    const int step_batch = batch;
    if (sampling && (step + 1) % sample_every == 0 && step + 1 >= config.sample->sample_start_step) {
      bucket = std::to_string(config.sample->width) + "x" + std::to_string(config.sample->height), batch = 1;
      run_samples(step + 1);
    }
    if (!last && config.save.save_every > 0 && (step + 1) % config.save.save_every == 0) save(step + 1, false);
    bucket = step_bucket, batch = step_batch;
    auto stats = meter.stats();
    for (const auto& [name, bytes] : phases.peaks()) stats.peak_bytes = std::max(stats.peak_bytes, bytes);  // phases reset the meter
    summary.peak_bytes = std::max(summary.peak_bytes, stats.peak_bytes);
    std::ostringstream line;
    line.precision(6);
    line << "{\"step\": " << step + 1 << ", \"loss\": " << loss << ", \"lr\": " << lr << ", \"grad_norm\": " << grad_norm
         << ", \"step_time_s\": " << step_s << ", \"data_wait_s\": " << wait_s << ", \"bucket\": \"" << bucket
         << "\", \"batch\": " << batch << ", \"peak_bytes\": " << stats.peak_bytes << ", \"phases\": {";
    bool first = true;
    for (const auto& [name, bytes] : phases.peaks()) line << (first ? "" : ", ") << "\"" << name << "\": " << bytes, first = false;
    line << "}, \"weights_bytes\": " << weight_bytes() << ", \"gradient_bytes\": " << step_gradient_bytes << ", \"optimizer_bytes\": " << optimizer->state_bytes()
         << ", \"live_bytes\": " << stats.live_bytes << ", \"cap_bytes\": " << config.vram_cap.bytes
         << ", \"oom_skips\": " << summary.oom_skips << "}";
    metrics << line.str() << "\n";
    metrics.flush();
    for (const auto& [name, bytes] : phases.peaks()) run_peaks[name] = std::max(run_peaks[name], bytes);
    last_step_peaks = phases.peaks();
    phases.clear();
    meter.reset_peak();

    const int64_t done = step + 1 - start_step;
    if (options.progress && (done % report_every == 0 || step + 1 == tc.steps)) {
      const double per_s = static_cast<double>(done) / std::max(seconds_since(loop_start), 1e-9);
      char text[256];
      const std::string cap = config.vram_cap.bytes > 0 ? " / cap " + config::format_bytes(config.vram_cap.bytes) : "";
      std::snprintf(text, sizeof text, "step %lld/%d  loss %.4f  %.2f it/s  ETA %s  mem %s  peak %s%s",
                    static_cast<long long>(step + 1), tc.steps, loss, per_s,
                    duration_text(static_cast<double>(tc.steps - step - 1) / std::max(per_s, 1e-9)).c_str(),
                    config::format_bytes(stats.live_bytes).c_str(), config::format_bytes(summary.peak_bytes).c_str(),
                    cap.c_str());
      if (options.progress_in_place) *options.progress << "\r" << text << "\033[K" << std::flush;
      else *options.progress << text << "\n" << std::flush;
    }
    consecutive_ooms = 0;
    } catch (const c10::OutOfMemoryError& e) {
      // Free what the failed step held, then skip the batch or stop with nothing lost.
      const auto live = meter.stats();
      const int64_t failed_gradient_bytes = gradient_bytes();
      optimizer->zero_grad();
      const bool in_step = current_phase != "sample" && current_phase != "save";
      if (tc.oom_policy == "skip" && in_step && ++consecutive_ooms < 3) {
        ++summary.oom_skips;
        log::warn("out of memory at step " + std::to_string(step + 1) + " in " + current_phase + " (bucket " + bucket +
                  "); batch skipped (train.oom_policy: skip, " + std::to_string(consecutive_ooms) + " in a row)");
        metrics << "{\"step\": " << step + 1 << ", \"oom_skip\": true, \"phase\": \"" << current_phase
                << "\", \"bucket\": \"" << bucket << "\", \"oom_skips\": " << summary.oom_skips << "}\n";
        phases.clear();
        meter.reset_peak();
        --step;  // the step is taken again with the next batch
        continue;
      }
      OomContext ctx;
      ctx.step = step + 1;
      ctx.phase = current_phase;
      ctx.bucket = bucket;
      ctx.batch = batch;
      ctx.checkpoint_policy = policy.to_string();
      ctx.message = e.what_without_backtrace();
      ctx.device = device.str();
      ctx.cap_bytes = config.vram_cap.bytes;
      ctx.live_bytes = live.live_bytes;
      ctx.peak_bytes = live.peak_bytes;
      ctx.weight_bytes = weight_bytes();
      ctx.gradient_bytes = failed_gradient_bytes;
      ctx.optimizer_bytes = optimizer->state_bytes();
      ctx.text_encoder_bytes = conditioner.encoder_bytes();
      ctx.last_step_phase_peaks = last_step_peaks;
      // The parameters are those of the last completed step unless the optimizer itself failed.
      ctx.last_good_step = in_step && current_phase != "optimizer" ? step : step + 1;
      // Nothing lost: save under no cap (the cap is the experiment, not the disk write).
      if (cpu_tracker) cpu_tracker->set_cap(0);
      try {
        save(ctx.last_good_step, false);
        ctx.saved_weights = summary.saves.back().string();
      } catch (const std::exception& save_error) {
        log::error(std::string("could not save after the out-of-memory error: ") + save_error.what());
      }
      const auto fixes = recommend_fixes(ctx, config, spec);
      const std::string brief = write_oom_report(summary.output_dir, ctx, fixes);
      if (options.progress && options.progress_in_place) *options.progress << "\n";
      throw OutOfMemoryStop(brief);
    }
  }
  if (options.progress && options.progress_in_place) *options.progress << "\n";
  // The last step's preview, as AI Toolkit ends a run, unless it was just taken.
  if (sampling && !summary.interrupted && step > start_step && step % sample_every != 0) run_samples(step);
  if (summary.interrupted) {
    log::info("stopped at step " + std::to_string(step) + " (interrupted); saving");
    save(step, false);
  } else {
    save(step, false);  // the state for --resume, then the final weights
    save(step, true);
  }
  summary.total_s = seconds_since(t_start);
  // memory.json: the run's peaks, for reports and other tools.
  std::ofstream mem(summary.output_dir / "memory.json");
  mem << "{\"device\": \"" << device.str() << "\", \"cap_bytes\": " << config.vram_cap.bytes
      << ", \"peak_bytes\": " << summary.peak_bytes << ", \"checkpoint_policy\": \"" << policy.to_string()
      << "\", \"weights_bytes\": " << weight_bytes() << ", \"optimizer_bytes\": " << optimizer->state_bytes()
      << ", \"text_encoder_bytes\": " << conditioner.encoder_bytes() << ", \"phase_peak_bytes\": {";
  bool first_phase = true;
  for (const auto& [name, bytes] : run_peaks) mem << (first_phase ? "" : ", ") << "\"" << name << "\": " << bytes, first_phase = false;
  mem << "}}\n";
  return summary;
}

}  // namespace gclab::train
