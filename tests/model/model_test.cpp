#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "../support/test_util.h"
#include "gclab/config/user_error.h"
#include "gclab/io/safetensors.h"
#include "gclab/model/lora.h"
#include "gclab/model/quantize.h"
#include "gclab/model/registry.h"
#include "gclab/model/transformer.h"

namespace gclab::model {
namespace {

int64_t meta_params(const std::string& preset) {
  return parameter_count(*build_transformer(spec_by_preset(preset), torch::TensorOptions().device(torch::kMeta)));
}

// Parameter counts of the full-size presets, built on the meta device (no memory). Exact figures are the
// published / computed ones in docs/models.md; DiT-XL/2's paper figure is "675M".
TEST(Presets, FullSizeParameterCountsMatchThePublishedFigures) {
  EXPECT_EQ(meta_params("flux-dev"), 11901408320);
  EXPECT_EQ(meta_params("flex1"), 8163264064);
  EXPECT_EQ(meta_params("flex2"), 8163264064 + (196 - 64) * 3072);  // a 196-feature x_embedder
  EXPECT_EQ(meta_params("qwen-image"), 20430401088);
  EXPECT_EQ(meta_params("zimage"), 6154908736);
  EXPECT_EQ(meta_params("flux-schnell"), 11901408320 - 10229760);  // no guidance embedder
  EXPECT_EQ(meta_params("flux-kontext"), 11901408320);             // FLUX.1-dev's transformer
  // diffusers' ChromaTransformer2DModel at its defaults on the meta device (its approximator 278,285,312).
  EXPECT_EQ(meta_params("chroma"), 8899983424);
  // diffusers' Flux2Transformer2DModel with Klein4BParams' / Klein9BParams' numbers (num_layers 5 / 8,
  // num_single_layers 20 / 24, 24 / 32 heads, joint_attention_dim 7680 / 12288, no guidance embedder).
  EXPECT_EQ(meta_params("flux2-klein-4b"), 3875544576);
  EXPECT_EQ(meta_params("flux2-klein-9b"), 9078581248);
  // FLUX.2-dev: Flux2Transformer2DModel at its defaults (Flux2Params: 8 + 48 blocks of 6144, the guidance
  // embedder).
  EXPECT_EQ(meta_params("flux2-dev"), 32223281152);
  const int64_t dit = meta_params("dit-xl2");
  EXPECT_NEAR(static_cast<double>(dit), 675e6, 0.5e6) << dit;
  const int64_t sd35 = meta_params("sd35-large");  // "8.1B" (stabilityai/stable-diffusion-3.5-large)
  EXPECT_NEAR(static_cast<double>(sd35), 8.1e9, 0.05e9) << sd35;
}

// The Wan transformers against diffusers' WanTransformer3DModel built on the meta device with the configs
// scripts/convert_wan_to_diffusers.py writes (diffusers 0.42.1, accelerate's init_empty_weights): Wan 2.1
// T2V 1.3B and 14B as presets; Wan 2.1 I2V 14B (36 input channels, CLIP's 1280-wide tokens through their
// own keys and values), Wan 2.2 I2V A14B (36 channels, no CLIP) and Wan 2.2 TI2V 5B (48 channels) read from
// their config.json keys onto the 14B preset.
TEST(Presets, WanParameterCountsAreDiffusers) {
  EXPECT_EQ(meta_params("wan21-1.3b"), 1418996800);
  EXPECT_EQ(meta_params("wan21-14b"), 14288491584);
  auto from_config = [](const nlohmann::json& c) {
    ModelSpec s = spec_by_preset("wan21-14b");
    family_of(s.family).read_diffusers_config(s, c);
    return parameter_count(*build_transformer(s, torch::TensorOptions().device(torch::kMeta)));
  };
  EXPECT_EQ(from_config(nlohmann::json{{"in_channels", 36}, {"image_dim", 1280}, {"added_kv_proj_dim", 5120}}),
            16394878784);
  EXPECT_EQ(meta_params("wan21-i2v-14b"), 16394878784);  // the wan21_i2v arch's preset: the same model
  EXPECT_EQ(meta_params("wan22-5b"), 4999787712);        // the wan22_5b arch's preset: TI2V 5B
  // Wan 2.2 A14B: two experts of Wan 2.1 14B's shape (T2V: in 16; I2V: in 36, no image tokens), 2 x diffusers'
  // WanTransformer3DModel count of each config.
  EXPECT_EQ(meta_params("wan22-14b"), 2 * 14288491584);
  EXPECT_EQ(meta_params("wan22-14b-i2v"), 2 * 14288901184);
  EXPECT_EQ(from_config(nlohmann::json{{"in_channels", 36}}), 14288901184);
  EXPECT_EQ(from_config(nlohmann::json{{"num_attention_heads", 24},
                                       {"ffn_dim", 14336},
                                       {"num_layers", 30},
                                       {"in_channels", 48},
                                       {"out_channels", 48}}),
            4999787712);
}

// AI Toolkit's Wan21.get_train_scheduler (wan21.py:79-84): static shift 3, no dynamic shifting; WanPipeline
// sets its preview timesteps from the scheduler.
TEST(Presets, WanFlowScheduleIsAiToolkits) {
  const FlowSchedule s = family_of(spec_by_preset("wan21-14b").family).flow_schedule();
  EXPECT_DOUBLE_EQ(s.shift, 3.0);
  EXPECT_FALSE(s.dynamic);
  EXPECT_TRUE(s.preview_from_scheduler);
}

TEST(Presets, ParameterNamesFollowTheReferenceStateDicts) {
  const auto names = [](const std::string& preset) {
    std::set<std::string> out;
    auto m = build_transformer(spec_by_preset(preset), torch::TensorOptions().device(torch::kMeta));
    for (const auto& p : m->named_parameters()) out.insert(p.key());
    return out;
  };
  const auto flux = names("flux-dev");
  for (const char* n :
       {"x_embedder.weight", "time_text_embed.guidance_embedder.linear_2.bias",
        "transformer_blocks.18.norm1_context.linear.weight", "transformer_blocks.0.attn.to_out.0.weight",
        "transformer_blocks.0.attn.norm_added_k.weight", "transformer_blocks.0.ff.net.0.proj.weight",
        "transformer_blocks.0.ff_context.net.2.bias", "single_transformer_blocks.37.proj_out.weight",
        "single_transformer_blocks.0.attn.norm_q.weight", "norm_out.linear.weight", "proj_out.bias"})
    EXPECT_TRUE(flux.count(n)) << n;
  const auto qwen = names("qwen-image");
  for (const char* n : {"img_in.weight", "txt_norm.weight", "transformer_blocks.59.img_mod.1.weight",
                        "transformer_blocks.0.txt_mlp.net.2.weight", "transformer_blocks.0.attn.to_add_out.bias"})
    EXPECT_TRUE(qwen.count(n)) << n;
  const auto zimage = names("zimage");
  for (const char* n : {"all_x_embedder.2-1.weight", "all_final_layer.2-1.adaLN_modulation.1.weight",
                        "t_embedder.mlp.2.weight", "cap_embedder.0.weight", "x_pad_token",
                        "noise_refiner.1.adaLN_modulation.0.weight", "context_refiner.0.feed_forward.w3.weight",
                        "layers.29.attention.to_out.0.weight", "layers.0.attention.norm_k.weight"})
    EXPECT_TRUE(zimage.count(n)) << n;
  EXPECT_FALSE(zimage.count("context_refiner.0.adaLN_modulation.0.weight"));
  const auto sd3 = names("sd35-large");
  EXPECT_TRUE(sd3.count("pos_embed.proj.weight"));
  EXPECT_TRUE(sd3.count("transformer_blocks.36.attn.to_add_out.weight"));
  EXPECT_FALSE(sd3.count("transformer_blocks.37.attn.to_add_out.weight"));  // the last block is context-pre-only
  const auto dit = names("dit-xl2");
  for (const char* n : {"x_embedder.proj.weight", "y_embedder.embedding_table", "blocks.27.attn.qkv.weight",
                        "blocks.0.adaLN_modulation.1.weight", "final_layer.adaLN_modulation.1.bias"})
    EXPECT_TRUE(dit.count(n)) << n;
}

class TinyPreset : public ::testing::TestWithParam<std::string> {};

// Every tiny preset runs forward and backward at 256x256 on the CPU, every block is called through the
// one call site, in order, and gradients reach the first block's parameters.
TEST_P(TinyPreset, ForwardBackwardThroughEveryBlock) {
  torch::manual_seed(0);
  const ModelSpec spec = spec_by_preset(GetParam());
  auto model = build_transformer(spec);
  const ModelInputs in = model->example_inputs({2, 1, 256, 256});
  std::vector<size_t> called;
  model->set_block_caller([&](size_t i, const Tensors& inputs) {
    called.push_back(i);
    return model->blocks()[i]->forward(inputs);
  });
  const torch::Tensor out = model->forward(in);
  std::vector<int64_t> expected = in.latents.sizes().vec();  // the latents' shape, out_channels wide
  expected[1] = spec.out_channels;
  EXPECT_EQ(out.sizes(), expected);
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
  ASSERT_EQ(called.size(), model->blocks().size());
  for (size_t i = 0; i < called.size(); ++i) EXPECT_EQ(called[i], i);
  out.pow(2).mean().backward();
  // Every parameter of the first block matters to the output. (In the last block of a two-stream model
  // the text stream's MLP does not: its output is dropped, as in the reference.)
  for (const auto& p : model->blocks()[0]->named_parameters())
    EXPECT_TRUE(p.value().grad().defined()) << model->block_names()[0] << "." << p.key();
}

INSTANTIATE_TEST_SUITE_P(All, TinyPreset,
                         ::testing::Values("tiny-flux", "tiny-qwen-image", "tiny-zimage", "tiny-sd3", "tiny-dit",
                                           "tiny-wan21", "tiny-flux-kontext", "tiny-chroma", "tiny-flux2-klein"),
                         [](const auto& info) { return gclab::testing::test_name(info.param); });

TEST(Tokens, ImageTextAndReferenceTokensPerFamily) {
  EXPECT_EQ(image_tokens(spec_by_preset("flux-dev"), {1, 1, 1024, 1024}), 4096);
  EXPECT_EQ(image_tokens(spec_by_preset("zimage"), {1, 1, 1248, 832}), 78 * 52);
  EXPECT_EQ(text_tokens(spec_by_preset("flux-dev"), 20), 512);
  EXPECT_EQ(text_tokens(spec_by_preset("flux-schnell"), 20), 256);
  EXPECT_EQ(text_tokens(spec_by_preset("qwen-image"), 77), 77);
  EXPECT_EQ(text_tokens(spec_by_preset("qwen-image"), 5000), 1024);
  EXPECT_EQ(text_tokens(spec_by_preset("zimage"), 33), 64);
  EXPECT_EQ(text_tokens(spec_by_preset("sd35-large"), 5), 333);
  EXPECT_EQ(text_tokens(spec_by_preset("dit-xl2"), 5), 0);
  // The Plus models train two 1024² references; Qwen-Image-Edit two of the image's size (512²: 1024 each);
  // every Qwen edit preview's reference is 1024²; FLUX.1 Kontext's the preview's own size, as it trains them.
  EXPECT_EQ(reference_tokens(spec_by_preset("qwen-image-edit-2509"), 2, 512, 512), 8192);
  EXPECT_EQ(reference_tokens(spec_by_preset("qwen-image-edit"), 2, 512, 512), 2048);
  EXPECT_EQ(preview_reference_tokens(spec_by_preset("qwen-image-edit"), 1, 512, 512), 4096);
  EXPECT_EQ(preview_reference_tokens(spec_by_preset("flux-kontext"), 1, 512, 768), 1536);
  EXPECT_EQ(reference_tokens(spec_by_preset("flux-kontext"), 1, 512, 512), 1024);
  EXPECT_EQ(reference_tokens(spec_by_preset("qwen-image"), 2, 512, 512), 0);
}

TEST(Presets, ConfigSelectsThePresetAndRefusesUnmodelledArchs) {
  config::ModelConfig m;
  m.arch = "flux";
  m.name_or_path = "black-forest-labs/FLUX.1-schnell";
  EXPECT_EQ(spec_for(m).preset, "flux-schnell");
  m.name_or_path = "black-forest-labs/FLUX.1-dev";
  EXPECT_EQ(spec_for(m).preset, "flux-dev");
  m.arch = "zimage";
  m.name_or_path = "Tongyi-MAI/Z-Image-Turbo";
  EXPECT_EQ(spec_for(m).preset, "zimage-turbo");
  m.arch = "tiny-qwen-image";
  EXPECT_EQ(spec_for(m).family, model::Family("qwen_image"));
  // AI Toolkit's Wan21 class: the 1.3B by its name (the UI's `wan21:1b` tag is dropped, as AI Toolkit drops
  // it), else the 14B.
  m.arch = "wan21";
  m.name_or_path = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers";
  EXPECT_EQ(spec_for(m).preset, "wan21-1.3b");
  m.name_or_path = "Wan-AI/Wan2.1-T2V-14B-Diffusers";
  EXPECT_EQ(spec_for(m).preset, "wan21-14b");
  m.arch = "wan22_14b";  // Wan 2.2 A14B: two experts of the 14B's shape
  EXPECT_EQ(spec_for(m).preset, "wan22-14b");
  m.arch = "flux2";  // FLUX.2-dev
  m.name_or_path = "black-forest-labs/FLUX.2-dev";
  EXPECT_EQ(spec_for(m).preset, "flux2-dev");
  m.arch = "hidream";  // an AI Toolkit arch gclab does not model
  EXPECT_THROW(spec_for(m), std::invalid_argument);
}

}  // namespace
}  // namespace gclab::model

namespace gclab::model {
namespace {

// model.name_or_path as one diffusers-named .safetensors file: the shape comes from its tensors (blocks
// counted, widths read), the weights load unchanged, and a file in the original BFL layout is refused
// with what to do.
TEST(LocalWeights, ASingleSafetensorsFileGivesItsShapeAndWeights) {
  ModelSpec custom = spec_by_preset("tiny-zimage");
  custom.hidden = 256, custom.heads = 2, custom.head_dim = 128, custom.mlp_hidden = 682;
  custom.single_blocks = 3, custom.rope_axes = {32, 48, 48}, custom.adaln_dim = 256;  // min(width, 256)
  torch::manual_seed(1);
  auto model = build_transformer(custom);
  const auto dir = std::filesystem::temp_directory_path() / ("gclab_single_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "zimage_custom.safetensors";
  io::save_safetensors(file, weights_state(*model, torch::kFloat));

  config::ModelConfig c;
  c.arch = "zimage";
  c.name_or_path = file.string();
  const ModelSpec s = spec_for(c);
  EXPECT_EQ(s.hidden, 256);
  EXPECT_EQ(s.heads, 2);
  EXPECT_EQ(s.single_blocks, 3);
  EXPECT_EQ(s.refiner_blocks, custom.refiner_blocks);
  EXPECT_EQ(s.mlp_hidden, 682);
  EXPECT_NE(s.preset.find("shape from"), std::string::npos);
  auto loaded = build_transformer(s);
  EXPECT_TRUE(load_weights(*loaded, local_model(c)->weights).empty());
  const ModelInputs in = model->example_inputs({1, 1, 64, 64}, 20);
  EXPECT_TRUE(torch::equal(loaded->forward(in), model->forward(in)));

  io::save_safetensors(dir / "bfl.safetensors", {{"double_blocks.0.img_attn.qkv.weight", torch::zeros({3, 1})}});
  c.arch = "flux";
  c.name_or_path = (dir / "bfl.safetensors").string();
  try {
    spec_for(c);
    ADD_FAILURE() << "a BFL-layout file was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("original (BFL"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// Which text encoders AI Toolkit's loaders quantize, under which switch, as which qtype: FLUX.1 / Flex T5
// only under quantize_te (defaulting to quantize) as model.qtype; SD3 T5 only under model.quantize as
// model.qtype; Qwen-Image / Z-Image the whole encoder under quantize_te as qtype_te; Wan UMT5 whole under
// quantize_te as model.qtype.
TEST(TextEncoderStorage, AsAiToolkitsLoadersQuantizeThem) {
  using S = WeightStorage;
  using Slots = std::vector<std::optional<WeightStorage>>;
  config::ModelConfig m;
  m.quantize = true;
  m.qtype = config::QType::uint4;
  m.qtype_te = config::QType::float8;
  EXPECT_EQ(text_encoder_storage(m, spec_by_preset("flux-dev")), (Slots{std::nullopt, S::UInt4}));  // CLIP-L, T5
  m.quantize_te = false;
  EXPECT_EQ(text_encoder_storage(m, spec_by_preset("flux-dev")), (Slots{std::nullopt, std::nullopt}));
  EXPECT_EQ(text_encoder_storage(m, spec_by_preset("sd35-large")), (Slots{std::nullopt, std::nullopt, S::UInt4}));
  EXPECT_EQ(text_encoder_storage(m, spec_by_preset("qwen-image")), (Slots{std::nullopt}));
  m.quantize = false;
  m.quantize_te = true;
  EXPECT_EQ(text_encoder_storage(m, spec_by_preset("sd35-large")), (Slots{std::nullopt, std::nullopt, std::nullopt}));
  EXPECT_EQ(text_encoder_storage(m, spec_by_preset("qwen-image")), (Slots{S::Float8}));
  EXPECT_EQ(text_encoder_storage(m, spec_by_preset("zimage")), (Slots{S::Float8}));
  EXPECT_EQ(text_encoder_storage(m, spec_by_preset("wan21-14b")),
            (Slots{S::UInt4}));  // UMT5 as model.qtype (wan21.py:432-436)
  EXPECT_TRUE(text_encoder_storage(m, spec_by_preset("dit-xl2")).empty());
  EXPECT_EQ(describe_text_encoder_storage(m, spec_by_preset("zimage")), "qwen3's Linears as float8");
}

}  // namespace
}  // namespace gclab::model

namespace gclab::model {
namespace {

// Chroma's text mask counts a prompt's tokens in the model's dtype, as AI Toolkit casts the mask before
// modify_mask_to_attend_padding sums it: in bf16, 257 tokens count as 256, so the padding token after them
// stays masked and the prediction is that of a 256-token prompt (whose padding token is the 257th); in
// float32 the two prompts differ.
TEST(Chroma, APromptsLengthIsCountedInTheModelsDtype) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    torch::manual_seed(0);
    auto model = build_transformer(spec_by_preset("tiny-chroma"), torch::TensorOptions().dtype(dtype));
    model->eval();
    ModelInputs in = model->example_inputs({1, 1, 64, 64}, 300, torch::TensorOptions().dtype(dtype));
    auto predict = [&](int64_t tokens) {
      torch::NoGradGuard no_grad;
      in.text_mask = torch::zeros({1, 300}, torch::kLong);
      in.text_mask.narrow(1, 0, tokens).fill_(1);
      return model->forward(in).to(torch::kFloat);
    };
    const torch::Tensor a = predict(257), b = predict(256);
    if (dtype == torch::kBFloat16)
      EXPECT_TRUE(torch::equal(a, b));
    else
      EXPECT_FALSE(torch::allclose(a, b));
  }
}

}  // namespace
}  // namespace gclab::model
