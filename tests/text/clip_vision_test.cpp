// CLIP's vision tower (Wan 2.1 I2V's image encoder): the full-size ViT-H/14 counted on the meta device equals
// transformers' CLIPVisionModel, and a tiny one transformers saved (ctest interop.transformers_clip_vision
// writes it, with its inputs and outputs, and runs the second test on it) loads unchanged and gives the same
// hidden states to float32 rounding.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "gclab/io/safetensors.h"
#include "gclab/model/transformer.h"
#include "gclab/text/clip.h"

namespace gclab::text {
namespace {
namespace fs = std::filesystem;

TEST(ClipVision, TheFullSizeTowerIsTransformersCount) {
  ClipVisionModel vit(ClipVisionConfig::vit_h14(), torch::TensorOptions().device(torch::kMeta));
  EXPECT_EQ(model::parameter_count(*vit), 630766080);  // transformers' CLIPVisionModel on the meta device
  EXPECT_EQ(ClipVisionConfig::vit_h14().positions(), 257);
  const ClipVisionOutput out =
      vit->forward(torch::empty({2, 3, 224, 224}, torch::TensorOptions().device(torch::kMeta)));
  EXPECT_EQ(out.penultimate.sizes(), (std::vector<int64_t>{2, 257, 1280}));
  EXPECT_EQ(out.pooled.sizes(), (std::vector<int64_t>{2, 1280}));
  EXPECT_THROW(vit->forward(torch::empty({1, 3, 256, 256}, torch::TensorOptions().device(torch::kMeta))),
               std::invalid_argument);
}

// transformers' hidden_states[-2] of a one-layer tower is the embeddings' output (the input to its layer).
TEST(ClipVision, OneLayersPenultimateIsTheEmbeddingsOutputInBothTowers) {
  torch::manual_seed(2);
  ClipTextConfig tc = ClipTextConfig::tiny(ClipTextConfig::clip_l());
  tc.num_hidden_layers = 1;
  ClipTextModel text(tc);
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = torch::randint(0, tc.vocab_size, {1, 5}, torch::kLong);
  const torch::Tensor embedded =
      torch::embedding(text->named_parameters()["text_model.embeddings.token_embedding.weight"], ids) +
      text->named_parameters()["text_model.embeddings.position_embedding.weight"].slice(0, 0, 5);
  EXPECT_TRUE(torch::allclose(text->forward(ids).penultimate, embedded));
  ClipVisionConfig vc = ClipVisionConfig::tiny();
  vc.num_hidden_layers = 1;
  ClipVisionModel vision(vc);
  const ClipVisionOutput out = vision->forward(torch::randn({1, 3, 32, 32}));
  EXPECT_FALSE(torch::allclose(out.penultimate, out.last_hidden_state));
}

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

TEST(ClipVision, MatchesTransformersOnTheSameWeights) {
  const char* dir = std::getenv("GCLAB_CLIP_VISION_FIXTURE");
  if (!dir) GTEST_SKIP() << "run by ctest interop.transformers_clip_vision";
  const fs::path fixture(dir);
  const auto io = io::SafetensorsFile::open(fixture / "io.safetensors");
  for (const char* folder : {"model", "prefixed"}) {  // transformers 5's names, and the published `vision_model.`
    SCOPED_TRACE(folder);
    ClipVisionModel m(ClipVisionConfig::from_json_file(fixture / "model" / "config.json"));
    const auto unused = load_clip_vision_weights(*m, fixture / folder);
    EXPECT_TRUE(unused.empty()) << unused.front();
    torch::NoGradGuard no_grad;
    const ClipVisionOutput out = m->forward(io.tensor("pixel_values"));
    EXPECT_LT(relative(out.penultimate, io.tensor("penultimate")), 1e-5);
    EXPECT_LT(relative(out.last_hidden_state, io.tensor("last_hidden_state")), 1e-5);
    EXPECT_LT(relative(out.pooled, io.tensor("pooler_output")), 1e-5);
  }
}

}  // namespace
}  // namespace gclab::text
