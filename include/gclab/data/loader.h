// Batches ready before the step needs them: a background thread decodes, scales, crops and flips each
// batch's images, takes their latents from the latent caches or (the DCT stand-in) encodes them, and
// processes the captions, a few batches ahead of training. An autoencoder is not run on that thread: its
// batches carry the images, and the session encodes them on the device in the step's `data` phase, as AI
// Toolkit does when latents are not cached. Batches come in a fixed global order (epoch 0's plan seeded by
// the run's seed, every later epoch the same batches — the same crops, the same members — reordered by a
// seed of its own, as AI Toolkit's buckets are built once), so a resumed run sees exactly the batches it
// would have seen.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "gclab/data/dataset.h"
#include "gclab/text/prompt.h"
#include "gclab/vae/codec.h"

namespace gclab::data {

// Where one sample's latents are cached: cache_latents keeps them in memory, cache_latents_to_disk in a
// safetensors file beside the image (`_latent_cache/`), valid while the image's size and time are unchanged.
struct LatentSlot {
  std::string key;             // the image and its placement, flips and latent channels
  bool memory = false;         // cache_latents
  std::filesystem::path file;  // cache_latents_to_disk (empty: not on disk)
  std::string stamp;           // the image's size and time, in the file's metadata
  // A clip of a dataset whose first frames are cached as latents too (LoaderOptions::first_frame_latents): a
  // cache without them is not this slot's.
  bool first_frame = false;
  bool cached() const { return memory || !file.empty(); }
};

// One sample's cached latents (CPU float32): its own, [C, F', h, w], and its first frame's, [C, 1, h, w], where
// its slot keeps them (AI Toolkit's `latent` and `first_frame_latent` in the cache file).
struct CachedLatents {
  torch::Tensor latents;
  torch::Tensor first_frame;
  bool defined() const { return latents.defined(); }
};

// The latent caches of a run, shared by the loader's thread and the session (thread-safe).
class LatentCache {
 public:
  // The sample's latents from memory, else from a valid file (then kept in memory when cached there);
  // undefined when not cached, or cached without the first frame's latents the slot asks for.
  CachedLatents find(const LatentSlot& slot);
  // Keeps one sample's latents where the slot says.
  void store(const LatentSlot& slot, const CachedLatents& z);
  int64_t memory_bytes() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, CachedLatents> memory_;
};

struct LoadedBatch {
  int64_t index = 0;         // position in the run's sequence of batches
  bool epoch_start = false;  // the first batch of an epoch after the first
  int64_t epoch = 0;         // its epoch (0 first): AI Toolkit's epoch_num once this batch is taken
  int dataset = 0, resolution = 0;
  BucketResolution bucket;
  // The family's latents (model::latent_shape: [B, C, h/8, w/8] for an image family) float32: from the
  // caches or the stand-in codec (CPU); undefined until the session encodes `images` with the autoencoder.
  torch::Tensor latents;
  torch::Tensor images;  // frames [B, 3, F, H, W] in [-1, 1], CPU float32, when latents were not ready
  // An image-to-video model's first frames: their pixels [B, 3, H, W] (host memory), kept by the session as it
  // encodes `images`; or, where their dataset caches them (LoaderOptions::first_frame_latents), their latents
  // [B, C, 1, h, w] (first_frame_latents) from the cache beside `latents` — zeros for a sample without one
  // (DataLoaderBatchDTO's first_frame_latents, toolkit/data_transfer_object/data_loader.py:293-305).
  torch::Tensor first_frames;
  torch::Tensor first_frame_latents;
  // Every sample a clip (AI Toolkit's 5-D batch), not an image: a clip of one latent frame is still a clip.
  bool clips = false;
  // Edit models: one [B, C, h', w'] per control folder (reference_images: one frame each, [B, 3, 1, H, W]), each
  // control placed as its image at the batch's size (LoaderOptions::controls_at_bucket: flipped, stretched to the
  // image's scale_to size, cut at its crop) or covering a reference_area image of the batch's aspect
  // (reference_size), centre-cropped — one such latent per control image, as the token accounting counts it. As
  // the latents: undefined until encoded, the images in reference_images meanwhile.
  std::vector<torch::Tensor> references;
  std::vector<torch::Tensor> reference_images;
  std::vector<std::string> captions;               // processed (trigger, dropout, shuffle)
  std::vector<std::filesystem::path> image_files;  // per sample: the dataset image (empty: synthetic)
  // Edit models: per sample, the control files (the text encoder reads them too, through its vision tower),
  // or for a synthetic batch the control images themselves ([3, H, W] in [0, 1]).
  std::vector<std::vector<std::filesystem::path>> control_files;
  std::vector<text::ConditionImages> control_images;
  // Flex.2's inpainting images (LoaderOptions::inpaint_images): each sample's alpha, [B, 1, H, W] float32 in
  // [0, 1], 0 where the model inpaints; zeros for a sample without one; undefined when no sample has one
  // (DataLoaderBatchDTO's inpaint_tensor, toolkit/data_transfer_object/data_loader.py:358-373).
  torch::Tensor inpaint_alpha;
  // The loss masks (mask_path / alpha_mask): [B, 1, H, W] float32 in [mask_min_value, 1], zeros for a sample
  // without one; undefined when no sample has one (its mask_tensor, data_loader.py:399-412).
  torch::Tensor loss_mask;
  // Where the session puts the latents it encodes (one slot per sample), and the caches they go to.
  std::vector<LatentSlot> slots;
  std::shared_ptr<LatentCache> cache;
};

struct LoaderOptions {
  int batch_size = 1;
  int divisibility = 16;
  int temporal = 4;                      // the autoencoder's frames per latent frame (auto_frame_count snaps to it)
  int64_t reference_area = 1024 * 1024;  // edit models' control images (reference_size)
  // Control images at the batch's own size — scaled and cropped as the images, for Flex.2's channels beside
  // the latents and Qwen-Image-Edit's references (model::trains_references_at_image_size) — instead of at
  // reference_area.
  bool controls_at_bucket = false;
  // Control images raw, each prepared as FLUX.2's pipeline prepares a reference (raw_reference_image: capped at
  // reference_area, cropped to multiples of 16), and with match_target_res (model_kwargs) resized to the
  // batch's area first.
  bool raw_controls = false;
  bool match_target_res = false;
  // The text encoder reads each sample's control files too (model::text_reads_controls: Qwen-Image-Edit's
  // vision tower).
  bool text_reads_controls = false;
  // The datasets' inpaint_path images are read (Flex.2: its family's controls_as_channels).
  bool inpaint_images = false;
  // The datasets (by index) whose latent caches keep each clip's first frame's latents too (the family's
  // caches_first_frame_latents, for a dataset whose steps condition on first frames).
  std::set<int> first_frame_latents;
  uint64_t seed = 0;
  std::optional<std::string> trigger_word;  // the process's; a dataset's own wins
  int prefetch = 3;
  // Data parallelism: the epoch is planned in global batches of world_size x each dataset's batch size (the same
  // plan on every rank: the same bucket at the same step, so the ranks' shapes match), and this rank loads its
  // slice of each, samples [rank x b, (rank + 1) x b) — always the same samples of a batch, so a rank caches
  // only its own latents. The ranks together load what one process with the global batch loads: each sample's
  // caption randomness is seeded by its batch and its place in the global batch.
  int world_size = 1, rank = 0;
};

class BatchLoader {
 public:
  // The codec encodes on the loader's thread only when it says it may (the stand-in); the thread starts
  // with the first next().
  BatchLoader(std::vector<ImageItem> items, std::vector<config::DatasetConfig> datasets, vae::ImageCodec& codec,
              const LoaderOptions& options, int64_t start_index);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next batch (blocks until it is ready); rethrows a worker's error as DataError.
  LoadedBatch next();
  int64_t batches_per_epoch() const { return epoch_size_; }
  // This rank's samples of a planned (global) batch.
  std::pair<size_t, size_t> my_slice(const Batch& batch) const;
  // Warnings from the worker (a file that failed to decode), taken once.
  std::vector<std::string> take_warnings();
  // Every image that could not be decoded so far: each was replaced by another image of its bucket and
  // is not used again.
  std::vector<std::string> unusable_files();

  // AI Toolkit's latent caching before training (cache_latents_all_latents): every sample the caching
  // datasets can give (each image at each resolution, flipped as the dataset may flip it) that is not
  // cached yet, one sample at a time as AI Toolkit encodes them, handed to `encode` (frames [1, 3, F, H, W]
  // in [-1, 1] -> the family's latents) and stored — and a clip's first frame ([1, 3, 1, H, W]) where its slot
  // keeps it. Call before the first next(). Returns how many samples were encoded.
  // `encode` also gets a key of the image's placement (for its posterior sample).
  using Encode = std::function<torch::Tensor(const torch::Tensor&, uint64_t)>;
  int64_t fill_caches(const Encode& encode);
  const std::shared_ptr<LatentCache>& cache() const { return cache_; }

 private:
  void work();
  LoadedBatch load(int64_t index);
  struct Sample {
    CachedLatents latents;  // one sample's latents when cached or encoded here
    torch::Tensor image;    // its frames [3, F, H, W] otherwise
    torch::Tensor inpaint;  // [1, H, W] its inpainting image's alpha (undefined: none)
    torch::Tensor mask;     // [1, H, W] its loss mask (undefined: none)
    LatentSlot slot;
  };
  // The sample's latents or image, and the images beside it; an unusable image or mask is an ImageError
  // (an unusable inpainting image is a warning: the sample has none, as in AI Toolkit). `rng`: the mask's blur.
  Sample load_sample(const PlannedSample& s, std::mt19937_64& rng);
  LatentSlot slot_for(const PlannedSample& s) const;
  // The batch's control images (edit models, Flex.2), images or (the stand-in) latents, into `out`.
  void load_controls(const Batch& plan, const std::vector<PlannedSample>& used, const std::vector<bool>& text_only,
                     LoadedBatch& out);
  static CachedLatents encode_sample(const torch::Tensor& image, const LatentSlot& slot, const Encode& encode);
  torch::Tensor sample_image(const PlannedSample& s) const;
  PlannedSample replacement_for(int64_t epoch, const Batch& batch, const PlannedSample& bad) const;

  std::vector<ImageItem> items_;
  std::vector<config::DatasetConfig> datasets_;
  vae::ImageCodec& codec_;
  const bool encode_here_;
  const std::string codec_key_;  // the codec's part of every cache key
  LoaderOptions o_;
  int64_t epoch_size_ = 0;
  int64_t next_to_load_ = 0;
  std::vector<Batch> first_epoch_;               // every epoch's batches, reordered
  std::map<int64_t, std::vector<Batch>> plans_;  // by epoch (at most two kept)
  std::shared_ptr<LatentCache> cache_ = std::make_shared<LatentCache>();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<LoadedBatch> ready_;
  std::exception_ptr error_;
  std::vector<std::string> warnings_;
  std::set<int> bad_items_;  // items that failed to decode (touched by the worker only, except the list)
  std::vector<std::string> bad_files_;
  bool stop_ = false;
  std::thread worker_;
};

// Stores the batch's encoded latents (and its first frames' latents, where its slots keep them) in the caches
// its slots name.
void remember_latents(const LoadedBatch& batch);

}  // namespace gclab::data
