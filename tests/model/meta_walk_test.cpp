// The meta walk (memory/meta_count.h, nn/meta_kernels.h): a transformer's forward and backward run on meta
// tensors under a MetaCount count what the same network allocates on the CPU under the tracking allocator,
// byte for byte — every tiny preset, full training and LoRA, float32 and bf16, with and without a graph (in
// bf16 on a CPU whose bf16 matmuls are oneDNN's, up to their scratch in the backward: memory/live_set.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "gclab/memory/cpu_isa.h"
#include "gclab/memory/live_set.h"
#include "gclab/memory/meta_count.h"
#include "gclab/memory/placement.h"
#include "gclab/memory/tracker.h"
#include "gclab/model/lora.h"
#include "gclab/model/registry.h"
#include "gclab/model/transformer.h"
#include "gclab/nn/meta_kernels.h"

namespace gclab::model {
namespace {

struct Peaks {
  int64_t forward = 0;   // above what was live before the forward
  int64_t live = 0;      // after it (the graph's saved tensors, the output)
  int64_t backward = 0;  // above what was live before the backward
};

// One forward (and, with a graph, the backward of a squared-mean loss) of `preset` at batch 2, 128 x 96,
// on the CPU with the tracking allocator or on the meta device counted.
Peaks run(const std::string& preset, bool lora, torch::ScalarType dtype, bool grad, bool meta) {
  std::optional<memory::CpuMemoryTracker> tracker;
  if (!meta) tracker.emplace();
  torch::manual_seed(0);
  const auto options = torch::TensorOptions().device(meta ? torch::kMeta : torch::kCPU);
  auto model = build_transformer(spec_by_preset(preset), options);
  model->to(dtype);
  if (lora) apply_lora(*model, {4, 4.0, 0.0});
  const ModelInputs in = model->example_inputs({2, 1, 128, 96}, 0, options.dtype(dtype));
  std::optional<memory::MetaCount> count;
  if (meta) count.emplace();
  const int64_t base = meta ? 0 : tracker->stats().live_bytes;
  const auto live = [&] { return meta ? count->live() : tracker->stats().live_bytes - base; };
  const auto peak = [&] { return meta ? count->peak() : tracker->stats().peak_bytes - base; };
  const auto reset = [&] { meta ? count->reset_peak() : tracker->reset_peak(); };
  reset();
  Peaks p;
  std::optional<torch::NoGradGuard> no_grad;
  if (!grad) no_grad.emplace();
  torch::Tensor loss = model->forward(in).to(torch::kFloat).pow(2).mean();
  p.forward = peak();
  p.live = live();
  if (grad) {
    reset();
    loss.backward();
    p.backward = peak() - p.live;
  }
  return p;
}

class MetaWalk : public ::testing::TestWithParam<std::string> {};

TEST_P(MetaWalk, CountsWhatTheCpuAllocates) {
  for (const bool lora : {false, true})
    for (const auto dtype : {torch::kFloat, torch::kBFloat16})
      for (const bool grad : {false, true}) {
        const Peaks cpu = run(GetParam(), lora, dtype, grad, false);
        const Peaks meta = run(GetParam(), lora, dtype, grad, true);
        const std::string what = GetParam() + (lora ? " LoRA " : " full ") + c10::toString(dtype) +
                                 (grad ? " with a graph" : " without a graph");
        EXPECT_GT(cpu.forward, 0) << what;
        EXPECT_EQ(meta.live, cpu.live) << what;
        if (dtype == torch::kBFloat16 && memory::cpu_onednn_bf16()) {
          // oneDNN's scratch beside each bf16 matmul on this CPU (memory/live_set.h): the walk holds the
          // Linears' forwards' (nn::linear), not the backward's matmuls', so the CPU is above the walk's
          // backward by it, no more; each held to the bound measured on this ISA (memory::cpu_bf16_bound:
          // LoRA's matmuls are float32, exact on every ISA).
          const memory::CpuRuleBound f = memory::cpu_bf16_bound(memory::CpuRule::forward);
          const memory::CpuRuleBound b = memory::cpu_bf16_bound(memory::CpuRule::backward);
          const double forward = static_cast<double>(meta.forward) / static_cast<double>(cpu.forward);
          const double backward = grad ? static_cast<double>(meta.backward) / static_cast<double>(cpu.backward) : 1.0;
          std::printf("%s: forward %.3f (%s), backward %.3f (%s)\n", what.c_str(), forward,
                      memory::describe(memory::CpuRule::forward).c_str(), backward,
                      memory::describe(memory::CpuRule::backward).c_str());
          EXPECT_GE(forward, f.low) << what;
          EXPECT_LE(forward, f.high) << what;
          EXPECT_LE(meta.backward, cpu.backward) << what;
          EXPECT_GE(backward, b.low) << what;
          continue;
        }
        // Within a few bytes: the CPU run's 0-dim scalar operands (a number in an expression) are CPU
        // tensors on a meta run too, not counted there (12 bytes at most here, SD3 and DiT in bf16 forwards,
        // FLUX.2 klein's LoRA backward in bf16 on AVX2).
        EXPECT_NEAR(meta.forward, cpu.forward, 16) << what;
        EXPECT_NEAR(meta.backward, cpu.backward, 16) << what;
        if (grad) {
          EXPECT_GT(cpu.backward, 0) << what;
        }
      }
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, MetaWalk,
                         ::testing::Values("tiny-flux", "tiny-qwen-image", "tiny-qwen-image-edit", "tiny-zimage",
                                           "tiny-sd3", "tiny-dit", "tiny-wan21", "tiny-flux-kontext", "tiny-chroma",
                                           "tiny-flux2-klein", "tiny-flux2-dev"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// An op without a meta kernel ends a walk, not the program: run_walk names it and the count so far stands.
TEST(MetaCount, AnOpWithoutAMetaKernelEndsTheWalkAndIsNamed) {
  memory::take_meta_gaps();
  const auto meta = torch::TensorOptions().device(torch::kMeta);
  memory::MetaCount count(c10::kCPU);
  torch::Tensor kept;
  const bool ran = memory::run_walk([&] {
    kept = torch::empty({256}, meta);  // counted before the op
    const torch::Tensor cond = torch::empty({256}, meta.dtype(torch::kBool));
    torch::where(cond, kept, kept);  // aten::where.self has no C++ meta kernel in LibTorch 2.11
  });
  EXPECT_FALSE(ran);
  EXPECT_GE(count.peak(), 256 * 4);
  EXPECT_EQ(memory::take_meta_gaps(), std::vector<std::string>{"aten::where.self"});
  EXPECT_TRUE(memory::take_meta_gaps().empty());
  EXPECT_TRUE(memory::run_walk([&] { nn::where(torch::empty({256}, meta.dtype(torch::kBool)), kept, kept); }));
}

// A MetaCount stands for its target device while it lives and restores the one before.
// The counting allocator is the meta device's only while a count (or a meta Session) lives: a process that
// estimated once keeps LibTorch's own meta allocator afterwards.
TEST(MetaCount, TheCountingAllocatorIsInstalledOnlyWhileAWalkRuns) {
  c10::Allocator* const before = c10::GetAllocator(c10::kMeta);
  {
    memory::MetaCount outer;
    c10::Allocator* const counting = c10::GetAllocator(c10::kMeta);
    EXPECT_NE(counting, before);
    {
      memory::MetaCount inner;
      EXPECT_EQ(c10::GetAllocator(c10::kMeta), counting);
    }
    EXPECT_EQ(c10::GetAllocator(c10::kMeta), counting);  // the outer count still runs
  }
  EXPECT_EQ(c10::GetAllocator(c10::kMeta), before);  // a memory model's meta Session: LayerOffloading.*Rings*
}

// A walk's host memory (memory::HostScope on the meta device): uncounted, named by is_host_memory; to_device
// copies it onto the counted device as a run copies a loader's batch, to_host clones a device tensor into it.
TEST(MetaCount, HostScopeMarksAWalksHostMemory) {
  const auto meta = torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat);
  memory::MetaCount count;
  torch::Tensor host;
  {
    memory::HostScope scope;
    host = torch::empty({256}, meta);
  }
  EXPECT_EQ(count.live(), 0);  // host memory: not the device's
  EXPECT_TRUE(memory::is_host_memory(host));
  EXPECT_TRUE(memory::is_host_memory(host.view({16, 16})));  // a view of it too
  const torch::Tensor device = memory::to_device(host, c10::Device(c10::kMeta));
  EXPECT_FALSE(memory::is_host_memory(device));
  EXPECT_EQ(count.live(), 1024);                                                    // the copy on the device
  EXPECT_TRUE(memory::to_device(device, c10::Device(c10::kMeta)).is_same(device));  // on the device: no copy
  const torch::Tensor half = memory::to_device(host, c10::Device(c10::kMeta), torch::kBFloat16);
  EXPECT_EQ(count.live(), 1024 + 512);  // copied in the dtype asked
  const torch::Tensor back = memory::to_host(device);
  EXPECT_TRUE(memory::is_host_memory(back));
  EXPECT_EQ(count.live(), 1024 + 512);  // the host copy is not counted
  EXPECT_TRUE(memory::to_host(back).is_same(back));
}

TEST(MetaCount, TargetsNest) {
  EXPECT_EQ(memory::meta_target(), c10::kCPU);
  {
    memory::MetaCount outer(c10::kCUDA);
    EXPECT_EQ(memory::meta_target(), c10::kCUDA);
    torch::Tensor t = torch::empty({256}, torch::TensorOptions().device(torch::kMeta));
    EXPECT_EQ(outer.live(), 1024);
    t = torch::Tensor();
    EXPECT_EQ(outer.live(), 0);
    EXPECT_EQ(outer.peak(), 1024);
    memory::meta_spike(4096);
    EXPECT_EQ(outer.live(), 0);
    EXPECT_EQ(outer.peak(), 4096);
  }
  EXPECT_EQ(memory::meta_target(), c10::kCPU);
}

// A count inside a count (the quantization's peak priced while a meta model loads) counts from where it
// starts, and the outer count's peak still sees what happened inside, and before.
TEST(MetaCount, CountsNest) {
  const auto meta = torch::TensorOptions().device(torch::kMeta);
  memory::MetaCount outer(c10::kCPU);
  torch::Tensor held = torch::empty({1024}, meta);  // 4 KiB, kept
  memory::meta_spike(16384);                        // the outer peak: 20 KiB
  {
    memory::MetaCount inner(c10::kCPU);
    EXPECT_EQ(inner.live(), 0);
    memory::meta_spike(8192);
    EXPECT_EQ(inner.peak(), 8192);
  }
  EXPECT_EQ(outer.peak(), 20480);  // the inner count did not lower it
  {
    memory::MetaCount inner(c10::kCPU);
    memory::meta_spike(32768);
  }
  EXPECT_EQ(outer.peak(), 4096 + 32768);  // nor hide what it saw
  EXPECT_EQ(outer.live(), 4096);
}

// A run's CPU-side work (memory::to_cpu, CpuWork): a CPU walk counts it as the device's, a GPU walk as host
// memory — the copy to the CPU and what is made there.
TEST(MetaCount, CpuWorkIsTheDevicesOnTheCpuAndHostMemoryForAGpu) {
  const auto meta = torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat);
  for (c10::DeviceType target : {c10::kCPU, c10::kCUDA}) {
    memory::MetaCount count(target);
    const torch::Tensor device = torch::empty({256}, meta);
    EXPECT_EQ(count.live(), 1024);
    torch::Tensor made;
    {
      const memory::CpuWork cpu;
      const torch::Tensor on_cpu = memory::to_cpu(device);
      EXPECT_EQ(on_cpu.is_same(device), target == c10::kCPU);  // a GPU run copies it to the host
      made = on_cpu * 2;
    }
    EXPECT_EQ(memory::is_host_memory(made), target == c10::kCUDA);
    EXPECT_EQ(count.live(), target == c10::kCPU ? 2048 : 1024);
    const torch::Tensor onto = memory::to_device(made, c10::Device(c10::kMeta));
    EXPECT_EQ(count.live(), 2048);  // on the device either way
  }
  // Outside a walk, on real tensors: the CPU's tensor itself.
  const torch::Tensor t = torch::ones({4});
  const memory::CpuWork cpu;
  EXPECT_TRUE(memory::to_cpu(t).is_same(t));
}

// The image resizes an edit model's control images go through (nn::resize_bilinear, nn::resize_bicubic_aa)
// hold on meta, walked for the CPU, what the CPU's kernels hold under the tracking allocator — byte for byte,
// up and down, one axis or both, and unchanged, on one thread and two (the bilinear kernel ATen picks
// depends on them).
TEST(MetaKernels, ImageResizesHoldWhatTheCpuKernelsHold) {
  memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  auto measured = [&](auto&& fn) {
    fn();  // the kernels' lazy state
    const int64_t before = tracker.stats().live_bytes;
    tracker.reset_peak();
    fn();
    return tracker.stats().peak_bytes - before;
  };
  auto walked = [&](auto&& fn) {
    memory::MetaCount count(c10::kCPU);
    fn();
    return count.peak();
  };
  const auto meta = torch::TensorOptions().device(torch::kMeta);
  const std::vector<std::vector<int64_t>> cases = {{384, 256, 400, 280}, {100, 100, 300, 300}, {300, 300, 100, 100},
                                                   {384, 256, 384, 256}, {64, 64, 64, 200},    {64, 64, 200, 64},
                                                   {200, 200, 60, 60}};
  const int threads = at::get_num_threads();
  for (int t : {1, 2})
    for (const std::vector<int64_t>& c : cases) {
      at::set_num_threads(t);
      const int64_t h = c[0], w = c[1];
      const std::vector<int64_t> size = {c[2], c[3]};
      const std::string what = std::to_string(h) + "x" + std::to_string(w) + " to " + std::to_string(size[0]) + "x" +
                               std::to_string(size[1]) + ", " + std::to_string(t) + " thread(s)";
      const torch::Tensor image = torch::rand({1, 3, h, w});
      const torch::Tensor levels = (image * 255).round().to(torch::kUInt8);
      const torch::Tensor meta_image = torch::empty({1, 3, h, w}, meta), meta_levels = meta_image.to(torch::kUInt8);
      EXPECT_EQ(walked([&] { nn::resize_bilinear(meta_image, size); }),
                measured([&] { nn::resize_bilinear(image, size); }))
          << "bilinear " << what;
      EXPECT_EQ(walked([&] { nn::resize_bicubic_aa(meta_levels, size); }),
                measured([&] { nn::resize_bicubic_aa(levels, size); }))
          << "bicubic, antialiased, uint8 " << what;
    }
  at::set_num_threads(threads);
}

}  // namespace
}  // namespace gclab::model
