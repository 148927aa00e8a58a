// Video files through FFmpeg: what gclab writes reads back (size, frame count, rate, pixels) in every container
// it writes, frames come back at the indices asked, bad files are errors that name the file, and a video
// dataset reads video files, folders of frames and loose images as AI Toolkit's video datasets do.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>

#include "../support/test_util.h"
#include "gclab/data/dataset.h"
#include "gclab/data/synth.h"
#include "gclab/data/video.h"

namespace gclab::data {
namespace {
namespace fs = std::filesystem;

// Frame i: a flat colour that says i in its red (a multiple of 36, exact in GIF's 3-3-2 palette) and a fixed
// green / blue, with a white square that moves: decoders must give back each frame, in order.
torch::Tensor numbered_frames(int count, int height, int width) {
  torch::Tensor f = torch::zeros({count, height, width, 3}, torch::kUInt8);
  for (int i = 0; i < count; ++i) {
    f[i].select(2, 0).fill_(36 * (i % 8));
    f[i].select(2, 1).fill_(73);
    f[i].select(2, 2).fill_(170);
    f[i].slice(0, 8, 24).slice(1, 4 * i, 4 * i + 16).fill_(255);
  }
  return f;
}

double mean_abs_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat) - b.to(torch::kFloat)).abs().mean().item<double>();
}

TEST(Video, EachContainerGclabWritesReadsBackItsSizeFramesRateAndPixels) {
  const fs::path dir = testing::fresh_dir("video_round_trip");
  const torch::Tensor frames = numbered_frames(8, 48, 64);
  for (const char* ext : {".mp4", ".mov", ".mkv", ".webm", ".gif"}) {
    SCOPED_TRACE(ext);
    const fs::path file = dir / (std::string("clip") + ext);
    write_video(file, frames, 16);
    EXPECT_FALSE(fs::exists(dir / (std::string(".clip") + ext + ".part")));  // written under a temporary name
    std::string why;
    const auto info = probe_video(file, &why);
    ASSERT_TRUE(info) << why;
    EXPECT_EQ(info->width, 64);
    EXPECT_EQ(info->height, 48);
    EXPECT_EQ(info->frames, 8);
    // GIF stores delays in hundredths of a second (1/16 s is 6 of them) and no rate: FFmpeg's is a guess.
    EXPECT_NEAR(info->fps, 16.0, std::string(ext) == ".gif" ? 1.0 : 1e-9);
    std::vector<int> all(8);
    std::iota(all.begin(), all.end(), 0);
    const std::vector<torch::Tensor> back = decode_video_frames(file, all);
    ASSERT_EQ(back.size(), 8u);
    for (int i = 0; i < 8; ++i) {
      ASSERT_EQ(back[static_cast<size_t>(i)].sizes(), (std::vector<int64_t>{48, 64, 3}));
      EXPECT_LT(mean_abs_difference(back[static_cast<size_t>(i)], frames[i]), 3.0) << "frame " << i;
    }
  }
  fs::remove_all(dir);
}

// Every frame is in the file at any rate: without a duration on each packet the MP4 muxer's edit list
// ended where the last frame starts, and demuxers dropped it (at 8, 16 or 25 fps, not at 24 or 30).
TEST(Video, TheLastFrameIsKeptAtEveryRate) {
  const fs::path dir = testing::fresh_dir("video_rates");
  const torch::Tensor frames = numbered_frames(3, 48, 64);
  for (int fps : {8, 15, 16, 24, 25, 30}) {
    write_video(dir / "c.mp4", frames, fps);
    const std::vector<torch::Tensor> back = decode_video_frames(dir / "c.mp4", {0, 1, 2});
    for (int i = 0; i < 3; ++i)
      EXPECT_LT(mean_abs_difference(back[static_cast<size_t>(i)], frames[i]), 3.0) << fps << " fps, frame " << i;
  }
  fs::remove_all(dir);
}

TEST(Video, FramesComeBackAtTheIndicesAskedInTheirOrderAndPastTheEndAsTheLast) {
  const fs::path dir = testing::fresh_dir("video_indices");
  const torch::Tensor frames = numbered_frames(8, 32, 64);
  write_video(dir / "c.mp4", frames, 24);
  const std::vector<int> asked = {5, 0, 5, 2, 7, 12};
  const std::vector<torch::Tensor> back = decode_video_frames(dir / "c.mp4", asked);
  ASSERT_EQ(back.size(), asked.size());
  for (size_t k = 0; k < asked.size(); ++k) {
    const int want = std::min(asked[k], 7);
    for (int other = 0; other < 8; ++other) {  // nearest to the frame asked, far from every other
      if (other == want) continue;
      EXPECT_LT(mean_abs_difference(back[k], frames[want]), mean_abs_difference(back[k], frames[other]))
          << "asked " << asked[k] << ", closer to " << other;
    }
  }
  EXPECT_TRUE(decode_video_frames(dir / "c.mp4", {}).empty());
  fs::remove_all(dir);
}

TEST(Video, BadFilesAndBadRequestsAreErrorsThatNameTheFile) {
  const fs::path dir = testing::fresh_dir("video_errors");
  std::ofstream(dir / "text.mp4") << "not a video at all";
  std::string why;
  EXPECT_FALSE(probe_video(dir / "text.mp4", &why));
  EXPECT_NE(why.find("text.mp4"), std::string::npos) << why;
  EXPECT_THROW(decode_video_frames(dir / "text.mp4", {0}), VideoError);
  EXPECT_THROW(decode_video_frames(dir / "missing.mp4", {0}), ImageError);  // a loader's bad-file path catches it
  EXPECT_THROW(write_video(dir / "c.avi", numbered_frames(2, 16, 16), 8), VideoError);  // not written
  EXPECT_THROW(write_video(dir / "c.mp4", torch::zeros({2, 16, 16}, torch::kUInt8), 8), VideoError);
  EXPECT_THROW(write_video(dir / "c.mp4", numbered_frames(2, 16, 16), 0), VideoError);
  // H.264 needs even sides: an odd frame loses its last row and column, the rest as it was.
  const torch::Tensor odd = numbered_frames(3, 33, 35);
  write_video(dir / "odd.mp4", odd, 8);
  const auto info = probe_video(dir / "odd.mp4");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->width, 34);
  EXPECT_EQ(info->height, 32);
  const std::vector<torch::Tensor> back = decode_video_frames(dir / "odd.mp4", {0, 1, 2});
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      if (j == i) continue;
      EXPECT_LT(mean_abs_difference(back[static_cast<size_t>(i)], odd[i].slice(0, 0, 32).slice(1, 0, 34)),
                mean_abs_difference(back[static_cast<size_t>(i)], odd[j].slice(0, 0, 32).slice(1, 0, 34)))
          << i << " is closer to " << j;
    }
  }
  EXPECT_FALSE(fs::exists(dir / ".c.avi.part"));
  EXPECT_TRUE(is_video_file("a/b.MP4") && is_video_file("x.webm") && is_video_file("x.gif"));
  EXPECT_FALSE(is_video_file("x.png") || is_video_file("x.txt"));
  fs::remove_all(dir);
}

// A video dataset holds video files and folders of frames as clips and loose images as items of one frame
// (AI Toolkit's data_transfer_object/data_loader.py:64-68): a bucket of frames = 1, never batched with clips.
TEST(Dataset, AVideoDatasetReadsVideoFilesFramesFoldersAndImagesOfOneFrame) {
  const fs::path dir = testing::fresh_dir("video_dataset");
  SynthOptions s;
  s.count = 2, s.frames = 9, s.sizes = {{64, 48}}, s.video_format = "mp4", s.fps = 16;
  const auto files = write_synthetic_dataset(dir / "set", s);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].extension(), ".mp4");
  s.video_format = "", s.count = 1, s.seed = 2;
  write_synthetic_dataset(dir / "set" / "more", s);  // a folder of frames: more/synth_0000/
  write_png(dir / "set" / "still.png", torch::zeros({48, 64, 3}, torch::kUInt8));
  std::ofstream(dir / "set" / "broken.webm") << "no";
  config::DatasetConfig d;
  d.folder_path = (dir / "set").string();
  d.resolution = {64};
  d.num_frames = 5;
  const ScanResult scan = scan_dataset(d, 0);
  ASSERT_EQ(scan.items.size(), 4u);  // two files, one folder, one image; broken.webm skipped
  EXPECT_EQ(scan.skipped_images, 1);
  int videos = 0, folders = 0, images = 0;
  for (const ImageItem& item : scan.items) {
    if (item.video) {
      ++videos;
      EXPECT_EQ(item.clip_length(), 9);
      EXPECT_EQ(item.width, 64);
      EXPECT_NE(item.caption.find("moving right"), std::string::npos);
    }
    folders += !item.frames.empty();
    images += !item.is_clip();
  }
  EXPECT_EQ(videos, 2);
  EXPECT_EQ(folders, 1);
  EXPECT_EQ(images, 1);
  const auto histogram = bucket_histogram(scan.items, d, BucketRules{16, 4});
  EXPECT_EQ(histogram.at(64).size(), 2u);  // 64x48x5f (three clips) and 64x48 (the image, one frame)
  std::map<std::string, int> batches;
  for (const Batch& b : plan_epoch(scan.items, {d}, 1, BucketRules{16, 4}, 7)) {
    ++batches[b.bucket.key()];
    for (const PlannedSample& p : b.samples)
      EXPECT_EQ(p.frames.size(), scan.items[static_cast<size_t>(p.item)].is_clip() ? 5u : 0u);
  }
  EXPECT_EQ(batches, (std::map<std::string, int>{{"64x48", 1}, {"64x48x5f", 3}}));
  // Only clips: a folder of images alone is not a video dataset.
  d.folder_path = (dir / "set" / "more" / "synth_0000").string();
  EXPECT_THROW(scan_dataset(d, 0), DataError);
  fs::remove_all(dir);
}

// shrink_video_to_frames: false takes every round(clip fps / dataset fps)-th frame from a random start
// (dataloader_mixins.py:567-585), evenly spread when the clip is too short.
TEST(Dataset, FpsModeTakesFramesAtTheDatasetsRateFromARandomStart) {
  ImageItem clip;
  clip.video = VideoInfo{64, 64, 61, 30.0};
  config::DatasetConfig d;
  d.num_frames = 9, d.fps = 15, d.shrink_video_to_frames = false;
  std::mt19937_64 rng(3);
  std::set<int> starts;
  for (int k = 0; k < 2000; ++k) {
    const std::vector<int> f = sample_frame_indices(clip, d, 4, rng);
    ASSERT_EQ(f.size(), 9u);
    for (size_t i = 1; i < f.size(); ++i) ASSERT_EQ(f[i] - f[i - 1], 2);
    starts.insert(f.front());
  }
  // Every start of randint(0, 60 - 8 * 2) drawn, both ends included, none past them.
  EXPECT_EQ(starts.size(), 45u);
  EXPECT_EQ(*starts.begin(), 0);
  EXPECT_EQ(*starts.rbegin(), 44);
  // int(round(25 / 10)): Python rounds 2.5 to 2 (halves to even); 3.5 to 4.
  clip.video->fps = 25.0, d.fps = 10;
  const std::vector<int> half = sample_frame_indices(clip, d, 4, rng);
  EXPECT_EQ(half[1] - half[0], 2);
  clip.video->fps = 35.0;
  const std::vector<int> three_and_a_half = sample_frame_indices(clip, d, 4, rng);
  EXPECT_EQ(three_and_a_half[1] - three_and_a_half[0], 4);
  clip.video->fps = 30.0, d.fps = 15;
  d.fps = 3;  // interval 10: 61 / 10 = 6 frames at that rate < 9: spread evenly instead
  EXPECT_EQ(sample_frame_indices(clip, d, 4, rng), clip_frame_indices(61, 9));
  d.shrink_video_to_frames = true, d.fps = 15;  // the default: spread evenly, nothing drawn
  EXPECT_EQ(sample_frame_indices(clip, d, 4, rng), clip_frame_indices(61, 9));
  ImageItem folder;  // a folder of frames is at the dataset's fps: consecutive frames
  folder.frames.assign(20, "f.png");
  d.shrink_video_to_frames = false;
  const std::vector<int> f = sample_frame_indices(folder, d, 4, rng);
  for (size_t i = 1; i < f.size(); ++i) EXPECT_EQ(f[i] - f[i - 1], 1);
}

// auto_frame_count (AI Toolkit's get_auto_frame_count, toolkit/dataloader_mixins.py:484-509, and its frame
// pick, :555-562): each clip at its own length at the dataset's fps, snapped to 4k + 1 (Wan's temporal factor
// 4) — the tail trimmed by default — its frames from the start at real time; buckets keyed on each clip's
// frames. The expected values are AI Toolkit's formulas evaluated in Python (int() truncation, round() halves
// to even).
TEST(Dataset, AutoFrameCountTrainsEachClipAtItsOwnLengthAsAiToolkitSnapsIt) {
  config::DatasetConfig d;
  d.auto_frame_count = true, d.fps = 24;
  auto clip = [](int frames, double fps) {
    ImageItem c;
    c.width = c.height = 64;
    c.video = VideoInfo{64, 64, frames, fps};
    return c;
  };
  // int(61 / 30 * 24) = 48: trimmed max(0, 47) // 4 * 4 + 1 = 45; untrimmed 48 // 4 * 4 + 1 = 49.
  EXPECT_EQ(item_frames(clip(61, 30.0), d, 4), 45);
  EXPECT_EQ(item_frames(clip(100, 29.97), d, 4), 77);  // int(80.08) = 80 -> 77
  EXPECT_EQ(item_frames(clip(3, 24.0), d, 4), 1);      // 3 -> max(0, 2) // 4 * 4 + 1
  config::DatasetConfig at16 = d;
  at16.fps = 16;
  EXPECT_EQ(item_frames(clip(81, 16.0), at16, 4), 81);  // int(81.0) = 81 -> 80 // 4 * 4 + 1
  ImageItem image;
  image.width = image.height = 64;
  EXPECT_EQ(item_frames(image, d, 4), 1);
  // Trimmed: min(round(i * 30 / 24), 60) for i < 45 — 2.5 rounds to 2, 7.5 to 8.
  std::mt19937_64 rng(1);
  const std::vector<int> trimmed = sample_frame_indices(clip(61, 30.0), d, 4, rng);
  ASSERT_EQ(trimmed.size(), 45u);
  EXPECT_EQ(std::vector<int>(trimmed.begin(), trimmed.begin() + 12),
            (std::vector<int>{0, 1, 2, 4, 5, 6, 8, 9, 10, 11, 12, 14}));
  EXPECT_EQ(trimmed.back(), 55);  // 44 * 1.25: the last 5 frames of 61 trimmed
  d.fps = 16;                     // 49 frames at 24 fps taken at 16: int(32.67) = 32 -> 29, every 1.5th
  const std::vector<int> slower = sample_frame_indices(clip(49, 24.0), d, 4, rng);
  ASSERT_EQ(slower.size(), 29u);
  EXPECT_EQ(std::vector<int>(slower.begin(), slower.begin() + 6), (std::vector<int>{0, 2, 3, 4, 6, 8}));
  // Untrimmed: 49 frames, shrink_video_to_frames (the default) spreading them over the whole clip.
  d.fps = 24, d.trim_auto_frame_count_tail = false;
  EXPECT_EQ(item_frames(clip(61, 30.0), d, 4), 49);
  EXPECT_EQ(sample_frame_indices(clip(61, 30.0), d, 4, rng), clip_frame_indices(61, 49));
  EXPECT_EQ(item_frames(clip(100, 29.97), d, 4), 81);
  // Buckets keyed on each clip's frames; the image one frame, never batched with them; a temporal factor of 8
  // snaps otherwise (int(61 / 30 * 24) = 48 -> 48 // 8 * 8 + 1 = 49, trimmed 47 // 8 * 8 + 1 = 41).
  d.trim_auto_frame_count_tail = true;
  d.resolution = {64};
  const std::vector<ImageItem> items = {clip(61, 30.0), clip(100, 29.97), clip(60, 30.0), image};
  std::map<std::string, int> buckets;
  for (const Batch& b : plan_epoch(items, {d}, 1, BucketRules{16, 4}, 7)) {
    ++buckets[b.bucket.key()];
    for (const PlannedSample& p : b.samples)
      EXPECT_EQ(static_cast<int>(p.frames.size()),
                items[static_cast<size_t>(p.item)].is_clip() ? p.placement.bucket.frames : 0);
  }
  EXPECT_EQ(buckets, (std::map<std::string, int>{{"64x64", 1}, {"64x64x45f", 2}, {"64x64x77f", 1}}));
  EXPECT_EQ(item_frames(clip(61, 30.0), d, 8), 41);
}

}  // namespace
}  // namespace gclab::data

namespace gclab::data {
namespace {

// Without libgclab_video.so (ctest data.video_module_missing points GCLAB_VIDEO_LIBRARY at nothing): video
// files are a clear error that says what is missing, and images are untouched.
TEST(VideoModule, AMissingModuleIsAClearErrorAndImagesStillRead) {
  const char* env = std::getenv("GCLAB_VIDEO_LIBRARY");
  if (!env || std::filesystem::exists(env)) GTEST_SKIP() << "run by ctest data.video_module_missing";
  const fs::path dir = testing::fresh_dir("video_module_missing");
  std::string why;
  EXPECT_FALSE(probe_video(dir / "a.mp4", &why));
  EXPECT_NE(why.find("libgclab_video.so"), std::string::npos) << why;
  try {
    write_video(dir / "a.mp4", numbered_frames(2, 16, 16), 8);
    ADD_FAILURE() << "wrote a video without the module";
  } catch (const VideoError& e) {
    EXPECT_NE(std::string(e.what()).find("scripts/setup.sh"), std::string::npos) << e.what();
  }
  write_png(dir / "a.png", torch::zeros({8, 8, 3}, torch::kUInt8));
  EXPECT_EQ(decode_image_rgb(dir / "a.png").sizes(), (std::vector<int64_t>{8, 8, 3}));
  // A video dataset with video files is refused whole, not trained without its clips.
  std::ofstream(dir / "clip.mp4") << "a clip";
  config::DatasetConfig d;
  d.folder_path = dir.string();
  d.num_frames = 5;
  try {
    scan_dataset(d, 0);
    ADD_FAILURE() << "scanned video files without the module";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("clip.mp4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("libgclab_video.so"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::data
