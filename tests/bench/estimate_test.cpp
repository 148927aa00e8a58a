#include "gclab/train/predict.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>
#include "../support/step_peak.h"
#include "../support/test_util.h"
#include "gclab/bench/bench.h"
#include "gclab/bench/bench_page.h"
#include "gclab/bench/report.h"
#include "gclab/config/loader.h"
#include "gclab/data/synth.h"
#include "gclab/memory/cpu_isa.h"
#include "gclab/model/family.h"
#include "gclab/model/quantize.h"
#include "gclab/model/summary.h"
#include "gclab/train/session.h"
#include "gclab/train/sharding.h"
#include "gclab/train/trainer.h"

namespace gclab::bench {
namespace {

using train::estimate_load;
using train::estimate_memory;

namespace fs = std::filesystem;

config::ProcessConfig load(const std::string& path, std::vector<std::string> overrides = {}) {
  config::LoadOptions o;
  o.overrides = std::move(overrides);
  auto r = model::load_config_file(path, o);
  if (!r.ok()) throw std::runtime_error("config refused: " + r.diagnostics.all().front().format());
  return *r.config;
}

config::ProcessConfig flux_24gb(std::vector<std::string> overrides = {}) {
  return load(std::string(GCLAB_SHARED_DIR) + "/aitk-configs/train_lora_flux_24gb.yaml", std::move(overrides));
}

std::vector<ckpt::CheckpointPolicy> policies(std::initializer_list<const char*> names) {
  std::vector<ckpt::CheckpointPolicy> out;
  for (const char* n : names) out.push_back(ckpt::CheckpointPolicy::parse(n));
  return out;
}

// `gclab estimate --frames 1,17,33 --resolution 480,632` on AI Toolkit's Wan 2.1 1.3B example: a row per
// frames x resolution, each the config re-planned there (the same rows estimate_memory gives it), tokens =
// latent frames x (H/16)(W/16); an image model asked for frames is refused as its config would be.
TEST(Estimate, AGridOfFramesAndResolutionsIsARowEach) {
  const std::string wan = std::string(GCLAB_SHARED_DIR) + "/aitk-configs/train_lora_wan21_1b_24gb.yaml";
  const auto grid = train::estimate_memory_grid(load(wan), {1, 17, 33}, {480, 632});
  ASSERT_EQ(grid.resolutions.size(), 6u);
  for (const auto& r : grid.resolutions) {
    const int latent = 1 + (r.frames - 1) / 4;
    const int64_t per_frame = r.resolution == 480 ? 30 * 30 : 39 * 40;  // 480², and 632's bucket 624 x 640
    EXPECT_EQ(r.image_tokens, latent * per_frame) << r.frames << " at " << r.resolution;
  }
  const auto one = estimate_memory(load(wan, {"datasets.0.num_frames=17", "datasets.0.resolution=[632]"}));
  ASSERT_EQ(one.resolutions.size(), 1u);
  const auto& same = grid.resolutions[3];
  ASSERT_EQ(same.frames, 17);
  ASSERT_EQ(same.resolution, 632);
  EXPECT_EQ(same.gc_full.total_bytes, one.resolutions[0].gc_full.total_bytes);
  EXPECT_EQ(same.gc_off.total_bytes, one.resolutions[0].gc_off.total_bytes);
  EXPECT_LT(grid.resolutions[0].gc_full.total_bytes, grid.resolutions[2].gc_full.total_bytes);  // frames cost
  EXPECT_THROW(train::estimate_memory_grid(flux_24gb(), {5}, {}), UserError);
  EXPECT_THROW(train::estimate_memory_grid(load(wan), {0}, {}), UserError);
}

// Data parallelism (issue 51), `estimate --world-size 8 --shard ...` on AI Toolkit's FLUX.1-dev 24 GB LoRA config:
// each rank holds the reducer's buckets — one element per trained tensor beyond its gradient, in its dtype, as
// the reducer allocates them — and each sharding divides what train/sharding.h says it divides, the cells' totals
// moving by the resident bytes' change. One process holds no buckets.
TEST(Estimate, EachRankOfADataParallelRunAndItsShardings) {
  const auto one = estimate_memory(flux_24gb());
  EXPECT_EQ(one.gradient_bucket_bytes, 0);
  dist::World eight;
  eight.size = 8;
  dist::set_process_world(eight);
  const auto e = estimate_memory(flux_24gb());
  dist::set_process_world(dist::World{});
  EXPECT_EQ(e.world_size, 8);
  int64_t buckets = 0, tensors = 0;
  {
    train::Session meta(flux_24gb(), train::SessionOptions{/*meta=*/true});
    for (const auto& [name, p] : meta.trained())
      buckets += static_cast<int64_t>((p.numel() + 1) * p.element_size()), ++tensors;
  }
  EXPECT_GT(tensors, 100);
  EXPECT_EQ(e.gradient_bucket_bytes, buckets);
  EXPECT_EQ(e.resident_bytes, one.resident_bytes + buckets);
  ASSERT_EQ(e.resolutions.size(), one.resolutions.size());
  EXPECT_EQ(e.resolutions[0].gc_full.total_bytes, one.resolutions[0].gc_full.total_bytes + buckets);

  auto eighth = [](int64_t b) { return (b + 7) / 8; };
  const auto none = train::shard_resident(e, train::Shard::none);
  EXPECT_EQ(none.resident, e.resident_bytes);
  EXPECT_EQ(none.change(), 0);
  EXPECT_THROW(train::shard_resident(e, train::Shard::optimizer), std::invalid_argument);  // needs the walk below
  // Any sharding: the optimizer's state walked for rank 0's own tensors (dist::owners), as `train --shard
  // optimizer` holds it — about an eighth of the whole (whole tensors to a rank).
  eight.shard_optimizer = true;
  dist::set_process_world(eight);
  const auto s = estimate_memory(flux_24gb());
  dist::set_process_world(dist::World{});
  EXPECT_TRUE(s.optimizer_sharded);
  EXPECT_GT(s.optimizer_bytes, e.optimizer_bytes / 16);
  EXPECT_LT(s.optimizer_bytes, e.optimizer_bytes / 4);
  const auto zero1 = train::shard_resident(s, train::Shard::optimizer);
  EXPECT_EQ(zero1.optimizer, s.optimizer_bytes);
  EXPECT_EQ(zero1.ema, s.ema_bytes);  // updated whole, as `train --shard optimizer` keeps it
  EXPECT_EQ(zero1.gradients, s.gradient_bytes);
  EXPECT_EQ(zero1.change(), 0);
  EXPECT_EQ(s.resident_bytes, e.resident_bytes - (e.optimizer_bytes - s.optimizer_bytes));
  const auto zero2 = train::shard_resident(s, train::Shard::grads);
  EXPECT_EQ(zero2.gradients, eighth(s.gradient_bytes));
  EXPECT_EQ(zero2.gradient_buckets, std::min<int64_t>(s.gradient_bucket_bytes, 25 << 20));
  EXPECT_LT(zero2.resident, zero1.resident);
  const auto fsdp = train::shard_resident(s, train::Shard::full);
  EXPECT_EQ(fsdp.weights, eighth(s.weight_bytes));
  EXPECT_EQ(fsdp.ema, eighth(s.ema_bytes));
  EXPECT_GT(s.largest_block_weight_bytes, s.weight_bytes / 60);  // FLUX.1-dev: 57 blocks, the double ones larger
  EXPECT_EQ(fsdp.gathered, 2 * s.largest_block_weight_bytes + s.largest_block_trained_bytes);
  EXPECT_LT(fsdp.resident, zero2.resident - s.weight_bytes / 2);  // the frozen base is what it divides
  // The report: the per_rank section, each cell's phases moved by the resident change.
  const auto doc = bench::estimate_report(s, train::Shard::full).value;
  const auto& pr = doc["estimate"]["per_rank"];
  EXPECT_EQ(pr["shard"], "full");
  EXPECT_EQ(pr["resident"].get<int64_t>(), fsdp.resident);
  const auto& cell = s.resolutions[0].gc_off;
  int64_t expected = 0;
  for (const auto& [phase, bytes] : cell.phases) expected = std::max(expected, bytes + fsdp.change());
  EXPECT_EQ(pr["per_resolution"][0]["gc_off_total"].get<int64_t>(), expected);
  EXPECT_LT(expected, cell.total_bytes);
  EXPECT_FALSE(bench::estimate_report(one).value["estimate"].contains("per_rank"));
}

// AI Toolkit's FLUX.1-dev 24 GB LoRA config: fits a 24 GB card with checkpointing at every resolution it
// trains, and does not without it — the switch this project exists to explain.
TEST(Estimate, FluxLoraOn24GbFitsWithCheckpointingAndNotWithout) {
  const auto e = estimate_memory(flux_24gb({"vram_cap=24GB"}));
  ASSERT_EQ(e.resolutions.size(), 3u);
  for (const auto& r : e.resolutions) {
    EXPECT_LT(r.gc_full.total_bytes, e.cap_bytes) << r.resolution;
    EXPECT_GT(r.gc_off.activation_bytes, 10 * r.gc_full.activation_bytes) << r.resolution;
    // Without checkpointing the step's peak is its forward's or its backward's: what stays, and the walked
    // peak (the micro-batch, the activations, the gradients as they are made).
    EXPECT_EQ(r.gc_off.total_bytes,
              e.resident_bytes - e.gradient_bytes + std::max(r.gc_off.forward_bytes, r.gc_off.backward_bytes));
    EXPECT_GT(r.gc_off.backward_bytes, r.gc_off.batch_bytes + r.gc_off.activation_bytes);
  }
  EXPECT_GT(e.resolutions.back().gc_off.total_bytes, e.cap_bytes);
  EXPECT_EQ(e.resident_bytes,
            e.weight_bytes + e.gradient_bytes + e.optimizer_bytes + e.ema_bytes + e.text_encoder_bytes);
}

// The memory model executes a plan for the meta device — the same one a config gives — and nothing else: a
// plan for a real device would build the model for real.
TEST(Estimate, TheMemoryModelExecutesAMetaPlan) {
  const auto config = flux_24gb({"train.checkpoint_policy=every:2"});
  const train::MemoryModel from_plan(train::plan_run(config, train::PlanOptions{/*meta=*/true}));
  const auto e = estimate_memory(config);
  EXPECT_EQ(from_plan.estimate().resident_bytes, e.resident_bytes);
  EXPECT_EQ(from_plan.estimate().resolutions.back().gc_run->total_bytes, e.resolutions.back().gc_run->total_bytes);
  auto plan = train::plan_run(config, train::PlanOptions{/*meta=*/true});
  plan.device = torch::Device(torch::kCPU);
  EXPECT_THROW(train::MemoryModel{std::move(plan)}, std::invalid_argument);
}

// Every config shape AI Toolkit's UI writes for a modelled arch (configs/aitk-ui/: resolution lists, empty
// `controls`, the text encoder resident and quantized) plans at full size on meta, also with the text
// embeddings cached, the text encoder unquantized and low_vram: no internal error, and the walk runs every op
// it meets (no "the walk met" entry in not_modelled). Qwen-Image-Edit-2511's per-token modulation
// (torch::where on meta) ended `check` with exit 1 before.
TEST(Estimate, EveryUiConfigPlansAtFullSize) {
  const std::vector<std::vector<std::string>> variants = {
      {}, {"train.cache_text_embeddings=true"}, {"model.quantize_te=false", "model.low_vram=true"}};
  int planned = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(GCLAB_SOURCE_DIR) / "configs" / "aitk-ui")) {
    for (const auto& overrides : variants) {
      const std::string what = entry.path().filename().string() + (overrides.empty() ? "" : " " + overrides.front());
      train::MemoryEstimate e;
      ASSERT_NO_THROW(e = estimate_memory(load(entry.path().string(), overrides))) << what;
      ASSERT_FALSE(e.resolutions.empty()) << what;
      for (const std::string& gap : e.not_modelled)
        EXPECT_EQ(gap.find("the walk met"), std::string::npos) << what << ": " << gap;
      ++planned;
    }
  }
  EXPECT_GE(planned, 8 * 3);
}

// On a CPU whose kernels the bf16 rules were not measured exact on (memory::cpu_bf16_bound: AVX-512 without
// BF16, AMX), a bf16 CPU estimate says so in not_modelled, with the bounds measured there; float32's never
// does from AVX2 up. Run under ONEDNN_MAX_CPU_ISA=AVX2 and =AVX512_CORE too (ctest's isa.* entries).
TEST(Estimate, SaysWhereTheCpuRulesAreNotExact) {
  const fs::path dir = testing::fresh_dir("estimate_isa");
  // device: auto resolves to the CPU here as the plan resolves it (the caveats said for it too).
  const char* device = torch::cuda::is_available() ? "cpu" : "auto";
  for (const char* dtype : {"bf16", "fp32"}) {
    const std::string yaml = "name: e\ntraining_folder: " + dir.string() + "\ndevice: " + device +
                             "\ndatasets:\n  - folder_path: " + dir.string() +
                             "\n    resolution: [256]\ntrain: {batch_size: 1, steps: 1, dtype: " + dtype +
                             "}\nmodel: {arch: tiny-flux, vae: dct}\n";
    auto r = model::load_config_text(yaml, "e.yaml");
    ASSERT_TRUE(r.ok()) << r.diagnostics.all().front().format();
    const auto e = estimate_memory(*r.config);
    EXPECT_EQ(e.device, "cpu");
    const int64_t bytes = std::string(dtype) == "bf16" ? 2 : 4;
    const bool said = std::any_of(e.not_modelled.begin(), e.not_modelled.end(), [](const std::string& s) {
      return s.find("docs/results/cpu-isa.md") != std::string::npos;
    });
    std::printf("%s on %s: rules %s\n", dtype, memory::name_of(memory::onednn_isa()).c_str(),
                memory::cpu_rules_measured(bytes) ? "exact" : "bounded");
    EXPECT_EQ(said, !memory::cpu_rules_measured(bytes)) << dtype;
    if (said) {
      const std::string caveat = memory::cpu_rules_caveat(bytes);
      EXPECT_NE(caveat.find(memory::name_of(memory::onednn_isa())), std::string::npos) << caveat;
    }
  }
}

// A partial policy is predicted block by block: every other block keeps its activations (block 0 and each
// second one checkpointed, the rest not), so at every resolution its step lies between GC full's and GC
// off's, its activations the ledger's blocks under the policy's modes; the off and full cells stay as they
// were.
TEST(Estimate, EveryOtherBlockCheckpointedLiesBetweenFullAndOff) {
  const auto plain = estimate_memory(flux_24gb());
  const auto e = estimate_memory(flux_24gb({"train.checkpoint_policy=every:2"}));
  EXPECT_EQ(e.policy.kind, ckpt::CheckpointPolicy::Kind::EveryN);
  EXPECT_EQ(e.policy.n, 2);
  EXPECT_EQ(plain.policy.kind, ckpt::CheckpointPolicy::Kind::Full);
  ASSERT_EQ(e.resolutions.size(), plain.resolutions.size());
  train::Session meta(flux_24gb(), train::SessionOptions{/*meta=*/true});
  for (size_t i = 0; i < e.resolutions.size(); ++i) {
    const auto& r = e.resolutions[i];
    EXPECT_FALSE(plain.resolutions[i].gc_run);
    ASSERT_TRUE(r.gc_run) << r.resolution;
    EXPECT_GT(r.gc_run->total_bytes, r.gc_full.total_bytes) << r.resolution;
    EXPECT_LT(r.gc_run->total_bytes, r.gc_off.total_bytes) << r.resolution;
    EXPECT_EQ(r.gc_off.total_bytes, plain.resolutions[i].gc_off.total_bytes);
    // FLUX.1-dev: 19 double and 38 single blocks; every:2 keeps the activations of 9 double and 19 single.
    const auto a = meta.block_activations({r.batch, 1, r.resolution, r.resolution});
    int64_t kept = 0;
    for (size_t b = 0; b < a.per_block.size(); ++b) kept += b % 2 == 0 ? a.per_block[b].input : a.per_block[b].saved;
    EXPECT_GE(r.gc_run->activation_bytes, kept) << r.resolution;
    EXPECT_LT(r.gc_run->activation_bytes, kept + a.per_block.front().saved + a.per_block.front().input) << r.resolution;
  }
}

// The load of AI Toolkit's FLUX.1-dev config (train/loading.h): without low_vram the bf16 transformer is
// quantized on the device (22.17 GiB and one Linear's quantization: fits a 24 GiB card, not the same card
// with a display's couple of GiB taken); with it the quantized transformer sits beside T5-XXL loading in
// bf16, and the host holds what the device held.
TEST(Estimate, FluxLoadQuantizesOnTheDeviceUnlessLowVram) {
  const auto on_device = estimate_memory(flux_24gb());
  const auto on_host = estimate_memory(flux_24gb({"model.low_vram=true"}));
  const int64_t bf16_transformer = 2 * int64_t{11'901'408'320};
  EXPECT_FALSE(on_device.load.quantized_on_host);
  EXPECT_GT(on_device.load.device_peak_bytes, bf16_transformer);
  EXPECT_LT(on_device.load.device_peak_bytes, bf16_transformer + (int64_t{1} << 30));
  EXPECT_EQ(on_device.load.host_peak_bytes, 0);
  EXPECT_TRUE(on_host.load.quantized_on_host);
  EXPECT_EQ(on_host.load.host_peak_bytes, on_device.load.device_peak_bytes);
  EXPECT_LT(on_host.load.device_peak_bytes, on_device.load.device_peak_bytes - (int64_t{2} << 30));
  EXPECT_GT(on_host.load.device_peak_bytes, on_host.weight_bytes);  // T5 in bf16 beside the quantized base
}

// The GPU-scale OOM pairs (configs/oom/gpu_*.yaml, run by scripts/gpu/check.sh) say where they run out; the
// estimate holds them to it: each loads under its cap, GC off at 1024² does not fit 24 GiB and GC full fits
// at every resolution, and the preview pair's step fits while its whole-image decode does not and the tiled
// one does.
TEST(Estimate, TheGpuScalePairsRunOutWhereTheySay) {
  const std::string dir = std::string(GCLAB_SOURCE_DIR) + "/configs/oom/";
  const auto gc = estimate_memory(load(dir + "gpu_flux_gc_off_24gb.yaml"));
  EXPECT_LT(gc.load.device_peak_bytes, gc.cap_bytes);
  EXPECT_GT(gc.resolutions.back().gc_off.total_bytes, gc.cap_bytes);
  for (const auto& r : estimate_memory(load(dir + "gpu_flux_gc_on_24gb.yaml")).resolutions)
    EXPECT_LT(r.gc_full.total_bytes, gc.cap_bytes) << r.resolution;
  const auto whole = estimate_memory(load(dir + "gpu_flux_preview_decode.yaml"));
  const auto tiled = estimate_memory(load(dir + "gpu_flux_preview_decode_fixed.yaml"));
  for (const auto* e : {&whole, &tiled}) {
    EXPECT_LT(e->load.device_peak_bytes, e->cap_bytes);
    ASSERT_EQ(e->resolutions.size(), 1u);
    EXPECT_LT(e->resolutions[0].gc_full.total_bytes, e->cap_bytes);
    ASSERT_TRUE(e->preview.has_value());
  }
  EXPECT_GT(whole.preview->total_bytes, whole.cap_bytes);
  EXPECT_LT(tiled.preview->total_bytes, tiled.cap_bytes);
  // The frames pair (Wan 2.1 14B, GC on): both load under the cap (quantized blocks parked while UMT5 loads);
  // 41 frames run out in the checkpointed forward, 21 fit every phase.
  const auto many = estimate_memory(load(dir + "gpu_wan21_14b_frames_24gb.yaml"));
  const auto fewer = estimate_memory(load(dir + "gpu_wan21_14b_frames_24gb_fixed.yaml"));
  for (const auto* e : {&many, &fewer}) {
    EXPECT_LT(e->load.device_peak_bytes, e->cap_bytes);
    ASSERT_EQ(e->resolutions.size(), 1u);
  }
  EXPECT_EQ(many.resolutions[0].frames, 41);
  EXPECT_GT(many.resolutions[0].gc_full.phases.at(memory::Phase::forward), many.cap_bytes);
  EXPECT_LT(many.resolutions[0].gc_full.phases.at(memory::Phase::data), many.cap_bytes);
  EXPECT_LT(fewer.resolutions[0].gc_full.total_bytes, fewer.cap_bytes);
  // The klein pair (FLUX.2 klein 4B with a 1024² reference image): both load under the cap; GC off runs out in
  // the forward, GC on fits every phase; without the control images GC off needs less by the reference's tokens.
  const auto klein_off = estimate_memory(load(dir + "gpu_flux2_klein_4b_edit_24gb.yaml"));
  const auto klein_on = estimate_memory(load(dir + "gpu_flux2_klein_4b_edit_24gb_fixed.yaml"));
  const auto klein_plain =
      estimate_memory(load(dir + "gpu_flux2_klein_4b_edit_24gb.yaml", {"datasets.0.control_path=[]"}));
  for (const auto* e : {&klein_off, &klein_on}) {
    EXPECT_LT(e->load.device_peak_bytes, e->cap_bytes);
    ASSERT_EQ(e->resolutions.size(), 1u);
  }
  EXPECT_GT(klein_off.resolutions[0].gc_off.phases.at(memory::Phase::forward), klein_off.cap_bytes);
  EXPECT_LT(klein_on.resolutions[0].gc_full.total_bytes, klein_on.cap_bytes);
  EXPECT_LT(klein_plain.resolutions[0].gc_off.total_bytes, klein_off.resolutions[0].gc_off.total_bytes);
}

// AI Toolkit's Qwen-Image 24 GB config stores the transformer as uint3 (its accuracy-recovery adapter not
// counted yet): the packed weights are well under half of float8's, the checkpointed steps and the first
// preview fit the card, and with checkpointing off every block also keeps its Linears' dequantized bf16
// weights for the backward — exactly the ledger's extra term over the float8 base.
TEST(Estimate, TheQwenImage24GbConfigsUint3BaseIsPackedAndItsDequantizedCopiesAreCounted) {
  const std::string path = std::string(GCLAB_SHARED_DIR) + "/aitk-configs/train_lora_qwen_image_24gb.yaml";
  const auto uint3 = estimate_memory(load(path, {"vram_cap=24GB"}));
  const auto float8 = estimate_memory(load(path, {"vram_cap=24GB", "model.qtype=qfloat8"}));
  EXPECT_LT(uint3.weight_bytes, float8.weight_bytes / 2);
  ASSERT_EQ(uint3.resolutions.size(), float8.resolutions.size());
  train::Session meta(load(path), train::SessionOptions{/*meta=*/true});
  int64_t dequantized = 0;
  for (int64_t b : model::dequantized_weight_bytes(meta.model(), /*conditioning_grad=*/false)) dequantized += b;
  // 13.6 G block weights in bf16 (the 6.8 G of img_mod / txt_mod take the conditioning: no gradient)
  EXPECT_GT(dequantized, int64_t{25} << 30);
  for (size_t i = 0; i < uint3.resolutions.size(); ++i) {
    const auto& r = uint3.resolutions[i];
    EXPECT_LT(r.gc_full.total_bytes, uint3.cap_bytes) << r.resolution;
    EXPECT_EQ(r.gc_off.activation_bytes - float8.resolutions[i].gc_off.activation_bytes, dequantized) << r.resolution;
  }
  ASSERT_TRUE(uint3.preview.has_value());
  EXPECT_LT(uint3.preview->total_bytes, uint3.cap_bytes);
  // Its accuracy-recovery adapter (a Hub name here: built at rank 16) sits on the 60 x 14 block Linears,
  // which alone are uint3; the extras stay bf16. Against the same qtype without the adapter, the weights
  // differ by exactly the adapter and the extras' unquantized bytes.
  const auto bare = estimate_memory(load(path, {"vram_cap=24GB", "model.qtype=uint3"}));
  int64_t adapters = 0, adapter_bytes = 0, extras_bf16 = 0;
  for (auto& [name, linear] : nn::named_linears(meta.model())) {
    if (linear->has_recovery_adapter()) {
      ++adapters;
      adapter_bytes += 2 * model::kRecoveryAdapterRank * (linear->in_features() + linear->out_features());
    } else {
      EXPECT_EQ(linear->weight.scalar_type(), torch::kBFloat16) << name;  // unquantized
      for (const auto& t : linear->parameters()) extras_bf16 += static_cast<int64_t>(t.nbytes());
    }
  }
  EXPECT_EQ(adapters, 60 * 14);
  // The extras' bytes as the adapter-less uint3 run stores them (packed where their width groups).
  train::Session bare_meta(load(path, {"model.qtype=uint3"}), train::SessionOptions{/*meta=*/true});
  int64_t extras_uint3 = 0;
  for (auto& [name, linear] : nn::named_linears(bare_meta.model())) {
    if (name.rfind("transformer_blocks.", 0) == 0) continue;
    for (const auto& t : linear->parameters()) extras_uint3 += static_cast<int64_t>(t.nbytes());
    for (const auto& t : linear->buffers()) extras_uint3 += static_cast<int64_t>(t.nbytes());
  }
  EXPECT_EQ(uint3.weight_bytes - bare.weight_bytes, adapter_bytes + extras_bf16 - extras_uint3);
}

TEST(Estimate, EightBitStateIsAQuarterOfAdamWsAndQuantizeHalvesTheWeights) {
  const auto eight = estimate_memory(flux_24gb());
  const auto full = estimate_memory(flux_24gb({"train.optimizer=adamw"}));
  EXPECT_NEAR(static_cast<double>(eight.optimizer_bytes) / static_cast<double>(full.optimizer_bytes), 0.25, 0.01);
  const auto bf16 = estimate_memory(flux_24gb({"model.quantize=false"}));
  EXPECT_NEAR(static_cast<double>(eight.weight_bytes) / static_cast<double>(bf16.weight_bytes), 0.5, 0.01);
}

// The weights are counted in the dtype the run holds them in. A bf16 full fine-tune holds bf16 weights and
// gradients, as AI Toolkit does (no float32 master copy), AdamW's two moments bf16 too, Adafactor's float32
// factored ones far smaller; the first step's forward and backward run before the optimizer's state exists.
TEST(Estimate, WeightsInTheirRealDtype) {
  const auto lora = estimate_memory(flux_24gb({"model.quantize=false"}));
  const auto fp32 = estimate_memory(flux_24gb({"model.quantize=false", "train.dtype=fp32"}));
  EXPECT_NEAR(static_cast<double>(fp32.weight_bytes) / static_cast<double>(lora.weight_bytes), 2.0, 0.02);
  const auto full = estimate_memory(flux_24gb({"model.quantize=false", "network=null", "train.optimizer=adamw"}));
  EXPECT_NEAR(static_cast<double>(full.weight_bytes) / static_cast<double>(lora.weight_bytes), 1.0, 0.02);
  EXPECT_EQ(full.gradient_bytes, full.trained_bytes);
  EXPECT_NEAR(static_cast<double>(full.trained_bytes) / static_cast<double>(full.weight_bytes), 1.0, 0.01);
  EXPECT_EQ(full.optimizer_bytes, 2 * full.trained_bytes);
  const auto adafactor =
      estimate_memory(flux_24gb({"model.quantize=false", "network=null", "train.optimizer=adafactor"}));
  EXPECT_LT(adafactor.optimizer_bytes * 50, full.optimizer_bytes);
  const auto& cell = full.resolutions.back().gc_off;
  EXPECT_EQ(cell.phases.at(memory::Phase::backward) - cell.first_phases.at(memory::Phase::backward),
            full.optimizer_bytes);
  EXPECT_EQ(cell.phases.at(memory::Phase::optimizer), cell.first_phases.at(memory::Phase::optimizer));
}

// The estimate against what a real step measures on the CPU (exact accounting): every tiny preset, LoRA
// and full training, GC off and full, within 10% of the step's peak.
TEST(Estimate, WithinTenPercentOfAMeasuredStepForEveryTinyPreset) {
  const fs::path dir = testing::fresh_dir("estimate_vs_run");
  // The estimate counts text for a 77-token prompt (estimate_activations' default, CLIP's window); the
  // steps measured here use one: 76 words and the stand-in tokenizer's end token.
  std::string prompt = "word";
  for (int i = 1; i < 76; ++i) prompt += " word" + std::to_string(i);
  for (const char* arch :
       {"tiny-flux", "tiny-qwen-image", "tiny-qwen-image-edit", "tiny-zimage", "tiny-sd3", "tiny-dit"})
    for (const char* network : {"lora", "none"})
      for (const char* policy : {"off", "full"}) {
        const std::string yaml =
            std::string("name: e\ntraining_folder: ") + dir.string() +
            "\ndevice: cpu\ndatasets:\n  - folder_path: " + dir.string() +
            "\n    resolution: [256]\ntrain: {batch_size: 2, steps: 2, dtype: fp32, checkpoint_policy: " + policy +
            "}\nmodel: {arch: " + arch + ", vae: dct}\nsample: {prompts: [\"" + prompt + "\"]}\n" +
            (std::string(network) == "lora" ? "network: {type: lora, linear: 8}\n" : "");
        auto r = model::load_config_text(yaml, "e.yaml");
        ASSERT_TRUE(r.ok()) << r.diagnostics.all().front().format();
        const train::MemoryModel model(*r.config);
        const auto& e = model.estimate();
        int64_t measured = 0, text_tokens = 0;
        {
          train::Session session(*r.config);
          measured = testing::synthetic_step_peak(session, 2, 2, 256, &text_tokens);
        }
        // The step predicted for the text length it ran with, as a run records it: the estimate's cells assume
        // a nominal 77-token caption, where the stand-in tokenizer makes 222 tokens of the 76 words — which the
        // edit pipelines keep whole (the others cut them at max_text_tokens: 64 for the tiny presets).
        const bool off = std::string(policy) == "off";
        const ckpt::CheckpointPolicy p = off ? ckpt::CheckpointPolicy::off() : ckpt::CheckpointPolicy::full();
        const auto predicted = model.step({2, 1, 256, 256}, p, text_tokens);
        EXPECT_EQ((off ? e.resolutions[0].gc_off : e.resolutions[0].gc_full).total_bytes,
                  model.step({2, 1, 256, 256}, p).total_bytes);
        const double ratio = static_cast<double>(predicted.total_bytes) / static_cast<double>(measured);
        std::printf(
            "%-22s %-5s %-4s predicted %10lld measured %10lld ratio %.3f  (resident %lld batch %lld act %lld ws "
            "%lld)\n",
            arch, network, policy, static_cast<long long>(predicted.total_bytes), static_cast<long long>(measured),
            ratio, (long long)e.resident_bytes, (long long)predicted.batch_bytes, (long long)predicted.activation_bytes,
            (long long)predicted.backward_bytes);
        EXPECT_NEAR(ratio, 1.0, 0.10) << arch << " " << network << " " << policy;
      }
  fs::remove_all(dir);
}

// Two training steps of batches of two 256² synthetic images (the second with the optimizer's state), then a
// preview: the second step's phase peaks and the preview's.
struct MeasuredPhases {
  std::map<train::Phase, int64_t> step;
  int64_t sample = 0;
};
MeasuredPhases two_steps_and_a_preview(train::Session& session, const fs::path& dir) {
  MeasuredPhases out;
  for (int step = 0; step < 2; ++step) {
    session.phases().clear();
    session.train_step(step, [&] { return session.synthetic_batch({2, 1, 256, 256}); });
  }
  out.step = session.phases().peaks();
  session.phases().clear();
  session.sample(1, dir);
  out.sample = session.phases().peaks().at(train::Phase::sample);
  return out;
}

// With the autoencoder encoding on the fly, the step's `data` phase holds the images and the encode's peak
// on top of the resident weights (the autoencoder's included); a preview decodes at sample.width x height.
// Both as estimate_memory predicts them, against the tracking allocator (tiny FLUX, its tiny autoencoder).
TEST(Estimate, TheAutoencodersEncodeAndDecodeAreInTheEstimate) {
  const fs::path dir = testing::fresh_dir("estimate_vae");
  for (const char* network : {"lora", "none"}) {
    const std::string yaml = std::string("name: v\ntraining_folder: ") + dir.string() +
                             "\ndevice: cpu\ndatasets:\n  - folder_path: " + dir.string() +
                             "\n    resolution: [256]\ntrain: {batch_size: 2, steps: 2, dtype: fp32}\n"
                             "model: {arch: tiny-flux}\nsample: {width: 512, height: 512, sample_steps: 1, "
                             "guidance_scale: 1, prompts: [\"a red circle\"]}\n" +
                             (std::string(network) == "lora" ? "network: {type: lora, linear: 8}\n" : "");
    auto r = model::load_config_text(yaml, "v.yaml");
    ASSERT_TRUE(r.ok()) << r.diagnostics.all().front().format();
    const auto e = estimate_memory(*r.config);
    ASSERT_GT(e.vae_bytes, 0);
    ASSERT_TRUE(e.preview);
    train::Session session(*r.config);
    EXPECT_EQ(session.resident().vae, e.vae_bytes);
    const MeasuredPhases measured = two_steps_and_a_preview(session, dir);
    const int64_t data_peak = measured.step.at(train::Phase::data), sample_peak = measured.sample;
    const int64_t predicted_data = e.resident_bytes - e.gradient_bytes + e.resolutions[0].gc_off.encode_bytes;
    std::printf("%s: data phase predicted %lld measured %lld; preview predicted %lld (decode %lld) measured %lld\n",
                network, (long long)predicted_data, (long long)data_peak, (long long)e.preview->total_bytes,
                (long long)e.preview->decode_bytes, (long long)sample_peak);
    EXPECT_NEAR(static_cast<double>(predicted_data) / static_cast<double>(data_peak), 1.0, 0.01) << network;
    EXPECT_NEAR(static_cast<double>(e.preview->total_bytes) / static_cast<double>(sample_peak), 1.0, 0.02) << network;
  }
  fs::remove_all(dir);
}

// A preview whose denoising makes its peak (the DCT stand-in decodes almost nothing): the sampler's step
// walked on the meta model (train/predict.cpp walk_preview_denoise) against the tracking allocator, for each
// family with guidance (CFG where the family runs it: the prompt and its empty negative differ in length, so
// the sampler runs them as two passes; Qwen-Image always does).
TEST(Estimate, ThePreviewsDenoisingIsWalked) {
  const fs::path dir = testing::fresh_dir("estimate_denoise");
  for (const char* arch : {"tiny-flux", "tiny-qwen-image", "tiny-zimage", "tiny-sd3", "tiny-dit"}) {
    const std::string yaml = std::string("name: d\ntraining_folder: ") + dir.string() +
                             "\ndevice: cpu\ndatasets:\n  - folder_path: " + dir.string() +
                             "\n    resolution: [256]\ntrain: {batch_size: 2, steps: 2, dtype: fp32}\n"
                             "model: {arch: " +
                             arch +
                             ", vae: dct}\nsample: {width: 256, height: 256, "
                             "sample_steps: 2, guidance_scale: 4, prompts: [\"a red circle on a blue square\"]}\n";
    auto r = model::load_config_text(yaml, "d.yaml");
    ASSERT_TRUE(r.ok()) << r.diagnostics.all().front().format();
    const auto e = estimate_memory(*r.config);
    ASSERT_TRUE(e.preview);
    train::Session session(*r.config);
    const MeasuredPhases measured = two_steps_and_a_preview(session, dir);
    std::printf("%-16s preview predicted %lld (denoise %lld, decode %lld, text %lld) measured %lld (%.4f)\n", arch,
                (long long)e.preview->total_bytes, (long long)e.preview->denoise_bytes,
                (long long)e.preview->decode_bytes, (long long)e.preview->text_encode_bytes, (long long)measured.sample,
                static_cast<double>(e.preview->total_bytes) / static_cast<double>(measured.sample));
    EXPECT_GT(e.preview->denoise_bytes, std::max(e.preview->decode_bytes, e.preview->text_encode_bytes)) << arch;
    EXPECT_NEAR(static_cast<double>(e.preview->total_bytes) / static_cast<double>(measured.sample), 1.0, 0.02) << arch;
  }
  fs::remove_all(dir);
}

// With the text encoders resident (captions encoded every step), the step's `text` phase holds the batch's
// latents and one caption's encode (text/memory.h) beside the resident weights, and a preview encodes its
// prompts in the `sample` phase: both as estimate_memory predicts them, against the tracking allocator. A
// tiny FLUX whose T5 has a wide feed-forward (the OOM lab's), so that the encode is what makes both peaks.
TEST(Estimate, TheTextEncodersEncodeIsInTheEstimate) {
  const fs::path dir = testing::fresh_dir("estimate_text");
  const std::string yaml = std::string("name: t\ntraining_folder: ") + dir.string() +
                           "\ndevice: cpu\ndatasets:\n  - folder_path: " + dir.string() +
                           "\n    resolution: [256]\ntrain: {batch_size: 2, steps: 2, dtype: fp32}\n"
                           "model: {arch: tiny-flux, vae: dct, name_or_path: " GCLAB_SOURCE_DIR
                           "/configs/oom/models/flux_wide_t5}\nsample: {width: 256, height: 256, sample_steps: 1, "
                           "guidance_scale: 1, prompts: [\"a red circle\"]}\n";
  auto r = model::load_config_text(yaml, "t.yaml");
  ASSERT_TRUE(r.ok()) << r.diagnostics.all().front().format();
  const auto e = estimate_memory(*r.config);
  ASSERT_TRUE(e.text && e.text->every_step);
  ASSERT_TRUE(e.preview);
  EXPECT_GT(e.text->encode_bytes, int64_t{4} << 20);  // the wide feed-forward: 3 x [32, 16384] floats
  train::Session session(*r.config);
  const MeasuredPhases measured = two_steps_and_a_preview(session, dir);
  const int64_t text_peak = measured.step.at(train::Phase::text), sample_peak = measured.sample;
  const int64_t predicted_text = e.resident_bytes - e.gradient_bytes + e.resolutions[0].gc_full.text_bytes;
  std::printf("text phase predicted %lld measured %lld; preview predicted %lld (text encode %lld) measured %lld\n",
              (long long)predicted_text, (long long)text_peak, (long long)e.preview->total_bytes,
              (long long)e.preview->text_encode_bytes, (long long)sample_peak);
  EXPECT_NEAR(static_cast<double>(predicted_text) / static_cast<double>(text_peak), 1.0, 0.02);
  EXPECT_EQ(e.preview->text_encode_bytes, e.text->encode_bytes);  // FLUX pads every prompt to the same length
  EXPECT_NEAR(static_cast<double>(e.preview->total_bytes) / static_cast<double>(sample_peak), 1.0, 0.02);
  fs::remove_all(dir);
}

// gclab bench on a tiny model: every cell measured; GC full keeps less than GC off; under a cap the
// cells that do not fit are reported as OOM, not crashed on.
TEST(Bench, PoliciesSideBySideAndOomCellsUnderACap) {
  BenchOptions b;
  b.policies = policies({"off", "full", "every:2"});
  b.resolutions = {256, 512};
  b.steps = 1;
  {
    train::Session session(load(std::string(GCLAB_SOURCE_DIR) + "/configs/quickstart.yaml", {"train.batch_size=2"}));
    const auto rows = run_bench(session, b);
    ASSERT_EQ(rows.size(), 6u);
    for (const auto& row : rows) {
      EXPECT_FALSE(row.oom);
      EXPECT_GT(row.step_ms, 0);
    }
    EXPECT_LT(rows[4].peak_bytes, rows[3].peak_bytes);  // 512: full below off
    EXPECT_LT(rows[4].peak_ratio, 1.0);
    // The theory beside the measure: GC off's forward alone is timed, shorter than its step; full recomputes
    // every block (1 + t_fwd / t_step), every:2 some of them, off none.
    for (const size_t off : {0u, 3u}) {
      EXPECT_GT(rows[off].forward_ms, 0);
      EXPECT_LT(rows[off].forward_ms, rows[off].step_ms);
      EXPECT_DOUBLE_EQ(rows[off].theory_ratio, 1.0);
      EXPECT_DOUBLE_EQ(rows[off + 1].theory_ratio, 1 + rows[off].forward_ms / rows[off].step_ms);
      EXPECT_GT(rows[off + 2].theory_ratio, 1.0);
      EXPECT_LT(rows[off + 2].theory_ratio, rows[off + 1].theory_ratio);
    }
  }
  train::Session capped(
      load(std::string(GCLAB_SOURCE_DIR) + "/configs/quickstart.yaml", {"train.batch_size=2", "vram_cap=100MiB"}));
  b.resolutions = {512};
  b.policies = policies({"off", "full"});
  const auto under_cap = run_bench(capped, b);
  EXPECT_TRUE(under_cap[0].oom);
  EXPECT_FALSE(under_cap[1].oom);
}

// bench --caps: auto timed under caps a quarter and three quarters of the way from full's predicted peak to
// GC off's, each within its cap, the looser cap's plan recomputing no more (and less than full); every row's
// recomputed share in FLOPs (off 0, full 1); the CSV quotes the plans' commas, the page draws the caps.
TEST(Bench, AutoUnderCapsBetweenFullAndOffFitsEachCap) {
  BenchOptions b;
  b.policies = policies({"off", "full", "auto"});
  b.resolutions = {512};
  b.steps = 1;
  b.caps = {"25%", "75%"};
  train::Session session(load(std::string(GCLAB_SOURCE_DIR) + "/configs/quickstart.yaml", {"train.batch_size=2"}));
  const auto rows = run_bench(session, b);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].recomputed_share, 0);
  EXPECT_DOUBLE_EQ(rows[1].recomputed_share, 1);
  for (const size_t k : {2u, 3u}) {
    const BenchRow& r = rows[k];
    EXPECT_EQ(r.policy, "auto");
    EXPECT_EQ(r.cap, k == 2 ? "25%" : "75%");
    EXPECT_FALSE(r.oom) << r.applied;
    EXPECT_LE(r.peak_bytes, r.cap_bytes) << r.applied;
    EXPECT_GT(r.cap_bytes, rows[1].peak_bytes);
    EXPECT_LT(r.cap_bytes, rows[0].peak_bytes);
    EXPECT_NE(r.applied, "auto");
    EXPECT_GT(r.theory_ratio, 1.0);
  }
  EXPECT_LT(rows[3].recomputed_share, 1.0) << rows[3].applied;
  EXPECT_LE(rows[3].recomputed_share, rows[2].recomputed_share);
  const fs::path dir = testing::fresh_dir("bench_caps");
  write_bench_csv(dir / "bench.csv", rows);
  std::ifstream csv(dir / "bench.csv");
  std::string header, line;
  std::getline(csv, header);
  EXPECT_NE(header.find(",cap,cap_bytes,applied,recomputed_share"), std::string::npos) << header;
  int quoted = 0;
  while (std::getline(csv, line)) quoted += line.find(",\"75%\",") != std::string::npos ? 1 : 0;
  EXPECT_EQ(quoted, 1);
  write_bench_page(dir / "bench.html", rows, 0);
  std::ifstream page(dir / "bench.html");
  const std::string html((std::istreambuf_iterator<char>(page)), std::istreambuf_iterator<char>());
  EXPECT_NE(html.find("cap 25%"), std::string::npos);
  EXPECT_NE(html.find("auto under 75%"), std::string::npos);
  fs::remove_all(dir);
}

// gclab fit on one Session: the batch it finds trains for two steps under the same cap with `gclab
// train`, and one more does not — fit runs the step the trainer runs, with all it keeps resident.
TEST(Fit, TheBatchFitFindsTrainsUnderTheSameCapAndOneMoreDoesNot) {
  const fs::path dir = testing::fresh_dir("fit_vs_train");
  data::SynthOptions so;
  so.count = 12;
  so.sizes = {{256, 256}};
  data::write_synthetic_dataset(dir / "data", so);
  auto config_for = [&](const std::string& name, const std::string& policy, int batch) {
    const std::string yaml = "name: " + name + "\ntraining_folder: " + dir.string() +
                             "\ndevice: cpu\nvram_cap: 60MiB\nnetwork: {type: lora, linear: 8}\n"
                             "save: {dtype: float32, save_every: 1000}\n"
                             "datasets:\n  - folder_path: " +
                             (dir / "data").string() +
                             "\n    resolution: [256]\ntrain: {batch_size: " + std::to_string(batch) +
                             ", steps: 2, dtype: fp32, lr: 1e-4, oom_policy: abort, checkpoint_policy: " + policy +
                             "}\nmodel: {arch: tiny-flux, vae: dct}\n";
    auto r = model::load_config_text(yaml, "fit.yaml");
    if (!r.ok()) throw std::runtime_error(r.diagnostics.all().front().format());
    return *r.config;
  };
  std::vector<FitRow> rows;
  {
    train::Session session(config_for("fit", "full", 1));
    rows = run_fit(session, policies({"off", "full", "auto"}), {256}, 16);
  }
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_GT(rows[1].largest, rows[0].largest);
  // auto, decided at each batch under the cap: at least GC off's batch, and where only full fits it is full.
  EXPECT_GE(rows[2].largest, rows[0].largest);
  EXPECT_GE(rows[2].largest, rows[1].largest - 1);
  // Its prediction: the largest batch whose plan fits the cap less auto's margin — at most the measured one.
  EXPECT_GE(rows[2].predicted, rows[0].predicted);
  EXPECT_LE(rows[2].predicted, rows[2].largest);
  rows.pop_back();
  for (const auto& row : rows) {
    ASSERT_GE(row.largest, 1) << row.policy;
    // The memory model's largest batch beside the measured one.
    std::printf("fit %s: largest batch %d measured, %d predicted\n", row.policy.c_str(), row.largest, row.predicted);
    EXPECT_NEAR(row.predicted, row.largest, 1) << row.policy;
    EXPECT_NO_THROW(train::train(config_for("fits_" + row.policy, row.policy, row.largest), {})) << row.policy;
    EXPECT_THROW(train::train(config_for("over_" + row.policy, row.policy, row.largest + 1), {}),
                 train::OutOfMemoryStop)
        << row.policy << " batch " << row.largest + 1;
  }
  fs::remove_all(dir);
}

// step_flops counts what a hand count of DiT's blocks gives: per block qkv (3D²), proj (D²), fc1 and fc2
// (4D² each) on every token, the adaLN modulation (6D²) on one vector a sample, attention 4·N²·D;
// forward + input backward for a LoRA run, + weight backward for full training.
TEST(Flops, StepFlopsMatchAHandCountOfDiT) {
  auto config_for = [](const std::string& network) {
    auto r = model::load_config_text(
        "name: f\ndevice: cpu\ndatasets:\n  - folder_path: /tmp\n    resolution: [256]\n"
        "train: {batch_size: 2}\nmodel: {arch: tiny-dit}\n" +
            network,
        "f.yaml");
    if (!r.ok()) throw std::runtime_error(r.diagnostics.all().front().format());
    return *r.config;
  };
  train::Session full(config_for(""));
  const double D = 128, N = 256, B = 2, blocks = 2;
  const double forward =
      blocks * (2 * B * N * (3 * D * D + D * D + 4 * D * D + 4 * D * D) + 2 * B * 6 * D * D + 4 * B * N * N * D);
  EXPECT_NEAR(step_flops(full, full.block_activations({2, 1, 256, 256})) / (3 * forward), 1.0, 1e-9);
  train::Session lora(config_for("network: {type: lora, linear: 4}\n"));
  EXPECT_NEAR(step_flops(lora, lora.block_activations({2, 1, 256, 256})) / (2 * forward), 1.0, 1e-9);
  EXPECT_EQ(peak_bf16_flops("NVIDIA H200"), 989.4e12);
  EXPECT_EQ(peak_bf16_flops("a mystery card"), 0);
}

// The two streams of FLUX's double blocks: the image Linears on the image tokens, the text Linears (add_*
// projections, to_add_out, the text MLP) on the text tokens, each stream's modulation on one vector, joint
// attention over both; the single blocks on the joint sequence.
TEST(Flops, StepFlopsMatchAHandCountOfFluxsTwoStreams) {
  auto r = model::load_config_text(
      "name: f\ndevice: cpu\ndatasets:\n  - folder_path: /tmp\n    resolution: [256]\n"
      "train: {batch_size: 2}\nmodel: {arch: tiny-flux}\n",
      "f.yaml");
  ASSERT_TRUE(r.ok());
  train::Session full(*r.config);
  const auto est = full.block_activations({2, 1, 256, 256});
  const double D = 128, M = 512, B = 2, n = static_cast<double>(est.image_tokens);
  const double t = static_cast<double>(est.text_tokens), s = n + t;
  const double stream = 3 * D * D + D * D + 2 * D * M;  // q, k, v, out; the MLP
  const double dbl = 2 * B * (n * stream + t * stream + 2 * 6 * D * D) + 4 * B * s * s * D;
  const double single = 2 * B * (3 * D * D + s * (3 * D * D + D * M + (D + M) * D)) + 4 * B * s * s * D;
  EXPECT_NEAR(step_flops(full, est) / (3 * (2 * dbl + 2 * single)), 1.0, 1e-9);
}

// What check, estimate, bench and fit print is built as data: the YAML print reads back (yaml-cpp) as
// exactly the JSON print, comments and all, and the figures are typed.
TEST(Reports, TheYamlPrintReadsBackAsTheJsonPrint) {
  const auto config = flux_24gb({"vram_cap=24GB"});
  BenchRow cell;
  cell.policy = "full", cell.resolution = 512, cell.batch = 2, cell.step_ms = 12.5, cell.peak_bytes = 1 << 20;
  BenchRow oom = cell;
  oom.policy = "off", oom.oom = true, oom.oom_phase = "forward";
  FitRow fit{"full", 512, "batch", 7, 7, int64_t{57} << 20};
  Document check = config_report(config);
  check.append(model_summary_report(model::summarize_model(config)));
  check.append(autoencoder_report(config));
  check.append(text_encoders_report(config));
  check.append(load_report(estimate_load(config), config.vram_cap.bytes));
  check.append(bucket_report(config));
  const Document estimate = estimate_report(estimate_memory(config));
  for (const Document* d : {static_cast<const Document*>(&check), &estimate}) {
    const std::string yaml = d->yaml();
    EXPECT_NE(yaml.find("  # "), std::string::npos) << "comments for people";
    YAML::Node node;
    ASSERT_NO_THROW(node = YAML::Load(yaml)) << yaml;
    EXPECT_EQ(yaml_value(node), nlohmann::ordered_json::parse(d->json())) << yaml;
  }
  for (const Document& d : {bench_report({cell, oom}), fit_report({fit})}) {
    EXPECT_EQ(d.yaml().rfind("# |", 0), 0u) << "the table first, as comments";
    EXPECT_EQ(yaml_value(YAML::Load(d.yaml())), nlohmann::ordered_json::parse(d.json())) << d.yaml();
  }
  EXPECT_EQ(estimate.value["estimate"]["preset"], "flux-dev");
  EXPECT_TRUE(estimate.value["estimate"]["weights"].is_number_integer());
  EXPECT_EQ(estimate.value["estimate"]["per_resolution"].size(), 3u);
  EXPECT_TRUE(estimate.value["estimate"]["load"]["device_peak"].is_number_integer());
  const Document bench = bench_report({cell, oom});
  EXPECT_EQ(bench.value["bench"][1]["oom"], true);
  EXPECT_EQ(yaml_value(YAML::Load(bench.yaml()))["bench"][1]["policy"], "off");  // quoted: not YAML's false
  EXPECT_EQ(fit_report({fit}).value["fit"][0]["largest_batch"], 7);
  EXPECT_EQ(check.value["model_summary"]["parameters"], 11901408320);
  EXPECT_TRUE(check.value.contains("train") && check.value.contains("buckets"));
}

}  // namespace
// gclab check's text encoders: FLUX.1-dev's CLIP-L and T5-XXL at their real parameter counts (a meta build),
// their bytes in the training dtype, float8 Linear weights with quantize_te, and whether they stay.
TEST(Report, TheTextEncodersAreCountedAtTheirRealShapes) {
  auto config_of = [](const std::string& extra) {
    const std::string yaml =
        "name: t\ndevice: cpu\ndatasets: [{folder_path: /tmp}]\ntrain: {batch_size: 1, steps: 1, "
        "dtype: bf16" +
        extra + "}\nmodel: {arch: flux, quantize: false}\n";
    auto r = model::load_config_text(yaml, "t.yaml");
    EXPECT_TRUE(r.ok()) << r.diagnostics.all().front().format();
    return *r.config;
  };
  auto encoder = [](const Document& d, size_t slot) {
    const auto& e = d.value["text_encoders"][slot];
    return e["kind"].get<std::string>() + " " + std::to_string(e["parameters"].get<int64_t>()) + " " +
           std::to_string(e["weight_bytes"].get<int64_t>());
  };
  const Document plain = text_encoders_report(config_of(""));
  EXPECT_EQ(encoder(plain, 0), "clip_l 123060480 246120960");
  EXPECT_EQ(encoder(plain, 1), "t5_xxl 4762310656 9524621312");
  EXPECT_EQ(plain.value["text_encoders_on_the_device_during_steps"], true);
  const Document cached = text_encoders_report(config_of(", cache_text_embeddings: true"));
  EXPECT_EQ(cached.value["text_encoders_on_the_device_during_steps"], false);
  auto quantized = config_of("");
  quantized.model.quantize_te = true;
  const Document q = text_encoders_report(quantized);
  // T5-XXL's Linear weights (all but the 32128 x 4096 embedding, the 32 x 64 position buckets and the norms)
  // in one byte each with quanto's bf16 scale per output row (24 blocks: q, k, v, o, wo of 4096 rows, wi_0,
  // wi_1 of 10240), the rest in bf16.
  const int64_t other = 32128 * 4096 + 32 * 64 + 49 * 4096 + 24 * (5 * 4096 + 2 * 10240) * 2;
  EXPECT_EQ(encoder(q, 1), "t5_xxl 4762310656 " + std::to_string(4762310656 + other));
}

}  // namespace gclab::bench
