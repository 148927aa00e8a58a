// A training session: everything a run holds, built once by executing a plan (train/plan.h: plan_run
// resolves the validated config first) — the device, the memory meter and its cap, the model (LoRA /
// quantized as configured) with its checkpoint policy, the optimizer, EMA, the text encoder and its
// embedding cache, the autoencoder and the preview settings — and the one training step. `gclab train`,
// `bench`, `fit` and `estimate` all build a Session, so they run (or count) exactly the same step. What
// it sets process-wide (the host cap, the offload rings) goes back when it ends.
#pragma once

#include <array>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gclab/ckpt/policy.h"
#include "gclab/config/config.h"
#include "gclab/config/user_error.h"
#include "gclab/data/conditioner.h"
#include "gclab/data/loader.h"
#include "gclab/dist/process_group.h"
#include "gclab/dist/reducer.h"
#include "gclab/memory/meta_count.h"
#include "gclab/memory/tracker.h"
#include "gclab/model/activations.h"
#include "gclab/model/experts.h"
#include "gclab/model/lora.h"
#include "gclab/sample/sampler.h"
#include "gclab/train/checkpointing.h"
#include "gclab/train/flow.h"
#include "gclab/train/loading.h"
#include "gclab/train/offload.h"
#include "gclab/train/optimizer.h"
#include "gclab/train/phase.h"
#include "gclab/train/plan.h"
#include "gclab/train/timesteps.h"
#include "gclab/vae/codec.h"

namespace gclab::train {

// The device's peak while the model loads as the config says (LoadMemory's walk), from a Session built on
// the meta device.
int64_t predicted_load_peak(const config::ProcessConfig& config);

struct SessionOptions {
  // Build on the meta device: shapes and byte counts, no memory and no data (train --dry-run, estimate).
  bool meta = false;
  // Stop after the load (the transformer and the text encoders, as the arch's loader takes them): what
  // predict_load walks.
  bool load_only = false;
  // checkpoint_policy auto: the plan the caller's memory model of this run chose (train's: the one it writes
  // beside what it measures); none: a Session on a device builds the memory model and takes its choice.
  std::optional<ckpt::CheckpointPolicy> auto_choice = std::nullopt;
  // Data parallelism: the joined group of the plan's world (nullptr: one process). The steps then agree on
  // non-finite losses, average the gradients (a dist::GradientReducer, overlapped with the last micro-batch's
  // backward) and report the ranks' mean loss.
  dist::ProcessGroup* group = nullptr;
};

// Bytes held outside the step's activations, by what holds them.
struct ResidentBytes {
  int64_t weights = 0;           // parameters and buffers as stored (frozen base + trained tensors)
  int64_t trained = 0;           // of which trained (LoRA adapters, or every weight)
  int64_t gradients = 0;         // one gradient per trained tensor, in its dtype
  int64_t optimizer = 0;         // the optimizer's state (after its first step)
  int64_t ema = 0;               // the EMA copy of the trained tensors
  int64_t text_encoder = 0;      // while loaded
  int64_t vae = 0;               // the autoencoder's weights while on the device
  int64_t image_encoder = 0;     // an image-to-video model's image encoder while on the device (CLIP's)
  int64_t offload_buffers = 0;   // the offloaded Linears' ring slots (weights brought to the device, kept)
  int64_t gradient_buckets = 0;  // data parallelism: the gradient reducer's buckets (dist::GradientReducer)
  int64_t total() const {
    return weights + gradients + optimizer + ema + text_encoder + vae + image_encoder + offload_buffers +
           gradient_buckets;
  }
  // In host memory, not in total():
  int64_t text_cache_host = 0;    // precomputed embeddings (cache_text_embeddings)
  int64_t host_weights = 0;       // the transformer's offloaded Linears' weights (model.layer_offloading)
  int64_t text_encoder_host = 0;  // the text encoders' offloaded Linears' weights, while they are loaded
  int64_t host() const { return text_cache_host + host_weights + text_encoder_host; }
};

struct StepResult {
  double loss = 0, grad_norm = 0;
  double lr = 0;        // the learning rate the update used
  bool updated = true;  // false on a legacy gradient_accumulation_steps step that only accumulates
  // No update before this step: the optimizer's state did not exist yet during its forward and backward.
  bool before_first_update = false;
  int64_t epoch = 0;   // the last micro-batch's epoch (0 first)
  std::string bucket;  // the step's batches' bucket key (WxH, WxHxFf)
  int batch = 0;
  int frames = 1, width = 0, height = 0;  // the bucket's: frames, and pixels
  int64_t text_tokens = 0;                // the conditioning's text sequence (the longest micro-batch's)
  // The last micro-batch's captions as the text phase encodes them, their control images as shapes only
  // (meta tensors): what the memory model predicts the step's text phase from.
  std::vector<data::Caption> captions;
  double data_wait_s = 0;
  int64_t gradient_bytes = 0;  // held just before the update
  // Data parallelism: the gradient buckets whose average started during the backward (of the reducer's), and the
  // time the step then waited for the averages to finish.
  int buckets_started_in_backward = 0;
  double reduce_wait_s = 0;
  // Micro-batches whose loss was not finite: no backward, no gradient (AI Toolkit's zero leaf); when every
  // micro-batch's was, no update either (`loss` is then NaN).
  int nonfinite = 0;
  bool all_nonfinite() const { return nonfinite > 0 && loss != loss; }
};

class MemoryModel;

class Session {
 public:
  // Throws UserError for a setting this machine cannot run (a CUDA device without one, a full-size model
  // that cannot fit host memory).
  explicit Session(const config::ProcessConfig& config, const SessionOptions& options = {});
  // Executes a plan (plan_run): the load in its order, the network, the autoencoder, the policy, the optimizer.
  explicit Session(RunPlan plan, const SessionOptions& options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const RunPlan& plan() const { return plan_; }
  const config::ProcessConfig& config() const { return config_; }
  const model::ModelSpec& spec() const { return spec_; }
  torch::Device device() const { return device_; }
  bool bf16() const { return config_.train.dtype == config::DType::bf16; }
  int accumulation() const { return config_.train.accumulation(); }
  // A step skipped out of memory: AI Toolkit's LR scheduler did not step for it (hook_train_loop raised
  // before lr_scheduler.step()), so the later steps' learning rates lag by one (not kept in the state: AI
  // Toolkit's resume fast-forwards the scheduler to the step, forgetting the lag too).
  void skip_scheduler_step() { ++skipped_scheduler_steps_; }

  // Memory: the meter, the per-phase peaks of the current step, and the phase now running.
  memory::MemoryMeter& meter() { return meter_; }
  memory::PhaseMeter& phases() { return phases_; }
  memory::PhaseMeter::Scope phase(Phase phase);
  Phase current_phase() const { return current_phase_; }
  // What runs inside the phase: the autoencoder's encode / decode, or the model.
  Activity current_activity() const { return current_activity_; }
  // The bucket (WxH) and batch size of the micro-batch being trained on (for the OOM report).
  const std::string& current_bucket() const { return current_bucket_; }
  int current_batch() const { return current_batch_; }
  // The epoch of the last batch trained on (0 first; AI Toolkit's epoch_num), for the saves' training_info.
  int64_t epoch() const { return epoch_; }
  // Lifts the emulated cap, CPU or CUDA, and returns CUDA's cached blocks (to save after an out-of-memory
  // error: the cap is the experiment, not the save).
  void lift_cap();

  // An image-to-video model's conditioning on each sample's first frame, run in each step's forward phase
  // before the transformer (as AI Toolkit's get_noise_prediction does) — and walked there by the memory model.
  bool conditions_on_first_frame() const { return first_frame_ != nullptr && plan_.first_frame_in_steps; }
  void condition_on_first_frame(model::ModelInputs& in, const model::FirstFrames& first, const torch::Tensor& x0,
                                uint64_t draw);
  // Whether every dataset whose steps condition on first frames takes their latents from the latent cache
  // (RunPlan::first_frame_latents): no encode in the step then.
  bool first_frames_cached() const;
  // Whether its image encoder waits in host memory until the first step (model.low_vram).
  bool first_frame_encoder_waits() const { return plan_.first_frame && config_.model.low_vram; }
  model::DiffusionTransformer& model() { return *model_; }
  const model::LoraOptions& lora() const { return lora_; }
  int lora_modules() const { return lora_modules_; }
  Optimizer& optimizer() { return *optimizer_; }
  // Clears every trained tensor's gradient (the optimizer's, and under ZeRO-1 the tensors other ranks own).
  void zero_grad();
  // ZeRO-1 (RunPlan::world.shard_optimizer, more than one rank): this rank's optimizer holds the state of the
  // trained tensors it owns (dist::owners) and updates them; the others' weights come from their owners.
  bool shards_optimizer() const { return !owners_.empty(); }
  // The optimizer's state as a save writes it: the whole state — under ZeRO-1 the one gather_optimizer_state()
  // gathered at rank 0 last (collective: every rank calls it before rank 0 saves).
  std::vector<std::pair<std::string, torch::Tensor>> optimizer_state() const;
  void gather_optimizer_state();
  // ZeRO-1, after the update: every trained tensor from its owner (dist::broadcast_from_owners); without a group
  // its buffers alone (the memory model walks them in the optimizer phase).
  void gather_updated_weights();
  void drop_gathered_state() { gathered_state_.clear(); }  // once rank 0 has saved it
  const Optimizer& optimizer() const { return *optimizer_; }
  const std::vector<std::pair<std::string, torch::Tensor>>& trained() const { return trained_; }
  std::map<std::string, torch::Tensor>& ema() { return ema_; }
  data::TextEmbeddingCache& text() { return *text_; }
  // The text encoders while they are loaded (nullptr after they left, or for a family without them).
  const text::PromptEncoder* text_encoder() const { return text_->encoder(); }
  // The autoencoder (or the DCT stand-in); on the meta device built on meta tensors. codec_spec() is always
  // there.
  vae::ImageCodec& codec();
  const vae::CodecSpec& codec_spec() const { return plan_.codec; }
  // Whether the run caches latents (some dataset's cache_latents / cache_latents_to_disk): the autoencoder
  // then leaves the device once they are encoded, and comes back for previews only.
  bool caches_latents() const { return plan_.caches_latents; }

  // The checkpoint policy applied to the model now, and switching it between steps (no rebuild). A
  // budget:BYTES policy is resolved to blocks:[...] from the walked block activations (block_activations) at
  // this batch and square resolution (the largest the run will meet).
  const ckpt::CheckpointPolicy& applied_policy() const { return applied_; }
  // The policy in force from now on; a budget:BYTES policy resolved to its blocks at samples of `cell`, auto
  // decided for steps of `cell` (the run's decision at its largest cell: what train applies; bench, fit and
  // advise decide it at each cell they run).
  void apply_policy(const ckpt::CheckpointPolicy& policy, const model::SampleShape& cell);
  // What each block keeps for its backward with nothing checkpointed, and what a checkpointed one keeps (its
  // hidden-stream inputs), for a step on samples of `shape` with `text_tokens` (0: a 77-token
  // caption's) and an edit model's one control image: walked on the meta device (model/activations.h) — a
  // meta Session walks its own model, any other a meta twin of its run (walk_twin). The applied policy is
  // left as it was.
  model::ActivationEstimate block_activations(const model::SampleShape& shape, int64_t text_tokens = 0);
  // Each block under each of `modes` (None always among them) at `shape`: what it keeps and what its backward
  // recomputes, a forward walked per mode on the meta device (a meta twin's, as block_activations).
  model::BlockModeCosts block_mode_costs(const model::SampleShape& shape, std::vector<ckpt::BlockMode> modes);
  // This run's memory model on the meta device (built once; auto decided with it at a cell fits
  // RunPlan::auto_cap_bytes: apply_policy).
  const MemoryModel& auto_model();
  // The cap from now on (bench's caps): the CPU tracker's or the CUDA meter's, and what auto fits; and the
  // run's own back (vram_cap for the tracker or meter, the plan's auto cap).
  void set_cap(int64_t bytes);
  void restore_cap();
  // checkpoint_policy auto, once decided (MemoryModel: train::AutoPlan's choice): what apply_policy applies
  // for auto from then on. Before it, a meta Session applies off for auto.
  void set_auto_choice(const ckpt::CheckpointPolicy& chosen) { auto_choice_ = chosen; }
  // checkpoint_policy auto: a step (train_step's, its bucket and batch) larger than every cell the plan was
  // made for is a UserError naming it — the run never re-decides silently.
  void check_foreseen(const StepResult& r) const;
  // A Session of this run's config on the meta device (built quietly), to walk what this one holds; the
  // meta allocator is installed while it lives.
  std::unique_ptr<Session> walk_twin() const;
  // train.budget_probe: a probe forward at the largest batch and resolution with nothing checkpointed,
  // measuring what each block keeps (the tracking allocator's bytes), beside the walk's figures for the same
  // step. Leaves the applied policy and the random generators as they were.
  struct BlockProbes {
    model::ActivationEstimate measured, walked;
  };
  BlockProbes probe_block_activations();

  // The micro-batch a step trains on: conditioning for the captions, latents (and references) on the
  // device, fresh noise and timesteps from the global generator (the batch encoded first if it is not).
  MicroBatch micro_batch(data::LoadedBatch batch);
  // Encodes a batch's images (and references) with the autoencoder, on the device, when the loader could
  // not give latents, and stores them in the caches its slots name. train_step calls it in the `data`
  // phase.
  void encode(data::LoadedBatch& batch);
  // AI Toolkit's caching before training: every sample the caching datasets give, encoded (the
  // autoencoder on the device), then the autoencoder leaves the device. Nothing when the run caches
  // nothing or the stand-in encodes on the loader's thread. Returns how many were encoded.
  int64_t cache_latents(data::BatchLoader& loader);
  // The device states AI Toolkit sets while it fills a cache (set_device_state_preset,
  // toolkit/models/base_model.py:1554-1615, toolkit/dataloader_mixins.py:1963-1976, 2311-2315): for the
  // latents only the autoencoder stays on the device — the transformer and the text encoders go to host
  // memory —, for the captions only the text encoders (the autoencoder leaves too); the LoRA network (a module of its
  // own there) and the optimizer's state stay. Everything comes back once the cache is filled (restore_device_state);
  // nothing moves when nothing is encoded (did_move). cache_parked_bytes: what a fill takes off the device (works on
  // meta: the memory model's `cache` phase); filled(): the fills that moved it in this run.
  int64_t cache_parked_bytes(CacheFill fill) const;
  const std::set<CacheFill>& filled() const { return filled_; }
  // A batch of this shape with the config's first caption (bench, fit, the memory model's walks): random
  // latents, or, when the autoencoder encodes on the fly, random frames it encodes in the step's `data` phase;
  // control images as the loader gives them.
  // On the meta device its tensors stand for the loader's host memory (memory/meta_count.h).
  data::LoadedBatch synthetic_batch(const model::SampleShape& shape) const;
  // The step's data phase walked: a batch of `shape` as the loader gives it (synthetic_batch, in host
  // memory) through encode() on the meta device — the frames copied to the device in the autoencoder's dtype,
  // its encode, the control images' — counted for the run's device (a meta Session walks itself, any other
  // its walk_twin). `data`: the phase's peak; `held`: what it leaves on the device for the text phase (the
  // latents and control latents it made); `references`: the control latents' bytes on the device;
  // `reference_shapes`: each control latent's shape, as the step's forward reads them.
  struct InputWalk {
    int64_t data = 0, held = 0, references = 0;
    std::vector<std::vector<int64_t>> reference_shapes;
  };
  InputWalk walk_inputs(const model::SampleShape& shape);
  // A latent cache fill's peak, walked as cache_latents runs it for one sample of `sample`: the autoencoder
  // brought back to the device, the sample's frames copied there and encoded, the latents to host memory.
  int64_t walk_latent_fill(const model::SampleShape& sample);

  // One training step: `accumulation()` micro-batches from next(), forward and backward each, then (unless
  // the legacy gradient_accumulation_steps holds the update back) clipping, the update at the scheduled
  // learning rate, zeroed gradients and EMA.
  StepResult train_step(int64_t step, const std::function<data::LoadedBatch()>& next);

  // Previews (the sample block's prompts) at `step`, with the EMA weights when EMA is on, written as PNG
  // into dir; nothing when sampling is off.
  bool sampling() const { return !plan_.previews.empty(); }
  std::vector<std::filesystem::path> sample(int64_t step, const std::filesystem::path& dir);
  // What `gclab advise` tries on the previews: every item at this size and step count (unset: as configured).
  struct PreviewSettings {
    std::optional<int> width, height, steps;
  };
  std::vector<std::filesystem::path> sample(int64_t step, const std::filesystem::path& dir,
                                            const PreviewSettings& settings);
  // The sampler's options for preview `i` (the plan's previews) as sample() runs it: its size (cut to the
  // family's divisibility), steps, guidance, seed, the compute dtype and the family's CFG rescale.
  sample::SampleOptions preview_options(size_t i, const PreviewSettings& settings = {}) const;
  // Encodes every caption the run will ask for, then the empty prompt and the previews' prompts, and unloads
  // the text encoder; with cache_text_embeddings all of it in the `cache` phase with the transformer off the
  // device, after the latents, as AI Toolkit's setup_epoch and hook_before_train_loop do it. unload_text_encoder
  // without cache_text_embeddings is AI Toolkit's other mode: the trigger word (or the empty prompt) is encoded once
  // and every step trains on it.
  void precompute_text(const std::vector<data::Caption>& captions);
  void precompute_text(const std::vector<std::string>& captions);
  // What precompute_text encodes, in order: the captions (cache_text_embeddings) or the trigger word, then
  // the empty prompt and each preview's prompt and negative; none when the text encoders stay.
  std::vector<data::Caption> precomputed_captions(const std::vector<data::Caption>& captions) const;
  // The batch's captions with its control images (edit models' text encoders read them).
  std::vector<data::Caption> captions_of(const data::LoadedBatch& lb) const;
  // Preview i's control images as its pipeline conditions on them: an edit model's encoded as reference latents
  // (preview_references), Flex.2's ctrl_img as the channels beside the latents (preview_condition).
  void preview_controls(size_t i, const sample::SampleOptions& so, model::ModelInputs& cond,
                        model::ModelInputs& uncond);
  // A preview's decode and its control images' encode walked as sample() runs them (the meta Session's own,
  // any other's walk_twin): decode_preview for latents of `shape` (the decode, then the frames' conversion to
  // uint8), preview_controls for preview i — each above the autoencoder's weights on the device.
  int64_t walk_preview_decode(const model::SampleShape& shape);
  int64_t walk_preview_controls(size_t i);
  // What preview i's first-frame conditioning hands its denoise (image tokens, channels, clean frames,
  // per-token timesteps), as meta tensors: the denoise's walk takes them beside the example inputs.
  model::ModelInputs walk_preview_first_frame(size_t i);
  // A preview's frames from its latents: decoded with the autoencoder on the device, as uint8 [F, H, W, 3].
  torch::Tensor decode_preview(const torch::Tensor& latents);
  // An edit model's preview: its control images' latents (reference tokens), encoded on the device.
  // An edit preview's control images encoded as its pipeline does for a width x height preview
  // (load_preview_reference).
  std::vector<torch::Tensor> preview_references(const std::vector<std::filesystem::path>& controls, int width,
                                                int height);
  // Flex.2: a preview's ctrl_img encoded at the preview's size into the channels beside its latents (the
  // family's preview_condition), at slot `index` (the prompt's ctrl_idx).
  torch::Tensor preview_condition(const std::filesystem::path& control, int index, int width, int height);

  ResidentBytes resident() const;
  // The trained tensors summed in float64 (values and squares): what data-parallel ranks compare to know their
  // weights are the same.
  double trained_fingerprint() const;
  // The offload rings of this Session's device (model.layer_offloading's Linears share them).
  const nn::OffloadRings& offload_rings() const { return *rings_; }
  // What loading the model held (train/loading.h): predicted from the steps AI Toolkit's loader takes, and
  // measured on a real run.
  const LoadMemory& load_memory() const { return load_; }
  // A model of several experts: its trainer's stage (the expert whose timesteps the next micro-batch draws)
  // and the micro-batches it has had; set when a run resumes.
  std::pair<size_t, int64_t> stage() const { return {stage_, steps_this_stage_}; }
  const std::vector<size_t>& trained_experts() const { return trained_stages_; }
  // Under low_vram, one expert's frozen weights: what the experts' swap moves (0 for any other model).
  int64_t expert_swap_bytes() const;
  void set_stage(size_t stage, int64_t steps) { stage_ = stage, steps_this_stage_ = steps; }
  // The trained tensors replaced by their EMA for the duration of fn (saving), when EMA is on.
  void with_ema_weights(const std::function<void()>& fn);
  // AI Toolkit's EMA update after an optimizer step (toolkit/ema.py:100-153), when EMA is on: per tensor, in
  // float32 whatever the shadow's dtype — s -= (s - p)(1 - decay) — then written back to a bf16 shadow by
  // stochastic rounding (copy_stochastic), so that a slow EMA moves at all; use_feedback and
  // param_multiplier as there. On a meta session it is walked for its temporaries (the optimizer phase).
  void update_ema();

 private:
  int64_t skipped_scheduler_steps_ = 0;
  // The constructor's steps, in order.
  void start_memory();
  // checkpoint_policy auto on a device: `given` (SessionOptions::auto_choice), else the memory model's choice.
  void choose_auto_plan(const std::optional<ckpt::CheckpointPolicy>& given);
  ckpt::CheckpointPolicy auto_choice_at(const ckpt::CheckpointPolicy& requested, const model::SampleShape& cell);

  // One forward with nothing checkpointed on this Session's device, on samples of `shape` with
  // `text_tokens` and an edit model's one control image: what each block keeps, `live` reading the device's
  // bytes (the offload rings' left out). block_activations (meta) and probe_block_activations (measured).
  model::ActivationEstimate probe_blocks(const model::SampleShape& shape, int64_t text_tokens,
                                         const std::function<int64_t()>& live);
  // The control image a step of `shape` takes, as the loader sizes it: the training image's size, or a raw
  // reference family's largest control (RunPlan::largest_raw_control; match_target_res: at the bucket's area).
  std::pair<int64_t, int64_t> reference_size(const model::SampleShape& shape, bool at_image_size = false) const;
  // The same forward with every block in `mode` (ModelCheckpointing::probe_blocks).
  ModelCheckpointing::BlockProbe probe_forward(const model::SampleShape& shape, int64_t text_tokens,
                                               const std::function<int64_t()>& live, ckpt::BlockMode mode);
  void load_transformer();
  void park_blocks();
  void transformer_to_device();
  // LoadPlan::at_first_use: the transformer's host-resident tensors (not the offloaded Linears' own) to the
  // device, once, at the first forward or preview; the EMA copy with them.
  void transformer_at_first_use();
  // A model of several experts under LoadPlan::at_first_use: the router of its forwards (experts.h).
  void expert_to_device(size_t expert);
  int64_t experts_in_host_bytes() const;    // the frozen weights of the experts that wait in host memory
  void next_stage();                        // the stage of the next micro-batch
  void experts_to_host();                   // the expert on the device to host memory (a preview's decode)
  void expert_base_to_host(size_t expert);  // its base weights that are on the device, to host memory
  void experts_adapters_to_device();        // under low_vram, the experts' adapters to the device at the load
  void load_text_encoders();
  void load_first_frame_encoder();
  void first_frame_encoder_to_device();
  void first_frame_encoder_to_host();
  bool first_frame_on(int dataset) const;  // the dataset's steps condition on its first frames
  void record_load(const memory::MemoryStats& before_load);
  void attach_network();
  void load_user_weights();
  void attach_assistant();
  void offload_transformer();
  void build_codec();
  void build_optimizer();
  // offload_layers under the run's host_cap: a UserError naming the share to lower when it would not fit.
  // `share_key` names the config key of `share` (the advice), `what` the component.
  Offloaded offload_within_host_cap(torch::nn::Module& component, double share, const std::string& share_key,
                                    uint64_t seed, const std::string& what);
  int64_t resident_host_weights();  // the offloaded weights so far (the model's, the text encoders')
  model::ModelInputs conditioning(const std::vector<data::Caption>& captions);

  std::vector<std::filesystem::path> sample_previews(int64_t step, const std::filesystem::path& dir,
                                                     const PreviewSettings& settings);

  RunPlan plan_;
  const config::ProcessConfig& config_ = plan_.config;
  const model::ModelSpec& spec_ = plan_.spec;
  LoadMemory load_;
  torch::Device device_;
  // A meta Session: the meta device's counting allocator for its life (its model built and walked through it).
  std::optional<memory::MetaAllocatorScope> meta_allocator_;
  std::unique_ptr<memory::CpuMemoryTracker> cpu_tracker_;  // before meter_: the CPU meter reads it
  std::shared_ptr<nn::OffloadRings> rings_ = nn::make_offload_rings();
  memory::MemoryMeter meter_;
  memory::PhaseMeter phases_;
  Phase current_phase_ = Phase::setup;
  Activity current_activity_ = Activity::model;
  TimestepSampler timesteps_;
  std::string current_bucket_;
  int current_batch_ = 0;
  int64_t epoch_ = 0;
  std::shared_ptr<model::DiffusionTransformer> model_;
  model::ExpertTransformers* experts_ = nullptr;  // model_ when it is a model of several experts
  int expert_on_device_ = -1;                     // under low_vram, the expert last brought to the device
  // Its trainer's stage (SDTrainer.py:2250-2264): the expert whose timesteps the micro-batches draw, and how
  // many micro-batches it has had.
  size_t stage_ = 0;
  int64_t steps_this_stage_ = 0;
  std::vector<size_t> trained_stages_;
  bool transformer_parked_ = false;
  // What a cache fill took off the device (CacheFill), until it is filled.
  struct Parked {
    std::vector<torch::Tensor> transformer, text_encoders;
    bool autoencoder = false;  // offloaded for the fill
    static int64_t bytes(const std::vector<torch::Tensor>& tensors);
  };
  Parked parked_while_caching(CacheFill fill) const;
  void park_for(CacheFill fill);
  // A fill's first encode: the cache phase begins (its peak from here), the device state set.
  void start_fill(CacheFill fill, std::optional<memory::PhaseMeter::Scope>& scope);
  void unpark();
  std::optional<Parked> parked_;
  std::set<CacheFill> filled_;  // LoadPlan::at_first_use, until transformer_at_first_use()
  model::LoraOptions lora_;
  int lora_modules_ = 0;
  std::unique_ptr<ModelCheckpointing> checkpointing_;
  ckpt::CheckpointPolicy applied_;
  std::optional<ckpt::CheckpointPolicy> auto_choice_;  // set_auto_choice
  std::unique_ptr<MemoryModel> auto_model_;
  std::map<std::string, ckpt::CheckpointPolicy> auto_at_;  // auto_choice_at's, by policy, cell and cap
  // The plan's own auto cap (what the run's decision fitted) while set_cap holds another.
  int64_t run_auto_cap_ = 0;
  std::string run_auto_cap_source_;
  // What the applied auto plan was decided for (check_foreseen): the most pixels a step may hold; 0: no check.
  int64_t foreseen_pixels_ = 0;
  std::vector<std::pair<std::string, torch::Tensor>> trained_;
  dist::ProcessGroup* group_ = nullptr;  // SessionOptions::group
  std::vector<int> owners_;              // ZeRO-1: each trained tensor's rank (empty: no sharding)
  std::vector<std::pair<std::string, torch::Tensor>> gathered_state_;  // ZeRO-1, rank 0: the last gather
  std::unique_ptr<dist::GradientReducer> reducer_;
  // Data parallelism: whether every rank's loss is finite (one rank's non-finite loss skips the micro-batch on all,
  // as one process's loss over the global batch would be non-finite).
  bool finite_everywhere(const torch::Tensor& loss);
  // After a step's micro-batches: the gradients averaged across the ranks, then (r.updated) clipped and applied
  // (`any_gradient`: some micro-batch's loss was finite), and the EMA updated.
  void update(StepResult& r, bool any_gradient);
  // The key of a batch's k-th autoencoder draw (its posterior sample): by batch, and under data parallelism by rank.
  uint64_t encode_key(int64_t batch, uint64_t k) const;
  std::unique_ptr<Optimizer> optimizer_;
  std::map<std::string, torch::Tensor> ema_;
  std::unique_ptr<data::TextEmbeddingCache> text_;  // built once the CPU tracker counts
  std::unique_ptr<vae::ImageCodec> codec_;
  // An image-to-video model's first-frame conditioning (plan_.first_frame); its encoder in host memory until
  // the first step under model.low_vram.
  std::unique_ptr<model::FrameConditioning> first_frame_;
  bool first_frame_parked_ = false;
  std::optional<std::string> fixed_caption_;                 // unload_text_encoder without cached captions: what trains
  std::map<std::array<int64_t, 4>, InputWalk> input_walks_;  // walk_inputs' by (batch, frames, height, width)
  int64_t previous_host_cap_ = 0;                            // process-wide: restored when the Session ends
  std::optional<double> previous_fraction_;  // CUDA's memory fraction before vram_cap set it: restored too
};

// One caption's encode through `prompts`, walked (PromptEncoder::predict_encode) for the nominal caption
// (model::kNominalCaptionTokens tokens, an edit model's with one square control image) on the CPU's
// kernels with this process's threads, or CUDA's: what estimate, check and the OOM report state.
text::EncodePrediction predict_caption_encode(const text::PromptEncoder& prompts, const model::ModelSpec& spec,
                                              bool cpu);

// A step as file names carry it: 000000120 (sorts by name).
std::string step_tag(int64_t step);

}  // namespace gclab::train
