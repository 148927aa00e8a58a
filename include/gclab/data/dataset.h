// A training set as AI Toolkit reads one: folders of images with same-named caption files, each
// `resolution` its own copy of the dataset, bucketed by aspect ratio, batches that never mix buckets.
#pragma once

#include <filesystem>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gclab/config/config.h"
#include "gclab/config/user_error.h"
#include "gclab/data/buckets.h"
#include "gclab/data/video.h"

namespace gclab::data {

// A dataset that cannot be used at all (missing folder, no images): the message names the folder.
class DataError : public UserError {
 public:
  using UserError::UserError;
};

// One item of a dataset: an image, or (a video_dataset) a clip — a video file (`image` the file, `video` its
// stream) or a folder of numbered frames (`image` the folder, `frames` its frame files in name order); the
// caption is the same-named file beside either.
struct ImageItem {
  std::filesystem::path image;
  std::string caption;                            // raw, before trigger / dropout / shuffling
  int width = 0, height = 0;                      // the image's, or the clip's first frame's
  int dataset = 0;                                // index in the config's datasets
  std::vector<std::filesystem::path> controls{};  // edit models: the same-named image in each control_path
  std::filesystem::path inpaint{};                // inpaint_path's same-named .png / .webp (empty: none)
  std::filesystem::path mask{};  // the loss mask: mask_path's same-named image, or the image (alpha_mask)
  std::vector<std::filesystem::path> frames{};  // a folder clip's frames (empty: an image or a video file)
  std::optional<VideoInfo> video{};             // a video file's stream
  bool is_clip() const { return video || !frames.empty(); }
  int clip_length() const { return video ? video->frames : static_cast<int>(frames.size()); }
  // A video's rate; a folder's (or a video without one) the dataset's.
  double clip_fps(const config::DatasetConfig& d) const { return video && video->fps > 0 ? video->fps : d.fps; }
};

// Whether a dataset's items are clips (and images one frame each): num_frames > 1 or auto_frame_count, as
// AI Toolkit's is_video (toolkit/data_loader.py:396, data_transfer_object/data_loader.py:64).
bool video_dataset(const config::DatasetConfig& dataset);

// The frames an item trains at: 1 for an image; a clip's num_frames, or with auto_frame_count its own length
// at the dataset's fps snapped to `temporal` k + 1 (the autoencoder's temporal factor), as AI Toolkit's
// get_auto_frame_count computes it (toolkit/dataloader_mixins.py:484-509): n = int(total / clip fps * fps)
// (a folder of frames, at the dataset's fps: its length); with trim_auto_frame_count_tail (the default)
// max(0, n - 1) // t * t, else n // t * t; then + 1.
int item_frames(const ImageItem& item, const config::DatasetConfig& dataset, int temporal);

// The most frames a dataset's samples take: num_frames; with auto_frame_count its longest clip's item_frames
// (its folder scanned once a process: the videos' headers), nullopt when it cannot be scanned here (`why`
// says why).
// `index` names the dataset in `why`.
std::optional<int> most_frames(const config::DatasetConfig& dataset, int index, int temporal,
                               std::string* why = nullptr);

// The frames a sample of `num_frames` takes from a clip of `total` frames, as AI Toolkit's
// shrink_video_to_frames picks them (dataloader_mixins.py:563-566): spread evenly over the whole clip,
// min(int(round(i * (total - 1) / (num_frames - 1))), total - 1) with Python's round (halves to even) — a
// clip shorter than num_frames repeats frames.
std::vector<int> clip_frame_indices(int total, int num_frames);
// The frames a sample takes from a clip as AI Toolkit's load_and_process_video picks them
// (dataloader_mixins.py:550-588), n = item_frames: with auto_frame_count and trim_auto_frame_count_tail,
// min(round(i * clip fps / dataset fps), last) for i < n — real time from the clip's start, the tail
// trimmed; with shrink_video_to_frames (the default), or from a clip shorter than n, clip_frame_indices; else
// every max(1, round(clip fps / dataset fps))-th frame from a start drawn uniformly in
// [0, last - (n - 1) * interval] — spread evenly instead when the clip has fewer than n such frames. A
// folder of frames is taken to be at the dataset's fps.
std::vector<int> sample_frame_indices(const ImageItem& clip, const config::DatasetConfig& dataset, int temporal,
                                      std::mt19937_64& rng);

struct ScanResult {
  std::vector<ImageItem> items;
  std::vector<std::string> warnings;  // one per skipped or repaired file
  int skipped_images = 0;             // unreadable or corrupt
  int without_inpaint = 0;            // inpaint_path given, no file for the image: zeros beside images that have one
  int without_mask = 0;               // mask_path given, no file for the image: a zero mask beside images that have one
  int uncaptioned = 0;  // no caption file and no default_caption: trained on '' (+ the trigger), as AI Toolkit
};

// Lists the folder's images (sorted by name) and reads their sizes from headers and their captions — or,
// for a dataset of num_frames > 1, its clips: every folder below folder_path that holds images is one clip,
// captioned by the same-named caption file beside the folder (loose images and video files are skipped with
// a warning; control, inpainting and mask images are not read for clips: a DataError); with
// control_path, each image's same-named control image (any image extension) must exist in every
// control folder, or the image is skipped with a warning. The inpainting image and the loss mask are found as
// AI Toolkit finds them (dataloader_mixins.py:1000-1013, 1566-1580): an image without one has none; with
// alpha_mask an image without an alpha channel is a DataError (AI Toolkit fails on it when it loads).
// A missing folder or one without usable images is a DataError; unreadable files are skipped with a
// warning each.
ScanResult scan_dataset(const config::DatasetConfig& dataset, int index);

// The caption as one step of AI Toolkit's sees it (dataset.cpp cites the lines): caption_dropout_rate first
// (a dropped caption is ''), the parts between commas joined with ", " (shuffled with shuffle_tokens, every
// part), "[trigger]" / "[name]" replaced and the trigger word put in front with a space when absent; then the
// job's trigger_word in front of whatever lacks it, a dropped caption included ("sks ").
// AI Toolkit's get_caption (toolkit/dataloader_mixins.py:403-415) neither drops nor shuffles the captions of
// a dataset whose text embeddings are cached (train.cache_text_embeddings caches every dataset's): shuffling
// is turned off, with a warning. Caption dropout is not: load_prompt_embedding (:2239-2253) still draws it
// per item and loads the cached embedding of the dropout caption instead (get_dropout_caption, :2188-2193:
// the trigger word alone, or ''; text only, without an edit model's control images).
std::vector<std::string> disable_caption_randomness(config::DatasetConfig& dataset);

// The dropout caption AI Toolkit caches for an item (FileItemDTO.get_dropout_caption,
// toolkit/dataloader_mixins.py:2188-2193): its own trigger word — the dataset's, else the job's — put into
// '' ("dsw "), '' for an is_reg item or without a trigger word. What a dropped caption is when the dataset's
// text embeddings are cached; encoded live, it is the job's trigger word (process_caption).
std::string cached_dropout_caption(const config::DatasetConfig& dataset,
                                   const std::optional<std::string>& trigger_word);

// A dataset caption as the step trains on it (trigger, dropout, shuffling, as AI Toolkit's get_caption and
// the training step make it); `dropped` (when given) says whether caption dropout dropped it.
std::string process_caption(const std::string& raw, const config::DatasetConfig& dataset,
                            const std::optional<std::string>& trigger_word, std::mt19937_64& rng,
                            bool* dropped = nullptr);

// One sample of a batch: which item, where it goes, flipped or not.
struct PlannedSample {
  int item = 0;  // index into the item list given to plan_batches
  BucketPlacement placement;
  bool flip_x = false, flip_y = false;
  std::vector<int> frames;  // a clip's frame indices (sample_frame_indices; empty: an image)
};

struct Batch {
  int dataset = 0;
  int resolution = 0;
  BucketResolution bucket;
  std::vector<PlannedSample> samples;
};

// How items take buckets: the arch's divisibility of their sides, and its autoencoder's temporal factor
// (auto_frame_count snaps each clip's frames to it).
struct BucketRules {
  int divisibility = 16;
  int temporal = 1;
};

// One epoch of batches: each dataset's items at each of its resolutions (num_repeats times), grouped by
// bucket (its frames each item's item_frames), shuffled, cut into batches of the dataset's batch size (its
// own `batch_size` or the train block's); a short last batch of a bucket is filled by repeating its items.
// Deterministic for a seed.
std::vector<Batch> plan_epoch(const std::vector<ImageItem>& items, const std::vector<config::DatasetConfig>& datasets,
                              int default_batch_size, const BucketRules& rules, uint64_t seed);

// Bucket counts per dataset and resolution, from image sizes and clip lengths alone (what `gclab check` prints).
std::map<int, std::map<BucketResolution, int>> bucket_histogram(const std::vector<ImageItem>& items,
                                                                const config::DatasetConfig& dataset,
                                                                const BucketRules& rules);

}  // namespace gclab::data
