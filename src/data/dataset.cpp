#include "gclab/data/dataset.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
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

// Python's text.split(',') and ', '.join(parts), as AI Toolkit's get_caption uses them: the pieces as they
// are, spaces kept ("a, b" comes back as "a,  b").
std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> parts;
  size_t from = 0;
  for (size_t at; (at = s.find(',', from)) != std::string::npos; from = at + 1)
    parts.push_back(s.substr(from, at - from));
  parts.push_back(s.substr(from));
  return parts;
}
std::string join_commas(const std::vector<std::string>& parts) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out;
}

// AI Toolkit's inject_trigger_into_prompt (toolkit/prompt_utils.py:715-742): "[name]" and "[trigger]" become
// the trigger ('' without one); a non-blank trigger the text lacks is put in front, followed by a space.
std::string inject_trigger(std::string text, const std::optional<std::string>& trigger, bool add_if_absent) {
  const std::string with = trigger.value_or("");
  for (const std::string tag : {"[name]", "[trigger]"})
    for (size_t at = 0; (at = text.find(tag, at)) != std::string::npos; at += with.size())
      text.replace(at, tag.size(), with);
  if (add_if_absent && !trim(with).empty() && text.find(with) == std::string::npos) text = with + " " + text;
  return text;
}

// Python's text mode (open(..., 'r')): "\r\n" and a lone "\r" read as "\n".
std::string universal_newlines(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\r') {
      out += s[i];
      continue;
    }
    out += '\n';
    if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
  }
  return out;
}

// The folder and every folder below it, as AI Toolkit's os.walk (toolkit/data_loader.py:438-450): hidden
// folders and files (a leading '.') left out, and the images of any `_controls` folder; sorted.
std::vector<fs::path> image_files_below(const fs::path& folder, bool (*accept)(const fs::path&) = is_image_file) {
  std::error_code ec;
  std::vector<fs::path> images;
  for (auto it = fs::recursive_directory_iterator(folder, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    if (it->is_directory(ec)) {
      if (!name.empty() && name[0] == '.') it.disable_recursion_pending();
      continue;
    }
    if (!name.empty() && name[0] != '.' && it->is_regular_file(ec) && accept(it->path()) &&
        it->path().parent_path().filename() != "_controls")
      images.push_back(it->path());
  }
  std::sort(images.begin(), images.end());
  return images;
}

// The caption as AI Toolkit's load_caption reads it (toolkit/dataloader_mixins.py:344-364): the file's text
// as it is (clean_caption changes nothing; no strip), default_caption when it is blank or missing, and ''
// for an image without one — which still trains, on the trigger word alone if there is one. What it finds
// wrong goes into `result`'s warnings and counts.
std::string read_caption(const config::DatasetConfig& dataset, const fs::path& image, ScanResult& result) {
  fs::path caption_path = image;
  caption_path.replace_extension(dataset.caption_ext);
  if (std::ifstream in{caption_path, std::ios::binary}) {
    std::stringstream text;
    text << in.rdbuf();
    bool repaired = false;
    std::string caption = universal_newlines(valid_utf8(text.str(), &repaired));
    if (repaired)
      result.warnings.push_back(caption_path.string() + ": invalid or truncated UTF-8; the broken bytes were dropped");
    if (trim(caption).empty() && dataset.default_caption) caption = *dataset.default_caption;
    return caption;
  }
  if (dataset.default_caption) return *dataset.default_caption;
  result.warnings.push_back(image.string() + ": no caption file " + caption_path.filename().string() +
                            " and no default_caption: trained on the empty caption (the trigger word alone, "
                            "with one), as AI Toolkit does");
  ++result.uncaptioned;
  return "";
}

// Names in natural order: runs of digits compare as numbers ("frame2" before "frame10", as a frame
// sequence written without zero padding, ffmpeg's %d, is meant), the rest as text.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      const std::string x = a.substr(i, ie - i), y = b.substr(j, je - j);
      const std::string xs = x.substr(std::min(x.find_first_not_of('0'), x.size())),
                        ys = y.substr(std::min(y.find_first_not_of('0'), y.size()));
      if (xs.size() != ys.size()) return xs.size() < ys.size();
      if (xs != ys) return xs < ys;
      i = ie, j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i, ++j;
  }
  return a.size() - i < b.size() - j;
}

// A video dataset's items (video_dataset), as AI Toolkit's video datasets hold them (toolkit/data_loader.py:
// 433-436, data_transfer_object/data_loader.py:64-68): each video file below `folder` a clip; each image
// directly in it an item of one frame; and (gclab's own) each folder below it holding images a clip, its frames
// those images in natural name order (frame2 before frame10), sized by the first.
ScanResult scan_clips(const config::DatasetConfig& dataset, int index, const std::string& where) {
  const std::string frames =
      dataset.auto_frame_count ? "auto_frame_count" : "num_frames " + std::to_string(dataset.num_frames);
  if (!dataset.control_path.empty() || dataset.inpaint_path || dataset.mask_path || dataset.alpha_mask)
    throw DataError(where + ": control, inpainting and mask images are not read for clips (" + frames +
                    "); set num_frames: 1 and auto_frame_count: false, or remove them");
  const fs::path folder = *dataset.folder_path;
  std::map<fs::path, std::vector<fs::path>> clips;
  ScanResult result;
  for (const auto& path : image_files_below(folder)) {
    if (path.parent_path() != folder) {
      clips[path.parent_path()].push_back(path);
      continue;
    }
    std::string why;
    if (const auto size = read_image_size(path, &why))
      result.items.push_back({path, read_caption(dataset, path, result), size->width, size->height, index});
    else
      result.warnings.push_back(path.string() + ": skipped, not a readable image (" + why + ")"),
          ++result.skipped_images;
  }
  const std::vector<fs::path> videos = image_files_below(folder, is_video_file);
  if (std::string why; !videos.empty() && !video_support(&why))
    throw DataError(where + ".folder_path: '" + folder.string() + "' holds video files (" + videos.front().string() +
                    "), which this gclab cannot read: " + why);
  for (const auto& path : videos) {
    std::string why;
    const auto info = probe_video(path, &why);
    if (!info) {
      result.warnings.push_back(path.string() + ": skipped, not a readable video (" + why + ")");
      ++result.skipped_images;
      continue;
    }
    if (dataset.auto_frame_count && !(info->fps > 0)) {  // AI Toolkit's total / fps raises, the item skipped
      result.warnings.push_back(path.string() + ": skipped, its frame rate is unknown (auto_frame_count times it)");
      ++result.skipped_images;
      continue;
    }
    ImageItem item{path, read_caption(dataset, path, result), info->width, info->height, index};
    item.video = info;
    result.items.push_back(std::move(item));
  }
  for (auto& [clip, frames] : clips) {
    std::sort(frames.begin(), frames.end(), [](const fs::path& a, const fs::path& b) {
      return natural_less(a.filename().string(), b.filename().string());
    });
    std::string why;
    const auto size = read_image_size(frames.front(), &why);
    if (!size) {
      result.warnings.push_back(clip.string() + ": skipped, its first frame is not a readable image (" + why + ")");
      ++result.skipped_images;
      continue;
    }
    ImageItem item{clip, read_caption(dataset, clip, result), size->width, size->height, index, {}, {}, {}, frames};
    result.items.push_back(std::move(item));
  }
  std::sort(result.items.begin(), result.items.end(),
            [](const ImageItem& a, const ImageItem& b) { return a.image < b.image; });
  if (std::none_of(result.items.begin(), result.items.end(), [](const ImageItem& i) { return i.is_clip(); }))
    throw DataError(where + ".folder_path: '" + folder.string() + "' has no clips (video files, or folders of " +
                    "frames) for " + frames);
  return result;
}

}  // namespace

std::vector<int> clip_frame_indices(int total, int num_frames) {
  const int last = total - 1;
  const double interval = num_frames > 1 ? static_cast<double>(last) / (num_frames - 1) : 0.0;
  std::vector<int> out;
  for (int i = 0; i < num_frames; ++i)
    out.push_back(std::min(static_cast<int>(std::nearbyint(i * interval)), last));  // round half to even
  return out;
}

bool video_dataset(const config::DatasetConfig& dataset) { return dataset.num_frames > 1 || dataset.auto_frame_count; }

int item_frames(const ImageItem& item, const config::DatasetConfig& dataset, int temporal) {
  if (!item.is_clip()) return 1;
  if (!dataset.auto_frame_count) return dataset.num_frames;
  const double seconds = static_cast<double>(item.clip_length()) / item.clip_fps(dataset);
  const int n = item.video ? static_cast<int>(seconds * dataset.fps) : item.clip_length();
  const int t = std::max(temporal, 1);
  return (dataset.trim_auto_frame_count_tail ? std::max(0, n - 1) / t * t : n / t * t) + 1;
}

std::vector<int> sample_frame_indices(const ImageItem& clip, const config::DatasetConfig& dataset, int temporal,
                                      std::mt19937_64& rng) {
  const int total = clip.clip_length(), n = item_frames(clip, dataset, temporal);
  const int last = total - 1;
  if (dataset.auto_frame_count && dataset.trim_auto_frame_count_tail) {
    const double ratio = clip.clip_fps(dataset) / dataset.fps;
    std::vector<int> out;
    for (int i = 0; i < n; ++i) out.push_back(std::min(static_cast<int>(std::nearbyint(i * ratio)), last));
    return out;
  }
  if (dataset.shrink_video_to_frames || total < n) return clip_frame_indices(total, n);
  const int interval = std::max(1, static_cast<int>(std::nearbyint(clip.clip_fps(dataset) / dataset.fps)));
  if (total / interval < n) return clip_frame_indices(total, n);
  const int start = std::uniform_int_distribution<int>(0, std::max(0, last - (n - 1) * interval))(rng);
  std::vector<int> out;
  for (int i = 0; i < n; ++i) out.push_back(std::min(start + i * interval, last));
  return out;
}

std::optional<int> most_frames(const config::DatasetConfig& dataset, int index, int temporal, std::string* why) {
  if (!dataset.auto_frame_count) return dataset.num_frames;
  // Every verb plans the cells several times (the plan, the walks' twins, the reports): the folder is scanned
  // once a process for each way of counting it.
  static std::mutex mutex;
  static std::map<std::string, std::pair<std::optional<int>, std::string>> scanned;
  std::ostringstream key;
  key << index << '|' << dataset.folder_path.value_or("") << '|' << dataset.fps << '|'
      << dataset.trim_auto_frame_count_tail << '|' << temporal << '|' << dataset.control_path.size() << '|'
      << dataset.inpaint_path.has_value() << dataset.mask_path.has_value() << dataset.alpha_mask;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = scanned.find(key.str());
  if (it == scanned.end()) {
    std::pair<std::optional<int>, std::string> result;
    try {
      int most = 0;
      for (const ImageItem& item : scan_dataset(dataset, index).items)
        most = std::max(most, item_frames(item, dataset, temporal));
      result.first = most;
    } catch (const DataError& e) {
      result.second = e.what();
    }
    it = scanned.emplace(key.str(), std::move(result)).first;
  }
  if (why) *why = it->second.second;
  return it->second.first;
}

ScanResult scan_dataset(const config::DatasetConfig& dataset, int index) {
  const std::string where = "datasets[" + std::to_string(index) + "]";
  if (!dataset.folder_path) throw DataError(where + ": no folder_path");
  const fs::path folder = *dataset.folder_path;
  std::error_code ec;
  if (!fs::is_directory(folder, ec))
    throw DataError(where + ".folder_path: '" + folder.string() + "' does not exist or is not a folder");
  if (video_dataset(dataset)) return scan_clips(dataset, index, where);
  const std::vector<fs::path> images = image_files_below(folder);
  ScanResult result;
  for (const auto& path : images) {
    std::string why;
    const auto size = read_image_size(path, &why);
    if (!size) {
      result.warnings.push_back(path.string() + ": skipped, not a readable image (" + why + ")");
      ++result.skipped_images;
      continue;
    }
    const std::string caption = read_caption(dataset, path, result);
    // The same-named file in `folder` with the first of `extensions` that exists (empty: none).
    auto same_named = [&](const std::string& folder, std::initializer_list<const char*> extensions) {
      for (const char* ext : extensions) {
        const fs::path candidate = fs::path(folder) / (path.stem().string() + ext);
        if (fs::exists(candidate, ec)) return candidate;
      }
      return fs::path();
    };
    std::vector<fs::path> controls;
    bool have_controls = true;
    for (const auto& folder : dataset.control_path) {
      const fs::path found = same_named(folder, {".png", ".jpg", ".jpeg", ".webp", ".PNG", ".JPG", ".JPEG", ".WEBP"});
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
    ImageItem item{path, caption, size->width, size->height, index, controls, {}, {}, {}};
    if (dataset.inpaint_path) {
      item.inpaint = same_named(*dataset.inpaint_path, {".png", ".webp"});
      if (!item.inpaint.empty() && !opens_as_rgba(item.inpaint)) {  // load_inpaint_image returns without one
        result.warnings.push_back(item.inpaint.string() + ": not an RGBA image, so no inpainting mask for " +
                                  path.filename().string() + " (AI Toolkit reads none from it either)");
        item.inpaint.clear();
      }
      if (item.inpaint.empty()) ++result.without_inpaint;
    }
    if (dataset.alpha_mask) {
      if (!opens_as_rgba(path))
        throw DataError(where + ".alpha_mask: " + path.string() +
                        " has no alpha channel (AI Toolkit fails on it); give it one (RGBA .png / .webp) or turn "
                        "alpha_mask off");
      item.mask = path;
    } else if (dataset.mask_path) {
      item.mask = same_named(*dataset.mask_path, {".jpg", ".jpeg", ".png", ".webp"});
      if (item.mask.empty()) ++result.without_mask;
    }
    result.items.push_back(std::move(item));
  }
  // A batch stacks a zero tensor for an image without one when another image has one
  // (toolkit/data_transfer_object/data_loader.py:358-373, 399-412).
  if (result.without_inpaint)
    result.warnings.push_back(where + ".inpaint_path: " + std::to_string(result.without_inpaint) +
                              " images have no same-named .png / .webp there; batched with one that has, each gets "
                              "a zero alpha (inpaint everything), as AI Toolkit does");
  if (result.without_mask)
    result.warnings.push_back(where + ".mask_path: " + std::to_string(result.without_mask) +
                              " images have no same-named mask there; batched with one that has, each gets a zero "
                              "loss mask (it does not train), as AI Toolkit does");
  if (result.items.empty())
    throw DataError(where + ".folder_path: '" + folder.string() + "' has no usable images (" +
                    std::to_string(images.size()) + " image files, " + std::to_string(result.skipped_images) +
                    " unreadable)");
  return result;
}

std::vector<std::string> disable_caption_randomness(config::DatasetConfig& dataset) {
  std::vector<std::string> warnings;
  dataset.cache_text_embeddings = true;  // what train.cache_text_embeddings sets on every dataset
  if (dataset.shuffle_tokens) {
    warnings.push_back("shuffle_tokens is ignored with cache_text_embeddings (as in AI Toolkit)");
    dataset.shuffle_tokens = false;
  }
  return warnings;
}

std::string cached_dropout_caption(const config::DatasetConfig& dataset,
                                   const std::optional<std::string>& trigger_word) {
  const std::optional<std::string> item_trigger = dataset.trigger_word ? dataset.trigger_word : trigger_word;
  if (!item_trigger || dataset.is_reg) return "";
  return inject_trigger("", item_trigger, true);
}

std::string process_caption(const std::string& raw, const config::DatasetConfig& dataset,
                            const std::optional<std::string>& trigger_word, std::mt19937_64& rng, bool* dropped) {
  // A dataset without a trigger word of its own takes the job's (BaseSDTrainProcess.py:168-169).
  const std::optional<std::string> dataset_trigger = dataset.trigger_word ? dataset.trigger_word : trigger_word;
  // A regularization dataset's captions get no trigger put in front: get_caption adds it only when the item
  // is not is_reg (toolkit/dataloader_mixins.py:389-392), the training step likewise (BaseSDTrainProcess.py:
  // 1075-1080); "[trigger]" tags are still replaced. Its dropout caption is '' (:2188-2193).
  const bool add = !dataset.is_reg;
  // get_caption (toolkit/dataloader_mixins.py:403-455): a dropped caption is '' before anything else; a kept
  // one is split on ',' and joined with ', ' (shuffled before and after the trigger goes in, every token:
  // keep_tokens guards only token dropout there), its tags replaced and the trigger put in front if absent.
  std::string caption;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const bool drop = dataset.caption_dropout_rate > 0 && uniform(rng) < dataset.caption_dropout_rate;
  if (dropped) *dropped = drop;
  if (!drop) {
    auto tokens = split_commas(raw);
    if (dataset.shuffle_tokens) std::shuffle(tokens.begin(), tokens.end(), rng);
    caption = inject_trigger(join_commas(tokens), dataset_trigger, add && dataset_trigger.has_value());
    if (dataset.shuffle_tokens) {
      tokens = split_commas(caption);
      std::shuffle(tokens.begin(), tokens.end(), rng);
      caption = join_commas(tokens);
    }
  }
  // Then the training step (BaseSDTrainProcess.py:1076-1081) puts the job's trigger word in front of every
  // caption that lacks it — a dropped one too: '' becomes "trigger ".
  if (trigger_word) caption = inject_trigger(caption, trigger_word, add);
  return caption;
}

std::vector<Batch> plan_epoch(const std::vector<ImageItem>& items, const std::vector<config::DatasetConfig>& datasets,
                              int default_batch_size, const BucketRules& rules, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Batch> batches;
  for (size_t d = 0; d < datasets.size(); ++d) {
    const auto& ds = datasets[d];
    const int batch_size = ds.batch_size.value_or(default_batch_size);
    for (int resolution : ds.resolution) {
      std::map<BucketResolution, std::vector<PlannedSample>> buckets;
      for (size_t i = 0; i < items.size(); ++i) {
        if (items[i].dataset != static_cast<int>(d)) continue;
        // flip_x / flip_y add a flipped copy of every image (AI Toolkit's file list grows: x-flipped copies,
        // then y-flipped copies of all of those, toolkit/data_loader.py:574-592), each its own sample.
        for (int r = 0; r < std::max(ds.num_repeats, 1); ++r)
          for (int fx = 0; fx <= (ds.flip_x ? 1 : 0); ++fx)
            for (int fy = 0; fy <= (ds.flip_y ? 1 : 0); ++fy) {
              PlannedSample s;
              s.item = static_cast<int>(i);
              s.placement = place_in_bucket(items[i].width, items[i].height, resolution, rules.divisibility,
                                            ds.random_crop ? &rng : nullptr);
              // AI Toolkit's bucket key holds the frames (dataloader_mixins.py:299-302): an image of a video
              // dataset is a sample of one frame, never batched with clips of more; with auto_frame_count each
              // clip's own (data_transfer_object/data_loader.py:163-166) — a clip of one frame shares the
              // images' bucket, as AI Toolkit's `x1f` key shares it.
              s.placement.bucket.frames = item_frames(items[i], ds, rules.temporal);
              if (items[i].is_clip()) s.frames = sample_frame_indices(items[i], ds, rules.temporal, rng);
              s.flip_x = fx == 1, s.flip_y = fy == 1;
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
                                                                const BucketRules& rules) {
  std::map<int, std::map<BucketResolution, int>> out;
  for (int resolution : dataset.resolution)
    for (const auto& item : items) {
      BucketResolution bucket = bucket_for(item.width, item.height, resolution, rules.divisibility);
      bucket.frames = item_frames(item, dataset, rules.temporal);
      ++out[resolution][bucket];
    }
  return out;
}

}  // namespace gclab::data
