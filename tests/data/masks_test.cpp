// The images beside a training image: PIL's blur and grey conversion to the byte, the inpainting images'
// alpha and the loss masks placed as the image and stacked per batch as AI Toolkit stacks them.
#include "gclab/data/masks.h"

#include <gtest/gtest.h>
#include <stb/stb_image_write.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "../support/test_util.h"
#include "gclab/data/image.h"
#include "gclab/data/loader.h"
#include "gclab/data/synth.h"
#include "gclab/vae/autoencoder_kl.h"

namespace fs = std::filesystem;

namespace gclab::data {
namespace {

void write_rgba_png(const fs::path& path, const torch::Tensor& rgba) {
  const torch::Tensor c = rgba.contiguous();
  ASSERT_TRUE(stbi_write_png(path.c_str(), static_cast<int>(c.size(1)), static_cast<int>(c.size(0)), 4,
                             c.data_ptr<uint8_t>(), static_cast<int>(c.size(1)) * 4));
}

torch::Tensor read_bytes(const fs::path& path, std::vector<int64_t> shape) {
  std::ifstream in(path, std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), {});
  torch::Tensor t = torch::empty(shape, torch::kUInt8);
  if (raw.size() != static_cast<size_t>(t.numel())) return {};
  std::memcpy(t.data_ptr(), raw.data(), raw.size());
  return t;
}

// pil_gaussian_blur and pil_luminance against PIL itself (GaussianBlur then convert('L'), the steps of
// load_mask_image), byte for byte, over radii that take each of the box blur's edge regimes: a box narrower
// than the image, and one wider (the 5x4 image).
TEST(Image, PilGaussianBlurAndGreyAreBytesForBytesPils) {
  const fs::path dir = testing::fresh_dir("pil_blur");
  torch::manual_seed(3);
  const torch::Tensor noise = torch::randint(0, 256, {23, 37, 3}).to(torch::kUInt8);
  torch::Tensor edges = torch::zeros({40, 30, 3}, torch::kUInt8);
  edges.narrow(0, 10, 20).narrow(1, 5, 12).fill_(255);
  edges.narrow(2, 1, 1).narrow(1, 20, 10).fill_(140);
  const torch::Tensor small = torch::randint(0, 256, {4, 5, 3}).to(torch::kUInt8);
  const std::vector<std::pair<std::string, torch::Tensor>> images = {
      {"noise.png", noise}, {"edges.png", edges}, {"small.png", small}};
  const std::vector<std::pair<std::string, int>> cases = {{"noise.png", 1}, {"noise.png", 2}, {"noise.png", 5},
                                                          {"edges.png", 1}, {"edges.png", 3}, {"edges.png", 8},
                                                          {"small.png", 1}, {"small.png", 4}};
  std::string command =
      std::string("\"") + GCLAB_PYTHON + "\" \"" + GCLAB_SOURCE_DIR + "/tests/reference/pil_mask_blur.py\"";
  for (const auto& [name, image] : images) write_png(dir / name, image);
  for (const auto& [name, radius] : cases) command += " \"" + (dir / name).string() + "\" " + std::to_string(radius);
  if (std::system((command + " > /dev/null 2>&1").c_str()) != 0) GTEST_SKIP() << "PIL did not run";
  for (const auto& [name, radius] : cases) {
    const torch::Tensor image = decode_image_rgb(dir / name);
    const torch::Tensor blurred = pil_gaussian_blur(image, radius);
    const std::string stem = (dir / name).string() + ".r" + std::to_string(radius);
    const torch::Tensor want_rgb = read_bytes(stem + ".rgb", {image.size(0), image.size(1), 3});
    const torch::Tensor want_l = read_bytes(stem + ".l", {image.size(0), image.size(1), 1});
    ASSERT_TRUE(want_rgb.defined() && want_l.defined()) << stem;
    EXPECT_TRUE(torch::equal(blurred, want_rgb))
        << stem << ": " << (blurred.to(torch::kInt) - want_rgb.to(torch::kInt)).abs().max().item<int>() << " off";
    EXPECT_TRUE(torch::equal(pil_luminance(blurred), want_l)) << stem;
  }
  EXPECT_TRUE(torch::equal(pil_gaussian_blur(noise, 0), noise));
  fs::remove_all(dir);
}

// A dataset with inpaint_path and mask_path: the batch stacks each sample's alpha and mask placed as its
// image, zeros for the image that has none (data_loader.py:358-373, 399-412); mask_min_value lifts the mask's
// floor, invert_mask inverts it, a flip flips it; the inpainting images are read only when asked (Flex.2).
// Control images at the batch's size as AI Toolkit's load_control_image places them (toolkit/
// dataloader_mixins.py:1157-1198): an RGBA control pasted over control_transparent_color through its alpha
// (PIL's rounding), flipped with its image, stretched to the image's scale_to size and cut at its crop — a
// 32 x 32 control of a 64 x 64 image, its left half opaque red, its right half transparent.
TEST(Loader, ControlImagesArePlacedFlippedAndPastedAsAiToolkitPlacesThem) {
  const fs::path dir = testing::fresh_dir("control_placement");
  SynthOptions o;
  o.count = 1, o.sizes = {{64, 64}};
  write_synthetic_dataset(dir / "data", o);
  fs::create_directories(dir / "controls");
  torch::Tensor rgba = torch::zeros({32, 32, 4}, torch::kUInt8);
  rgba.narrow(1, 0, 16).select(2, 0).fill_(255);
  rgba.narrow(1, 0, 16).select(2, 3).fill_(255);
  rgba.narrow(1, 16, 16).select(2, 1).fill_(255);  // green under alpha 0: not seen
  rgba[0][0][0] = 200, rgba[0][0][3] = 128;        // 200 at alpha 128: round(200 * 128 / 255) = 100
  write_rgba_png(dir / "controls" / "synth_0000.png", rgba);
  const torch::Tensor black = decode_control_rgb(dir / "controls" / "synth_0000.png", {0, 0, 0});
  EXPECT_EQ(black[0][0][0].item<int>(), 100);
  EXPECT_EQ(black[5][20][1].item<int>(), 0);
  const torch::Tensor grey = decode_control_rgb(dir / "controls" / "synth_0000.png", {10, 20, 30});
  EXPECT_TRUE(torch::equal(grey[5][20], torch::tensor({10, 20, 30}, torch::kUInt8)));
  EXPECT_EQ(grey[0][0][1].item<int>(), 10);  // round((0 * 128 + 20 * 127) / 255)

  config::DatasetConfig d;
  d.folder_path = (dir / "data").string();
  d.control_path = {(dir / "controls").string()};
  d.resolution = {64};
  d.flip_x = true;
  const ScanResult scan = scan_dataset(d, 0);
  ASSERT_EQ(scan.items.size(), 1u);
  vae::CodecSpec cs;
  cs.autoencoder = vae::AutoencoderKLConfig{}.shrunk();  // not encoded on the loader's thread: the images come back
  auto codec = vae::build_codec(cs, torch::kCPU, 0);
  LoaderOptions lo;
  lo.batch_size = 1, lo.divisibility = 16, lo.controls_at_bucket = true;
  BatchLoader loader(scan.items, {d}, *codec, lo, 0);
  int flipped = 0;
  for (int k = 0; k < 2; ++k) {  // the image and its flipped copy
    const LoadedBatch b = loader.next();
    ASSERT_EQ(b.reference_images.size(), 1u);
    const torch::Tensor ref = b.reference_images[0];  // [1, 3, 1, 64, 64] in [-1, 1]
    ASSERT_EQ(ref.sizes(), (std::vector<int64_t>{1, 3, 1, 64, 64}));
    const double left = ref[0][0][0].narrow(1, 0, 24).mean().item<double>();
    const double right = ref[0][0][0].narrow(1, 40, 24).mean().item<double>();
    EXPECT_NEAR(std::max(left, right), 1.0, 0.01) << k;   // red, stretched over its half (one corner pixel 100)
    EXPECT_NEAR(std::min(left, right), -1.0, 1e-6) << k;  // black where it was transparent
    EXPECT_NEAR(ref[0][1].abs().sub(1).abs().max().item<double>(), 0.0, 0.05) << k;  // no green anywhere
    flipped += right > left;
  }
  EXPECT_EQ(flipped, 1);
  fs::remove_all(dir);
}

TEST(Loader, InpaintingImagesAndLossMasksAreStackedPerBatchAsAiToolkitStacksThem) {
  const fs::path dir = testing::fresh_dir("masks_loader");
  fs::create_directories(dir / "images");
  fs::create_directories(dir / "inpaint");
  fs::create_directories(dir / "masks");
  for (const char* stem : {"a", "b"}) {
    write_png(dir / "images" / (std::string(stem) + ".png"), torch::full({64, 64, 3}, 90, torch::kUInt8));
    std::ofstream(dir / "images" / (std::string(stem) + ".txt")) << "a square";
  }
  // "a" has both: alpha 0 on its left 16 columns (inpaint there), a mask black on its top 8 rows.
  torch::Tensor rgba = torch::full({64, 64, 4}, 255, torch::kUInt8);
  rgba.narrow(1, 0, 16).select(2, 3).fill_(0);
  write_rgba_png(dir / "inpaint" / "a.png", rgba);
  torch::Tensor mask = torch::full({64, 64, 3}, 255, torch::kUInt8);
  mask.narrow(0, 0, 8).fill_(0);
  write_png(dir / "masks" / "a.png", mask);
  write_png(dir / "inpaint" / "b.png", torch::zeros({64, 64, 3}, torch::kUInt8));  // RGB: no alpha, none

  config::DatasetConfig d;
  d.folder_path = (dir / "images").string();
  d.resolution = {64};
  d.inpaint_path = (dir / "inpaint").string();
  d.mask_path = (dir / "masks").string();
  d.mask_min_value = 0.25;
  ScanResult scan = scan_dataset(d, 0);
  ASSERT_EQ(scan.items.size(), 2u);
  EXPECT_EQ(scan.without_mask, 1);
  EXPECT_EQ(scan.without_inpaint, 1);  // b's is RGB: AI Toolkit's load_inpaint_image reads none from it
  EXPECT_TRUE(scan.items[1].inpaint.empty());
  EXPECT_EQ(scan.items[0].inpaint, dir / "inpaint" / "a.png");
  auto codec = vae::build_codec(vae::CodecSpec{}, torch::kCPU, 0);
  LoaderOptions o;
  o.batch_size = 2;
  o.divisibility = 16;
  o.inpaint_images = true;
  torch::Tensor keep_a = torch::ones({1, 64, 64});
  keep_a.narrow(2, 0, 16).zero_();
  torch::Tensor mask_a = torch::ones({1, 64, 64});
  mask_a.narrow(1, 0, 8).fill_(0.25);
  {
    BatchLoader loader(scan.items, {d}, *codec, o, 0);
    const LoadedBatch b = loader.next();
    ASSERT_TRUE(b.inpaint_alpha.defined());
    ASSERT_TRUE(b.loss_mask.defined());
    ASSERT_EQ(b.inpaint_alpha.sizes(), (std::vector<int64_t>{2, 1, 64, 64}));
    for (int64_t i = 0; i < 2; ++i) {
      const bool is_a = b.image_files[static_cast<size_t>(i)].stem() == "a";
      EXPECT_TRUE(torch::equal(b.inpaint_alpha[i], is_a ? keep_a : torch::zeros_like(keep_a))) << i;
      EXPECT_TRUE(torch::allclose(b.loss_mask[i], is_a ? mask_a : torch::zeros_like(mask_a))) << i;
    }
    EXPECT_TRUE(loader.take_warnings().empty());
  }
  o.inpaint_images = false;
  {
    BatchLoader loader(scan.items, {d}, *codec, o, 0);
    EXPECT_FALSE(loader.next().inpaint_alpha.defined());
  }
  // Placed as the image: a flip flips them; invert_mask inverts the mask before its floor is applied.
  const BucketPlacement same{{64, 64}, 64, 64, 0, 0};
  EXPECT_TRUE(torch::equal(load_inpaint_alpha(dir / "inpaint" / "a.png", same, true, false), keep_a.flip({2})));
  d.invert_mask = true;
  std::mt19937_64 rng(1);
  const torch::Tensor inverted = load_loss_mask(dir / "masks" / "a.png", d, same, false, true, rng);
  torch::Tensor want = torch::full({1, 64, 64}, 0.25);
  want.narrow(1, 56, 8).fill_(1.0);
  EXPECT_TRUE(torch::allclose(inverted, want));
  // alpha_mask: the image's own alpha; an image without one is refused by name.
  config::DatasetConfig alpha = d;
  alpha.folder_path = (dir / "inpaint").string();
  alpha.mask_path.reset();
  alpha.inpaint_path.reset();
  alpha.alpha_mask = true;
  try {
    scan_dataset(alpha, 0);
    ADD_FAILURE() << "b.png has no alpha";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("b.png has no alpha channel"), std::string::npos) << e.what();
  }
  fs::remove(dir / "inpaint" / "b.png");
  scan = scan_dataset(alpha, 0);
  ASSERT_EQ(scan.items.size(), 1u);
  EXPECT_EQ(scan.items[0].mask, dir / "inpaint" / "a.png");
  alpha.invert_mask = false;
  alpha.mask_min_value = 0;
  EXPECT_TRUE(torch::equal(load_loss_mask(scan.items[0].mask, alpha, same, false, false, rng), keep_a));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::data
