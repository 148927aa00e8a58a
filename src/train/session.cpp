#include "gclab/train/session.h"

#include <numeric>
#include "gclab/io/safetensors.h"

#include "gclab/train/predict.h"

#include <algorithm>
#include <array>

#include <chrono>
#include <set>

#include "gclab/config/byte_size.h"
#include "gclab/data/image.h"
#include "gclab/data/video.h"
#include "gclab/log/log.h"
#include "gclab/memory/placement.h"
#include "gclab/model/experts.h"
#include "gclab/model/family.h"
#include "gclab/model/quantize.h"
#include "gclab/model/registry.h"
#include "gclab/sample/sampler.h"
#include "gclab/train/loading.h"
#include "gclab/train/offload.h"
#include "gclab/vae/qwen_image_vae.h"

namespace gclab::train {

namespace fs = std::filesystem;

const char* activity_name(Activity activity) {
  switch (activity) {
    case Activity::model:
      return "";
    case Activity::vae_encode:
      return "vae encode";
    case Activity::vae_decode:
      return "vae decode";
    case Activity::text_encode:
      return "text encode";
    case Activity::first_frame:
      return "first-frame encode";
  }
  return "?";
}

int64_t predicted_load_peak(const config::ProcessConfig& config) {
  return predict_load(plan_run(config, PlanOptions{/*meta=*/true})).device.peak();
}

namespace {

// The transformer held in host memory while it loads does not fit host_cap: what it needs there, and the
// levers — quantizing it on the device instead where the arch's loader allows it.
UserError host_load_refusal(const RunPlan& plan) {
  const config::ProcessConfig& config = plan.config;
  const int64_t needed = predict_load(plan_run(config, PlanOptions{/*meta=*/true})).host.peak();
  std::string levers = "raise host_cap (a machine with more RAM)";
  if (plan.load.loading == model::TransformerLoading::on_device_unless_low_vram) {
    config::ProcessConfig on_device = config;
    on_device.model.low_vram = false;
    levers = "set model.low_vram: false (quantized on the device instead, which then holds " +
             config::format_bytes(predicted_load_peak(on_device)) + " while it loads), or " + levers;
  } else {
    levers += "; AI Toolkit's loader for " + config.model.arch +
              " always quantizes the transformer in host memory (quantize_model)";
  }
  return UserError("host memory: loading the transformer in host memory does not fit host_cap " +
                   config::format_bytes(config.host_cap.bytes) + " (the load holds " + config::format_bytes(needed) +
                   " there) — " + levers);
}

}  // namespace

text::EncodePrediction predict_caption_encode(const text::PromptEncoder& prompts, const model::ModelSpec& spec,
                                              bool cpu) {
  text::EncodeMemoryOptions kernels;
  kernels.cpu = cpu;
  return prompts.predict_encode(model::kNominalCaptionTokens, model::text_reads_controls(spec) ? 1 : 0, kernels);
}

std::string step_tag(int64_t step) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%09lld", static_cast<long long>(step));
  return buf;
}

Session::Session(const config::ProcessConfig& config, const SessionOptions& options)
    : Session(plan_run(config, PlanOptions{options.meta}), options) {}

Session::Session(RunPlan plan, const SessionOptions& options)
    : plan_(std::move(plan)),
      device_(plan_.device),
      // Exact accounting on the CPU. A meta session counts nothing and installs no tracker: a run's memory
      // model (train/predict.h) lives beside the run's own Session, whose tracker holds the cap.
      cpu_tracker_(device_.is_cpu() && !memory::CpuMemoryTracker::installed()
                       ? std::make_unique<memory::CpuMemoryTracker>(config_.vram_cap.bytes)
                       : nullptr),
      meter_(device_),
      phases_(meter_),
      timesteps_(plan_.family->flow_schedule(plan_.spec), config_.train),
      previous_host_cap_(memory::MemoryMeter::host_cap()) {
  if (device_.is_meta()) meta_allocator_.emplace();
  for (const auto& w : plan_.warnings) log::warn(w);
  if (!device_.is_meta() && plan_.policy.kind == ckpt::CheckpointPolicy::Kind::Auto)
    choose_auto_plan(options.auto_choice);
  run_auto_cap_ = plan_.auto_cap_bytes, run_auto_cap_source_ = plan_.auto_cap_source;
  start_memory();
  // The load, in the order AI Toolkit's loader for the arch takes: the transformer (on the device, or in
  // host memory and moved after the text encoders), the text encoders. Each step records its modules' sizes
  // in load_ as it runs: a meta Session's record is the prediction (predict_load); a run's load_ is that
  // prediction, made before it loads, and what it measured. Random weights from the training seed, the
  // transformer's drawn first.
  load_.quantized_on_host = plan_.load.quantized_on_host;
  load_.at_first_use = plan_.load.at_first_use && plan_.load.quantized_on_host;
  LoadMemory predicted;
  if (!device_.is_meta()) {
    predicted = predict_load(plan_);
    // A GPU run's host memory is not the CPU tracker's: the walk's host peak is held against the cap.
    if (device_.is_cuda() && config_.host_cap.bytes > 0 && predicted.host.peak() > config_.host_cap.bytes)
      throw host_load_refusal(plan_);
  }
  const memory::MemoryStats before_load = meter_.stats();
  meter_.reset_peak();
  memory::MemoryMeter::reset_host_peak();
  load_transformer();
  if (plan_.load.blocks_parked) park_blocks();
  if (!plan_.load.after_text_encoders && !load_.at_first_use) transformer_to_device();
  load_text_encoders();
  if (plan_.load.after_text_encoders && !load_.at_first_use) transformer_to_device();
  transformer_parked_ = load_.at_first_use && !device_.is_meta();
  load_first_frame_encoder();
  if (!device_.is_meta()) {
    load_ = std::move(predicted);
    record_load(before_load);
  }
  if (options.load_only) return;
  attach_network();
  load_user_weights();
  attach_assistant();
  experts_adapters_to_device();
  offload_transformer();
  model_->train();
  build_codec();
  // Checkpointing, applied to the built model from outside; a budget resolved at the largest cell.
  checkpointing_ = std::make_unique<ModelCheckpointing>(*model_);
  apply_policy(plan_.policy, plan_.largest.shape());
  build_optimizer();
  // A rank of a world holds the reducer's buckets — `bench` and `fit` too, without a group, so that their
  // figures are a rank's.
  group_ = options.group;
  if (!plan_.world.alone() && !device_.is_meta()) {
    std::vector<torch::Tensor> tensors;
    for (const auto& [n, p] : trained_) tensors.push_back(p);
    reducer_ = std::make_unique<dist::GradientReducer>(group_, std::move(tensors));
  }
}

// Exact accounting on the CPU, the allocator's statistics on CUDA; the emulated caps.
void Session::start_memory() {
  if (device_.is_cpu()) {
    try {
      model::check_fits_in_host_memory(spec_, "gclab");
    } catch (const std::invalid_argument& e) {
      throw UserError(e.what());
    }
  } else if (device_.is_cuda() && config_.vram_cap.bytes > 0) {
    previous_fraction_ = meter_.memory_fraction();
    meter_.set_cap(config_.vram_cap.bytes);
  }
  if (device_.is_cpu()) memory::MemoryMeter::set_host_cap(config_.host_cap.bytes);
}

// The transformer built in the dtype it trains in (bf16: every weight bfloat16, the LoRA adapters float32;
// a full fine-tune updates the bfloat16 weights themselves, as AI Toolkit does) and quantized — on the
// device, or in host memory under low_vram or block by block.
void Session::load_transformer() {
  torch::manual_seed(plan_.seed);
  try {
    std::optional<memory::HostScope> host;
    if (load_.quantized_on_host && device_.is_cpu()) host.emplace();
    std::optional<nn::DrawOnDevice> draw_on;
    if (plan_.load.staged && device_.is_cuda()) draw_on.emplace(device_);
    const Residence built_in = load_.quantized_on_host ? Residence::host : Residence::device;
    // Each transformer (each expert in turn: experts_in_turn) built and quantized before the next is built —
    // but with an accuracy recovery adapter the experts are quantized together once both are built
    // (wan22_14b_model.py:360-364: quantize_model on the wrapper, its exclude patterns then matching no
    // expert's embedders).
    const bool together = !spec_.expert_boundaries.empty() && config_.model.accuracy_recovery_adapter.has_value();
    auto quantize = [&](model::DiffusionTransformer& m) {
      if (!config_.model.quantize) return;
      const model::BaseQuantization q = model::quantize_base(m, config_.model);
      load_.quantized(built_in, q.memory);
      log::info("model.quantize: " + model::describe(q, config_.model) +
                (load_.quantized_on_host ? ", in host memory" : ", on the device"));
    };
    auto loaded = [&](model::DiffusionTransformer& m) {
      if (plan_.load.staged) load_.staged(largest_parameter_bytes(m));
      load_.built(built_in, nn::module_bytes(m));
      if (!together) quantize(m);
    };
    const auto options =
        torch::TensorOptions().device(draw_on ? torch::Device(torch::kCPU) : device_).dtype(plan_.base_dtype);
    if (spec_.expert_boundaries.empty()) {
      model_ = plan_.family->build_transformer(spec_, options);
      loaded(*model_);
    } else {
      model_ = model::build_experts(spec_, options, loaded);
      if (together) quantize(*model_);
      experts_ = dynamic_cast<model::ExpertTransformers*>(model_.get());
      if (load_.at_first_use) experts_->set_router([this](size_t e) { expert_to_device(e); });
    }
  } catch (const c10::OutOfMemoryError&) {
    if (!load_.quantized_on_host) throw;  // the device's: the run's OOM report
    throw host_load_refusal(plan_);       // the CPU tracker's host cap
  }
}

// quantize_model's blocks, each sent to host memory once quantized (parked_while_text_encoders_load): what
// the device holds of the transformer while the text encoders load is the rest of it.
void Session::park_blocks() {
  for (const auto& block : model_->blocks()) {
    load_.moved(Residence::host, nn::module_bytes(*block));
    move_module(*block, Residence::host, device_);
  }
}

void Session::transformer_to_device() {
  if (plan_.load.blocks_parked) {
    for (const auto& block : model_->blocks()) {
      load_.moved(Residence::device, nn::module_bytes(*block));
      move_module(*block, Residence::device, device_);
    }
    return;
  }
  if (!load_.quantized_on_host) return;
  load_.moved(Residence::device, nn::module_bytes(*model_));
  move_module(*model_, Residence::device, device_);
}

namespace {

// The tensors of `module` that live on the device: its parameters and buffers but an offloaded Linear's own
// (model.layer_offloading keeps those in host memory).
std::vector<torch::Tensor> device_tensors(const torch::nn::Module& module) {
  std::set<const c10::TensorImpl*> offloaded;
  for (const auto& m : module.modules())
    if (const auto* l = m->as<nn::LinearImpl>(); l && l->offloaded()) {
      for (const auto& p : l->parameters(/*recurse=*/false)) offloaded.insert(p.unsafeGetTensorImpl());
      for (const auto& b : l->buffers(/*recurse=*/false)) offloaded.insert(b.unsafeGetTensorImpl());
    }
  std::vector<torch::Tensor> out;
  for (const auto& p : module.parameters())
    if (p.defined() && offloaded.count(p.unsafeGetTensorImpl()) == 0) out.push_back(p);
  for (const auto& b : module.buffers())
    if (b.defined() && offloaded.count(b.unsafeGetTensorImpl()) == 0) out.push_back(b);
  return out;
}

// An expert's base weights: what the swap between experts moves — every tensor but its LoRA adapters' and
// accuracy-recovery adapters' (they stay on the device, as AI Toolkit's networks hold them apart from the
// transformer they adapt).
std::vector<torch::Tensor> expert_base_tensors(const torch::nn::Module& expert) {
  std::set<const c10::TensorImpl*> adapters;
  for (const auto& p : expert.named_parameters())
    if (p.key().find("lora_A.") != std::string::npos || p.key().find("lora_B.") != std::string::npos)
      adapters.insert(p.value().unsafeGetTensorImpl());
  for (const auto& b : expert.named_buffers())
    if (b.key().find("recovery_") != std::string::npos) adapters.insert(b.value().unsafeGetTensorImpl());
  std::vector<torch::Tensor> out;
  for (const auto& t : device_tensors(expert))
    if (adapters.count(t.unsafeGetTensorImpl()) == 0) out.push_back(t);
  return out;
}

// Whether `t` is where `device` keeps its device memory (a CPU run's: not tagged host memory).
bool on_device(const torch::Tensor& t, const torch::Device& device) {
  return device.is_cuda() ? t.is_cuda() : !memory::is_host_memory(t);
}

}  // namespace

void Session::transformer_at_first_use() {
  if (!transformer_parked_) return;
  transformer_parked_ = false;
  torch::NoGradGuard no_grad;
  for (auto& [n, e] : ema_) e = memory::to_device(e, device_);
  if (experts_) return;  // the forward brings the expert it runs (expert_to_device)
  for (auto& t : device_tensors(*model_)) t.set_data(memory::to_device(t, device_));
  log::info("model.low_vram: the transformer reaches the device at its first use, as AI Toolkit's " +
            config_.model.arch + " loader leaves it");
}

// The expert that runs comes to the device; the one that ran before goes to host memory, its frozen weights
// (its adapters stay, with their optimizer state).
void Session::expert_to_device(size_t e) {
  if (expert_on_device_ == static_cast<int>(e)) return;
  // A meta session's tensors stay where they are (a walk's forward would count the move as freed memory):
  // resident() reads the experts' places from expert_on_device_.
  if (!device_.is_meta()) {
    const int before = expert_on_device_;
    expert_on_device_ = -1;  // until the move is whole: an error midway leaves every expert to be checked again
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < experts_->expert_count(); ++i)
      if (i != e) expert_base_to_host(i);
    for (auto& t : expert_base_tensors(experts_->expert(e)))
      if (!on_device(t, device_)) t.set_data(memory::to_device(t, device_));
    log::info("model.low_vram: " + model::expert_name(e) + " to the device" +
              (before >= 0 ? ", " + model::expert_name(static_cast<size_t>(before)) + " to host memory" : ""));
  }
  expert_on_device_ = static_cast<int>(e);
}

void Session::expert_base_to_host(size_t e) {
  torch::NoGradGuard no_grad;
  for (auto& t : expert_base_tensors(experts_->expert(e)))
    if (on_device(t, device_)) t.set_data(device_.is_cpu() ? memory::to_host(t) : t.to(torch::kCPU));
}

void Session::experts_to_host() {
  if (!experts_ || !load_.at_first_use || expert_on_device_ < 0) return;
  const int before = expert_on_device_;
  expert_on_device_ = -1;
  if (!device_.is_meta()) {
    expert_base_to_host(static_cast<size_t>(before));
    log::info("model.low_vram: " + model::expert_name(static_cast<size_t>(before)) + " to host memory");
  }
}

int64_t Session::expert_swap_bytes() const {
  if (!experts_ || !load_.at_first_use) return 0;
  int64_t bytes = 0;
  for (const auto& t : expert_base_tensors(experts_->expert(0))) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

int64_t Session::experts_in_host_bytes() const {
  if (!experts_ || !load_.at_first_use) return 0;
  // Every expert but the one that ran last (the first before any has: the experts have one shape, and the
  // load's parked bytes stand for the first's wait in host memory until its first forward).
  const size_t on = expert_on_device_ < 0 ? 0 : static_cast<size_t>(expert_on_device_);
  int64_t bytes = 0;
  for (size_t i = 0; i < experts_->expert_count(); ++i)
    if (i != on)
      for (const auto& t : expert_base_tensors(experts_->expert(i))) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

// The text encoders built on the device and quantized there (offloaded as the config says), and the
// embedding cache in front of them.
void Session::load_text_encoders() {
  torch::manual_seed(plan_.seed);
  std::unique_ptr<text::PromptEncoder> prompts;
  try {
    prompts = std::make_unique<text::PromptEncoder>(plan_.prompts);
  } catch (const std::runtime_error& e) {
    throw UserError(std::string("text encoders: ") + e.what());
  }
  for (const auto& step : prompts->load_steps()) {
    load_.built(Residence::device, step.built_bytes);
    load_.quantized(Residence::device, step.quantized);
  }
  for (size_t i = 0; i < prompts->slots(); ++i)
    log::info(model::text_encoder_folder(i) + ": " + std::string(config::name_of(prompts->encoder(i).kind())) + ", " +
              (prompts->random_weights(i) ? "random weights" : "weights loaded") + ", " +
              (prompts->hashing_tokenizer(i) ? "the hashing stand-in tokenizer" : "its tokenizer"));
  if (config_.model.layer_offloading && config_.model.layer_offloading_text_encoder_percent > 0)
    for (size_t i = 0; i < prompts->slots(); ++i) {
      const Offloaded o = offload_within_host_cap(
          prompts->encoder(i), config_.model.layer_offloading_text_encoder_percent,
          "model.layer_offloading_text_encoder_percent", plan_.seed + 1 + i, model::text_encoder_folder(i));
      load_.moved(Residence::host, o.host_bytes);
      log::info("model.layer_offloading: " + std::to_string(o.offloaded) + " of " + model::text_encoder_folder(i) +
                "'s " + std::to_string(o.linears) + " Linears in host memory (" + config::format_bytes(o.host_bytes) +
                ")");
    }
  // What made the embeddings, for the cache files' key: the model, its encoders' weights (random: the seed),
  // the dtype and the encoders' storage.
  std::string encoders =
      config_.model.arch + "|" + config_.model.name_or_path.value_or("") + "|" + std::string(bf16() ? "bf16" : "fp32");
  for (size_t i = 0; i < prompts->slots(); ++i)
    if (prompts->random_weights(i)) encoders += "|random " + std::to_string(plan_.seed);
  for (const auto& storage : plan_.prompts.linear_storage)
    encoders += "|" + (storage ? nn::to_string(*storage) : std::string("-"));
  text_ = std::make_unique<data::TextEmbeddingCache>(
      std::move(prompts), [this](int64_t n) { return model::sequence_rows(spec_, n); },
      device_.is_meta() ? torch::Device(torch::kCPU) : device_, plan_.text_encoder_leaves, encoders);
}

// An image-to-video model's image encoder, loaded after the rest (Wan21I2V.load_model, wan21_i2v.py:304-343:
// CLIPVisionModel in the model's dtype, to the device). Under model.low_vram AI Toolkit sends it to the CPU
// after — having sent UMT5 there first, so its moment on the device never raises the load's peak at a real
// model's sizes — and the first step brings it back (get_noise_prediction: `self.image_encoder.to(device)`,
// :504): gclab builds it in host memory then, and moves it at the first step.
void Session::load_first_frame_encoder() {
  if (!plan_.first_frame) return;
  model::FrameConditioningSource source = *plan_.first_frame;
  const bool waits = first_frame_encoder_waits() && !device_.is_meta();
  std::optional<memory::HostScope> host;
  if (waits) {
    host.emplace();
    source.encoder_in_host_memory = true;
  }
  first_frame_ = plan_.family->frame_conditioning(spec_, source);
  host.reset();
  torch::nn::Module* encoder = first_frame_->image_encoder();
  if (!encoder) return;
  load_.built(first_frame_encoder_waits() ? Residence::host : Residence::device, nn::module_bytes(*encoder));
  first_frame_parked_ = waits;
  if (!device_.is_meta()) log::info("image_encoder: " + first_frame_->describe());
}

// Under model.low_vram (first_frame_encoder_waits) the encoder leaves the device for previews: AI Toolkit's
// Wan21I2V.generate_images sends it to the CPU, its pipeline brings it for the control image's encode and
// sends it back (wan21_i2v.py:351-356, 164, 189); the next step's forward brings it again.
void Session::first_frame_encoder_to_host() {
  if (!first_frame_encoder_waits() || first_frame_parked_ || device_.is_meta() || !first_frame_->image_encoder())
    return;
  move_module(*first_frame_->image_encoder(), Residence::host, device_);
  first_frame_parked_ = true;
}

void Session::first_frame_encoder_to_device() {
  if (!first_frame_parked_) return;
  move_module(*first_frame_->image_encoder(), Residence::device, device_);
  first_frame_parked_ = false;
}

bool Session::first_frame_on(int dataset) const {
  const auto d = static_cast<size_t>(dataset);
  return first_frame_ && d < config_.datasets.size() && plan_.family->trains_on_first_frame(spec_, config_.datasets[d]);
}

bool Session::first_frames_cached() const {
  if (!conditions_on_first_frame()) return false;
  for (size_t d = 0; d < config_.datasets.size(); ++d)
    if (first_frame_on(static_cast<int>(d)) && !plan_.first_frame_latents.count(static_cast<int>(d))) return false;
  return true;
}

void Session::condition_on_first_frame(model::ModelInputs& in, const model::FirstFrames& first, const torch::Tensor& x0,
                                       uint64_t draw) {
  first_frame_encoder_to_device();
  current_activity_ = Activity::first_frame;
  first_frame_->condition(in, first, x0, [&](const torch::Tensor& video) { return codec().encode(video, draw); });
  current_activity_ = Activity::model;
}

// What loading held, measured beside the walk's prediction.
void Session::record_load(const memory::MemoryStats& before_load) {
  const memory::MemoryStats loaded = meter_.stats();
  load_.measured_device_peak_bytes = loaded.peak_bytes - before_load.live_bytes;
  if (device_.is_cpu())  // the tracker measures host memory apart on a CPU run only
    load_.measured_host_peak_bytes = loaded.host_peak_bytes - before_load.host_live_bytes;
  log::info("loaded: the device held at most " + config::format_bytes(*load_.measured_device_peak_bytes) +
            " (predicted " + config::format_bytes(load_.device.peak()) + ")" +
            (load_.measured_host_peak_bytes && load_.host.peak() > 0
                 ? ", host memory " + config::format_bytes(*load_.measured_host_peak_bytes) + " (predicted " +
                       config::format_bytes(load_.host.peak()) + ")"
                 : ""));
}

// The LoRA network's float32 adapters on the built transformer.
void Session::attach_network() {
  if (experts_) {
    trained_stages_ = plan_.family->trained_experts(spec_, config_.model.model_kwargs);
    for (size_t e : trained_stages_)
      if (e >= experts_->expert_count()) trained_stages_.clear();
    if (trained_stages_.empty())
      throw UserError("model.model_kwargs leave none of " + spec_.preset + "'s " +
                      std::to_string(experts_->expert_count()) + " experts to train: let at least one train");
    // BaseSDTrainProcess.py:271-272 starts at stage 0 and the first micro-batch moves on to one that trains:
    // the first that trains, here, so that every caller of micro_batch draws a trained stage.
    stage_ = trained_stages_.front();
  }
  if (!config_.network) return;
  lora_ = model::lora_options(*config_.network);
  if (experts_ && trained_stages_.size() < experts_->expert_count())
    for (size_t e : trained_stages_) lora_.within.push_back(model::expert_name(e) + ".");
  const config::NetworkConfig& n = *config_.network;
  if (n.use_linear_alpha)
    log::info("network.use_linear_alpha (gclab's): the adapters are scaled by linear_alpha / linear = " +
              std::to_string(lora_.alpha / static_cast<double>(lora_.rank)) +
              "; AI Toolkit would train them at scale 1 (alpha = rank)");
  else if (n.linear_alpha && *n.linear_alpha != static_cast<double>(lora_.rank))
    log::info(
        "network.linear_alpha is not applied, as in AI Toolkit, which trains these models' LoRAs at "
        "scale 1 (alpha = rank); network.use_linear_alpha: true applies it");
  lora_modules_ = model::apply_lora(*model_, lora_);
}

// Two experts waiting in host memory (low_vram): their LoRA and accuracy-recovery adapters on the device from
// the start, as AI Toolkit's networks are (network.to(device)); the base weights come at each expert's forward.
void Session::experts_adapters_to_device() {
  if (!experts_ || !load_.at_first_use || device_.is_meta()) return;
  torch::NoGradGuard no_grad;
  for (size_t e = 0; e < experts_->expert_count(); ++e) {
    std::set<const c10::TensorImpl*> base;
    for (const auto& t : expert_base_tensors(experts_->expert(e))) base.insert(t.unsafeGetTensorImpl());
    for (auto& t : device_tensors(experts_->expert(e)))
      if (base.count(t.unsafeGetTensorImpl()) == 0 && !on_device(t, device_)) t.set_data(memory::to_device(t, device_));
  }
}

// The user's weights when name_or_path is a local diffusers folder that has them: every tensor checked
// against the model built from its config.json, loaded into the storage the run uses.
// model.assistant_lora_path: merged into the base after its weights are in (AI Toolkit merges before it
// quantizes: on a quantized base gclab requantizes the merged weight), its matrices on the device in the
// compute dtype until the first preview, host memory between previews (base_model.py:739-745).
void Session::attach_assistant() {
  if (plan_.assistant_adapter.empty()) return;
  int adapted = 0;
  try {
    adapted = model::attach_assistant_adapter(*model_, plan_.assistant_adapter, plan_.compute_dtype);
  } catch (const std::exception& e) {
    throw UserError("model.assistant_lora_path: " + plan_.assistant_adapter.string() + ": " + e.what());
  }
  log::info("model.assistant_lora_path: merged into " + std::to_string(adapted) +
            " Linears for training, taken back out while sampling (AI Toolkit's assistant adapter)");
}

void Session::load_user_weights() {
  const auto& local = plan_.local;
  if (local && !local->weights.empty() && !device_.is_meta()) {
    try {
      const auto unused = model::load_weights(*model_, local->weights, local->expert_weights);
      log::info("loaded " + local->weights.string() +
                (unused.empty()
                     ? ""
                     : " (" + std::to_string(unused.size()) + " tensors not used, e.g. " + unused.front() + ")"));
    } catch (const std::runtime_error& e) {
      throw UserError(std::string("the weights do not fit the model their config.json describes: ") + e.what());
    }
  } else if (local) {
    log::info(local->config.string() + " has no weights beside it: its shape with random weights");
  } else if (config_.model.name_or_path) {
    log::info("model.name_or_path '" + *config_.model.name_or_path + "' is not a local folder: the " + spec_.preset +
              " preset with random weights");
  }
}

void Session::offload_transformer() {
  if (!config_.model.layer_offloading || config_.model.layer_offloading_transformer_percent <= 0) return;
  const Offloaded o =
      offload_within_host_cap(*model_, config_.model.layer_offloading_transformer_percent,
                              "model.layer_offloading_transformer_percent", plan_.seed, "the transformer");
  log::info("model.layer_offloading: " + std::to_string(o.offloaded) + " of the transformer's " +
            std::to_string(o.linears) + " Linears keep their weights in host memory (" +
            config::format_bytes(o.host_bytes) + "), brought to the device for each call");
}

// The autoencoder: resident while it encodes on the fly; with cached latents it leaves the device once they
// are encoded (cache_latents) and comes back for previews only, or for the steps' control images. On the
// meta device (its weights' sizes) it stands for the steps: resident when they encode.
void Session::build_codec() {
  const vae::CodecSpec& spec = plan_.codec;
  try {
    codec_ = vae::build_codec(spec, device_, plan_.seed);
  } catch (const std::runtime_error& e) {
    throw UserError(std::string("the autoencoder's weights do not fit its config.json: ") + e.what());
  }
  if (device_.is_meta()) {
    if (!plan_.vae_in_steps) codec_->offload();
    return;
  }
  if (spec.autoencoder)
    log::info("autoencoder: " + spec.describe() +
              (spec.weights.empty()
                   ? "; random weights: its memory is exact, its latents and previews are meaningless (model.vae: "
                     "dct previews a tiny model trained from scratch)"
                   : ""));
  if (plan_.caches_latents) codec_->offload();
}

// What is trained, the optimizer (its own defaults for what the config does not set: Lion's betas
// 0.9/0.99, no decay), EMA.
void Session::build_optimizer() {
  const config::TrainConfig& tc = config_.train;
  // A full fine-tune trains the parameters model.only_if_contains / ignore_if_contains leave, the rest
  // frozen (named as "transformer.<name>": stable_diffusion_model.py:2704-2713, models/base_model.py:
  // 1310-1318; BaseSDTrainProcess.py:1900 freezes all, ensure_params_requires_grad thaws the optimizer's).
  const config::ModelConfig& mc = config_.model;
  auto any_in = [](const std::string& name, const std::vector<std::string>& words) {
    return std::any_of(words.begin(), words.end(),
                       [&](const std::string& w) { return name.find(w) != std::string::npos; });
  };
  if (!config_.network && (!mc.only_if_contains.empty() || !mc.ignore_if_contains.empty()))
    for (auto& p : model_->named_parameters()) {
      const std::string name = "transformer." + p.key();
      if (any_in(name, mc.ignore_if_contains) || (!mc.only_if_contains.empty() && !any_in(name, mc.only_if_contains)))
        p.value().set_requires_grad(false);
    }
  if (experts_)  // the experts that do not train, frozen (a full fine-tune's; a LoRA's have no adapters)
    for (auto& p : model_->named_parameters())
      if (std::none_of(trained_stages_.begin(), trained_stages_.end(),
                       [&](size_t e) { return p.key().rfind(model::expert_name(e) + ".", 0) == 0; }))
        p.value().set_requires_grad(false);
  for (const auto& p : model_->named_parameters())
    if (p.value().requires_grad()) trained_.emplace_back(p.key(), p.value());
  if (trained_.empty())
    throw UserError(std::string("nothing to train: ") +
                    (config_.network ? "network.transformer_only / network_kwargs leave no Linear to adapt"
                                     : "model.only_if_contains / ignore_if_contains leave no parameter") +
                    " (names are matched as \"transformer.<path>\", e.g. transformer.transformer_blocks.0.attn.to_q)");
  std::vector<std::pair<std::string, torch::Tensor>> updated = trained_;
  if (plan_.world.shard_optimizer && !plan_.world.alone()) {  // ZeRO-1: the state of this rank's tensors only
    if (tc.optimizer == config::OptimizerKind::prodigy)
      throw UserError(
          "--shard optimizer: Prodigy's step size is estimated over every trained tensor at once; "
          "use another optimizer, or --shard none");
    std::vector<torch::Tensor> tensors;
    for (const auto& [n, p] : trained_) tensors.push_back(p);
    owners_ = dist::owners(tensors, plan_.world.size);
    updated.clear();
    for (size_t i = 0; i < trained_.size(); ++i)
      if (owners_[i] == plan_.world.rank) updated.push_back(trained_[i]);
  }
  optimizer_ =
      make_optimizer(tc.optimizer, std::move(updated),
                     options_from(tc, [&](const char* key) { return config_.source.origin_by_path.count(key) > 0; }));
  if (tc.ema_config.use_ema)
    for (const auto& [n, p] : trained_) ema_[n] = p.detach().clone();
}

int64_t Session::resident_host_weights() {
  int64_t bytes = model_ ? nn::offloaded_bytes(*model_) : 0;
  if (text_ && text_->encoder())
    for (size_t i = 0; i < text_->encoder()->slots(); ++i) bytes += nn::offloaded_bytes(text_->encoder()->encoder(i));
  return bytes;
}

Offloaded Session::offload_within_host_cap(torch::nn::Module& component, double share, const std::string& share_key,
                                           uint64_t seed, const std::string& what) {
  const int64_t cap = config_.host_cap.bytes;
  auto refuse = [&](int64_t held) {
    return UserError("host memory: offloading " + what + "'s Linears does not fit host_cap " +
                     config::format_bytes(cap) + " (" + config::format_bytes(held) +
                     " of offloaded weights were in host memory when it ran out) — lower " + share_key +
                     ", quantize the weights (model.qtype / qtype_te), or raise the cap");
  };
  try {
    const Offloaded o = offload_layers(component, share, seed, device_, rings_);
    // A GPU run's pinned host memory is not the CPU tracker's: held against the cap from the prediction.
    if (device_.is_cuda() && cap > 0 && resident_host_weights() > cap) throw refuse(resident_host_weights());
    return o;
  } catch (const c10::OutOfMemoryError&) {  // the CPU tracker's host cap
    throw refuse(meter_.stats().host_live_bytes);
  }
}

// The process-wide state a Session sets goes back as it was: the offloaded Linears' ring slots (device
// memory until overwritten) are released, the host cap restored.
Session::~Session() {
  nn::release_offload_buffers(*rings_);  // its own: another Session's (a run's, a memory model's) are untouched
  if (device_.is_cpu()) memory::MemoryMeter::set_host_cap(previous_host_cap_);
  if (previous_fraction_) meter_.set_memory_fraction(*previous_fraction_);
}

memory::PhaseMeter::Scope Session::phase(Phase p) {
  current_phase_ = p;
  current_activity_ = Activity::model;
  return phases_.phase(p);
}

uint64_t Session::encode_key(int64_t batch, uint64_t k) const {
  // A rank's posterior samples are its own: its images differ from the other ranks' in the same batch.
  return static_cast<uint64_t>(batch) * 16 + k + (static_cast<uint64_t>(plan_.world.rank) << 48);
}

vae::ImageCodec& Session::codec() {
  if (!codec_) throw std::logic_error("the autoencoder is not built in a Session that only loads");
  return *codec_;
}

void Session::encode(data::LoadedBatch& lb) {
  if (lb.latents.defined() && lb.reference_images.empty()) return;
  current_activity_ = Activity::vae_encode;
  if (!lb.latents.defined()) {
    const uint64_t draw = encode_key(lb.index, 0);
    const bool first_latents =
        std::any_of(lb.slots.begin(), lb.slots.end(), [](const data::LatentSlot& s) { return s.first_frame; });
    if (first_latents)  // its dataset caches them: encoded here (a posterior sample of their own), and kept
      lb.first_frame_latents = memory::to_host(codec().encode(lb.images.narrow(2, 0, 1), draw + 15).to(torch::kFloat));
    else if (first_frame_on(lb.dataset)) {  // kept for the step's conditioning (host memory, as the pixels)
      memory::HostScope host;
      lb.first_frames = lb.images.select(2, 0).clone();
    }
    lb.latents = codec().encode(lb.images, draw);
    lb.images = torch::Tensor();
    data::remember_latents(lb);
  }
  for (size_t i = 0; i < lb.reference_images.size(); ++i)
    lb.references.push_back(codec().encode(lb.reference_images[i], encode_key(lb.index, 1 + i)));
  lb.reference_images.clear();
  current_activity_ = Activity::model;
}

Session::Parked Session::parked_while_caching(CacheFill fill) const {
  Parked out;
  // The transformer, unless it is in host memory already (LoadPlan::at_first_use: until its first use, which
  // comes after the caches; the meta Session keeps no flag for it); a LoRA's adapters stay.
  if (!transformer_parked_ && !(device_.is_meta() && load_.at_first_use)) {
    std::set<const c10::TensorImpl*> stays;
    if (config_.network)
      for (const auto& [n, p] : trained_) stays.insert(p.unsafeGetTensorImpl());
    for (auto& t : device_tensors(*model_))
      if (stays.count(t.unsafeGetTensorImpl()) == 0) out.transformer.push_back(t);
  }
  if (fill == CacheFill::latents)
    if (const text::PromptEncoder* prompts = text_->encoder())
      for (size_t i = 0; i < prompts->slots(); ++i)
        for (auto& t : device_tensors(prompts->encoder(i))) out.text_encoders.push_back(t);
  return out;
}

int64_t Session::Parked::bytes(const std::vector<torch::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += static_cast<int64_t>(t.nbytes());
  return n;
}

int64_t Session::cache_parked_bytes(CacheFill fill) const {
  const Parked p = parked_while_caching(fill);
  return Parked::bytes(p.transformer) + Parked::bytes(p.text_encoders);
}

void Session::park_for(CacheFill fill) {
  if (parked_) return;
  torch::NoGradGuard no_grad;
  parked_ = parked_while_caching(fill);
  for (auto* tensors : {&parked_->transformer, &parked_->text_encoders})
    for (auto& t : *tensors) t.set_data(memory::to_host(t));
  // The autoencoder too while the captions are encoded ('cache_text_encoder' keeps only the text encoders).
  if (fill == CacheFill::text && codec_ && !codec_->offloaded()) {
    codec_->offload();
    parked_->autoencoder = true;
  }
  filled_.insert(fill);
}

void Session::unpark() {
  if (!parked_) return;
  torch::NoGradGuard no_grad;
  for (auto* tensors : {&parked_->transformer, &parked_->text_encoders})
    for (auto& t : *tensors) t.set_data(memory::to_device(t, device_));
  if (parked_->autoencoder) codec_->restore();
  parked_.reset();
}

void Session::start_fill(CacheFill fill, std::optional<memory::PhaseMeter::Scope>& scope) {
  current_phase_ = Phase::cache;
  current_activity_ = fill == CacheFill::latents ? Activity::vae_encode : Activity::text_encode;
  park_for(fill);
  scope.emplace(phases_, Phase::cache);  // its peak from what stays on the device
}

int64_t Session::cache_latents(data::BatchLoader& loader) {
  if (!plan_.caches_latents || !codec_ || codec_->encodes_on_loader_thread()) return 0;
  // The cache phase: from the first encode (AI Toolkit moves only when one is needed) to the fill's end.
  std::optional<memory::PhaseMeter::Scope> scope;
  const int64_t n = loader.fill_caches([&](const torch::Tensor& images, uint64_t key) {
    if (!scope) start_fill(CacheFill::latents, scope);
    return codec_->encode(images, key);
  });
  codec_->offload();
  scope.reset();
  current_activity_ = Activity::model;
  // After the phase: its peak is the fill's. (An out-of-memory error above leaves them in host memory: the
  // run stops there, the caches being filled before the step loop, where AI Toolkit catches none.)
  unpark();
  if (n > 0)
    log::info("cached the latents of " + std::to_string(n) +
              " image placements (cache_latents), the transformer and text encoders off the device meanwhile; "
              "the autoencoder left the device");
  return n;
}

void Session::set_cap(int64_t bytes) {
  if (cpu_tracker_) cpu_tracker_->set_cap(bytes);
  if (device_.is_cuda()) {
    if (!previous_fraction_) previous_fraction_ = meter_.memory_fraction();  // put back when the Session ends
    meter_.release_cached();
    meter_.set_cap(bytes);
  }
  plan_.auto_cap_bytes = bytes;
  plan_.auto_cap_source = bytes > 0 ? "the cap set" : "";
}

void Session::restore_cap() {
  set_cap(config_.vram_cap.bytes);
  plan_.auto_cap_bytes = run_auto_cap_, plan_.auto_cap_source = run_auto_cap_source_;
}

void Session::lift_cap() {
  if (cpu_tracker_) cpu_tracker_->set_cap(0);
  if (device_.is_cuda()) {
    meter_.release_cached();
    meter_.set_cap(0);
  }
}

void Session::check_foreseen(const StepResult& r) const {
  if (foreseen_pixels_ <= 0) return;  // no auto plan applied
  const int64_t pixels = int64_t{r.batch} * r.frames * r.width * r.height;
  if (pixels > foreseen_pixels_)
    throw UserError("checkpoint_policy " + plan_.policy.to_string() + " chose " + applied_.to_string() +
                    " for steps of up to " + std::to_string(foreseen_pixels_) + " pixels (" +
                    plan_.largest.shape().describe() + " the largest); this step's bucket " + r.bucket + " x batch " +
                    std::to_string(r.batch) + " holds " + std::to_string(pixels) +
                    ", which the plan did not foresee. Give its dataset that resolution, or set the policy "
                    "yourself (full, or the plan above as modes:[...])");
}

void Session::choose_auto_plan(const std::optional<ckpt::CheckpointPolicy>& given) {
  if (given) {
    auto_choice_ = given;
    return;
  }
  const AutoPlan& chosen = *auto_model().estimate().auto_plan;
  auto_choice_ = chosen.chosen;
  log::info(describe_auto_plan(chosen));
}

const MemoryModel& Session::auto_model() {
  if (!auto_model_) {  // the memory model of this very plan, on the meta device, fitting the cap it measured
    RunPlan meta = plan_run(config_, PlanOptions{/*meta=*/true});
    meta.auto_cap_bytes = plan_.auto_cap_bytes, meta.auto_cap_source = plan_.auto_cap_source;
    log::QuietScope quiet;
    auto_model_ = std::make_unique<MemoryModel>(std::move(meta));
  }
  return *auto_model_;
}

ckpt::CheckpointPolicy Session::auto_choice_at(const ckpt::CheckpointPolicy& requested,
                                               const model::SampleShape& cell) {
  // The run's own decision at its largest cell under its own cap (a meta Session's at every cell: it walks for
  // the run); off on a meta Session until its memory model has decided.
  if (device_.is_meta() || (cell == plan_.largest.shape() && requested.to_string() == plan_.policy.to_string() &&
                            plan_.auto_cap_bytes == run_auto_cap_)) {
    if (!auto_choice_ && !device_.is_meta())
      throw std::logic_error("checkpoint policy auto is applied once the memory model has chosen its plan");
    return auto_choice_.value_or(ckpt::CheckpointPolicy::off());
  }
  const std::string key =
      requested.to_string() + " at " + cell.describe() + " under " + std::to_string(plan_.auto_cap_bytes);
  if (const auto it = auto_at_.find(key); it != auto_at_.end()) return it->second;
  const AutoPlan chosen = auto_model().auto_plan(requested, cell, plan_.auto_cap_bytes, plan_.auto_cap_source);
  log::info("at " + cell.describe() + ": " + describe_auto_plan(chosen));
  return auto_at_[key] = chosen.chosen;
}

void Session::apply_policy(const ckpt::CheckpointPolicy& policy, const model::SampleShape& cell) {
  foreseen_pixels_ = 0;
  if (policy.kind == ckpt::CheckpointPolicy::Kind::Auto) {
    applied_ = auto_choice_at(policy, cell);
    checkpointing_->apply(applied_);
    // The steps it was decided for: the run's cells at its largest (its own decision), else this cell.
    int64_t run = plan_.largest.shape().pixel_elements() / 3;
    for (const StepCell& c : plan_.cells)
      run = std::max(run, int64_t{c.batch} * c.frames * c.resolution * c.resolution);
    foreseen_pixels_ = cell == plan_.largest.shape() ? run : cell.pixel_elements() / 3;
    return;
  }
  if (policy.kind != ckpt::CheckpointPolicy::Kind::Budget) {
    try {
      checkpointing_->apply(policy);
    } catch (const std::invalid_argument& e) {  // modes:[...] written for another model
      throw UserError(e.what());
    }
    applied_ = policy;
    return;
  }
  // budget:BYTES from the walk: what each block keeps without and with checkpointing (its dequantized
  // weights included), in call order.
  const model::ActivationEstimate est = block_activations(cell);
  // Each expert's blocks against the budget on their own (a forward runs one expert's).
  const size_t experts = est.experts, per_expert = est.per_block.size() / std::max<size_t>(experts, 1);
  std::vector<int> blocks;
  for (size_t e = 0; e < experts; ++e) {
    std::vector<int64_t> kept, inputs;
    for (size_t i = e * per_expert; i < (e + 1) * per_expert; ++i)
      kept.push_back(est.per_block[i].saved), inputs.push_back(est.per_block[i].input);
    for (const int b : ckpt::select_blocks_for_budget(kept, inputs, policy.budget_bytes))
      blocks.push_back(b + static_cast<int>(e * per_expert));
  }
  applied_ = ckpt::CheckpointPolicy::only_blocks(blocks);
  checkpointing_->apply(applied_);
  log::info("checkpoint policy " + policy.to_string() + " at samples of " + cell.describe() + ": the walk finds " +
            std::to_string(est.total_off_bytes) + " bytes of block activations without checkpointing; applying " +
            applied_.to_string());
}

std::unique_ptr<Session> Session::walk_twin() const {
  log::QuietScope quiet;
  return std::make_unique<Session>(config_, SessionOptions{/*meta=*/true});
}

std::pair<int64_t, int64_t> Session::reference_size(const model::SampleShape& shape, bool at_image_size) const {
  if (at_image_size || !spec_.raw_references || !plan_.largest_raw_control)
    return model::training_reference_size(spec_, shape.width, shape.height, at_image_size);
  const int64_t target = config_.model.model_kwargs.match_target_res ? shape.width * shape.height : 0;
  const data::BucketResolution r =
      data::raw_reference_size({plan_.largest_raw_control->width, plan_.largest_raw_control->height},
                               spec_.reference_area, target)
          .cropped;
  return {r.width, r.height};
}

ModelCheckpointing::BlockProbe Session::probe_forward(const model::SampleShape& shape, int64_t text_tokens,
                                                      const std::function<int64_t()>& live, ckpt::BlockMode mode) {
  const model::StepTokens tokens = model::step_tokens(spec_, shape, text_tokens);
  const auto options = torch::TensorOptions().device(device_).dtype(plan_.compute_dtype);
  model::ModelInputs in = model_->example_inputs(shape, tokens.text, options);
  if (spec_.reference_tokens) {  // one control image, as the step's walk and the token count take it
    const auto [w, h] = reference_size(shape);
    in.reference_latents.push_back(torch::randn(model::latent_shape(spec_, {shape.batch, 1, h, w}), options));
  }
  in.bypass_guidance = model::training_bypasses_guidance(spec_, config_.train);
  // Offloaded Linears' ring slots fill as the blocks run: the rings' bytes, the step's walk's (walked.rings),
  // are not a block's.
  return checkpointing_->probe_blocks(
      in, [&] { return live() - nn::offload_buffer_bytes(*rings_); }, mode);
}

model::ActivationEstimate Session::probe_blocks(const model::SampleShape& shape, int64_t text_tokens,
                                                const std::function<int64_t()>& live) {
  const model::StepTokens tokens = model::step_tokens(spec_, shape, text_tokens);
  const auto probe = probe_forward(shape, text_tokens, live, ckpt::BlockMode::None);
  std::vector<model::BlockBytes> per_block;
  for (size_t i = 0; i < probe.kept_bytes.size(); ++i)
    per_block.push_back({probe.kept_bytes[i], probe.input_bytes[i], probe.forward_flops[i] - probe.adapter_flops[i]});
  return model::activation_estimate(std::move(per_block), tokens, model_->expert_count());
}

model::ActivationEstimate Session::block_activations(const model::SampleShape& shape, int64_t text_tokens) {
  if (!device_.is_meta()) return walk_twin()->block_activations(shape, text_tokens);
  memory::MetaCount count(plan_.cuda ? c10::kCUDA : c10::kCPU);
  model::ActivationEstimate est;
  memory::run_walk([&] { est = probe_blocks(shape, text_tokens, [&] { return count.live(); }); });
  return est;
}

model::BlockModeCosts Session::block_mode_costs(const model::SampleShape& shape, std::vector<ckpt::BlockMode> modes) {
  if (!device_.is_meta()) return walk_twin()->block_mode_costs(shape, std::move(modes));
  modes.erase(std::remove(modes.begin(), modes.end(), ckpt::BlockMode::None), modes.end());
  modes.insert(modes.begin(), ckpt::BlockMode::None);  // first: a checkpointed block keeps None's inputs
  model::BlockModeCosts out;
  out.experts = model_->expert_count();
  out.per_block.resize(model_->blocks().size());
  std::vector<int64_t> inputs;  // None's: what a checkpointed block keeps (activations_under's convention)
  for (const ckpt::BlockMode mode : modes) {
    memory::MetaCount count(plan_.cuda ? c10::kCUDA : c10::kCPU);
    ModelCheckpointing::BlockProbe probe;
    memory::run_walk([&] {
      probe = probe_forward(
          shape, 0, [&] { return count.live(); }, mode);
    });
    if (mode == ckpt::BlockMode::None) inputs = probe.input_bytes;
    for (size_t i = 0; i < probe.kept_bytes.size() && i < out.per_block.size(); ++i) {
      model::ModeCost& c = out.per_block[i][mode];
      c.kept = mode == ckpt::BlockMode::Full && i < inputs.size() ? inputs[i] : probe.kept_bytes[i];
      c.recomputed_flops = probe.recomputed_flops[i];
      c.recomputed_bytes = probe.recomputed_bytes[i];
    }
  }
  return out;
}

Session::BlockProbes Session::probe_block_activations() {
  transformer_at_first_use();
  const model::SampleShape largest = plan_.largest.shape();
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  const torch::Tensor rng = cpu.get_state();  // the probe's random inputs leave no trace
  model::ActivationEstimate measured = probe_blocks(largest, 0, [&] { return meter_.stats().live_bytes; });
  cpu.set_state(rng);
  return {std::move(measured), block_activations(largest)};
}

model::ModelInputs Session::conditioning(const std::vector<data::Caption>& captions) {
  model::ModelInputs in;
  const data::TextEmbedding e = text_->encode(captions);
  in.text = e.text;
  in.pooled = e.pooled;
  in.text_mask = e.mask;
  if (spec_.num_classes) {
    std::vector<int64_t> labels;
    for (const auto& c : captions) labels.push_back(data::class_label_for(c.text, spec_.num_classes));
    in.class_labels = torch::tensor(labels).to(device_);
  }
  return in;
}

std::vector<data::Caption> Session::captions_of(const data::LoadedBatch& lb) const {
  std::vector<data::Caption> out;
  for (size_t i = 0; i < lb.captions.size(); ++i) {
    if (fixed_caption_) {  // the one embedding precomputed before the encoder left
      out.push_back({*fixed_caption_, {}, {}, {}});
      continue;
    }
    data::Caption c{lb.captions[i], {}, {}, {}};
    if (i < lb.image_files.size()) c.image = lb.image_files[i];
    if (i < lb.control_files.size()) c.control_files = lb.control_files[i];
    if (i < lb.control_images.size()) c.control_images = lb.control_images[i];
    out.push_back(std::move(c));
  }
  return out;
}

// SDTrainer.py:2250-2264, before each micro-batch: after switch_boundary_every micro-batches, or on a stage
// that does not train, the next stage that does (wrapping around).
void Session::next_stage() {
  auto trains = [&](size_t s) {
    return std::find(trained_stages_.begin(), trained_stages_.end(), s) != trained_stages_.end();
  };
  if (steps_this_stage_ < config_.train.switch_boundary_every && trains(stage_)) return;
  do {
    steps_this_stage_ = 0;
    stage_ = (stage_ + 1) % spec_.expert_boundaries.size();
  } while (!trains(stage_));
}

namespace {

// randn_like(x) for the global batch of `ranks` x its batch, this rank's slice kept: drawn in x's own layout (its
// dimensions by stride, as randn_like fills its storage), so that with the batch outermost a rank's slice is the
// storage one process's draw gives those samples. One process: randn_like itself.
torch::Tensor global_randn_like(const torch::Tensor& x, int64_t ranks, int64_t first) {
  if (ranks == 1) return torch::randn_like(x);
  std::vector<int64_t> order(static_cast<size_t>(x.dim()));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x.stride(a) > x.stride(b); });
  if (order.front() != 0) std::iota(order.begin(), order.end(), 0);  // the batch not outermost: contiguous
  std::vector<int64_t> sizes, back(order.size());
  for (size_t i = 0; i < order.size(); ++i)
    sizes.push_back(x.size(order[i]) * (order[i] == 0 ? ranks : 1)),
        back[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  return torch::randn(sizes, x.options()).permute(back).narrow(0, first, x.size(0));
}

}  // namespace

MicroBatch Session::micro_batch(data::LoadedBatch lb) {
  encode(lb);  // nothing when train_step encoded it in the data phase
  MicroBatch mb;
  {
    auto scope = phase(Phase::text);
    mb.conditioning = conditioning(captions_of(lb));
  }
  mb.x0 = memory::to_device(lb.latents, device_);  // the loader's are host memory
  // SDTrainer trains a guidance-distilled model at guidance_embedding_scale = train.cfg_scale (1.0 unless
  // set), or without the guidance embedder at all (bypass_guidance_embedding, as the Flex examples set).
  // (FLUX.2-dev's class has no such switch: model::training_bypasses_guidance asks the family.)
  if (spec_.guidance_embed) {
    mb.conditioning.bypass_guidance = model::training_bypasses_guidance(spec_, config_.train);
    if (!mb.conditioning.bypass_guidance)
      mb.conditioning.guidance =
          torch::full({mb.x0.size(0)}, config_.train.cfg_scale, torch::TensorOptions().device(device_));
  }
  std::vector<torch::Tensor> controls;  // Flex.2: control latents for the channels beside the latents
  for (const auto& r : lb.references)
    (spec_.reference_tokens ? mb.conditioning.reference_latents : controls).push_back(memory::to_device(r, device_));
  const model::ModelFamily& family = model::family_of(spec_.family);
  if (family.controls_as_channels(spec_)) {  // Flex.2: the x0 copy in the compute dtype only where it is used
    // Its inpainting mask: the inpainting images' alpha, else the loss mask (flex2.py:385-388).
    const torch::Tensor& keep = lb.inpaint_alpha.defined() ? lb.inpaint_alpha : lb.loss_mask;
    mb.conditioning.condition_channels =
        family.training_condition(spec_, config_.model.model_kwargs, mb.x0.to(plan_.compute_dtype), controls,
                                  keep.defined() ? memory::to_device(keep, device_) : keep);
  }
  if (lb.loss_mask.defined())
    mb.loss_mask = loss_mask_multiplier(memory::to_device(lb.loss_mask, device_), mb.x0, plan_.compute_dtype);
  // Data parallelism: the global batch's draws, this rank's slice of them (the replicas draw as one process).
  const int64_t b = mb.x0.size(0), ranks = plan_.world.size, first = b * plan_.world.rank;
  auto mine = [&](const torch::Tensor& t) { return t.defined() ? t.narrow(0, first, b) : t; };
  mb.noise = global_randn_like(mb.x0, ranks, first);
  if (config_.train.noise_offset != 0) {  // one offset per sample and channel, over its frames and pixels
    std::vector<int64_t> per_channel(static_cast<size_t>(mb.x0.dim()), 1);
    per_channel[0] = mb.x0.size(0) * ranks, per_channel[1] = mb.x0.size(1);
    mb.noise = mb.noise + config_.train.noise_offset * mine(torch::randn(per_channel, mb.x0.options()));
  }
  std::optional<std::pair<double, double>> stage;  // a model of several experts: this stage's timesteps
  if (experts_) stage.emplace(stage_ == 0 ? 1.0 : spec_.expert_boundaries[stage_ - 1], spec_.expert_boundaries[stage_]);
  TimestepDraw draw = timesteps_.draw(
      b * ranks, plan_.family->shift_tokens(spec_, {1, lb.bucket.frames, lb.bucket.height, lb.bucket.width}), stage);
  draw.t = mine(draw.t), draw.weight = mine(draw.weight), draw.next_t = mine(draw.next_t);
  mb.t = draw.t.to(device_);
  mb.weight = draw.weight.to(device_);
  if (draw.next_t.defined()) mb.next_t = draw.next_t.to(device_);
  if (first_frame_on(lb.dataset)) {  // inside get_noise_prediction, after the noise (wan21_i2v.py:488-517)
    auto scope = phase(Phase::forward);
    condition_on_first_frame(mb.conditioning, {lb.first_frames, lb.first_frame_latents, lb.clips}, mb.x0,
                             encode_key(lb.index, 15));
  }
  return mb;
}

data::LoadedBatch Session::synthetic_batch(const model::SampleShape& shape) const {
  data::LoadedBatch lb;
  const int batch = static_cast<int>(shape.batch), width = static_cast<int>(shape.width),
            height = static_cast<int>(shape.height);
  lb.bucket = {width, height, static_cast<int>(shape.frames)};
  lb.clips = shape.frames > 1;
  lb.resolution = std::max(width, height);
  // A meta Session's batch is a walk's: meta tensors standing for the loader's host memory (meta_count.h).
  std::optional<memory::HostScope> host;
  if (device_.is_meta()) host.emplace();
  const auto o = torch::TensorOptions().device(device_.is_meta() ? torch::kMeta : torch::kCPU);
  const bool images = plan_.codec.autoencoder && !plan_.caches_latents;  // encoded in the step's data phase
  if (images)
    lb.images = torch::rand({shape.batch, 3, shape.frames, shape.height, shape.width}, o) * 2 - 1;
  else
    lb.latents = torch::randn(model::latent_shape(spec_, shape), o);
  if (!images && first_frame_on(lb.dataset)) {  // the latents given ready: the first frames beside them
    memory::HostScope host;
    if (first_frames_cached()) {  // as the walk's step takes them
      lb.first_frame_latents = torch::randn(model::latent_shape(spec_, {shape.batch, 1, shape.height, shape.width}), o);
    } else {
      lb.first_frames = torch::rand({shape.batch, 3, shape.height, shape.width}, o) * 2 - 1;
    }
  }
  std::string caption = "a photo";
  if (config_.sample && !config_.sample->samples.empty()) caption = config_.sample->samples.front().prompt;
  lb.captions.assign(static_cast<size_t>(batch), caption);
  // Control images as the loader gives them: an edit model's (one at least) at reference_area of the
  // batch's aspect, Flex.2's at the batch's own size when a dataset has control folders — one per folder of
  // the dataset with the most; encoded every step, cached latents or not.
  const bool channels = model::family_of(spec_.family).controls_as_channels(spec_);
  size_t references = spec_.reference_tokens ? 1 : 0;
  if (spec_.reference_tokens || channels)
    for (const auto& d : config_.datasets) references = std::max(references, d.control_path.size());
  const auto [ref_width, ref_height] = reference_size({batch, 1, height, width}, channels);
  const bool text_reads = model::text_reads_controls(spec_);
  if (text_reads) lb.control_images.resize(static_cast<size_t>(batch));
  for (size_t r = 0; r < references; ++r) {
    const torch::Tensor control = torch::rand({batch, 3, ref_height, ref_width}, o);
    if (plan_.codec.autoencoder)
      lb.reference_images.push_back((control * 2 - 1).unsqueeze(2));
    else
      lb.references.push_back(torch::randn(model::latent_shape(spec_, {batch, 1, ref_height, ref_width}), o));
    if (text_reads)  // the text encoder reads them too
      for (int i = 0; i < batch; ++i) lb.control_images[static_cast<size_t>(i)].push_back(control[i]);
  }
  return lb;
}

Session::InputWalk Session::walk_inputs(const model::SampleShape& shape) {
  if (!device_.is_meta()) return walk_twin()->walk_inputs(shape);
  // Walked once per shape: the memory model asks again for every logged step of a run.
  const std::array<int64_t, 4> key{shape.batch, shape.frames, shape.height, shape.width};
  if (const auto it = input_walks_.find(key); it != input_walks_.end()) return it->second;
  data::LoadedBatch lb = synthetic_batch(shape);
  const bool offloaded = codec_ && codec_->offloaded();  // encode brings it back: put back as it was
  InputWalk w;
  {
    memory::MetaCount count(plan_.cuda ? c10::kCUDA : c10::kCPU);
    memory::run_walk([&] { encode(lb); });
    w.data = count.peak();
    w.held = count.live();
  }
  for (const auto& r : lb.references) {
    if (!memory::is_host_memory(r)) w.references += static_cast<int64_t>(r.nbytes());  // encoded on the device
    w.reference_shapes.push_back(r.sizes().vec());
  }
  if (offloaded) codec_->offload();
  return input_walks_.emplace(key, std::move(w)).first->second;
}

int64_t Session::walk_latent_fill(const model::SampleShape& sample) {
  if (!device_.is_meta()) return walk_twin()->walk_latent_fill(sample);
  torch::Tensor images;
  {
    memory::HostScope host;
    images = torch::empty({sample.batch, 3, sample.frames, sample.height, sample.width},
                          torch::TensorOptions().device(torch::kMeta));
  }
  // As cache_latents: the autoencoder, off the device before the fill, comes back for its first encode; each
  // sample's latents go to host memory.
  const bool resident = !codec().offloaded();
  codec().offload();
  const int64_t peak =
      memory::inference_peak(plan_.cuda ? c10::kCUDA : c10::kCPU, [&] { memory::to_host(codec().encode(images)); });
  if (resident)
    codec().restore();
  else
    codec().offload();
  return peak;
}

StepResult Session::train_step(int64_t step, const std::function<data::LoadedBatch()>& next) {
  const config::TrainConfig& tc = config_.train;
  StepOptions so;
  // AI Toolkit's gradient_accumulation sums the micro-batches' gradients: SDTrainer.hook_train_loop zeroes
  // the gradients, calls backward on each micro-batch's loss as it is, then steps once (the legacy
  // gradient_accumulation_steps: only on its every-Nth steps, with that step's gradient).
  zero_grad();
  so.loss_type = tc.loss_type;
  so.dtype = plan_.compute_dtype;
  bool epoch_start = false;
  StepResult r;
  r.before_first_update = optimizer_->steps() == 0;
  std::vector<torch::Tensor> losses;
  for (int micro = 0; micro < accumulation(); ++micro) {
    const auto t_wait = std::chrono::steady_clock::now();
    data::LoadedBatch lb;
    {
      auto scope = phase(Phase::data);
      lb = next();
      r.data_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_wait).count();
      encode(lb);
    }
    epoch_start = epoch_start || lb.epoch_start;
    r.epoch = epoch_ = lb.epoch;
    // An is_reg dataset's loss weighs reg_weight (SDTrainer.py:1455-1459: loss_multiplier per item).
    const auto d = static_cast<size_t>(lb.dataset);
    const bool reg = d < config_.datasets.size() && config_.datasets[d].is_reg;
    r.bucket = current_bucket_ = lb.bucket.key();
    r.frames = lb.bucket.frames, r.width = lb.bucket.width, r.height = lb.bucket.height;
    r.batch = current_batch_ = static_cast<int>(lb.latents.size(0));
    check_foreseen(r);
    r.captions = captions_of(lb);
    if (experts_) next_stage();
    for (auto& c : r.captions)
      for (auto& image : c.control_images) image = torch::empty(image.sizes(), image.options().device(torch::kMeta));
    const MicroBatch mb = micro_batch(std::move(lb));
    if (mb.conditioning.text.defined()) r.text_tokens = std::max<int64_t>(r.text_tokens, mb.conditioning.text.size(1));
    torch::Tensor loss;
    {
      auto scope = phase(Phase::forward);
      transformer_at_first_use();
      loss = flow_matching_loss(*model_, mb, so);
      // The dataset's loss_multiplier weighs each item's loss before the batch's mean (SDTrainer.py:544,
      // 994); a batch is one dataset's, so it weighs the mean.
      if (d < config_.datasets.size() && config_.datasets[d].loss_multiplier != 1.0)
        loss = loss * config_.datasets[d].loss_multiplier;
      if (reg && tc.reg_weight != 1.0) loss = loss * tc.reg_weight;
    }
    ++steps_this_stage_;
    if (experts_ && !loss.requires_grad())
      throw UserError("step " + std::to_string(step) + ": this micro-batch's mean timestep (" +
                      std::to_string(mb.t.to(torch::kCPU).to(torch::kDouble).mean().item<double>() * 1000) + ") runs " +
                      model::expert_name(experts_->active()) +
                      ", which does not train (model.model_kwargs): on a shifted or sigmoid timestep grid a "
                      "stage's first point can lie just above its boundary, and that draw runs the expert before "
                      "it — AI Toolkit fails on it the same way (BaseSDTrainProcess.py:1230-1245). Use "
                      "train.timestep_type: linear, or train every expert");
    // A non-finite loss gives this micro-batch no gradient (SDTrainer.py:2221-2224: the loss replaced by a
    // zero leaf, so its backward reaches no parameter).
    if (!finite_everywhere(loss)) {
      ++r.nonfinite;
      continue;
    }
    // Data parallelism: the last micro-batch's backward of an updating step averages the buckets as it fills
    // them (a stochastic accumulation adds the earlier gradients after it: then averaged after the backward).
    if (reducer_ && micro == accumulation() - 1 && tc.optimizer_steps_at(step, epoch_start) &&
        !(micro > 0 && optimizer_->accumulates_stochastically()))
      reducer_->arm();
    {
      auto scope = phase(Phase::backward);
      if (micro > 0 && optimizer_->accumulates_stochastically()) {
        std::vector<torch::Tensor> aside = optimizer_->set_gradients_aside();
        loss.backward();
        optimizer_->accumulate(std::move(aside));
      } else {
        loss.backward();
      }
    }
    losses.push_back(loss.detach());
  }
  r.lr = scheduled_lr(tc.lr_scheduler, tc.lr_scheduler_params, optimizer_lr(tc.optimizer, tc.lr),
                      step - skipped_scheduler_steps_, tc.steps);
  r.updated = tc.optimizer_steps_at(step, epoch_start);
  r.loss = losses.empty() ? std::nan("") : torch::stack(losses).mean().item<double>();
  // The ranks' mean (one process's loss over the global batch), before the update: a rank lost now leaves every
  // other's weights at the last good step.
  if (group_ && !losses.empty()) r.loss = group_->sum({r.loss}, "the step's loss")[0] / plan_.world.size;
  update(r, !losses.empty());
  return r;
}

void Session::update(StepResult& r, bool any_gradient) {
  const config::TrainConfig& tc = config_.train;
  if (reducer_ && r.updated) {
    auto scope = phase(Phase::backward);  // the buckets' averages, waited for (and those not started yet)
    r.buckets_started_in_backward = reducer_->started_during_backward();
    const auto t0 = std::chrono::steady_clock::now();
    reducer_->finish();
    r.reduce_wait_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  for (const auto& [n, p] : trained_)
    if (p.grad().defined()) r.gradient_bytes += static_cast<int64_t>(p.grad().nbytes());
  if (!r.updated) return;
  auto scope = phase(Phase::optimizer);
  // Under ZeRO-1 the rank's own tensors, the norm summed over the ranks (each rank's share of the clip).
  std::vector<torch::Tensor> params;
  for (size_t i = 0; i < trained_.size(); ++i)
    if (!shards_optimizer() || owners_[i] == plan_.world.rank) params.push_back(trained_[i].second);
  std::function<double(double)> total;
  if (group_ && shards_optimizer())
    total = [this](double mine) { return group_->sum({mine}, "the gradients' norm")[0]; };
  // Without a gradient (every micro-batch's loss non-finite) the optimizer updates nothing: torch's
  // optimizers skip parameters whose .grad is None. The EMA is still updated, as hook_train_loop does.
  if (any_gradient) {
    // hook_train_loop clips for every optimizer but Adafactor (the norm is still measured for the log).
    r.grad_norm = clip_grad_norm(
        params,
        tc.optimizer == config::OptimizerKind::adafactor ? std::nullopt : std::optional<double>(tc.max_grad_norm),
        total);
    optimizer_->step(r.lr);
  }
  gather_updated_weights();
  zero_grad();
  update_ema();
}

void Session::gather_updated_weights() {
  if (!shards_optimizer()) return;
  std::vector<torch::Tensor> tensors;
  for (const auto& [n, p] : trained_) tensors.push_back(p);
  if (group_)
    group_->broadcast_from_owners(tensors, owners_, "gathering the updated weights");
  else  // its buffers, as the memory model walks them (and bench / fit, one rank of a world, hold them)
    dist::broadcast_from_owners(tensors, owners_, plan_.world.rank, plan_.world.size, [](at::Tensor&, int) {});
}

void Session::zero_grad() {
  optimizer_->zero_grad();
  if (shards_optimizer())
    for (auto& [n, p] : trained_) p.mutable_grad() = torch::Tensor();
}

std::vector<std::pair<std::string, torch::Tensor>> Session::optimizer_state() const {
  return shards_optimizer() ? gathered_state_ : optimizer_->state();
}

void Session::gather_optimizer_state() {
  if (!group_ || !shards_optimizer()) return;
  const std::vector<std::string> blobs =
      group_->gather_to_rank0(io::serialize_safetensors(optimizer_->state()), "gathering the optimizer's state");
  gathered_state_.clear();
  std::set<std::string> seen;  // the counts every rank has ("step") once
  for (size_t r = 0; r < blobs.size(); ++r)
    for (const auto& [name, t] : io::SafetensorsFile::from_bytes(blobs[r], "rank " + std::to_string(r)).tensors())
      if (seen.insert(name).second) gathered_state_.emplace_back(name, t.clone());
}

bool Session::finite_everywhere(const torch::Tensor& loss) {
  const bool finite = torch::isfinite(loss).all().item<bool>();
  return group_ ? !group_->any(!finite, "whether the losses are finite") : finite;
}

std::vector<fs::path> Session::sample(int64_t step, const fs::path& dir) { return sample(step, dir, {}); }

std::vector<fs::path> Session::sample(int64_t step, const fs::path& dir, const PreviewSettings& settings) {
  std::vector<fs::path> files;
  if (plan_.previews.empty()) return files;
  auto scope = phase(Phase::sample);
  transformer_at_first_use();
  if (first_frame_) first_frame_encoder_to_host();
  // AI Toolkit previews with the EMA weights when EMA is on (BaseSDTrainProcess.sample: ema.eval() swaps
  // them in, ema.train() back).
  // The assistant adapter inverted while sampling: on the device, multiplier -1; off and in host memory after.
  model::set_assistant_adapters(*model_, -1.0, [&](const torch::Tensor& t) { return memory::to_device(t, device_); });
  with_ema_weights([&] { files = sample_previews(step, dir, settings); });
  model::set_assistant_adapters(*model_, 0.0, [](const torch::Tensor& t) { return memory::to_host(t); });
  return files;
}

sample::SampleOptions Session::preview_options(size_t i, const PreviewSettings& settings) const {
  const auto& sc = *config_.sample;
  const auto& item = plan_.previews.at(i);
  const int d = spec_.preview_divisibility;
  sample::SampleOptions so;
  so.height = settings.height.value_or(item.height.value_or(sc.height)) / d * d;
  so.width = settings.width.value_or(item.width.value_or(sc.width)) / d * d;
  so.frames = plan_.family->preview_frames(spec_, config_.model, item.num_frames.value_or(sc.num_frames));
  so.steps = settings.steps.value_or(item.sample_steps.value_or(sc.sample_steps));
  so.guidance_scale = item.guidance_scale.value_or(sc.guidance_scale);
  so.seed = sc.seeds().at(i);
  so.dtype = plan_.compute_dtype;
  so.guidance = plan_.family->preview_guidance(spec_, sc.do_cfg_norm);
  return so;
}

std::vector<fs::path> Session::sample_previews(int64_t step, const fs::path& dir, const PreviewSettings& settings) {
  std::vector<fs::path> files;
  const auto& sc = *config_.sample;
  for (size_t i = 0; i < plan_.previews.size(); ++i) {
    const auto& item = plan_.previews[i];
    const sample::SampleOptions so = preview_options(i, settings);
    const std::vector<fs::path>& controls = plan_.preview_controls.at(i);
    // Each prompt with its control images, as the edit pipelines encode it.
    const std::vector<fs::path> read = spec_.reference_tokens ? controls : std::vector<fs::path>{};
    if (text_->encoder()) current_activity_ = Activity::text_encode;  // not cached: encoded here
    auto cond = conditioning({data::Caption{item.prompt, read, {}, {}}});
    auto uncond = conditioning({data::Caption{item.neg.value_or(sc.neg), read, {}, {}}});
    current_activity_ = Activity::model;
    preview_controls(i, so, cond, uncond);
    // The item's network_multiplier on every adapter while it denoises (stable_diffusion_model.py:1440-1441:
    // network.multiplier = gen_config.network_multiplier), 1 again after, however the sampling ends.
    torch::Tensor z;
    {
      struct Multiplier {
        model::DiffusionTransformer& m;
        ~Multiplier() { model::set_lora_multiplier(m, 1.0); }
      } restore{*model_};
      model::set_lora_multiplier(*model_, item.network_multiplier.value_or(sc.network_multiplier));
      z = sample::euler_sample(*model_, cond, uncond, so);
    }
    experts_to_host();  // Wan22Pipeline under low_vram: "unload transformer" before the decode (:276-280)
    const torch::Tensor frames = decode_preview(z);
    if (dir.empty()) continue;  // fit: the preview's memory, not its picture
    // sample.format: AI Toolkit's ext (config_modules.py:93, jpg by default) on the file it saves — the first
    // frame's; several frames also as an animated WebP beside it at the item's fps (AI Toolkit saves video
    // previews as animated WebP, config_modules.py:98-102) and as an MP4 (H.264) that players and report.html
    // play.
    const std::string stem = config_.name + "_" + step_tag(step) + "_" + std::to_string(i);
    const fs::path file = dir / (stem + "." + config_.sample->format);
    data::write_image(file, frames[0]);
    files.push_back(file);
    if (frames.size(0) > 1) {
      const fs::path animation = dir / (stem + "_frames.webp");
      data::write_animated_webp(animation, frames, item.fps.value_or(sc.fps));
      files.push_back(animation);
      // Without libgclab_video.so (FFmpeg) the MP4 is left out, with a warning: the run goes on.
      const fs::path video = dir / (stem + "_frames.mp4");
      try {
        data::write_video(video, frames, item.fps.value_or(sc.fps));
        files.push_back(video);
      } catch (const data::VideoError& e) {
        log::warn(std::string("preview: no MP4 beside the animated WebP: ") + e.what());
      }
    }
  }
  return files;
}

namespace {

// The autoencoder on the device for a preview's encode or decode, and back where it was after (AI Toolkit
// restores the device state it found).
struct CodecOnDevice {
  vae::ImageCodec& codec;
  bool was_offloaded;
  explicit CodecOnDevice(vae::ImageCodec& c) : codec(c), was_offloaded(c.offloaded()) { c.restore(); }
  ~CodecOnDevice() {
    if (was_offloaded) codec.offload();
  }
  CodecOnDevice(const CodecOnDevice&) = delete;
  CodecOnDevice& operator=(const CodecOnDevice&) = delete;
};

}  // namespace

void Session::preview_controls(size_t i, const sample::SampleOptions& so, model::ModelInputs& cond,
                               model::ModelInputs& uncond) {
  const std::vector<fs::path>& controls = plan_.preview_controls.at(i);
  cond.reference_latents = uncond.reference_latents = preview_references(controls, so.width, so.height);
  if (first_frame_) {  // an image-to-video model's first frame (checked when planned)
    first_frame_encoder_to_device();
    current_activity_ = Activity::first_frame;
    CodecOnDevice on_device(codec());
    first_frame_->preview_condition(
        cond, controls.empty() ? fs::path() : controls.front(),
        model::latent_shape(spec_, {1, so.frames, so.height, so.width}),
        [&](const torch::Tensor& v) { return codec().encode_mean(v).to(device_); },
        [&](const torch::Tensor& v) { return codec().encode(v, plan_.seed + i).to(device_); });
    uncond.image_embeds = cond.image_embeds, uncond.condition_channels = cond.condition_channels;
    uncond.clean_latent_frames = cond.clean_latent_frames, uncond.per_token_timesteps = cond.per_token_timesteps;
    current_activity_ = Activity::model;
    first_frame_encoder_to_host();  // AggressiveWanI2VUnloadPipeline: image_encoder.to('cpu') after (low_vram)
  } else if (!spec_.reference_tokens && !controls.empty())  // Flex.2: its ctrl_img as the channels beside the latents
    cond.condition_channels = uncond.condition_channels =
        preview_condition(controls.front(), plan_.previews[i].ctrl_idx.value_or(0), so.width, so.height);
}

int64_t Session::walk_preview_decode(const model::SampleShape& shape) {
  if (!device_.is_meta()) return walk_twin()->walk_preview_decode(shape);
  CodecOnDevice on_device(codec());  // its weights are the preview's own term (PreviewEstimate::total_bytes)
  const torch::Tensor z = torch::empty(model::latent_shape(spec_, shape), torch::TensorOptions(device_));
  return memory::inference_peak(plan_.cuda ? c10::kCUDA : c10::kCPU, [&] { decode_preview(z); });
}

int64_t Session::walk_preview_controls(size_t i) {
  if (!device_.is_meta()) return walk_twin()->walk_preview_controls(i);
  CodecOnDevice on_device(codec());
  const sample::SampleOptions so = preview_options(i);
  model::ModelInputs cond, uncond;
  return memory::inference_peak(plan_.cuda ? c10::kCUDA : c10::kCPU, [&] { preview_controls(i, so, cond, uncond); });
}

model::ModelInputs Session::walk_preview_first_frame(size_t i) {
  if (!device_.is_meta()) return walk_twin()->walk_preview_first_frame(i);
  model::ModelInputs cond, uncond;
  if (!first_frame_) return cond;
  CodecOnDevice on_device(codec());
  memory::run_walk([&] { preview_controls(i, preview_options(i), cond, uncond); });
  return cond;
}

torch::Tensor Session::decode_preview(const torch::Tensor& z) {
  // The decode runs on top of what the training step left resident; then the uint8 image.
  current_activity_ = Activity::vae_decode;
  CodecOnDevice on_device(codec());
  torch::Tensor frames = data::to_rgb_uint8(codec().decode(z)[0]);  // [3, F, H, W] -> [F, H, W, 3]
  current_activity_ = Activity::model;
  return frames;
}

std::vector<torch::Tensor> Session::preview_references(const std::vector<fs::path>& controls, int width, int height) {
  // An edit model's preview conditions on its control images as the pipelines do: each encoded at a
  // 1024² area (QwenImageEditPipeline's calculate_dimensions, the Plus pipeline's VAE_IMAGE_SIZE) or the
  // preview's size (FluxKontextPipeline) and appended as reference tokens, the posterior's mean (the
  // pipelines' retrieve_latents with sample_mode "argmax").
  std::vector<torch::Tensor> out;
  if (!spec_.reference_tokens || controls.empty() || !codec_) return out;
  current_activity_ = Activity::vae_encode;
  CodecOnDevice on_device(codec());
  for (const auto& f : controls) {
    if (!fs::is_regular_file(f)) continue;  // checked when the session started; a file gone since is skipped
    torch::NoGradGuard no_grad;
    torch::Tensor image;
    {
      memory::HostScope host;  // read in host memory, as a GPU run's pipeline does: the encode copies it
      image = load_preview_reference(spec_, f, width, height).unsqueeze(0).unsqueeze(2);
    }
    out.push_back(codec().encode_mean(image).to(device_));
  }
  current_activity_ = Activity::model;
  return out;
}

torch::Tensor Session::preview_condition(const fs::path& control, int index, int width, int height) {
  if (!codec_) return {};
  current_activity_ = Activity::vae_encode;
  CodecOnDevice on_device(codec());
  torch::Tensor out = plan_.family->preview_condition(
      spec_, control, index, width, height,
      [&](const torch::Tensor& x) { return codec().encode(x.unsqueeze(2)).to(device_); });  // one frame
  current_activity_ = Activity::model;
  return out;
}

void Session::precompute_text(const std::vector<std::string>& captions) {
  std::vector<data::Caption> c;
  for (const auto& t : captions) c.push_back({t, {}, {}, {}});
  precompute_text(c);
}

std::vector<data::Caption> Session::precomputed_captions(const std::vector<data::Caption>& captions) const {
  if (!text_encoder_leaves(config_)) return {};
  // Without cached captions, unload_text_encoder trains every step on the trigger word's embedding.
  std::vector<data::Caption> all =
      run_caches_text(config_) ? captions : std::vector<data::Caption>{{config_.trigger_word.value_or(""), {}, {}, {}}};
  all.push_back({"", {}, {}, {}});
  for (size_t i = 0; i < plan_.previews.size(); ++i) {
    all.push_back({plan_.previews[i].prompt, plan_.preview_controls[i], {}, {}});
    all.push_back({plan_.previews[i].neg.value_or(config_.sample->neg), plan_.preview_controls[i], {}, {}});
  }
  return all;
}

void Session::precompute_text(const std::vector<data::Caption>& captions) {
  if (!text_encoder_leaves(config_)) return;
  const bool caching = run_caches_text(config_);
  if (!caching) {
    // AI Toolkit (BaseSDTrainProcess.run): without cached captions, unload_text_encoder encodes the empty
    // prompt and the trigger word once, unloads the encoder, and trains every step on the trigger word's
    // embedding (the empty prompt's without one) — "This will train only with a blank prompt or trigger
    // word, if set".
    fixed_caption_ = config_.trigger_word.value_or("");
    log::warn(
        "train.unload_text_encoder without cache_text_embeddings: as in AI Toolkit, every step trains on " +
        (config_.trigger_word ? "the trigger word '" + *config_.trigger_word + "'" : std::string("the empty prompt")) +
        ", not on the captions");
  }
  // Cached captions: the cache phase from the first encode the encoder runs (a caption already in
  // _t_e_cache/ needs none) — the captions (dataloader_mixins.py:2311-2315, whose restore is commented out:
  // 2407-2409), then the blank, trigger and sample prompts SDTrainer.hook_before_train_loop encodes with the
  // transformer still off (SDTrainer.py:296-298, 357-378) — and the encoder unloaded; the transformer comes
  // back for the steps (BaseSDTrainProcess.py:2514). Without caching, the trigger word and the prompts are
  // encoded with everything where it is.
  std::optional<memory::PhaseMeter::Scope> scope;
  if (caching) text_->before_first_encode([&] { start_fill(CacheFill::text, scope); });
  for (const auto& c : precomputed_captions(captions)) text_->encode(std::vector<data::Caption>{c});
  text_->before_first_encode(nullptr);
  text_->unload();
  scope.reset();
  current_activity_ = Activity::model;
  unpark();
}

ResidentBytes Session::resident() const {
  ResidentBytes r;
  r.weights = nn::module_bytes(*model_);
  // Offloaded Linears keep their weights in host memory, and so do the experts that do not run (low_vram).
  r.host_weights = nn::offloaded_bytes(*model_) + experts_in_host_bytes();
  r.weights -= r.host_weights;
  // While a cache fills, what it took off the device.
  if (parked_) r.weights -= Parked::bytes(parked_->transformer);
  for (const auto& [n, p] : trained_) {
    r.trained += static_cast<int64_t>(p.nbytes());
    if (p.grad().defined()) r.gradients += static_cast<int64_t>(p.grad().nbytes());
  }
  r.optimizer = optimizer_->state_bytes();
  for (const auto& [n, e] : ema_) r.ema += static_cast<int64_t>(e.nbytes());
  r.text_encoder = text_->encoder_bytes() - (parked_ ? Parked::bytes(parked_->text_encoders) : 0);
  if (text::PromptEncoder* prompts = text_->encoder())
    for (size_t i = 0; i < prompts->slots(); ++i) {
      const int64_t host = nn::offloaded_bytes(prompts->encoder(i));
      r.text_encoder -= host;
      r.text_encoder_host += host;
    }
  r.offload_buffers = nn::offload_buffer_bytes(*rings_);
  if (!plan_.world.alone()) {  // held from the Session's start (the reducer's), predicted alike on the meta device
    std::vector<torch::Tensor> tensors;
    for (const auto& [n, p] : trained_) tensors.push_back(p);
    r.gradient_buckets = dist::GradientReducer::buffer_bytes(tensors);
  }
  r.text_cache_host = text_->cache_bytes();
  r.vae = codec_ ? codec_->resident_bytes() : plan_.vae_in_steps ? plan_.codec.weight_bytes() : 0;
  if (first_frame_ && first_frame_->image_encoder() && !first_frame_parked_)
    r.image_encoder = nn::module_bytes(*first_frame_->image_encoder());
  return r;
}

double Session::trained_fingerprint() const {
  torch::NoGradGuard no_grad;
  double sum = 0;
  for (const auto& [n, p] : trained_) {
    const torch::Tensor d = p.detach().to(torch::kDouble);
    sum += d.sum().item<double>() + d.square().sum().item<double>();
  }
  return sum;
}

void Session::with_ema_weights(const std::function<void()>& fn) {
  if (ema_.empty()) return fn();
  std::map<std::string, torch::Tensor> live;
  {
    torch::NoGradGuard no_grad;
    for (auto& [n, p] : trained_) live[n] = p.detach().clone(), p.copy_(ema_.at(n));
  }
  // The live weights come back however fn ends (a preview that runs out of memory included).
  struct Restore {
    std::vector<std::pair<std::string, torch::Tensor>>& trained;
    std::map<std::string, torch::Tensor>& live;
    ~Restore() {
      torch::NoGradGuard no_grad;
      for (auto& [n, p] : trained) p.copy_(live.at(n));
    }
  } restore{trained_, live};
  fn();
}

void Session::update_ema() {
  if (ema_.empty()) return;
  torch::NoGradGuard no_grad;
  const config::EmaConfig& ec = config_.train.ema_config;
  const double one_minus_decay = 1.0 - ec.ema_decay;
  for (auto& [n, p] : trained_) {
    torch::Tensor& shadow = ema_.at(n);
    // .to(kFloat) is the tensor itself when it is float32, as .float() is there: updated in place.
    torch::Tensor s = shadow.to(torch::kFloat), param = p.to(torch::kFloat);
    const torch::Tensor tmp = (s - param).mul_(one_minus_decay);
    s.sub_(tmp);
    bool update_param = false;
    if (ec.use_feedback) param.add_(tmp * 10), update_param = true;
    if (ec.param_multiplier != 1.0) param.mul_(ec.param_multiplier), update_param = true;
    if (shadow.scalar_type() != torch::kFloat) copy_stochastic(shadow, s);
    if (update_param && p.scalar_type() != torch::kFloat) copy_stochastic(p, param);
  }
}

}  // namespace gclab::train
