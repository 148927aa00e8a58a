#include "gclab/data/loader.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <sstream>

#include "gclab/data/image.h"
#include "gclab/data/masks.h"
#include "gclab/io/safetensors.h"
#include "gclab/memory/placement.h"
#include "gclab/memory/tracker.h"

namespace gclab::data {

namespace fs = std::filesystem;

namespace {

// A per-sample tensor of a batch, stacked when any sample has one, zeros for the others; undefined when none has
// (AI Toolkit's batches stack inpaint_tensor, mask_tensor, first_frame_latents so:
// toolkit/data_transfer_object/data_loader.py:293-305, 358-373, 399-412).
template <class Samples, class Get>
torch::Tensor stack_any(const Samples& samples, Get get) {
  const auto with = std::find_if(samples.begin(), samples.end(), [&](const auto& x) { return get(x).defined(); });
  if (with == samples.end()) return {};
  const torch::Tensor like = get(*with);
  std::vector<torch::Tensor> each;
  for (const auto& x : samples) {
    torch::Tensor t = get(x);
    each.push_back(t.defined() ? t : torch::zeros_like(like));
  }
  return torch::stack(each);
}

}  // namespace

CachedLatents LatentCache::find(const LatentSlot& slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (slot.memory) {
    const auto it = memory_.find(slot.key);
    if (it != memory_.end() && (!slot.first_frame || it->second.first_frame.defined())) return it->second;
  }
  std::error_code ec;
  if (slot.file.empty() || !fs::exists(slot.file, ec)) return {};
  try {
    const auto file = io::SafetensorsFile::open(slot.file);
    const auto m = file.metadata();
    if (!m.count("source") || m.at("source") != slot.stamp) return {};
    // A file written without the first frame's latents (do_i2v set since) is encoded again, with them.
    if (slot.first_frame && !file.contains("first_frame_latent")) return {};
    CachedLatents z{file.tensor("latent").clone(), {}};
    if (slot.first_frame) z.first_frame = file.tensor("first_frame_latent").clone();
    if (slot.memory) memory_[slot.key] = z;
    return z;
  } catch (const io::SafetensorsError&) {
    return {};  // a damaged cache file is rebuilt
  }
}

void LatentCache::store(const LatentSlot& slot, const CachedLatents& z) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (slot.memory) memory_[slot.key] = z;
  if (slot.file.empty()) return;
  std::vector<std::pair<std::string, torch::Tensor>> tensors = {{"latent", z.latents}};
  if (z.first_frame.defined()) tensors.emplace_back("first_frame_latent", z.first_frame);
  io::save_safetensors(slot.file, tensors, {{"source", slot.stamp}});
}

int64_t LatentCache::memory_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n = 0;
  for (const auto& [k, z] : memory_)
    n += static_cast<int64_t>(z.latents.nbytes() + (z.first_frame.defined() ? z.first_frame.nbytes() : 0));
  return n;
}

void remember_latents(const LoadedBatch& batch) {
  if (!batch.cache || !batch.latents.defined()) return;
  auto one = [](const torch::Tensor& t, size_t i) {
    return memory::to_host(t[static_cast<int64_t>(i)].detach().to(torch::kFloat).contiguous());
  };
  for (size_t i = 0; i < batch.slots.size(); ++i) {
    const LatentSlot& slot = batch.slots[i];
    if (!slot.cached()) continue;
    CachedLatents z{one(batch.latents, i), {}};
    if (slot.first_frame && batch.first_frame_latents.defined()) z.first_frame = one(batch.first_frame_latents, i);
    batch.cache->store(slot, z);
  }
}

BatchLoader::BatchLoader(std::vector<ImageItem> items, std::vector<config::DatasetConfig> datasets,
                         vae::ImageCodec& codec, const LoaderOptions& options, int64_t start_index)
    : items_(std::move(items)),
      datasets_(std::move(datasets)),
      codec_(codec),
      encode_here_(codec.encodes_on_loader_thread()),
      codec_key_([&codec] {
        // The latent channels, whether they carry frames (a video family's latents of one image have a frame
        // axis an image family's lack), and which autoencoder (its shape and weights) made them.
        std::ostringstream k;
        k << "_c" << codec.spec().latent_channels << (codec.spec().video ? "_frames" : "");
        if (codec.spec().autoencoder) {
          vae::CodecSpec what = codec.spec();
          what.tile_sample_size = 0;  // tiling changes the previews, not the latents
          k << "_vae" << std::hex << (std::hash<std::string>{}(what.describe()) & 0xffffffffu);
        }
        return k.str();
      }()),
      o_(options),
      next_to_load_(start_index) {
  if (o_.world_size < 1 || o_.rank < 0 || o_.rank >= o_.world_size)
    throw std::invalid_argument("rank " + std::to_string(o_.rank) + " is outside a world of " +
                                std::to_string(o_.world_size));
  std::vector<config::DatasetConfig> global = datasets_;  // the batches of all ranks together
  for (auto& ds : global)
    if (ds.batch_size) *ds.batch_size *= o_.world_size;
  plans_[0] = first_epoch_ =
      data::plan_epoch(items_, global, o_.batch_size * o_.world_size, {o_.divisibility, o_.temporal}, o_.seed);
  epoch_size_ = static_cast<int64_t>(plans_[0].size());
  if (epoch_size_ == 0) throw DataError("the datasets give no batches");
}

// One sample's latents, [C, F', h, w], and its first frame's, [C, 1, h, w], where its slot keeps them (AI
// Toolkit's _cache_one_latent: encode_images of the frames, then of frames[:, 0] alone, each a posterior sample
// of its own — toolkit/dataloader_mixins.py:2034-2064), CPU float32.
CachedLatents BatchLoader::encode_sample(const torch::Tensor& image, const LatentSlot& slot, const Encode& encode) {
  torch::NoGradGuard no_grad;
  const uint64_t key = std::hash<std::string>{}(slot.key);
  auto kept = [](const torch::Tensor& z) { return memory::to_host(z[0].detach().to(torch::kFloat).contiguous()); };
  CachedLatents z{kept(encode(image.unsqueeze(0), key)), {}};
  if (slot.first_frame) z.first_frame = kept(encode(image.narrow(1, 0, 1).unsqueeze(0).contiguous(), key + 1));
  return z;
}

int64_t BatchLoader::fill_caches(const Encode& encode) {
  // Every cacheable sample of the first epoch's plan, in each flip the dataset allows, grouped by size.
  std::map<std::pair<int, int>, std::vector<std::pair<PlannedSample, LatentSlot>>> todo;
  std::set<std::string> seen;
  for (const auto& batch : plans_.at(0)) {
    const auto [first, last] = my_slice(batch);
    for (size_t i = first; i < last; ++i) {
      const PlannedSample& planned = batch.samples[i];
      const auto& ds = datasets_[static_cast<size_t>(items_[static_cast<size_t>(planned.item)].dataset)];
      if (!ds.cache_latents && !ds.cache_latents_to_disk) continue;
      for (int fx = 0; fx <= (ds.flip_x ? 1 : 0); ++fx) {
        for (int fy = 0; fy <= (ds.flip_y ? 1 : 0); ++fy) {
          PlannedSample s = planned;
          s.flip_x = fx == 1, s.flip_y = fy == 1;
          LatentSlot slot = slot_for(s);
          if (!seen.insert(slot.key).second || cache_->find(slot).defined()) continue;
          todo[{s.placement.bucket.width, s.placement.bucket.height}].emplace_back(s, std::move(slot));
        }
      }
    }
  }
  int64_t encoded = 0;  // one image at a time, as AI Toolkit encodes them
  for (const auto& [size, samples] : todo) {
    for (const auto& [sample, slot] : samples) {
      torch::Tensor image;
      try {
        memory::HostScope host;  // read in host memory, as the batches are (work()): the encode copies it
        image = sample_image(sample);
      } catch (const ImageError&) {
        continue;  // reported, and replaced, when a batch meets it
      }
      cache_->store(slot, encode_sample(image, slot, encode));
      ++encoded;
    }
  }
  return encoded;
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

LoadedBatch BatchLoader::next() {
  if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return !ready_.empty() || error_; });
  if (ready_.empty() && error_) std::rethrow_exception(error_);
  LoadedBatch b = std::move(ready_.front());
  ready_.pop_front();
  cv_.notify_all();
  return b;
}

std::vector<std::string> BatchLoader::take_warnings() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(warnings_, {});
}

// The worker builds batches as a GPU run's loader does, in host memory (memory/placement.h): the step copies
// what it uses to the device.
void BatchLoader::work() {
  memory::HostScope host;
  try {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return stop_ || static_cast<int>(ready_.size()) < o_.prefetch; });
        if (stop_) return;
      }
      LoadedBatch b = load(next_to_load_++);
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.push_back(std::move(b));
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

LoadedBatch BatchLoader::load(int64_t index) {
  const int64_t epoch = index / epoch_size_;
  if (!plans_.count(epoch)) {
    // AI Toolkit builds its buckets, crops and batches once, in epoch 0 (setup_buckets returns early after
    // it, toolkit/dataloader_mixins.py:222-225); its DataLoader (shuffle=True, data_loader.py:749-753) only
    // reorders those batches each epoch.
    std::vector<Batch> batches = first_epoch_;
    std::mt19937_64 rng(o_.seed + static_cast<uint64_t>(epoch) * 1000003ull);
    std::shuffle(batches.begin(), batches.end(), rng);
    plans_[epoch] = std::move(batches);
    while (plans_.size() > 2) plans_.erase(plans_.begin());
  }
  const Batch& plan = plans_.at(epoch)[static_cast<size_t>(index % epoch_size_)];
  LoadedBatch out;
  out.index = index;
  out.epoch_start = index > 0 && index % epoch_size_ == 0;
  out.epoch = epoch;
  out.dataset = plan.dataset;
  out.resolution = plan.resolution;
  out.bucket = plan.bucket;
  std::vector<Sample> loaded;
  std::vector<PlannedSample> used;  // after replacing images that cannot be decoded
  std::vector<bool> text_only;      // per sample: its caption is the cached dropout caption
  const auto [first, last] = my_slice(plan);
  for (size_t i = first; i < last; ++i) {
    // Caption randomness (dropout, shuffling) and a mask's blur are a function of the sample's place (its batch,
    // its position in the global batch), not of history or of which rank loads it.
    std::mt19937_64 rng(o_.seed ^ (static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull) ^
                        (static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull));
    PlannedSample s = plan.samples[i];
    std::optional<Sample> sample;
    while (!sample) {
      if (!bad_items_.count(s.item)) {
        try {
          sample = load_sample(s, rng);
          continue;
        } catch (const ImageError& e) {
          std::lock_guard<std::mutex> lock(mutex_);
          bad_items_.insert(s.item);
          bad_files_.push_back(items_[static_cast<size_t>(s.item)].image.string());
          warnings_.push_back(std::string(e.what()) + "; it is replaced by another image of bucket " +
                              plan.bucket.key() + " and not used again");
        }
      }
      s = replacement_for(epoch, plan, s);
    }
    loaded.push_back(std::move(*sample));
    used.push_back(s);
    const auto& item = items_[static_cast<size_t>(s.item)];
    const config::DatasetConfig& dataset = datasets_[static_cast<size_t>(item.dataset)];
    bool dropped = false;
    out.captions.push_back(data::process_caption(item.caption, dataset, o_.trigger_word, rng, &dropped));
    // A dropped caption of a dataset whose embeddings are cached is the cached dropout embedding: text only
    // (get_blank_text_embedding_path(text_only=True), toolkit/dataloader_mixins.py:2226-2236), of the item's
    // own trigger word (get_dropout_caption, :2188-2193), not the job's the live path puts in.
    if (dropped && dataset.cache_text_embeddings)
      out.captions.back() = cached_dropout_caption(dataset, o_.trigger_word);
    text_only.push_back(dropped && dataset.cache_text_embeddings);
    out.image_files.push_back(item.image);
  }
  out.clips = std::all_of(used.begin(), used.end(),
                          [this](const PlannedSample& x) { return items_[static_cast<size_t>(x.item)].is_clip(); });
  // Latents when every sample has them; else the images, all of them, for the session to encode.
  const bool all_latents =
      std::all_of(loaded.begin(), loaded.end(), [](const Sample& x) { return x.latents.defined(); });
  std::vector<torch::Tensor> parts;
  for (size_t i = 0; i < loaded.size(); ++i) {
    parts.push_back(all_latents                 ? loaded[i].latents.latents
                    : loaded[i].image.defined() ? loaded[i].image
                                                : sample_image(used[i]));
    out.slots.push_back(loaded[i].slot);
  }
  (all_latents ? out.latents : out.images) = torch::stack(parts);
  out.cache = cache_;
  // The clips' first frames' latents (beside latents only), inpainting images and loss masks.
  if (all_latents) out.first_frame_latents = stack_any(loaded, [](const Sample& x) { return x.latents.first_frame; });
  out.inpaint_alpha = stack_any(loaded, [](const Sample& x) { return x.inpaint; });
  out.loss_mask = stack_any(loaded, [](const Sample& x) { return x.mask; });
  load_controls(plan, used, text_only, out);
  return out;
}

std::pair<size_t, size_t> BatchLoader::my_slice(const Batch& batch) const {
  const size_t per_rank = batch.samples.size() / static_cast<size_t>(o_.world_size);
  const size_t first = per_rank * static_cast<size_t>(o_.rank);
  return {first, first + per_rank};
}

// Controls: every sample of the batch has the same number (the dataset's control folders).
void BatchLoader::load_controls(const Batch& plan, const std::vector<PlannedSample>& used,
                                const std::vector<bool>& text_only, LoadedBatch& out) {
  const auto& first = items_[static_cast<size_t>(used.front().item)];
  if (first.controls.empty()) return;
  for (size_t i = 0; i < used.size() && o_.text_reads_controls; ++i)
    out.control_files.push_back(text_only[i] ? std::vector<std::filesystem::path>{}
                                             : items_[static_cast<size_t>(used[i].item)].controls);
  const BucketResolution ref =
      o_.controls_at_bucket ? plan.bucket : reference_size(plan.bucket, o_.divisibility, o_.reference_area);
  for (size_t c = 0; c < first.controls.size(); ++c) {
    std::vector<torch::Tensor> refs;
    for (const auto& s : used) {
      const ImageItem& item = items_[static_cast<size_t>(s.item)];
      const fs::path& file = item.controls.at(c);
      // At the batch's size: flipped, scaled to the image's scale_to size and cut at its crop, as AI
      // Toolkit's load_control_image places it (toolkit/dataloader_mixins.py:1174-1198).
      const std::vector<int>& background = datasets_[static_cast<size_t>(item.dataset)].control_transparent_color;
      if (o_.raw_controls) {
        const int64_t target = o_.match_target_res ? int64_t{plan.bucket.width} * plan.bucket.height : 0;
        try {
          refs.push_back(raw_reference_image(decode_control_rgb(file, background), o_.reference_area, target));
        } catch (const ImageError& e) {
          throw DataError(file.string() + ": " + e.what());
        }
        if (refs.back().sizes() != refs.front().sizes())
          throw DataError(file.string() + ": its reference is " + std::to_string(refs.back().size(2)) + "x" +
                          std::to_string(refs.back().size(1)) + ", another in its batch " +
                          std::to_string(refs.front().size(2)) + "x" + std::to_string(refs.front().size(1)) +
                          ": a batch's raw control images must give one size (AI Toolkit concatenates their "
                          "reference tokens over the batch); use batch_size 1 or control images of one size");
        continue;
      }
      refs.push_back(o_.controls_at_bucket ? to_unit_range(place_pixels(decode_control_rgb(file, background),
                                                                        s.placement, s.flip_x, s.flip_y))
                                           : load_image_cover(file, ref.width, ref.height, background));
    }
    torch::Tensor images = torch::stack(refs).unsqueeze(2);  // one frame each
    if (encode_here_) {
      torch::NoGradGuard no_grad;
      out.references.push_back(codec_.encode(images));
    } else {
      out.reference_images.push_back(images);
    }
  }
}

PlannedSample BatchLoader::replacement_for(int64_t epoch, const Batch& batch, const PlannedSample& bad) const {
  // The next usable sample of the same dataset, resolution and bucket in this epoch's plan, scanning
  // from the failed one's batch onwards: deterministic, so a resumed run picks the same replacement.
  const auto& plan = plans_.at(epoch);
  const size_t n = plan.size();
  size_t start = 0;
  for (size_t i = 0; i < n; ++i)
    if (&plan[i] == &batch) start = i;
  for (size_t k = 0; k < n; ++k) {
    const Batch& b = plan[(start + k) % n];
    if (b.dataset != batch.dataset || b.resolution != batch.resolution || !(b.bucket == batch.bucket)) continue;
    for (const auto& s : b.samples)
      if (s.item != bad.item && !bad_items_.count(s.item)) return s;
  }
  throw DataError(items_[static_cast<size_t>(bad.item)].image.string() +
                  " cannot be decoded and no other image of bucket " + batch.bucket.key() +
                  " can take its place; remove or repair it");
}

std::vector<std::string> BatchLoader::unusable_files() {
  std::lock_guard<std::mutex> lock(mutex_);
  return bad_files_;
}

LatentSlot BatchLoader::slot_for(const PlannedSample& s) const {
  const auto& item = items_[static_cast<size_t>(s.item)];
  const auto& ds = datasets_[static_cast<size_t>(item.dataset)];
  const auto& p = s.placement;
  std::ostringstream key;
  key << item.image.stem().string() << "_" << p.bucket.key() << "_" << p.scale_to_width << "x" << p.scale_to_height
      << "_" << p.crop_x << "_" << p.crop_y << (s.flip_x ? "_fx" : "") << (s.flip_y ? "_fy" : "") << codec_key_;
  // A clip's frames at the dataset's fps (shrink_video_to_frames: false) are another latent than spread ones.
  if (item.is_clip() && !ds.shrink_video_to_frames) key << "_fps" << ds.fps;
  // auto_frame_count: the clip's own length at fps; trimmed, other frames than spread ones (AI Toolkit's latent
  // info gains auto_frame_count and trim_auto_frame_count_tail, dataloader_mixins.py:1797-1804).
  if (item.is_clip() && ds.auto_frame_count) key << "_auto" << ds.fps << (ds.trim_auto_frame_count_tail ? "_trim" : "");
  LatentSlot slot;
  slot.first_frame = item.is_clip() && o_.first_frame_latents.count(item.dataset) > 0;
  slot.key = item.image.string() + "|" + key.str();
  slot.memory = ds.cache_latents;
  if (ds.cache_latents_to_disk) {
    // Next to the images, reused while the image (size and time) and the placement are unchanged.
    std::error_code ec;
    slot.file = item.image.parent_path() / "_latent_cache" / (key.str() + ".safetensors");
    for (const fs::path& file : item.frames.empty() ? std::vector<fs::path>{item.image} : item.frames)
      slot.stamp += (slot.stamp.empty() ? "" : ",") + std::to_string(fs::file_size(file, ec)) + ":" +
                    std::to_string(fs::last_write_time(file, ec).time_since_epoch().count());
  }
  return slot;
}

torch::Tensor BatchLoader::sample_image(const PlannedSample& s) const {
  const ImageItem& item = items_[static_cast<size_t>(s.item)];
  auto frame = [&](const fs::path& file) {
    return data::to_unit_range(place_pixels(data::decode_image_rgb(file), s.placement, s.flip_x, s.flip_y));
  };
  if (!item.is_clip()) return frame(item.image).unsqueeze(1).contiguous();
  // A clip: the frames the plan picked (sample_frame_indices), each flipped, scaled and cropped as an image
  // (load_and_process_video's process_frame), decoded once each.
  const std::vector<int> picked =
      s.frames.empty() ? clip_frame_indices(item.clip_length(), s.placement.bucket.frames) : s.frames;
  std::vector<torch::Tensor> decoded_video;
  if (item.video) decoded_video = decode_video_frames(item.image, picked);
  std::map<int, torch::Tensor> decoded;
  std::vector<torch::Tensor> frames;
  for (size_t k = 0; k < picked.size(); ++k) {
    auto& f = decoded[picked[k]];
    if (!f.defined())
      f = item.video ? data::to_unit_range(place_pixels(decoded_video[k], s.placement, s.flip_x, s.flip_y))
                     : frame(item.frames[static_cast<size_t>(picked[k])]);
    frames.push_back(f);
  }
  return torch::stack(frames, 1).contiguous();
}

BatchLoader::Sample BatchLoader::load_sample(const PlannedSample& s, std::mt19937_64& rng) {
  Sample out;
  const ImageItem& item = items_[static_cast<size_t>(s.item)];
  const config::DatasetConfig& dataset = datasets_[static_cast<size_t>(item.dataset)];
  if (!item.mask.empty()) out.mask = load_loss_mask(item.mask, dataset, s.placement, s.flip_x, s.flip_y, rng);
  if (o_.inpaint_images && !item.inpaint.empty()) {
    try {
      out.inpaint = load_inpaint_alpha(item.inpaint, s.placement, s.flip_x, s.flip_y);
    } catch (const ImageError& e) {  // load_inpaint_image prints it and goes on without (:1017-1069)
      std::lock_guard<std::mutex> lock(mutex_);
      warnings_.push_back(std::string(e.what()) + "; the image trains without an inpainting image");
    }
  }
  out.slot = slot_for(s);
  if (out.slot.cached()) {
    out.latents = cache_->find(out.slot);
    if (out.latents.defined()) return out;
  }
  out.image = sample_image(s);
  if (!encode_here_) return out;
  out.latents = encode_sample(out.image, out.slot,
                              [this](const torch::Tensor& images, uint64_t /*key*/) { return codec_.encode(images); });
  if (out.slot.cached()) cache_->store(out.slot, out.latents);
  out.image = torch::Tensor();
  return out;
}

}  // namespace gclab::data
