// The model families' sizes (not a test): for each full-size preset, parameters (meta-device build),
// bf16 weight bytes, image tokens at 512/768/1024/1536, and each kind of block's saved activations at
// 1024², batch 1, with checkpointing off and full (the block's inputs), walked on the meta device
// (train::ModelCheckpointing::probe_blocks under a MetaCount); then, for the tiny presets, the walk beside
// the tracking allocator's measurement of the same probe forward.
//
//   build/bin/model_shapes > docs/results/models.md
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <map>
#include <optional>

#include "gclab/config/byte_size.h"
#include "gclab/memory/meta_count.h"
#include "gclab/memory/tracker.h"
#include "gclab/model/activations.h"
#include "gclab/model/lora.h"
#include "gclab/train/checkpointing.h"

using namespace gclab::model;

namespace {

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }
std::string human(int64_t b) { return gclab::config::format_bytes(b); }

// What each block of `spec` keeps (GC off) and its hidden-stream inputs (GC full), from one probe forward at
// batch 1, height x width, on `device`: walked on the meta device, measured on the CPU; LoRA of `rank` on
// every block Linear (0: every weight trained); a walk stands for `target`'s kernels.
gclab::train::ModelCheckpointing::BlockProbe probe(const ModelSpec& s, int64_t height, int64_t width,
                                                   torch::ScalarType dtype, int64_t rank, torch::Device device,
                                                   c10::DeviceType target = c10::kCPU) {
  torch::manual_seed(0);
  std::optional<gclab::memory::CpuMemoryTracker> tracker;
  if (device.is_cpu()) tracker.emplace();
  const auto o = torch::TensorOptions().device(device);
  auto m = build_transformer(s, o);
  m->to(dtype);
  if (rank > 0) apply_lora(*m, {rank, static_cast<double>(rank), 0.0});
  ModelInputs in = m->example_inputs({1, 1, height, width}, step_tokens(s, {1, 1, height, width}).text, o.dtype(dtype));
  if (s.reference_tokens) {
    const auto [w, h] = training_reference_size(s, width, height);
    in.reference_latents.push_back(torch::randn(latent_shape(s, {1, 1, h, w}), o.dtype(dtype)));
  }
  gclab::train::ModelCheckpointing checkpointing(*m);
  if (device.is_meta()) {
    gclab::memory::MetaCount count(target);
    return checkpointing.probe_blocks(in, [&] { return count.live(); });
  }
  gclab::memory::MemoryMeter meter(torch::kCPU);
  return checkpointing.probe_blocks(in, [&] { return meter.stats().live_bytes; });
}

// The kinds of block in call order: a block's name without its index ("single_transformer_blocks"), one
// row per run of blocks of that name that keep the same bytes (SD3's last joint block keeps less).
struct Kind {
  std::string name;
  int count = 0;
  size_t first = 0;
};
std::vector<Kind> kinds(const std::vector<std::string>& names, const std::vector<int64_t>& kept) {
  std::vector<Kind> out;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string name = names[i].substr(0, names[i].rfind('.'));
    if (!out.empty() && out.back().name == name && kept[out.back().first] == kept[i])
      ++out.back().count;
    else
      out.push_back({name, 1, i});
  }
  return out;
}

}  // namespace

int main() {
  const std::vector<std::string> names = {
      "flux-dev", "flux-schnell", "flux-kontext",         "chroma", "flux2-dev",  "flux2-klein-4b", "flux2-klein-9b",
      "flex1",    "qwen-image",   "qwen-image-edit-2509", "zimage", "sd35-large", "dit-xl2"};
  // A model whose reference images are optional (FLUX.2) twice: text-to-image, then with one control
  // image of the image's size (its tokens capped at 1024²'s).
  std::vector<std::pair<std::string, ModelSpec>> full;
  for (const auto& name : names) {
    ModelSpec s = spec_by_preset(name);
    if (s.raw_references) {
      ModelSpec plain = s;
      plain.reference_tokens = false;
      full.emplace_back(name, plain);
      full.emplace_back(name + " + reference", s);
    } else {
      full.emplace_back(name, s);
    }
  }
  std::printf("# Model families: sizes and per-block activations\n\n");
  std::printf(
      "Produced by `build/bin/model_shapes` (bench/model_shapes.cpp). Parameters come from building each\n"
      "preset on the meta device; activations from walking each block's forward there (model/activations.h),\n"
      "which tests/train/block_walk_test.cpp checks block by block against the tracking allocator.\n\n");
  std::printf("## Full-size presets\n\n");
  std::printf(
      "| preset | parameters | bf16 weights | image tokens 512 / 768 / 1024 / 1536 | text tokens "
      "|\n|---|---|---|---|---|\n");
  for (const auto& [name, s] : full) {
    auto m = build_transformer(s, torch::TensorOptions().device(torch::kMeta).dtype(torch::kBFloat16));
    int64_t bytes = 0;
    for (const auto& p : m->parameters()) bytes += static_cast<int64_t>(p.nbytes());
    // The image's tokens; a raw reference's beside them where the row has one.
    auto tokens = [&s = s](int64_t side) {
      return static_cast<long long>(s.raw_references ? step_tokens(s, {1, 1, side, side}).image
                                                     : image_tokens(s, {1, 1, side, side}));
    };
    std::printf("| %s | %lld | %s | %lld / %lld / %lld / %lld | %lld |\n", name.c_str(),
                static_cast<long long>(parameter_count(*m)), human(bytes).c_str(), tokens(512), tokens(768),
                tokens(1024), tokens(1536), static_cast<long long>(text_tokens(s, 77)));
  }
  std::printf(
      "\nQwen-Image-Edit-2509's image tokens include one 1024² reference image (+4096) where it is trained "
      "with a control image, FLUX.1 Kontext's one reference of the image's own size (twice the count: 2048 / "
      "4608 / 8192 / 18432), and its previews' one of the preview's size; the table's counts are the target "
      "image's alone, the activations below hold the reference's. Text tokens are for a "
      "77-token prompt, and for Qwen-Image-Edit-2509 the 203 rows its control image adds (the vision "
      "tower's 196 tokens of a 384² condition image, their markers and \"Picture 1: \"). FLUX.2's rows "
      "\"+ reference\" count one control image of the image's size beside it (capped at 1024²: 1024 / 2304 / "
      "4096 / 4096 more), its rows without it none: its references are optional.\n\n");

  std::printf("## One block's saved activations, 1024×1024, batch 1, bf16\n\n");
  std::printf(
      "GC off: what one block keeps from forward to backward. GC full: what a checkpointed block keeps "
      "instead (its hidden-stream inputs). LoRA: rank 16 on every block Linear, base frozen, adapters in float32 "
      "as AI Toolkit attaches them — each adapter keeps its own float32 copy of its input, so a bf16 LoRA block "
      "keeps more than a fully trained one; the first block's input needs no gradient there, and Z-Image's "
      "refiners, without adapters, keep nothing. Walked for a GPU's kernels (LayerNorm statistics in "
      "float32).\n\n");
  std::printf(
      "| preset | block | count | GC off, full training | GC off, LoRA r16 | GC full | off / full | all blocks off | "
      "all blocks full |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& [name, s] : full) {
    const auto block_names = build_transformer(s, torch::TensorOptions().device(torch::kMeta))->block_names();
    const auto off = probe(s, 1024, 1024, torch::kBFloat16, 0, torch::kMeta, c10::kCUDA);
    const auto lora = probe(s, 1024, 1024, torch::kBFloat16, 16, torch::kMeta, c10::kCUDA);
    std::vector<BlockBytes> per_block;
    for (size_t i = 0; i < off.kept_bytes.size(); ++i) per_block.push_back({off.kept_bytes[i], off.input_bytes[i]});
    const ActivationEstimate a = activation_estimate(per_block, step_tokens(s, {1, 1, 1024, 1024}));
    const std::vector<Kind> ks = kinds(block_names, off.kept_bytes);
    for (size_t k = 0; k < ks.size(); ++k) {
      const size_t i = ks[k].first;
      std::printf("| %s | %s | %d | %.1f MiB | %.1f MiB | %.1f MiB | %.1fx | %s | %s |\n", name.c_str(),
                  ks[k].name.c_str(), ks[k].count, mib(off.kept_bytes[i]), mib(lora.kept_bytes[i]),
                  mib(off.input_bytes[i]),
                  static_cast<double>(off.kept_bytes[i]) / static_cast<double>(off.input_bytes[i]),
                  k == 0 ? human(a.total_off_bytes).c_str() : "", k == 0 ? human(a.total_full_bytes).c_str() : "");
    }
  }

  std::printf("\n## Tiny presets: walked vs measured, 256×256, batch 1\n\n");
  std::printf(
      "Measured: the same probe forward on the CPU, each block's live bytes after it minus before minus its "
      "outputs, from the tracking CPU allocator (CPU kernels: LayerNorm keeps bf16 statistics for a bf16 "
      "input there, float32 on CUDA — the meta kernels follow the device a walk stands for).\n\n");
  std::printf(
      "| preset | block | dtype | GC off walked | GC off measured | GC full (inputs) |\n|---|---|---|---|---|---|\n");
  for (const std::string name :
       {"tiny-flux", "tiny-chroma", "tiny-flux2-klein", "tiny-qwen-image", "tiny-zimage", "tiny-sd3", "tiny-dit"}) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      const ModelSpec s = spec_by_preset(name);
      const auto names = build_transformer(s, torch::TensorOptions().device(torch::kMeta))->block_names();
      const auto walked = probe(s, 256, 256, dtype, 0, torch::kMeta);
      const auto measured = probe(s, 256, 256, dtype, 0, torch::kCPU);
      for (const Kind& k : kinds(names, walked.kept_bytes))
        std::printf("| %s | %s | %s | %lld | %lld | %lld |\n", name.c_str(), k.name.c_str(),
                    dtype == torch::kFloat ? "fp32" : "bf16", static_cast<long long>(walked.kept_bytes[k.first]),
                    static_cast<long long>(measured.kept_bytes[k.first]),
                    static_cast<long long>(walked.input_bytes[k.first]));
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
    const ModelInputs in = m->example_inputs({1, 1, 256, 256});
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
