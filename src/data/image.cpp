#include "gclab/data/image.h"

#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#include <stb/stb_image_write.h>
#include <unistd.h>
#include <webp/decode.h>
#include <webp/encode.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <vector>

namespace gclab::data {

namespace fs = std::filesystem;

namespace {

std::string lower_extension(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext;
}

std::vector<unsigned char> read_all(const fs::path& path, size_t limit = SIZE_MAX) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ImageError(path.string() + ": cannot open");
  std::vector<unsigned char> bytes;
  char buf[65536];
  while (in && bytes.size() < limit) {
    in.read(buf, static_cast<std::streamsize>(std::min<size_t>(sizeof buf, limit - bytes.size())));
    bytes.insert(bytes.end(), buf, buf + in.gcount());
  }
  return bytes;
}

bool is_jpeg(const fs::path& path) {
  const std::string ext = lower_extension(path);
  return ext == ".jpg" || ext == ".jpeg";
}

// A JPEG's EXIF orientation (tag 0x0112 of IFD0 in its APP1 "Exif" segment), 1 when it has none or the
// segment is malformed: what PIL's ImageOps.exif_transpose reads.
int jpeg_orientation(const fs::path& path) {
  const auto b = read_all(path, 1 << 17);
  auto u16 = [&](size_t at, bool big) {
    return at + 2 > b.size() ? -1 : big ? (b[at] << 8 | b[at + 1]) : (b[at + 1] << 8 | b[at]);
  };
  auto u32 = [&](size_t at, bool big) -> int64_t {
    if (at + 4 > b.size()) return -1;
    return big ? (int64_t{b[at]} << 24 | b[at + 1] << 16 | b[at + 2] << 8 | b[at + 3])
               : (int64_t{b[at + 3]} << 24 | b[at + 2] << 16 | b[at + 1] << 8 | b[at]);
  };
  if (b.size() < 4 || b[0] != 0xFF || b[1] != 0xD8) return 1;
  size_t at = 2;
  while (at + 4 <= b.size() && b[at] == 0xFF) {
    const int marker = b[at + 1], length = u16(at + 2, true);
    if (marker == 0xDA || marker == 0xD9 || length < 2) break;  // image data, or the end: no EXIF before
    const size_t body = at + 4;
    if (marker == 0xE1 && body + 14 <= b.size() && std::memcmp(&b[body], "Exif\0\0", 6) == 0) {
      const size_t tiff = body + 6;
      const bool big = b[tiff] == 'M';
      const int64_t ifd = u32(tiff + 4, big);
      if (ifd < 0) return 1;
      const int count = u16(tiff + static_cast<size_t>(ifd), big);
      for (int e = 0; e < count; ++e) {
        const size_t entry = tiff + static_cast<size_t>(ifd) + 2 + 12 * static_cast<size_t>(e);
        if (u16(entry, big) == 0x0112) {
          const int value = u16(entry + 8, big);
          return value >= 1 && value <= 8 ? value : 1;
        }
      }
      return 1;
    }
    at = body - 2 + static_cast<size_t>(length);
  }
  return 1;
}

// The pixels as PIL's exif_transpose leaves them for `orientation`: 2 mirrored, 3 turned 180°, 4 flipped,
// 5 transposed, 6 turned 90° clockwise, 7 transversed, 8 turned 90° counter-clockwise.
torch::Tensor oriented(const torch::Tensor& hwc, int orientation) {
  switch (orientation) {
    case 2:
      return hwc.flip({1}).contiguous();
    case 3:
      return hwc.flip({0, 1}).contiguous();
    case 4:
      return hwc.flip({0}).contiguous();
    case 5:
      return hwc.permute({1, 0, 2}).contiguous();
    case 6:
      return hwc.permute({1, 0, 2}).flip({1}).contiguous();
    case 7:
      return hwc.flip({0, 1}).permute({1, 0, 2}).contiguous();
    case 8:
      return hwc.permute({1, 0, 2}).flip({0}).contiguous();
    default:
      return hwc;
  }
}

}  // namespace

bool is_image_file(const fs::path& path) {
  const std::string ext = lower_extension(path);
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".webp";
}

std::optional<ImageSize> read_image_size(const fs::path& path, std::string* error) {
  auto fail = [&](const std::string& why) -> std::optional<ImageSize> {
    if (error) *error = why;
    return std::nullopt;
  };
  try {
    if (lower_extension(path) == ".webp") {
      // The RIFF header and the first chunk carry the size (VP8 / VP8L / VP8X): 64 bytes are plenty.
      const auto head = read_all(path, 64);
      int w = 0, h = 0;
      if (!WebPGetInfo(head.data(), head.size(), &w, &h)) return fail("not a readable WebP header");
      return ImageSize{w, h};
    }
    int w = 0, h = 0, channels = 0;
    if (!stbi_info(path.c_str(), &w, &h, &channels)) return fail(stbi_failure_reason());
    if (w <= 0 || h <= 0) return fail("zero-sized image");
    // A phone photo's EXIF orientation turns it: AI Toolkit sizes it after exif_transpose
    // (toolkit/data_transfer_object/data_loader.py:158).
    if (is_jpeg(path) && jpeg_orientation(path) >= 5) std::swap(w, h);
    return ImageSize{w, h};
  } catch (const ImageError& e) {
    return fail(e.what());
  }
}

torch::Tensor decode_image_rgb(const fs::path& path) {
  if (lower_extension(path) == ".webp") {
    const auto bytes = read_all(path);
    int w = 0, h = 0;
    uint8_t* rgb = WebPDecodeRGB(bytes.data(), bytes.size(), &w, &h);
    if (!rgb) throw ImageError(path.string() + ": cannot decode WebP (corrupt or truncated?)");
    torch::Tensor out = torch::empty({h, w, 3}, torch::kUInt8);
    std::memcpy(out.data_ptr(), rgb, static_cast<size_t>(w) * h * 3);
    WebPFree(rgb);
    return out;
  }
  int w = 0, h = 0, channels = 0;
  unsigned char* rgb = stbi_load(path.c_str(), &w, &h, &channels, 3);
  if (!rgb) throw ImageError(path.string() + ": cannot decode (" + stbi_failure_reason() + ")");
  torch::Tensor out = torch::empty({h, w, 3}, torch::kUInt8);
  std::memcpy(out.data_ptr(), rgb, static_cast<size_t>(w) * h * 3);
  stbi_image_free(rgb);
  // Upright as AI Toolkit loads it (exif_transpose, toolkit/dataloader_mixins.py:896).
  return is_jpeg(path) ? oriented(out, jpeg_orientation(path)) : out;
}

torch::Tensor resize_rgb(const torch::Tensor& image, int width, int height) {
  TORCH_CHECK(image.dim() == 3 && image.size(2) == 3 && image.scalar_type() == torch::kUInt8,
              "resize_rgb needs uint8 [H, W, 3]");
  const torch::Tensor src = image.contiguous();
  if (src.size(0) == height && src.size(1) == width) return src.clone();
  torch::Tensor out = torch::empty({height, width, 3}, torch::kUInt8);
  if (!stbir_resize_uint8(src.data_ptr<uint8_t>(), static_cast<int>(src.size(1)), static_cast<int>(src.size(0)), 0,
                          out.data_ptr<uint8_t>(), width, height, 0, 3))
    throw ImageError("resize to " + std::to_string(width) + "x" + std::to_string(height) + " failed");
  return out;
}

void write_png(const fs::path& path, const torch::Tensor& image) {
  TORCH_CHECK(image.dim() == 3 && image.size(2) == 3 && image.scalar_type() == torch::kUInt8,
              "write_png needs uint8 [H, W, 3]");
  const torch::Tensor src = image.contiguous().cpu();
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + ".tmp-" + std::to_string(::getpid()) + ".png";
  const int w = static_cast<int>(src.size(1)), h = static_cast<int>(src.size(0));
  if (!stbi_write_png(tmp.c_str(), w, h, 3, src.data_ptr<uint8_t>(), w * 3)) {
    fs::remove(tmp, ec);
    throw ImageError(path.string() + ": cannot write PNG (disk full or no permission?)");
  }
  fs::rename(tmp, path, ec);
  if (ec) throw ImageError(path.string() + ": cannot rename the finished PNG into place: " + ec.message());
}

void write_image(const fs::path& path, const torch::Tensor& image) {
  const std::string ext = lower_extension(path);
  if (ext == ".png") return write_png(path, image);
  TORCH_CHECK(image.dim() == 3 && image.size(2) == 3 && image.scalar_type() == torch::kUInt8,
              "write_image needs uint8 [H, W, 3]");
  if (ext != ".jpg" && ext != ".jpeg" && ext != ".webp")
    throw ImageError(path.string() + ": gclab writes .png, .jpg or .webp images");
  const torch::Tensor src = image.contiguous().cpu();
  const int w = static_cast<int>(src.size(1)), h = static_cast<int>(src.size(0));
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + ".tmp-" + std::to_string(::getpid()) + ext;
  bool written = false;
  if (ext == ".webp") {
    uint8_t* out = nullptr;
    const size_t size = WebPEncodeRGB(src.data_ptr<uint8_t>(), w, h, w * 3, 80.0f, &out);
    if (size > 0) {
      std::ofstream f(tmp, std::ios::binary);
      f.write(reinterpret_cast<const char*>(out), static_cast<std::streamsize>(size));
      written = static_cast<bool>(f);
    }
    WebPFree(out);
  } else {
    written = stbi_write_jpg(tmp.c_str(), w, h, 3, src.data_ptr<uint8_t>(), 75) != 0;
  }
  if (!written) {
    fs::remove(tmp, ec);
    throw ImageError(path.string() + ": cannot write the image (disk full or no permission?)");
  }
  fs::rename(tmp, path, ec);
  if (ec) throw ImageError(path.string() + ": cannot rename the finished image into place: " + ec.message());
}

torch::Tensor to_unit_range(const torch::Tensor& rgb_hwc) {
  return rgb_hwc.permute({2, 0, 1}).to(torch::kFloat).div(127.5).sub(1.0);
}

torch::Tensor to_rgb_uint8(const torch::Tensor& image_chw) {
  // One float copy, scaled in place, then the uint8 image: a preview's conversion holds at most one more
  // float image and a quarter of one.
  return image_chw.detach()
      .to(torch::kFloat)
      .cpu()
      .add(1.0)
      .mul_(127.5)
      .round_()
      .clamp_(0, 255)
      .permute({1, 2, 0})
      .to(torch::kUInt8);
}

torch::Tensor load_image_cover(const std::filesystem::path& path, int width, int height) {
  torch::Tensor rgb = decode_image_rgb(path);
  const double scale = std::max(static_cast<double>(width) / rgb.size(1), static_cast<double>(height) / rgb.size(0));
  const int sw = std::max(width, static_cast<int>(std::ceil(rgb.size(1) * scale)));
  const int sh = std::max(height, static_cast<int>(std::ceil(rgb.size(0) * scale)));
  rgb = resize_rgb(rgb, sw, sh).narrow(0, (sh - height) / 2, height).narrow(1, (sw - width) / 2, width);
  return to_unit_range(rgb);
}

}  // namespace gclab::data
