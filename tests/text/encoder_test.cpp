// The text encoders at their real shapes (built on the meta device: no memory) have transformers' parameter
// counts and names; tiny ones run, honour the attention mask, and load weights by transformers' names with
// the tied / prefixed spellings. Their numerics against transformers are ctest interop.transformers_text.
#include <gtest/gtest.h>

#include <array>

#include "../support/test_util.h"
#include "gclab/io/safetensors.h"
#include "gclab/model/family.h"
#include "gclab/model/registry.h"
#include "gclab/model/spec.h"
#include "gclab/text/clip.h"
#include "gclab/text/encoder.h"
#include "gclab/text/qwen_vision.h"
#include "gclab/text/t5.h"

namespace gclab::text {
namespace {

namespace fs = std::filesystem;
using Kind = config::TextEncoderKind;

int64_t parameter_count(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

// Counted by transformers on the meta device (tests/reference/transformers_text.py prints them).
TEST(TextEncoders, FullSizeParameterCountsEqualTransformers) {
  const auto meta = torch::TensorOptions().device(torch::kMeta);
  EXPECT_EQ(parameter_count(*build_text_encoder(Kind::t5_xxl, false, {}, meta).encoder), 4762310656);
  // google/umt5-xxl's UMT5EncoderModel (transformers' UMT5Config at its sizes, on meta, its embedding shared
  // by `shared` and `encoder.embed_tokens`): T5-XXL's blocks with a 256,384-id table and a
  // relative_attention_bias (32 x 64) in each of the 24.
  EXPECT_EQ(parameter_count(*build_text_encoder(Kind::umt5_xxl, false, {}, meta).encoder), 5680910336);
  EXPECT_EQ(parameter_count(*build_text_encoder(Kind::clip_l, false, {}, meta).encoder), 123060480);
  EXPECT_EQ(parameter_count(*build_text_encoder(Kind::clip_l_projected, false, {}, meta).encoder),
            123060480 + 768 * 768);
  EXPECT_EQ(parameter_count(*build_text_encoder(Kind::clip_g_projected, false, {}, meta).encoder), 694659840);
  EXPECT_EQ(parameter_count(*build_text_encoder(Kind::qwen3, false, {}, meta).encoder), 4022468096);
  // Qwen2_5_VLForConditionalGeneration as a whole (what AI Toolkit and diffusers hold): the language model
  // 7,070,619,136, the vision tower 676,550,144 and the untied LM head 544,997,376.
  auto qwen = build_text_encoder(Kind::qwen25_vl, false, {}, meta).encoder;
  EXPECT_EQ(parameter_count(*qwen), 8292166656);
  int64_t visual = 0, head = 0;
  for (const auto& p : qwen->named_parameters()) {
    if (p.key().rfind("visual.", 0) == 0) visual += p.value().numel();
    if (p.key().rfind("lm_head.", 0) == 0) head += p.value().numel();
  }
  EXPECT_EQ(visual, 676550144);
  EXPECT_EQ(head, 544997376);
}

// Each preset's encoders give what its transformer takes, full size and tiny, as its pipeline composes them
// (FLUX T5's width = text_dim and CLIP-L's pooled = pooled_dim; SD3 the two CLIP penultimate states side by
// side fit under T5's width (the pipeline pads them to it) = text_dim, the two projections side by side =
// pooled_dim; Qwen-Image and Z-Image the language model's width = text_dim; FLUX.2 klein three of Qwen3's
// layers side by side = text_dim; DiT none).
TEST(TextEncoders, EveryPresetsEncodersFitItsTransformer) {
  const auto meta = torch::TensorOptions().device(torch::kMeta);
  for (const std::string& preset : model::preset_names()) {
    const model::ModelSpec spec = model::spec_by_preset(preset);
    int64_t widest = 0, clip_hidden = 0, pooled = 0;
    std::vector<TinyWidths> built;
    for (Kind kind : model::text_encoders(spec)) {
      auto e = build_text_encoder(kind, spec.tiny, {}, meta).encoder;
      built.push_back({e->hidden_width(), e->pooled_width()});
      if (config::t5_structured(kind)) widest = e->hidden_width();
      if (kind == Kind::clip_l_projected || kind == Kind::clip_g_projected) clip_hidden += e->hidden_width();
      pooled += e->pooled_width();
    }
    if (const auto pipeline = model::family_of(spec.family).text_pipeline(spec)) {
      EXPECT_TRUE(pipeline->composes(built, model::text_target(spec))) << preset;
    }
    if (widest > 0) {
      EXPECT_EQ(widest, spec.text_dim) << preset;
    }
    EXPECT_LE(clip_hidden, widest) << preset;
    if (spec.family == model::Family("sd3")) {
      EXPECT_EQ(clip_hidden, spec.tiny ? spec.text_dim : 2048) << preset;
    }
    EXPECT_EQ(pooled, spec.pooled_dim) << preset;
  }
}

TEST(TextEncoders, ParametersCarryTransformersNames) {
  T5Encoder t5(T5Config::tiny());
  std::set<std::string> names;
  for (const auto& p : t5->named_parameters()) names.insert(p.key());
  for (const char* n : {"shared.weight", "encoder.block.0.layer.0.SelfAttention.q.weight",
                        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                        "encoder.block.1.layer.1.DenseReluDense.wi_0.weight",
                        "encoder.block.1.layer.1.layer_norm.weight", "encoder.final_layer_norm.weight"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_FALSE(names.count("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"));
  ClipTextModel clip(ClipTextConfig::tiny(ClipTextConfig::clip_g()));
  names.clear();
  for (const auto& p : clip->named_parameters()) names.insert(p.key());
  for (const char* n : {"text_model.embeddings.token_embedding.weight", "text_model.encoder.layers.1.mlp.fc2.bias",
                        "text_model.final_layer_norm.weight", "text_projection.weight"})
    EXPECT_TRUE(names.count(n)) << n;
}

// A padded key changes nothing where the mask hides it: the unpadded prefix encodes alike either way (T5,
// bidirectional); CLIP is causal, so positions before the padding do not see it at all.
TEST(TextEncoders, TheAttentionMaskHidesPaddedKeys) {
  torch::manual_seed(0);
  torch::NoGradGuard no_grad;
  for (Kind kind : {Kind::t5_xxl, Kind::clip_l_projected, Kind::qwen3}) {
    auto e = build_text_encoder(kind, true).encoder;
    e->eval();
    const torch::Tensor ids = torch::randint(0, 1000, {1, 12});
    torch::Tensor mask = torch::ones({1, 12}, torch::kLong);
    mask.slice(1, 8).zero_();
    const torch::Tensor short_ids = ids.slice(1, 0, 8);
    const EncodedText padded = e->encode(ids, mask), alone = e->encode(short_ids);
    EXPECT_TRUE(torch::allclose(padded.hidden_states.slice(1, 0, 8), alone.hidden_states, 1e-5, 1e-5))
        << config::name_of(kind);
    const EncodedText unmasked = e->encode(ids);
    if (kind == Kind::t5_xxl) {  // without the mask, the padding is attended to
      EXPECT_FALSE(torch::allclose(unmasked.hidden_states.slice(1, 0, 8), alone.hidden_states, 1e-5, 1e-5));
    }
  }
}

// Weights saved under transformers' names load back; the tied T5 embedding is accepted as
// encoder.embed_tokens.weight, CLIP's without the text_model. prefix; a misshapen tensor is named.
TEST(TextEncoders, WeightsLoadByTransformersNames) {
  const fs::path dir = testing::fresh_dir("text_weights");
  torch::manual_seed(1);
  T5Encoder t5(T5Config::tiny());
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : t5->named_parameters())
    tensors.emplace_back(p.key() == "shared.weight" ? "encoder.embed_tokens.weight" : p.key(), p.value().detach());
  io::save_safetensors(dir / "t5.safetensors", tensors);
  torch::manual_seed(2);
  T5Encoder other(T5Config::tiny());
  EXPECT_TRUE(load_t5_weights(*other, dir / "t5.safetensors").empty());
  const torch::Tensor ids = torch::randint(0, 1000, {1, 5});
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::equal(t5->forward(ids), other->forward(ids)));
  }
  ClipTextModel clip(ClipTextConfig::tiny(ClipTextConfig::clip_l()));
  tensors.clear();
  for (const auto& p : clip->named_parameters()) tensors.emplace_back(p.key().substr(11), p.value().detach());
  tensors.emplace_back("extra.weight", torch::zeros({2}));
  fs::create_directories(dir / "clip");
  io::save_safetensors(dir / "clip" / "model.safetensors", tensors);
  ClipTextModel clip2(ClipTextConfig::tiny(ClipTextConfig::clip_l()));
  EXPECT_EQ(load_clip_text_weights(*clip2, dir / "clip"), std::vector<std::string>{"extra.weight"});
  ClipTextConfig narrower = ClipTextConfig::tiny(ClipTextConfig::clip_l());
  narrower.hidden_size = 48;
  ClipTextModel wider(narrower);
  try {
    load_clip_text_weights(*wider, dir / "clip");
    ADD_FAILURE() << "a misshapen checkpoint loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// transformers' smart_resize (image_processing_pil_qwen2_vl.py) at Qwen2.5-VL-7B-Instruct's limits
// (min_pixels 3136, max_pixels 12845056) gives these sizes; 1022 = 36.5 x 28 rounds half to even.
TEST(QwenVision, SmartResizeMatchesTheImageProcessor) {
  const std::vector<std::array<int64_t, 4>> cases = {
      {1024, 1024, 1036, 1036}, {384, 384, 392, 392},   {1022, 700, 1008, 700}, {30, 40, 56, 84},
      {5000, 4000, 4004, 3192}, {768, 1360, 756, 1372}, {10, 1900, 28, 784}};
  for (const auto& [h, w, rh, rw] : cases)
    EXPECT_EQ(qwen_vl_smart_resize(h, w, 28, kQwenVlMinPixels, kQwenVlMaxPixels), std::make_pair(rh, rw))
        << h << "x" << w;
  EXPECT_THROW(qwen_vl_smart_resize(10, 2100), std::invalid_argument);
}

// The processor's patch order: merge block by merge block, the block's patches row-major, each patch's
// pixels channel-major and repeated over the temporal patch.
TEST(QwenVision, PatchesFollowTheProcessorsOrder) {
  const QwenVisionConfig c = QwenVisionConfig::tiny(64);
  const torch::Tensor image = torch::rand({3, 56, 84});
  const QwenVisionInput in = qwen_vl_image_input(image, c);
  EXPECT_TRUE(torch::equal(in.grid_thw, torch::tensor(std::vector<int64_t>{1, 4, 6}).view({1, 3})));
  ASSERT_EQ(in.pixel_values.sizes(), (std::vector<int64_t>{24, 3 * 2 * 14 * 14}));
  EXPECT_EQ(in.tokens_per_image(2), std::vector<int64_t>{6});
  const torch::Tensor mean = torch::tensor({0.48145466, 0.4578275, 0.40821073}).view({3, 1, 1});
  const torch::Tensor std = torch::tensor({0.26862954, 0.26130258, 0.27577711}).view({3, 1, 1});
  const torch::Tensor normed = (image - mean) / std;
  auto patch = [&](int64_t row, int64_t col) {  // [3, 2, 14, 14] flattened, channel-major
    const torch::Tensor p = normed.slice(1, row * 14, row * 14 + 14).slice(2, col * 14, col * 14 + 14);
    return p.unsqueeze(1).expand({3, 2, 14, 14}).reshape(-1);
  };
  // Rows 0..3: block (0, 0) = patches (0,0) (0,1) (1,0) (1,1); row 4: block (0, 1)'s first = patch (0, 2).
  const std::vector<std::pair<int64_t, int64_t>> order = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {0, 2}, {0, 3}};
  for (size_t i = 0; i < order.size(); ++i)
    EXPECT_TRUE(
        torch::allclose(in.pixel_values[static_cast<int64_t>(i)], patch(order[i].first, order[i].second), 1e-6, 1e-6))
        << i;
  EXPECT_THROW(qwen_vl_image_input(torch::rand({4, 56, 56}), c), std::invalid_argument);
}

// Qwen2.5-VL reads an image where its tokens are: the language model is causal, so the rows before the
// image tokens do not depend on the image and the rows from them on do; a run of image tokens that does
// not match the image is refused. (Its numerics against transformers: ctest interop.transformers_text.)
TEST(QwenVision, TheImageConditionsTheRowsFromItsTokensOn) {
  torch::manual_seed(0);
  torch::NoGradGuard no_grad;
  auto e = build_text_encoder(Kind::qwen25_vl, true).encoder;
  ASSERT_TRUE(e->takes_images());
  ASSERT_NE(e->vision_config(), nullptr);
  const QwenVisionInput a = qwen_vl_image_input(torch::rand({3, 56, 56}), *e->vision_config());
  const QwenVisionInput b = qwen_vl_image_input(torch::rand({3, 56, 56}), *e->vision_config());
  const int64_t n = a.tokens_per_image(2)[0];
  const torch::Tensor ids =
      torch::cat({torch::randint(0, 990, {5}), torch::full({n}, e->image_token_id()), torch::randint(0, 990, {3})})
          .unsqueeze(0);
  const torch::Tensor ha = e->encode_with_images(ids, {}, a).hidden_states;
  const torch::Tensor hb = e->encode_with_images(ids, {}, b).hidden_states;
  ASSERT_EQ(ha.size(1), ids.size(1));
  EXPECT_TRUE(torch::equal(ha.slice(1, 0, 5), hb.slice(1, 0, 5)));
  EXPECT_FALSE(torch::allclose(ha.slice(1, 5), hb.slice(1, 5)));
  const torch::Tensor short_run = ids.slice(1, 0, ids.size(1) - 4);
  EXPECT_THROW(e->encode_with_images(short_run, {}, a), std::invalid_argument);
  auto clip = build_text_encoder(Kind::clip_l, true).encoder;
  EXPECT_FALSE(clip->takes_images());
  EXPECT_THROW(clip->encode_with_images(ids, {}, a), std::invalid_argument);
}

// The text-only Qwen-Image pipeline holds Qwen2.5-VL without its vision tower (as AI Toolkit's loader drops
// it): the same checkpoint file loads unchanged — its visual.* tensors reported unused — and the text path
// gives the whole model's hidden states exactly (the whole model against transformers: interop tests).
TEST(QwenVision, TheEncoderWithoutItsTowerLoadsTheSameFileAndGivesTheSameText) {
  const fs::path dir = testing::fresh_dir("qwen_without_tower");
  torch::manual_seed(3);
  auto whole = build_text_encoder(Kind::qwen25_vl, true).encoder;
  // The checkpoint's names (transformers 4.x layout: model.layers.*, visual.*, lm_head.*): the encoder holds
  // the language model under `model`, whose own names start with `model.`.
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  auto checkpoint_name = [](const std::string& n) { return n.rfind("model.", 0) == 0 ? n.substr(6) : n; };
  for (const auto& p : whole->named_parameters()) tensors.emplace_back(checkpoint_name(p.key()), p.value());
  for (const auto& b : whole->named_buffers()) tensors.emplace_back(checkpoint_name(b.key()), b.value());
  io::save_safetensors(dir / "model.safetensors", tensors);
  const LoadedTextEncoder with = build_text_encoder(Kind::qwen25_vl, true, dir / "model.safetensors");
  const LoadedTextEncoder without =
      build_text_encoder(Kind::qwen25_vl, true, dir / "model.safetensors", {}, true, {}, /*vision_tower=*/false);
  ASSERT_FALSE(with.random);
  ASSERT_FALSE(without.random);
  // The LM head never runs (held for its memory, its weights not read); the tower's are what the encoder
  // without it leaves unused besides.
  for (const auto& name : with.unused) EXPECT_EQ(name.rfind("lm_head.", 0), 0u) << name;
  ASSERT_GT(without.unused.size(), with.unused.size());
  for (const auto& name : without.unused)
    EXPECT_TRUE(name.rfind("visual.", 0) == 0 || name.rfind("lm_head.", 0) == 0) << name;
  EXPECT_TRUE(with.encoder->takes_images());
  EXPECT_FALSE(without.encoder->takes_images());
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = torch::randint(0, 990, {1, 12});
  EXPECT_TRUE(
      torch::equal(with.encoder->encode(ids, {}).hidden_states, without.encoder->encode(ids, {}).hidden_states));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::text
