#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gclab/data/latent_codec.h"
#include "gclab/data/text_encoder.h"

namespace gclab::data {
namespace {

TEST(LatentCodec, DecodeThenEncodeIsTheIdentityAndEncodeKeepsColourAndLayout) {
  for (int64_t channels : {16, 4}) {
    const LatentCodec codec(channels);
    const torch::Tensor z = torch::randn({2, channels, 4, 6});
    EXPECT_TRUE(torch::allclose(codec.encode(codec.decode(z)), z, 1e-4, 1e-5)) << channels;
    // An image constant per 8x8 patch survives the round trip exactly (only the DC terms are used).
    const torch::Tensor blocks = torch::rand({1, 3, 4, 6}) * 2 - 1;
    const torch::Tensor image = blocks.repeat_interleave(8, 2).repeat_interleave(8, 3);
    EXPECT_TRUE(torch::allclose(codec.decode(codec.encode(image)), image, 1e-4, 1e-5)) << channels;
    EXPECT_EQ(codec.encode(image).sizes(), (std::vector<int64_t>{1, channels, 4, 6}));
  }
}

TEST(TextEncoder, SameCaptionSameEmbeddingDifferentCaptionsDifferAndTheTrainingRngIsUntouched) {
  torch::manual_seed(5);
  const torch::Tensor before = torch::rand({4});
  torch::manual_seed(5);
  TextEncoder enc({64, 32});
  const auto a = enc.encode({"a red circle", "a blue square", "a red circle"}, 16);
  EXPECT_TRUE(torch::equal(torch::rand({4}), before));  // building and encoding drew nothing from it
  EXPECT_EQ(a.text.sizes(), (std::vector<int64_t>{3, 16, 64}));
  EXPECT_EQ(a.pooled.sizes(), (std::vector<int64_t>{3, 32}));
  EXPECT_TRUE(torch::equal(a.text[0], a.text[2]));
  EXPECT_FALSE(torch::allclose(a.text[0], a.text[1]));
  EXPECT_EQ(a.text[0][10].abs().sum().item<float>(), 0.0f);  // padding
  EXPECT_EQ(enc.tokenize("A Red, circle!"), enc.tokenize("a red circle"));
}

}  // namespace
}  // namespace gclab::data
