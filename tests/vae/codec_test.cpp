// The DCT stand-in (model.vae: dct) and the run's choice of codec.
#include "gclab/vae/dct_codec.h"

#include <gtest/gtest.h>

namespace gclab::vae {
namespace {

TEST(DctCodec, DecodeThenEncodeIsTheIdentityAndEncodeKeepsColourAndLayout) {
  for (int64_t channels : {16, 4}) {
    DctCodec codec(channels);
    const torch::Tensor z = torch::randn({2, channels, 4, 6});
    EXPECT_TRUE(torch::allclose(codec.encode(codec.decode(z)), z, 1e-4, 1e-5)) << channels;
    // An image (one frame) constant per 8x8 patch survives the round trip exactly (only the DC terms are used).
    const torch::Tensor blocks = torch::rand({1, 3, 1, 4, 6}) * 2 - 1;
    const torch::Tensor image = blocks.repeat_interleave(8, 3).repeat_interleave(8, 4);
    EXPECT_TRUE(torch::allclose(codec.decode(codec.encode(image)), image, 1e-4, 1e-5)) << channels;
    EXPECT_EQ(codec.encode(image).sizes(), (std::vector<int64_t>{1, channels, 4, 6}));
    EXPECT_EQ(codec.decode(z).sizes(), (std::vector<int64_t>{2, 3, 1, 32, 48}));  // frames [B, 3, F, H, W]
    // The stand-in is an image codec: several frames are refused, not silently cut to one.
    EXPECT_THROW(codec.encode(torch::zeros({1, 3, 5, 32, 48})), c10::Error);
  }
}

}  // namespace
}  // namespace gclab::vae
