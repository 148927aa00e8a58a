// The shape of what a run trains on and previews, everywhere (issue 47): `batch` samples of `frames` frames
// of height x width pixels. An image is frames = 1, not a special case: the dataset's cells and buckets, the
// loader, the codec, the flow loss, the sampler, the previews and the memory model all carry this, and only
// a family (its latent_shape, model/spec.h) or an autoencoder decides what one frame or several become.
#pragma once

#include <cstdint>
#include <string>

namespace gclab::model {

struct SampleShape {
  int64_t batch = 1;
  int64_t frames = 1;
  int64_t height = 0;
  int64_t width = 0;

  SampleShape with_batch(int64_t b) const { return {b, frames, height, width}; }
  // The pixels of the whole batch: [B, 3, F, H, W]'s element count.
  int64_t pixel_elements() const { return batch * 3 * frames * height * width; }
  // "2 x 17 x 480x832" (batch x frames x height x width); "2 x 512x512" for frames = 1.
  std::string describe() const {
    return std::to_string(batch) + " x " + (frames > 1 ? std::to_string(frames) + " x " : std::string()) +
           std::to_string(height) + "x" + std::to_string(width);
  }
  bool operator==(const SampleShape& o) const {
    return batch == o.batch && frames == o.frames && height == o.height && width == o.width;
  }
};

}  // namespace gclab::model
