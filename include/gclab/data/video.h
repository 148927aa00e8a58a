// Video files through FFmpeg's libraries (libavformat / libavcodec / libswscale): what a video dataset's clips
// are read from, and what `gclab synth --video` and a video model's previews write. Frames are uint8 [H, W, 3]
// RGB, as the image files' decoder gives them.
#pragma once

#include <torch/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gclab/data/image.h"

namespace gclab::data {

// A file that does not open, has no video stream, or does not decode or encode; the message names the file
// and FFmpeg's reason. An ImageError, so a data loader that skips a bad image skips a bad clip the same way.
class VideoError : public ImageError {
 public:
  using ImageError::ImageError;
};

// AI Toolkit's video extensions (toolkit/data_loader.py:40: .mp4 .avi .mov .webm .mkv .wmv .m4v .flv) and
// .gif, which gclab reads as a clip too (AI Toolkit reads neither it as a video nor as an image); any case.
bool is_video_file(const std::filesystem::path& path);

// Whether this process can read and write video files: libgclab_video.so and FFmpeg's libraries load (why
// not, in `why`).
bool video_support(std::string* why = nullptr);

struct VideoInfo {
  int width = 0, height = 0;
  int frames = 0;    // the stream's frame count: its header's, or its packets counted when the header has none
  double fps = 0.0;  // the stream's frame rate (FFmpeg's guess from its header: av_guess_frame_rate; 0: none)
};
// The first video stream's size, frame count and rate, from the container without decoding a frame (what AI
// Toolkit reads with OpenCV's CAP_PROP_FRAME_WIDTH / HEIGHT / COUNT / FPS). nullopt, and why in `error`, for
// a file that is not a readable video.
std::optional<VideoInfo> probe_video(const std::filesystem::path& path, std::string* error = nullptr);

// The frames at `indices` (0-based, any order, repeats allowed), each uint8 [H, W, 3], in the order asked,
// decoded in one pass from the start. An index past the last frame that decodes is given the last one (AI
// Toolkit clamps indices to the last frame and retries nearby frames on a failed read). Throws VideoError —
// also where libgclab_video.so (FFmpeg's part of gclab, loaded on first use) or FFmpeg's libraries are missing.
std::vector<torch::Tensor> decode_video_frames(const std::filesystem::path& path, const std::vector<int>& indices);

// Frames uint8 [F, H, W, 3] written at `fps` in the container and codec the extension names: .mp4 / .mov /
// .mkv H.264 (libx264, CRF 18, yuv420p; MPEG-4 part 2 where the library lacks libx264), .webm VP9, .gif GIF
// (FFmpeg's fixed 3-3-2 palette: 256 colours). H.264 and VP9 need even sides: an odd width or height loses its last
// column or row. Written under a temporary name and renamed into place; throws VideoError.
void write_video(const std::filesystem::path& path, const torch::Tensor& frames, int fps);

}  // namespace gclab::data
