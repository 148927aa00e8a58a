// The memory model: the memory a config's run takes, phase by phase (memory::Phase: the phases the meter
// records), predicted from the run's plan (train/plan.h) executed on the meta device by the same Session
// code a run uses (no memory, no data: the modules' sizes come from the modules themselves, never from a
// second copy of their shapes) — weights in their real dtype, trained tensors and their gradients,
// optimizer state, EMA, the text encoder, the autoencoder — plus, per training cell and checkpoint policy
// (off, full, and the run's own), the step's forward and backward walked op by op on the meta model
// (memory/meta_count.h: the micro-batch, every op's output and temporaries, what autograd and the
// checkpoints keep, the recompute, the gradients as they are made), the gradients an accumulated step keeps
// between its micro-batches, the autoencoder's encode when latents are encoded on the
// fly, the text encoders' encode, the preview with its decode, and the save. It is the one prediction:
// `gclab estimate` and `check` print it, `fit` sets its largest batch beside the measured one, every run
// writes it beside what it measured (metrics.jsonl, memory.json), and the OOM report prices each fix by
// re-planning the changed config through it. What it does not model is listed in `not_modelled`.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gclab/ckpt/policy.h"
#include "gclab/config/config.h"
#include "gclab/data/conditioner.h"
#include "gclab/memory/phase.h"
#include "gclab/model/spec.h"
#include "gclab/train/phase.h"
#include "gclab/train/plan.h"

namespace gclab::train {

class Session;
struct StepResult;

// Bytes per phase of a run, predicted or measured.
using PhaseBytes = std::map<memory::Phase, int64_t>;

struct StepEstimate {
  // The micro-batch on the device as the step's forward begins (walked: latents, noise, timesteps, text
  // embeddings, control latents); the loss's own tensors are the forward's.
  int64_t batch_bytes = 0;
  int64_t activation_bytes = 0;  // what the blocks keep for backward (full: inputs + one block recomputed)
  // The forward's and the backward's peaks above what stays between steps, walked op by op on the meta
  // model (the micro-batch, the blocks' activations as the policy keeps them, every op's temporaries, the
  // recompute, the gradients as the backward makes them).
  int64_t forward_bytes = 0, backward_bytes = 0;
  // The `data` phase above the resident bytes, walked (Session::walk_inputs): the batch's frames copied to
  // the device in the autoencoder's dtype and its encode, the control images' likewise (0 when latents are
  // cached or the stand-in encodes, and no control image is encoded).
  int64_t encode_bytes = 0;
  int64_t reference_bytes = 0;  // the control latents the data phase made on the device, beside the batch's
  // The `text` phase above the resident bytes: the latents the data phase made on the device, and the
  // step's conditioning walked (TextEmbeddingCache::collate with the captions' embeddings: encoded on the
  // device, the text encoders resident — TextEncodeEstimate —, or cached in host memory).
  int64_t text_bytes = 0;
  int64_t total_bytes = 0;  // the step's peak: resident + the largest of the data, text and training phases
  // The step's phases as the meter records them, each one's highest live bytes with what was live when it
  // began: data, text, forward, backward, optimizer.
  PhaseBytes phases;
  // The same for a run's first update: the optimizer's state is made in it, so the phases before it hold
  // none. Where the state outweighs what the first update's temporaries add, step 2 is the run's peak, not
  // step 1 (a full fine-tune with checkpointing off: AI Toolkit's "OOM at step 2").
  PhaseBytes first_phases;
  int64_t first_total_bytes = 0;
};

// The text encoders encoding one caption (PromptEncoder::predict_encode: the prompt's encode walked):
// every step in the `text` phase when they stay on the device, else once before training
// (cache_text_embeddings / unload_text_encoder), beside what is resident then (no gradients or optimizer
// state yet).
struct TextEncodeEstimate {
  int64_t caption_tokens = 0;           // the caption it is predicted for (a 77-token one, as `check`'s tokens)
  int control_images = 0;               // edit models: one square control image through the vision tower
  std::vector<std::string> encoders;    // per slot: text_encoder, text_encoder_2, ...
  std::vector<int64_t> tokens, bytes;   // per slot: the ids it runs on, its peak
  int64_t encode_bytes = 0;             // the caption's peak
  c10::ScalarType dtype = c10::kFloat;  // the embeddings' (text::EncodePrediction::dtype)
  bool every_step = false;
  int64_t total_bytes = 0;  // before training: what is resident then + the encode (0 when every step: see
                            // StepEstimate::text_bytes)
};

struct ResolutionEstimate {
  int resolution = 0;  // square resolution x resolution
  int batch = 0;
  int frames = 1;  // the dataset's num_frames
  int64_t image_tokens = 0, text_tokens = 0;
  StepEstimate gc_off, gc_full;
  // The run's own policy when it is neither (every:N, first:K, blocks, selective, offload, a budget
  // resolved to its blocks).
  std::optional<StepEstimate> gc_run;
};

// Filling the caches before the first step (the `cache` phase, Session::CacheFill): what is resident then —
// the weights, the text encoders (loaded until the captions are cached), the EMA, the offload rings; no
// gradients, no optimizer state — less what the fill takes off the device (Session::cache_parked_bytes),
// plus the fill's own work.
struct CacheEstimate {
  // The latents (some dataset caches them, the autoencoder encodes): its weights, one image of the largest
  // cell (AI Toolkit encodes them one at a time) and its encode. 0 when nothing is cached so.
  int64_t latents_bytes = 0;
  int resolution = 0;  // the image's (square) side
  int frames = 1;      // a clip's frames (the largest cell's)
  // The captions (cache_text_embeddings): the text encoders and a caption's encode, the run's largest (a
  // 77-token caption's in an estimate). 0 when they are not cached.
  int64_t text_bytes = 0;
  int64_t total_bytes = 0;  // the larger
};

// A preview at sample.width x height, after a step (gradients freed): the autoencoder back on the device
// when it had left it, the denoising passes (without gradients), then the decode.
struct PreviewEstimate {
  int width = 0, height = 0;
  int frames = 1;  // sample.num_frames
  int64_t image_tokens = 0;
  // One step of the sampler walked on the meta model (its conditioning, latents and no-grad forwards, CFG
  // batched as the sampler does it for the prompts' text rows), the most of the previews'.
  int64_t denoise_bytes = 0;
  // The decode and the frames' conversion to uint8, walked (Session::walk_preview_decode: decode_preview on
  // the meta twin), above the autoencoder's weights.
  int64_t decode_bytes = 0;
  // The samples' ctrl_img encoded as their pipelines do (Session::walk_preview_controls): an edit model's
  // reference latents (a 1024²-area image), Flex.2's channels (the preview's size); the most of the previews'.
  int64_t reference_encode_bytes = 0;
  // The sample prompts encoded in the preview (the text encoders resident, the prompts not cached): the
  // largest prompt's encode peak.
  int64_t text_encode_bytes = 0;
  int64_t total_bytes = 0;  // resident (without gradients, with the autoencoder) + the largest of the four
};

// Loading the model, before any step, as the arch's AI Toolkit loader does it (train/loading.h): the
// transformer built in its dtype and quantized on the device or in host memory (model.low_vram, block by
// block), the text encoders built on the device and quantized there; the highest either side held.
struct LoadEstimate {
  bool quantized_on_host = false;
  bool at_first_use = false;  // LoadMemory::at_first_use
  int64_t device_peak_bytes = 0;
  int64_t host_peak_bytes = 0;
};

// checkpoint_policy: auto resolved — from the memory model, once, before the run's first step: per block
// none, selective (attn / mlp), full or (CUDA) offload, so that every phase the run will hold (the load, the
// caches, step 1 and step 2 — the optimizer's state made — at the largest cell, the previews, the save) fits
// the cap less a margin, for the fewest FLOPs recomputed (memory/flops.h). No cap, or room for GC off: off.
struct AutoPlan {
  std::string requested;  // as written: auto, auto:10%, auto:2GiB
  int64_t cap_bytes = 0;  // what it fits (RunPlan::auto_cap_bytes); 0: no cap
  std::string cap_source;
  int64_t margin_bytes = 0;                                       // kept free of the cap (CheckpointPolicy::margin_of)
  ckpt::CheckpointPolicy chosen = ckpt::CheckpointPolicy::off();  // off, full or modes:[...]
  bool fits = true;            // every phase under cap - margin (false: the least memory found, said in `why`)
  int64_t peak_bytes = 0;      // the run's highest predicted phase under `chosen`
  std::string peak_phase;      // which (memory::phase_name)
  int64_t off_peak_bytes = 0;  // the same with checkpointing off
  // The step's recomputation at the largest cell, in forward FLOPs: the plan's, and full's; and its cost with
  // the recompute's writes and offload's transfers (FLOP-equivalents, model::recompute_cost), the plan's and full's.
  double recomputed_flops = 0, full_recomputed_flops = 0;
  double recompute_cost = 0, full_recompute_cost = 0;
  int walks = 0;  // the step walks it took (each candidate verified by the whole step's walk)
  // The candidates walked, in order: each plan and its highest phase's bytes.
  std::vector<std::pair<std::string, int64_t>> tried;
  std::string why;  // in words
};

// The plan in a line: what it fits, what it chose and why, the recomputation against full's.
std::string describe_auto_plan(const AutoPlan& plan);
// As memory.json and the estimate write it.
nlohmann::json auto_plan_json(const AutoPlan& plan);

struct MemoryEstimate {
  model::ModelSpec spec;
  std::string device;         // "cpu" or "cuda": the kind of device predicted for (for reports)
  int64_t weight_bytes = 0;   // every parameter and buffer as stored (frozen base + trained tensors)
  int64_t trained = 0;        // parameters trained
  int64_t trained_bytes = 0;  // their storage (part of weight_bytes)
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t optimizer_step_bytes = 0;  // the optimizer phase's temporaries (walked: Optimizer::walk)
  int64_t ema_bytes = 0;
  int64_t text_encoder_bytes = 0;
  std::string vae;               // what encodes and decodes (vae::CodecSpec::describe)
  int64_t vae_weight_bytes = 0;  // the autoencoder's weights
  int64_t vae_bytes = 0;         // of which resident during steps (0 when cache_latents sends it away)
  // An image-to-video model's image encoder (CLIP's for Wan 2.1 I2V), resident through the steps; under
  // model.low_vram it arrives at the first step's forward (Session::first_frame_encoder_waits).
  int64_t image_encoder_bytes = 0;
  bool image_encoder_waits = false;
  // model.layer_offloading: the offloaded Linears' weights in host memory (not in weight_bytes), and what
  // bringing them holds on the device (their ring slots, one being brought; in resident_bytes).
  int64_t host_weight_bytes = 0;
  int64_t offload_buffer_bytes = 0;
  // Data parallelism (RunPlan::world): the gradient reducer's buckets, held beside the gradients; world_size is
  // the number of replicas these per-process figures are for.
  int64_t gradient_bucket_bytes = 0;
  int world_size = 1;
  // ZeRO-1 (RunPlan::world.shard_optimizer): optimizer_bytes and the optimizer phase are the rank's own tensors'
  // (walked).
  bool optimizer_sharded = false;
  // The largest transformer block's weights, and of them its trained tensors' (what fully sharded data
  // parallelism gathers whole while the block runs: train/sharding.h).
  int64_t largest_block_weight_bytes = 0, largest_block_trained_bytes = 0;
  int64_t resident_bytes = 0;  // weights + gradients + optimizer + EMA + text and image encoders + autoencoder +
                               // rings + gradient buckets
  // LoadPlan::at_first_use: the transformer's weights (not the LoRA's) in host memory until its first
  // forward or preview — through the captions' precompute, and the first step's data and text phases when
  // no baseline preview comes first.
  int64_t parked_bytes = 0;
  int64_t cap_bytes = 0;
  std::string activation_dtype;
  ckpt::CheckpointPolicy policy;      // the run's checkpoint policy as its Session applies it (a budget resolved)
  std::optional<AutoPlan> auto_plan;  // checkpoint_policy auto: what it chose and why
  LoadEstimate load;
  std::vector<ResolutionEstimate> resolutions;
  std::optional<TextEncodeEstimate> text;  // when the family has text encoders
  std::optional<CacheEstimate> cache;      // when the run fills a cache before the first step
  std::optional<PreviewEstimate> preview;  // when the config samples
  // The save phase: what is resident between steps, and the state the weights file is written from
  // (model::lora_state / weights_state walked: scaled adapters, copies in save.dtype).
  int64_t save_bytes = 0;
  std::vector<std::string> not_modelled;
};

// The memory model of one config: its estimate, and any step's prediction (a cell of the datasets, or the
// bucket a run's step trained) phase by phase.
class MemoryModel {
 public:
  // From a plan for the meta device (plan_run with PlanOptions::meta; std::invalid_argument otherwise), or
  // from a config planned so.
  explicit MemoryModel(RunPlan plan);
  explicit MemoryModel(const config::ProcessConfig& config);
  ~MemoryModel();
  MemoryModel(const MemoryModel&) = delete;
  MemoryModel& operator=(const MemoryModel&) = delete;

  const MemoryEstimate& estimate() const { return estimate_; }
  // A step on samples of `shape` under a checkpoint policy (any; a budget policy resolved to its blocks
  // first: policy()), with `text_tokens` text tokens (0: a 77-token caption's,
  // model::kNominalCaptionTokens) and, when the captions are encoded every step, those captions (none: a
  // 77-token caption's encode).
  StepEstimate step(const model::SampleShape& shape, const ckpt::CheckpointPolicy& policy, int64_t text_tokens = 0,
                    const std::vector<data::Caption>& captions = {}) const;
  // The run's policy as its Session applies it (budget:BYTES resolved to blocks:[...] at the largest cell).
  const ckpt::CheckpointPolicy& policy() const;
  // checkpoint_policy auto (`requested`: its margin) decided for steps of `shape` under `cap_bytes` (0: none):
  // the run's own is estimate().auto_plan, at the largest cell under RunPlan::auto_cap_bytes; bench and fit
  // decide it at each cell they run.
  AutoPlan auto_plan(const ckpt::CheckpointPolicy& requested, const model::SampleShape& shape, int64_t cap_bytes,
                     const std::string& cap_source) const;
  // Every phase of a run whose steps are like `step`: the load (setup), the step's phases, the preview
  // (sample, when the config samples) and the save.
  PhaseBytes phases(const StepEstimate& step) const;
  // The same with step 1's phases too (no optimizer state yet), each phase the higher of the two: every phase
  // a run whose steps are like `step` holds, from its first step on — what auto fits under the cap.
  PhaseBytes run_phases(const StepEstimate& step) const;
  // The highest of them: the most a run whose steps are like `step` holds at once.
  int64_t run_peak(const StepEstimate& step) const;
  // The `cache` phase as a run filled it: the fills that moved the transformer (Session::filled), the run's
  // captions (each distinct one's encode predicted; none: a 77-token caption's).
  int64_t cache(const std::set<CacheFill>& fills, const std::vector<data::Caption>& captions) const;
  // The prediction for a step as a run logged it (its batch, bucket, text tokens and captions, and whether
  // the optimizer had state yet) under the run's policy.
  PhaseBytes predict(const StepResult& step) const;

 private:
  std::unique_ptr<Session> session_;  // the run's Session on the meta device
  MemoryEstimate estimate_;
  bool cuda_ = false;
};

MemoryEstimate estimate_memory(const config::ProcessConfig& config);
// The estimate over a grid (`gclab estimate --frames --resolution`): a row per frames x resolution, each
// cell the config re-planned with every dataset at that num_frames and that one resolution (empty: the
// config's own) — its budget resolved there; the cache fill the largest cell's; the rest (weights, load,
// previews, the policy's name) the first cell's. An image model asked for frames above 1 is a UserError, as
// its config would be.
MemoryEstimate estimate_memory_grid(const config::ProcessConfig& config, const std::vector<int>& frames,
                                    const std::vector<int>& resolutions);
// The load alone (what `check` prints), from the same meta-device Session.
LoadEstimate estimate_load(const config::ProcessConfig& config);

}  // namespace gclab::train
