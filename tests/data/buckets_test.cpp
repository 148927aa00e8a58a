#include "gclab/data/buckets.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace gclab::data {
namespace {

// Every row of AI Toolkit's own answers (../shared/golden/aitk_buckets.csv): bucket, scale-to size and
// crop offsets, exactly.
TEST(Buckets, ReproduceEveryRowOfAiToolkitsGoldenOutput) {
  std::ifstream in(std::string(GCLAB_SHARED_DIR) + "/golden/aitk_buckets.csv");
  ASSERT_TRUE(in) << "missing ../shared/golden/aitk_buckets.csv";
  std::string line;
  std::getline(in, line);  // header
  int rows = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::stringstream s(line);
    std::vector<int> v;
    for (std::string cell; std::getline(s, cell, ',');) v.push_back(std::stoi(cell));
    ASSERT_EQ(v.size(), 10u) << line;
    const BucketPlacement p = place_in_bucket(v[0], v[1], v[2], v[3]);
    EXPECT_EQ(
        (std::vector<int>{p.bucket.width, p.bucket.height, p.scale_to_width, p.scale_to_height, p.crop_x, p.crop_y}),
        (std::vector<int>(v.begin() + 4, v.end())))
        << line;
    ++rows;
  }
  EXPECT_EQ(rows, 570);
}

TEST(Buckets, RandomCropStaysInsideTheScaledImage) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200; ++i) {
    const BucketPlacement p = place_in_bucket(3000, 2000, 512, 32, &rng);
    EXPECT_GE(p.crop_x, 0);
    EXPECT_LE(p.crop_x + p.bucket.width, p.scale_to_width);
    EXPECT_GE(p.crop_y, 0);
    EXPECT_LE(p.crop_y + p.bucket.height, p.scale_to_height);
  }
}

}  // namespace
}  // namespace gclab::data

namespace gclab::data {
namespace {

// FLUX.2's raw references (flux2/src/sampling.py default_prep, flux2_model.py:365-416): kept under 1024², above
// it scaled with each side truncated, then cropped to multiples of 16; with match_target_res first resized to
// the target's area (sides rounded to 32) and capped at that area — a 4:3 control for a 768² bucket: 896 x 672
// rounded, 886 x 665 capped, 880 x 656 cropped.
TEST(RawReferences, AreCappedTruncatedAndCroppedAsThePipelinePreparesThem) {
  EXPECT_EQ(raw_reference_size({512, 512}, 1024 * 1024).cropped.key(), BucketResolution({512, 512}).key());
  EXPECT_EQ(raw_reference_size({1000, 600}, 1024 * 1024).cropped.key(), BucketResolution({992, 592}).key());
  const RawReferenceSize big = raw_reference_size({1536, 1536}, 1024 * 1024);
  EXPECT_EQ(big.resized.key(), BucketResolution({1024, 1024}).key());
  const RawReferenceSize matched = raw_reference_size({1024, 768}, 1024 * 1024, 768 * 768);
  EXPECT_EQ(matched.resized.key(), BucketResolution({886, 665}).key());
  EXPECT_EQ(matched.cropped.key(), BucketResolution({880, 656}).key());
}

}  // namespace
}  // namespace gclab::data
