// Aspect-ratio buckets as AI Toolkit assigns them today (toolkit/buckets.py get_bucket_for_image_size and
// BucketsMixin.setup_buckets, ostris/ai-toolkit at 27a03a91): the bucket keeps the image's own area,
// capped at resolution², with each side a multiple of the model's divisibility; the image is scaled to
// cover the bucket and centre-cropped (or randomly, with random_crop). ../shared/golden/aitk_buckets.csv
// holds AI Toolkit's answers for 570 cases; tests/data/buckets_test.cpp reproduces every row.
#pragma once

#include <random>
#include <string>

namespace gclab::data {

// A bucket is frames x height x width (model::SampleShape's, less the batch): a video dataset's samples
// have its num_frames, an image's one. AI Toolkit keys a video dataset's buckets "WxHxFf" so that clips of
// different lengths never share a batch (dataloader_mixins.py:299-302), an image dataset's "WxH".
struct BucketResolution {
  int width = 0;
  int height = 0;
  int frames = 1;
  std::string key() const {
    return std::to_string(width) + "x" + std::to_string(height) +
           (frames > 1 ? "x" + std::to_string(frames) + "f" : "");
  }
  bool operator<(const BucketResolution& o) const {
    return frames != o.frames ? frames < o.frames : width != o.width ? width < o.width : height < o.height;
  }
  bool operator==(const BucketResolution& o) const {
    return width == o.width && height == o.height && frames == o.frames;
  }
};

struct BucketPlacement {
  BucketResolution bucket;
  int scale_to_width = 0, scale_to_height = 0;  // resize the image to this first
  int crop_x = 0, crop_y = 0;                   // then cut the bucket-sized window here
};

// The bucket for a width x height image at `resolution` with sides divisible by `divisibility`.
BucketResolution bucket_for(int width, int height, int resolution, int divisibility);
// The size an edit model's control image is brought to: an image of `area` pixels (the spec's
// reference_area, the pipelines' 1024²) at the aspect of `size`, each side rounded to the nearest multiple
// of the divisibility, ties to even — the pipelines' calculate_dimensions (`round(width / 32) * 32`), and
// qwen_image_edit_plus.py:293-302 in training (one such latent per control image).
BucketResolution reference_size(const BucketResolution& size, int divisibility, int64_t area);
// A raw control image's reference size as the FLUX.2 pipelines make it (flux2/src/sampling.py default_prep):
// with `target_area` > 0 (model_kwargs.match_target_res) first resized to that area at its aspect, sides
// rounded to multiples of 32, and that area the limit below in place of `area` (flux2_model.py:365-416); then,
// above the limit's pixels, scaled down by
// sqrt(area / pixels) with each side truncated (cap_pixels); then centre-cropped to multiples of 16
// (center_crop_to_multiple_of_x). `resized` says what the first two steps give (the crop's input).
struct RawReferenceSize {
  BucketResolution resized, cropped;
};
RawReferenceSize raw_reference_size(const BucketResolution& size, int64_t area, int64_t target_area = 0);
// The bucket and how to get there: scale to cover (rounded up), crop centred, or at a uniformly random
// offset when `rng` is given (random_crop).

BucketPlacement place_in_bucket(int width, int height, int resolution, int divisibility,
                                std::mt19937_64* rng = nullptr);

}  // namespace gclab::data
