#include "gclab/bench/bench.h"

#include "bench/cell.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include <ATen/cuda/CUDAEvent.h>

#include "gclab/config/byte_size.h"
#include "gclab/log/log.h"
#include "gclab/memory/device.h"
#include "gclab/model/activations.h"
#include "gclab/nn/layers.h"
#include "gclab/train/predict.h"

namespace gclab::bench {

namespace {

// The forward alone at the cell — the loss of one synthetic micro-batch, its graph dropped — timed as
// run_cell times a step; the median of three after one to warm up.
double forward_ms(train::Session& session, const model::SampleShape& shape) {
  const train::MicroBatch mb = session.micro_batch(session.synthetic_batch(shape));
  train::StepOptions so;
  so.dtype = session.plan().compute_dtype;
  so.loss_type = session.config().train.loss_type;
  CellResult timed;
  for (int i = 0; i < 4; ++i)
    timed.step_ms.push_back(
        time_ms(session, [&] { const torch::Tensor loss = train::flow_matching_loss(session.model(), mb, so); }));
  return timed.median_ms();
}

}  // namespace

double CellResult::median_ms() const {
  std::vector<double> timed(step_ms.begin() + (step_ms.size() > 1 ? 1 : 0), step_ms.end());
  if (timed.empty()) return 0.0;
  std::sort(timed.begin(), timed.end());
  return timed[timed.size() / 2];
}

double time_ms(const train::Session& session, const std::function<void()>& work) {
  if (!session.device().is_cuda()) {
    const auto t0 = std::chrono::steady_clock::now();
    work();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  start.record();
  work();
  stop.record();
  stop.synchronize();
  return static_cast<double>(start.elapsed_time(stop));
}

CellResult run_cell(train::Session& session, const model::SampleShape& shape, int steps, bool preview) {
  CellResult out;
  auto next = [&] { return session.synthetic_batch(shape); };
  try {
    for (int s = 0; s < steps; ++s) {
      session.meter().reset_peak();
      session.phases().clear();
      out.step_ms.push_back(time_ms(session, [&] { session.train_step(s, next); }));
      auto stats = session.meter().stats();
      for (const auto& [name, bytes] : session.phases().peaks()) stats.peak_bytes = std::max(stats.peak_bytes, bytes);
      out.peak_bytes = std::max(out.peak_bytes, stats.peak_bytes);
      out.reserved_peak_bytes =
          std::max(out.reserved_peak_bytes, std::max(stats.reserved_peak_bytes, stats.peak_bytes));
    }
    if (preview && session.sampling()) {
      session.meter().reset_peak();
      session.sample(0, {});
      out.peak_bytes = std::max(out.peak_bytes, session.meter().stats().peak_bytes);
    }
  } catch (const c10::OutOfMemoryError&) {
    session.optimizer().zero_grad();
    out.oom_phase = train::phase_name(session.current_phase());
  }
  session.phases().clear();
  return out;
}

std::vector<int> resolutions_for(const train::Session& session, std::vector<int> given) {
  const int div = session.spec().divisibility;
  // A dataset's resolution is its buckets' target area, any positive value (AI Toolkit's): the squares bench
  // measures are the largest within it (632 -> 624 at 16); one given on the command line must be a side.
  if (given.empty())
    for (const auto& d : session.config().datasets)
      for (int r : d.resolution) given.push_back(std::max(div, r / div * div));
  if (given.empty()) given = {512};
  std::sort(given.begin(), given.end());
  given.erase(std::unique(given.begin(), given.end()), given.end());
  for (int r : given)
    if (r <= 0 || r % div != 0)
      throw UserError("resolution " + std::to_string(r) + " is not a positive multiple of " + std::to_string(div) +
                      " (" + session.spec().arch + ")");
  return given;
}

double peak_bf16_flops(const std::string& name) {
  // Dense bf16 tensor-core peaks from the vendors' data sheets (SXM parts where there are two).
  const std::pair<const char*, double> table[] = {{"H200", 989.4e12}, {"H100", 989.4e12},  {"GH200", 989.4e12},
                                                  {"B200", 2250e12},  {"A100", 312e12},    {"L40S", 362e12},
                                                  {"L40", 181e12},    {"A6000", 154.8e12}, {"4090", 165.2e12}};
  for (const auto& [needle, flops] : table)
    if (name.find(needle) != std::string::npos) return flops;
  return 0;
}

// `est`: the walked blocks of this step (Session::block_activations).
double step_flops(const train::Session& session, const model::ActivationEstimate& est) {
  double forward = 0;
  for (const model::BlockBytes& b : est.per_block) forward += b.flops;
  const bool full_training = !session.config().network;
  return forward * (full_training ? 3.0 : 2.0);
}

namespace {

// One thing bench times at a cell: a policy, under a cap of its own (auto under --caps) or the run's.
struct Variant {
  ckpt::CheckpointPolicy policy;
  std::string cap;  // "25%": of the way from full's predicted peak to GC off's; empty: the run's cap
  int64_t cap_bytes = 0;
};

// The caps --caps names at a cell: a percentage of the way from full's highest predicted phase to GC off's
// (the run's memory model: every phase, step 1 and step 2), or a size.
std::vector<Variant> variants_at(train::Session& session, const BenchOptions& options,
                                 const model::SampleShape& shape) {
  std::vector<Variant> out;
  int64_t off = 0, full = 0;
  if (!options.caps.empty()) {
    const train::MemoryModel& model = session.auto_model();
    off = model.run_peak(model.step(shape, ckpt::CheckpointPolicy::off()));
    full = model.run_peak(model.step(shape, ckpt::CheckpointPolicy::full()));
  }
  for (const auto& policy : options.policies) {
    if (policy.kind != ckpt::CheckpointPolicy::Kind::Auto || options.caps.empty()) {
      out.push_back({policy, "", 0});
      continue;
    }
    for (const std::string& cap : options.caps) {
      std::optional<int64_t> bytes;
      if (!cap.empty() && cap.back() == '%') {
        char* end = nullptr;
        const std::string number = cap.substr(0, cap.size() - 1);
        const double percent = std::strtod(number.c_str(), &end);
        if (!number.empty() && *end == '\0' && percent >= 0 && percent <= 100)
          bytes = full + static_cast<int64_t>(percent / 100 * static_cast<double>(off - full));
      } else {
        bytes = config::parse_byte_size(cap);
      }
      if (!bytes || *bytes <= 0)
        throw UserError("--caps: '" + cap + "' is neither a percentage (0-100%) nor a size (e.g. 20GiB)");
      out.push_back({policy, cap, *bytes});
    }
  }
  return out;
}

// The share of full's recomputation a policy's blocks run again (their FLOPs and writes, model::recompute_cost):
// each block's mode priced by the walk (Session::block_mode_costs).
double recomputed_share(const model::BlockModeCosts& costs, const ckpt::CheckpointPolicy& policy, bool cuda) {
  double mine = 0, full = 0;
  const int n = static_cast<int>(costs.per_block.size());
  for (int i = 0; i < n; ++i) {
    const auto& block = costs.per_block[static_cast<size_t>(i)];
    const auto mode = block.find(policy.mode_for(i, n)), whole = block.find(ckpt::BlockMode::Full);
    mine += mode == block.end() ? 0 : model::recompute_cost(mode->second, cuda);
    full += whole == block.end() ? 0 : model::recompute_cost(whole->second, cuda);
  }
  return full > 0 ? mine / full : 0;
}

// Each variant's steps at the cell, in the order given. With `interleave` the variants take turns instead:
// `steps` rounds, each variant one warm-up step and one timed step a round, the order reversed every other
// round — so that a machine whose speed drifts over minutes (a shared virtual machine's) slows every
// variant alike, and none always runs first.
std::vector<CellResult> time_variants(train::Session& session, const std::vector<Variant>& variants,
                                      const model::SampleShape& shape, int steps, bool interleave,
                                      std::vector<ckpt::CheckpointPolicy>& applied) {
  std::vector<CellResult> out(variants.size());
  applied.assign(variants.size(), ckpt::CheckpointPolicy::off());
  struct RunCap {  // the run's cap back however a variant ends
    train::Session& session;
    ~RunCap() { session.restore_cap(); }
  } run_cap{session};
  const int rounds = interleave ? std::max(steps - 1, 2) : 1;  // `steps` counts the warm-up
  for (int round = 0; round < rounds; ++round)
    for (size_t k = 0; k < variants.size(); ++k) {
      const size_t v = round % 2 == 0 ? k : variants.size() - 1 - k;
      if (out[v].oom_phase) continue;
      if (variants[v].cap_bytes > 0) session.set_cap(variants[v].cap_bytes);
      session.apply_policy(variants[v].policy, shape);
      applied[v] = session.applied_policy();
      CellResult cell = run_cell(session, shape, interleave ? 2 : steps, false);
      if (variants[v].cap_bytes > 0) session.restore_cap();
      cell.step_ms.erase(cell.step_ms.begin(), cell.step_ms.begin() + std::min<size_t>(1, cell.step_ms.size()));
      out[v].oom_phase = cell.oom_phase;
      out[v].step_ms.insert(out[v].step_ms.end(), cell.step_ms.begin(), cell.step_ms.end());
      out[v].peak_bytes = std::max(out[v].peak_bytes, cell.peak_bytes);
      out[v].reserved_peak_bytes = std::max(out[v].reserved_peak_bytes, cell.reserved_peak_bytes);
    }
  for (auto& c : out) c.step_ms.insert(c.step_ms.begin(), 0.0);  // median_ms drops a warm-up
  return out;
}

}  // namespace

std::vector<BenchRow> run_bench(train::Session& session, const BenchOptions& given) {
  using Kind = ckpt::CheckpointPolicy::Kind;
  BenchOptions options = given;
  if (options.policies.empty()) options.policies = {ckpt::CheckpointPolicy::off(), ckpt::CheckpointPolicy::full()};
  std::vector<int> batches = options.batches;
  if (batches.empty()) batches = {session.config().train.batch_size};
  session.precompute_text(session.captions_of(session.synthetic_batch({1, 1, 64, 64})));

  double peak_flops = options.peak_flops;
  if (session.device().is_cuda() && peak_flops <= 0) {
    const auto devices = memory::describe_devices();
    const int index = session.device().has_index() ? session.device().index() : 0;
    for (const auto& g : devices.gpus)
      if (g.index == index) peak_flops = peak_bf16_flops(g.name);
  }
  const std::vector<ckpt::BlockMode> modes = {ckpt::BlockMode::None,          ckpt::BlockMode::Full,
                                              ckpt::BlockMode::SelectiveAttn, ckpt::BlockMode::SelectiveMlp,
                                              ckpt::BlockMode::SelectiveOps,  ckpt::BlockMode::Offload};
  std::vector<BenchRow> rows;
  const std::unique_ptr<train::Session> walk = session.walk_twin();  // the run on the meta device
  for (int resolution : resolutions_for(session, options.resolutions))
    for (int batch : batches) {
      const model::SampleShape shape = square_cell(session, batch, resolution);
      const model::ActivationEstimate est = walk->block_activations(shape);
      const model::BlockModeCosts costs = walk->block_mode_costs(shape, modes);
      const std::vector<Variant> variants = variants_at(session, options, shape);
      std::vector<ckpt::CheckpointPolicy> applied;
      const std::vector<CellResult> cells =
          time_variants(session, variants, shape, options.steps + 1, !options.caps.empty(), applied);
      std::optional<BenchRow> off;
      const size_t first = rows.size();
      for (size_t v = 0; v < variants.size(); ++v) {
        BenchRow row;
        row.world_size = session.plan().world.size;
        row.policy = variants[v].policy.to_string();
        row.cap = variants[v].cap;
        row.cap_bytes = variants[v].cap_bytes;
        row.applied = applied[v].to_string();
        row.resolution = resolution;
        row.batch = batch;
        row.frames = static_cast<int>(shape.frames);
        // The walked blocks under the policy's modes (a budget resolved to its blocks): none for selective.
        if (const auto kept = model::activations_under(est, applied[v]))
          row.predicted_activation_bytes = kept->peak_bytes;
        row.recomputed_share = recomputed_share(costs, applied[v], session.device().is_cuda());
        if (cells[v].oom_phase) {
          row.oom = true;
          row.oom_phase = *cells[v].oom_phase;
        } else {
          row.step_ms = cells[v].median_ms();
          row.peak_bytes = cells[v].peak_bytes;
          row.reserved_peak_bytes = cells[v].reserved_peak_bytes;
          row.model_tflop = step_flops(session, est) / 1e12;
          if (peak_flops > 0 && session.device().is_cuda())
            row.mfu = row.model_tflop * 1e12 / (row.step_ms / 1e3 * peak_flops);
          if (variants[v].policy.kind == Kind::Off) try {
              session.apply_policy(variants[v].policy, shape);
              row.forward_ms = forward_ms(session, shape);
            } catch (const c10::OutOfMemoryError&) {  // the step fit, its forward alone did not: no theory
            }
        }
        if (variants[v].policy.kind == Kind::Off) off = row;
        rows.push_back(row);
      }
      for (size_t k = first; k < rows.size(); ++k) {
        BenchRow& r = rows[k];
        if (!off || off->oom || r.oom) continue;
        r.time_ratio = r.step_ms / off->step_ms;
        r.peak_ratio = static_cast<double>(r.peak_bytes) / static_cast<double>(off->peak_bytes);
        if (off->forward_ms > 0) r.theory_ratio = 1 + r.recomputed_share * off->forward_ms / off->step_ms;
      }
    }
  session.apply_policy(session.config().train.policy(), square_cell(session, session.config().train.batch_size, 512));
  return rows;
}

namespace {

// What fit grows at a resolution: the batch (an image run), or a video run's frames at its batch — the counts
// its autoencoder takes (model::frames_of_latent). Step n (from 1) is batch n, or n latent frames.
struct Lever {
  const model::ModelSpec* spec = nullptr;
  bool frames = false;
  int batch = 1, resolution = 0;
  model::SampleShape at(int n) const {
    return frames ? model::SampleShape{batch, model::frames_of_latent(*spec, n), resolution, resolution}
                  : model::SampleShape{n, 1, resolution, resolution};
  }
  int value(int n) const { return n == 0 ? 0 : static_cast<int>(frames ? at(n).frames : at(n).batch); }
};

// The largest step up to `most` the memory model predicts under the cap: every step's peak and, when the
// config samples, the preview's (what fit's attempts run); -1 for a policy it does not predict (selective;
// budget, which fit resolves per cell) or without a cap.
int predicted_largest(const train::MemoryModel& model, const ckpt::CheckpointPolicy& policy, const Lever& lever,
                      int most) {
  const int64_t cap = model.estimate().cap_bytes;
  if (cap <= 0 || policy.kind == ckpt::CheckpointPolicy::Kind::Budget) return -1;
  int largest = 0;
  for (int n = 1; n <= most; ++n) {
    if (policy.kind == ckpt::CheckpointPolicy::Kind::Auto) {  // the plan auto makes at this batch, under the cap
      if (!model.auto_plan(policy, lever.at(n), cap, "vram_cap").fits) break;
      largest = n;
      continue;
    }
    const train::StepEstimate s = model.step(lever.at(n), policy);
    int64_t peak = std::max(s.total_bytes, s.first_total_bytes);
    if (const auto p = model.estimate().preview) peak = std::max(peak, p->total_bytes);
    if (peak > cap) break;
    largest = n;
  }
  return largest;
}

}  // namespace

std::vector<FitRow> run_fit(train::Session& session, const std::vector<ckpt::CheckpointPolicy>& policies,
                            const std::vector<int>& resolutions, int max_batch, int max_frames) {
  std::unique_ptr<train::MemoryModel> predicted;
  {
    log::QuietScope quiet;
    predicted = std::make_unique<train::MemoryModel>(session.config());
  }
  session.precompute_text(session.captions_of(session.synthetic_batch({1, 1, 64, 64})));
  Lever lever;
  lever.frames = model::takes_frames(session.spec());
  lever.batch = session.config().train.batch_size;
  lever.spec = &session.spec();
  const int most = lever.frames ? static_cast<int>(model::latent_frames(session.spec(), max_frames)) : max_batch;
  std::vector<FitRow> out;
  for (int resolution : resolutions_for(session, resolutions))
    for (const auto& policy : policies) {
      lever.resolution = resolution;
      FitRow row;
      row.world_size = session.plan().world.size;
      row.policy = policy.to_string();
      row.resolution = resolution;
      row.lever = lever.frames ? "num_frames" : "batch";
      const int predicted_n = predicted_largest(*predicted, policy, lever, most);
      auto attempt = [&](int n) -> std::optional<int64_t> {
        session.apply_policy(policy, lever.at(n));
        const CellResult cell = run_cell(session, lever.at(n), 2, true);
        if (cell.oom_phase) return std::nullopt;
        return cell.peak_bytes;
      };
      int good = 0, bad = most + 1;
      int64_t good_peak = 0;
      for (int n = 1; n <= most; n *= 2) {  // doubling until the first failure
        if (auto peak = attempt(n)) {
          good = n, good_peak = *peak;
        } else {
          bad = n;
          break;
        }
      }
      while (bad - good > 1 && good > 0) {  // then bisect between the last fit and the failure
        const int mid = std::min(most, (good + bad) / 2);
        if (mid == good) break;
        if (auto peak = attempt(mid))
          good = mid, good_peak = *peak;
        else
          bad = mid;
      }
      row.largest = lever.value(good);
      row.predicted = predicted_n < 0 ? -1 : lever.value(predicted_n);
      row.batch = lever.frames ? lever.batch : row.largest;
      row.peak_bytes = good_peak;
      out.push_back(row);
    }
  session.apply_policy(session.config().train.policy(), session.plan().largest.shape());
  return out;
}

void write_bench_csv(const std::filesystem::path& path, const std::vector<BenchRow>& rows) {
  std::ofstream out(path);
  // A policy's text holds commas (blocks:[0,3], modes:[full*2,none]): quoted, as RFC 4180 has it.
  auto quoted = [](const std::string& text) {
    std::string q = "\"";
    for (char c : text) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  out << "policy,resolution,batch,oom,oom_phase,step_ms,time_ratio,peak_bytes,reserved_peak_bytes,peak_ratio,"
         "predicted_activation_bytes,model_tflop,mfu,forward_ms,theory_ratio,cap,cap_bytes,applied,recomputed_share,"
         "world_size\n";
  for (const auto& r : rows)
    out << quoted(r.policy) << "," << r.resolution << "," << r.batch << "," << (r.oom ? 1 : 0) << "," << r.oom_phase
        << "," << r.step_ms << "," << r.time_ratio << "," << r.peak_bytes << "," << r.reserved_peak_bytes << ","
        << r.peak_ratio << "," << r.predicted_activation_bytes << "," << r.model_tflop << "," << r.mfu << ","
        << r.forward_ms << "," << r.theory_ratio << "," << quoted(r.cap) << "," << r.cap_bytes << ","
        << quoted(r.applied) << "," << r.recomputed_share << "," << r.world_size << "\n";
}

std::string bench_table(const std::vector<BenchRow>& rows) {
  std::ostringstream s;
  s << "| resolution | batch | policy | step ms | vs off | theory | peak | reserved | vs off | walked activations | "
       "model TFLOP | MFU |\n";
  s << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  char buf[64];
  for (const auto& r : rows) {
    s << "| " << r.resolution << " | " << r.batch << " | " << r.policy
      << (r.cap.empty() ? std::string() : " under " + r.cap + " (" + config::format_bytes(r.cap_bytes) + ")")
      << (r.applied.empty() || r.applied == r.policy ? std::string() : ": " + r.applied) << " | ";
    if (r.oom) {
      s << "OOM (" << r.oom_phase << ") | | | | | | " << config::format_bytes(r.predicted_activation_bytes)
        << " | | |\n";
      continue;
    }
    std::snprintf(buf, sizeof buf, "%.1f", r.step_ms);
    s << buf << " | ";
    if (r.time_ratio > 0) std::snprintf(buf, sizeof buf, "%.2fx", r.time_ratio), s << buf;
    s << " | ";
    if (r.theory_ratio > 0) std::snprintf(buf, sizeof buf, "%.2fx", r.theory_ratio), s << buf;
    s << " | " << config::format_bytes(r.peak_bytes) << " | " << config::format_bytes(r.reserved_peak_bytes) << " | ";
    if (r.peak_ratio > 0) std::snprintf(buf, sizeof buf, "%.2fx", r.peak_ratio), s << buf;
    s << " | " << (r.predicted_activation_bytes ? config::format_bytes(r.predicted_activation_bytes) : "-") << " | ";
    std::snprintf(buf, sizeof buf, "%.4g", r.model_tflop);
    s << buf << " | ";
    if (r.mfu > 0) std::snprintf(buf, sizeof buf, "%.1f%%", 100 * r.mfu), s << buf;
    s << " |\n";
  }
  return s.str();
}

}  // namespace gclab::bench
