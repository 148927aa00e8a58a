// The model's load as AI Toolkit's loaders do it (train/loading.h): where the transformer is quantized
// (on the device; in host memory under model.low_vram for the StableDiffusion-class archs, always for the
// quantize_model archs), when it reaches the device, the text encoders built and quantized on the device —
// and the load's memory walk, which predicts (on the meta device too) what the tracking allocator measures.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../support/test_util.h"
#include "../support/tiny_run.h"
#include "gclab/model/family.h"
#include "gclab/nn/layers.h"
#include "gclab/train/oom_report.h"
#include "gclab/train/session.h"
#include "gclab/train/trainer.h"

namespace gclab::train {
namespace {

namespace fs = std::filesystem;
using gclab::testing::tiny_config;

// ATen's one-element tensors for Scalar operands, alive for an instant inside a quantization.
constexpr int64_t kScalarSlack = 256;

struct Load {
  int64_t device_measured = 0, device_predicted = 0, host_measured = 0, host_predicted = 0;
  bool on_host = false;
};

Load load_of(const fs::path& dir, const std::string& name, const std::vector<std::string>& extra) {
  Session s(tiny_config(dir, name, extra));
  const LoadMemory& l = s.load_memory();
  EXPECT_TRUE(l.measured_device_peak_bytes.has_value());
  EXPECT_TRUE(l.measured_host_peak_bytes.has_value());
  // The meta build predicts the same walk.
  auto config = tiny_config(dir, name, extra);
  EXPECT_EQ(predicted_load_peak(config), l.device.peak()) << name;
  return {l.measured_device_peak_bytes.value_or(-1), l.device.peak(), l.measured_host_peak_bytes.value_or(-1),
          l.host.peak(), l.quantized_on_host};
}

void expect_predicted(const Load& l, const std::string& what) {
  EXPECT_GE(l.device_measured, l.device_predicted) << what;
  EXPECT_LE(l.device_measured, l.device_predicted + kScalarSlack) << what;
  EXPECT_GE(l.host_measured, l.host_predicted) << what;
  EXPECT_LE(l.host_measured, l.host_predicted + kScalarSlack) << what;
}

TEST(Loading, ThePredictedLoadIsWhatTheAllocatorMeasures) {
  const fs::path dir = testing::fresh_dir("loading_walk");
  struct Case {
    std::string name;
    std::vector<std::string> extra;
    bool on_host;
    bool parks_blocks = false;  // quantized on the device, its blocks in host memory for a while
  };
  const std::vector<Case> cases = {
      {"plain", {}, false},
      {"plain_low_vram", {"model.low_vram=true"}, true},
      {"qfloat8", {"model.quantize=true"}, false},
      {"qfloat8_low_vram", {"model.quantize=true", "model.low_vram=true"}, true},
      {"uint4_bf16", {"model.quantize=true", "model.qtype=uint4", "train.dtype=bf16"}, false},
      {"uint3_bf16_low_vram",
       {"model.quantize=true", "model.qtype=uint3", "train.dtype=bf16", "model.low_vram=true"},
       true},
      {"int8_te_float8", {"model.quantize=true", "model.qtype=int8", "model.qtype_te=float8"}, false},
      {"uint3_adapter", {"model.quantize=true", "model.qtype=uint3|ostris/adapters/tiny_uint3.safetensors"}, false},
      {"qwen_uint3", {"model.arch=tiny-qwen-image", "model.quantize=true", "model.qtype=uint3"}, true},
      {"qwen_plain", {"model.arch=tiny-qwen-image"}, true},
      {"qwen_low_vram", {"model.arch=tiny-qwen-image", "model.quantize=true", "model.low_vram=true"}, true},
      {"zimage_float8_bf16",
       {"model.arch=tiny-zimage", "model.quantize=true", "model.qtype=float8", "train.dtype=bf16"},
       true},
      {"sd3_qfloat8_low_vram", {"model.arch=tiny-sd3", "model.quantize=true", "model.low_vram=true"}, true},
      // Wan: quantized on the device, the blocks parked in host memory while UMT5 loads, then back.
      {"wan_qfloat8", {"model.arch=tiny-wan21", "model.quantize=true"}, false, true},
      {"wan_qfloat8_low_vram", {"model.arch=tiny-wan21", "model.quantize=true", "model.low_vram=true"}, true},
      {"wan_plain", {"model.arch=tiny-wan21"}, false},
      {"wan_plain_low_vram", {"model.arch=tiny-wan21", "model.low_vram=true"}, true},
  };
  for (const auto& c : cases) {
    const Load l = load_of(dir, c.name, c.extra);
    EXPECT_EQ(l.on_host, c.on_host) << c.name;
    EXPECT_GT(l.device_predicted, 0) << c.name;
    EXPECT_EQ(l.host_predicted > 0, c.on_host || c.parks_blocks) << c.name;
    expect_predicted(l, c.name);
  }
  fs::remove_all(dir);
}

// model.low_vram on FLUX.1 (AI Toolkit's StableDiffusion loader): quantized in host memory, the device holds
// the quantized transformer beside the text encoders' load instead of the float one beside one Linear's
// quantization; the weights, and so the training, are the same.
TEST(Loading, LowVramQuantizesInHostMemoryAndTrainsTheSame) {
  const fs::path dir = testing::fresh_dir("loading_low_vram");
  const std::vector<std::string> q = {"model.quantize=true", "train.steps=2"};
  auto low = q;
  low.push_back("model.low_vram=true");
  int64_t float_bytes = 0, quantized_bytes = 0;
  {
    Session s(tiny_config(dir, "bytes", {"train.steps=2"}));
    float_bytes = nn::module_bytes(s.model());
  }
  const Load on_device = load_of(dir, "on_device", q);
  const Load on_host = load_of(dir, "on_host", low);
  {
    Session s(tiny_config(dir, "quantized", q));
    quantized_bytes = nn::module_bytes(s.model());  // the LoRA adapters included
  }
  EXPECT_GT(on_device.device_measured, float_bytes);  // the float transformer on the device, being quantized
  EXPECT_LT(on_host.device_measured, on_device.device_measured - (float_bytes - quantized_bytes) / 2);
  EXPECT_GT(on_host.host_measured, float_bytes);
  EXPECT_EQ(on_device.host_measured, 0);
  testing::expect_same_losses(train(tiny_config(dir, "train_on_device", q), {}).losses,
                              train(tiny_config(dir, "train_on_host", low), {}).losses, 2);
  fs::remove_all(dir);
}

// host_cap holds the load's host memory too: a transformer quantized in host memory that does not fit is
// refused (exit 2, as offloading beyond the cap is) with what the load holds there and the lever the arch's
// loader has — low_vram off for FLUX.1, which then quantizes on the device.
TEST(Loading, TheHostCapRefusesATransformerQuantizedInHostMemoryThatDoesNotFit) {
  const fs::path dir = testing::fresh_dir("loading_host_cap");
  const std::vector<std::string> low = {"model.quantize=true", "model.low_vram=true"};
  const Load free = load_of(dir, "free", low);
  auto capped = low;
  capped.push_back("host_cap=" + std::to_string(free.host_predicted / 2));
  try {
    Session s(tiny_config(dir, "capped", capped));
    ADD_FAILURE() << "a host cap of half the load's host peak was not enforced";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model.low_vram: false"), std::string::npos) << m;
    EXPECT_NE(m.find("host_cap"), std::string::npos) << m;
  }
  auto roomy = low;
  roomy.push_back("host_cap=" + std::to_string(free.host_predicted + kScalarSlack));
  EXPECT_NO_THROW(Session(tiny_config(dir, "roomy", roomy)));
  fs::remove_all(dir);
}

// Qwen-Image's loader drops Qwen2.5-VL's vision tower for the text-only pipeline; the edit models keep it to
// read their control images (qwen_image.py's `_qwen_image_keep_visual`).
TEST(Loading, QwenImageLoadsItsTextEncoderWithoutTheVisionTowerAndTheEditModelsWithIt) {
  const fs::path dir = testing::fresh_dir("loading_vision_tower");
  auto text_only = tiny_config(dir, "qwen", {"model.arch=tiny-qwen-image"});
  auto edit = tiny_config(dir, "edit", {"model.arch=tiny-qwen-image-edit"});
  Session a(text_only, SessionOptions{/*meta=*/true});
  Session b(edit, SessionOptions{/*meta=*/true});
  EXPECT_FALSE(a.text().encoder()->encoder(0).takes_images());
  EXPECT_TRUE(b.text().encoder()->encoder(0).takes_images());
  EXPECT_LT(a.text().encoder()->weight_bytes(), b.text().encoder()->weight_bytes());
  fs::remove_all(dir);
}

// Out of memory while loading: each lever is priced from the load's walk and offered only where it lowers
// the load — quantizing on the device (FLUX.1 without low_vram) does not, since the transformer still
// arrives in its dtype; in host memory it does; Qwen-Image's loader quantizes in host memory anyway.
TEST(Loading, TheLoadsAdviceOffersOnlyWhatLowersTheLoad) {
  const fs::path dir = testing::fresh_dir("loading_advice");
  auto titles = [&](const std::vector<std::string>& extra) {
    const auto config = tiny_config(dir, "advice", extra);
    OomContext ctx;
    ctx.phase = Phase::setup;
    const model::ModelSpec spec = model::spec_for(config.model);
    std::vector<std::string> out;
    for (const OomFix& f : recommend_fixes(ctx, config, codec_plan(config, spec))) {
      EXPECT_GT(f.predicted_saving_bytes, 0) << f.title;
      out.push_back(f.title);
    }
    return out;
  };
  using V = std::vector<std::string>;
  // FLUX.1 unquantized: quantizing in host memory saves the most; quantize_te saves nothing (T5 still arrives
  // in its dtype beside the transformer).
  const V flux = titles({});
  ASSERT_FALSE(flux.empty());
  EXPECT_EQ(flux.front(), "Quantize the base weights in host memory");
  EXPECT_EQ(std::count(flux.begin(), flux.end(), "Quantize the text encoders"), 0);
  EXPECT_EQ(titles({"model.quantize=true"}), (V{"Quantize the transformer in host memory"}));
  // Qwen-Image: quantized in host memory whatever low_vram says, so no lever to quantize there; low_vram
  // keeps the transformer off the device through the load instead.
  const V qwen = titles({"model.arch=tiny-qwen-image"});
  EXPECT_EQ(std::count(qwen.begin(), qwen.end(), "Quantize the base weights"), 1);
  EXPECT_EQ(std::count(qwen.begin(), qwen.end(), "Quantize the transformer in host memory"), 0);
  EXPECT_EQ(std::count(qwen.begin(), qwen.end(), "Keep the transformer in host memory until its first use"), 1);
  const V qwen_low = titles({"model.arch=tiny-qwen-image", "model.low_vram=true"});
  EXPECT_EQ(std::count(qwen_low.begin(), qwen_low.end(), "Keep the transformer in host memory until its first use"), 0);
  // Wan: low_vram parks the transformer in host memory while UMT5 loads, quantized or not — a saving where
  // UMT5 is quantized as it loads (its bf16 weights and the quantization beside no transformer), none where
  // it is not (the load ends with both on the device either way).
  const std::string parked = "Keep the transformer in host memory while the text encoders load";
  const V wan_te = titles({"model.arch=tiny-wan21", "model.quantize_te=true"});
  EXPECT_EQ(std::count(wan_te.begin(), wan_te.end(), parked), 1);
  const V wan = titles({"model.arch=tiny-wan21"});
  EXPECT_EQ(std::count(wan.begin(), wan.end(), parked), 0);
  const V wan_q = titles({"model.arch=tiny-wan21", "model.quantize=true"});
  EXPECT_EQ(std::count(wan_q.begin(), wan_q.end(), "Quantize the transformer in host memory"), 1);
  const V wan_low = titles({"model.arch=tiny-wan21", "model.quantize_te=true", "model.low_vram=true"});
  EXPECT_EQ(std::count(wan_low.begin(), wan_low.end(), parked), 0);
  fs::remove_all(dir);
}

// train, bench and fit open their Session the same way: a load that runs out writes the report (phase
// setup) and stops with its short version (exit 3 in the CLI).
TEST(Loading, ALoadThatRunsOutIsReportedByTheSessionEveryVerbOpens) {
  const fs::path dir = testing::fresh_dir("loading_open_session");
  const std::vector<std::string> q = {"model.quantize=true"};
  auto capped = q;
  capped.push_back("vram_cap=" + std::to_string(predicted_load_peak(tiny_config(dir, "free", q)) / 2));
  EXPECT_THROW(open_session(tiny_config(dir, "capped", capped), dir / "report"), OutOfMemoryStop);
  std::ifstream in(dir / "report" / "oom_report.json");
  ASSERT_TRUE(in);
  const auto report = nlohmann::json::parse(in, nullptr, false);
  EXPECT_EQ(report["phase"], "setup");
  EXPECT_EQ(report["fixes"][0]["change"], "model.low_vram: true");
  fs::remove_all(dir);
}

// The arch's loader is a fact of the family table: Flex.2's quantizes on the device whatever low_vram says,
nlohmann::json first_metrics_row(const fs::path& run) {
  std::ifstream in(run / "metrics.jsonl");
  std::string line;
  std::getline(in, line);
  return nlohmann::json::parse(line);
}

// Qwen-Image's and Z-Image's loaders under model.low_vram (qwen_image.py:141-143, :219-220): the transformer
// stays in host memory through the load and reaches the device at its first use — here the first step's
// forward (skip_first_sample) — so neither the load nor the first step's data and text phases hold it; the
// memory model predicts both, and the training is the same.
TEST(Loading, UnderLowVramQwenImagesTransformerReachesTheDeviceAtItsFirstUse) {
  const fs::path dir = testing::fresh_dir("loading_first_use");
  const std::vector<std::string> resident = {"model.arch=tiny-qwen-image", "model.quantize=true", "train.steps=2"};
  auto parked = resident;
  parked.push_back("model.low_vram=true");
  int64_t base_bytes = 0;  // the transformer's own weights, quantized (the LoRA adapters apart)
  {
    Session s(tiny_config(dir, "bytes", resident));
    base_bytes = s.resident().weights - s.resident().trained;
  }
  const Load with = load_of(dir, "resident", resident), without = load_of(dir, "parked", parked);
  expect_predicted(without, "parked");
  // The load's peak is the text encoder's own quantization on the tiny preset; the transformer beside it
  // lifts it without low_vram.
  EXPECT_LT(without.device_measured, with.device_measured);
  const TrainSummary a = train(tiny_config(dir, "train_resident", resident), {});
  const TrainSummary b = train(tiny_config(dir, "train_parked", parked), {});
  testing::expect_same_losses(a.losses, b.losses, 2);
  const nlohmann::json ra = first_metrics_row(dir / "train_resident"), rb = first_metrics_row(dir / "train_parked");
  for (const char* phase : {"data", "text"}) {
    const int64_t measured_with = ra["phases"][phase], measured_without = rb["phases"][phase];
    EXPECT_NEAR(static_cast<double>(measured_with - measured_without), static_cast<double>(base_bytes),
                0.02 * static_cast<double>(base_bytes))
        << phase;
    const int64_t predicted = rb["predicted_phases"][phase];
    EXPECT_NEAR(static_cast<double>(predicted), static_cast<double>(measured_without),
                0.05 * static_cast<double>(measured_without))
        << phase;
  }
  // From the forward on, the device holds what it holds without low_vram.
  EXPECT_EQ(ra["phases"]["backward"], rb["phases"]["backward"]);
  fs::remove_all(dir);
}

// FLUX.1's and SD3's honour it, Qwen-Image's and Z-Image's quantize block by block (host memory).
TEST(Loading, EachArchLoadsAsItsAiToolkitLoader) {
  using L = model::TransformerLoading;
  EXPECT_EQ(model::transformer_loading("flux"), L::on_device_unless_low_vram);
  EXPECT_EQ(model::transformer_loading("flex1"), L::on_device_unless_low_vram);
  EXPECT_EQ(model::transformer_loading("flex2"), L::on_device);
  EXPECT_EQ(model::transformer_loading("sd3"), L::on_device_unless_low_vram);
  EXPECT_EQ(model::transformer_loading("qwen_image"), L::per_block);
  EXPECT_EQ(model::transformer_loading("qwen_image_edit_plus"), L::per_block);
  EXPECT_EQ(model::transformer_loading("zimage"), L::per_block);
  EXPECT_EQ(model::transformer_loading("tiny-qwen-image"), L::per_block);
  EXPECT_EQ(model::transformer_loading("wan21"), L::parked_while_text_encoders_load);
  const fs::path dir = testing::fresh_dir("loading_archs");
  auto config = tiny_config(dir, "flex2", {"model.quantize=true", "model.low_vram=true"});
  config.model.arch = "flex2";
  EXPECT_FALSE(Session(config, SessionOptions{/*meta=*/true}).load_memory().quantized_on_host);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::train
