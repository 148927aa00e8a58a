// The autoencoder where AI Toolkit runs it (issue 14): encoding on the fly in each step's data phase with
// the autoencoder resident; cache_latents encoding every image once before training, after which the
// autoencoder leaves the device (its bytes leave the meter) and comes back for previews only; the stand-in
// as an explicit choice; Qwen-Image on its own AutoencoderKLQwenImage; a local vae/ folder's weights used.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "../support/test_util.h"
#include "../support/tiny_run.h"
#include "gclab/data/dataset.h"
#include "gclab/io/safetensors.h"
#include "gclab/memory/cpu_isa.h"
#include "gclab/model/registry.h"
#include "gclab/train/session.h"
#include "gclab/vae/autoencoder_kl.h"
#include "gclab/vae/codec.h"

namespace gclab::train {
namespace {

namespace fs = std::filesystem;
using gclab::testing::tiny_config;

data::LoaderOptions loader_options(const Session& session) {
  data::LoaderOptions lo;
  lo.batch_size = session.config().train.batch_size;
  lo.divisibility = session.spec().divisibility;
  return lo;
}

std::vector<data::ImageItem> items_of(const config::ProcessConfig& c) {
  return data::scan_dataset(c.datasets.at(0), 0).items;
}

// AI Toolkit's Qwen-Image model decodes previews with the VAE tiled under model.low_vram (qwen_image.py:
// pipeline.vae.enable_tiling(), diffusers' default 256-pixel tile), as its Qwen-Image-Edit and Plus edit
// models; the other families do not; an explicit
// sample.vae_tiling wins. The plan is what the run, estimate and the OOM report decode with.
TEST(SessionAutoencoder, LowVramTilesQwenImagePreviewsAsAiToolkitDoes) {
  const fs::path dir = testing::fresh_dir("low_vram_tiling");
  auto tile = [&](std::vector<std::string> extra) {
    const auto config = tiny_config(dir, "t", std::move(extra));
    return codec_plan(config, model::spec_for(config.model)).tile_sample_size;
  };
  EXPECT_EQ(tile({"model.arch=tiny-qwen-image", "model.low_vram=true"}), 256);
  EXPECT_EQ(tile({"model.arch=tiny-qwen-image"}), 0);
  EXPECT_EQ(tile({"model.low_vram=true"}), 0);  // tiny-flux
  // Qwen-Image-Edit's model class tiles too (qwen_image_edit.py:118-120), and so does the Plus one (2509,
  // 2511: qwen_image_edit_plus.py:136-138), which gclab did not tile before 2026-12-03.
  EXPECT_EQ(tile({"model.arch=qwen_image_edit", "model.low_vram=true"}), 256);
  EXPECT_EQ(tile({"model.arch=qwen_image_edit_plus", "model.low_vram=true"}), 256);
  EXPECT_EQ(tile({"model.arch=tiny-qwen-image", "model.low_vram=true",
                  "sample={prompts: [a], vae_tiling: true, "
                  "vae_tile_size: 128}"}),
            128);
  fs::remove_all(dir);
}

// AI Toolkit builds buckets, crops and batches once, in epoch 0 (dataloader_mixins.py:222-225), and its
// DataLoader only reorders those batches: every later epoch has epoch 0's batches, the same members — and,
// under random_crop, the same crops (each file's pixels equal in every epoch; the images' aspects leave the
// crop a few pixels of freedom in its bucket).
TEST(Loader, LaterEpochsReorderTheFirstEpochsBatches) {
  const fs::path dir = testing::fresh_dir("epoch_batches");
  data::SynthOptions o;
  o.count = 6;
  o.sizes = {{100, 64}, {64, 100}, {90, 70}};
  data::write_synthetic_dataset(dir / "data", o);
  const auto config = tiny_config(dir, "e", {"model.vae=dct", "datasets.0.random_crop=true"});
  Session session(config);
  data::BatchLoader loader(items_of(config), config.datasets, session.codec(), loader_options(session), 0);
  const int64_t per_epoch = loader.batches_per_epoch();
  ASSERT_GE(per_epoch, 2);
  auto members = [](const data::LoadedBatch& b) {
    std::vector<std::string> m;
    for (const auto& f : b.image_files) m.push_back(f.filename().string());
    std::sort(m.begin(), m.end());
    return b.bucket.key() + ":" + [&] {
      std::string joined;
      for (const auto& x : m) joined += x + ",";
      return joined;
    }();
  };
  // Each file's latent (its crop, encoded by the deterministic stand-in) as epoch 0 gave it.
  std::map<std::string, torch::Tensor> pixels;
  auto same_crops = [&](const data::LoadedBatch& b) {
    const torch::Tensor& x = b.latents.defined() ? b.latents : b.images;
    bool same = true;
    for (size_t j = 0; j < b.image_files.size(); ++j) {
      const auto [it, fresh] = pixels.emplace(b.image_files[j].filename().string(), x[static_cast<int64_t>(j)]);
      same = same && (fresh || torch::equal(it->second, x[static_cast<int64_t>(j)]));
    }
    return same;
  };
  std::multiset<std::string> first;
  std::vector<std::string> first_order;
  for (int64_t i = 0; i < per_epoch; ++i) {
    const data::LoadedBatch b = loader.next();
    first_order.push_back(members(b)), first.insert(first_order.back());
    same_crops(b);
  }
  bool reordered = false;
  for (int epoch = 1; epoch < 6; ++epoch) {
    std::multiset<std::string> batches;
    std::vector<std::string> order;
    for (int64_t i = 0; i < per_epoch; ++i) {
      const data::LoadedBatch b = loader.next();
      order.push_back(members(b)), batches.insert(order.back());
      EXPECT_TRUE(same_crops(b)) << "epoch " << epoch << ": a crop was drawn again";
    }
    EXPECT_EQ(batches, first) << "epoch " << epoch;
    reordered = reordered || order != first_order;
  }
  EXPECT_TRUE(reordered);
  fs::remove_all(dir);
}

// Data parallelism (issue 51): two ranks of batch 2 load, between them, exactly the batches one process of batch
// 4 loads — the same bucket at each step, rank 0 the first half, rank 1 the second: the same files, the same
// latents (random crops), the same captions under caption dropout and token shuffling (seeded by the sample's
// place in the global batch) — and a rank's slices are the same samples in every epoch.
TEST(Loader, TwoRanksLoadTheHalvesOfOneProcesssGlobalBatches) {
  const fs::path dir = testing::fresh_dir("sharded_loader");
  data::SynthOptions o;
  o.count = 10;
  o.sizes = {{100, 64}, {64, 100}, {90, 70}};
  data::write_synthetic_dataset(dir / "data", o);
  const auto config =
      tiny_config(dir, "s",
                  {"model.vae=dct", "datasets.0.random_crop=true", "datasets.0.caption_dropout_rate=0.4",
                   "datasets.0.shuffle_tokens=true", "train.batch_size=2"});
  Session session(config);
  data::LoaderOptions whole = loader_options(session), half = whole;
  whole.batch_size = 4;
  half.world_size = 2;
  data::BatchLoader one(items_of(config), config.datasets, session.codec(), whole, 0);
  std::vector<std::unique_ptr<data::BatchLoader>> ranks;
  for (int r = 0; r < 2; ++r) {
    half.rank = r;
    ranks.push_back(std::make_unique<data::BatchLoader>(items_of(config), config.datasets, session.codec(), half, 0));
  }
  EXPECT_EQ(ranks[0]->batches_per_epoch(), one.batches_per_epoch());
  std::map<std::string, std::set<int>> rank_of;  // the ranks each file's samples go to
  bool dropped = false;
  for (int64_t i = 0; i < 3 * one.batches_per_epoch(); ++i) {
    const data::LoadedBatch g = one.next();
    for (int r = 0; r < 2; ++r) {
      const data::LoadedBatch b = ranks[static_cast<size_t>(r)]->next();
      ASSERT_EQ(b.bucket.key(), g.bucket.key()) << "batch " << i;
      ASSERT_EQ(b.latents.size(0), 2);
      EXPECT_TRUE(torch::equal(b.latents, g.latents.narrow(0, 2 * r, 2))) << "batch " << i << ", rank " << r;
      for (size_t j = 0; j < 2; ++j) {
        EXPECT_EQ(b.image_files[j], g.image_files[2 * static_cast<size_t>(r) + j]);
        EXPECT_EQ(b.captions[j], g.captions[2 * static_cast<size_t>(r) + j]) << "batch " << i;
        dropped = dropped || b.captions[j].empty();
        // Epoch 0 shows which ranks load each file (a bucket's short batch repeats files, so a file can be both's);
        // later epochs only reorder the batches: a file never reaches a rank that did not cache it.
        std::set<int>& ranks_of_file = rank_of[b.image_files[j].string()];
        if (i < one.batches_per_epoch())
          ranks_of_file.insert(r);
        else
          EXPECT_TRUE(ranks_of_file.count(r)) << b.image_files[j] << " reached rank " << r << " only after epoch 0";
      }
    }
  }
  EXPECT_TRUE(dropped) << "no caption was dropped: the captions' randomness was not exercised";
  fs::remove_all(dir);
}

// A dropped caption is the job's trigger word when encoded live (the training step puts it in,
// BaseSDTrainProcess.py:1076-1081), but the item's own — its dataset's — when the text embeddings are cached:
// AI Toolkit caches get_dropout_caption() of the file item (toolkit/dataloader_mixins.py:2188-2193, 2288-2301).
// train.cache_text_embeddings sets every dataset's flag (BaseSDTrainProcess.py:153-155).
TEST(Loader, ACachedDropoutCaptionCarriesTheDatasetsTriggerWord) {
  const fs::path dir = testing::fresh_dir("cached_dropout_caption");
  auto first_caption = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"model.vae=dct", "trigger_word=job", "datasets.0.trigger_word=dsw",
                               "datasets.0.caption_dropout_rate=1"});
    const auto config = tiny_config(dir, "d", extra);
    Session session(config);
    data::LoaderOptions lo = loader_options(session);
    lo.trigger_word = config.trigger_word;
    data::BatchLoader loader(items_of(config), config.datasets, session.codec(), lo, 0);
    return loader.next().captions.at(0);
  };
  EXPECT_EQ(first_caption({}), "job ");
  EXPECT_EQ(first_caption({"train.cache_text_embeddings=true"}), "dsw ");
  EXPECT_EQ(first_caption({"datasets.0.cache_text_embeddings=true"}), "dsw ");
  fs::remove_all(dir);
}

TEST(SessionAutoencoder, WithoutCachedLatentsTheStepEncodesOnTheDeviceInItsDataPhase) {
  const fs::path dir = testing::fresh_dir("vae_on_the_fly");
  const auto config = tiny_config(dir, "f");
  Session session(config);
  ASSERT_TRUE(session.codec_spec().autoencoder);
  EXPECT_EQ(session.resident().vae, session.codec_spec().weight_bytes());  // resident from the start
  EXPECT_GT(session.resident().vae, 0);
  data::BatchLoader loader(items_of(config), config.datasets, session.codec(), loader_options(session), 0);
  EXPECT_EQ(session.cache_latents(loader), 0);  // nothing cached: nothing encoded before training
  data::LoadedBatch batch = loader.next();
  EXPECT_FALSE(batch.latents.defined());  // the loader's thread does not run the autoencoder
  ASSERT_TRUE(batch.images.defined());
  EXPECT_EQ(batch.images.size(1), 3);
  const int64_t images = static_cast<int64_t>(batch.images.nbytes());
  session.phases().clear();
  const StepResult r = session.train_step(0, [&] { return batch; });
  EXPECT_TRUE(std::isfinite(r.loss));
  // The data phase held the images and the encode's peak above what was resident.
  const ResidentBytes held = session.resident();
  const int64_t predicted = images + session.codec_spec().encode_bytes({2, 1, 64, 64}, true);
  EXPECT_GE(session.phases().peaks().at(Phase::data), held.weights + held.vae + predicted - held.optimizer);
  fs::remove_all(dir);
}

// The memory model predicts the data phase and a latent cache fill by walking the Session's own code on a
// meta twin (Session::walk_inputs, walk_latent_fill): the loader's frames in host memory, copied to the device
// in the autoencoder's dtype (half of float32's in bfloat16: the estimate counted float32 frames before
// 2026-12-05) and encoded. A measured step and fill hold exactly that, in float32 and in bfloat16.
// Exact in float32, and in bf16 on the ISAs its rules were measured exact on; elsewhere (AMX, AVX-512
// without BF16) within the autoencoder's bounds measured there (memory/cpu_isa.h).
void expect_walked(int64_t measured, int64_t walked, bool bf16) {
  const memory::CpuRuleBound bound = memory::cpu_bf16_bound(memory::CpuRule::autoencoder);
  if (!bf16 || bound.exact) {
    EXPECT_EQ(walked, measured);
    return;
  }
  EXPECT_GE(static_cast<double>(walked) / static_cast<double>(measured), bound.low);
  EXPECT_LE(static_cast<double>(walked) / static_cast<double>(measured), bound.high);
}

TEST(SessionAutoencoder, TheDataPhaseAndTheLatentFillAreWhatTheirWalksHold) {
  const fs::path dir = testing::fresh_dir("vae_walked_inputs");
  for (const std::string dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(dtype);
    const auto config = tiny_config(dir, "w" + dtype, {"train.dtype=" + dtype});
    Session session(config);
    data::BatchLoader loader(items_of(config), config.datasets, session.codec(), loader_options(session), 0);
    data::LoadedBatch batch = loader.next();
    ASSERT_TRUE(batch.images.defined());
    const model::SampleShape shape{batch.images.size(0), 1, batch.bucket.height, batch.bucket.width};
    const Session::InputWalk walked = session.walk_inputs(shape);
    session.phases().clear();
    const int64_t before = session.meter().stats().live_bytes;
    session.train_step(0, [&] { return batch; });
    expect_walked(session.phases().peaks().at(Phase::data) - before, walked.data, dtype == "bf16");
    // What the data phase leaves for the text phase: the float32 latents.
    EXPECT_EQ(walked.held, 4 * c10::multiply_integers(model::latent_shape(session.spec(), shape)));
    if (dtype == "bf16") {  // the frames' copy in bfloat16: a float32 one would be 2 bytes a value more
      const int64_t frames = shape.pixel_elements();
      EXPECT_EQ(walked.data, session.codec_spec().encode_bytes(shape, true) + 2 * frames);
    }
  }
  for (const std::string dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE("cached " + dtype);
    const auto config = tiny_config(dir, "c" + dtype, {"train.dtype=" + dtype, "datasets.0.cache_latents=true"});
    Session session(config);
    const auto items = items_of(config);
    model::SampleShape largest{1, 1, 0, 0};  // the largest bucket an image is encoded at
    {
      auto uncached = config.datasets;
      uncached[0].cache_latents = false;
      data::BatchLoader buckets(items, uncached, session.codec(), loader_options(session), 0);
      for (size_t i = 0; i < items.size(); ++i) {
        const data::BucketResolution b = buckets.next().bucket;
        if (int64_t{b.width} * b.height > largest.width * largest.height) largest = {1, 1, b.height, b.width};
      }
    }
    data::BatchLoader loader(items, config.datasets, session.codec(), loader_options(session), 0);
    const int64_t walked = session.walk_latent_fill(largest);
    const int64_t stays = session.meter().stats().live_bytes - session.cache_parked_bytes(CacheFill::latents);
    ASSERT_GT(session.cache_latents(loader), 0);
    expect_walked(session.phases().peaks().at(Phase::cache) - stays, walked, dtype == "bf16");
  }
  fs::remove_all(dir);
}

TEST(SessionAutoencoder, CachedLatentsAreEncodedOnceBeforeTrainingAndTheAutoencoderLeavesTheDevice) {
  const fs::path dir = testing::fresh_dir("vae_cached");
  const auto config =
      tiny_config(dir, "c",
                  {"datasets.0.cache_latents=true", "datasets.0.flip_x=true", "sample.prompts=[\"a red circle\"]",
                   "sample.width=64", "sample.height=64", "sample.sample_steps=1"});
  Session session(config);
  EXPECT_EQ(session.resident().vae, 0);  // it left as soon as it was built: the latents will be cached
  const int64_t weights = session.codec_spec().weight_bytes();
  const auto items = items_of(config);
  data::BatchLoader loader(items, config.datasets, session.codec(), loader_options(session), 0);
  const int64_t live_before = session.meter().stats().live_bytes;
  // The transformer (but the LoRA's adapters) and the text encoders leave the device while it encodes.
  const int64_t parked = session.cache_parked_bytes(CacheFill::latents);
  EXPECT_GT(parked, session.resident().text_encoder);
  // Every image, flipped and not (flip_x), once.
  EXPECT_EQ(session.cache_latents(loader), 2 * static_cast<int64_t>(items.size()));
  EXPECT_EQ(session.resident().vae, 0);
  const int64_t peak = session.phases().peaks().at(Phase::cache);
  EXPECT_GE(peak, live_before - parked + weights);             // it was on the device to encode
  EXPECT_LT(peak, live_before + weights);                      // the transformer was not
  EXPECT_EQ(session.meter().stats().live_bytes, live_before);  // everything back; the latents in host memory
  EXPECT_EQ(session.cache_latents(loader), 0);                 // all cached already
  for (int i = 0; i < 4; ++i) {
    const data::LoadedBatch b = loader.next();
    EXPECT_TRUE(b.latents.defined()) << i;
    EXPECT_FALSE(b.images.defined()) << i;
  }
  // A preview brings it back for the decode, and it leaves again (the second preview: the first also
  // cached its prompts' embeddings).
  ASSERT_EQ(session.sample(0, dir / "samples").size(), 1u);
  session.phases().clear();
  const int64_t live = session.meter().stats().live_bytes;
  const auto files = session.sample(1, dir / "samples");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_TRUE(fs::exists(files[0]));
  EXPECT_GE(session.phases().peaks().at(Phase::sample),
            live + weights + session.codec_spec().decode_bytes({1, 1, 64, 64}, true));
  EXPECT_EQ(session.resident().vae, 0);
  EXPECT_LE(session.meter().stats().live_bytes, live);
  fs::remove_all(dir);
}

// Qwen-Image encodes its images (and an edit model its control images) with AutoencoderKLQwenImage in the
// step's data phase, and decodes its previews with it; the data phase and the preview hold at least what
// the walk predicts for the encode and the decode (vae/memory.h; exact against the allocator there).
TEST(SessionAutoencoder, QwenImageTrainsAndPreviewsWithItsOwnAutoencoder) {
  const fs::path dir = testing::fresh_dir("vae_qwen");
  const auto config = tiny_config(dir, "q",
                                  {"model.arch=tiny-qwen-image", "sample.prompts=[\"a red circle\"]", "sample.width=64",
                                   "sample.height=64", "sample.sample_steps=1"});
  Session session(config);
  ASSERT_TRUE(session.codec_spec().autoencoder);
  ASSERT_TRUE(std::holds_alternative<vae::QwenImageVaeConfig>(*session.codec_spec().autoencoder));
  EXPECT_EQ(session.resident().vae, session.codec_spec().weight_bytes());
  data::BatchLoader loader(items_of(config), config.datasets, session.codec(), loader_options(session), 0);
  data::LoadedBatch batch = loader.next();
  ASSERT_TRUE(batch.images.defined());
  const int64_t images = static_cast<int64_t>(batch.images.nbytes());
  session.phases().clear();
  const StepResult r = session.train_step(0, [&] { return batch; });
  EXPECT_TRUE(std::isfinite(r.loss));
  const ResidentBytes held = session.resident();
  EXPECT_GE(
      session.phases().peaks().at(Phase::data),
      held.weights + held.vae + images + session.codec_spec().encode_bytes({2, 1, 64, 64}, true) - held.optimizer);
  ASSERT_EQ(session.sample(0, dir / "samples").size(), 1u);  // the first also caches its prompts' embeddings
  session.phases().clear();
  const int64_t live = session.meter().stats().live_bytes;
  const auto files = session.sample(1, dir / "samples");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_TRUE(fs::exists(files[0]));
  EXPECT_GE(session.phases().peaks().at(Phase::sample), live + session.codec_spec().decode_bytes({1, 1, 64, 64}, true));
  fs::remove_all(dir);
}

TEST(SessionAutoencoder, TheStandInIsAnExplicitChoiceAndEachFamilyGetsItsAutoencoder) {
  const fs::path dir = testing::fresh_dir("vae_choice");
  auto dct = codec_plan(tiny_config(dir, "d", {"model.vae=dct"}), model::spec_by_preset("tiny-flux"));
  EXPECT_FALSE(dct.autoencoder);
  EXPECT_EQ(dct.weight_bytes(), 0);
  auto flux = codec_plan(tiny_config(dir, "f"), model::spec_by_preset("tiny-flux"));
  ASSERT_TRUE(flux.autoencoder);
  EXPECT_TRUE(std::holds_alternative<vae::AutoencoderKLConfig>(*flux.autoencoder));
  const auto qwen_config = tiny_config(dir, "q", {"model.arch=tiny-qwen-image"});
  auto qwen = codec_plan(qwen_config, model::spec_for(qwen_config.model));
  ASSERT_TRUE(qwen.autoencoder);
  EXPECT_TRUE(std::holds_alternative<vae::QwenImageVaeConfig>(*qwen.autoencoder));
  EXPECT_EQ(vae::latent_channels(*qwen.autoencoder), 16);
  EXPECT_NE(qwen.describe().find("AutoencoderKLQwenImage"), std::string::npos);
  auto tiled = codec_plan(tiny_config(dir, "t", {"sample.vae_tiling=true", "sample.vae_tile_size=128"}),
                          model::spec_by_preset("tiny-flux"));
  EXPECT_EQ(tiled.tile_sample_size, 128);
  EXPECT_EQ(tiled.dtype_bytes, 4);
  auto bf16 = codec_plan(tiny_config(dir, "b", {"train.dtype=bf16"}), model::spec_by_preset("tiny-flux"));
  EXPECT_EQ(bf16.dtype_bytes, 2);
  EXPECT_EQ(bf16.weight_bytes() * 2, tiled.weight_bytes());
  fs::remove_all(dir);
}

TEST(SessionAutoencoder, ALocalVaeFolderIsLoadedAndAMismatchIsRefused) {
  const fs::path dir = testing::fresh_dir("vae_folder");
  // A diffusers-shaped vae/ folder: config.json and weights written from a built autoencoder.
  vae::AutoencoderKLConfig c = vae::AutoencoderKLConfig{}.shrunk();  // tiny-flux's
  torch::manual_seed(3);
  vae::AutoencoderKL source(c);
  fs::create_directories(dir / "model" / "vae");
  fs::create_directories(dir / "model" / "transformer");
  std::ofstream(dir / "model" / "transformer" / "config.json")
      << R"({"_class_name": "FluxTransformer2DModel", "num_layers": 1, "num_single_layers": 1,
             "num_attention_heads": 2, "attention_head_dim": 32, "joint_attention_dim": 64,
             "pooled_projection_dim": 32, "guidance_embeds": true, "axes_dims_rope": [8, 12, 12]})";
  std::ofstream(dir / "model" / "vae" / "config.json")
      << R"({"_class_name": "AutoencoderKL", "latent_channels": 16, "block_out_channels": [16, 16, 16, 16],
            "layers_per_block": 1, "norm_num_groups": 4, "use_quant_conv": false, "use_post_quant_conv": false,
            "scaling_factor": 0.3611, "shift_factor": 0.1159, "sample_size": 256})";
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : source->named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
  io::save_safetensors(dir / "model" / "vae" / "diffusion_pytorch_model.safetensors", tensors);
  const auto config = tiny_config(dir, "l", {"model.name_or_path=" + (dir / "model").string()});
  Session session(config);
  EXPECT_EQ(session.codec_spec().weights, dir / "model" / "vae");
  // The same weights: the same decode.
  const torch::Tensor z = torch::randn({1, 16, 4, 4});
  torch::NoGradGuard no_grad;
  source->eval();
  EXPECT_TRUE(torch::allclose(session.codec().decode(z), source->decode(z).unsqueeze(2), 1e-5, 1e-6));
  // AI Toolkit's model.vae_path names the same folder for a model without one.
  {
    Session other(tiny_config(dir, "p", {"model.vae_path=" + (dir / "model" / "vae").string()}));
    EXPECT_EQ(other.codec_spec().weights, dir / "model" / "vae");
    EXPECT_TRUE(torch::allclose(other.codec().decode(z), source->decode(z).unsqueeze(2), 1e-5, 1e-6));
  }
  // An autoencoder whose latents the transformer does not take is refused by name.
  std::ofstream(dir / "model" / "vae" / "config.json") << R"({"_class_name": "AutoencoderKL", "latent_channels": 4})";
  EXPECT_THROW(Session{config}, UserError);
  fs::remove_all(dir);
}

// AI Toolkit's Flux2Model reads a local name_or_path folder in BFL's layout (flux2_model.py:138-148, 188-189):
// the arch's transformer file there and ae.safetensors beside it, taken over model.vae_path, its decoder's
// widths from its tensors (the small decoder where they are narrower); a folder with neither that file nor a
// config.json is refused by name. (Its names against diffusers' own: ctest interop.diffusers_autoencoder_kl.)
TEST(SessionAutoencoder, ABflFolderGivesTheTransformerFileAndItsAutoencoder) {
  const fs::path dir = testing::fresh_dir("bfl_folder");
  const model::ModelSpec spec = model::spec_by_preset("tiny-flux2-klein");
  torch::manual_seed(4);
  auto transformer = model::build_transformer(spec, torch::TensorOptions());
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : transformer->named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
  fs::create_directories(dir / "klein");
  io::save_safetensors(dir / "klein" / "flux-2-klein-base-4b.safetensors", tensors);
  vae::AutoencoderKLConfig small = vae::AutoencoderKLConfig::batch_normed().shrunk();
  small.decoder_block_out_channels = {8, 8, 8, 8};
  vae::AutoencoderKL source(small);
  tensors.clear();
  for (const auto& p : source->named_parameters())
    tensors.emplace_back(vae::bfl_autoencoder_name(p.key(), 4), p.value().detach());
  for (const auto& b : source->named_buffers()) tensors.emplace_back(b.key(), b.value().detach());
  io::save_safetensors(dir / "klein" / "ae.safetensors", tensors);
  // A vae_path that exists (a diffusers-named file of the same autoencoder), and a diffusers transformer/
  // beside the BFL file (a Hub snapshot): the folder's files win over both.
  tensors.clear();
  for (const auto& p : source->named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
  io::save_safetensors(dir / "elsewhere.safetensors", tensors);
  fs::create_directories(dir / "klein" / "transformer");
  std::ofstream(dir / "klein" / "transformer" / "config.json") << R"({"_class_name": "Flux2Transformer2DModel"})";
  const std::vector<std::string> klein = {"model.arch=tiny-flux2-klein",
                                          "model.name_or_path=" + (dir / "klein").string(),
                                          "model.vae_path=" + (dir / "elsewhere.safetensors").string()};
  const auto config = tiny_config(dir, "k", klein);
  const auto local = model::local_model(config.model);
  ASSERT_TRUE(local.has_value());
  EXPECT_EQ(local->weights, dir / "klein" / "flux-2-klein-base-4b.safetensors");
  // The file's spec is no preset's (full-size companions): where its autoencoder comes from is the point here.
  EXPECT_EQ(codec_plan(config, model::spec_for(config.model)).weights, dir / "klein" / "ae.safetensors");
  // Read as the tiny preset's autoencoder, the decoder's widths from the file.
  const vae::AutoencoderConfig read =
      vae::autoencoder_config(vae::AutoencoderKLConfig::batch_normed().shrunk(), dir / "klein" / "ae.safetensors");
  EXPECT_EQ(std::get<vae::AutoencoderKLConfig>(read).decoder_channels(), (std::vector<int64_t>{8, 8, 8, 8}));
  {
    const vae::LoadedAutoencoder loaded = vae::build_autoencoder(read, dir / "klein" / "ae.safetensors");
    EXPECT_FALSE(loaded.random);
    const torch::Tensor z = torch::randn({1, 128, 2, 2});
    torch::NoGradGuard no_grad;
    source->eval(), loaded.vae->eval();
    EXPECT_TRUE(torch::allclose(loaded.vae->decode(z), source->decode(z), 1e-5, 1e-6));
  }
  // Without ae.safetensors in the folder, model.vae_path is what the run reads.
  fs::remove(dir / "klein" / "ae.safetensors");
  EXPECT_EQ(codec_plan(config, model::spec_for(config.model)).weights, dir / "elsewhere.safetensors");
  fs::create_directories(dir / "empty");
  EXPECT_THROW(
      model::local_model(
          tiny_config(dir, "e", {"model.arch=tiny-flux2-klein", "model.name_or_path=" + (dir / "empty").string()})
              .model),
      UserError);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::train
