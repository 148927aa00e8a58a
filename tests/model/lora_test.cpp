#include <gtest/gtest.h>

#include <torch/torch.h>
#include <functional>

#include <algorithm>
#include <filesystem>
#include <set>

#include "gclab/io/safetensors.h"
#include "gclab/memory/tracker.h"
#include "gclab/model/lora.h"
#include "gclab/model/quantize.h"

namespace fs = std::filesystem;

namespace gclab::model {
namespace {

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() / ("gclab_model_" + std::to_string(::getpid()) + "_" + name);
}

TEST(Lora, TargetsEveryBlockLinearAsAiToolkitDoes) {
  auto flux = build_transformer(spec_by_preset("flux-dev"), torch::TensorOptions().device(torch::kMeta));
  EXPECT_EQ(apply_lora(*flux, {16, 16.0}), 19 * 14 + 38 * 6);  // 494 modules in an AI Toolkit FLUX LoRA
  // Rank 16 on every target: 16 * (in + out) each.
  int64_t expected = 0;
  for (const auto& p : flux->named_parameters())
    if (p.key().find("lora_") != std::string::npos) expected += p.value().numel();
  EXPECT_EQ(trainable_parameter_count(*flux), expected);
  EXPECT_GT(expected, 0);
}

// Z-Image's adapters go on its main `layers` only (z_image.py:464-465 get_transformer_block_names, matched
// by toolkit/lora_special.py:531-541 under transformer_only): not on the noise and context refiners.
TEST(Lora, ZImageAdaptersAreOnItsLayersOnlyAsAiToolkitPutsThem) {
  auto z = build_transformer(spec_by_preset("zimage"), torch::TensorOptions().device(torch::kMeta));
  const int adapted = apply_lora(*z, {16, 16.0});
  int in_layers = 0, in_refiners = 0;
  for (size_t b = 0; b < z->blocks().size(); ++b)
    for (auto& [path, linear] : nn::named_linears(*z->blocks()[b])) {
      const bool layer = z->block_names()[b].rfind("layers.", 0) == 0;
      (layer ? in_layers : in_refiners) += 1;
      EXPECT_EQ(linear->has_lora(), layer) << z->block_names()[b] << "." << path;
    }
  EXPECT_EQ(adapted, in_layers);
  EXPECT_GT(in_refiners, 0);
}

// network.network_kwargs and transformer_only as LoRASpecialNetwork.create_modules reads them
// (toolkit/lora_special.py:524-525, 531-533, 570-573): names "transformer.<path>"; ignore_if_contains drops,
// only_if_contains keeps (also matched with '.' as "$$"); transformer_only false adapts every Linear.
TEST(Lora, KeySelectionAsAiToolkitsNetworkKwargsMakeIt) {
  auto count = [](const LoraOptions& o, const std::function<bool(const std::string&)>& expect) {
    auto m = build_transformer(spec_by_preset("tiny-flux"), torch::TensorOptions().device(torch::kMeta));
    const int adapted = apply_lora(*m, o);
    int seen = 0;
    for (auto& [path, linear] : nn::named_linears(*m)) {
      EXPECT_EQ(linear->has_lora(), expect(path)) << path;
      seen += linear->has_lora() ? 1 : 0;
    }
    EXPECT_EQ(adapted, seen);
    return adapted;
  };
  auto in_blocks = [](const std::string& p) { return p.find("transformer_blocks.") != std::string::npos; };
  const int all_blocks = count({4, 4.0}, in_blocks);
  LoraOptions o{4, 4.0};
  o.ignore_if_contains = {"single_transformer_blocks"};
  const int double_only = count(o, [](const std::string& p) { return p.rfind("transformer_blocks.", 0) == 0; });
  EXPECT_LT(double_only, all_blocks);
  o = {4, 4.0};
  o.only_if_contains = {"to_q", "transformer$$transformer_blocks$$0$$"};
  count(o, [](const std::string& p) {
    return p.find("to_q") != std::string::npos || p.rfind("transformer_blocks.0.", 0) == 0;
  });
  o = {4, 4.0};
  o.transformer_only = false;
  const int every = count(o, [](const std::string&) { return true; });
  EXPECT_GT(every, all_blocks);  // the embedders and the output projection too
}

// model.quantize leaves what the arch's AI Toolkit loader leaves: Z-Image's model class keeps its
// embedders and final layer in their dtype (toolkit/models/v2/z_image.py:18-35); FLUX.1's StableDiffusion
// loader passes model.quantize_kwargs (stable_diffusion_model.py:799: the Flex example excludes
// "*time_text_embed*"); Qwen-Image's quantizes every Linear. fnmatch on each Linear's own name.
TEST(Quantize, EachArchLeavesWhatItsAiToolkitLoaderLeaves) {
  EXPECT_TRUE(quantized_by({}, "x_embedder"));
  EXPECT_FALSE(quantized_by({{}, {"t_embedder*"}}, "t_embedder.mlp.0"));
  EXPECT_TRUE(quantized_by({{}, {"t_embedder"}}, "t_embedder.mlp.0"));  // a parent's pattern is not its children's
  EXPECT_FALSE(quantized_by({{"*attn*"}, {}}, "ff.net.0.proj"));
  auto kept = [](const std::string& preset, std::vector<std::string> exclude) {
    auto m = build_transformer(spec_by_preset(preset), torch::TensorOptions().device(torch::kMeta));
    config::ModelConfig c;
    c.quantize = true;
    c.quantize_kwargs.exclude = std::move(exclude);
    const BaseQuantization q = quantize_base(*m, c);
    std::set<std::string> left;
    for (auto& [path, linear] : nn::named_linears(*m))
      if (linear->weight_storage() != WeightStorage::QFloat8) left.insert(path);
    EXPECT_EQ(static_cast<int>(left.size()), q.kept) << preset;
    EXPECT_EQ(static_cast<int>(nn::named_linears(*m).size()), q.kept + q.quantized) << preset;
    return left;
  };
  const auto z = kept("tiny-zimage", {"*"});  // Z-Image's loader passes no quantize_kwargs: "*" is not read
  ASSERT_FALSE(z.empty());
  for (const auto& path : z)
    EXPECT_TRUE(path.rfind("t_embedder", 0) == 0 || path.rfind("cap_embedder", 0) == 0 ||
                path.rfind("all_x_embedder", 0) == 0 || path.rfind("all_final_layer", 0) == 0)
        << path;
  EXPECT_TRUE(kept("tiny-qwen-image", {"*"}).empty());
  // SD3's own branch of the StableDiffusion loader calls quantize(transformer, weights=...) without
  // quantize_kwargs (stable_diffusion_model.py:425-429): every Linear.
  EXPECT_TRUE(kept("tiny-sd3", {"*"}).empty());
  EXPECT_TRUE(kept("tiny-flux", {}).empty());
  const auto flux = kept("tiny-flux", {"*time_text_embed*"});
  ASSERT_FALSE(flux.empty());
  for (const auto& path : flux) EXPECT_NE(path.find("time_text_embed"), std::string::npos) << path;
}

// Gives every adapter a lora_B of N(0, 0.05): adapters that change the output.
void randomize_lora_b(DiffusionTransformer& m) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.named_parameters())
    if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0, 0.05);
}

// model.assistant_lora_path as AI Toolkit keeps an assistant (training) adapter: merged into the base
// for training (the model then computes what the adapted one does), its matrices beside the weights, and
// at multiplier -1 — sampling — the merged update taken back out: the base model's output again.
TEST(Lora, AnAssistantAdapterIsMergedForTrainingAndTakenBackOutForSampling) {
  auto base = [] {
    torch::manual_seed(0);
    return build_transformer(spec_by_preset("tiny-flux"));
  };
  auto m = base();
  const ModelInputs in = m->example_inputs({1, 1, 128, 128});
  const torch::Tensor plain = m->forward(in).detach();
  apply_lora(*m, {4, 4.0});
  randomize_lora_b(*m);
  const torch::Tensor adapted = m->forward(in).detach();
  const fs::path file = temp_file("assistant.safetensors");
  save_lora(*m, file, torch::kFloat, {4, 4.0});

  auto trained = base();
  EXPECT_EQ(attach_assistant_adapter(*trained, file, torch::kFloat), 40);
  EXPECT_FALSE(torch::allclose(plain, adapted, 1e-3, 1e-4));
  EXPECT_TRUE(torch::allclose(trained->forward(in).detach(), adapted, 1e-5, 1e-6));  // training: merged
  set_assistant_adapters(*trained, -1.0, [](const torch::Tensor& t) { return t; });
  EXPECT_TRUE(torch::allclose(trained->forward(in).detach(), plain, 1e-5, 1e-6));  // sampling: taken out
  set_assistant_adapters(*trained, 0.0, [](const torch::Tensor& t) { return t; });
  EXPECT_TRUE(torch::allclose(trained->forward(in).detach(), adapted, 1e-5, 1e-6));
  // Its matrices are buffers: no trained parameter, no LoRA key.
  for (const auto& p : trained->named_parameters()) EXPECT_EQ(p.key().find("assistant"), std::string::npos);
  int64_t buffers = 0;
  for (const auto& b : trained->named_buffers()) buffers += b.key().find("assistant_") != std::string::npos;
  EXPECT_EQ(buffers, 80);
}

TEST(Lora, StartsAsANoOpTrainsOnlyAdaptersAndRoundTripsThroughAFile) {
  torch::manual_seed(0);
  auto m = build_transformer(spec_by_preset("tiny-flux"));
  const ModelInputs in = m->example_inputs({1, 1, 128, 128});
  const torch::Tensor base = m->forward(in).detach();
  const int adapted = apply_lora(*m, {4, 8.0});
  EXPECT_EQ(adapted, 2 * 14 + 2 * 6);
  EXPECT_TRUE(torch::equal(m->forward(in).detach(), base));
  for (const auto& p : m->named_parameters())
    EXPECT_EQ(p.value().requires_grad(), p.key().find("lora_") != std::string::npos) << p.key();
  randomize_lora_b(*m);
  const torch::Tensor adapted_out = m->forward(in).detach();
  EXPECT_FALSE(torch::allclose(adapted_out, base));

  const fs::path file = temp_file("lora.safetensors");
  save_lora(*m, file, torch::kFloat, {4, 8.0});
  const auto saved = io::SafetensorsFile::open(file);
  EXPECT_EQ(saved.entries().size(), 2u * adapted);  // only adapters
  EXPECT_TRUE(saved.contains("transformer.transformer_blocks.0.attn.to_q.lora_A.weight"));
  EXPECT_TRUE(saved.contains("transformer.single_transformer_blocks.1.proj_out.lora_B.weight"));
  EXPECT_EQ(saved.metadata().at("ss_network_dim"), "4");

  torch::manual_seed(0);  // the same base weights, fresh adapters
  auto fresh = build_transformer(spec_by_preset("tiny-flux"));
  apply_lora(*fresh, {4, 8.0});
  load_lora(*fresh, file);
  EXPECT_TRUE(torch::equal(fresh->forward(in).detach(), adapted_out));
  auto other_rank = build_transformer(spec_by_preset("tiny-flux"));
  apply_lora(*other_rank, {8, 8.0});
  EXPECT_THROW(load_lora(*other_rank, file), std::runtime_error);
  fs::remove(file);
}

// A LoRA file merged into the base weights (gclab forward --lora) gives what the model with its adapters
// gives: from gclab's own file (alpha / rank folded into lora_B), and from the same update in kohya naming
// with an .alpha per module; a tensor naming no Linear of the model is refused, by name.
TEST(Lora, AFileMergedIntoTheBaseGivesTheAdaptedOutputInEveryNaming) {
  torch::manual_seed(0);
  auto m = build_transformer(spec_by_preset("tiny-flux"));
  const ModelInputs in = m->example_inputs({1, 1, 128, 128});
  apply_lora(*m, {4, 8.0});  // scale 2
  randomize_lora_b(*m);
  const torch::Tensor adapted = m->forward(in).detach();
  const fs::path file = temp_file("merge.safetensors");
  save_lora(*m, file, torch::kFloat, {4, 8.0});
  EXPECT_EQ(io::SafetensorsFile::open(file).metadata().at("gclab_linear_alpha"), "8.000000");

  auto base = [] {
    torch::manual_seed(0);
    return build_transformer(spec_by_preset("tiny-flux"));
  };
  auto merged = base();
  EXPECT_EQ(merge_lora_file(*merged, file), 40);
  EXPECT_TRUE(torch::allclose(merged->forward(in).detach(), adapted, 1e-5, 1e-6));
  // --lora-scale 0.5: as the adapters with lora_B halved.
  {
    torch::NoGradGuard no_grad;
    for (auto& p : m->named_parameters())
      if (p.key().find("lora_B") != std::string::npos) p.value().mul_(0.5);
  }
  auto half = base();
  merge_lora_file(*half, file, 0.5);
  EXPECT_TRUE(torch::allclose(half->forward(in).detach(), m->forward(in).detach(), 1e-5, 1e-6));

  // kohya naming: lora_transformer_<path with _>.lora_down / lora_up, the unfolded B and alpha = 8.
  std::vector<std::pair<std::string, torch::Tensor>> kohya;
  const auto saved = io::SafetensorsFile::open(file);
  for (const auto& e : saved.entries()) {
    std::string path = e.name.substr(std::string("transformer.").size());
    const bool up = path.find(".lora_B.") != std::string::npos;
    path = path.substr(0, path.find(".lora_"));
    std::replace(path.begin(), path.end(), '.', '_');
    torch::Tensor t = saved.tensor(e.name);
    kohya.emplace_back("lora_transformer_" + path + (up ? ".lora_up.weight" : ".lora_down.weight"), up ? t / 2 : t);
    if (up) kohya.emplace_back("lora_transformer_" + path + ".alpha", torch::tensor(8.0));
  }
  const fs::path kohya_file = temp_file("kohya.safetensors");
  io::save_safetensors(kohya_file, kohya);
  auto from_kohya = base();
  EXPECT_EQ(merge_lora_file(*from_kohya, kohya_file), 40);
  EXPECT_TRUE(torch::allclose(from_kohya->forward(in).detach(), adapted, 1e-5, 1e-6));

  io::save_safetensors(kohya_file,
                       {{"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", torch::zeros({4, 128})}});
  try {
    merge_lora_file(*base(), kohya_file);
    ADD_FAILURE() << "a LoRA for the BFL layout was applied";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("lora_unet_double_blocks_0_img_attn_qkv"), std::string::npos) << e.what();
  }
  fs::remove(file);
  fs::remove(kohya_file);
}

// AI Toolkit trains these families' LoRAs in PEFT format with alpha = rank: scale 1 whatever linear_alpha
// says (toolkit/lora_special.py). gclab does the same; network.use_linear_alpha applies linear_alpha.
TEST(Lora, TheScaleIsOneAsInAiToolkitUnlessUseLinearAlphaAsksForIt) {
  config::NetworkConfig n;
  n.linear = 16, n.linear_alpha = 1.0;  // AI Toolkit's default linear_alpha (= alpha = 1)
  EXPECT_DOUBLE_EQ(lora_options(n).alpha, 16.0);
  n.use_linear_alpha = true;
  EXPECT_DOUBLE_EQ(lora_options(n).alpha, 1.0);
  n.dropout = 0.1;
  EXPECT_DOUBLE_EQ(lora_options(n).dropout, 0.1);
}

// LoRA dropout acts on lora_A's output (AI Toolkit: lora_down, then dropout): with p close to 1 the
// adapter's contribution is zero or hugely scaled per rank component, and in eval mode it is off.
TEST(Lora, DropoutActsOnTheRankSizedOutputAndOnlyInTraining) {
  torch::manual_seed(0);
  Linear l(LinearOptions(64, 32));
  l->add_lora(4, 4.0, 0.5);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : l->named_parameters())
      if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0, 0.5);
  }
  const torch::Tensor x = torch::randn({3, 10, 64});
  l->eval();
  const torch::Tensor a = l->forward(x), b = l->forward(x);
  EXPECT_TRUE(torch::equal(a, b));  // no dropout in eval
  l->train();
  torch::manual_seed(1);
  const torch::Tensor t = l->forward(x);
  // The difference from eval is (dropped-and-rescaled h - h) B^T: rank-sized dropout on h = x A^T.
  const torch::Tensor h = torch::nn::functional::linear(x, l->named_parameters()["lora_A.weight"]);
  torch::manual_seed(1);
  const torch::Tensor dropped = torch::dropout(h, 0.5, true);
  const torch::Tensor want = a + torch::nn::functional::linear(dropped - h, l->named_parameters()["lora_B.weight"]);
  EXPECT_TRUE(torch::allclose(t, want, 1e-5, 1e-5));
}

// A LoRA on a bf16 base, as AI Toolkit runs it (toolkit/network_mixins.py:303-318, no autocast): the base
// in bf16; the adapter in float32 on a float32 copy of the input, its output cast back to bf16 and added.
// Fails if the adapter computed in bf16 (as under the bf16 autocast gclab ran before) or on the bf16 input.
TEST(Lora, OnABf16BaseTheAdapterComputesInFloat32OnItsOwnCopyOfTheInput) {
  torch::manual_seed(0);
  Linear l(LinearOptions(64, 32));
  l->to(torch::kBFloat16);
  l->add_lora(4, 4.0);
  auto A = l->named_parameters()["lora_A.weight"], B = l->named_parameters()["lora_B.weight"];
  ASSERT_EQ(A.scalar_type(), torch::kFloat);
  {
    torch::NoGradGuard no_grad;
    B.normal_(0, 0.5);
  }
  const torch::Tensor x = torch::randn({3, 10, 64}).to(torch::kBFloat16);
  namespace F = torch::nn::functional;
  const torch::Tensor base = F::linear(x, l->weight, l->bias);
  const torch::Tensor want = base + F::linear(F::linear(x.to(torch::kFloat), A), B).to(torch::kBFloat16);
  const torch::Tensor y = l->forward(x);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(y, want));
  const torch::Tensor in_bf16 = base + F::linear(F::linear(x, A.to(torch::kBFloat16)), B.to(torch::kBFloat16));
  EXPECT_FALSE(torch::equal(y, in_bf16));
  // lora_down keeps the float32 copy: 3 x 10 x 64 x 4 bytes more than the rank-sized intermediate.
  memory::CpuMemoryTracker tracker;
  const torch::Tensor x2 = x.clone();
  const int64_t before = tracker.stats().live_bytes;
  torch::Tensor kept = l->forward(x2);
  const int64_t held = tracker.stats().live_bytes - before - static_cast<int64_t>(kept.nbytes());
  EXPECT_EQ(held, 3 * 10 * 64 * 4 + 3 * 10 * 4 * 4);
}

// A preview's network_multiplier (`--m`) scales the adapter's output as AI Toolkit's network.multiplier
// does (toolkit/network_mixins.py:289-320): 0 is the base Linear alone, 2 twice the adapter's delta; the
// model-wide setter reaches every adapter.
TEST(Lora, AMultiplierScalesTheAdapterAndZeroIsTheBaseAlone) {
  torch::manual_seed(0);
  Linear l(LinearOptions(16, 8));
  l->add_lora(4, 4.0);
  {
    torch::NoGradGuard no_grad;
    l->named_parameters()["lora_B.weight"].normal_(0, 0.5);
  }
  const torch::Tensor x = torch::randn({2, 5, 16});
  const torch::Tensor one = l->forward(x);
  const torch::Tensor base = torch::nn::functional::linear(x, l->weight, l->bias);
  l->set_lora_multiplier(0);
  EXPECT_TRUE(torch::equal(l->forward(x), base));
  l->set_lora_multiplier(2);
  EXPECT_TRUE(torch::allclose(l->forward(x), base + 2 * (one - base), 1e-5, 1e-5));
  auto m = build_transformer(spec_by_preset("tiny-flux"));
  apply_lora(*m, {4, 4.0, 0.0});
  set_lora_multiplier(*m, 0.5);
  int adapters = 0;
  for (auto& [path, linear] : nn::named_linears(*m))
    if (linear->has_lora()) {
      EXPECT_EQ(linear->lora_multiplier(), 0.5) << path;
      ++adapters;
    }
  EXPECT_GT(adapters, 0);
}

TEST(Quantize, QFloat8AndFloat8BaseWeightsQuarterFp32StorageAndStayClose) {
  torch::manual_seed(0);
  auto m = build_transformer(spec_by_preset("tiny-qwen-image"));
  const ModelInputs in = m->example_inputs({1, 1, 128, 128});
  const torch::Tensor ref = m->forward(in).detach();
  int64_t fp32_bytes = 0;
  for (auto& [path, l] : named_linears(*m)) fp32_bytes += l->weight.nbytes();
  torch::manual_seed(0);
  auto per_row = build_transformer(spec_by_preset("tiny-qwen-image"));
  const int64_t saved_tensor = set_base_weight_storage(*m, WeightStorage::QFloat8);  // quanto
  set_base_weight_storage(*per_row, WeightStorage::Float8);                          // torchao
  // 1 byte instead of 4 per Linear weight, the blocks' and the ones outside them (AI Toolkit quantizes both).
  EXPECT_EQ(saved_tensor, fp32_bytes * 3 / 4);
  auto rel_err = [&](const torch::Tensor& out) { return ((out - ref).norm() / ref.norm()).item<double>(); };
  const double err_tensor = rel_err(m->forward(in).detach()), err_row = rel_err(per_row->forward(in).detach());
  EXPECT_LT(err_tensor, 0.05);
  EXPECT_LT(err_row, 0.05);
  EXPECT_GT(err_tensor, 0.0);
  RecordProperty("relative_error_qfloat8", std::to_string(err_tensor));
  RecordProperty("relative_error_float8", std::to_string(err_row));
  // LoRA trains on top of the float8 base (the first block's adapters all reach the output).
  apply_lora(*m, {4, 4.0});
  m->forward(in).pow(2).mean().backward();
  for (const auto& p : m->blocks()[0]->named_parameters()) {
    if (p.key().find("lora_A") != std::string::npos) {
      EXPECT_TRUE(p.value().grad().defined()) << p.key();
    }
  }
}

TEST(Weights, SaveAndLoadByDiffusersNameReproduceTheModel) {
  for (const std::string preset : {"tiny-flux", "tiny-zimage", "tiny-sd3", "tiny-dit", "tiny-qwen-image"}) {
    torch::manual_seed(1);
    auto a = build_transformer(spec_by_preset(preset));
    torch::manual_seed(2);
    auto b = build_transformer(spec_by_preset(preset));
    const ModelInputs in = a->example_inputs({1, 1, 64, 64});
    const fs::path file = temp_file(preset + ".safetensors");
    io::save_safetensors(file, weights_state(*a, torch::kFloat));
    EXPECT_TRUE(load_weights(*b, file).empty()) << preset;
    EXPECT_TRUE(torch::equal(a->forward(in), b->forward(in))) << preset;
    fs::remove(file);
  }
}

TEST(Weights, MissingOrMisshapenTensorsAreNamed) {
  auto m = build_transformer(spec_by_preset("tiny-dit"));
  auto state = weights_state(*m, torch::kFloat);
  const fs::path file = temp_file("bad.safetensors");
  auto missing = state;
  missing.erase(missing.begin());
  io::save_safetensors(file, missing);
  try {
    load_weights(*m, file);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("missing " + state.front().first), std::string::npos) << e.what();
  }
  auto wrong = state;
  wrong.back().second = torch::zeros({3});
  wrong.emplace_back("extra.tensor", torch::zeros({1}));
  io::save_safetensors(file, wrong);
  EXPECT_THROW(load_weights(*m, file), std::runtime_error);
  state.emplace_back("pos_embed", torch::zeros({1}));
  io::save_safetensors(file, state);
  EXPECT_EQ(load_weights(*m, file), std::vector<std::string>{"pos_embed"});
  fs::remove(file);
}

}  // namespace
}  // namespace gclab::model

namespace gclab::model {
namespace {

// A qfloat8 Linear (optimum-quanto's autograd function) keeps its float8 weight and scale for backward,
// never a dequantized copy: after its forward, only the output is new. torchao's float8 and int8 build a
// weight-sized copy in the compute dtype that autograd keeps — dequantized_bytes(), measured. Every input
// gradient equals a plain linear's on the dequantized weight.
TEST(Quantize, WhatEachQuantizedLinearKeepsForBackwardIsMeasured) {
  for (const WeightStorage storage : {WeightStorage::QFloat8, WeightStorage::Float8, WeightStorage::Int8}) {
    torch::manual_seed(5);
    Linear q(LinearOptions(256, 512));
    q->set_weight_storage(storage);
    const torch::Tensor x0 = torch::randn({4, 32, 256});
    int64_t kept = 0;
    torch::Tensor grad;
    {
      memory::CpuMemoryTracker tracker;
      torch::Tensor x = x0.clone().requires_grad_(true);
      const int64_t before = tracker.stats().live_bytes;
      torch::Tensor y = q->forward(x);
      kept = tracker.stats().live_bytes - before - static_cast<int64_t>(y.nbytes());
      y.square().sum().backward();
      grad = x.grad();
    }
    const int64_t copy = 256 * 512 * 4;  // a float32 weight-sized copy
    if (storage == WeightStorage::QFloat8) {
      EXPECT_LT(kept, 256 * 512) << kept;
      EXPECT_EQ(q->dequantized_bytes(), 0);
    } else {
      EXPECT_EQ(q->dequantized_bytes(), copy) << to_string(storage);
      EXPECT_GE(kept, copy) << to_string(storage);
      EXPECT_LT(kept, copy + 256 * 512) << to_string(storage);
    }
    torch::Tensor x = x0.clone().requires_grad_(true);
    torch::nn::functional::linear(x, q->effective_weight(torch::kFloat), q->bias).square().sum().backward();
    EXPECT_TRUE(torch::allclose(grad, x.grad(), 1e-4, 1e-4)) << to_string(storage);
  }
}

}  // namespace
}  // namespace gclab::model

namespace gclab::model {
namespace {

// An offloaded Linear (its tensors "on the host", brought per call) computes the same output and input
// gradient as the resident one, plain, uint4 and with a recovery adapter; autograd keeps no device copy.
TEST(Quantize, AnOffloadedLinearComputesAsTheResidentOne) {
  for (const bool uint4 : {false, true}) {
    torch::manual_seed(9);
    Linear resident(LinearOptions(128, 64)), offloaded(LinearOptions(128, 64));
    {
      torch::NoGradGuard g;
      offloaded->weight.copy_(resident->weight);
      offloaded->bias.copy_(resident->bias);
    }
    for (Linear* l : {&resident, &offloaded}) {
      if (uint4) (*l)->set_weight_storage(WeightStorage::UInt4);
      torch::manual_seed(3);
      (*l)->add_recovery_adapter(torch::randn({4, 128}) * 0.1, torch::randn({64, 4}) * 0.1, 1.0);
      (*l)->add_lora(4, 4.0);
    }
    offloaded->offload([](const torch::Tensor& t) { return t.clone(); }, nn::make_offload_rings());
    ASSERT_TRUE(offloaded->offloaded());
    EXPECT_EQ(offloaded->dequantized_bytes(), 0);
    const torch::Tensor x0 = torch::randn({2, 5, 128});
    torch::Tensor xa = x0.clone().requires_grad_(true), xb = x0.clone().requires_grad_(true);
    const torch::Tensor ya = resident->forward(xa), yb = offloaded->forward(xb);
    EXPECT_TRUE(torch::allclose(ya, yb, 1e-6, 1e-6)) << uint4;
    ya.square().sum().backward();
    yb.square().sum().backward();
    EXPECT_TRUE(torch::allclose(xa.grad(), xb.grad(), 1e-5, 1e-6)) << uint4;
  }
}

}  // namespace
}  // namespace gclab::model

namespace gclab::model {
namespace {

// A Linear without a bias (Z-Image's and SD3's attention projections) trains through each quantized
// storage: the input gradient equals a plain linear's on the dequantized weight.
TEST(Quantize, ABiasFreeQuantizedLinearTrains) {
  for (const WeightStorage storage :
       {WeightStorage::QFloat8, WeightStorage::Float8, WeightStorage::Int8, WeightStorage::UInt4}) {
    torch::manual_seed(4);
    Linear q(LinearOptions(128, 64).bias(false));
    q->set_weight_storage(storage);
    torch::Tensor x = torch::randn({3, 128}).requires_grad_(true);
    q->forward(x).square().sum().backward();
    torch::Tensor x2 = x.detach().clone().requires_grad_(true);
    torch::nn::functional::linear(x2, q->effective_weight(torch::kFloat)).square().sum().backward();
    EXPECT_TRUE(torch::allclose(x.grad(), x2.grad(), 1e-4, 1e-4)) << to_string(storage);
  }
}

}  // namespace
}  // namespace gclab::model
