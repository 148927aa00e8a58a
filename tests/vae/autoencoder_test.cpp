// The AutoencoderKL's shapes and names (its numerics against diffusers are tests/reference/diffusers_vae.py):
// full-size parameter counts equal diffusers' (FLUX.1's 83,819,683), parameters carry
// diffusers' names, latents are scaled as the pipelines scale them, a sampled posterior follows its generator,
// and a weights file missing a tensor is refused by name.
#include "gclab/model/registry.h"
#include "gclab/model/spec.h"
#include "gclab/vae/autoencoder_kl.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "gclab/io/safetensors.h"
#include "gclab/memory/tracker.h"
#include "gclab/vae/qwen_image_vae.h"

namespace gclab::vae {
namespace {

int64_t count(AutoencoderKLImpl& vae) {
  int64_t n = 0;
  for (const auto& p : vae.parameters()) n += p.numel();
  return n;
}

AutoencoderKLConfig tiny(int64_t latent_channels = 16, bool quant = false) {
  AutoencoderKLConfig c;
  c.block_out_channels = {32, 64};
  c.layers_per_block = 1;
  c.norm_num_groups = 8;
  c.latent_channels = latent_channels;
  c.use_quant_conv = c.use_post_quant_conv = quant;
  return c;
}

TEST(AutoencoderKL, FullSizeParameterCountsEqualDiffusers) {
  // diffusers' AutoencoderKL with each config.json (counted there on the meta device), as each family that
  // decodes with one gives it (its folder's ModelFamily::autoencoder).
  const std::pair<const char*, int64_t> expected[] = {
      {"flux-dev", 83'819'683}, {"zimage", 83'819'683}, {"sd35-large", 83'819'683}, {"dit-xl2", 83'653'863}};
  for (const auto& [preset, params] : expected) {
    const model::ModelSpec spec = model::spec_by_preset(preset);
    AutoencoderKL vae(std::get<AutoencoderKLConfig>(model::family_of(spec.family).autoencoder(spec)));
    EXPECT_EQ(count(*vae), params) << preset;
  }
}

TEST(AutoencoderKL, ParametersCarryDiffusersNames) {
  AutoencoderKL vae(tiny(4, true));
  std::set<std::string> names;
  for (const auto& p : vae->named_parameters()) names.insert(p.key());
  for (const char* n :
       {"encoder.conv_in.weight", "encoder.down_blocks.0.resnets.0.norm1.weight",
        "encoder.down_blocks.0.downsamplers.0.conv.weight", "encoder.down_blocks.1.resnets.0.conv_shortcut.weight",
        "encoder.mid_block.attentions.0.group_norm.weight", "encoder.mid_block.attentions.0.to_q.weight",
        "encoder.mid_block.attentions.0.to_out.0.bias", "encoder.mid_block.resnets.1.conv2.bias",
        "encoder.conv_norm_out.weight", "encoder.conv_out.weight", "quant_conv.weight", "post_quant_conv.bias",
        "decoder.conv_in.weight", "decoder.up_blocks.0.resnets.1.norm2.weight",
        "decoder.up_blocks.0.upsamplers.0.conv.weight", "decoder.up_blocks.1.resnets.0.conv_shortcut.weight",
        "decoder.conv_out.bias"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_FALSE(names.count("decoder.up_blocks.1.upsamplers.0.conv.weight"));  // the last block keeps its size
}

TEST(AutoencoderKL, LatentsAreScaledAsThePipelinesScaleThem) {
  torch::manual_seed(0);
  AutoencoderKLConfig c = tiny();
  AutoencoderKL vae(c);
  vae->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor images = torch::rand({2, 3, 24, 40}) * 2 - 1;
  const torch::Tensor mean = vae->moments(images).chunk(2, 1)[0];
  const torch::Tensor z = vae->encode(images, Posterior::mean);
  EXPECT_EQ(z.sizes(), (std::vector<int64_t>{2, 16, 12, 20}));
  EXPECT_TRUE(torch::allclose(z, (mean - c.shift_factor) * c.scaling_factor));
  EXPECT_TRUE(torch::allclose(vae->decode(z), vae->decode_unscaled(mean), 1e-4, 1e-4));
  // A sampled posterior: the generator decides it, and it differs from the mean.
  auto draw = [&](uint64_t seed) {
    return vae->encode(images, Posterior::sample, at::make_generator<at::CPUGeneratorImpl>(seed));
  };
  EXPECT_TRUE(torch::equal(draw(3), draw(3)));
  EXPECT_FALSE(torch::allclose(draw(3), z));
  EXPECT_EQ(vae->decode(z).sizes(), images.sizes());
}

// Tiled decoding bounds the decoder's activations by a tile's: a 128² image decoded in 32-pixel tiles peaks
// at under half the untiled decode's bytes (measured by the tracking allocator), and an image no larger
// than a tile decodes untiled, to the same bytes.
TEST(AutoencoderKL, TiledDecodingPeaksAtATilesActivations) {
  memory::CpuMemoryTracker tracker;
  torch::manual_seed(1);
  AutoencoderKL vae(tiny());
  vae->eval();
  torch::NoGradGuard no_grad;
  auto peak_of_decode = [&](const torch::Tensor& z, torch::Tensor& out) {
    const int64_t before = tracker.stats().live_bytes;
    tracker.reset_peak();
    out = vae->decode(z);
    return tracker.stats().peak_bytes - before;
  };
  const torch::Tensor z = torch::randn({1, 16, 64, 64});
  torch::Tensor whole, tiled, small_whole, small_tiled;
  const int64_t untiled_peak = peak_of_decode(z, whole);
  vae->enable_tiling(32);
  const int64_t tiled_peak = peak_of_decode(z, tiled);
  EXPECT_EQ(tiled.sizes(), whole.sizes());
  EXPECT_LT(tiled_peak * 2, untiled_peak) << tiled_peak << " vs " << untiled_peak;
  const torch::Tensor one_tile = torch::randn({1, 16, 16, 16});
  peak_of_decode(one_tile, small_tiled);
  vae->disable_tiling();
  peak_of_decode(one_tile, small_whole);
  EXPECT_TRUE(torch::equal(small_tiled, small_whole));
}

TEST(AutoencoderKL, AWeightsFileMissingATensorIsRefusedByName) {
  namespace fs = std::filesystem;
  AutoencoderKL vae(tiny());
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : vae->named_parameters())
    if (p.key() != "decoder.conv_out.bias") tensors.emplace_back(p.key(), p.value().detach() + 1);
  tensors.emplace_back("extra.weight", torch::zeros({2}));
  const fs::path dir = fs::temp_directory_path() / "gclab_vae_weights";
  fs::create_directories(dir);
  io::save_safetensors(dir / "diffusion_pytorch_model.safetensors", tensors);
  try {
    load_autoencoder_weights(*vae, dir);
    ADD_FAILURE() << "a missing tensor was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("missing decoder.conv_out.bias"), std::string::npos) << e.what();
  }
  tensors.emplace_back("decoder.conv_out.bias", torch::ones({3}));
  io::save_safetensors(dir / "diffusion_pytorch_model.safetensors", tensors);
  EXPECT_EQ(load_autoencoder_weights(*vae, dir), std::vector<std::string>{"extra.weight"});
  EXPECT_TRUE(torch::equal(vae->named_parameters()["decoder.conv_out.bias"], torch::ones({3})));
  // FLUX.2's autoencoder without its BatchNorm statistics is refused, naming them; with them it loads them.
  AutoencoderKL flux2(AutoencoderKLConfig::batch_normed().shrunk());
  tensors.clear();
  for (const auto& p : flux2->named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
  io::save_safetensors(dir / "diffusion_pytorch_model.safetensors", tensors);
  try {
    load_autoencoder_weights(*flux2, dir);
    ADD_FAILURE() << "a FLUX.2 autoencoder without its statistics was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("missing bn.running_mean"), std::string::npos) << e.what();
  }
  tensors.emplace_back("bn.running_mean", torch::full({128}, 0.5));
  tensors.emplace_back("bn.running_var", torch::full({128}, 2.0));
  io::save_safetensors(dir / "diffusion_pytorch_model.safetensors", tensors);
  load_autoencoder_weights(*flux2, dir);
  EXPECT_TRUE(torch::equal(flux2->named_buffers()["bn.running_var"], torch::full({128}, 2.0)));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::vae

namespace gclab::vae {
namespace {

// AutoencoderKLQwenImage at Qwen-Image's size: diffusers' parameter count (126,892,531, counted there on the
// meta device: tests/reference/diffusers_qwen_vae.py prints it) and names; its numerics against diffusers are
// ctest interop.diffusers_qwen_image_vae.
TEST(QwenImageVae, FullSizeParameterCountAndNamesEqualDiffusers) {
  QwenImageVae vae(QwenImageVaeConfig::preset());
  int64_t n = 0;
  std::set<std::string> names;
  for (const auto& p : vae->named_parameters()) n += p.value().numel(), names.insert(p.key());
  EXPECT_EQ(n, 126'892'531);
  for (const char* name :
       {"encoder.conv_in.weight", "encoder.down_blocks.0.norm1.gamma", "encoder.down_blocks.2.resample.1.weight",
        "encoder.down_blocks.5.time_conv.weight", "encoder.mid_block.attentions.0.to_qkv.weight",
        "encoder.mid_block.attentions.0.norm.gamma", "encoder.norm_out.gamma", "quant_conv.weight",
        "post_quant_conv.bias", "decoder.up_blocks.0.upsamplers.0.time_conv.weight",
        "decoder.up_blocks.1.resnets.0.conv_shortcut.weight", "decoder.up_blocks.2.upsamplers.0.resample.1.bias",
        "decoder.conv_out.weight"})
    EXPECT_TRUE(names.count(name)) << name;
  EXPECT_FALSE(names.count("decoder.up_blocks.2.upsamplers.0.time_conv.weight"));  // 2-D up-sampling there
  // An image is one frame: 8x smaller, 16 latent channels, and back.
  torch::NoGradGuard no_grad;
  QwenImageVaeConfig tiny;
  tiny.base_dim = 8;
  tiny.dim_mult = {1, 2, 2, 2};
  tiny.num_res_blocks = 1;
  QwenImageVae small(tiny);
  const torch::Tensor z = small->encode(torch::rand({1, 3, 32, 48}) * 2 - 1, Posterior::mean);
  EXPECT_EQ(z.sizes(), (std::vector<int64_t>{1, 16, 4, 6}));
  const torch::Tensor x = small->decode(z);
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{1, 3, 32, 48}));
  EXPECT_LE(x.abs().max().item<double>(), 1.0);  // clamped as diffusers' _decode clamps
  // A video of 1 + 4k frames has 1 + k latent frames.
  EXPECT_EQ(small->encode(torch::zeros({1, 3, 9, 16, 16}), Posterior::mean).size(2), 3);
}

}  // namespace
}  // namespace gclab::vae

namespace gclab::vae {
namespace {

// The Wan 2.2 VAE at Wan2.2-TI2V-5B's size (diffusers' AutoencoderKLWan with the config
// convert_wan_to_diffusers.py writes: 704,688,668 parameters counted there on the meta device,
// tests/reference/diffusers_wan22_vae.py prints it) and its names; 16x spatially, 48 channels.
TEST(Wan22Vae, FullSizeParameterCountAndNamesEqualDiffusers) {
  QwenImageVae vae(QwenImageVaeConfig::residual_16x(), torch::TensorOptions().device(torch::kMeta));
  int64_t n = 0;
  std::set<std::string> names;
  for (const auto& p : vae->named_parameters()) n += p.value().numel(), names.insert(p.key());
  EXPECT_EQ(n, 704'688'668);
  EXPECT_EQ(names.size(), 196u);
  for (const char* name :
       {"encoder.conv_in.weight", "encoder.down_blocks.0.resnets.1.conv2.weight",
        "encoder.down_blocks.0.downsampler.resample.1.weight", "encoder.down_blocks.1.downsampler.time_conv.bias",
        "encoder.down_blocks.3.resnets.0.norm1.gamma", "encoder.mid_block.attentions.0.to_qkv.weight",
        "decoder.up_blocks.0.upsampler.time_conv.weight", "decoder.up_blocks.2.upsampler.resample.1.bias",
        "decoder.up_blocks.3.resnets.2.conv1.weight", "decoder.conv_out.weight"})
    EXPECT_TRUE(names.count(name)) << name;
  EXPECT_FALSE(names.count("encoder.down_blocks.3.downsampler.resample.1.weight"));  // the last stage keeps size
  EXPECT_FALSE(names.count("decoder.up_blocks.2.upsampler.time_conv.weight"));       // 2-D up-sampling there
  EXPECT_EQ(vae->downsampling(), 16);
  EXPECT_EQ(vae->latent_channels(), 48);
  EXPECT_EQ(vae->image_channels(), 3);
  // An image is one frame, 16x smaller; 1 + 4k frames have 1 + k latent frames; and back.
  torch::NoGradGuard no_grad;
  QwenImageVae small(QwenImageVaeConfig::residual_16x_tiny());
  const torch::Tensor z = small->encode(torch::rand({1, 3, 32, 48}) * 2 - 1, Posterior::mean);
  EXPECT_EQ(z.sizes(), (std::vector<int64_t>{1, 48, 2, 3}));
  EXPECT_EQ(small->decode(z).sizes(), (std::vector<int64_t>{1, 3, 32, 48}));
  const torch::Tensor v = small->encode(torch::zeros({1, 3, 9, 32, 32}), Posterior::mean);
  EXPECT_EQ(v.sizes(), (std::vector<int64_t>{1, 48, 3, 2, 2}));
  EXPECT_EQ(small->decode(v).sizes(), (std::vector<int64_t>{1, 3, 9, 32, 32}));
}

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1;
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

TEST(Wan22Vae, MatchesDiffusersOnTheSameWeights) {
  const char* dir = std::getenv("GCLAB_WAN22_VAE_FIXTURE");
  if (!dir) GTEST_SKIP() << "run by ctest interop.diffusers_wan22_vae";
  const std::filesystem::path fixture(dir);
  QwenImageVae vae(QwenImageVaeConfig::from_json_file(fixture / "vae" / "config.json"));
  const auto unused = load_qwen_image_vae_weights(*vae, fixture / "vae");
  EXPECT_TRUE(unused.empty()) << unused.front();
  const auto io = io::SafetensorsFile::open(fixture / "io.safetensors");
  torch::NoGradGuard no_grad;
  for (const int frames : {1, 5, 9}) {
    SCOPED_TRACE(frames);
    const std::string f = std::to_string(frames);
    EXPECT_LT(relative(vae->encode(io.tensor("images_" + f), Posterior::mean), io.tensor("encoded_" + f)), 1e-5);
    EXPECT_LT(relative(vae->decode(io.tensor("latents_" + f)), io.tensor("decoded_" + f)), 1e-5);
  }
  vae->enable_tiling(64);  // diffusers' tile_sample_min 64, stride 48
  EXPECT_LT(relative(vae->decode(io.tensor("tiled_latents")), io.tensor("tiled_decoded")), 1e-5);
}

}  // namespace
}  // namespace gclab::vae
