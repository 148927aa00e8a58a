// The plan of a run: everything a config resolves to before a tensor exists — the arch and its family, the
// model's shape, the device and dtypes, the load's order, the text encoders and the autoencoder to build,
// what is cached, the checkpoint policy, the (batch, resolution) cells the datasets ask for, the previews and
// the seed. plan_run() resolves them once and checks what can be checked without building anything; a
// Session executes a plan, and what-if advice re-plans a changed config rather than building one.
#pragma once

#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gclab/ckpt/policy.h"
#include "gclab/config/config.h"
#include "gclab/data/buckets.h"
#include "gclab/data/image.h"
#include "gclab/dist/world.h"
#include "gclab/model/family.h"
#include "gclab/model/registry.h"
#include "gclab/model/spec.h"
#include "gclab/text/prompt.h"
#include "gclab/vae/codec.h"

namespace gclab::train {

// One (batch size, frames, resolution) a dataset trains at: its sample shape, a square image's bucket.
struct StepCell {
  int batch = 0;
  int resolution = 0;  // the dataset's resolution: its buckets' target area, resolution²
  int frames = 1;      // the dataset's num_frames
  // The bucket a square image takes at that resolution (data::bucket_for at the arch's divisibility: 1024 at
  // 32 is 1024², 632 at 16 is 624 x 640, 1008 at 32 is 992 x 1024); 0: resolution² (no arch to round for).
  int width = 0, height = 0;
  int bucket_width() const { return width > 0 ? width : resolution; }
  int bucket_height() const { return height > 0 ? height : resolution; }
  model::SampleShape shape() const { return {batch, frames, bucket_height(), bucket_width()}; }
  bool operator<(const StepCell& o) const {
    return resolution != o.resolution ? resolution < o.resolution
           : frames != o.frames       ? frames < o.frames
                                      : batch < o.batch;
  }
  bool operator==(const StepCell& o) const {
    return batch == o.batch && resolution == o.resolution && frames == o.frames;
  }
};

// Every dataset's (batch_size or train.batch_size, resolution, num_frames) cells, each once, by resolution,
// frames, then batch; with auto_frame_count the dataset's longest clip's frames (data::most_frames).
std::vector<StepCell> step_cells(const config::ProcessConfig& config);
// The cell among step_cells whose step holds the most pixels (batch x frames x resolution², then a sample's)
// — a cell some dataset trains on (512², the train batch, when there is none): what a
// budget:BYTES policy is resolved for and what the budget probe measures.
StepCell largest_cell(const config::ProcessConfig& config);
StepCell largest_cell(const std::vector<StepCell>& cells, int batch);  // among these (none: 512², `batch`)

// How the transformer loads, in the order AI Toolkit's loader for the arch takes (model::TransformerLoading).
struct LoadPlan {
  model::TransformerLoading loading = model::TransformerLoading::on_device_unless_low_vram;
  // Built and quantized in host memory (per_block always, on_device_unless_low_vram under low_vram), then
  // moved to the device: before the text encoders are built, or after them (per_block).
  bool quantized_on_host = false;
  bool after_text_encoders = false;
  // per_block under model.low_vram: the transformer stays in host memory through the load, the captions'
  // precompute and the latent cache, and reaches the device at its first use — the first preview or the
  // first step's forward (qwen_image.py:141-143 and :219-220, z_image.py:251-253 and :313-314: moved to
  // the CPU, `if not self.low_vram: pipe.transformer.to(device)`; get_noise_prediction and
  // generate_single_image move it, qwen_image.py:327 and :261, z_image.py:385-386 and :355-356). A model of
  // several experts (experts_in_turn) brings only the expert that runs, and sends the other back.
  bool at_first_use = false;
  // parked_while_text_encoders_load, quantized without low_vram: quantized on the device, its blocks sent to
  // host memory while the text encoders load, then brought back.
  bool blocks_parked = false;
  // A GPU run's transformer built in host memory is drawn on the GPU, a parameter at a time (a meta plan
  // predicting for one walks the same).
  bool staged = false;
};

struct PlanOptions {
  // Plan for the meta device: shapes and byte counts, no memory and no data (train --dry-run, estimate).
  bool meta = false;
};

struct RunPlan {
  config::ProcessConfig config;
  const model::ArchFacts* arch = nullptr;             // model.arch's facts (nullptr: an arch gclab does not know)
  const model::ModelFamily* family = nullptr;         // the registry's entry for the spec's family
  model::ModelSpec spec;                              // the transformer's shape (preset or config.json)
  std::optional<model::LocalModel> local;             // name_or_path when it is a local diffusers folder
  torch::Device device = torch::Device(torch::kCPU);  // where the run lives (kMeta: counts only)
  bool cuda = false;                                  // runs on CUDA, or (meta) predicts for CUDA's kernels
  torch::ScalarType base_dtype = torch::kFloat;       // the transformer's stored dtype (base_dtype())
  torch::ScalarType compute_dtype = torch::kFloat;    // train.dtype: the model's inputs, the text encoders'
  uint64_t seed = 42;                                 // training_seed (config.seed())
  // Data parallelism (dist::process_world): this process's rank among `world.size` replicas. Each trains on its
  // slice of every global batch of world.size x batch_size samples (data::LoaderOptions::world_size), draws the
  // noise and timesteps of the whole global batch and keeps its slice (so that the replicas together train as one
  // process on the global batch), and holds the gradient reducer's buckets beside its gradients. A CUDA run's
  // device is cuda:LOCAL_RANK.
  dist::World world;
  LoadPlan load;
  // model.assistant_lora_path when it is a local file the arch takes (else empty: refused, or a Hub name
  // gclab does not fetch, said in a warning).
  std::filesystem::path assistant_adapter;
  text::PromptEncoderOptions prompts;  // the text encoders to build, on `device` in compute_dtype
  vae::CodecSpec codec;                // the autoencoder (or the DCT stand-in)
  bool caches_latents = false;         // run_caches_latents()
  // An image-to-video model's conditioning on each sample's first frame (the family's trains_on_first_frame,
  // registry.h): its image encoder on `device` in compute_dtype, from name_or_path's image_encoder/ when it has one.
  std::optional<model::FrameConditioningSource> first_frame;
  bool first_frame_in_steps = false;  // some dataset's steps condition on it (the walk's steps do then)
  // The datasets (by index) whose steps condition on the first frames' latents from the latent cache (the
  // family's caches_first_frame_latents, with cache_latents / cache_latents_to_disk), not on their pixels.
  std::set<int> first_frame_latents;
  // The autoencoder on the device through the steps: latents encoded on the fly, or an edit model's control
  // images, encoded every step cached latents or not (encode brings an offloaded autoencoder back).
  bool vae_in_steps = false;
  bool caches_text = false;          // run_caches_text()
  bool text_encoder_leaves = false;  // text_encoder_leaves()
  ckpt::CheckpointPolicy policy;     // train's policy as written (budget: resolved at `largest`)
  // What checkpoint_policy auto fits (MemoryModel chooses its plan; bench, fit and advise try it too):
  // vram_cap, else on a CUDA run (or a meta plan predicting for one on a machine with its GPU) that GPU's free
  // memory as the plan is made; 0: none.
  int64_t auto_cap_bytes = 0;
  std::string auto_cap_source;  // "vram_cap", "the GPU's free memory", "" (no cap)
  // A family that takes its control images raw (FLUX.2's encode_image_refs: each at its own size, capped at
  // reference_area): the largest control image (by area) in the datasets' control folders, read from the
  // headers — the reference the steps' walk holds. None: a control of the training image's size.
  std::optional<data::ImageSize> largest_raw_control;
  std::vector<StepCell> cells;  // step_cells()
  StepCell largest;             // largest_cell()
  // The previews (none when sampling is off) and, per prompt, its control images that are files (edit
  // models).
  std::vector<config::SampleItem> previews;
  std::vector<std::vector<std::filesystem::path>> preview_controls;
  std::vector<std::string> warnings;  // said once by the Session that executes the plan
};

// Resolves `config` (validated) into a plan. Builds no tensor; reads config.json files and looks for the
// files the config names. Throws UserError for what cannot run: a CUDA device without one, an autoencoder
// whose latent channels are not the transformer's, a config.json it cannot use.
RunPlan plan_run(const config::ProcessConfig& config, const PlanOptions& options = {});

// The dtype the transformer is built and stored in, as AI Toolkit loads it: train.dtype (BaseSDTrainProcess.py:
// 1799), a full fine-tune's optimizer handed those weights themselves, no float32 master copy (:2146-2155).
torch::ScalarType base_dtype(const config::ProcessConfig& config);
// The dtype saves write (save.dtype).
torch::ScalarType save_dtype(const config::ProcessConfig& config);

// What a run encodes and decodes with: model.vae's choice, the family's autoencoder (tiny presets: its
// CPU-test size), its weights from `weights` when given, else model.vae_path when it is local, else
// name_or_path's vae/ folder, the run's dtype and sample.vae_tiling. Throws UserError for a config.json it
// cannot use.
vae::CodecSpec codec_plan(const config::ProcessConfig& config, const model::ModelSpec& spec,
                          const std::filesystem::path& weights = {});
// What a run conditions on: the family's text encoders (model::text_encoders) from name_or_path's
// text_encoder*/ and tokenizer*/ folders when it is a local diffusers folder, sized to the transformer's
// text widths and length, placed by `options`.
text::PromptEncoderOptions prompt_plan(const config::ProcessConfig& config, const model::ModelSpec& spec,
                                       const torch::TensorOptions& options);
// Whether some dataset caches latents (cache_latents / cache_latents_to_disk): the autoencoder then encodes
// before training and leaves the device.
bool run_caches_latents(const config::ProcessConfig& config);
// Whether the text encoder leaves the device before training. AI Toolkit (BaseSDTrainProcess.run): when
// unload_text_encoder is set or any dataset caches text embeddings (train.cache_text_embeddings sets it on
// every dataset), it encodes what it needs up front — the captions when caching, else the empty prompt and
// the trigger word it then trains on — and the sample prompts, then unloads the encoder.
bool text_encoder_leaves(const config::ProcessConfig& config);
// Whether the run caches text embeddings (train.cache_text_embeddings, or any dataset's).
bool run_caches_text(const config::ProcessConfig& config);
// Where the autoencoder's weights come from: `weights` when given, else model.vae_path when it is a local
// folder or file, else name_or_path's vae/ folder; empty: random weights.
std::filesystem::path autoencoder_weights(const config::ProcessConfig& config, const std::filesystem::path& weights);

// The device a config names: "auto" is CUDA when present, else the CPU. Throws UserError for a CUDA device
// on a machine without one, or a name LibTorch does not know.
torch::Device resolve_device(const std::string& name);
// Whether `config` runs on CUDA (device cuda...; `auto` on a machine with a GPU) — what a meta-device plan
// predicts for (CUDA's kernels, a load staged through the GPU) — or on the CPU.
bool runs_on_cuda(const config::ProcessConfig& config);

// An edit preview's control image as its pipeline encodes it, at reference_size of the spec's
// reference_area: the Plus pipeline at the image's own aspect, the image stretched to it (its image
// processor's resize); Qwen-Image-Edit's generate_single_image first resizes the image to the preview's
// width x height (qwen_image_edit.py:98-105), so at the preview's aspect. [3, h, w] in [-1, 1].
data::BucketResolution preview_reference_size(const model::ModelSpec& spec, data::BucketResolution image, int width,
                                              int height);
torch::Tensor load_preview_reference(const model::ModelSpec& spec, const std::filesystem::path& file, int width,
                                     int height);

}  // namespace gclab::train
