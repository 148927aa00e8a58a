// The model families' sizes (not a test): for each full-size preset, parameters (meta-device build),
// bf16 weight bytes, image tokens at 512/768/1024/1536, and each block kind's saved activations at 1024²,
// batch 1, with checkpointing off (the activation ledger, computed from shapes) and full (the block's
// inputs); then, for the tiny presets, the ledger beside the tracking allocator's measurement.
//
//   build/bin/model_shapes > docs/results/models.md
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "../tests/support/measure_blocks.h"
#include "gclab/config/byte_size.h"
#include "gclab/model/activations.h"
#include "gclab/model/lora.h"

using namespace gclab::model;

namespace {

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }
std::string human(int64_t b) { return gclab::config::format_bytes(b); }

}  // namespace

int main() {
  const std::vector<std::string> full = {"flux-dev", "flux-schnell", "flex1",  "qwen-image", "qwen-image-edit-2509",
                                         "zimage",   "sd35-large",   "dit-xl2"};
  std::printf("# Model families: sizes and per-block activations\n\n");
  std::printf(
      "Produced by `build/bin/model_shapes` (bench/model_shapes.cpp). Parameters come from building each\n"
      "preset on the meta device; activations from the ledger in src/model/activations.cpp, which\n"
      "tests/model/activations_test.cpp checks byte for byte against the tracking allocator.\n\n");
  std::printf("## Full-size presets\n\n");
  std::printf(
      "| preset | parameters | bf16 weights | image tokens 512 / 768 / 1024 / 1536 | text tokens "
      "|\n|---|---|---|---|---|\n");
  for (const auto& name : full) {
    const ModelSpec s = spec_by_preset(name);
    auto m = build_transformer(s, torch::TensorOptions().device(torch::kMeta).dtype(torch::kBFloat16));
    int64_t bytes = 0;
    for (const auto& p : m->parameters()) bytes += static_cast<int64_t>(p.nbytes());
    std::printf("| %s | %lld | %s | %lld / %lld / %lld / %lld | %lld |\n", name.c_str(),
                static_cast<long long>(parameter_count(*m)), human(bytes).c_str(),
                static_cast<long long>(image_tokens(s, 512, 512)), static_cast<long long>(image_tokens(s, 768, 768)),
                static_cast<long long>(image_tokens(s, 1024, 1024)),
                static_cast<long long>(image_tokens(s, 1536, 1536)), static_cast<long long>(text_tokens(s, 77)));
  }
  std::printf(
      "\nQwen-Image-Edit-2509's image tokens include one 1024² reference image (+4096) where it is trained "
      "with a control image; the table's counts are the target image's alone. Text tokens are for a "
      "77-token prompt, and for Qwen-Image-Edit-2509 the 203 rows its control image adds (the vision "
      "tower's 196 tokens of a 384² condition image, their markers and \"Picture 1: \").\n\n");

  std::printf("## One block's saved activations, 1024×1024, batch 1, bf16\n\n");
  std::printf(
      "GC off: what one block keeps from forward to backward. GC full: what a checkpointed block keeps "
      "instead (its hidden-stream inputs). LoRA: rank 16 on every block Linear, base frozen.\n\n");
  std::printf(
      "| preset | block | count | GC off, full training | GC off, LoRA r16 | GC full | off / full | all blocks off | "
      "all blocks full |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& name : full) {
    const ModelSpec s = spec_by_preset(name);
    ActivationOptions train;
    train.element_bytes = 2;
    ActivationOptions lora = train;
    lora.lora_rank = 16;
    lora.conditioning_grad = false;
    const auto a = estimate_activations(s, 1, 1024, 1024, 0, train);
    const auto l = estimate_activations(s, 1, 1024, 1024, 0, lora);
    for (size_t k = 0; k < a.blocks.size(); ++k) {
      const auto& b = a.blocks[k];
      std::printf("| %s | %s | %d | %.1f MiB | %.1f MiB | %.1f MiB | %.1fx | %s | %s |\n", name.c_str(), b.kind.c_str(),
                  b.count, mib(b.saved_bytes), mib(l.blocks[k].saved_bytes), mib(b.input_bytes),
                  static_cast<double>(b.saved_bytes) / static_cast<double>(b.input_bytes),
                  k == 0 ? human(a.total_off_bytes).c_str() : "", k == 0 ? human(a.total_full_bytes).c_str() : "");
    }
  }

  std::printf("\n## Tiny presets: computed vs measured, 256×256, batch 1\n\n");
  std::printf(
      "Measured: each block run alone on inputs captured from a forward, live bytes after it minus before "
      "minus its outputs, from the tracking CPU allocator (CPU kernels; LayerNorm keeps bf16 statistics "
      "for bf16 input on the CPU, float32 on CUDA — the ledger takes that as a parameter).\n\n");
  std::printf(
      "| preset | block | dtype | GC off computed | GC off measured | GC full (inputs) |\n|---|---|---|---|---|---|\n");
  for (const std::string name : {"tiny-flux", "tiny-qwen-image", "tiny-zimage", "tiny-sd3", "tiny-dit"}) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      torch::manual_seed(0);
      const ModelSpec s = spec_by_preset(name);
      auto m = build_transformer(s);
      m->to(dtype);
      // A 16-token prompt's rows as the transformer takes them (Z-Image's padded to a multiple of 32).
      const ModelInputs in = m->example_inputs(1, 256, 256, text_tokens(s, 16), torch::TensorOptions().dtype(dtype));
      const auto measured = gclab::testing::measure_saved_bytes(*m, in, false);
      ActivationOptions o;
      o.element_bytes = static_cast<int64_t>(c10::elementSize(dtype));
      o.layer_norm_stats_bytes = o.element_bytes;
      const auto est = estimate_activations(s, 1, 256, 256, in.text.defined() ? in.text.size(1) : 0, o);
      for (const auto& b : est.blocks)
        std::printf("| %s | %s | %s | %lld | %lld | %lld |\n", name.c_str(), b.kind.c_str(),
                    dtype == torch::kFloat ? "fp32" : "bf16", static_cast<long long>(b.saved_bytes),
                    static_cast<long long>(measured.at(b.kind)), static_cast<long long>(b.input_bytes));
    }
  }
  std::printf("\n## Tiny presets: one training step on this machine's CPU\n\n");
  std::printf(
      "Forward + backward of mean(prediction²), 256×256, batch 1, fp32, every weight trained, %d threads; "
      "median of 5 after a warm-up.\n\n| preset | parameters | step ms |\n|---|---|---|\n",
      at::get_num_threads());
  for (const std::string name : {"tiny-flux", "tiny-qwen-image", "tiny-zimage", "tiny-sd3", "tiny-dit"}) {
    torch::manual_seed(0);
    auto m = build_transformer(spec_by_preset(name));
    const ModelInputs in = m->example_inputs(1, 256, 256);
    std::vector<double> ms;
    for (int i = 0; i < 6; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      m->forward(in).pow(2).mean().backward();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin() + 1, ms.end());
    std::printf("| %s | %lld | %.1f |\n", name.c_str(), static_cast<long long>(parameter_count(*m)), ms[3]);
  }
  return 0;
}
