#include "gclab/data/dataset.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "gclab/data/image.h"

namespace gclab::data {

namespace fs = std::filesystem;

namespace {

// Keeps whole UTF-8 sequences; drops a sequence cut short (a truncated file) or malformed bytes.
std::string valid_utf8(const std::string& s, bool* repaired) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      *repaired = true;
      ++i;
    }
  }
  return out;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  for (std::string p; std::getline(in, p, ',');) parts.push_back(trim(p));
  return parts;
}

}  // namespace

ScanResult scan_dataset(const config::DatasetConfig& dataset, int index) {
  const std::string where = "datasets[" + std::to_string(index) + "]";
  if (!dataset.folder_path) throw DataError(where + ": no folder_path");
  const fs::path folder = *dataset.folder_path;
  std::error_code ec;
  if (!fs::is_directory(folder, ec))
    throw DataError(where + ".folder_path: '" + folder.string() + "' does not exist or is not a folder");
  std::vector<fs::path> images;
  for (const auto& entry : fs::directory_iterator(folder, ec))
    if (entry.is_regular_file() && is_image_file(entry.path())) images.push_back(entry.path());
  std::sort(images.begin(), images.end());
  ScanResult result;
  for (const auto& path : images) {
    std::string why;
    const auto size = read_image_size(path, &why);
    if (!size) {
      result.warnings.push_back(path.string() + ": skipped, not a readable image (" + why + ")");
      ++result.skipped_images;
      continue;
    }
    fs::path caption_path = path;
    caption_path.replace_extension(dataset.caption_ext);
    std::string caption;
    if (std::ifstream in{caption_path, std::ios::binary}) {
      std::stringstream text;
      text << in.rdbuf();
      bool repaired = false;
      caption = trim(valid_utf8(text.str(), &repaired));
      if (repaired)
        result.warnings.push_back(caption_path.string() +
                                  ": invalid or truncated UTF-8; the broken bytes were dropped");
      if (caption.empty() && dataset.default_caption) caption = *dataset.default_caption;
    } else if (dataset.default_caption) {
      caption = *dataset.default_caption;
    } else {
      result.warnings.push_back(path.string() + ": skipped, no caption file " + caption_path.filename().string() +
                                " and no default_caption");
      ++result.skipped_captions;
      continue;
    }
    std::vector<fs::path> controls;
    bool have_controls = true;
    for (const auto& folder : dataset.control_path) {
      fs::path found;
      for (const char* ext : {".png", ".jpg", ".jpeg", ".webp", ".PNG", ".JPG", ".JPEG", ".WEBP"}) {
        const fs::path candidate = fs::path(folder) / (path.stem().string() + ext);
        if (fs::exists(candidate, ec)) {
          found = candidate;
          break;
        }
      }
      if (found.empty()) {
        result.warnings.push_back(path.string() + ": skipped, no control image " + path.stem().string() + ".* in " +
                                  folder);
        ++result.skipped_images;
        have_controls = false;
        break;
      }
      controls.push_back(found);
    }
    if (!have_controls) continue;
    result.items.push_back({path, caption, size->width, size->height, index, controls});
  }
  if (result.items.empty())
    throw DataError(where + ".folder_path: '" + folder.string() + "' has no usable images (" +
                    std::to_string(images.size()) + " image files, " + std::to_string(result.skipped_images) +
                    " unreadable, " + std::to_string(result.skipped_captions) + " without a caption)");
  return result;
}

std::vector<std::string> disable_caption_randomness(config::DatasetConfig& dataset) {
  std::vector<std::string> warnings;
  if (dataset.caption_dropout_rate > 0) {
    warnings.push_back("caption_dropout_rate is ignored with cache_text_embeddings (as in AI Toolkit)");
    dataset.caption_dropout_rate = 0;
  }
  if (dataset.shuffle_tokens) {
    warnings.push_back("shuffle_tokens is ignored with cache_text_embeddings (as in AI Toolkit)");
    dataset.shuffle_tokens = false;
  }
  return warnings;
}

std::string process_caption(const std::string& raw, const config::DatasetConfig& dataset,
                            const std::optional<std::string>& trigger_word, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  if (dataset.caption_dropout_rate > 0 && uniform(rng) < dataset.caption_dropout_rate) return "";
  std::string caption = raw;
  const std::optional<std::string> trigger = dataset.trigger_word ? dataset.trigger_word : trigger_word;
  if (dataset.shuffle_tokens) {
    auto parts = split_commas(caption);
    const size_t keep = std::min<size_t>(static_cast<size_t>(std::max(dataset.keep_tokens, 0)), parts.size());
    std::shuffle(parts.begin() + static_cast<std::ptrdiff_t>(keep), parts.end(), rng);
    caption.clear();
    for (const auto& p : parts) caption += (caption.empty() ? "" : ", ") + p;
  }
  if (trigger) {
    const std::string tag = "[trigger]";
    if (caption.find(tag) != std::string::npos) {
      for (size_t at; (at = caption.find(tag)) != std::string::npos;) caption.replace(at, tag.size(), *trigger);
    } else if (caption.find(*trigger) == std::string::npos) {
      caption = caption.empty() ? *trigger : *trigger + ", " + caption;
    }
  }
  return caption;
}

std::vector<Batch> plan_epoch(const std::vector<ImageItem>& items, const std::vector<config::DatasetConfig>& datasets,
                              int default_batch_size, int divisibility, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Batch> batches;
  for (size_t d = 0; d < datasets.size(); ++d) {
    const auto& ds = datasets[d];
    const int batch_size = ds.batch_size.value_or(default_batch_size);
    for (int resolution : ds.resolution) {
      std::map<BucketResolution, std::vector<PlannedSample>> buckets;
      for (size_t i = 0; i < items.size(); ++i) {
        if (items[i].dataset != static_cast<int>(d)) continue;
        for (int r = 0; r < std::max(ds.num_repeats, 1); ++r) {
          PlannedSample s;
          s.item = static_cast<int>(i);
          s.placement = place_in_bucket(items[i].width, items[i].height, resolution, divisibility,
                                        ds.random_crop ? &rng : nullptr);
          s.flip_x = ds.flip_x && (rng() & 1);
          s.flip_y = ds.flip_y && (rng() & 1);
          buckets[s.placement.bucket].push_back(s);
        }
      }
      for (auto& [bucket, samples] : buckets) {
        std::shuffle(samples.begin(), samples.end(), rng);
        for (size_t start = 0; start < samples.size(); start += static_cast<size_t>(batch_size)) {
          Batch b{static_cast<int>(d), resolution, bucket, {}};
          for (size_t k = 0; k < static_cast<size_t>(batch_size); ++k) {
            // A short last batch repeats the bucket's own items (AI Toolkit pads the same way).
            const size_t at = start + k < samples.size() ? start + k : start + (k % (samples.size() - start));
            b.samples.push_back(samples[at]);
          }
          batches.push_back(std::move(b));
        }
      }
    }
  }
  std::shuffle(batches.begin(), batches.end(), rng);
  return batches;
}

std::map<int, std::map<BucketResolution, int>> bucket_histogram(const std::vector<ImageItem>& items,
                                                                const config::DatasetConfig& dataset,
                                                                int divisibility) {
  std::map<int, std::map<BucketResolution, int>> out;
  for (int resolution : dataset.resolution)
    for (const auto& item : items) ++out[resolution][bucket_for(item.width, item.height, resolution, divisibility)];
  return out;
}

}  // namespace gclab::data
