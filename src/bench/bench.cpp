#include "gclab/bench/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "gclab/config/byte_size.h"
#include "gclab/memory/tracker.h"
#include "gclab/model/activations.h"
#include "gclab/model/lora.h"
#include "gclab/train/checkpointing.h"
#include "gclab/train/flow.h"
#include "gclab/train/model_setup.h"
#include "gclab/train/optimizer.h"
#include "gclab/train/trainer.h"

namespace gclab::bench {

std::vector<BenchRow> run_bench(const config::ProcessConfig& config, const BenchOptions& options) {
  const model::ModelSpec spec = model::spec_for(config.model);
  const torch::Device device = train::resolve_device(config.device);
  const bool bf16 = config.train.dtype == "bf16";
  if (device.is_cpu()) model::check_fits_in_host_memory(spec, "gclab bench");
  std::vector<int> resolutions = options.resolutions, batches = options.batches;
  if (resolutions.empty())
    for (const auto& d : config.datasets) resolutions.insert(resolutions.end(), d.resolution.begin(), d.resolution.end());
  if (resolutions.empty()) resolutions = {512};
  std::sort(resolutions.begin(), resolutions.end());
  resolutions.erase(std::unique(resolutions.begin(), resolutions.end()), resolutions.end());
  if (batches.empty()) batches = {config.train.batch_size};

  std::optional<memory::CpuMemoryTracker> tracker;
  if (device.is_cpu() && !memory::CpuMemoryTracker::installed()) tracker.emplace(config.vram_cap.bytes);
  memory::MemoryMeter meter(device);
  if (!device.is_cpu() && config.vram_cap.bytes > 0) meter.set_cap(config.vram_cap.bytes);

  torch::manual_seed(static_cast<uint64_t>(config.training_seed.value_or(42)));
  const train::TrainingModel built = train::build_training_model(config, spec, device);
  auto m = built.model;
  const model::LoraOptions lora = built.lora;
  train::ModelCheckpointing checkpointing(*m);
  std::vector<std::pair<std::string, torch::Tensor>> trainable;
  for (const auto& p : m->named_parameters())
    if (p.value().requires_grad()) trainable.emplace_back(p.key(), p.value());
  train::AdamWOptions adam;
  auto optimizer = train::make_optimizer(config.train.optimizer, trainable, adam);

  model::ActivationOptions ao;
  ao.element_bytes = bf16 ? 2 : 4;
  ao.lora_rank = config.network ? lora.rank : 0;
  ao.conditioning_grad = !config.network;
  ao.layer_norm_stats_bytes = device.is_cpu() ? ao.element_bytes : 4;

  std::vector<BenchRow> rows;
  for (int resolution : resolutions)
    for (int batch : batches) {
      const model::ModelInputs inputs = m->example_inputs(batch, resolution, resolution, 0, torch::TensorOptions().device(device));
      const auto est = model::estimate_activations(spec, batch, resolution, resolution, 0, ao);
      std::map<std::string, BenchRow> by_policy;
      for (const std::string& name : options.policies) {
        BenchRow row;
        row.policy = name;
        row.resolution = resolution;
        row.batch = batch;
        const auto policy = ckpt::CheckpointPolicy::parse(name);
        row.predicted_activation_bytes = policy.kind == ckpt::CheckpointPolicy::Kind::Off ? est.total_off_bytes
                                         : policy.kind == ckpt::CheckpointPolicy::Kind::Full
                                             ? est.full_with_recompute_bytes
                                             : 0;
        if (policy.kind == ckpt::CheckpointPolicy::Kind::Budget)
          checkpointing.apply(checkpointing.resolve_budget(inputs, policy.budget_bytes, meter).policy);
        else
          checkpointing.apply(policy);
        train::MicroBatch mb;
        mb.conditioning = inputs;
        mb.x0 = inputs.latents;
        train::StepOptions so;
        so.autocast_bf16 = bf16;
        std::vector<double> ms;
        std::string phase;
        try {
          for (int s = 0; s <= options.steps; ++s) {
            mb.noise = torch::randn_like(mb.x0);
            mb.t = train::sample_timesteps("sigmoid", batch, device);
            meter.reset_peak();
            const auto t0 = std::chrono::steady_clock::now();
            phase = "forward/backward";
            train::flow_matching_step(*m, mb, so);
            phase = "optimizer";
            optimizer->step(1e-6);
            optimizer->zero_grad();
            if (device.is_cuda()) torch::cuda::synchronize();
            const double elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (s > 0) ms.push_back(elapsed);  // the first step warms up
            row.peak_bytes = std::max(row.peak_bytes, meter.stats().peak_bytes);
          }
          std::sort(ms.begin(), ms.end());
          row.step_ms = ms[ms.size() / 2];
        } catch (const c10::OutOfMemoryError&) {
          optimizer->zero_grad();
          row.oom = true;
          row.oom_phase = phase;
        }
        by_policy[name] = row;
      }
      for (const std::string& name : options.policies) {
        BenchRow row = by_policy[name];
        if (by_policy.count("off") && !by_policy["off"].oom && !row.oom) {
          row.time_ratio = row.step_ms / by_policy["off"].step_ms;
          row.peak_ratio = static_cast<double>(row.peak_bytes) / static_cast<double>(by_policy["off"].peak_bytes);
        }
        rows.push_back(row);
      }
    }
  return rows;
}

std::vector<FitRow> run_fit(const config::ProcessConfig& config, const std::vector<std::string>& policies,
                            const std::vector<int>& resolutions, int max_batch) {
  std::vector<FitRow> out;
  for (int resolution : resolutions)
    for (const auto& policy : policies) {
      FitRow row;
      row.policy = policy;
      row.resolution = resolution;
      auto attempt = [&](int batch) -> std::optional<int64_t> {
        BenchOptions o;
        o.policies = {policy};
        o.batches = {batch};
        o.resolutions = {resolution};
        o.steps = 1;
        const auto r = run_bench(config, o).front();
        if (r.oom) return std::nullopt;
        return r.peak_bytes;
      };
      int good = 0, bad = max_batch + 1;
      int64_t good_peak = 0;
      for (int b = 1; b <= max_batch; b *= 2) {  // doubling until the first failure
        if (auto peak = attempt(b)) {
          good = b, good_peak = *peak;
        } else {
          bad = b;
          break;
        }
      }
      while (bad - good > 1 && good > 0 && good < max_batch) {  // then bisect between the last fit and the failure
        const int mid = std::min(max_batch, (good + bad) / 2);
        if (mid == good) break;
        if (auto peak = attempt(mid)) good = mid, good_peak = *peak;
        else bad = mid;
      }
      row.largest_batch = good;
      row.peak_bytes = good_peak;
      out.push_back(row);
    }
  return out;
}

void write_bench_csv(const std::filesystem::path& path, const std::vector<BenchRow>& rows) {
  std::ofstream out(path);
  out << "policy,resolution,batch,oom,oom_phase,step_ms,time_ratio,peak_bytes,peak_ratio,predicted_activation_bytes\n";
  for (const auto& r : rows)
    out << r.policy << "," << r.resolution << "," << r.batch << "," << (r.oom ? 1 : 0) << "," << r.oom_phase << ","
        << r.step_ms << "," << r.time_ratio << "," << r.peak_bytes << "," << r.peak_ratio << ","
        << r.predicted_activation_bytes << "\n";
}

std::string bench_table(const std::vector<BenchRow>& rows) {
  std::ostringstream s;
  s << "| resolution | batch | policy | step ms | vs off | peak | vs off | ledger activations |\n";
  s << "|---|---|---|---|---|---|---|---|\n";
  char buf[64];
  for (const auto& r : rows) {
    s << "| " << r.resolution << " | " << r.batch << " | " << r.policy << " | ";
    if (r.oom) {
      s << "OOM (" << r.oom_phase << ") | | | | " << config::format_bytes(r.predicted_activation_bytes) << " |\n";
      continue;
    }
    std::snprintf(buf, sizeof buf, "%.1f", r.step_ms);
    s << buf << " | ";
    if (r.time_ratio > 0) std::snprintf(buf, sizeof buf, "%.2fx", r.time_ratio), s << buf;
    s << " | " << config::format_bytes(r.peak_bytes) << " | ";
    if (r.peak_ratio > 0) std::snprintf(buf, sizeof buf, "%.2fx", r.peak_ratio), s << buf;
    s << " | " << (r.predicted_activation_bytes ? config::format_bytes(r.predicted_activation_bytes) : "-") << " |\n";
  }
  return s.str();
}

}  // namespace gclab::bench
