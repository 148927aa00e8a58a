#include "gclab/bench/advise.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "bench/cell.h"
#include "gclab/bench/bench.h"
#include "gclab/bench/svg.h"
#include "gclab/config/byte_size.h"
#include "gclab/log/log.h"

namespace gclab::bench {

namespace {

using Policy = ckpt::CheckpointPolicy;

// The preview passes a run of `steps` takes, as Run takes them (trainer.cpp): the baseline at step 0
// unless skip_first_sample, every sample_every from sample_start_step, and the last step's.
int64_t previews_in(const config::ProcessConfig& c, int64_t steps, int every) {
  if (!c.sample || c.train.disable_sampling || c.sample->samples.empty() || every <= 0) return 0;
  int64_t n = c.train.skip_first_sample ? 0 : 1;
  for (int64_t k = 1; k <= steps; ++k)
    if ((k % every == 0 && k >= c.sample->sample_start_step) || (k == steps && k % every != 0)) ++n;
  return n;
}

bool same_policy(const Policy& a, const Policy& b) { return a.to_string() == b.to_string(); }

struct Measured {
  double ms = 0;
  int64_t peak = 0;
  std::optional<std::string> oom_phase;
};

// One optimizer step under `policy`: `accumulation` micro-batches of `batch` samples of `frames`, averaged
// over `resolutions` (each dataset resolution is a copy of the data: a run's steps are spread evenly over them).
Measured measure_step(train::Session& session, const Policy& policy, int batch, int frames, int accumulation,
                      const std::vector<int>& resolutions, int timed) {
  Measured m;
  for (const int r : resolutions) {
    const model::SampleShape shape{batch, frames, r, r};
    session.apply_policy(policy, shape);
    const CellResult cell = run_cell(session, shape, timed + 1, false);
    if (cell.oom_phase) {
      m.oom_phase = cell.oom_phase;
      return m;
    }
    m.ms += cell.median_ms() * accumulation / static_cast<double>(resolutions.size());
    m.peak = std::max(m.peak, cell.peak_bytes);
  }
  return m;
}

// One pass over every preview prompt at `settings`, under the config's own policy.
Measured measure_previews(train::Session& session, const train::Session::PreviewSettings& settings) {
  Measured m;
  session.meter().reset_peak();
  try {
    m.ms = time_ms(session, [&] { session.sample(0, {}, settings); });
  } catch (const c10::OutOfMemoryError&) {
    m.oom_phase = "sample";
  }
  session.meter().release_cached();
  m.peak = session.meter().stats().peak_bytes;
  return m;
}

Advice row(const std::string& change, const std::string& set, const Measured& step, const Measured& preview,
           double previews_per_step) {
  Advice a;
  a.change = change, a.set = set;
  a.step_ms = step.ms;
  a.preview_ms = preview.ms * previews_per_step;
  a.total_ms = a.step_ms + a.preview_ms;
  a.peak_bytes = std::max(step.peak, preview.peak);
  a.fits = !step.oom_phase && !preview.oom_phase;
  a.oom_phase = step.oom_phase ? *step.oom_phase : preview.oom_phase.value_or("");
  return a;
}

std::string ms_text(double ms) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", ms);
  return b;
}

// The cheaper previews: half as often, half the steps, half the size, none — each with the step as measured.
void cheaper_previews(train::Session& session, int run_steps, const Measured& step, const Measured& preview,
                      double per_step, std::vector<Advice>& alternatives) {
  const config::ProcessConfig& c = session.config();
  const auto& sc = *c.sample;
  const int every = sc.sample_every, d = session.spec().preview_divisibility;
  Advice a = row("sample_every " + std::to_string(2 * every), "sample.sample_every=" + std::to_string(2 * every), step,
                 preview, static_cast<double>(previews_in(c, run_steps, 2 * every)) / run_steps);
  a.note = "half as many previews to look at";
  alternatives.push_back(a);
  const int steps = std::max(1, sc.sample_steps / 2);
  a = row("sample_steps " + std::to_string(steps), "sample.sample_steps=" + std::to_string(steps), step,
          measure_previews(session, {std::nullopt, std::nullopt, steps}), per_step);
  a.note = "rougher previews";
  alternatives.push_back(a);
  const int w = std::max(d, sc.width / 2 / d * d), h = std::max(d, sc.height / 2 / d * d);
  a = row("previews at " + std::to_string(w) + "x" + std::to_string(h),
          "sample.width=" + std::to_string(w) + " sample.height=" + std::to_string(h), step,
          measure_previews(session, {w, h, std::nullopt}), per_step);
  a.note = "smaller previews";
  alternatives.push_back(a);
  a = row("disable_sampling", "train.disable_sampling=true", step, Measured{}, per_step);
  a.note = "no previews";
  alternatives.push_back(a);
}

}  // namespace

AdviseResult run_advise(train::Session& session, const AdviseOptions& options) {
  const config::ProcessConfig& c = session.config();
  AdviseResult out;
  out.cap_bytes = c.vram_cap.bytes;
  out.run_steps = options.steps > 0 ? options.steps : c.train.steps;
  const int every = c.sample ? c.sample->sample_every : 0;
  out.previews_per_run = previews_in(c, out.run_steps, every);
  const double per_step = static_cast<double>(out.previews_per_run) / static_cast<double>(out.run_steps);
  const std::vector<int> resolutions = resolutions_for(session, {});
  const Policy configured = c.train.policy();
  const int batch = c.train.batch_size, accumulation = c.train.accumulation();
  const int frames = session.plan().largest.frames;  // a video run's num_frames (1: images)
  const int timed = std::max(1, options.timed_steps);
  session.precompute_text(session.captions_of(session.synthetic_batch({1, 1, 64, 64})));
  log::info("advise: " + std::to_string(resolutions.size()) + " resolution(s), batch " + std::to_string(batch) + ", " +
            std::to_string(out.previews_per_run) + " preview pass(es) over " + std::to_string(out.run_steps) +
            " steps");

  // The config as it is.
  const Measured step = measure_step(session, configured, batch, frames, accumulation, resolutions, timed);
  Measured preview;
  if (out.previews_per_run > 0) {
    session.apply_policy(configured, square_cell(session, batch, resolutions.back()));
    measure_previews(session, {});  // a warm-up pass
    preview = measure_previews(session, {});
  }
  out.rows.push_back(row("the config as it is (" + configured.to_string() + ")", "", step, preview, per_step));
  std::vector<Advice> alternatives;
  // Checkpoint policies, GC off among them.
  std::vector<Policy> policies = {Policy::off(),
                                  Policy::parse("every:2"),
                                  Policy::parse("selective:attn"),
                                  Policy::parse("selective:mlp"),
                                  Policy::parse("selective:ops"),
                                  Policy::full()};
  // auto under the run's cap (vram_cap, or the GPU's free memory), decided at each resolution; with no cap
  // it is off.
  if (session.plan().auto_cap_bytes > 0) policies.push_back(Policy::parse("auto"));
  for (const Policy& policy : policies) {
    if (same_policy(policy, configured)) continue;
    const std::string name = policy.to_string();
    const std::string set =
        policy.kind == Policy::Kind::Off ? "train.gradient_checkpointing=false" : "train.checkpoint_policy=" + name;
    alternatives.push_back(row("checkpoint policy " + name, set,
                               measure_step(session, policy, batch, frames, accumulation, resolutions, timed), preview,
                               per_step));
  }
  // Half the batch, twice the accumulation: the same samples per update, half the activations.
  if (batch >= 2 && batch % 2 == 0)
    alternatives.push_back(row(
        "batch " + std::to_string(batch / 2) + " with gradient_accumulation " + std::to_string(2 * accumulation),
        "train.batch_size=" + std::to_string(batch / 2) +
            " train.gradient_accumulation=" + std::to_string(2 * accumulation),
        measure_step(session, configured, batch / 2, frames, 2 * accumulation, resolutions, timed), preview, per_step));
  // A video run: half the latent frames a clip (num_frames 1 + t·k to 1 + t·(k/2)), the lever a video model
  // reaches for first once checkpointing is on.
  const int fewer = static_cast<int>(model::fewer_frames(session.spec(), frames));
  if (fewer < frames) {
    // No --set reaches every dataset's num_frames: the change is said in words, as dropping a resolution is.
    bool per_clip = false;  // auto_frame_count: each clip at its own length, the longest `frames`
    for (const auto& d : c.datasets) per_clip = per_clip || d.auto_frame_count;
    Advice a =
        row("num_frames " + std::to_string(fewer) + (per_clip ? " with auto_frame_count: false" : ""), "",
            measure_step(session, configured, batch, fewer, accumulation, resolutions, timed), preview, per_step);
    a.changes_training = true;
    a.note = "trains on shorter clips";
    alternatives.push_back(a);
  }
  // The top resolution dropped.
  if (resolutions.size() > 1) {
    const std::vector<int> lower(resolutions.begin(), resolutions.end() - 1);
    Advice a = row("drop resolution " + std::to_string(resolutions.back()) + " from the datasets", "",
                   measure_step(session, configured, batch, frames, accumulation, lower, timed), preview, per_step);
    a.changes_training = true;
    a.note = "trains without the top resolution";
    alternatives.push_back(a);
  }
  if (out.previews_per_run > 0) {
    session.apply_policy(configured, square_cell(session, batch, resolutions.back()));
    cheaper_previews(session, out.run_steps, step, preview, per_step, alternatives);
  }
  session.apply_policy(configured, square_cell(session, batch, resolutions.back()));
  const double base = out.rows.front().total_ms;
  for (auto& a : alternatives) a.saved_ms = a.fits ? base - a.total_ms : 0.0;
  std::stable_sort(alternatives.begin(), alternatives.end(), [](const Advice& x, const Advice& y) {
    return x.fits != y.fits ? x.fits : x.saved_ms > y.saved_ms;
  });
  out.rows.insert(out.rows.end(), alternatives.begin(), alternatives.end());
  for (const auto& a : alternatives)
    if (a.fits && a.saved_ms > 0 && !a.changes_training) {
      out.first = a.change + (a.set.empty() ? "" : " (--set " + a.set + ")") + ": " + ms_text(a.saved_ms) +
                  " ms a step faster" + (a.note.empty() ? "" : ", " + a.note);
      break;
    }
  if (out.first.empty()) out.first = "nothing measured here is faster and fits: keep the config as it is";
  return out;
}

std::string advise_table(const AdviseResult& r) {
  std::ostringstream s;
  s << "| change | step ms | previews ms / step | total ms / step | saved ms / step | peak | fits |\n";
  s << "|---|---|---|---|---|---|---|\n";
  for (const auto& a : r.rows)
    s << "| " << a.change << (a.note.empty() ? "" : " (" + a.note + ")") << " | "
      << (a.fits ? ms_text(a.step_ms) : "OOM (" + a.oom_phase + ")") << " | " << ms_text(a.preview_ms) << " | "
      << (a.fits ? ms_text(a.total_ms) : "") << " | " << (a.fits ? ms_text(a.saved_ms) : "") << " | "
      << config::format_bytes(a.peak_bytes) << " | " << (a.fits ? "yes" : "no") << " |\n";
  s << "\nfirst thing to try: " << r.first << "\n";
  return s.str();
}

namespace {

nlohmann::json to_json(const AdviseResult& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& a : r.rows)
    rows.push_back({{"change", a.change},
                    {"set", a.set},
                    {"step_ms", a.step_ms},
                    {"preview_ms", a.preview_ms},
                    {"total_ms", a.total_ms},
                    {"saved_ms", a.saved_ms},
                    {"peak_bytes", a.peak_bytes},
                    {"fits", a.fits},
                    {"oom_phase", a.oom_phase},
                    {"changes_training", a.changes_training},
                    {"note", a.note}});
  return {{"rows", rows},
          {"cap_bytes", r.cap_bytes},
          {"run_steps", r.run_steps},
          {"previews_per_run", r.previews_per_run},
          {"first", r.first}};
}

}  // namespace

std::string advice_html(const nlohmann::json& j) {
  BarChart c;
  c.title = "Time per training step: the step and the previews amortised over " +
            std::to_string(j.value("run_steps", 0)) + " steps";
  c.y_label = "ms / step";
  c.bars = {{"step", "#1f77b4"}, {"previews", "#9467bd"}};
  std::ostringstream table;
  table << "<table><tr><th>change</th><th>step (ms)</th><th>previews (ms / step)</th><th>saved (ms / step)</th>"
           "<th>peak</th><th>fits</th><th>--set</th></tr>";
  for (const auto& a : j.at("rows")) {
    const bool fits = a.value("fits", false);
    const std::string change = a.value("change", std::string());
    c.groups.push_back(change);
    c.values.push_back({fits ? a.value("step_ms", 0.0) : 0.0, fits ? a.value("preview_ms", 0.0) : 0.0});
    table << "<tr><td>" << escape_xml(change) << "</td><td>"
          << (fits ? ms_text(a.value("step_ms", 0.0))
                   : "out of memory in " + escape_xml(a.value("oom_phase", std::string())))
          << "</td><td>" << ms_text(a.value("preview_ms", 0.0)) << "</td><td>"
          << (fits ? ms_text(a.value("saved_ms", 0.0)) : "") << "</td><td>"
          << format_axis_bytes(a.value("peak_bytes", 0.0)) << "</td><td>" << (fits ? "yes" : "no") << "</td><td>"
          << escape_xml(a.value("set", std::string())) << "</td></tr>";
  }
  table << "</table>";
  c.width = std::max(720, 90 * static_cast<int>(c.groups.size()));
  return "<h2>I want speed: what to try before turning checkpointing off</h2><p><b>First thing to try:</b> " +
         escape_xml(j.value("first", std::string())) + "</p>" + bar_chart_svg(c) + table.str();
}

void write_advice(const std::filesystem::path& dir, const AdviseResult& r) {
  std::filesystem::create_directories(dir);
  const nlohmann::json j = to_json(r);
  std::ofstream(dir / "advise.json") << j.dump(2) << "\n";
  write_html_page(dir / "advise.html", "gclab advise", "<h1>gclab advise</h1>" + advice_html(j));
}

}  // namespace gclab::bench
