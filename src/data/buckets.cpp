#include "gclab/data/buckets.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace gclab::data {

BucketResolution bucket_for(int width, int height, int resolution, int divisibility) {
  const double total = static_cast<double>(width) * height;
  const double cap = static_cast<double>(resolution) * resolution;
  const double target = std::min(total, cap);
  const double scale = std::sqrt(target / total);  // never upscales
  // The scaled sides in units of `divisibility`; each side is rounded down or up, and of the four
  // combinations within the cap the one whose area is closest to the target wins (the first on a tie,
  // in the order below).
  const double w_units = width * scale / divisibility, h_units = height * scale / divisibility;
  const int w_lo = static_cast<int>(std::floor(w_units)) * divisibility;
  const int w_hi = static_cast<int>(std::ceil(w_units)) * divisibility;
  const int h_lo = static_cast<int>(std::floor(h_units)) * divisibility;
  const int h_hi = static_cast<int>(std::ceil(h_units)) * divisibility;
  std::vector<BucketResolution> candidates;
  for (const BucketResolution c : {BucketResolution{w_lo, h_lo}, BucketResolution{w_lo, h_hi},
                                   BucketResolution{w_hi, h_lo}, BucketResolution{w_hi, h_hi}})
    if (c.width > 0 && c.height > 0 && static_cast<double>(c.width) * c.height <= cap) candidates.push_back(c);
  if (candidates.empty())  // a side below one divisibility step: the smallest legal side
    return {std::max(divisibility, w_lo), std::max(divisibility, h_lo)};
  const BucketResolution* best = &candidates.front();
  for (const auto& c : candidates)
    if (std::abs(static_cast<double>(c.width) * c.height - target) <
        std::abs(static_cast<double>(best->width) * best->height - target))
      best = &c;
  return *best;
}

BucketResolution reference_size(const BucketResolution& size, int divisibility, int64_t area) {
  const double scale = std::sqrt(static_cast<double>(area) / (static_cast<double>(size.width) * size.height));
  const int d = divisibility;
  auto side = [&](int s) { return std::max(d, static_cast<int>(std::nearbyint(s * scale / d)) * d); };
  return {side(size.width), side(size.height)};
}

RawReferenceSize raw_reference_size(const BucketResolution& size, int64_t area, int64_t target_area) {
  RawReferenceSize r{size, size};
  if (target_area > 0) {
    const double ratio = static_cast<double>(size.height) / size.width;
    const double h = std::sqrt(static_cast<double>(target_area) * ratio), w = h / ratio;
    r.resized = {static_cast<int>(std::nearbyint(w / 32)) * 32, static_cast<int>(std::nearbyint(h / 32)) * 32};
  }
  if (target_area > 0) area = target_area;  // control_image_max_res = the target's area (flux2_model.py:365-374)
  const int64_t pixels = static_cast<int64_t>(r.resized.width) * r.resized.height;
  if (pixels > area) {
    const double scale = std::sqrt(static_cast<double>(area) / static_cast<double>(pixels));
    r.resized = {static_cast<int>(r.resized.width * scale), static_cast<int>(r.resized.height * scale)};
  }
  r.cropped = {r.resized.width / 16 * 16, r.resized.height / 16 * 16};
  return r;
}

BucketPlacement place_in_bucket(int width, int height, int resolution, int divisibility, std::mt19937_64* rng) {
  BucketPlacement p;
  p.bucket = bucket_for(width, height, resolution, divisibility);
  const double scale =
      std::max(static_cast<double>(p.bucket.width) / width, static_cast<double>(p.bucket.height) / height);
  p.scale_to_width = static_cast<int>(std::ceil(width * scale));
  p.scale_to_height = static_cast<int>(std::ceil(height * scale));
  const int spare_x = p.scale_to_width - p.bucket.width, spare_y = p.scale_to_height - p.bucket.height;
  if (rng) {
    p.crop_x = spare_x > 0 ? static_cast<int>((*rng)() % static_cast<uint64_t>(spare_x + 1)) : 0;
    p.crop_y = spare_y > 0 ? static_cast<int>((*rng)() % static_cast<uint64_t>(spare_y + 1)) : 0;
  } else {
    p.crop_x = spare_x / 2;
    p.crop_y = spare_y / 2;
  }
  return p;
}

}  // namespace gclab::data
