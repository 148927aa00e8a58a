// The family registry (model/registry.h): each family is one folder under src/model/families/, and the
// generic code asks the registry instead of testing which family it has.
#include "gclab/model/registry.h"

#include <gtest/gtest.h>
#include <stb/stb_image_write.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "../support/test_util.h"
#include "gclab/config/user_error.h"
#include "gclab/data/image.h"
#include "gclab/model/diffusers_config.h"
#include "gclab/train/plan.h"

namespace gclab::model {
namespace {

namespace fs = std::filesystem;

// No test on a family — an id spelled (`Family("flux")`, the enum's old `Family::flux`) or a family's name
// compared — outside the family folders and the registry: a new family is a folder and a registry line,
// not edits across the tree.
TEST(Registry, NoFamilyTestsOutsideTheFamilyFolders) {
  const fs::path root = GCLAB_SOURCE_DIR;
  const std::set<std::string> allowed = {"src/model/registry.cpp", "include/gclab/model/registry.h"};
  const std::regex family_test(R"(\bFamily::[a-z_]+\b|\bFamily\("|family(\(\))?\.name\(\)\s*[!=]=)");
  std::vector<std::string> offenders;
  int files = 0;
  for (const char* part : {"src", "include"})
    for (const auto& e : fs::recursive_directory_iterator(root / part)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".h" && ext != ".inc")) continue;
      const std::string rel = fs::relative(e.path(), root).generic_string();
      ++files;
      if (rel.rfind("src/model/families/", 0) == 0) continue;
      std::ifstream in(e.path());
      int line_no = 0;
      for (std::string line; std::getline(in, line);) {
        ++line_no;
        if (std::regex_search(line, family_test))
          offenders.push_back(rel + ":" + std::to_string(line_no) + ": " + line);
      }
    }
  EXPECT_GT(files, 100) << "the walk found the sources";
  std::ostringstream all;
  for (const auto& o : offenders) all << o << "\n";
  EXPECT_TRUE(offenders.empty()) << all.str();
}

// Nor an enumerator named after a family (`Something::qwen_image`, `TrueCfg`-like guidance kinds, an
// autoencoder kind, a text composition) or a family's own block outside the folders: what a family does is
// its objects' (its guidance rule, its autoencoder config, its text pipeline, its blocks).
TEST(Registry, NoFamilyNamedEnumeratorsOutsideTheFamilyFolders) {
  const fs::path root = GCLAB_SOURCE_DIR;
  const std::regex named(
      R"(\b[A-Z]\w*::(flux|flex1|flex2|qwen_image|qwen_image_edit|zimage|sd3|sd|dit|wan21|wan22|flux2)\b|)"
      R"(\b(ZImageCfg|TrueCfg|AutoencoderKind|TextComposition)\b|)"
      // A block one family alone has lives in its folder (model/blocks.h keeps what several share).
      R"(\b(FluxDoubleBlock|FluxSingleBlock|QwenImageBlock|ZImageBlock|SD3JointBlock|DiTBlock)\b|)"
      // A family's model-class flags (Qwen-Image-Edit's `edit` / `edit_plus`): generic code reads what the
      // flag means (reference_tokens, references_at_image_size), the family its own `variant`.
      R"(\.edit\b|\bedit_plus\b|\.variant\b)");
  std::vector<std::string> offenders;
  for (const char* part : {"src", "include"})
    for (const auto& e : fs::recursive_directory_iterator(root / part)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".h" && ext != ".inc")) continue;
      const std::string rel = fs::relative(e.path(), root).generic_string();
      if (rel.rfind("src/model/families/", 0) == 0) continue;
      std::ifstream in(e.path());
      int line_no = 0;
      for (std::string line; std::getline(in, line);) {
        ++line_no;
        if (std::regex_search(line, named)) offenders.push_back(rel + ":" + std::to_string(line_no) + ": " + line);
      }
    }
  std::ostringstream all;
  for (const auto& o : offenders) all << o << "\n";
  EXPECT_TRUE(offenders.empty()) << all.str();
}

// Every family registered once, every arch it answers naming one of its presets, every preset once.
TEST(Registry, EveryArchNamesAPresetOfItsOwnFamily) {
  std::set<Family> ids;
  std::set<std::string> presets;
  for (const ModelFamily* f : families()) {
    EXPECT_TRUE(ids.insert(f->id()).second) << f->id().name() << " registered twice";
    EXPECT_EQ(&family_of(f->id()), f);
    for (const ModelSpec& s : f->presets()) {
      EXPECT_EQ(s.family, f->id()) << s.preset;
      EXPECT_TRUE(presets.insert(s.preset).second) << s.preset << " defined twice";
    }
    for (const ArchFacts& a : f->archs()) {
      EXPECT_EQ(a.family, f->id()) << a.name;
      EXPECT_EQ(spec_by_preset(a.preset).family, f->id()) << a.name;
      if (!a.variant_preset.empty()) {
        EXPECT_EQ(spec_by_preset(a.variant_preset).family, f->id()) << a.name;
      }
      EXPECT_EQ(spec_by_preset(a.preset).tiny, a.tiny) << a.name;
      EXPECT_EQ(find_arch(a.name), &*std::find_if(supported_archs().begin(), supported_archs().end(),
                                                  [&](const ArchFacts& x) { return x.name == a.name; }));
    }
  }
  EXPECT_EQ(presets.size(), preset_names().size());
  // Listed to users: every family's own archs, then the tiny ones.
  bool seen_tiny = false;
  for (const ArchFacts& a : supported_archs()) {
    EXPECT_FALSE(seen_tiny && !a.tiny) << a.name << " after a tiny arch";
    seen_tiny = seen_tiny || a.tiny;
  }
}

// What a family writes as its transformer/config.json, its reader reads back as the same shape: every
// preset, through the folder a full fine-tune saves (save_format: diffusers).
TEST(Registry, EachFamilyReadsBackTheConfigJsonItWrites) {
  const fs::path dir = fs::temp_directory_path() / ("gclab_registry_" + std::to_string(::getpid()));
  for (const std::string& name : preset_names()) {
    const ModelSpec spec = spec_by_preset(name);
    fs::create_directories(dir / name / "transformer");
    std::ofstream(dir / name / "transformer" / "config.json") << diffusers_config_json(spec);
    config::ModelConfig model;  // the arch that selects the preset (a variant by its tag)
    for (const ArchFacts& a : supported_archs())
      if (a.preset == name || a.variant_preset == name)
        model.arch = a.name, model.arch_tag = a.variant_preset == name ? a.variant_keyword : "";
    if (model.arch.empty()) continue;  // a preset no arch selects
    model.name_or_path = (dir / name).string();
    const ModelSpec read = spec_for(model);
    EXPECT_EQ(read.family, spec.family) << name;
    EXPECT_EQ(read.hidden, spec.hidden) << name;
    EXPECT_EQ(read.heads, spec.heads) << name;
    EXPECT_EQ(read.head_dim, spec.head_dim) << name;
    EXPECT_EQ(read.mlp_hidden, spec.mlp_hidden) << name;
    EXPECT_EQ(read.double_blocks, spec.double_blocks) << name;
    EXPECT_EQ(read.single_blocks, spec.single_blocks) << name;
    EXPECT_EQ(read.refiner_blocks, spec.refiner_blocks) << name;
    EXPECT_EQ(read.text_dim, spec.text_dim) << name;
    EXPECT_EQ(read.pooled_dim, spec.pooled_dim) << name;
    EXPECT_EQ(read.rope_axes, spec.rope_axes) << name;
    EXPECT_EQ(read.guidance_embed, spec.guidance_embed) << name;
    EXPECT_EQ(read.extra_input_features, spec.extra_input_features) << name;
    EXPECT_EQ(read.zero_cond_t, spec.zero_cond_t) << name;
    EXPECT_EQ(read.pos_embed_max, spec.pos_embed_max) << name;
    EXPECT_EQ(read.num_classes, spec.num_classes) << name;
    EXPECT_EQ(read.adaln_dim, spec.adaln_dim) << name;
  }
  fs::remove_all(dir);
}

// Bucket sides as AI Toolkit's model classes round them (get_bucket_divisibility), previews as the
// pipeline or the model class rounds them: a 1008 resolution (16 x 63) is a Z-Image or Flex.2 bucket side
// and not a FLUX.1 / Qwen-Image / SD3 one.
TEST(Registry, DivisibilityIsEachModelClasssOwn) {
  for (const auto& [preset, bucket, preview] :
       {std::tuple{"flux-dev", 32, 16}, std::tuple{"flex1", 32, 16}, std::tuple{"flex2", 16, 16},
        std::tuple{"flux-kontext", 16, 16}, std::tuple{"qwen-image", 32, 32},
        std::tuple{"qwen-image-edit-2509", 32, 32}, std::tuple{"zimage", 16, 16}, std::tuple{"zimage-turbo", 16, 16},
        std::tuple{"sd35-large", 32, 16}, std::tuple{"dit-xl2", 16, 16}}) {
    EXPECT_EQ(spec_by_preset(preset).divisibility, bucket) << preset;
    EXPECT_EQ(spec_by_preset(preset).preview_divisibility, preview) << preset;
  }
  // A resolution is the buckets' target area (AI Toolkit's get_bucket_for_image_size): 1008 loads for every
  // arch, and a square image's bucket is the model class's — 1008² at 16, 992 x 1024 at 32.
  for (const auto& [arch, width, height] :
       {std::tuple{"zimage", 1008, 1008}, std::tuple{"flex2", 1008, 1008}, std::tuple{"flux", 992, 1024},
        std::tuple{"qwen_image", 992, 1024}, std::tuple{"sd3", 992, 1024}}) {
    const std::string yaml = std::string("name: d\ntraining_folder: /tmp\ndatasets:\n  - folder_path: /tmp\n") +
                             "    resolution: [1008]\nmodel: {arch: " + arch + "}\n";
    const auto r = load_config_text(yaml, "d.yaml");
    ASSERT_TRUE(r.ok()) << arch;
    const std::vector<train::StepCell> cells = train::step_cells(*r.config);
    ASSERT_EQ(cells.size(), 1u);
    EXPECT_EQ(cells[0].shape().width, width) << arch;
    EXPECT_EQ(cells[0].shape().height, height) << arch;
  }
}

// Flex.2's training inputs (AI Toolkit's Flex2.condition_noisy_latents, flex2.py:376-527): an inpainting
// latent, its mask and a control latent beside the latents. Without a control or random inpainting they are
// the transformer's default (zeros, a mask of ones, zeros); a control folder's latents go in unless dropped
// (control_dropout); do_random_inpainting zeroes the latents under a random blob mask and hands the model
// that mask (1 where it inpaints), unless inpaint_dropout drops it; the packed layout is the default's.
TEST(Flex2, TrainingInputsAsAiToolkitsConditionNoisyLatents) {
  ModelSpec spec = spec_by_preset("tiny-flux");
  const ModelFamily& family = family_of(spec.family);
  EXPECT_FALSE(family.controls_as_channels(spec));
  spec.extra_input_features = 2 * families_shared::packed_features(spec) + spec.patch * spec.patch;
  ASSERT_TRUE(family.controls_as_channels(spec));
  torch::manual_seed(0);
  const torch::Tensor x0 = torch::randn({2, 16, 32, 32});
  const torch::Tensor control = torch::randn({2, 16, 32, 32}), other = torch::randn({2, 16, 32, 32});
  config::ModelKwargs k;
  EXPECT_FALSE(family.training_condition(spec, k, x0, {}, {}).defined());
  torch::Tensor c = family.training_condition(spec, k, x0, {control}, {});
  ASSERT_EQ(c.sizes(), (std::vector<int64_t>{2, 33, 32, 32}));
  EXPECT_TRUE(torch::equal(c.narrow(1, 0, 16), torch::zeros_like(x0)));
  EXPECT_TRUE(torch::equal(c.narrow(1, 16, 1), torch::ones({2, 1, 32, 32})));
  EXPECT_TRUE(torch::equal(c.narrow(1, 17, 16), control));
  // The default inputs, given explicitly, are what the transformer feeds itself.
  auto m = build_transformer(spec);
  m->eval();
  ModelInputs in = m->example_inputs({2, 1, 256, 256});
  const torch::Tensor plain = m->forward(in);
  in.condition_channels =
      torch::cat({torch::zeros_like(in.latents), torch::ones({2, 1, 32, 32}), torch::zeros_like(in.latents)}, 1);
  EXPECT_TRUE(torch::allclose(m->forward(in), plain, 0, 0));
  in.condition_channels = c;
  EXPECT_FALSE(torch::allclose(m->forward(in), plain, 1e-3, 1e-3));
  // control_dropout 1: zeros; several control folders: each chosen, one per batch.
  k.control_dropout = 1.0;
  EXPECT_TRUE(
      torch::equal(family.training_condition(spec, k, x0, {control}, {}).narrow(1, 17, 16), torch::zeros_like(x0)));
  k.control_dropout = 0.0;
  std::set<int> chosen;
  for (int i = 0; i < 20; ++i) {
    const torch::Tensor ctl = family.training_condition(spec, k, x0, {control, other}, {}).narrow(1, 17, 16);
    chosen.insert(torch::equal(ctl, control) ? 0 : torch::equal(ctl, other) ? 1 : -1);
  }
  EXPECT_EQ(chosen, (std::set<int>{0, 1}));
  // Random inpainting: a binary mask covering part of the image, the latents zeroed where it is 1.
  k.do_random_inpainting = true;
  c = family.training_condition(spec, k, x0, {}, {});
  const torch::Tensor mask = c.narrow(1, 16, 1);
  EXPECT_TRUE(torch::equal(mask, mask.round()));
  for (int b = 0; b < 2; ++b) {
    const double coverage = mask[b].mean().item<double>();
    EXPECT_GT(coverage, 0.02) << b;
    EXPECT_LT(coverage, 0.98) << b;
  }
  EXPECT_TRUE(torch::equal(c.narrow(1, 0, 16), x0 * (1 - mask)));
  EXPECT_TRUE(torch::equal(c.narrow(1, 17, 16), torch::zeros_like(x0)));
  // invert_inpaint_mask_chance 1 (outpainting): the same draws give the complementary mask.
  torch::manual_seed(5);
  const torch::Tensor drawn = family.training_condition(spec, k, x0, {}, {}).narrow(1, 16, 1);
  k.invert_inpaint_mask_chance = 1.0;
  torch::manual_seed(5);
  c = family.training_condition(spec, k, x0, {}, {});
  EXPECT_TRUE(torch::equal(c.narrow(1, 16, 1), 1 - drawn));
  EXPECT_TRUE(torch::equal(c.narrow(1, 0, 16), x0 * drawn));
  // A blurred mask (half the time) weighs the latents by its values; dilation then moves the mask's edge.
  k.invert_inpaint_mask_chance = 0.0;
  k.random_blur_mask = true;
  for (int i = 0; i < 4; ++i) {
    c = family.training_condition(spec, k, x0, {}, {});
    const torch::Tensor m = c.narrow(1, 16, 1);
    EXPECT_TRUE(torch::allclose(c.narrow(1, 0, 16), x0 * (1 - m), 1e-6, 1e-6));
    EXPECT_GE(m.min().item<double>(), -1e-6);
    EXPECT_LE(m.max().item<double>(), 1.0 + 1e-6);
  }
  k.random_dialate_mask = true;
  c = family.training_condition(spec, k, x0, {}, {});
  EXPECT_GE(c.narrow(1, 16, 1).min().item<double>(), -1e-6);
  k.inpaint_dropout = 1.0;
  c = family.training_condition(spec, k, x0, {}, {});
  EXPECT_TRUE(torch::equal(c.narrow(1, 0, 17), torch::cat({torch::zeros_like(x0), torch::ones({2, 1, 32, 32})}, 1)));
}

// An inpainting mask from the data (an inpainting image's alpha, else the loss mask): brought to the latents'
// size (bilinear), the clean latents zeroed where it is 0 and the model told 1 there (flex2.py:383-467); a
// sample without one (zeros) is inpainted everywhere; inpaint_random_chance 1 replaces it with a random mask,
// or, without do_random_inpainting, with the no-input default; inpaint_dropout drops it.
TEST(Flex2, AnInpaintingImagesAlphaZeroesTheLatentsWhereTheModelInpaints) {
  ModelSpec spec = spec_by_preset("tiny-flux");
  const ModelFamily& family = family_of(spec.family);
  spec.extra_input_features = 2 * families_shared::packed_features(spec) + spec.patch * spec.patch;
  torch::manual_seed(0);
  const torch::Tensor x0 = torch::randn({2, 16, 32, 32});
  torch::Tensor keep = torch::ones({2, 1, 256, 256});
  keep[0].narrow(2, 0, 128).zero_();  // the first inpaints its left half
  keep[1].zero_();                    // the second has no inpainting image
  config::ModelKwargs k;
  torch::Tensor c = family.training_condition(spec, k, x0, {}, keep);
  ASSERT_TRUE(c.defined());
  torch::Tensor small = torch::ones({2, 1, 32, 32});
  small[0].narrow(2, 0, 16).zero_();
  small[1].zero_();
  EXPECT_TRUE(torch::equal(c.narrow(1, 16, 1), 1 - small));
  EXPECT_TRUE(torch::equal(c.narrow(1, 0, 16), x0 * small));
  EXPECT_TRUE(torch::equal(c.narrow(1, 17, 16), torch::zeros_like(x0)));
  // A soft edge keeps bilinear's values: half-covered pixels weigh the latents by half.
  torch::Tensor soft = torch::ones({2, 1, 64, 64});
  soft.narrow(3, 0, 3).zero_();  // 3 of the first 4 columns: a latent pixel's sample falls between
  c = family.training_condition(spec, k, x0, {}, soft);
  namespace F = torch::nn::functional;
  const torch::Tensor expect = F::interpolate(
      soft, F::InterpolateFuncOptions().size(std::vector<int64_t>{32, 32}).mode(torch::kBilinear).align_corners(false));
  EXPECT_TRUE(torch::allclose(c.narrow(1, 16, 1), 1 - expect));
  EXPECT_GT(expect.select(3, 1).min().item<double>(), 0.0);
  EXPECT_LT(expect.select(3, 1).max().item<double>(), 1.0);
  // Replaced: the default without random inpainting; dropped.
  const torch::Tensor fallback = torch::cat({torch::zeros_like(x0), torch::ones({2, 1, 32, 32})}, 1);
  k.inpaint_random_chance = 1.0;
  EXPECT_TRUE(torch::equal(family.training_condition(spec, k, x0, {}, keep).narrow(1, 0, 17), fallback));
  k.inpaint_random_chance = 0.0;
  k.inpaint_dropout = 1.0;
  EXPECT_TRUE(torch::equal(family.training_condition(spec, k, x0, {}, keep).narrow(1, 0, 17), fallback));
}

// A Flex.2 preview's ctrl_img as its Flex2Pipeline takes it (flex2.py:231-251, pipeline.py:182-290): an RGB
// (or RGBA, alpha dropped) image is the control, replacing slot 1's zeros with its latents; an RGBA image
// named *.inpaint.* is the inpainting input, slot 0: its latents times the alpha at the latents' size and
// 1 - alpha. Where AI Toolkit would fail at the preview (the wrong ctrl_idx for the image, an inpainting
// name without alpha) the run is refused up front, the fix named.
TEST(Flex2, PreviewControlImagesAsAiToolkitsFlex2Pipeline) {
  ModelSpec spec = spec_by_preset("tiny-flux");
  const ModelFamily& family = family_of(spec.family);
  spec.extra_input_features = 2 * families_shared::packed_features(spec) + spec.patch * spec.patch;
  const fs::path dir = testing::fresh_dir("flex2_preview_control");
  torch::manual_seed(4);
  const torch::Tensor rgb = torch::randint(0, 256, {48, 64, 3}).to(torch::kUInt8);
  data::write_png(dir / "pose.png", rgb);
  torch::Tensor rgba = torch::cat({rgb, torch::full({48, 64, 1}, 255, torch::kUInt8)}, 2);
  rgba.narrow(1, 32, 32).select(2, 3).fill_(0);  // inpaint the right half
  rgba = rgba.contiguous();
  ASSERT_TRUE(stbi_write_png((dir / "photo.inpaint.png").c_str(), 64, 48, 4, rgba.data_ptr<uint8_t>(), 64 * 4));
  data::write_png(dir / "flat.inpaint.png", rgb);
  // The stand-in encoder: 8x8 means, the channels repeated (16 latent channels).
  int encoded = 0;
  const auto encode = [&](const torch::Tensor& x) {
    ++encoded;
    EXPECT_EQ(x.sizes(), (std::vector<int64_t>{1, 3, 48, 64}));
    return torch::avg_pool2d(x, 8).repeat({1, 6, 1, 1}).narrow(1, 0, 16);
  };
  const torch::Tensor z = encode(data::to_unit_range(rgb).unsqueeze(0));
  const torch::Tensor control = family.preview_condition(spec, dir / "pose.png", 1, 64, 48, encode);
  ASSERT_EQ(control.sizes(), (std::vector<int64_t>{1, 33, 6, 8}));
  EXPECT_TRUE(torch::equal(control.narrow(1, 0, 16), torch::zeros_like(z)));
  EXPECT_TRUE(torch::equal(control.narrow(1, 16, 1), torch::ones({1, 1, 6, 8})));
  EXPECT_TRUE(torch::allclose(control.narrow(1, 17, 16), z));
  const torch::Tensor inpaint = family.preview_condition(spec, dir / "photo.inpaint.png", 0, 64, 48, encode);
  torch::Tensor keep = torch::ones({1, 1, 6, 8});
  keep.narrow(3, 4, 4).zero_();
  EXPECT_TRUE(torch::allclose(inpaint.narrow(1, 0, 16), z * keep));
  EXPECT_TRUE(torch::allclose(inpaint.narrow(1, 16, 1), 1 - keep));
  EXPECT_TRUE(torch::equal(inpaint.narrow(1, 17, 16), torch::zeros_like(z)));
  EXPECT_EQ(encoded, 3);
  // What AI Toolkit fails on, refused by name with the fix.
  auto refused = [&](const fs::path& f, int index, const std::string& says) {
    try {
      family.check_preview_control(spec, f, index);
      ADD_FAILURE() << f << " at " << index;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused(dir / "pose.png", 0, "--ctrl_idx 1");
  refused(dir / "photo.inpaint.png", 1, "--ctrl_idx 0");
  refused(dir / "flat.inpaint.png", 0, "no alpha channel");
  EXPECT_NO_THROW(family.check_preview_control(spec, dir / "pose.png", 1));
  // Other archs take none.
  EXPECT_FALSE(family.preview_condition(spec_by_preset("tiny-flux"), dir / "pose.png", 1, 64, 48, encode).defined());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::model
