// A captioned image folder drawn procedurally (`gclab synth`): coloured shapes on coloured backgrounds,
// each caption saying what is drawn, where and how big — real structure to learn, no downloads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gclab/data/image.h"

namespace gclab::data {

struct SynthOptions {
  int count = 24;
  std::vector<ImageSize> sizes = {{512, 512}, {640, 448}, {448, 640}};  // cycled through
  uint64_t seed = 1;
  // One large shape in the middle of each image, the combinations of a few shapes, colours and backgrounds
  // taken in turn (every one of them once in 24 images): a set a tiny model trained for minutes can learn
  // caption by caption (the quickstart's). Otherwise 1-2 shapes of any colour, size and place, drawn at random.
  bool simple = false;
  // Above 1: each item a clip — a folder synth_NNNN/ of `frames` numbered PNGs (frame_0000.png, ...) whose
  // shapes move from left to right, captioned by synth_NNNN.txt beside it ("... moving right ..."): a video
  // dataset (num_frames) as gclab reads clips.
  int frames = 1;
  // With frames above 1: each clip one video file synth_NNNN.<video_format> (mp4, webm, mov, mkv, gif:
  // data::write_video) at `fps` instead of a folder of frames.
  std::string video_format;
  int fps = 16;
};

// Writes count PNG images (or clips) with .txt captions into dir (created if needed); returns the images'
// (or the clips' folders') paths.
std::vector<std::filesystem::path> write_synthetic_dataset(const std::filesystem::path& dir,
                                                           const SynthOptions& options);

}  // namespace gclab::data
