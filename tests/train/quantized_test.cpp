// A base stored as AI Toolkit's uint2..uint7 (model.quantize with model.qtype uintN): the packed weights
// are what the run holds (the formula's bytes), a LoRA trains on them with the same losses with
// checkpointing on and off, and the activation ledger counts the dequantized weights autograd keeps for
// a block that is not checkpointed — measured against the tracking allocator.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include "../support/oom_advice.h"
#include "../support/test_util.h"
#include "../support/tiny_run.h"
#include "gclab/io/safetensors.h"
#include "gclab/model/lora.h"
#include "gclab/model/quantize.h"
#include "gclab/quant/uintx.h"
#include "gclab/train/oom_report.h"
#include "gclab/train/session.h"
#include "gclab/train/trainer.h"

namespace gclab::train {
namespace {

namespace fs = std::filesystem;
using gclab::testing::tiny_config;

TEST(QuantizedBase, Uint4WeightsAreThePackedBytesAndTheLoraTrainsAlikeWithCheckpointingOnAndOff) {
  const fs::path dir = testing::fresh_dir("quantized_uint4");
  const std::vector<std::string> uint4 = {"model.quantize=true", "model.qtype=uint4", "train.steps=4"};
  int64_t plain = 0, packed = 0, expected_saving = 0, quantized = 0;
  {
    Session s(tiny_config(dir, "plain", {"train.steps=4"}));
    plain = s.resident().weights;
  }
  {
    Session s(tiny_config(dir, "q", uint4));
    packed = s.resident().weights;
    // Every uint4 Linear holds the formula's bytes in place of its float32 weight (the base is float32 here).
    for (auto& [path, linear] : nn::named_linears(s.model()))
      if (nn::uintx_bits(linear->weight_storage()) == 4) {
        ++quantized;
        expected_saving += 4 * linear->out_features() * linear->in_features() -
                           quant::uintx_bytes(linear->out_features(), linear->in_features(), 4, 4);
      }
  }
  EXPECT_GT(quantized, 10);
  EXPECT_EQ(plain - packed, expected_saving);

  const auto on = train(tiny_config(dir, "on", uint4), {});
  const auto off = train(
      tiny_config(dir, "off",
                  {"model.quantize=true", "model.qtype=uint4", "train.steps=4", "train.gradient_checkpointing=false"}),
      {});
  ASSERT_EQ(on.losses.size(), 4u);
  ASSERT_EQ(off.losses.size(), 4u);
  for (size_t i = 0; i < on.losses.size(); ++i) {
    EXPECT_TRUE(std::isfinite(on.losses[i]));
    EXPECT_EQ(on.losses[i], off.losses[i]) << "step " << i + 1;
  }
  fs::remove_all(dir);
}

// uintN (AI Toolkit's dequantize-then-F.linear), float8 (torchao's dequantizing fallback) and int8
// (torchao's mm on the codes cast to the compute dtype) each leave a weight-sized copy with autograd; quanto's
// qfloat8 does not. The walk counts exactly those, and equals the tracking allocator's measurement.
TEST(QuantizedBase, TheWalkCountsTheWeightCopiesAutogradKeepsForEachQtype) {
  const fs::path dir = testing::fresh_dir("quantized_ledger");
  Session plain(tiny_config(dir, "plain"));
  const Session::BlockProbes plain_probe = plain.probe_block_activations();
  const int64_t measured_plain = plain_probe.measured.total_off_bytes,
                walked_plain = plain_probe.walked.total_off_bytes;
  for (const std::string qtype : {"uint3", "float8", "int8", "qfloat8"}) {
    Session q(tiny_config(dir, qtype, {"model.quantize=true", "model.qtype=" + qtype}));
    const auto weights = model::dequantized_weight_bytes(q.model(), /*conditioning_grad=*/false);
    ASSERT_EQ(weights.size(), qtype == "qfloat8" ? 0 : q.model().blocks().size()) << qtype;
    int64_t dequantized = 0;
    for (int64_t w : weights) dequantized += w;
    if (qtype != "qfloat8") {
      EXPECT_GT(dequantized, 0) << qtype;
    }
    const Session::BlockProbes probe = q.probe_block_activations();
    const int64_t measured = probe.measured.total_off_bytes, walked = probe.walked.total_off_bytes;
    EXPECT_EQ(walked - walked_plain, dequantized) << qtype;
    // Measured with nothing checkpointed: the blocks keep the copies beside their activations.
    EXPECT_GE(measured - measured_plain, dequantized * 9 / 10) << qtype;
    EXPECT_NEAR(static_cast<double>(measured) / static_cast<double>(walked), 1.0, 1e-3)
        << qtype << ": " << measured << " " << walked;
  }
  fs::remove_all(dir);
}

// An accuracy-recovery adapter file (model.qtype "uint4|FILE", AI Toolkit's spelling): a frozen LoRA at
// scale 1 beside each Linear it names, those Linears stored as uint4, every other Linear left in its
// dtype (AI Toolkit's "uint8" pass); the run's weights are exactly that, no LoRA file or optimizer sees
// the adapter, and checkpointing on and off train alike through it.
TEST(QuantizedBase, ARecoveryAdapterFileIsAFrozenLoraBesideTheLinearsItNamesTheRestStayUnquantized) {
  const fs::path dir = testing::fresh_dir("quantized_ara");
  const auto plain_config = tiny_config(dir, "plain", {"train.steps=2"});
  // The adapter names the first block's Linears (rank 3, nonzero both ways), as AI Toolkit saves them.
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> written;
  {
    auto m = model::build_transformer(model::spec_for(plain_config.model));
    torch::manual_seed(5);
    for (auto& [path, linear] : nn::named_linears(*m->blocks()[0])) {
      const std::string full = m->block_names()[0] + "." + path;
      const torch::Tensor down = torch::randn({3, linear->in_features()}) * 0.1;
      const torch::Tensor up = torch::randn({linear->out_features(), 3}) * 0.1;
      tensors.emplace_back("transformer." + full + ".lora_A.weight", down);
      tensors.emplace_back("transformer." + full + ".lora_B.weight", up);
      written[full] = {down, up};
    }
  }
  const fs::path file = dir / "ara.safetensors";
  io::save_safetensors(file, tensors);
  const std::vector<std::string> ara = {"model.quantize=true", "model.qtype=uint4|" + file.string(), "train.steps=2"};
  int64_t plain = 0;
  {
    Session s(plain_config);
    plain = s.resident().weights;
  }
  {
    const auto config = tiny_config(dir, "ara", ara);
    EXPECT_EQ(config.model.qtype, config::QType::uint4);
    ASSERT_TRUE(config.model.accuracy_recovery_adapter);
    Session s(config);
    int64_t expected = plain, adapted = 0, quantized = 0;
    for (auto& [path, linear] : nn::named_linears(s.model())) {
      const auto it = written.find(path);
      EXPECT_EQ(linear->has_recovery_adapter(), it != written.end()) << path;
      if (it == written.end()) {
        EXPECT_EQ(linear->weight.scalar_type(), torch::kFloat) << path;  // unquantized
        continue;
      }
      ++adapted;
      const int64_t out = linear->out_features(), in = linear->in_features();
      expected += 4 * 3 * (in + out);  // the adapter, float32 like this base
      if (nn::uintx_bits(linear->weight_storage()) == 4) {
        ++quantized;
        expected -= 4 * out * in - quant::uintx_bytes(out, in, 4, 4);
      }
      // y = x W_q^T + b + up(down(x)) (+ the trained LoRA, still zero)
      torch::NoGradGuard no_grad;
      const torch::Tensor x = torch::randn({2, 5, in});
      const torch::Tensor want =
          torch::nn::functional::linear(x, linear->effective_weight(torch::kFloat), linear->bias) +
          torch::matmul(torch::matmul(x, it->second.first.t()), it->second.second.t());
      EXPECT_TRUE(torch::allclose(linear->forward(x), want, 1e-5, 1e-6)) << path;
    }
    EXPECT_EQ(adapted, static_cast<int64_t>(written.size()));
    EXPECT_GT(quantized, 0);
    EXPECT_EQ(s.resident().weights, expected);
    for (const auto& [name, t] : model::lora_state(s.model(), torch::kFloat))
      EXPECT_EQ(name.find("recovery"), std::string::npos) << name;
  }
  const auto on = train(tiny_config(dir, "on", ara), {});
  auto off_args = ara;
  off_args.push_back("train.gradient_checkpointing=false");
  testing::expect_same_losses(on.losses, train(tiny_config(dir, "off", off_args), {}).losses, 2);
  fs::remove_all(dir);
}

// An adapter that is not a local file (a Hub name: gclab fetches nothing) is built at AI Toolkit's rank 16 on
// every Linear of the blocks, with a zero up-projection (no effect, exact memory); the extras stay in their
// dtype. Frozen on both sides, it keeps no activation for the backward: ledger = allocator still.
TEST(QuantizedBase, AnAdapterNotOnDiskIsBuiltAtRank16OnTheBlocksAndKeepsNoActivations) {
  const fs::path dir = testing::fresh_dir("quantized_ara_random");
  Session q(tiny_config(dir, "q", {"model.quantize=true", "model.qtype=uint3|ostris/adapters/not_here.safetensors"}));
  std::set<std::string> in_blocks;
  for (size_t b = 0; b < q.model().blocks().size(); ++b)
    for (auto& [path, linear] : nn::named_linears(*q.model().blocks()[b]))
      in_blocks.insert(q.model().block_names()[b] + "." + path);
  for (auto& [path, linear] : nn::named_linears(q.model())) {
    ASSERT_EQ(linear->has_recovery_adapter(), in_blocks.count(path) == 1) << path;
    if (!linear->has_recovery_adapter()) {
      EXPECT_EQ(linear->weight.scalar_type(), torch::kFloat) << path;  // unquantized
      continue;
    }
    const torch::Tensor down = linear->named_buffers()["recovery_A"], up = linear->named_buffers()["recovery_B"];
    EXPECT_EQ(down.sizes(), (std::vector<int64_t>{model::kRecoveryAdapterRank, linear->in_features()}));
    EXPECT_EQ(up.sizes(), (std::vector<int64_t>{linear->out_features(), model::kRecoveryAdapterRank}));
    EXPECT_EQ(up.abs().sum().item<double>(), 0.0);
  }
  const Session::BlockProbes probe = q.probe_block_activations();
  const int64_t measured = probe.measured.total_off_bytes, walked = probe.walked.total_off_bytes;
  EXPECT_NEAR(static_cast<double>(measured) / static_cast<double>(walked), 1.0, 1e-3) << measured << " " << walked;
  fs::remove_all(dir);
}

// The OOM report's storage lever, priced by re-planning: an unquantized base gets qfloat8, saving exactly the
// stored bytes it drops (a meta build's: the text encoders quantized with it, as model.quantize does by
// default); a fully checkpointed qfloat8 run gets uint4 — but in the backward a uint base's recomputed block
// also keeps its dequantized weights, so the step saves up to that much less, and where that is more than the
// bits save (a tiny model's four blocks) it is not offered; with checkpointing off no bit step is offered,
// and to a full fine-tune no quantization (it trains the base).
TEST(QuantizedBase, TheOomAdviceOffersTheNextStorageStepWithItsSaving) {
  const fs::path dir = testing::fresh_dir("quantized_advice");
  // tiny-flux's width with 4 + 12 blocks: enough for a bit step to pay for one block's dequantized copy.
  fs::create_directories(dir / "deep" / "transformer");
  std::ofstream(dir / "deep" / "transformer" / "config.json")
      << R"({"_class_name": "FluxTransformer2DModel", "attention_head_dim": 32, "num_attention_heads": 4,
             "num_layers": 4, "num_single_layers": 12, "in_channels": 64, "joint_attention_dim": 64,
             "pooled_projection_dim": 32, "guidance_embeds": true, "axes_dims_rope": [8, 12, 12]})";
  for (const bool deep : {false, true}) {
    std::vector<std::string> base;
    if (deep) base = {"model.name_or_path=" + (dir / "deep").string()};
    auto with = [&](std::vector<std::string> extra) {
      extra.insert(extra.end(), base.begin(), base.end());
      return extra;
    };
    auto advice = [&](std::vector<std::string> extra) {
      return testing::backward_oom_fix(dir, with(std::move(extra)),
                                       {"Quantize the base weights", "Store the base in fewer bits"});
    };
    const auto config = tiny_config(dir, "a", with({}));
    const auto spec = model::spec_for(config.model);
    auto resident = [&](const std::string& qtype) {
      std::vector<std::string> extra;
      if (!qtype.empty()) extra = {"model.quantize=true", "model.qtype=" + qtype};
      return Session(tiny_config(dir, "a", with(extra)), SessionOptions{/*meta=*/true}).resident().total();
    };
    const int64_t fp32 = resident(""), f8 = resident("qfloat8"), u4 = resident("uint4");
    ASSERT_TRUE(fp32 > f8 && f8 > u4);
    const auto plain = advice({});
    ASSERT_TRUE(plain);
    EXPECT_EQ(plain->title, "Quantize the base weights");
    EXPECT_EQ(plain->predicted_saving_bytes, fp32 - f8);
    EXPECT_FALSE(advice({"model.quantize=true", "train.gradient_checkpointing=false"}));
    // A full fine-tune trains the base: quantized it would train nothing of it, so it is not offered.
    auto full = tiny_config(dir, "a", with({}));
    full.network.reset();
    OomContext ctx;
    ctx.phase = Phase::backward, ctx.bucket = "64x64", ctx.batch = 2, ctx.cpu = true, ctx.first_update_step = 1;
    for (const OomFix& f : recommend_fixes(ctx, full, codec_plan(full, spec)))
      EXPECT_TRUE(f.title.find("base") == std::string::npos) << f.title;
    // The largest block's dequantized uint4 weights (float32, kept for the LoRA run's input gradients).
    auto u4_model = model::build_transformer(spec, torch::TensorOptions().device(torch::kMeta));
    config::ModelConfig quantized = config.model;
    quantized.quantize = true, quantized.qtype = config::QType::uint4;
    model::quantize_base(*u4_model, quantized);
    const auto copies = model::dequantized_weight_bytes(*u4_model, /*conditioning_grad=*/false);
    ASSERT_FALSE(copies.empty());
    const int64_t largest_copy = *std::max_element(copies.begin(), copies.end());
    const auto from_f8 = advice({"model.quantize=true"});
    EXPECT_EQ(deep, f8 - u4 > largest_copy) << f8 - u4 << " saved, " << largest_copy << " dequantized";
    // Offered where the step's predicted peak drops: where the bit step pays for a block's dequantized copy
    // (deep), and where the peak is a phase that holds no copy (tiny-flux's: the data phase, its autoencoder
    // encoding on the fly). Never more than the weights it saves; at least that less one block's copy.
    if (deep) {
      ASSERT_TRUE(from_f8);
    }
    if (from_f8) {
      EXPECT_EQ(from_f8->change, "model.qtype: uint4 (from qfloat8)");
      EXPECT_GT(from_f8->predicted_saving_bytes, 0);
      EXPECT_LE(from_f8->predicted_saving_bytes, f8 - u4);
      EXPECT_GE(from_f8->predicted_saving_bytes, f8 - u4 - largest_copy);
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::train
