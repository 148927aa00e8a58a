#include "gclab/data/loader.h"

#include <cmath>
#include <filesystem>
#include <sstream>

#include "gclab/data/image.h"
#include "gclab/io/safetensors.h"

namespace gclab::data {

namespace fs = std::filesystem;

BatchLoader::BatchLoader(std::vector<ImageItem> items, std::vector<config::DatasetConfig> datasets,
                         const LatentCodec& codec, const LoaderOptions& options, int64_t start_index)
    : items_(std::move(items)), datasets_(std::move(datasets)), codec_(codec), o_(options), next_to_load_(start_index) {
  plans_[0] = data::plan_epoch(items_, datasets_, o_.batch_size, o_.divisibility, o_.seed);
  epoch_size_ = static_cast<int64_t>(plans_[0].size());
  if (epoch_size_ == 0) throw DataError("the datasets give no batches");
  worker_ = std::thread([this] { work(); });
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

void BatchLoader::work() {
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
    plans_[epoch] = data::plan_epoch(items_, datasets_, o_.batch_size, o_.divisibility,
                                     o_.seed + static_cast<uint64_t>(epoch) * 1000003ull);
    while (plans_.size() > 2) plans_.erase(plans_.begin());
  }
  const Batch& plan = plans_.at(epoch)[static_cast<size_t>(index % epoch_size_)];
  LoadedBatch out;
  out.index = index;
  out.epoch_start = index > 0 && index % epoch_size_ == 0;
  out.dataset = plan.dataset;
  out.resolution = plan.resolution;
  out.bucket = plan.bucket;
  // Caption randomness (dropout, shuffling) is a function of the batch's position, not of history.
  std::mt19937_64 rng(o_.seed ^ (static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull));
  std::vector<torch::Tensor> latents;
  std::vector<PlannedSample> used;  // after replacing images that cannot be decoded
  for (const auto& planned : plan.samples) {
    PlannedSample s = planned;
    torch::Tensor z;
    while (!z.defined()) {
      if (!bad_items_.count(s.item)) {
        try {
          z = load_sample(s);
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
    latents.push_back(z);
    used.push_back(s);
    const auto& item = items_[static_cast<size_t>(s.item)];
    out.captions.push_back(
        data::process_caption(item.caption, datasets_[static_cast<size_t>(item.dataset)], o_.trigger_word, rng));
  }
  out.latents = torch::stack(latents);
  // Controls: every sample of the batch has the same number (the dataset's control folders).
  const auto& first = items_[static_cast<size_t>(used.front().item)];
  if (!first.controls.empty()) {
    const BucketResolution ref = reference_size(plan.bucket, o_.divisibility);
    const int rw = ref.width, rh = ref.height;
    for (size_t c = 0; c < first.controls.size(); ++c) {
      std::vector<torch::Tensor> refs;
      for (const auto& s : used)
        refs.push_back(load_control(items_[static_cast<size_t>(s.item)].controls.at(c), rw, rh));
      out.references.push_back(torch::stack(refs));
    }
  }
  return out;
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

torch::Tensor BatchLoader::load_control(const fs::path& path, int width, int height) const {
  torch::Tensor rgb = data::decode_image_rgb(path);
  const double scale = std::max(static_cast<double>(width) / rgb.size(1), static_cast<double>(height) / rgb.size(0));
  const int sw = std::max(width, static_cast<int>(std::ceil(rgb.size(1) * scale)));
  const int sh = std::max(height, static_cast<int>(std::ceil(rgb.size(0) * scale)));
  rgb = data::resize_rgb(rgb, sw, sh).narrow(0, (sh - height) / 2, height).narrow(1, (sw - width) / 2, width);
  torch::NoGradGuard no_grad;
  return codec_.encode(data::to_unit_range(rgb).unsqueeze(0))[0].contiguous();
}

torch::Tensor BatchLoader::load_sample(const PlannedSample& s) {
  const auto& item = items_[static_cast<size_t>(s.item)];
  const auto& ds = datasets_[static_cast<size_t>(item.dataset)];
  const auto& p = s.placement;
  std::ostringstream key;
  key << item.image.stem().string() << "_" << p.bucket.key() << "_" << p.scale_to_width << "x" << p.scale_to_height
      << "_" << p.crop_x << "_" << p.crop_y << (s.flip_x ? "_fx" : "") << (s.flip_y ? "_fy" : "") << "_c"
      << codec_.channels();
  const std::string cache_key = item.image.string() + "|" + key.str();
  if (ds.cache_latents) {
    const auto it = memory_cache_.find(cache_key);
    if (it != memory_cache_.end()) return it->second;
  }
  // On disk: next to the images, reused while the image (size and time) and the placement are unchanged.
  const fs::path disk = item.image.parent_path() / "_latent_cache" / (key.str() + ".safetensors");
  std::error_code ec;
  std::string stamp;  // the image's size and time: a changed image invalidates its cached latents
  if (ds.cache_latents_to_disk)
    stamp = std::to_string(fs::file_size(item.image, ec)) + ":" +
            std::to_string(fs::last_write_time(item.image, ec).time_since_epoch().count());
  if (ds.cache_latents_to_disk && fs::exists(disk, ec)) {
    try {
      const auto file = io::SafetensorsFile::open(disk);
      const auto m = file.metadata();
      if (m.count("source") && m.at("source") == stamp) {
        torch::Tensor z = file.tensor("latent").clone();
        if (ds.cache_latents) memory_cache_[cache_key] = z;
        return z;
      }
    } catch (const io::SafetensorsError&) {
      // A damaged cache file is rebuilt below.
    }
  }
  torch::Tensor rgb = data::decode_image_rgb(item.image);
  rgb = data::resize_rgb(rgb, p.scale_to_width, p.scale_to_height);
  rgb = rgb.narrow(0, p.crop_y, p.bucket.height).narrow(1, p.crop_x, p.bucket.width);
  if (s.flip_x) rgb = rgb.flip({1});
  if (s.flip_y) rgb = rgb.flip({0});
  torch::Tensor z;
  {
    torch::NoGradGuard no_grad;
    z = codec_.encode(data::to_unit_range(rgb).unsqueeze(0))[0].contiguous();
  }
  if (ds.cache_latents) memory_cache_[cache_key] = z;
  if (ds.cache_latents_to_disk) io::save_safetensors(disk, {{"latent", z}}, {{"source", stamp}});
  return z;
}

}  // namespace gclab::data
