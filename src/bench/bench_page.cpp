#include "gclab/bench/bench_page.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "gclab/bench/svg.h"

namespace gclab::bench {
namespace {

const std::vector<std::string> kColors = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                          "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"};

std::string color_of(const std::vector<std::string>& policies, const std::string& p) {
  const auto at = std::find(policies.begin(), policies.end(), p) - policies.begin();
  return kColors[static_cast<size_t>(at) % kColors.size()];
}

// A row's series: its policy, and the cap auto ran under (bench --caps).
std::string name_of(const BenchRow& r) { return r.cap.empty() ? r.policy : r.policy + " under " + r.cap; }
std::string name_of(const FitRow& r) { return r.policy; }

template <class Row>
std::vector<std::string> policies_of(const std::vector<Row>& rows) {
  std::vector<std::string> out;
  for (const auto& r : rows)
    if (std::find(out.begin(), out.end(), name_of(r)) == out.end()) out.push_back(name_of(r));
  return out;
}

template <class Row>
std::set<int> resolutions_of(const std::vector<Row>& rows) {
  std::set<int> out;
  for (const auto& r : rows) out.insert(r.resolution);
  return out;
}

double ms_per_sample(const BenchRow& r) { return r.step_ms / std::max(1, r.batch); }

std::string cell(const BenchRow& r) {
  return name_of(r) + " " + std::to_string(r.resolution) + "² batch " + std::to_string(r.batch);
}

// Peak memory against batch, one line per policy, at one resolution; an OOM cell ends its line.
std::string memory_chart(const std::vector<BenchRow>& rows, int resolution, int64_t cap) {
  LineChart c;
  c.title = "Peak memory against batch at " + std::to_string(resolution) + "²";
  c.x_label = "batch";
  c.y_label = "peak device memory";
  c.bytes = true;
  const auto policies = policies_of(rows);
  for (const auto& p : policies) {
    Series s{p, {}, color_of(policies, p)};
    for (const auto& r : rows)
      if (r.resolution == resolution && name_of(r) == p && !r.oom) s.points.emplace_back(r.batch, r.peak_bytes);
    c.series.push_back(s);
  }
  if (cap > 0) c.limit = static_cast<double>(cap), c.limit_label = "cap " + format_axis_bytes(static_cast<double>(cap));
  return line_chart_svg(c);
}

// Each policy's step time relative to GC off at the same cell: what the memory it saves costs.
std::string overhead_chart(const std::vector<BenchRow>& rows) {
  BarChart c;
  c.title = "Step time relative to checkpointing off (same resolution and batch)";
  c.y_label = "x GC off";
  const auto policies = policies_of(rows);
  for (const auto& p : policies) c.bars.emplace_back(p, color_of(policies, p));
  // Beside them the theory of recomputing every block once: 1 + t_fwd / t_step (GC off's times).
  c.bars.emplace_back("theory, full: 1 + t_fwd / t_step", "#bbbbbb");
  std::map<std::string, std::vector<double>> groups;
  std::vector<std::string> order;
  for (const auto& r : rows) {
    const std::string key = std::to_string(r.resolution) + "² b" + std::to_string(r.batch);
    if (!groups.count(key)) groups[key].assign(policies.size() + 1, 0.0), order.push_back(key);
    const auto at = static_cast<size_t>(std::find(policies.begin(), policies.end(), name_of(r)) - policies.begin());
    groups[key][at] = r.oom ? 0.0 : r.time_ratio;
    if (!r.oom && r.forward_ms > 0 && r.step_ms > 0)  // GC off's cells: its forward timed alone
      groups[key].back() = 1 + r.forward_ms / r.step_ms;
  }
  for (const auto& key : order) c.groups.push_back(key), c.values.push_back(groups[key]);
  return bar_chart_svg(c);
}

std::string pareto_chart(const std::vector<BenchRow>& rows) {
  LineChart c;
  c.title = "Memory against time per sample, every cell that ran (the front: none both smaller and faster)";
  c.x_label = "step time per sample (ms)";
  c.integer_x = false;
  c.y_label = "peak device memory";
  c.bytes = true;
  const auto policies = policies_of(rows);
  for (const auto& p : policies) {
    Series s{p, {}, color_of(policies, p)};
    s.scatter = true;
    for (const auto& r : rows)
      if (name_of(r) == p && !r.oom) s.points.emplace_back(ms_per_sample(r), r.peak_bytes);
    c.series.push_back(s);
  }
  // The caps auto ran under (bench --caps), each a dashed line across the times measured.
  double lo = 0, hi = 0;
  for (const auto& r : rows)
    if (!r.oom) lo = lo > 0 ? std::min(lo, ms_per_sample(r)) : ms_per_sample(r), hi = std::max(hi, ms_per_sample(r));
  std::set<std::string> drawn;
  for (const auto& r : rows)
    if (r.cap_bytes > 0 && hi > 0 && drawn.insert(r.cap).second) {
      Series cap{
          "cap " + r.cap + " (" + format_axis_bytes(static_cast<double>(r.cap_bytes)) + ")", {}, "#999999", true};
      cap.points = {{lo, static_cast<double>(r.cap_bytes)}, {hi, static_cast<double>(r.cap_bytes)}};
      c.series.push_back(cap);
    }
  Series front{"Pareto front", {}, "#000000", true};
  auto f = pareto_front(rows);
  std::sort(f.begin(), f.end(),
            [](const BenchRow& a, const BenchRow& b) { return ms_per_sample(a) < ms_per_sample(b); });
  for (const auto& r : f) front.points.emplace_back(ms_per_sample(r), r.peak_bytes);
  c.series.push_back(front);
  return line_chart_svg(c);
}

std::string bench_table_html(const std::vector<BenchRow>& rows) {
  const auto front = pareto_front(rows);
  std::ostringstream h;
  h << "<table><tr><th>policy</th><th>resolution</th><th>batch</th><th>step (ms)</th><th>peak</th>"
       "<th>x GC off time</th><th>theory</th><th>x GC off peak</th><th>on the front</th></tr>";
  for (const auto& r : rows) {
    const bool on = std::any_of(front.begin(), front.end(), [&](const BenchRow& f) { return cell(f) == cell(r); });
    char t[64], tr[32], th[32], pr[32];
    std::snprintf(t, sizeof t, "%.1f", r.step_ms);
    std::snprintf(tr, sizeof tr, "%.2f", r.time_ratio);
    std::snprintf(th, sizeof th, "%.2f", r.theory_ratio);
    std::snprintf(pr, sizeof pr, "%.2f", r.peak_ratio);
    h << "<tr><td>" << escape_xml(name_of(r) + (r.applied.empty() || r.applied == r.policy ? "" : ": " + r.applied))
      << "</td><td>" << r.resolution << "</td><td>" << r.batch << "</td><td>"
      << (r.oom ? "out of memory in " + escape_xml(r.oom_phase) : std::string(t)) << "</td><td>"
      << (r.oom ? "" : format_axis_bytes(static_cast<double>(r.peak_bytes))) << "</td><td>" << (r.oom ? "" : tr)
      << "</td><td>" << (r.oom || r.theory_ratio <= 0 ? "" : th) << "</td><td>" << (r.oom ? "" : pr) << "</td><td>"
      << (on ? "yes" : "") << "</td></tr>";
  }
  h << "</table>";
  return h.str();
}

}  // namespace

std::vector<BenchRow> pareto_front(const std::vector<BenchRow>& rows) {
  std::vector<BenchRow> out;
  for (const auto& a : rows) {
    if (a.oom) continue;
    const bool beaten = std::any_of(rows.begin(), rows.end(), [&](const BenchRow& b) {
      return !b.oom && b.peak_bytes <= a.peak_bytes && ms_per_sample(b) <= ms_per_sample(a) &&
             (b.peak_bytes < a.peak_bytes || ms_per_sample(b) < ms_per_sample(a));
    });
    if (!beaten) out.push_back(a);
  }
  return out;
}

void write_bench_page(const std::filesystem::path& path, const std::vector<BenchRow>& rows, int64_t cap_bytes) {
  std::ostringstream h;
  h << "<h1>gclab bench: checkpoint policies side by side</h1>";
  if (!rows.empty() && rows.front().world_size > 1)
    h << "<p>Per process: one of " << rows.front().world_size << " data-parallel ranks (WORLD_SIZE).</p>";
  for (const int res : resolutions_of(rows)) h << memory_chart(rows, res, cap_bytes);
  h << "<h2>Time</h2>" << overhead_chart(rows);
  h << "<h2>Memory against time</h2>" << pareto_chart(rows);
  h << "<h2>Every cell</h2>" << bench_table_html(rows);
  write_html_page(path, "gclab bench", h.str());
}

void write_fit_page(const std::filesystem::path& path, const std::vector<FitRow>& rows, int64_t cap_bytes) {
  BarChart c;
  const std::string lever = rows.empty() ? "batch" : rows.front().lever;
  c.title = "Largest " + lever + " that fits" +
            (cap_bytes > 0 ? " under " + format_axis_bytes(static_cast<double>(cap_bytes)) : std::string());
  c.y_label = lever;
  const auto policies = policies_of(rows);
  for (const auto& p : policies) c.bars.emplace_back(p, color_of(policies, p));
  for (const int res : resolutions_of(rows)) {
    c.groups.push_back(std::to_string(res) + "²");
    std::vector<double> v(policies.size(), 0.0);
    for (const auto& r : rows)
      if (r.resolution == res)
        v[static_cast<size_t>(std::find(policies.begin(), policies.end(), r.policy) - policies.begin())] = r.largest;
    c.values.push_back(v);
  }
  std::ostringstream h;
  h << "<h1>gclab fit: the largest " << lever << " per resolution and policy</h1>";
  if (!rows.empty() && rows.front().world_size > 1)
    h << "<p>Per process: one of " << rows.front().world_size << " data-parallel ranks (WORLD_SIZE).</p>";
  h << bar_chart_svg(c);
  h << "<table><tr><th>resolution</th><th>policy</th><th>largest " << lever << "</th><th>batch</th><th>its peak</th>"
    << "<th>predicted largest " << lever << "</th></tr>";
  for (const auto& r : rows)
    h << "<tr><td>" << r.resolution << "</td><td>" << escape_xml(r.policy) << "</td><td>"
      << (r.largest > 0 ? std::to_string(r.largest) : std::string("none fits")) << "</td><td>" << r.batch << "</td><td>"
      << (r.largest > 0 ? format_axis_bytes(static_cast<double>(r.peak_bytes)) : std::string()) << "</td><td>"
      << (r.predicted < 0 ? std::string("-") : std::to_string(r.predicted)) << "</td></tr>";
  h << "</table>";
  write_html_page(path, "gclab fit", h.str());
}

}  // namespace gclab::bench
