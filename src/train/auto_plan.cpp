// checkpoint_policy: auto — the per-block plan chosen from the memory model (train/predict.h, AutoPlan).
//
// Each block's modes are walked once at the largest cell (Session::block_mode_costs: what the block keeps
// under none, selective attn / mlp, full and, on CUDA, offload, and the FLOPs its backward runs again). The
// cheapest set of modes whose kept bytes fall by what the cap asks (a multiple-choice knapsack over the
// bytes in 1/4096ths of the need, each saving floored so that none is over-counted) is then walked whole — the step's
// forward and backward on the meta model, step 1 and step 2, beside the load, caches, previews and save — and where the
// walk finds it still above the cap (the blocks' bytes do not add up to a step's peak exactly: the backward holds one
// block's recompute beside the rest), the need grows by the overshoot and the choice is made again.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "gclab/config/byte_size.h"
#include "gclab/log/log.h"
#include "gclab/memory/phase.h"
#include "gclab/model/activations.h"
#include "gclab/train/knapsack.h"
#include "gclab/train/predict.h"
#include "gclab/train/session.h"

namespace gclab::train {

std::optional<std::vector<size_t>> cheapest_saving(const std::vector<std::vector<SavingCost>>& options, int64_t need) {
  if (need <= 0) return std::vector<size_t>(options.size(), 0);
  const int64_t unit = std::max<int64_t>(1, need / 4096);
  const size_t target = static_cast<size_t>((need + unit - 1) / unit);
  constexpr double inf = std::numeric_limits<double>::infinity();
  std::vector<double> best(target + 1, inf);
  best[0] = 0;
  // back[i][t]: the option position i took to reach t units, and the units before it.
  std::vector<std::vector<std::pair<size_t, size_t>>> back(options.size(),
                                                           std::vector<std::pair<size_t, size_t>>(target + 1));
  for (size_t i = 0; i < options.size(); ++i) {
    std::vector<double> next(target + 1, inf);
    for (size_t t = 0; t <= target; ++t) {
      if (best[t] == inf) continue;
      for (size_t o = 0; o < options[i].size(); ++o) {
        const SavingCost& op = options[i][o];
        const size_t units = static_cast<size_t>(std::max<int64_t>(op.saving, 0) / unit);  // floored: never more
        const size_t reach = std::min(target, t + std::min(units, target));
        if (best[t] + op.cost < next[reach]) next[reach] = best[t] + op.cost, back[i][reach] = {o, t};
      }
    }
    best.swap(next);
  }
  if (best[target] == inf) return std::nullopt;
  std::vector<size_t> chosen(options.size());
  for (size_t i = options.size(), t = target; i-- > 0;) chosen[i] = back[i][t].first, t = back[i][t].second;
  return chosen;
}

namespace {

// What an offloaded block's inputs cost beside full's recompute, per byte carried to host memory and back, in
// FLOP-equivalents: a GPU's bf16 matmul rate over its PCIe rate (about 400 TFLOP/s achieved against 25 GB/s,
// an H100's order of magnitude), so offload is taken only where full does not fit.
constexpr double kOffloadFlopsPerByte = 16000;

struct Option {
  ckpt::BlockMode mode = ckpt::BlockMode::None;
  int64_t saving = 0;  // bytes kept below none's
  double flops = 0;    // recomputed
  int64_t bytes = 0;   // the recompute writes
  double cost = 0;     // flops, the recompute's writes and offload's transfer
};

// The knapsack (train/knapsack.h) on the options' savings and costs.
std::optional<std::vector<size_t>> cheapest_saving(const std::vector<std::vector<Option>>& options, int64_t need) {
  std::vector<std::vector<SavingCost>> plain(options.size());
  for (size_t i = 0; i < options.size(); ++i)
    for (const Option& o : options[i]) plain[i].push_back({o.saving, o.cost});
  return cheapest_saving(plain, need);
}

// Each position's largest saving (the least cost among equals).
std::vector<size_t> most_saving(const std::vector<std::vector<Option>>& options) {
  std::vector<size_t> chosen;
  for (const auto& opts : options) {
    size_t best = 0;
    for (size_t o = 1; o < opts.size(); ++o)
      if (opts[o].saving > opts[best].saving || (opts[o].saving == opts[best].saving && opts[o].cost < opts[best].cost))
        best = o;
    chosen.push_back(best);
  }
  return chosen;
}

// Per position within one expert (every position of a model of one): its modes, each priced at the largest of
// the experts' blocks there (a forward runs one expert; one plan serves them all).
std::vector<std::vector<Option>> options_of(const model::BlockModeCosts& costs, bool cuda) {
  const size_t experts = std::max<size_t>(costs.experts, 1), per = costs.per_block.size() / experts;
  std::vector<std::vector<Option>> out(per);
  for (size_t j = 0; j < per; ++j)
    for (const auto& [mode, unused] : costs.per_block[j]) {
      Option o;
      o.mode = mode;
      int64_t none = 0, kept = 0, inputs = 0;
      bool walked = true;  // every expert's block under this mode and none (a walk that met an op without a
                           // meta kernel gave no figures for its mode: that mode is not offered)
      for (size_t e = 0; e < experts; ++e) {
        const auto& block = costs.per_block[e * per + j];
        const auto own = block.find(mode), base = block.find(ckpt::BlockMode::None);
        const auto full = block.find(ckpt::BlockMode::Full);
        if (own == block.end() || base == block.end()) {
          walked = false;
          break;
        }
        none = std::max(none, base->second.kept);
        kept = std::max(kept, own->second.kept);
        inputs = std::max(inputs, full == block.end() ? int64_t{0} : full->second.kept);
        o.flops = std::max(o.flops, own->second.recomputed_flops);
        o.bytes = std::max(o.bytes, own->second.recomputed_bytes);
      }
      if (!walked) continue;
      // The last block's backward runs first, right after the forward: what its mode frees it makes again at
      // once, beside everything the earlier blocks keep — at the backward's start, the step's peak, it saves
      // nothing (tiny-qwen-image's two blocks: modes:[ops,full] walked 64.2 MB, modes:[full,none] 50.3).
      o.saving = j + 1 == per ? 0 : none - kept;
      o.cost = model::recompute_cost({0, o.flops, o.bytes}, cuda) +
               (mode == ckpt::BlockMode::Offload ? 2.0 * kOffloadFlopsPerByte * inputs : 0);
      (mode == ckpt::BlockMode::None ? out[j].insert(out[j].begin(), o) : out[j].insert(out[j].end(), o));
    }
  for (auto& opts : out)  // none is always there, first: the knapsack's zero
    if (opts.empty() || opts.front().mode != ckpt::BlockMode::None) opts.insert(opts.begin(), Option{});
  return out;
}

// The plan found: one option per position, its highest phase, and whether it is under `limit`.
struct Found {
  std::vector<size_t> pick;
  std::pair<int64_t, memory::Phase> peak;
  bool fits = false;
};

// A plan that fits, made cheaper where the walk leaves room: the blocks' bytes may claim less than a plan
// saves (or a phase no policy changes binds), so smaller needs are tried, halving the range between the
// largest need whose plan was walked and did not fit (`failed`; none: 0) and the need that fitted; at most 3
// more walks.
template <class Walk>
Found cheaper_that_fits(const std::vector<std::vector<Option>>& options, Found fit, int64_t failed, int64_t need,
                        int64_t limit, Walk&& walk) {
  int64_t lo = failed, hi = need;  // needs whose plans do not fit / fit
  for (int round = 0; round < 3 && hi - lo > 1; ++round) {
    const int64_t mid = lo + (hi - lo) / 2;
    const std::optional<std::vector<size_t>> pick = cheapest_saving(options, mid);
    if (!pick || *pick == fit.pick) {  // the same plan down to here: look below
      hi = mid;
      continue;
    }
    const std::pair<int64_t, memory::Phase> peak = walk(*pick);
    if (peak.first <= limit)
      fit = {*pick, peak, true}, hi = mid;
    else
      lo = mid;
  }
  return fit;
}

// The cheapest plan whose whole walk (`walk`: a pick's highest phase) is under `limit`, `off_peak` being GC
// off's: the knapsack's choice for what the cap asks, walked, the need grown where the walk finds less saved
// than the blocks' bytes claimed; at most 8 rounds, then the most each block can save. Not fitting: the least
// memory walked.
template <class Walk>
Found search(const std::vector<std::vector<Option>>& options, int64_t off_peak, int64_t limit, Walk&& walk) {
  int64_t need = off_peak - limit, failed = 0;
  std::optional<Found> least;
  bool most_walked = false;
  for (int round = 0; round < 8 && !most_walked; ++round) {
    std::optional<std::vector<size_t>> pick = cheapest_saving(options, need);
    most_walked = !pick;
    if (most_walked) pick = most_saving(options);
    const Found here{*pick, walk(*pick), false};
    if (here.peak.first <= limit)
      return cheaper_that_fits(options, {here.pick, here.peak, true}, failed, need, limit, walk);
    failed = need;
    if (!least || here.peak.first < least->peak.first) least = here;
    // The blocks' bytes claimed this much; the walk found less (a selective block's recompute can even
    // raise the backward's peak). Ask for more than this plan claims — the overshoot more, and where the walk
    // found some saving, up to twice the claim in the proportion it found — so the next plan differs.
    int64_t claimed = 0;
    for (size_t j = 0; j < pick->size(); ++j) claimed += options[j][(*pick)[j]].saving;
    need = std::max(need + here.peak.first - limit, claimed + 1);
    if (const int64_t saved = off_peak - here.peak.first; saved > 0)
      need = std::max(need, static_cast<int64_t>(static_cast<double>(claimed) *
                                                 std::min(static_cast<double>(off_peak - limit) / saved, 2.0)));
  }
  if (!most_walked) {  // the most each block can save, walked: the least memory there is
    const Found most{most_saving(options), walk(most_saving(options)), false};
    if (most.peak.first <= limit) return {most.pick, most.peak, true};
    if (most.peak.first < least->peak.first) least = most;
  }
  return *least;
}

std::string bytes_text(int64_t bytes) { return config::format_bytes(bytes); }

}  // namespace

std::string describe_auto_plan(const AutoPlan& a) {
  std::string out = "checkpoint policy " + a.requested + ": " + a.chosen.to_string();
  if (a.cap_bytes > 0)
    out += " under " + a.cap_source + " " + bytes_text(a.cap_bytes) + " less a margin of " +
           bytes_text(a.margin_bytes) + " (" + (a.fits ? "fits" : "does not fit") + ": highest phase " + a.peak_phase +
           " " + bytes_text(a.peak_bytes) + "; checkpointing off " + bytes_text(a.off_peak_bytes) + ")";
  if (a.full_recomputed_flops > 0) {
    char share[128];
    std::snprintf(share, sizeof share,
                  "; recomputes %.1f%% of full's forward FLOPs (%.1f%% of its cost with the writes)",
                  100.0 * a.recomputed_flops / a.full_recomputed_flops,
                  100.0 * a.recompute_cost / std::max(a.full_recompute_cost, 1.0));
    out += share;
  }
  return out + " — " + a.why;
}

nlohmann::json auto_plan_json(const AutoPlan& a) {
  return {{"requested", a.requested},
          {"cap_bytes", a.cap_bytes},
          {"cap_source", a.cap_source},
          {"margin_bytes", a.margin_bytes},
          {"chosen", a.chosen.to_string()},
          {"fits", a.fits},
          {"peak_bytes", a.peak_bytes},
          {"peak_phase", a.peak_phase},
          {"off_peak_bytes", a.off_peak_bytes},
          {"recomputed_flops", a.recomputed_flops},
          {"full_recomputed_flops", a.full_recomputed_flops},
          {"recompute_cost", a.recompute_cost},
          {"full_recompute_cost", a.full_recompute_cost},
          {"walks", a.walks},
          {"tried", a.tried},
          {"why", a.why}};
}

AutoPlan MemoryModel::auto_plan(const ckpt::CheckpointPolicy& requested, const model::SampleShape& shape,
                                int64_t cap_bytes, const std::string& cap_source) const {
  Session& session = *session_;
  AutoPlan a;
  a.requested = requested.to_string();
  a.cap_bytes = cap_bytes;
  a.cap_source = cap_source;
  a.margin_bytes = a.cap_bytes > 0 ? requested.margin_of(a.cap_bytes) : 0;
  const int64_t limit = a.cap_bytes - a.margin_bytes;
  // Each plan walked: every phase the run holds under it — step 1's (no optimizer state yet) and step 2's,
  // and the others — kept by the plan's text (a plan chosen again is not walked again).
  std::map<std::string, PhaseBytes> walked;
  auto phases_under = [&](const ckpt::CheckpointPolicy& policy) -> const PhaseBytes& {
    const std::string key = policy.to_string();
    if (const auto it = walked.find(key); it != walked.end()) return it->second;
    ++a.walks;
    const StepEstimate s = step(shape, policy);
    a.tried.emplace_back(key, run_peak(s));
    return walked[key] = run_phases(s);
  };
  // The highest of them (the first phase on a tie), or of those no checkpoint policy changes (all but the
  // forward and the backward).
  auto highest = [](const PhaseBytes& all, bool fixed_only) {
    std::pair<int64_t, memory::Phase> top{-1, memory::Phase::setup};
    for (const auto& [phase, bytes] : all)
      if (bytes > top.first && (!fixed_only || (phase != memory::Phase::forward && phase != memory::Phase::backward)))
        top = {bytes, phase};
    return top;
  };
  auto evaluate = [&](const ckpt::CheckpointPolicy& policy) { return highest(phases_under(policy), false); };
  const auto off = evaluate(ckpt::CheckpointPolicy::off());
  a.off_peak_bytes = off.first;
  const auto fixed = highest(phases_under(ckpt::CheckpointPolicy::off()), true);
  auto settle = [&](const ckpt::CheckpointPolicy& chosen, std::pair<int64_t, memory::Phase> peak) {
    a.chosen = chosen;
    a.peak_bytes = peak.first;
    a.peak_phase = memory::phase_name(peak.second);
  };
  if (a.cap_bytes > 0 && limit <= 0) {
    settle(ckpt::CheckpointPolicy::full(), evaluate(ckpt::CheckpointPolicy::full()));
    a.fits = false;
    a.why = "the margin (" + bytes_text(a.margin_bytes) + ") leaves nothing of the cap (" + bytes_text(a.cap_bytes) +
            "): give auto:MARGIN a smaller margin; applying full";
    return a;
  }
  if (a.cap_bytes <= 0 || off.first <= limit) {
    settle(ckpt::CheckpointPolicy::off(), off);
    a.why = a.cap_bytes <= 0
                ? "no cap to fit (no vram_cap, no GPU): checkpointing off"
                : "checkpointing off fits: its highest phase (" + a.peak_phase + ", " + bytes_text(off.first) +
                      ") is under the cap less the margin (" + bytes_text(limit) + ")";
    return a;
  }
  // Each block under each mode, walked once (a forward per mode); offload only where inputs can leave.
  std::vector<ckpt::BlockMode> modes = {ckpt::BlockMode::None, ckpt::BlockMode::SelectiveOps,
                                        ckpt::BlockMode::SelectiveMlp, ckpt::BlockMode::SelectiveAttn,
                                        ckpt::BlockMode::Full};
  if (cuda_) modes.push_back(ckpt::BlockMode::Offload);
  const model::BlockModeCosts costs = session.block_mode_costs(shape, modes);
  const std::vector<std::vector<Option>> options = options_of(costs, cuda_);
  for (const auto& opts : options)
    for (const Option& o : opts)
      if (o.mode == ckpt::BlockMode::Full) a.full_recomputed_flops += o.flops, a.full_recompute_cost += o.cost;
  const size_t experts = std::max<size_t>(costs.experts, 1);
  auto policy_of = [&](const std::vector<size_t>& pick) {
    std::vector<ckpt::BlockMode> per_block;
    for (size_t e = 0; e < experts; ++e)
      for (size_t j = 0; j < pick.size(); ++j) per_block.push_back(options[j][pick[j]].mode);
    return ckpt::CheckpointPolicy::per_block(per_block);
  };
  // A phase no policy changes above the limit: nothing fits; the least memory straight away.
  const auto walk = [&](const std::vector<size_t>& pick) { return evaluate(policy_of(pick)); };
  const Found found = fixed.first > limit ? Found{most_saving(options), walk(most_saving(options)), false}
                                          : search(options, off.first, limit, walk);
  a.fits = found.fits;
  settle(policy_of(found.pick), found.peak);
  for (size_t j = 0; j < options.size(); ++j)
    a.recomputed_flops += options[j][found.pick[j]].flops, a.recompute_cost += options[j][found.pick[j]].cost;
  a.why = a.fits ? "checkpointing off's " + bytes_text(off.first) + " is above the cap less the margin (" +
                       bytes_text(limit) + "); this plan's highest phase is " + a.peak_phase + " at " +
                       bytes_text(a.peak_bytes)
          : fixed.first > limit
              ? "no plan fits: the " + std::string(memory::phase_name(fixed.second)) + " phase holds " +
                    bytes_text(fixed.first) + " above the cap less the margin (" + bytes_text(limit) +
                    ") whatever the blocks do; applying the least memory (" + bytes_text(a.peak_bytes) + ", " +
                    a.peak_phase + ")"
              : "no plan fits: the least memory found (" + bytes_text(a.peak_bytes) + ", " + a.peak_phase +
                    ") is above the cap less the margin (" + bytes_text(limit) + "); applying it";
  return a;
}

}  // namespace gclab::train
