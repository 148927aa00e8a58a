// A model of several experts (experts.h): Wan 2.2 A14B's two transformers, the one that runs picked as AI
// Toolkit's DualWanTransformer3DModel picks it in training and Wan22Pipeline in sampling.
#include <gtest/gtest.h>

#include <set>

#include "gclab/model/experts.h"
#include "gclab/model/registry.h"

namespace gclab::model {
namespace {

ModelInputs at_times(const DiffusionTransformer& model, std::vector<float> t) {
  torch::manual_seed(1);
  ModelInputs in = model.example_inputs({static_cast<int64_t>(t.size()), 5, 64, 64});
  in.timestep = torch::tensor(t);
  return in;
}

TEST(Experts, AForwardRunsTheExpertTheMeanTimestepPicks) {
  torch::manual_seed(0);
  const ModelSpec spec = spec_by_preset("tiny-wan22-14b");
  ASSERT_EQ(spec.expert_boundaries, (std::vector<double>{0.875, 0.0}));
  auto model = build_transformer(spec);
  auto* experts = dynamic_cast<ExpertTransformers*>(model.get());
  ASSERT_NE(experts, nullptr);
  ASSERT_EQ(model->expert_count(), 2u);
  // The state dict as the wrapper's: transformer_1.* and transformer_2.*, each a whole WanTransformer3DModel.
  std::set<std::string> names;
  for (const auto& p : model->named_parameters()) names.insert(p.key());
  EXPECT_TRUE(names.count("transformer_1.patch_embedding.weight"));
  EXPECT_TRUE(names.count("transformer_2.blocks.1.ffn.net.2.weight"));
  EXPECT_EQ(parameter_count(*model), 2 * parameter_count(experts->expert(0)));
  // Its blocks: both experts', each expert's called through the model's one call site.
  ASSERT_EQ(model->blocks().size(), 4u);
  EXPECT_EQ(model->block_names()[2], "transformer_2.blocks.0");
  std::vector<size_t> called;
  model->set_block_caller([&](size_t i, const Tensors& inputs) {
    called.push_back(i);
    return model->blocks()[i]->forward(inputs);
  });
  torch::NoGradGuard no_grad;
  struct Case {
    std::vector<float> t;
    size_t expert;
  };
  // The batch's mean against 875 / 1000, strictly above for the high-noise expert (wan22_14b_model.py:124-128).
  for (const Case& c :
       {Case{{0.95f}, 0}, Case{{0.5f}, 1}, Case{{0.875f}, 1}, Case{{0.95f, 0.79f}, 1}, Case{{0.99f, 0.77f}, 0}}) {
    const ModelInputs in = at_times(*model, c.t);
    called.clear();
    const torch::Tensor out = model->forward(in);
    EXPECT_EQ(experts->active(), c.expert) << c.t[0];
    EXPECT_EQ(called, (std::vector<size_t>{2 * c.expert, 2 * c.expert + 1}));
    EXPECT_TRUE(torch::equal(out, experts->expert(c.expert).forward(in))) << c.t[0];  // that expert, alone
  }
  // ModelInputs::expert overrides the timestep; sampling compares with >= (Wan22Pipeline).
  ModelInputs in = at_times(*model, {0.95f});
  in.expert = 1;
  model->forward(in);
  EXPECT_EQ(experts->active(), 1u);
  EXPECT_EQ(expert_at(spec, 0.875, /*inclusive=*/true), 0u);
  EXPECT_EQ(expert_at(spec, 0.875, /*inclusive=*/false), 1u);
  EXPECT_EQ(expert_at(spec, 0.0, /*inclusive=*/true), 1u);
}

TEST(Experts, TheI2vExpertsTakeTheFirstFramesChannelsWithoutImageTokens) {
  const ModelSpec spec = spec_by_preset("tiny-wan22-14b-i2v");
  EXPECT_EQ(spec.condition_input_channels, 20);
  EXPECT_EQ(spec.image_embed_dim, 0);
  EXPECT_EQ(spec.expert_boundaries.size(), 2u);
  auto model = build_transformer(spec, torch::TensorOptions().device(torch::kMeta));
  std::set<std::string> names;
  for (const auto& p : model->named_parameters()) names.insert(p.key());
  EXPECT_FALSE(names.count("transformer_1.condition_embedder.image_embedder.norm1.weight"));
  EXPECT_EQ(model->named_parameters()["transformer_2.patch_embedding.weight"].size(1), 36);
}

// A preview's frames as each Wan model class and pipeline round sample.num_frames: the pipelines' F // 4 * 4 + 1
// where F is not 1 + 4k; the 5B's and the A14B I2V's own rounding down first, and Wan 2.1's low_vram
// pipelines, which do not round.
TEST(Experts, PreviewFramesRoundAsEachWanClassRoundsThem) {
  auto frames = [](const char* preset, int64_t f, bool low_vram = false) {
    const ModelSpec s = spec_by_preset(preset);
    config::ModelConfig m;
    m.low_vram = low_vram;
    return family_of(s.family).preview_frames(s, m, f);
  };
  for (const char* up : {"wan21-14b", "wan21-i2v-14b", "wan22-14b"}) {
    EXPECT_EQ(frames(up, 40), 41) << up;
    EXPECT_EQ(frames(up, 42), 41) << up;
    EXPECT_EQ(frames(up, 41), 41) << up;
  }
  EXPECT_EQ(frames("wan22-14b", 40, true), 41);  // Wan22Pipeline, low_vram or not
  for (const char* down : {"wan22-5b", "wan22-14b-i2v"}) {
    EXPECT_EQ(frames(down, 40), 37) << down;
    EXPECT_EQ(frames(down, 42), 41) << down;
  }
  // Wan 2.1's low_vram pipelines do not round: the latents' frames decide.
  EXPECT_EQ(frames("wan21-14b", 40, true), 37);
  EXPECT_EQ(frames("wan21-i2v-14b", 40, true), 37);
  EXPECT_EQ(frames("flux-dev", 1), 1);
}

}  // namespace
}  // namespace gclab::model
