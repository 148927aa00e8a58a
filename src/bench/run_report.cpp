#include "gclab/bench/run_report.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "gclab/bench/advise.h"
#include "gclab/bench/svg.h"
#include "gclab/config/loader.h"

namespace gclab::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The phases in the order a step runs them (memory/phase.h's names), each with its colour.
const std::vector<std::pair<std::string, std::string>> kPhases = {
    {"setup", "#7f7f7f"},     {"cache", "#17becf"},   {"data", "#8c564b"},
    {"text", "#e377c2"},      {"forward", "#1f77b4"}, {"backward", "#d62728"},
    {"optimizer", "#2ca02c"}, {"sample", "#9467bd"},  {"save", "#bcbd22"}};

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::optional<json> read_json(const fs::path& p) {
  if (!fs::is_regular_file(p)) return std::nullopt;
  try {
    return json::parse(read_text(p));
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

std::string base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const auto b = [&](size_t k) { return k < bytes.size() ? static_cast<unsigned char>(bytes[k]) : 0u; };
    const unsigned v = (b(i) << 16) | (b(i + 1) << 8) | b(i + 2);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

struct Run {
  std::string name;
  std::vector<json> steps;  // metrics.jsonl, one object per step
  std::optional<json> memory, oom;
  std::string config;
  std::vector<fs::path> samples;
};

Run read_run(const fs::path& dir) {
  Run r;
  r.name = dir.filename().string();
  std::ifstream metrics(dir / "metrics.jsonl");
  if (!metrics) throw std::runtime_error(dir.string() + " has no metrics.jsonl: not a gclab run folder");
  for (std::string line; std::getline(metrics, line);) try {
      if (!line.empty()) r.steps.push_back(json::parse(line));
    } catch (const json::exception&) {  // a line cut short by a crash: the steps before it stand
    }
  r.memory = read_json(dir / "memory.json");
  r.oom = read_json(dir / "oom_report.json");
  if (fs::is_regular_file(dir / "config.resolved.yaml")) r.config = read_text(dir / "config.resolved.yaml");
  if (fs::is_directory(dir / "samples"))
    for (const auto& e : fs::directory_iterator(dir / "samples")) {
      const std::string ext = e.path().extension().string();
      if (ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".webp" || ext == ".mp4")
        r.samples.push_back(e.path());
    }
  std::sort(r.samples.begin(), r.samples.end());
  return r;
}

double number_or(const json& j, const char* key, double fallback) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}

std::string loss_chart(const Run& r) {
  LineChart c;
  c.title = "Loss";
  c.x_label = "step";
  c.y_label = "loss";
  c.from_zero = false;
  Series raw{"loss", {}, "#9ecae1"}, smooth{"smoothed (EMA 0.9)", {}, "#08519c"};
  double ema = 0;
  bool first = true;
  for (const auto& s : r.steps) {
    if (!s.contains("loss") || !s["loss"].is_number()) continue;
    const double step = number_or(s, "step", 0), loss = s["loss"].get<double>();
    ema = first ? loss : 0.9 * ema + 0.1 * loss;
    first = false;
    raw.points.emplace_back(step, loss);
    smooth.points.emplace_back(step, ema);
  }
  c.series = {raw, smooth};
  return line_chart_svg(c);
}

std::string step_time_chart(const Run& r) {
  LineChart c;
  c.title = "Step time";
  c.x_label = "step";
  c.y_label = "seconds";
  Series t{"step time", {}, "#ff7f0e"}, wait{"waiting for data", {}, "#8c564b"};
  for (const auto& s : r.steps) {
    const double step = number_or(s, "step", 0);
    t.points.emplace_back(step, number_or(s, "step_time_s", 0));
    wait.points.emplace_back(step, number_or(s, "data_wait_s", 0));
  }
  c.series = {t, wait};
  return line_chart_svg(c);
}

double cap_of(const Run& r) {
  if (r.memory) return number_or(*r.memory, "cap_bytes", 0);
  if (r.oom) return number_or(*r.oom, "cap_bytes", 0);
  return r.steps.empty() ? 0 : number_or(r.steps.back(), "cap_bytes", 0);
}

// Each phase's peak per step, measured (solid) beside the memory model's prediction (dashed); the cap as
// a line, the step that ran out marked.
std::string phases_chart(const Run& r) {
  LineChart c;
  c.title = "Peak memory per phase and step";
  c.x_label = "step";
  c.y_label = "device memory";
  c.bytes = true;
  bool any_predicted = false;
  for (const auto& [phase, color] : kPhases) {
    Series measured{phase, {}, color}, predicted{phase + " predicted", {}, color, true};
    for (const auto& s : r.steps) {
      const double step = number_or(s, "step", 0);
      if (s.contains("phases") && s["phases"].contains(phase))
        measured.points.emplace_back(step, s["phases"][phase].get<double>());
      if (s.contains("predicted_phases") && s["predicted_phases"].is_object() && s["predicted_phases"].contains(phase))
        predicted.points.emplace_back(step, s["predicted_phases"][phase].get<double>());
    }
    if (!measured.points.empty() || !predicted.points.empty()) c.legend.push_back({phase, color});
    if (!measured.points.empty()) c.series.push_back(measured);
    if (!predicted.points.empty()) c.series.push_back(predicted), any_predicted = true;
  }
  // The phases by colour, then the two kinds of line, each named once.
  c.legend.push_back({"measured", "#444444"});
  if (any_predicted) c.legend.push_back({"predicted", "#444444", true});
  if (const double cap = cap_of(r); cap > 0) c.limit = cap, c.limit_label = "cap " + format_axis_bytes(cap);
  if (r.oom) {
    const double step = number_or(*r.oom, "step", 0);
    c.marker = step, c.marker_label = "out of memory in " + r.oom->value("phase", std::string());
    c.series.push_back({"live when it ran out", {{step, number_or(*r.oom, "live_bytes", 0)}}, "#000000"});
    c.legend.push_back({"live when it ran out", "#000000"});
  }
  return line_chart_svg(c);
}

// The run's phases (memory.json), or the last step's, measured beside predicted.
std::string last_phases_chart(const Run& r) {
  const json* measured = nullptr;
  const json* predicted = nullptr;
  if (r.memory && r.memory->contains("phase_peak_bytes")) {
    measured = &(*r.memory)["phase_peak_bytes"];
    if (r.memory->contains("predicted_phase_peak_bytes")) predicted = &(*r.memory)["predicted_phase_peak_bytes"];
  } else if (r.oom && r.oom->contains("last_step_phase_peaks")) {
    measured = &(*r.oom)["last_step_phase_peaks"];
  }
  if (!measured || !measured->is_object()) return "";
  BarChart c;
  c.title = "The run's peak by phase";
  c.y_label = "device memory";
  c.bytes = true;
  c.bars = {{"measured", "#1f77b4"}, {"predicted", "#aec7e8"}};
  for (const auto& [phase, color] : kPhases) {
    if (!measured->contains(phase)) continue;
    c.groups.push_back(phase);
    const double p =
        predicted && predicted->is_object() && predicted->contains(phase) ? (*predicted)[phase].get<double>() : 0;
    c.values.push_back({(*measured)[phase].get<double>(), p});
  }
  return bar_chart_svg(c);
}

std::string buckets_table(const Run& r) {
  std::map<std::string, int> per;
  for (const auto& s : r.steps)
    if (s.contains("bucket")) ++per[s["bucket"].get<std::string>() + ", batch " + std::to_string(s.value("batch", 0))];
  std::ostringstream h;
  h << "<table><tr><th>bucket, batch</th><th>steps</th></tr>";
  for (const auto& [key, n] : per) h << "<tr><td>" << escape_xml(key) << "</td><td>" << n << "</td></tr>";
  h << "</table>";
  return h.str();
}

std::string previews(const Run& r) {
  if (r.samples.empty()) return "<p>No previews.</p>";
  std::ostringstream h;
  h << "<div class=\"previews\">";
  for (const auto& f : r.samples) {
    std::string ext = f.extension().string().substr(1);
    if (ext == "jpg") ext = "jpeg";
    const std::string data = base64(read_text(f)), name = escape_xml(f.filename().string());
    if (ext == "mp4")  // a video preview, playing in a loop
      h << "<figure><video controls autoplay loop muted playsinline title=\"" << name
        << "\" src=\"data:video/mp4;base64," << data << "\"></video>";
    else
      h << "<figure><img alt=\"" << name << "\" src=\"data:image/" << ext << ";base64," << data << "\">";
    h << "<figcaption>" << name << "</figcaption></figure>";
  }
  h << "</div>";
  return h.str();
}

std::string oom_banner(const Run& r) {
  if (!r.oom) return "";
  const json& o = *r.oom;
  std::ostringstream h;
  h << "<div class=\"oom\"><strong>Out of memory</strong> at step " << o.value("step", 0) << " in <code>"
    << escape_xml(o.value("phase", std::string())) << "</code> (bucket " << escape_xml(o.value("bucket", std::string()))
    << ", batch " << o.value("batch", 0) << ")";
  if (o.contains("fixes") && o["fixes"].is_array() && !o["fixes"].empty()) {
    const json& f = o["fixes"][0];
    h << "; first fix: <code>" << escape_xml(f.value("change", std::string())) << "</code> ("
      << escape_xml(f.value("title", std::string())) << ", saves ~"
      << escape_xml(format_axis_bytes(number_or(f, "predicted_saving_bytes", 0))) << ")";
  }
  h << ". The full report: oom_report.md.</div>";
  return h.str();
}

std::string summary(const Run& r) {
  std::ostringstream h;
  h << "<table class=\"summary\">";
  auto row = [&](const std::string& k, const std::string& v) {
    h << "<tr><th>" << escape_xml(k) << "</th><td>" << escape_xml(v) << "</td></tr>";
  };
  row("steps recorded", std::to_string(r.steps.size()));
  if (r.memory) {
    row("device", r.memory->value("device", std::string()));
    row("checkpoint policy", r.memory->value("checkpoint_policy", std::string()));
    // What it applied (auto's plan, a budget's blocks), and auto's reasons.
    if (const std::string applied = r.memory->value("applied_policy", std::string());
        !applied.empty() && applied != r.memory->value("checkpoint_policy", std::string()))
      row("applied", applied);
    if (r.memory->contains("auto_plan") && r.memory->at("auto_plan").is_object())
      row("auto's plan", r.memory->at("auto_plan").value("why", std::string()));
    row("peak (measured)", format_axis_bytes(number_or(*r.memory, "peak_bytes", 0)));
  }
  if (const double cap = cap_of(r); cap > 0) row("cap", format_axis_bytes(cap));
  // Steps whose every loss was not finite: no update (AI Toolkit's "loss is nan"), counted by the run.
  if (!r.steps.empty())
    if (const double n = number_or(r.steps.back(), "nonfinite_steps", 0); n > 0)
      row("steps skipped: loss not finite", std::to_string(static_cast<int64_t>(n)));
  h << "</table>";
  return h.str();
}

// The defaults a key is compared with: a config with nothing set, one dataset and one sample item (the
// defaults of a list's items). gclab's config structs carry AI Toolkit's defaults for its keys
// (toolkit/config_modules.py; docs/aitk-semantics.md) and their own for the keys gclab adds.
YAML::Node default_config() {
  config::ProcessConfig d;
  d.network.emplace();  // a network's keys against the network defaults
  d.datasets.emplace_back();
  d.sample.emplace();
  d.sample->samples.emplace_back();
  // gradient_checkpointing's default, resolved as the loader resolves it.
  d.train.checkpoint_policy =
      d.train.gradient_checkpointing ? ckpt::CheckpointPolicy::full() : ckpt::CheckpointPolicy::off();
  return YAML::Load(config::to_yaml(d));
}

std::string flow_text(const YAML::Node& n) {
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

// A value drawn on its key's line: a scalar, or a list or map without blocks inside.
bool on_one_line(const YAML::Node& n) {
  if (n.IsMap()) return n.size() == 0;
  if (n.IsSequence())
    for (const auto& item : n)
      if (item.IsMap()) return false;
  return true;
}

// The map's keys as block YAML at `depth`, each line whose value differs from `def`'s (and from
// `inherited`'s, the enclosing block's values a list item falls back to) marked; `dash`: the map is a list
// item (its first key after "- ").
void render_keys(std::ostringstream& h, const YAML::Node& map, const YAML::Node& def, int depth, bool dash, int& marked,
                 const YAML::Node& inherited = YAML::Node()) {
  bool first = true;
  for (const auto& kv : map) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node value = kv.second;
    const YAML::Node d = def.IsDefined() && def.IsMap() ? def[key] : YAML::Node();
    const std::string pad = dash && first ? std::string(static_cast<size_t>(2 * (depth - 1)), ' ') + "- "
                                          : std::string(static_cast<size_t>(2 * depth), ' ');
    first = false;
    if (on_one_line(value)) {
      const std::string text = flow_text(value);
      const YAML::Node up = inherited.IsDefined() && inherited.IsMap() ? inherited[key] : YAML::Node();
      const bool differs = (!d.IsDefined() || flow_text(d) != text) && (!up.IsDefined() || flow_text(up) != text);
      marked += differs ? 1 : 0;
      h << (differs ? "<mark>" : "") << pad << escape_xml(key) << ": " << escape_xml(text) << (differs ? "</mark>" : "")
        << "\n";
    } else if (value.IsMap()) {
      h << pad << escape_xml(key) << ":\n";
      render_keys(h, value, d, depth + 1, false, marked);
    } else {  // a list of blocks (datasets, sample items): each against the list's default item, whose
              // keys the enclosing block also has take that block's values (a sample item inherits the
              // sample block's width, steps, ...)
      h << pad << escape_xml(key) << ":\n";
      const YAML::Node item_default = d.IsDefined() && d.IsSequence() && d.size() > 0 ? d[0] : YAML::Node();
      for (const auto& item : value)
        if (item.IsMap())
          render_keys(h, item, item_default, depth + 2, true, marked, map);
        else
          h << std::string(static_cast<size_t>(2 * depth + 2), ' ') << "- " << escape_xml(flow_text(item)) << "\n";
    }
  }
}

// The resolved config with every key whose value differs from its default marked.
std::string config_view(const std::string& yaml) {
  YAML::Node resolved;
  try {
    resolved = YAML::Load(yaml);
  } catch (const YAML::Exception&) {
    return "<pre>" + escape_xml(yaml) + "</pre>";
  }
  if (!resolved.IsMap()) return "<pre>" + escape_xml(yaml) + "</pre>";
  std::ostringstream lines;
  int marked = 0;
  render_keys(lines, resolved, default_config(), 0, false, marked);
  return "<p>" + std::to_string(marked) +
         " keys differ from their defaults (AI Toolkit's for its keys, gclab's for the keys it adds) and are "
         "marked.</p><pre class=\"config\">" +
         lines.str() + "</pre>";
}

}  // namespace

fs::path write_run_report(const fs::path& run_dir) {
  const Run r = read_run(run_dir);
  std::ostringstream h;
  h << "<h1>gclab run: " << escape_xml(r.name) << "</h1>" << oom_banner(r) << summary(r);
  if (!r.steps.empty()) h << "<h2>Loss</h2>" << loss_chart(r) << "<h2>Step time</h2>" << step_time_chart(r);
  if (!r.steps.empty() || r.oom) h << "<h2>Memory</h2>" << phases_chart(r);
  h << last_phases_chart(r);
  h << "<h2>Buckets and batches</h2>" << buckets_table(r);
  h << "<h2>Previews</h2>" << previews(r);
  if (const auto advice = read_json(run_dir / "advise.json"))  // gclab advise on this config
    try {
      h << advice_html(*advice);
    } catch (const nlohmann::json::exception&) {  // an advise.json of another shape: left out
    }
  h << "<h2>Resolved config</h2>" << config_view(r.config);
  const fs::path out = run_dir / "report.html";
  write_html_page(out, "gclab run " + r.name, h.str());
  return out;
}

}  // namespace gclab::bench
