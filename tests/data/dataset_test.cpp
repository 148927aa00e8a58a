#include "gclab/data/dataset.h"

#include <gtest/gtest.h>
#include <webp/encode.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <tuple>

#include "../support/test_util.h"
#include "gclab/data/image.h"
#include "gclab/data/loader.h"
#include "gclab/data/synth.h"
#include "gclab/vae/codec.h"

namespace fs = std::filesystem;

namespace gclab::data {
namespace {

config::DatasetConfig dataset_at(const fs::path& dir) {
  config::DatasetConfig d;
  d.folder_path = dir.string();
  return d;
}

TEST(Synth, WritesCaptionedImagesThatReadBack) {
  const fs::path dir = testing::fresh_dir("data_synth");
  SynthOptions o;
  o.count = 6;
  o.sizes = {{64, 64}, {96, 64}};
  const auto files = write_synthetic_dataset(dir, o);
  ASSERT_EQ(files.size(), 6u);
  const auto size = read_image_size(files[1]);
  ASSERT_TRUE(size);
  EXPECT_EQ(size->width, 96);
  EXPECT_EQ(size->height, 64);
  const torch::Tensor rgb = decode_image_rgb(files[1]);
  EXPECT_EQ(rgb.sizes(), (std::vector<int64_t>{64, 96, 3}));
  EXPECT_GT(rgb.to(torch::kFloat).std().item<double>(), 10.0);  // shapes drawn, not a flat fill
  std::ifstream caption(dir / "synth_0001.txt");
  std::string text;
  std::getline(caption, text);
  EXPECT_NE(text.find("background"), std::string::npos) << text;
  const auto scan = scan_dataset(dataset_at(dir), 0);
  EXPECT_EQ(scan.items.size(), 6u);
  EXPECT_TRUE(scan.warnings.empty());
  fs::remove_all(dir);
}

// --simple (the quickstart's set): 24 images, each shape x colour x background once, one large shape in the
// middle whose caption says so — the quickstart's prompt among them, drawn as it says.
TEST(Synth, TheSimpleSetHasEveryCombinationOnceTheQuickstartsPromptAmongThem) {
  const fs::path dir = testing::fresh_dir("data_synth_simple");
  SynthOptions o;
  o.count = 24;
  o.sizes = {{64, 64}};
  o.simple = true;
  const auto files = write_synthetic_dataset(dir, o);
  std::set<std::string> captions;
  for (int i = 0; i < 24; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "synth_%04d.txt", i);
    std::ifstream in(dir / name);
    std::string text;
    std::getline(in, text);
    captions.insert(text);
  }
  EXPECT_EQ(captions.size(), 24u);
  ASSERT_TRUE(captions.count("a large red circle in the middle on a blue background"));
  const torch::Tensor rgb = decode_image_rgb(files[0]);                                 // that one
  EXPECT_TRUE(torch::equal(rgb[32][32], torch::tensor({220, 40, 40}, torch::kUInt8)));  // red in the middle
  EXPECT_TRUE(torch::equal(rgb[1][1], torch::tensor({40, 70, 210}, torch::kUInt8)));    // blue in the corner
  EXPECT_TRUE(torch::equal(rgb[9][9], rgb[1][1]));  // outside the circle (radius 0.3 of 64)
  fs::remove_all(dir);
}

// Previews are written in sample.format's file type, as PIL saves them for AI Toolkit: each reads back as
// the same picture (exactly for PNG, within lossy rounding for JPEG and WebP), and an unknown extension is
// an error, not a mislabelled file.
TEST(Image, WritesPngJpgAndWebpThatReadBack) {
  const fs::path dir = testing::fresh_dir("image_formats");
  // A smooth picture (lossy codecs keep it close): a gradient in each channel.
  const torch::Tensor x = torch::linspace(0, 255, 64).view({1, 64, 1}).expand({48, 64, 1});
  const torch::Tensor y = torch::linspace(0, 255, 48).view({48, 1, 1}).expand({48, 64, 1});
  const torch::Tensor image = torch::cat({x, y, (x + y) / 2}, 2).round().to(torch::kUInt8);
  for (const auto& [ext, tolerance] : {std::pair{".png", 0.0}, std::pair{".jpg", 4.0}, std::pair{".webp", 6.0}}) {
    const fs::path file = dir / (std::string("p") + ext);
    write_image(file, image);
    const torch::Tensor back = decode_image_rgb(file);
    ASSERT_EQ(back.sizes(), image.sizes()) << ext;
    const double err = (back.to(torch::kFloat) - image.to(torch::kFloat)).abs().mean().item<double>();
    EXPECT_LE(err, tolerance) << ext;
  }
  EXPECT_NE(fs::file_size(dir / "p.jpg"), fs::file_size(dir / "p.png"));
  EXPECT_THROW(write_image(dir / "p.bmp", image), ImageError);
  fs::remove_all(dir);
}

TEST(Dataset, CorruptImagesAreSkippedAndMissingOrBrokenCaptionsTrainOnWhatIsLeftWithAWarningEach) {
  const fs::path dir = testing::fresh_dir("data_corrupt");
  SynthOptions o;
  o.count = 3;
  o.sizes = {{64, 64}};
  write_synthetic_dataset(dir, o);
  std::ofstream(dir / "broken.png") << "this is not a png";
  fs::copy_file(dir / "synth_0000.png", dir / "nocaption.png");
  std::ofstream(dir / "synth_0001.txt", std::ios::binary) << "a caf\xc3";  // cut inside a UTF-8 sequence
  // A truncated PNG: the header survives, the pixels do not.
  {
    std::ifstream in(dir / "synth_0002.png", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(dir / "truncated.png", std::ios::binary) << bytes.substr(0, 60);
    std::ofstream(dir / "truncated.txt") << "cut";
  }
  const auto scan = scan_dataset(dataset_at(dir), 0);
  EXPECT_EQ(scan.skipped_images, 1);  // broken.png (truncated.png still has a readable header)
  EXPECT_EQ(scan.uncaptioned, 1);     // nocaption.png: trained on '' as AI Toolkit does, not skipped
  EXPECT_EQ(scan.items.size(), 5u);   // 3 synthetic, truncated.png, nocaption.png
  EXPECT_EQ(scan.warnings.size(), 3u);
  bool repaired = false;
  for (const auto& item : scan.items) repaired = repaired || item.caption == "a caf";
  EXPECT_TRUE(repaired);
  // Decoding the truncated file is a clear error, not a crash.
  EXPECT_THROW(decode_image_rgb(dir / "truncated.png"), ImageError);
  config::DatasetConfig with_default = dataset_at(dir);
  with_default.default_caption = "a picture";
  EXPECT_EQ(scan_dataset(with_default, 0).uncaptioned, 0);
  fs::remove_all(dir);
}

TEST(Dataset, MissingAndEmptyFoldersAreClearErrors) {
  const fs::path dir = testing::fresh_dir("data_empty");
  try {
    scan_dataset(dataset_at(dir / "nope"), 2);
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("datasets[2].folder_path"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos);
  }
  try {
    scan_dataset(dataset_at(dir), 0);
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("no usable images"), std::string::npos);
  }
  fs::remove_all(dir);
}

// The scan walks the folder as AI Toolkit's os.walk does (toolkit/data_loader.py:438-450): images in
// subfolders train too; hidden folders and files, and `_controls` folders, are left out.
TEST(Dataset, SubfoldersAreScannedAndHiddenAndControlsFoldersLeftOut) {
  const fs::path dir = testing::fresh_dir("data_walk");
  SynthOptions o;
  o.count = 1;
  o.sizes = {{64, 64}};
  for (const char* sub : {"", "a", "a/b", ".hidden", "_controls"}) write_synthetic_dataset(dir / sub, o);
  fs::copy_file(dir / "synth_0000.png", dir / ".dot.png");
  const ScanResult r = scan_dataset(dataset_at(dir), 0);
  std::set<std::string> found;
  for (const auto& item : r.items) found.insert(fs::relative(item.image, dir).string());
  EXPECT_EQ(found, (std::set<std::string>{"synth_0000.png", "a/synth_0000.png", "a/b/synth_0000.png"}));
  fs::remove_all(dir);
}

TEST(Dataset, WebpSizeFromTheHeaderAndDecoding) {
  const fs::path dir = testing::fresh_dir("data_webp");
  std::vector<uint8_t> rgb(40 * 24 * 3, 128);
  uint8_t* out = nullptr;
  const size_t n = WebPEncodeLosslessRGB(rgb.data(), 40, 24, 40 * 3, &out);
  ASSERT_GT(n, 0u);
  std::ofstream(dir / "a.webp", std::ios::binary)
      .write(reinterpret_cast<const char*>(out), static_cast<std::streamsize>(n));
  WebPFree(out);
  const auto size = read_image_size(dir / "a.webp");
  ASSERT_TRUE(size);
  EXPECT_EQ(size->width, 40);
  EXPECT_EQ(decode_image_rgb(dir / "a.webp").sizes(), (std::vector<int64_t>{24, 40, 3}));
  fs::remove_all(dir);
}

// AI Toolkit's get_caption (toolkit/dataloader_mixins.py:403-455), inject_trigger_into_prompt
// (toolkit/prompt_utils.py:715-742) and the training step's injection (BaseSDTrainProcess.py:1076-1081).
TEST(Captions, TriggerDropoutAndShuffleAsAiToolkit) {
  config::DatasetConfig d;
  std::mt19937_64 rng(1);
  EXPECT_EQ(process_caption("a photo of [trigger]", d, std::string("sks"), rng), "a photo of sks");
  EXPECT_EQ(process_caption("a photo of [name]", d, std::string("sks"), rng), "a photo of sks");
  EXPECT_EQ(process_caption("a photo", d, std::string("sks"), rng), "sks a photo");  // a space, not ", "
  EXPECT_EQ(process_caption("sks at home", d, std::string("sks"), rng), "sks at home");
  EXPECT_EQ(process_caption("a photo of [trigger]", d, std::nullopt, rng), "a photo of ");  // the tag goes
  // Split on ',' and joined with ", ", the pieces unstripped; the file's newline kept.
  EXPECT_EQ(process_caption("a cat, on a mat\n", d, std::nullopt, rng), "a cat,  on a mat\n");
  // A dataset's own trigger inside get_caption, the job's after it.
  d.trigger_word = "ohwx";
  EXPECT_EQ(process_caption("a photo", d, std::string("sks"), rng), "sks ohwx a photo");
  d.trigger_word.reset();
  d.caption_dropout_rate = 1.0;
  EXPECT_EQ(process_caption("a photo", d, std::nullopt, rng), "");
  // A dropped caption is '' in get_caption; the training step then puts the job's trigger word in front.
  EXPECT_EQ(process_caption("a photo", d, std::string("sks"), rng), "sks ");
  d.trigger_word = "ohwx";  // a dataset's own trigger word is not put into a dropped caption
  EXPECT_EQ(process_caption("a photo", d, std::nullopt, rng), "");
  d.trigger_word.reset();
  d.caption_dropout_rate = 0.0;
  d.shuffle_tokens = true;
  d.keep_tokens = 1;  // guards token dropout only: shuffle_tokens moves every part
  bool first_moved = false;
  for (int i = 0; i < 40; ++i) {
    const std::string c = process_caption("first,b,c,d,e", d, std::nullopt, rng);
    std::string letters = c;  // the same parts, in some order
    letters.erase(std::remove_if(letters.begin(), letters.end(), [](char ch) { return ch == ' ' || ch == ','; }),
                  letters.end());
    std::sort(letters.begin(), letters.end());
    EXPECT_EQ(letters, "bcdefirst") << c;
    first_moved = first_moved || c.rfind("first", 0) != 0;
  }
  EXPECT_TRUE(first_moved);
  // With cached text embeddings get_caption does not shuffle (the setting goes, said once), but
  // load_prompt_embedding still drops captions at the dataset's rate, to the cached dropout caption: the
  // trigger alone (dataloader_mixins.py:2188-2193, 2239-2253).
  d.caption_dropout_rate = 0.5;
  const auto warnings = disable_caption_randomness(d);
  EXPECT_EQ(warnings.size(), 1u);
  EXPECT_EQ(d.caption_dropout_rate, 0.5);
  EXPECT_TRUE(d.cache_text_embeddings);
  EXPECT_FALSE(d.shuffle_tokens);
  int kept = 0, dropped = 0;
  for (int i = 0; i < 200; ++i) {
    bool was_dropped = false;
    const std::string c = process_caption("first, b, c", d, std::string("sks"), rng, &was_dropped);
    EXPECT_EQ(c, was_dropped ? "sks " : "sks first,  b,  c");
    (was_dropped ? dropped : kept) += 1;
  }
  EXPECT_GT(dropped, 70);
  EXPECT_GT(kept, 70);
  EXPECT_TRUE(disable_caption_randomness(d).empty());
  // A regularization dataset gets no trigger put in front (get_caption's add_if_not_present only when not
  // is_reg, dataloader_mixins.py:389-392; the step's likewise), its tags still replaced, its dropout ''.
  config::DatasetConfig reg;
  reg.is_reg = true;
  EXPECT_EQ(process_caption("a photo", reg, std::string("sks"), rng), "a photo");
  EXPECT_EQ(process_caption("a photo of [trigger]", reg, std::string("sks"), rng), "a photo of sks");
  reg.caption_dropout_rate = 1.0;
  EXPECT_EQ(process_caption("a photo", reg, std::string("sks"), rng), "");
}

TEST(Dataset, EpochPlanKeepsBucketsApartPadsShortBatchesAndCopiesPerResolution) {
  std::vector<ImageItem> items;
  for (int i = 0; i < 5; ++i) items.push_back({"sq" + std::to_string(i), "", 1024, 1024, 0, {}, {}, {}, {}});
  for (int i = 0; i < 3; ++i) items.push_back({"wide" + std::to_string(i), "", 1536, 1024, 0, {}, {}, {}, {}});
  items.push_back({"other", "", 512, 512, 1, {}, {}, {}, {}});
  config::DatasetConfig a, b;
  a.resolution = {512, 1024};
  a.num_repeats = 2;
  b.resolution = {512};
  b.batch_size = 1;
  const auto batches = plan_epoch(items, {a, b}, 4, BucketRules{32, 4}, 7);
  int samples_a = 0, samples_b = 0;
  for (const auto& batch : batches) {
    ASSERT_EQ(batch.samples.size(), batch.dataset == 0 ? 4u : 1u);
    for (const auto& s : batch.samples) {
      EXPECT_EQ(s.placement.bucket, batch.bucket);
      EXPECT_EQ(items[static_cast<size_t>(s.item)].dataset, batch.dataset);
    }
    (batch.dataset == 0 ? samples_a : samples_b) += static_cast<int>(batch.samples.size());
  }
  // Dataset a: 2 resolutions x 2 repeats; square 10 samples -> 3 batches (last padded), wide 6 -> 2.
  EXPECT_EQ(samples_a, 2 * (12 + 8));
  EXPECT_EQ(samples_b, 1);
  const auto again = plan_epoch(items, {a, b}, 4, BucketRules{32, 4}, 7);
  ASSERT_EQ(again.size(), batches.size());
  for (size_t i = 0; i < again.size(); ++i) EXPECT_EQ(again[i].samples[0].item, batches[i].samples[0].item);
  const auto histogram = bucket_histogram(items, a, BucketRules{32, 4});
  EXPECT_EQ(histogram.at(1024).at(BucketResolution{1024, 1024}), 5);
  EXPECT_EQ(histogram.at(1024).at(BucketResolution{1248, 832}), 3);
}

}  // namespace
// flip_x / flip_y grow the dataset as AI Toolkit's file list grows (toolkit/data_loader.py:574-592): every
// image once as it is and once flipped each way asked for — both: four copies, one flipped both ways — not
// a coin per sample.
TEST(Dataset, FlipsAddAFlippedCopyOfEveryImage) {
  std::vector<ImageItem> items;
  for (int i = 0; i < 3; ++i) items.push_back({"sq" + std::to_string(i), "", 512, 512, 0, {}, {}, {}, {}});
  config::DatasetConfig d;
  d.resolution = {512};
  d.batch_size = 1;
  for (const auto& [fx, fy] : {std::pair{true, false}, std::pair{false, true}, std::pair{true, true}}) {
    d.flip_x = fx, d.flip_y = fy;
    std::map<std::tuple<int, bool, bool>, int> seen;
    for (const auto& batch : plan_epoch(items, {d}, 1, BucketRules{32, 4}, 3))
      for (const auto& s : batch.samples) ++seen[{s.item, s.flip_x, s.flip_y}];
    const int copies = (fx ? 2 : 1) * (fy ? 2 : 1);
    EXPECT_EQ(seen.size(), static_cast<size_t>(3 * copies)) << fx << fy;
    for (const auto& [key, n] : seen) {
      EXPECT_EQ(n, 1);
      EXPECT_TRUE(fx || !std::get<1>(key));
      EXPECT_TRUE(fy || !std::get<2>(key));
    }
  }
}

// A phone photo's EXIF orientation turns it as AI Toolkit turns it (PIL's exif_transpose, for its size and
// its pixels: toolkit/data_transfer_object/data_loader.py:157-159, toolkit/dataloader_mixins.py:895-896):
// the size from the header alone is the upright one, and the pixels are what PIL gives (to its JPEG
// decoder's rounding) and what gclab's own decode of the unmarked file turns to (exactly).
TEST(Image, ExifOrientationTurnsJpegsAsPilDoes) {
  const fs::path dir = testing::fresh_dir("image_exif");
  // An asymmetric picture: a bright top-left corner on a gradient.
  torch::Tensor image = torch::linspace(0, 200, 64).view({1, 64, 1}).expand({40, 64, 3}).clone();
  image.narrow(0, 0, 10).narrow(1, 0, 16).fill_(255);
  image = image.round().to(torch::kUInt8);
  write_image(dir / "plain.jpg", image);
  const torch::Tensor plain = decode_image_rgb(dir / "plain.jpg");
  std::string bytes;
  {
    std::ifstream in(dir / "plain.jpg", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string command =
      std::string("\"") + GCLAB_PYTHON + "\" \"" + GCLAB_SOURCE_DIR + "/tests/reference/exif_transpose.py\"";
  for (int o = 1; o <= 8; ++o) {
    // APP1: "Exif\0\0", a little-endian TIFF header, IFD0 with one entry: Orientation (0x0112, SHORT) = o.
    const std::string exif = std::string("Exif\0\0II*\0\x08\0\0\0\x01\0\x12\x01\x03\0\x01\0\0\0", 24) +
                             std::string(1, static_cast<char>(o)) + std::string("\0\0\0\0\0\0\0", 7);
    const int length = static_cast<int>(exif.size()) + 2;
    const std::string app1 =
        std::string("\xFF\xE1", 2) + static_cast<char>(length >> 8) + static_cast<char>(length & 255);
    std::ofstream(dir / ("o" + std::to_string(o) + ".jpg"), std::ios::binary)
        << bytes.substr(0, 2) + app1 + exif + bytes.substr(2);
    command += " \"" + (dir / ("o" + std::to_string(o) + ".jpg")).string() + "\"";
  }
  const bool pil = std::system((command + " > /dev/null").c_str()) == 0;
  for (int o = 1; o <= 8; ++o) {
    const fs::path file = dir / ("o" + std::to_string(o) + ".jpg");
    const torch::Tensor got = decode_image_rgb(file);
    const auto size = read_image_size(file);
    ASSERT_TRUE(size) << o;
    EXPECT_EQ(size->width, got.size(1)) << o;
    EXPECT_EQ(size->height, got.size(0)) << o;
    EXPECT_EQ(got.size(1), o >= 5 ? 40 : 64) << o;
    if (o == 1) {
      EXPECT_TRUE(torch::equal(got, plain));
    }
    if (o == 6) {
      EXPECT_TRUE(torch::equal(got, torch::rot90(plain, -1, {0, 1}))) << "90 degrees clockwise";
    }
    if (!pil) continue;
    std::ifstream in(file.string() + ".rgb", std::ios::binary);
    std::string raw((std::istreambuf_iterator<char>(in)), {});
    ASSERT_EQ(raw.size(), static_cast<size_t>(got.numel())) << o;
    const torch::Tensor want =
        torch::from_blob(raw.data(), {got.size(0), got.size(1), 3}, torch::kUInt8).to(torch::kFloat);
    EXPECT_LT((got.to(torch::kFloat) - want).abs().mean().item<double>(), 2.0) << "orientation " << o;
  }
  if (!pil) GTEST_SKIP() << "checked without PIL: the reference did not run";
  fs::remove_all(dir);
}

// PIL's exif_transpose turns PNGs (an eXIf chunk) and WebPs (an EXIF chunk, the extended VP8X format) too,
// and AI Toolkit loads every format through it: the same eight orientations as for JPEG, the size from the
// headers and the pixels as PIL gives them (PNG exactly; WebP to its decoders' rounding), and gclab's own
// decode of the unmarked file turned.
uint32_t crc32_of(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const unsigned char c : bytes) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

std::string le32(uint32_t v) {
  return {static_cast<char>(v & 255), static_cast<char>(v >> 8 & 255), static_cast<char>(v >> 16 & 255),
          static_cast<char>(v >> 24)};
}

TEST(Image, ExifOrientationTurnsPngsAndWebpsAsPilDoes) {
  const fs::path dir = testing::fresh_dir("image_exif_png_webp");
  torch::Tensor image = torch::linspace(0, 200, 64).view({1, 64, 1}).expand({40, 64, 3}).clone();
  image.narrow(0, 0, 10).narrow(1, 0, 16).fill_(255);
  image = image.round().to(torch::kUInt8);
  const std::string command =
      std::string("\"") + GCLAB_PYTHON + "\" \"" + GCLAB_SOURCE_DIR + "/tests/reference/exif_transpose.py\"";
  bool without_pil = false;
  for (const std::string ext : {".png", ".webp"}) {
    write_image(dir / ("plain" + ext), image);
    const torch::Tensor plain = decode_image_rgb(dir / ("plain" + ext));
    std::string bytes;
    {
      std::ifstream in(dir / ("plain" + ext), std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    std::string files;
    for (int o = 1; o <= 8; ++o) {
      // A little-endian TIFF header, IFD0 with one entry: Orientation (0x0112, SHORT) = o.
      const std::string tiff = std::string("II*\0\x08\0\0\0\x01\0\x12\x01\x03\0\x01\0\0\0", 18) +
                               std::string(1, static_cast<char>(o)) + std::string(7, '\0');
      std::string marked;
      if (ext == ".png") {  // [length][type][data][crc of type and data]: after IHDR (8 + 25 bytes) for even
        // orientations, just before IEND, after the image data, for odd ones (PIL reads it there too)
        const std::string type_data = "eXIf" + tiff;
        std::string length = le32(static_cast<uint32_t>(tiff.size())), crc = le32(crc32_of(type_data));
        std::reverse(length.begin(), length.end());
        std::reverse(crc.begin(), crc.end());
        const size_t at = o % 2 == 0 ? 33 : bytes.size() - 12;
        marked = bytes.substr(0, at) + length + type_data + crc + bytes.substr(at);
      } else {  // VP8X (EXIF flag, canvas 64 x 40), the image's chunk, then EXIF
        std::string vp8x =
            "VP8X" + le32(10) + std::string("\x08\0\0\0", 4) + le32(63).substr(0, 3) + le32(39).substr(0, 3);
        const std::string body =
            "WEBP" + vp8x + bytes.substr(12) + "EXIF" + le32(static_cast<uint32_t>(tiff.size())) + tiff;
        marked = "RIFF" + le32(static_cast<uint32_t>(body.size())) + body;
      }
      const fs::path file = dir / ("o" + std::to_string(o) + ext);
      std::ofstream(file, std::ios::binary) << marked;
      files += " \"" + file.string() + "\"";
    }
    const bool pil = std::system((command + files + " > /dev/null").c_str()) == 0;
    for (int o = 1; o <= 8; ++o) {
      const fs::path file = dir / ("o" + std::to_string(o) + ext);
      const torch::Tensor got = decode_image_rgb(file);
      const auto size = read_image_size(file);
      ASSERT_TRUE(size) << ext << " " << o;
      EXPECT_EQ(size->width, got.size(1)) << ext << " " << o;
      EXPECT_EQ(got.size(1), o >= 5 ? 40 : 64) << ext << " " << o;
      if (o == 6) {
        EXPECT_TRUE(torch::equal(got, torch::rot90(plain, -1, {0, 1}))) << ext << ": 90 degrees clockwise";
      }
      if (!pil) continue;
      std::ifstream in(file.string() + ".rgb", std::ios::binary);
      std::string raw((std::istreambuf_iterator<char>(in)), {});
      ASSERT_EQ(raw.size(), static_cast<size_t>(got.numel())) << ext << " " << o;
      const torch::Tensor want =
          torch::from_blob(raw.data(), {got.size(0), got.size(1), 3}, torch::kUInt8).to(torch::kFloat);
      const double diff = (got.to(torch::kFloat) - want).abs().mean().item<double>();
      EXPECT_LE(diff, ext == ".png" ? 0.0 : 2.0) << ext << " orientation " << o;
    }
    without_pil = without_pil || !pil;
  }
  if (without_pil) GTEST_SKIP() << "checked without PIL: the reference did not run";
  fs::remove_all(dir);
}

}  // namespace gclab::data

namespace gclab::data {
namespace {

// A video dataset (num_frames > 1): each folder of numbered frames is a clip, captioned beside it; its
// buckets count frames ("64x64x5f", AI Toolkit's key); the loader gives each sample's frames [3, F, H, W],
// picked evenly from the clip as shrink_video_to_frames does, for the autoencoder to encode whole.
TEST(Dataset, ClipsAreFoldersOfFramesTheirBucketsCountFramesAndTheLoaderGivesFrames) {
  const fs::path dir = testing::fresh_dir("clip_dataset");
  SynthOptions s;
  s.count = 2, s.frames = 11, s.sizes = {{64, 64}};
  const auto clips = write_synthetic_dataset(dir / "clips", s);
  ASSERT_EQ(clips.size(), 2u);
  EXPECT_TRUE(fs::is_directory(clips[0]));
  EXPECT_TRUE(fs::exists(dir / "clips" / "synth_0000.txt"));
  config::DatasetConfig d;
  d.folder_path = (dir / "clips").string();
  d.resolution = {64};
  d.num_frames = 5;
  const ScanResult scan = scan_dataset(d, 0);
  ASSERT_EQ(scan.items.size(), 2u);
  EXPECT_EQ(scan.items[0].frames.size(), 11u);
  EXPECT_NE(scan.items[0].caption.find("moving right"), std::string::npos);
  const auto histogram = bucket_histogram(scan.items, d, BucketRules{16, 4});
  ASSERT_EQ(histogram.at(64).size(), 1u);
  EXPECT_EQ(histogram.at(64).begin()->first.key(), "64x64x5f");
  // Frames numbered without zero padding (ffmpeg's %d) are taken in their numbers' order.
  for (int f : {1, 2, 10})
    write_png(dir / "numbered" / "clip" / ("f" + std::to_string(f) + ".png"),
              torch::full({16, 16, 3}, f, torch::kUInt8));
  d.folder_path = (dir / "numbered").string();
  const ScanResult numbered = scan_dataset(d, 0);
  ASSERT_EQ(numbered.items.size(), 1u);
  ASSERT_EQ(numbered.items[0].frames.size(), 3u);
  EXPECT_EQ(numbered.items[0].frames[1].filename(), "f2.png");
  EXPECT_EQ(numbered.items[0].frames[2].filename(), "f10.png");
  d.folder_path = (dir / "clips").string();
  // The frames a sample takes, and a short clip's repeats.
  EXPECT_EQ(clip_frame_indices(11, 5), (std::vector<int>{0, 2, 5, 8, 10}));
  vae::CodecSpec video;  // an autoencoder codec: the loader gives frames, the session encodes them
  video.autoencoder = vae::QwenImageVaeConfig::tiny();
  video.video = true;
  auto codec = vae::build_codec(video, torch::kCPU, 0);
  LoaderOptions o;
  o.batch_size = 2;
  BatchLoader loader(scan.items, {d}, *codec, o, 0);
  const LoadedBatch b = loader.next();
  EXPECT_EQ(b.bucket.key(), "64x64x5f");
  ASSERT_EQ(b.images.sizes(), (std::vector<int64_t>{2, 3, 5, 64, 64}));
  const size_t first = b.image_files[0] == scan.items[0].image ? 0 : 1;
  for (const auto& [slot, frame] : std::vector<std::pair<int64_t, int>>{{0, 0}, {1, 2}, {2, 5}, {4, 10}})
    EXPECT_TRUE(
        torch::equal(b.images[0].select(1, slot), to_unit_range(decode_image_rgb(scan.items[first].frames[frame]))))
        << slot;
  // Encoded whole by the video autoencoder: 1 + (5 - 1) / 4 latent frames.
  EXPECT_EQ(codec->encode(b.images).sizes(), (std::vector<int64_t>{2, 16, 2, 8, 8}));
  EXPECT_EQ(codec->decode(codec->encode(b.images)).sizes(), b.images.sizes());
  fs::remove_all(dir);
}

// A preview's frames as an animated WebP: every frame back, each at its time.
TEST(Image, AnimatedWebpWritesEveryFrameAtTheFps) {
  const fs::path dir = testing::fresh_dir("animated_webp");
  const torch::Tensor frames = torch::arange(6).mul(40).view({6, 1, 1, 1}).expand({6, 32, 48, 3}).to(torch::kUInt8);
  write_animated_webp(dir / "a.webp", frames, 12);
  const AnimatedImage back = read_animated_webp(dir / "a.webp");
  ASSERT_EQ(back.frames.sizes(), frames.sizes());
  EXPECT_LE((back.frames.to(torch::kFloat) - frames.to(torch::kFloat)).abs().max().item<double>(), 6.0);
  EXPECT_EQ(back.timestamps_ms, (std::vector<int>{83, 167, 250, 333, 417, 500}));
  EXPECT_THROW(read_animated_webp(dir / "missing.webp"), ImageError);
  // The uint8 conversion takes [3, F, H, W] frames to [F, H, W, 3].
  EXPECT_EQ(to_rgb_uint8(torch::zeros({3, 4, 8, 16})).sizes(), (std::vector<int64_t>{4, 8, 16, 3}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::data
