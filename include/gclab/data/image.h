// Image files: sizes from headers alone (for bucket histograms before any decoding), decoding to RGB,
// resizing, and PNG writing. JPEG / PNG / BMP through stb_image, WebP through libwebp.
#pragma once

#include <torch/types.h>

#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gclab::data {

class ImageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ImageSize {
  int width = 0;
  int height = 0;
};

bool is_image_file(const std::filesystem::path& path);  // .jpg .jpeg .png .webp (any case)
// Width and height read from the file's header, without decoding pixels. nullopt (and why, in `error`)
// for a file that is not a readable image.
std::optional<ImageSize> read_image_size(const std::filesystem::path& path, std::string* error = nullptr);
// The whole image as uint8 [H, W, 3]. Throws ImageError naming the file and the decoder's reason.
torch::Tensor decode_image_rgb(const std::filesystem::path& path);
// A control image as AI Toolkit's load_control_image reads it (toolkit/dataloader_mixins.py:1157-1170):
// upright, and an RGBA one pasted over `background` (control_transparent_color) through its alpha —
// PIL's paste, round((src a + bg (255 - a)) / 255) per channel. uint8 [H, W, 3].
torch::Tensor decode_control_rgb(const std::filesystem::path& path, const std::vector<int>& background);
// uint8 [H, W, 3] resized to width x height (stb_image_resize, a filter suited to downscaling).
torch::Tensor resize_rgb(const torch::Tensor& image, int width, int height);
// The same for uint8 [H, W, C] of 1 to 4 channels, each resized on its own (masks, alpha).
torch::Tensor resize_pixels(const torch::Tensor& image, int width, int height);

// Whether PIL opens the file in mode RGBA (a PNG of colour type 6, a WebP with alpha; never a JPEG, a grey +
// alpha or a palette PNG), from its header: AI Toolkit's inpainting images and alpha_mask need that mode.
bool opens_as_rgba(const std::filesystem::path& path);
// Such a file's pixels, uint8 [H, W, 4]. Throws ImageError for a file that does not decode or is not RGBA.
torch::Tensor decode_image_rgba(const std::filesystem::path& path);
// PIL's ImageFilter.GaussianBlur(radius) on uint8 [H, W, C]: three extended box blurs each way of the box
// radius PIL derives from it (libImaging's ImagingGaussianBlur / ImagingBoxBlur), each channel on its own,
// to the byte. radius 0 returns the image.
torch::Tensor pil_gaussian_blur(const torch::Tensor& image, double radius);
// PIL's convert('L') of uint8 [H, W, 3]: (19595 R + 38470 G + 7471 B + 2^15) >> 16, as uint8 [H, W, 1].
torch::Tensor pil_luminance(const torch::Tensor& rgb);

// uint8 [H, W, 3] <-> float [3, H, W] in [-1, 1] (what the autoencoders take and give); to_rgb_uint8 holds
// one float copy of the image and the uint8 result above its input.
torch::Tensor to_unit_range(const torch::Tensor& rgb_hwc);
// A raw control image (uint8 [H, W, 3]) as the FLUX.2 pipelines prepare a reference (raw_reference_size in
// data/buckets.h): with `target_area` resized bilinearly to it (match_target_res), scaled to [-1, 1], above
// `area` pixels resized bicubically (F.interpolate, align_corners off: cap_pixels on a tensor), centre-cropped to
// multiples of 16. Float [3, H', W']. Throws ImageError below 64 pixels a side or beyond an aspect of 8
// (cap_min_pixels: "Skipping due to ...").
torch::Tensor raw_reference_image(const torch::Tensor& rgb_hwc, int64_t area, int64_t target_area = 0);
// Frames uint8 [F, H, W, 3] as an animated WebP at `fps` (lossy, quality 80, looping: what AI Toolkit's video
// previews save), atomic as write_image; throws ImageError. read_animated_webp gives them back (uint8
// [F, H, W, 3]) with each frame's end time in milliseconds, for tests and reports.
void write_animated_webp(const std::filesystem::path& path, const torch::Tensor& frames, int fps);
struct AnimatedImage {
  torch::Tensor frames;
  std::vector<int> timestamps_ms;
};
AnimatedImage read_animated_webp(const std::filesystem::path& path);
// An image file scaled to cover width x height (aspect kept) and centre-cropped to it, as float [3, H, W]
// in [-1, 1]: how the edit models' control images are sized (their 1024²-area reference at an aspect), read
// as decode_control_rgb reads them (an RGBA one over `background`). Throws ImageError for a file that does
// not decode.
torch::Tensor load_image_cover(const std::filesystem::path& path, int width, int height,
                               const std::vector<int>& background = {0, 0, 0});
// [3, H, W] -> uint8 [H, W, 3]; frames [3, F, H, W] -> uint8 [F, H, W, 3].
torch::Tensor to_rgb_uint8(const torch::Tensor& image_chw);
// Writes uint8 [H, W, 3] as PNG, under a temporary name renamed into place. Throws ImageError.
void write_png(const std::filesystem::path& path, const torch::Tensor& image);
// uint8 [H, W, 3] written in the format its extension names, as PIL's Image.save writes it at its defaults
// (what AI Toolkit's previews call): .png, .jpg / .jpeg (quality 75, 4:2:0), .webp (lossy, quality 80).
// Atomic as write_png; throws ImageError for another extension or a failed write.
void write_image(const std::filesystem::path& path, const torch::Tensor& image);

}  // namespace gclab::data
