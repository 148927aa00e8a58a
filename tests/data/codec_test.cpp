#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gclab/data/text_encoder.h"

namespace gclab::data {
namespace {

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
