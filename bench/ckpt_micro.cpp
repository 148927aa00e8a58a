// Micro-benchmark of the checkpoint module (not a test): a stack of L transformer-like blocks (frozen
// base + LoRA adapters, dropout), GC off vs each policy, measured side by side in one process.
//
// Prints, per token count: step time (median of interleaved runs) and its ratio to GC off, beside the
// theoretical ratio (full: 1 + t_fwd / t_step, where t_fwd is a no-grad forward of the same blocks),
// activation bytes kept between forward and backward (exact, from the tracking allocator) and the
// step's peak, with the ratio to GC off, and for `full` the prediction L x block input + one block's
// internals. Then the same stack in Python torch (tests/reference/toy_stack.py) with
// torch.utils.checkpoint, GC off and full, run by the venv's python with the same thread count, beside
// gclab's figures.
//
//   build/bin/ckpt_micro [--blocks 8] [--tokens 256,1024] [--width 256] [--batch 4] [--runs 7]
//                        [--python PATH | --python none]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../tests/support/toy_blocks.h"
#include "gclab/ckpt/policy.h"
#include "gclab/memory/tracker.h"

namespace {

using gclab::ckpt::CheckpointPolicy;
using gclab::memory::CpuMemoryTracker;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double mib(double bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

struct Measured {
  std::vector<double> step_s;
  std::int64_t kept_bytes = 0;  // live after forward, minus before and minus the output
  std::int64_t peak_bytes = 0;  // step peak above the live bytes before the step
};

}  // namespace

int main(int argc, char** argv) {
  int blocks = 8, width = 256, batch = 4, runs = 7;
  std::string python = GCLAB_PYTHON;
  std::vector<int> token_counts = {256, 1024};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--blocks")
      blocks = std::stoi(value);
    else if (key == "--width")
      width = std::stoi(value);
    else if (key == "--batch")
      batch = std::stoi(value);
    else if (key == "--runs")
      runs = std::stoi(value);
    else if (key == "--python")
      python = value;
    else if (key == "--tokens") {
      token_counts.clear();
      std::stringstream s(value);
      for (std::string t; std::getline(s, t, ',');) token_counts.push_back(std::stoi(t));
    } else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      return 2;
    }
  }
  std::string tokens_list;
  for (int t : token_counts) tokens_list += (tokens_list.empty() ? "" : ",") + std::to_string(t);
  // Python first, in its own process, so the two never share the cores.
  nlohmann::json py;
  if (python != "none") {
    const std::string command = "\"" + python + "\" \"" GCLAB_SOURCE_DIR "/tests/reference/toy_stack.py\" bench" +
                                " --blocks " + std::to_string(blocks) + " --width " + std::to_string(width) +
                                " --batch " + std::to_string(batch) + " --tokens " + tokens_list + " --runs " +
                                std::to_string(runs) + " --threads " + std::to_string(at::get_num_threads()) +
                                " 2>/dev/null";
    std::string text;
    if (FILE* pipe = popen(command.c_str(), "r")) {
      char buf[4096];
      for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) text.append(buf, n);
      pclose(pipe);
    }
    py = nlohmann::json::parse(text, nullptr, false);
    if (py.is_discarded() || !py.contains("tokens")) {
      std::fprintf(stderr, "ckpt_micro: the Python run failed (%s); continuing without it\n", command.c_str());
      py = nlohmann::json();
    }
  }
  CpuMemoryTracker tracker;
  const std::vector<std::string> policies = {"off", "full", "every:2", "selective:attn", "selective:mlp"};
  std::printf(
      "# ckpt_micro: %d blocks, width %d, batch %d, frozen base + LoRA rank 4, dropout 0.1, fp32, "
      "%d threads, median of %d interleaved runs\n\n",
      blocks, width, batch, at::get_num_threads(), runs);

  for (int tokens : token_counts) {
    gclab::testing::ToyBlockOptions o;
    o.width = width;
    o.heads = width / 64;
    gclab::testing::ToyStack stack(blocks, o, 1);
    const torch::Tensor x = torch::randn({batch, tokens, width});
    std::map<std::string, Measured> m;
    std::vector<double> fwd_s;

    auto run_step = [&](const std::string& policy, bool record_memory) {
      gclab::ckpt::apply_checkpoint_policy(stack.blocks, CheckpointPolicy::parse(policy));
      stack.zero_grad();
      const std::int64_t before = tracker.stats().live_bytes;
      tracker.reset_peak();
      const auto t0 = std::chrono::steady_clock::now();
      torch::Tensor out = stack.forward(x);
      const std::int64_t kept = tracker.stats().live_bytes - before - static_cast<std::int64_t>(out.nbytes());
      out.pow(2).mean().backward();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (record_memory) {
        m[policy].kept_bytes = kept;
        m[policy].peak_bytes = tracker.stats().peak_bytes - before;
      }
      return s;
    };
    for (const auto& p : policies) run_step(p, true);  // warm-up, and the (deterministic) memory figures
    for (int r = 0; r < runs; ++r) {
      for (std::size_t k = 0; k < policies.size(); ++k) {
        const std::string& p = policies[(k + static_cast<std::size_t>(r)) % policies.size()];
        m[p].step_s.push_back(run_step(p, false));
      }
      torch::NoGradGuard no_grad;
      const auto t0 = std::chrono::steady_clock::now();
      stack.forward(x);
      fwd_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }

    const double t_step = median(m["off"].step_s), t_fwd = median(fwd_s);
    const std::int64_t input_bytes = static_cast<std::int64_t>(x.nbytes());
    const std::int64_t one_block = m["off"].kept_bytes / blocks;
    // The first block's input is x itself, which exists anyway; each later block keeps its input.
    std::printf("## %d tokens (block input %.2f MiB; t_step(off) %.1f ms, t_fwd(no grad) %.1f ms)\n\n", tokens,
                mib(input_bytes), 1e3 * t_step, 1e3 * t_fwd);
    std::printf("| policy | step ms | ratio | theory | kept after fwd MiB | ratio | step peak MiB | ratio |\n");
    std::printf("|---|---|---|---|---|---|---|---|\n");
    for (const auto& p : policies) {
      const double t = median(m[p].step_s);
      std::string theory = "-";
      char buf[32];
      if (p == "off") theory = "1.00";
      if (p == "full") std::snprintf(buf, sizeof buf, "%.2f", 1 + t_fwd / t_step), theory = buf;
      if (p == "every:2") std::snprintf(buf, sizeof buf, "%.2f", 1 + 0.5 * t_fwd / t_step), theory = buf;
      std::printf("| %s | %.1f | %.2f | %s | %.2f | %.3f | %.2f | %.3f |\n", p.c_str(), 1e3 * t, t / t_step,
                  theory.c_str(), mib(m[p].kept_bytes), static_cast<double>(m[p].kept_bytes) / m["off"].kept_bytes,
                  mib(m[p].peak_bytes), static_cast<double>(m[p].peak_bytes) / m["off"].peak_bytes);
    }
    // The step peak with `full`: the kept inputs, one block's internals recomputed, and the backward's
    // own workspace (gradient buffers), which the run without checkpointing measures as peak - kept.
    const std::int64_t workspace = m["off"].peak_bytes - m["off"].kept_bytes;
    const std::int64_t simple_peak = blocks * input_bytes + one_block;
    const std::int64_t full_peak = m["full"].kept_bytes + one_block + workspace;
    auto off_by = [](std::int64_t measured, std::int64_t predicted) {
      return 100.0 * (static_cast<double>(measured) - static_cast<double>(predicted)) / static_cast<double>(predicted);
    };
    std::printf("\nfull, kept after forward: %.2f MiB measured vs %.2f MiB predicted ((L-1) x block input): %+.1f%%\n",
                mib(m["full"].kept_bytes), mib((blocks - 1) * input_bytes),
                off_by(m["full"].kept_bytes, (blocks - 1) * input_bytes));
    std::printf(
        "full, step peak: %.2f MiB measured vs %.2f MiB predicted (L x input + one block's internals %.2f MiB): "
        "%+.1f%%; with the backward workspace (%.2f MiB, measured GC off) added: %.2f MiB, %+.1f%%\n\n",
        mib(m["full"].peak_bytes), mib(simple_peak), mib(one_block), off_by(m["full"].peak_bytes, simple_peak),
        mib(workspace), mib(full_peak), off_by(m["full"].peak_bytes, full_peak));
    if (!py.is_null() && py["tokens"].contains(std::to_string(tokens))) {
      const auto& row = py["tokens"][std::to_string(tokens)];
      const auto fig = [&](const char* tag, const char* key) { return row[tag][key].get<double>(); };
      const double c_off = t_step, c_full = median(m["full"].step_s);
      std::printf(
          "Python torch %s, torch.utils.checkpoint(use_reentrant=False), same stack and threads. Peak is\n"
          "measured differently on each side (gclab: its tracking allocator; Python: the profiler's CPU\n"
          "allocation events), so compare each side's ratio to its own GC-off run:\n\n",
          py["torch"].get<std::string>().c_str());
      std::printf(
          "| | step ms off | step ms full | full / off | kept after fwd MiB | step peak MiB off | full | full / off "
          "|\n");
      std::printf("|---|---|---|---|---|---|---|---|\n");
      std::printf("| gclab C++ | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %.3f |\n", 1e3 * c_off, 1e3 * c_full,
                  c_full / c_off, mib(m["full"].kept_bytes), mib(m["off"].peak_bytes), mib(m["full"].peak_bytes),
                  static_cast<double>(m["full"].peak_bytes) / m["off"].peak_bytes);
      for (const char* tag : {"full", "full_no_early_stop"}) {
        std::printf("| Python%s | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %.3f |\n",
                    std::string(tag) == "full" ? "" : ", early stop off", 1e3 * fig("off", "step_s"),
                    1e3 * fig(tag, "step_s"), fig(tag, "step_s") / fig("off", "step_s"), mib(fig(tag, "kept_bytes")),
                    mib(fig("off", "peak_bytes")), mib(fig(tag, "peak_bytes")),
                    fig(tag, "peak_bytes") / fig("off", "peak_bytes"));
      }
      std::printf("\ngclab full step time / Python full: %.2f (early stop off: %.2f)\n\n",
                  c_full / fig("full", "step_s"), c_full / fig("full_no_early_stop", "step_s"));
    }
  }
  return 0;
}
