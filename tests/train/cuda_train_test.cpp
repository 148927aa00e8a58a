// The training layer on CUDA: what would break the first time a GPU runs gclab. Each test runs in a
// process of its own (ctest runs every discovered test separately), so "the cap is the first CUDA call"
// holds. Skipped without a GPU, so CI never depends on one; scripts/gpu/check.sh runs them.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../support/test_util.h"
#include "../support/tiny_run.h"
#include "gclab/bench/bench.h"
#include "gclab/ckpt/checkpoint.h"
#include "gclab/data/synth.h"
#include "gclab/io/safetensors.h"
#include "gclab/memory/flops.h"
#include "gclab/memory/tracker.h"
#include "gclab/model/family.h"
#include "gclab/model/lora.h"
#include "gclab/nn/layers.h"
#include "gclab/nn/meta_kernels.h"
#include "gclab/train/checkpointing.h"
#include "gclab/train/session.h"
#include "gclab/train/trainer.h"

namespace gclab::train {
namespace {

namespace fs = std::filesystem;

#define GCLAB_REQUIRE_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

// The shared tiny run (tests/support/tiny_run.h) on CUDA in bf16.
config::ProcessConfig cuda_config(const fs::path& dir, const std::string& name, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), {"device=cuda", "train.dtype=bf16", "train.steps=10"});
  return testing::tiny_config(dir, name, std::move(extra));
}

// The emulated cap is the first CUDA call of a run: in 2.11 the allocator asserts "not initialized" if
// CUDA was not initialised first (the meter does it).
TEST(CudaMeter, TheCapCanBeTheFirstCudaCallOfTheProcess) {
  GCLAB_REQUIRE_CUDA();
  memory::MemoryMeter meter(torch::Device(torch::kCUDA, 0));
  meter.set_cap(int64_t{1} << 30);
  EXPECT_GT(meter.stats().cap_bytes, 0);
  EXPECT_THROW(torch::empty({int64_t{2} << 30}, torch::TensorOptions().device(torch::kCUDA).dtype(torch::kByte)),
               c10::OutOfMemoryError);
  meter.set_cap(0);
}

// vram_cap sets the caching allocator's memory fraction, process-wide: the Session puts back the one it
// found when it ends, so a later Session (or the caller) does not inherit the cap.
TEST(CudaMeter, ASessionPutsBackTheMemoryFractionItSet) {
  GCLAB_REQUIRE_CUDA();
  const fs::path dir = testing::fresh_dir("cuda_fraction");
  memory::MemoryMeter meter(torch::Device(torch::kCUDA, 0));
  meter.set_memory_fraction(0.9);
  {
    Session capped(cuda_config(dir, "f", {"vram_cap=2GiB"}));
    EXPECT_LT(meter.memory_fraction(), 0.9);
  }
  EXPECT_DOUBLE_EQ(meter.memory_fraction(), 0.9);
  meter.set_memory_fraction(1.0);
  fs::remove_all(dir);
}

TEST(CudaTrain, TrainAndBenchRunATinyModel) {
  GCLAB_REQUIRE_CUDA();
  const fs::path dir = testing::fresh_dir("cuda_train");
  const auto s = train(cuda_config(dir, "t", {"vram_cap=4GiB"}), {});
  EXPECT_EQ(s.end_step, 10);
  for (double loss : s.losses) EXPECT_TRUE(std::isfinite(loss));
  Session session(cuda_config(dir, "b"));
  bench::BenchOptions o;
  o.resolutions = {64, 128};
  o.steps = 2;
  const auto rows = bench::run_bench(session, o);
  ASSERT_EQ(rows.size(), 4u);
  for (const auto& r : rows) EXPECT_FALSE(r.oom);
  fs::remove_all(dir);
}

// 10 steps + --resume 10 equals 20 straight steps bitwise: noise and timesteps come from the CUDA
// generator, which the state file carries.
TEST(CudaTrain, ResumeIsBitwise) {
  GCLAB_REQUIRE_CUDA();
  const fs::path dir = testing::fresh_dir("cuda_resume");
  const auto straight = train(cuda_config(dir, "straight", {"train.steps=20"}), {});
  train(cuda_config(dir, "split", {"train.steps=10"}), {});
  TrainOptions resume;
  resume.resume = true;
  const auto second = train(cuda_config(dir, "split", {"train.steps=20"}), resume);
  ASSERT_EQ(second.losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(second.losses[i], straight.losses[10 + i]) << "step " << 11 + i;
  fs::remove_all(dir);
}

// Out of memory on CUDA under oom_policy: skip — the large bucket's batches are dropped, the run goes on
// with the small one, and autocast is off again after each failed forward.
TEST(CudaTrain, AnOutOfMemoryIsSkippedAndTheRunContinues) {
  GCLAB_REQUIRE_CUDA();
  const fs::path dir = testing::fresh_dir("cuda_oom");
  // The small bucket's peak, measured, sets a cap between the two buckets.
  const auto small = train(cuda_config(dir, "small", {"train.steps=3"}), {});
  ASSERT_GT(small.peak_bytes, 0);
  const int64_t cap = small.peak_bytes * 2;
  // A second dataset of two 1024² images: one large batch per epoch among three small ones, so the
  // skips never come three in a row (which ends a run, as in AI Toolkit).
  data::SynthOptions big;
  big.count = 2;
  big.sizes = {{1024, 1024}};
  data::write_synthetic_dataset(dir / "big", big);
  const auto run = train(cuda_config(dir, "mixed",
                                     {"vram_cap=" + std::to_string(cap),
                                      "datasets.1={folder_path: " + (dir / "big").string() + ", resolution: [1024]}",
                                      "train.gradient_checkpointing=false", "train.oom_policy=skip", "train.steps=12"}),
                         {});
  EXPECT_GT(run.oom_skips, 0);
  EXPECT_EQ(run.end_step, 12);
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCUDA));
  fs::remove_all(dir);
}

// Layer offloading on CUDA as AI Toolkit stages it: the offloaded Linears' weights come from pinned host
// memory on a transfer stream (the compute stream waiting on each slot's copy, each copy on the compute
// that last read its slot), checkpointed (the recompute brings them again) and not, plain and uint4. The
// LoRA trains to the resident run's losses (the same kernels on the same values: equal up to bf16's
// reduction order) and the device's peak drops.
TEST(CudaTrain, OffloadedLayersStagedOnATransferStreamTrainAsResidentOnes) {
  GCLAB_REQUIRE_CUDA();
  const fs::path dir = testing::fresh_dir("cuda_offload");
  for (const std::string gc : {"true", "false"})
    for (const std::string qtype : {"", "uint4"}) {
      std::vector<std::string> base = {"train.steps=4", "train.gradient_checkpointing=" + gc};
      if (!qtype.empty()) base.insert(base.end(), {"model.quantize=true", "model.qtype=" + qtype});
      auto offloaded_args = base;
      offloaded_args.insert(offloaded_args.end(),
                            {"model.layer_offloading=true", "model.layer_offloading_text_encoder_percent=0"});
      const auto resident = train(cuda_config(dir, "r" + gc + qtype, base), {});
      const auto offloaded = train(cuda_config(dir, "o" + gc + qtype, offloaded_args), {});
      ASSERT_EQ(offloaded.losses.size(), resident.losses.size());
      for (size_t i = 0; i < resident.losses.size(); ++i)
        EXPECT_NEAR(offloaded.losses[i], resident.losses[i], 1e-2 * std::abs(resident.losses[i]))
            << "gc " << gc << " " << qtype << " step " << i + 1;
      EXPECT_LT(offloaded.peak_bytes, resident.peak_bytes) << "gc " << gc << " " << qtype;
    }
  fs::remove_all(dir);
}

// model.low_vram on a GPU run builds the transformer in host memory, where AI Toolkit's FLUX.1 loader quantizes
// it, with each parameter drawn on the GPU and copied over at once (nn::DrawOnDevice) rather than drawn on one
// CPU thread: the values a build on the GPU draws, quantized the same way, and the load's device peak as the
// walk predicts it.
TEST(CudaTrain, ALowVramLoadIsDrawnOnTheGpuAndQuantizedInHostMemory) {
  GCLAB_REQUIRE_CUDA();
  const fs::path dir = testing::fresh_dir("cuda_low_vram");
  const std::vector<std::string> quantize = {"model.quantize=true", "model.qtype=qfloat8"};
  auto low_vram = quantize;
  low_vram.push_back("model.low_vram=true");
  Session on_device(cuda_config(dir, "d", quantize));
  Session staged(cuda_config(dir, "h", low_vram));
  ASSERT_TRUE(staged.load_memory().quantized_on_host);
  ASSERT_FALSE(on_device.load_memory().quantized_on_host);
  auto a = nn::named_linears(on_device.model()), b = nn::named_linears(staged.model());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const torch::Tensor wa = a[i].second->effective_weight(torch::kFloat).cpu();
    const torch::Tensor wb = b[i].second->effective_weight(torch::kFloat).cpu();
    EXPECT_TRUE(torch::allclose(wa, wb, 1e-2, 1e-3)) << a[i].first;  // float8 codes: rounding at most
  }
  const LoadMemory& load = staged.load_memory();
  ASSERT_TRUE(load.measured_device_peak_bytes);
  EXPECT_NEAR(static_cast<double>(*load.measured_device_peak_bytes), static_cast<double>(load.device.peak()),
              0.02 * static_cast<double>(load.device.peak()) + (2 << 20));
  fs::remove_all(dir);
}

// selective:ops on the GPU in bf16: the kept matmuls and attention (the fused kernel ATen picks, replayed through
// its own backward) give GC off's loss and gradients to bf16 rounding, and the backward runs none of their FLOPs
// again (only the adapters'). The same test on the CPU is
// CheckpointedFamily.EveryPolicyGivesTheGradientsOfNoCheckpointing.
TEST(CheckpointCuda, SelectiveOpsReplaysTheKernelsOnTheGpu) {
  GCLAB_REQUIRE_CUDA();
  for (const std::string preset : {"tiny-flux", "tiny-qwen-image", "tiny-wan21"}) {
    SCOPED_TRACE(preset);
    torch::manual_seed(1);
    const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    auto m = model::build_transformer(model::spec_by_preset(preset), options);
    model::apply_lora(*m, {4, 4.0, 0.0});
    {
      torch::NoGradGuard no_grad;
      for (auto& p : m->named_parameters())
        if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0, 0.02);
    }
    const model::ModelInputs in = m->example_inputs({1, 1, 128, 128}, 0, options);
    ModelCheckpointing ckpt(*m);
    struct Result {
      torch::Tensor loss;
      std::vector<torch::Tensor> grads;
      double backward_flops = 0, backward_adapter_flops = 0;
    };
    auto step = [&](const char* policy) {
      ckpt.apply(ckpt::CheckpointPolicy::parse(policy));
      for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
      Result r;
      const torch::Tensor loss = m->forward(in).to(torch::kFloat).pow(2).mean();
      {
        memory::FlopCount flops;
        loss.backward();
        r.backward_flops = flops.total();
        r.backward_adapter_flops = flops.adapters();
      }
      r.loss = loss.detach().cpu();
      for (const auto& p : m->parameters())
        if (p.requires_grad())
          r.grads.push_back(p.grad().defined() ? p.grad().to(torch::kFloat).cpu() : torch::zeros({1}));
      return r;
    };
    const Result off = step("off"), ops = step("selective:ops"), full = step("full");
    EXPECT_TRUE(torch::allclose(off.loss, ops.loss, 1e-3, 1e-6))
        << off.loss.item<double>() << " vs " << ops.loss.item<double>();
    ASSERT_EQ(off.grads.size(), ops.grads.size());
    for (size_t i = 0; i < off.grads.size(); ++i) {
      const double scale = std::max(off.grads[i].abs().max().item<double>(), 1e-30);
      EXPECT_LE((off.grads[i] - ops.grads[i]).abs().max().item<double>() / scale, 2e-2) << "parameter " << i;
    }
    // Every FLOP the backward ran again is an adapter's: each matmul and attention was replayed, none fell back.
    EXPECT_GT(full.backward_flops, full.backward_adapter_flops);
    EXPECT_EQ(ops.backward_flops, ops.backward_adapter_flops);
  }
}

// The memory-efficient kernel's replay: attention with an additive float mask (aligned, broadcast over the
// heads, as scaled_dot_product_attention hands it over) in float32 on the GPU, checkpointed under
// selective:ops, gives the plain call's gradients and runs neither the matmul nor attention again.
TEST(CheckpointCuda, SelectiveOpsReplaysMaskedAttentionOnTheGpu) {
  GCLAB_REQUIRE_CUDA();
  torch::manual_seed(4);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const int64_t B = 2, H = 4, L = 24, D = 16;
  nn::Linear qkv(nn::LinearOptions(H * D, 3 * H * D).tensor_options(cuda));
  const torch::Tensor mask = torch::randn({B, 1, L, L}, cuda);
  const ckpt::BlockFn fn = [&](const std::vector<torch::Tensor>& in) {
    const auto parts = qkv(in[0]).view({B, L, 3, H, D}).permute({2, 0, 3, 1, 4});
    return std::vector<torch::Tensor>{nn::attention(parts[0], parts[1], parts[2], mask).sum()};
  };
  const torch::Tensor x0 = torch::randn({B, L, H * D}, cuda);
  auto grads = [&](bool ops, double& backward_flops) {
    torch::Tensor x = x0.clone().requires_grad_(true);
    for (auto& p : qkv->parameters()) p.mutable_grad() = torch::Tensor();
    const auto out =
        ops ? ckpt::checkpoint(fn, {x}, qkv->parameters(), ckpt::CheckpointOptions().with_save_ops(true)) : fn({x});
    memory::FlopCount flops;
    out[0].backward();
    backward_flops = flops.total();
    return std::vector<torch::Tensor>{x.grad().cpu(), qkv->weight.grad().cpu(), qkv->bias.grad().cpu()};
  };
  double plain_flops = 0, ops_flops = 0;
  const auto plain = grads(false, plain_flops), ops = grads(true, ops_flops);
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_TRUE(torch::allclose(plain[i], ops[i], 1e-4, 1e-5)) << "gradient " << i;
  EXPECT_EQ(ops_flops, 0);  // nothing kept ran again
}

}  // namespace
}  // namespace gclab::train
