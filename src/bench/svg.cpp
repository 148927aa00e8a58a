#include "gclab/bench/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace gclab::bench {

std::string escape_xml(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  return out;
}

std::string format_axis_bytes(double bytes) {
  char buf[32];
  const double mib = bytes / (1024.0 * 1024.0);
  if (mib >= 1024.0)
    std::snprintf(buf, sizeof buf, "%.2f GiB", mib / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", mib);
  return buf;
}

namespace {

// The binary unit a range of bytes reads in: the largest of B, KiB, MiB, GiB, TiB not above `bytes`.
double byte_unit(double bytes) {
  double unit = 1;
  while (unit < 1099511627776.0 && bytes >= 1024 * unit) unit *= 1024;
  return unit;
}

const char* const kUnitNames[] = {"B", "KiB", "MiB", "GiB", "TiB"};

}  // namespace

std::vector<double> axis_ticks(double lo, double hi, bool bytes, bool integer) {
  if (!(hi > lo)) hi = lo + 1;
  const double unit = bytes ? byte_unit(std::max(std::abs(lo), std::abs(hi))) : 1;
  const double raw = (hi - lo) / unit / 5;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (const double m : {1.0, 2.0, 5.0, 10.0})
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  if (integer) step = std::max(1.0, std::round(step));
  step *= unit;
  const double first = std::floor(lo / step + 1e-9) * step, last = std::ceil(hi / step - 1e-9) * step;
  std::vector<double> ticks;
  for (double v = first; v <= last + step * 0.5; v += step) ticks.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return ticks;
}

std::string tick_label(double v, bool bytes) {
  char buf[32];
  if (!bytes) {
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
  }
  const double unit = byte_unit(std::abs(v));
  int u = 0;
  for (double x = unit; x > 1; x /= 1024) ++u;
  std::snprintf(buf, sizeof buf, "%.4g %s", v / unit, kUnitNames[u]);
  return buf;
}

namespace {

const char* const kStyle =
    "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:980px}"
    "h1{font-size:22px}h2{font-size:17px;margin-top:28px}"
    "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
    ".chart{display:block;margin:8px 0;background:#fff;width:100%;height:auto}.axis{stroke:#444}.grid{stroke:#eee}"
    ".chart-title{font-size:13px;font-weight:600}.tick{font-size:10px;fill:#444}.label{font-size:11px}"
    ".limit{stroke:#d62728;stroke-width:1.5;stroke-dasharray:6 3}.marker{stroke:#000;stroke-width:1.5}"
    ".oom{background:#fdecea;border:1px solid #d62728;padding:8px 12px}"
    ".previews{display:flex;flex-wrap:wrap;gap:8px}figure{margin:0}img{max-width:220px;display:block}"
    "figcaption{font-size:10px}pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:11px}";

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// The plot area inside the chart's box: room on the left for the y ticks, above for the legend's rows,
// below for the x label.
struct Frame {
  double left = 72, right, top, bottom;
  double x0, x1, y0, y1;  // the data range shown
  // legend_rows: rows of legend between the title and the plot.
  Frame(int width, int height, double xa, double xb, double ya, double yb, int legend_rows = 0)
      : right(width - 16.0),
        top(28.0 + 14.0 * legend_rows),
        bottom(height - 40.0),
        x0(xa),
        x1(xb > xa ? xb : xa + 1),
        y0(ya),
        y1(yb > ya ? yb : ya + 1) {}
  double x(double v) const { return left + (v - x0) / (x1 - x0) * (right - left); }
  double y(double v) const { return bottom - (v - y0) / (y1 - y0) * (bottom - top); }
};

void axes(std::ostringstream& s, const Frame& f, const std::string& title, const std::string& x_label,
          const std::string& y_label, const std::vector<double>& y_ticks, bool bytes,
          const std::vector<double>& x_ticks) {
  s << "<text x=\"" << number(f.left) << "\" y=\"16\" class=\"chart-title\">" << escape_xml(title) << "</text>";
  s << "<line x1=\"" << number(f.left) << "\" y1=\"" << number(f.bottom) << "\" x2=\"" << number(f.right) << "\" y2=\""
    << number(f.bottom) << "\" class=\"axis\"/>";
  s << "<line x1=\"" << number(f.left) << "\" y1=\"" << number(f.top) << "\" x2=\"" << number(f.left) << "\" y2=\""
    << number(f.bottom) << "\" class=\"axis\"/>";
  for (const double v : y_ticks) {
    s << "<line x1=\"" << number(f.left) << "\" y1=\"" << number(f.y(v)) << "\" x2=\"" << number(f.right) << "\" y2=\""
      << number(f.y(v)) << "\" class=\"grid\"/>";
    s << "<text x=\"" << number(f.left - 4) << "\" y=\"" << number(f.y(v) + 4)
      << "\" class=\"tick y-tick\" text-anchor=\"end\">" << escape_xml(tick_label(v, bytes)) << "</text>";
  }
  for (const double xv : x_ticks)
    s << "<text x=\"" << number(f.x(xv)) << "\" y=\"" << number(f.bottom + 14)
      << "\" class=\"tick x-tick\" text-anchor=\"middle\">" << escape_xml(tick_label(xv, false)) << "</text>";
  s << "<text x=\"" << number((f.left + f.right) / 2) << "\" y=\"" << number(f.bottom + 30)
    << "\" class=\"label\" text-anchor=\"middle\">" << escape_xml(x_label) << "</text>";
  s << "<text x=\"12\" y=\"" << number((f.top + f.bottom) / 2) << "\" class=\"label\" text-anchor=\"middle\" "
    << "transform=\"rotate(-90 12 " << number((f.top + f.bottom) / 2) << ")\">" << escape_xml(y_label) << "</text>";
}

// Legend entries laid out left to right, wrapping at the plot's right edge: each entry's (x, row).
constexpr double kLegendLeft = 80;
std::vector<std::pair<double, int>> legend_layout(const std::vector<std::string>& names, double right, double swatch) {
  std::vector<std::pair<double, int>> at;
  double x = kLegendLeft;
  int row = 0;
  for (const auto& n : names) {
    const double w = swatch + 12 + 6.0 * static_cast<double>(n.size());
    if (x + w > right && x > kLegendLeft) x = kLegendLeft, ++row;
    at.emplace_back(x, row);
    x += w;
  }
  return at;
}

int legend_rows(const std::vector<std::pair<double, int>>& at) { return at.empty() ? 0 : at.back().second + 1; }

std::string open_svg(int width, int height, const std::string& title) {
  std::ostringstream s;
  s << "<svg class=\"chart\" viewBox=\"0 0 " << width << " " << height << "\" width=\"" << width << "\" height=\""
    << height << "\" role=\"img\" aria-label=\"" << escape_xml(title) << "\">";
  return s.str();
}

}  // namespace

std::string line_chart_svg(const LineChart& c) {
  double xa = std::numeric_limits<double>::max(), xb = std::numeric_limits<double>::lowest();
  double ya = 0, yb = std::numeric_limits<double>::lowest();
  for (const auto& series : c.series)
    for (const auto& [x, y] : series.points) {
      xa = std::min(xa, x), xb = std::max(xb, x);
      ya = std::min(ya, y), yb = std::max(yb, y);
    }
  if (!c.from_zero) {
    ya = std::numeric_limits<double>::max();
    for (const auto& series : c.series)
      for (const auto& p : series.points) ya = std::min(ya, p.second);
    if (ya > yb) ya = 0;
  }
  if (c.limit) yb = std::max(yb, *c.limit), ya = std::min(ya, *c.limit);
  if (xa > xb) xa = 0, xb = 1;
  if (yb < ya) yb = ya + 1;
  if (yb == ya) yb = ya + (c.bytes ? 1024 : 1);
  if (xb == xa) xb = xa + 1;
  std::vector<LegendEntry> entries = c.legend;
  if (entries.empty())
    for (const auto& series : c.series) entries.push_back({series.name, series.color, series.dashed});
  std::vector<std::string> names;
  for (const auto& e : entries) names.push_back(e.name);
  const auto legend = legend_layout(names, c.width - 16.0, 18);
  const std::vector<double> y_ticks = axis_ticks(ya, yb, c.bytes, false);
  const std::vector<double> x_ticks = axis_ticks(xa, xb, false, c.integer_x);
  const Frame f(c.width, c.height + 14 * legend_rows(legend), x_ticks.front(), x_ticks.back(), y_ticks.front(),
                y_ticks.back(), legend_rows(legend));
  std::ostringstream s;
  s << open_svg(c.width, c.height + 14 * legend_rows(legend), c.title);
  axes(s, f, c.title, c.x_label, c.y_label, y_ticks, c.bytes, x_ticks);
  for (const auto& series : c.series) {
    if (series.points.empty()) continue;
    if (series.scatter) {
      for (const auto& [x, y] : series.points)
        s << "<circle class=\"point\" data-name=\"" << escape_xml(series.name) << "\" cx=\"" << number(f.x(x))
          << "\" cy=\"" << number(f.y(y)) << "\" r=\"4\" fill=\"" << escape_xml(series.color) << "\"><title>"
          << escape_xml(series.name) << "</title></circle>";
      continue;
    }
    s << "<polyline class=\"series\" fill=\"none\" stroke=\"" << escape_xml(series.color) << "\" stroke-width=\"1.6\""
      << (series.dashed ? " stroke-dasharray=\"5 3\"" : "") << " data-name=\"" << escape_xml(series.name)
      << "\" points=\"";
    for (size_t i = 0; i < series.points.size(); ++i)
      s << (i ? " " : "") << number(f.x(series.points[i].first)) << "," << number(f.y(series.points[i].second));
    s << "\"><title>" << escape_xml(series.name) << "</title></polyline>";
    if (series.points.size() == 1)  // a lone point: a dot, since a one-point line draws nothing
      s << "<circle cx=\"" << number(f.x(series.points[0].first)) << "\" cy=\"" << number(f.y(series.points[0].second))
        << "\" r=\"4\" fill=\"" << escape_xml(series.color) << "\"/>";
  }
  if (c.limit)
    s << "<line class=\"limit\" x1=\"" << number(f.left) << "\" y1=\"" << number(f.y(*c.limit)) << "\" x2=\""
      << number(f.right) << "\" y2=\"" << number(f.y(*c.limit)) << "\"/><text x=\"" << number(f.right - 4) << "\" y=\""
      << number(f.y(*c.limit) - 4) << "\" class=\"tick limit-label\" text-anchor=\"end\">" << escape_xml(c.limit_label)
      << "</text>";
  if (c.marker)
    s << "<line class=\"marker\" x1=\"" << number(f.x(*c.marker)) << "\" y1=\"" << number(f.top) << "\" x2=\""
      << number(f.x(*c.marker)) << "\" y2=\"" << number(f.bottom) << "\"/><text x=\"" << number(f.x(*c.marker) + 4)
      << "\" y=\"" << number(f.top + 10) << "\" class=\"tick marker-label\">" << escape_xml(c.marker_label)
      << "</text>";
  // The legend above the plot: the chart's own entries, else one per series.
  for (size_t i = 0; i < entries.size(); ++i) {
    const LegendEntry& e = entries[i];
    const double lx = legend[i].first, ly = 24.0 + 14.0 * legend[i].second;
    s << "<line x1=\"" << number(lx) << "\" y1=\"" << number(ly) << "\" x2=\"" << number(lx + 18) << "\" y2=\""
      << number(ly) << "\" stroke=\"" << escape_xml(e.color) << "\" stroke-width=\"2\""
      << (e.dashed ? " stroke-dasharray=\"5 3\"" : "") << "/><text x=\"" << number(lx + 22) << "\" y=\""
      << number(ly + 4) << "\" class=\"tick legend\">" << escape_xml(e.name) << "</text>";
  }
  s << "</svg>";
  return s.str();
}

std::string bar_chart_svg(const BarChart& c) {
  double yb = 1;
  for (const auto& group : c.values)
    for (const double v : group) yb = std::max(yb, v);
  std::vector<std::string> names;
  for (const auto& bar : c.bars) names.push_back(bar.first);
  const auto legend = legend_layout(names, c.width - 16.0, 12);
  const int extra = 14 * legend_rows(legend);
  const std::vector<double> y_ticks = axis_ticks(0, yb, c.bytes, false);
  const Frame f(c.width, c.height + extra, 0, 1, 0, y_ticks.back(), legend_rows(legend));
  std::ostringstream s;
  s << open_svg(c.width, c.height + extra, c.title);
  axes(s, f, c.title, "", c.y_label, y_ticks, c.bytes, {});
  const double slot = (f.right - f.left) / std::max<size_t>(1, c.groups.size());
  const double bar = slot * 0.8 / std::max<size_t>(1, c.bars.size());
  for (size_t g = 0; g < c.groups.size(); ++g) {
    const double gx = f.left + slot * static_cast<double>(g) + slot * 0.1;
    for (size_t b = 0; b < c.bars.size() && g < c.values.size() && b < c.values[g].size(); ++b) {
      const double v = c.values[g][b];
      s << "<rect class=\"bar\" x=\"" << number(gx + bar * static_cast<double>(b)) << "\" y=\"" << number(f.y(v))
        << "\" width=\"" << number(bar * 0.92) << "\" height=\"" << number(f.bottom - f.y(v)) << "\" fill=\""
        << escape_xml(c.bars[b].second) << "\"><title>" << escape_xml(c.groups[g] + ", " + c.bars[b].first + ": ")
        << escape_xml(c.bytes ? format_axis_bytes(v) : tick_label(v, false)) << "</title></rect>";
    }
    s << "<text x=\"" << number(gx + slot * 0.4) << "\" y=\"" << number(f.bottom + 14)
      << "\" class=\"tick\" text-anchor=\"middle\">" << escape_xml(c.groups[g]) << "</text>";
  }
  for (size_t i = 0; i < c.bars.size(); ++i) {
    const double lx = legend[i].first, ly = 19.0 + 14.0 * legend[i].second;
    s << "<rect x=\"" << number(lx) << "\" y=\"" << number(ly) << "\" width=\"12\" height=\"10\" fill=\""
      << escape_xml(c.bars[i].second) << "\"/><text x=\"" << number(lx + 16) << "\" y=\"" << number(ly + 9)
      << "\" class=\"tick\">" << escape_xml(c.bars[i].first) << "</text>";
  }
  s << "</svg>";
  return s.str();
}

void write_html_page(const std::filesystem::path& path, const std::string& title, const std::string& body) {
  std::ofstream out(path, std::ios::binary);
  out << "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << escape_xml(title)
      << "</title><style>" << kStyle << "</style></head><body>" << body << "</body></html>\n";
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace gclab::bench
