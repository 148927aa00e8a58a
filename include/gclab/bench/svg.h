// Charts as inline SVG text for gclab's HTML reports: line charts (series of (x, y) points, a horizontal
// limit line such as the card's cap, a vertical marker such as the step that ran out of memory) and grouped
// bar charts. No scripts, no external resources: the text is placed as-is inside an HTML page.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gclab::bench {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in order
  std::string color = "#1f77b4";
  bool dashed = false;   // predicted beside measured: the prediction dashed
  bool scatter = false;  // points as dots, not joined (a Pareto plot)
};

// A legend entry: a swatch (a line, dashed or solid) and its name.
struct LegendEntry {
  std::string name;
  std::string color = "#444444";
  bool dashed = false;
};

struct LineChart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  // When set, the legend drawn instead of one entry per series: e.g. one per phase (its colour) and one per
  // kind of line (measured solid, predicted dashed), each named once.
  std::vector<LegendEntry> legend;
  std::optional<double> limit;  // a horizontal line across the plot (the memory cap)
  std::string limit_label;
  std::optional<double> marker;  // a vertical line at this x (the step that ran out of memory)
  std::string marker_label;
  bool bytes = false;     // y values are bytes: the axis reads MiB / GiB
  bool from_zero = true;  // the y axis starts at 0 (a loss reads better over its own range)
  bool integer_x = true;  // x values are counts (steps, batches): ticks at whole numbers
  int width = 940, height = 280;
};

struct BarChart {
  std::string title, y_label;
  std::vector<std::string> groups;                        // one group of bars per label (a phase)
  std::vector<std::pair<std::string, std::string>> bars;  // per bar of a group: its name and colour
  std::vector<std::vector<double>> values;                // values[group][bar]
  bool bytes = false;
  int width = 940, height = 280;
};

// An axis's ticks over [lo, hi]: 1, 2 or 5 x 10^n apart (for bytes, of the binary unit the range reads in:
// KiB, MiB, GiB), about five of them, the first at or below lo and the last at or above hi; `integer` keeps
// the step a whole number (steps are counted, not measured).
std::vector<double> axis_ticks(double lo, double hi, bool bytes, bool integer);

std::string line_chart_svg(const LineChart& chart);
std::string bar_chart_svg(const BarChart& chart);

// A whole page around `body` (HTML): the reports' one stylesheet, inline; no scripts, nothing fetched.
void write_html_page(const std::filesystem::path& path, const std::string& title, const std::string& body);

// Text made safe inside HTML and SVG (& < > " ').
std::string escape_xml(const std::string& text);
// A byte count as the reports print it ("12.3 MiB").
std::string format_axis_bytes(double bytes);
// A tick's label: a round number as it is ("0.5", "200", "1.5 GiB", "256 MiB").
std::string tick_label(double v, bool bytes);

}  // namespace gclab::bench
