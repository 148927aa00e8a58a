#include "gclab/data/image.h"

#include "gclab/data/buckets.h"

#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#include <stb/stb_image_write.h>
#include <unistd.h>
#include <webp/decode.h>
#include <webp/demux.h>
#include <webp/encode.h>
#include <webp/mux.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <vector>

#include "gclab/memory/placement.h"

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

// EXIF's orientation (tag 0x0112 of IFD0) in the TIFF structure at b[tiff...], 1 when it has none or it is
// malformed: what PIL's ImageOps.exif_transpose reads.
int tiff_orientation(const std::vector<unsigned char>& b, size_t tiff) {
  auto u16 = [&](size_t at, bool big) {
    return at + 2 > b.size() ? -1 : big ? (b[at] << 8 | b[at + 1]) : (b[at + 1] << 8 | b[at]);
  };
  auto u32 = [&](size_t at, bool big) -> int64_t {
    if (at + 4 > b.size()) return -1;
    return big ? (int64_t{b[at]} << 24 | b[at + 1] << 16 | b[at + 2] << 8 | b[at + 3])
               : (int64_t{b[at + 3]} << 24 | b[at + 2] << 16 | b[at + 1] << 8 | b[at]);
  };
  if (tiff + 8 > b.size()) return 1;
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

// The EXIF orientation of a JPEG (its APP1 "Exif" segment), a PNG (its eXIf chunk, before or after the image
// data) or a WebP (its EXIF chunk, after the image data in the extended format; with or without the
// "Exif\0\0" prefix): PIL reads each (ImageOps.exif_transpose of any format), as AI Toolkit loads every image
// through it. 1 when there is none. PNG and WebP chunks are walked by their headers, their data skipped.
int exif_orientation(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<unsigned char> head(12);
  if (!in.read(reinterpret_cast<char*>(head.data()), 12)) return 1;
  auto is = [](const unsigned char* p, const char* text, size_t n) { return std::memcmp(p, text, n) == 0; };
  // The chunk at `at` of `size` bytes, read (at most 64 KiB: EXIF's own limit), its orientation.
  auto orientation_at = [&](std::streamoff at, uint32_t size) {
    std::vector<unsigned char> b(std::min<uint32_t>(size, 1 << 16));
    in.clear();
    in.seekg(at);
    if (!in.read(reinterpret_cast<char*>(b.data()), static_cast<std::streamsize>(b.size()))) return 1;
    return tiff_orientation(b, b.size() >= 6 && is(b.data(), "Exif\0\0", 6) ? 6 : 0);
  };
  if (head[0] == 0xFF && head[1] == 0xD8) {  // JPEG: the segments before the image data
    const auto b = read_all(path, 1 << 17);
    size_t at = 2;
    while (at + 4 <= b.size() && b[at] == 0xFF) {
      const int marker = b[at + 1], length = b[at + 2] << 8 | b[at + 3];
      if (marker == 0xDA || marker == 0xD9 || length < 2) break;
      const size_t body = at + 4;
      if (marker == 0xE1 && body + 6 <= b.size() && is(&b[body], "Exif\0\0", 6)) return tiff_orientation(b, body + 6);
      at = body - 2 + static_cast<size_t>(length);
    }
    return 1;
  }
  unsigned char chunk[8];
  if (is(head.data(), "\x89PNG\r\n\x1a\n", 8)) {  // PNG: [big-endian length][type][data][crc]
    for (std::streamoff at = 8;;) {
      in.clear();
      in.seekg(at);
      if (!in.read(reinterpret_cast<char*>(chunk), 8)) return 1;
      const uint32_t length = uint32_t{chunk[0]} << 24 | uint32_t{chunk[1]} << 16 | uint32_t{chunk[2]} << 8 | chunk[3];
      if (is(chunk + 4, "eXIf", 4)) return orientation_at(at + 8, length);
      if (is(chunk + 4, "IEND", 4)) return 1;
      at += 12 + static_cast<std::streamoff>(length);
    }
  }
  if (is(head.data(), "RIFF", 4) && is(head.data() + 8, "WEBP", 4)) {  // WebP: [type][little-endian size][data]
    for (std::streamoff at = 12;;) {
      in.clear();
      in.seekg(at);
      if (!in.read(reinterpret_cast<char*>(chunk), 8)) return 1;
      const uint32_t size =
          uint32_t{chunk[4]} | uint32_t{chunk[5]} << 8 | uint32_t{chunk[6]} << 16 | uint32_t{chunk[7]} << 24;
      if (is(chunk, "EXIF", 4)) return orientation_at(at + 8, size);
      at += 8 + static_cast<std::streamoff>(size) + (size & 1);
    }
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
      if (exif_orientation(path) >= 5) std::swap(w, h);
      return ImageSize{w, h};
    }
    int w = 0, h = 0, channels = 0;
    if (!stbi_info(path.c_str(), &w, &h, &channels)) return fail(stbi_failure_reason());
    if (w <= 0 || h <= 0) return fail("zero-sized image");
    // A phone photo's EXIF orientation turns it: AI Toolkit sizes it after exif_transpose
    // (toolkit/data_transfer_object/data_loader.py:158).
    if (exif_orientation(path) >= 5) std::swap(w, h);
    return ImageSize{w, h};
  } catch (const ImageError& e) {
    return fail(e.what());
  }
}

namespace {

// The file's pixels with `channels` (3: RGB, its alpha dropped; 4: RGBA), as stb_image / libwebp decode them.
torch::Tensor decode_pixels(const fs::path& path, int channels) {
  int w = 0, h = 0;
  uint8_t* pixels = nullptr;
  const bool webp = lower_extension(path) == ".webp";
  if (webp) {
    const auto bytes = read_all(path);
    pixels = channels == 4 ? WebPDecodeRGBA(bytes.data(), bytes.size(), &w, &h)
                           : WebPDecodeRGB(bytes.data(), bytes.size(), &w, &h);
    if (!pixels) throw ImageError(path.string() + ": cannot decode WebP (corrupt or truncated?)");
  } else {
    int in_file = 0;
    pixels = stbi_load(path.c_str(), &w, &h, &in_file, channels);
    if (!pixels) throw ImageError(path.string() + ": cannot decode (" + stbi_failure_reason() + ")");
  }
  torch::Tensor out = torch::empty({h, w, channels}, torch::kUInt8);
  std::memcpy(out.data_ptr(), pixels, static_cast<size_t>(w) * h * static_cast<size_t>(channels));
  if (webp)
    WebPFree(pixels);
  else
    stbi_image_free(pixels);
  return out;
}

}  // namespace

torch::Tensor decode_image_rgb(const fs::path& path) {
  const torch::Tensor out = decode_pixels(path, 3);
  // Upright as AI Toolkit loads it (exif_transpose, toolkit/dataloader_mixins.py:896).
  return oriented(out, exif_orientation(path));
}

torch::Tensor decode_control_rgb(const fs::path& path, const std::vector<int>& background) {
  if (!opens_as_rgba(path)) return decode_image_rgb(path);
  const torch::Tensor rgba = oriented(decode_pixels(path, 4), exif_orientation(path)).to(torch::kInt32);
  const torch::Tensor a = rgba.narrow(2, 3, 1);
  torch::Tensor bg = torch::zeros({1, 1, 3}, torch::kInt32);
  for (int64_t c = 0; c < 3 && c < static_cast<int64_t>(background.size()); ++c)
    bg[0][0][c] = std::clamp(background[static_cast<size_t>(c)], 0, 255);
  // libImaging's BLEND with DIV255: t = x + 128, ((t >> 8) + t) >> 8 — x / 255 rounded.
  const torch::Tensor t = rgba.narrow(2, 0, 3) * a + bg * (255 - a) + 128;
  return ((t.bitwise_right_shift(8) + t).bitwise_right_shift(8)).to(torch::kUInt8).contiguous();
}

torch::Tensor resize_rgb(const torch::Tensor& image, int width, int height) {
  TORCH_CHECK(image.dim() == 3 && image.size(2) == 3 && image.scalar_type() == torch::kUInt8,
              "resize_rgb needs uint8 [H, W, 3]");
  return resize_pixels(image, width, height);
}

torch::Tensor resize_pixels(const torch::Tensor& image, int width, int height) {
  TORCH_CHECK(image.dim() == 3 && image.size(2) >= 1 && image.size(2) <= 4 && image.scalar_type() == torch::kUInt8,
              "resize_pixels needs uint8 [H, W, C] with 1 to 4 channels");
  const torch::Tensor src = image.contiguous();
  if (src.size(0) == height && src.size(1) == width) return src.clone();
  const int channels = static_cast<int>(src.size(2));
  torch::Tensor out = torch::empty({height, width, channels}, torch::kUInt8);
  if (!stbir_resize_uint8(src.data_ptr<uint8_t>(), static_cast<int>(src.size(1)), static_cast<int>(src.size(0)), 0,
                          out.data_ptr<uint8_t>(), width, height, 0, channels))
    throw ImageError("resize to " + std::to_string(width) + "x" + std::to_string(height) + " failed");
  return out;
}

bool opens_as_rgba(const fs::path& path) {
  const std::string ext = lower_extension(path);
  if (ext == ".webp") {
    const auto head = read_all(path, 64);
    WebPBitstreamFeatures features;
    return WebPGetFeatures(head.data(), head.size(), &features) == VP8_STATUS_OK && features.has_alpha;
  }
  if (ext != ".png") return false;
  // The IHDR chunk follows the 8-byte signature: length, "IHDR", width, height, bit depth, colour type.
  const auto head = read_all(path, 26);
  return head.size() == 26 && std::memcmp(head.data(), "\x89PNG", 4) == 0 && head[25] == 6;
}

torch::Tensor decode_image_rgba(const fs::path& path) {
  if (!opens_as_rgba(path)) throw ImageError(path.string() + ": not an RGBA image (no alpha channel)");
  return decode_pixels(path, 4);
}

namespace {

// libImaging's _gaussian_blur_radius (BoxBlur.c): the box radius whose `passes` box blurs approximate a
// Gaussian of `radius` (Gwosdek et al., "Theoretical foundations of Gaussian convolution by extended box
// filtering"), in single precision as written there.
float pil_box_radius(float radius, int passes) {
  const float sigma2 = radius * radius / static_cast<float>(passes);
  const auto L = static_cast<float>(std::sqrt(12.0 * sigma2 + 1.0));
  const auto l = static_cast<float>(std::floor((L - 1.0) / 2.0));
  float a = (2 * l + 1) * (l * (l + 1) - 3 * sigma2);
  a /= 6 * (sigma2 - (l + 1) * (l + 1));
  return l + a;
}

// One extended box blur of a line (ImagingLineBoxBlur8): a box of 2r + 1 pixels plus the fraction of the
// two beyond it, the edges extended, in 8.24 fixed point.
void pil_box_blur_line(uint8_t* out, const uint8_t* in, int n, float radius) {
  const int r = static_cast<int>(radius);
  const auto ww = static_cast<uint32_t>(static_cast<float>(1u << 24) / (radius * 2 + 1));
  const uint32_t fw = ((1u << 24) - static_cast<uint32_t>(r * 2 + 1) * ww) / 2;
  const int last = n - 1, edge_a = std::min(r + 1, n), edge_b = std::max(n - r - 1, 0);
  uint32_t acc = in[0] * static_cast<uint32_t>(r + 1);
  for (int x = 0; x < edge_a - 1; ++x) acc += in[x];
  acc += in[last] * static_cast<uint32_t>(r - edge_a + 1);
  auto step = [&](int x, int sub, int add, int left, int right) {
    acc += static_cast<uint32_t>(in[add]) - static_cast<uint32_t>(in[sub]);
    const uint32_t bulk = acc * ww + (static_cast<uint32_t>(in[left]) + in[right]) * fw;
    out[x] = static_cast<uint8_t>((bulk + (1u << 23)) >> 24);
  };
  if (edge_a <= edge_b) {
    for (int x = 0; x < edge_a; ++x) step(x, 0, x + r, 0, x + r + 1);
    for (int x = edge_a; x < edge_b; ++x) step(x, x - r - 1, x + r, x - r - 1, x + r + 1);
    for (int x = edge_b; x <= last; ++x) step(x, x - r - 1, last, x - r - 1, last);
  } else {
    for (int x = 0; x < edge_b; ++x) step(x, 0, x + r, 0, last);
    for (int x = edge_b; x < edge_a; ++x) step(x, 0, last, 0, last);
    for (int x = edge_a; x <= last; ++x) step(x, x - r - 1, last, x - r - 1, last);
  }
}

}  // namespace

torch::Tensor pil_gaussian_blur(const torch::Tensor& image, double radius) {
  TORCH_CHECK(image.dim() == 3 && image.scalar_type() == torch::kUInt8, "pil_gaussian_blur needs uint8 [H, W, C]");
  if (radius == 0) return image.clone();
  constexpr int kPasses = 3;  // ImageFilter.GaussianBlur's
  const float box = pil_box_radius(static_cast<float>(radius), kPasses);
  // Channel planes; each pass reads the previous one's whole line.
  torch::Tensor planes = image.permute({2, 0, 1}).contiguous();
  const int channels = static_cast<int>(planes.size(0)), h = static_cast<int>(planes.size(1)),
            w = static_cast<int>(planes.size(2));
  std::vector<uint8_t> line(static_cast<size_t>(std::max(w, h))), blurred(line.size());
  for (int c = 0; c < channels; ++c) {
    uint8_t* p = planes[c].data_ptr<uint8_t>();
    for (int pass = 0; pass < kPasses; ++pass)  // along the rows
      for (int y = 0; y < h; ++y) {
        std::copy(p + static_cast<ptrdiff_t>(y) * w, p + static_cast<ptrdiff_t>(y + 1) * w, line.begin());
        pil_box_blur_line(p + static_cast<ptrdiff_t>(y) * w, line.data(), w, box);
      }
    for (int pass = 0; pass < kPasses; ++pass)  // then the columns (libImaging transposes)
      for (int x = 0; x < w; ++x) {
        for (int y = 0; y < h; ++y) line[static_cast<size_t>(y)] = p[static_cast<ptrdiff_t>(y) * w + x];
        pil_box_blur_line(blurred.data(), line.data(), h, box);
        for (int y = 0; y < h; ++y) p[static_cast<ptrdiff_t>(y) * w + x] = blurred[static_cast<size_t>(y)];
      }
  }
  return planes.permute({1, 2, 0}).contiguous();
}

torch::Tensor pil_luminance(const torch::Tensor& rgb) {
  TORCH_CHECK(rgb.dim() == 3 && rgb.size(2) == 3 && rgb.scalar_type() == torch::kUInt8,
              "pil_luminance needs uint8 [H, W, 3]");
  const torch::Tensor c = rgb.to(torch::kInt64);
  const torch::Tensor l = c.select(2, 0) * 19595 + c.select(2, 1) * 38470 + c.select(2, 2) * 7471 + 32768;
  return l.div(65536, "floor").to(torch::kUInt8).unsqueeze(2);
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

void write_animated_webp(const fs::path& path, const torch::Tensor& frames, int fps) {
  TORCH_CHECK(frames.dim() == 4 && frames.size(3) == 3 && frames.scalar_type() == torch::kUInt8 && fps > 0,
              "write_animated_webp needs uint8 [F, H, W, 3] and fps above 0");
  const torch::Tensor src = frames.contiguous().cpu();
  const int n = static_cast<int>(src.size(0)), h = static_cast<int>(src.size(1)), w = static_cast<int>(src.size(2));
  WebPAnimEncoderOptions options;
  WebPConfig config;
  if (!WebPAnimEncoderOptionsInit(&options) || !WebPConfigInit(&config))
    throw ImageError(path.string() + ": libwebp's animation encoder does not match its headers");
  options.anim_params.loop_count = 0;  // PIL's default for an animated save: loop forever
  config.quality = 80.0f;              // PIL's WebP default, as write_image's
  WebPAnimEncoder* encoder = WebPAnimEncoderNew(w, h, &options);
  WebPData data;
  WebPDataInit(&data);
  bool ok = encoder != nullptr;
  auto at_ms = [fps](int i) { return static_cast<int>(std::lround(i * 1000.0 / fps)); };  // frame i's start
  for (int i = 0; ok && i < n; ++i) {
    WebPPicture picture;
    ok = WebPPictureInit(&picture) != 0;
    picture.width = w, picture.height = h, picture.use_argb = 1;
    ok = ok && WebPPictureImportRGB(&picture, src[i].data_ptr<uint8_t>(), w * 3) &&
         WebPAnimEncoderAdd(encoder, &picture, at_ms(i), &config);
    WebPPictureFree(&picture);
  }
  ok = ok && WebPAnimEncoderAdd(encoder, nullptr, at_ms(n), nullptr) && WebPAnimEncoderAssemble(encoder, &data);
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + ".tmp-" + std::to_string(::getpid()) + ".webp";
  if (ok) {
    std::ofstream f(tmp, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.bytes), static_cast<std::streamsize>(data.size));
    ok = static_cast<bool>(f);
  }
  WebPDataClear(&data);
  if (encoder) WebPAnimEncoderDelete(encoder);
  if (!ok) {
    fs::remove(tmp, ec);
    throw ImageError(path.string() + ": cannot write the animated WebP (disk full or no permission?)");
  }
  fs::rename(tmp, path, ec);
  if (ec) throw ImageError(path.string() + ": cannot rename the finished animation into place: " + ec.message());
}

AnimatedImage read_animated_webp(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  WebPData data{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()};
  WebPAnimDecoderOptions options;
  WebPAnimDecoderOptionsInit(&options);
  options.color_mode = MODE_RGBA;
  WebPAnimDecoder* decoder = WebPAnimDecoderNew(&data, &options);
  WebPAnimInfo info;
  if (!decoder || !WebPAnimDecoderGetInfo(decoder, &info)) {
    if (decoder) WebPAnimDecoderDelete(decoder);
    throw ImageError(path.string() + ": not a readable (animated) WebP");
  }
  AnimatedImage out;
  std::vector<torch::Tensor> frames;
  while (WebPAnimDecoderHasMoreFrames(decoder)) {
    uint8_t* rgba = nullptr;
    int timestamp = 0;
    if (!WebPAnimDecoderGetNext(decoder, &rgba, &timestamp)) break;
    frames.push_back(
        torch::from_blob(rgba, {info.canvas_height, info.canvas_width, 4}, torch::kUInt8).narrow(2, 0, 3).clone());
    out.timestamps_ms.push_back(timestamp);
  }
  WebPAnimDecoderDelete(decoder);
  if (frames.empty()) throw ImageError(path.string() + ": a WebP without frames");
  out.frames = torch::stack(frames);
  return out;
}

torch::Tensor to_unit_range(const torch::Tensor& rgb_hwc) {
  return rgb_hwc.permute({2, 0, 1}).to(torch::kFloat).div(127.5).sub(1.0);
}

torch::Tensor raw_reference_image(const torch::Tensor& rgb_hwc, int64_t area, int64_t target_area) {
  const int h = static_cast<int>(rgb_hwc.size(0)), w = static_cast<int>(rgb_hwc.size(1));
  const RawReferenceSize size = raw_reference_size({w, h}, area, target_area);
  torch::Tensor x = rgb_hwc.permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat).div(255);
  if (target_area > 0)
    x = torch::upsample_bilinear2d(x, {size.resized.height, size.resized.width}, /*align_corners=*/false);
  x = x * 2 - 1;
  const int rh = static_cast<int>(x.size(2)), rw = static_cast<int>(x.size(3));
  if (rw < 64 || rh < 64 || rw > 8 * rh || rh > 8 * rw)
    throw ImageError("a reference image of " + std::to_string(rw) + "x" + std::to_string(rh) +
                     " is below 64 pixels a side or beyond an aspect of 8 (the pipeline's cap_min_pixels refuses it)");
  if (size.resized.width != rw || size.resized.height != rh)
    x = torch::upsample_bicubic2d(x, {size.resized.height, size.resized.width}, /*align_corners=*/false);
  const int top = (size.resized.height - size.cropped.height) / 2, left = (size.resized.width - size.cropped.width) / 2;
  return x.squeeze(0).narrow(1, top, size.cropped.height).narrow(2, left, size.cropped.width).contiguous();
}

torch::Tensor to_rgb_uint8(const torch::Tensor& image_chw) {
  // One float copy, scaled in place, then the uint8 image: a preview's conversion holds at most one more
  // float image and a quarter of one. The channels go last, whatever comes between ([3, F, H, W] frames).
  std::vector<int64_t> channels_last;
  for (int64_t d = 1; d < image_chw.dim(); ++d) channels_last.push_back(d);
  channels_last.push_back(0);
  // A GPU run copies the image to host memory first and converts it there; a CPU run where it is (a walk as
  // the device it stands for).
  const torch::Tensor image = image_chw.detach().to(torch::kFloat);
  const memory::CpuWork cpu;
  return memory::to_cpu(image).add(1.0).mul_(127.5).round_().clamp_(0, 255).permute(channels_last).to(torch::kUInt8);
}

torch::Tensor load_image_cover(const std::filesystem::path& path, int width, int height,
                               const std::vector<int>& background) {
  torch::Tensor rgb = decode_control_rgb(path, background);
  const double scale = std::max(static_cast<double>(width) / rgb.size(1), static_cast<double>(height) / rgb.size(0));
  const int sw = std::max(width, static_cast<int>(std::ceil(rgb.size(1) * scale)));
  const int sh = std::max(height, static_cast<int>(std::ceil(rgb.size(0) * scale)));
  rgb = resize_rgb(rgb, sw, sh).narrow(0, (sh - height) / 2, height).narrow(1, (sw - width) / 2, width);
  return to_unit_range(rgb);
}

}  // namespace gclab::data
