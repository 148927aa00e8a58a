// Batches ready before the step needs them: a background thread decodes, scales, crops and flips each
// batch's images, encodes them to latents (with the latent caches) and processes the captions, a few
// batches ahead of training. Batches come in a fixed global order (epoch plans seeded by the run's seed),
// so a resumed run sees exactly the batches it would have seen.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "gclab/data/dataset.h"
#include "gclab/data/latent_codec.h"

namespace gclab::data {

struct LoadedBatch {
  int64_t index = 0;         // position in the run's sequence of batches
  bool epoch_start = false;  // the first batch of an epoch after the first
  int dataset = 0, resolution = 0;
  BucketResolution bucket;
  torch::Tensor latents;  // [B, C, h/8, w/8], CPU float32
  // Edit models: one [B, C, h', w'] per control folder, each control scaled to a 1024²-area image of the
  // batch's aspect (sides multiples of the divisibility), cover and centre-crop — one 1024²-area latent
  // per control image, as the token accounting counts it.
  std::vector<torch::Tensor> references;
  std::vector<std::string> captions;  // processed (trigger, dropout, shuffle)
};

struct LoaderOptions {
  int batch_size = 1;
  int divisibility = 16;
  uint64_t seed = 0;
  std::optional<std::string> trigger_word;  // the process's; a dataset's own wins
  int prefetch = 3;
};

class BatchLoader {
 public:
  BatchLoader(std::vector<ImageItem> items, std::vector<config::DatasetConfig> datasets, const LatentCodec& codec,
              const LoaderOptions& options, int64_t start_index);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // The next batch (blocks until it is ready); rethrows a worker's error as DataError.
  LoadedBatch next();
  int64_t batches_per_epoch() const { return epoch_size_; }
  // Warnings from the worker (a file that failed to decode), taken once.
  std::vector<std::string> take_warnings();
  // Every image that could not be decoded so far: each was replaced by another image of its bucket and
  // is not used again.
  std::vector<std::string> unusable_files();

 private:
  void work();
  LoadedBatch load(int64_t index);
  torch::Tensor load_sample(const PlannedSample& s);
  PlannedSample replacement_for(int64_t epoch, const Batch& batch, const PlannedSample& bad) const;
  torch::Tensor load_control(const std::filesystem::path& path, int width, int height) const;

  std::vector<ImageItem> items_;
  std::vector<config::DatasetConfig> datasets_;
  const LatentCodec& codec_;
  LoaderOptions o_;
  int64_t epoch_size_ = 0;
  int64_t next_to_load_ = 0;
  std::map<int64_t, std::vector<Batch>> plans_;        // by epoch (at most two kept)
  std::map<std::string, torch::Tensor> memory_cache_;  // cache_latents

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

}  // namespace gclab::data
