// report.html (bench/run_report.h) read back: the charts' SVG carries one point per step, predicted beside
// measured per phase, the cap and the step that ran out; the previews are inside the page; nothing is
// fetched from elsewhere.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "../support/test_util.h"
#include "../support/tiny_run.h"
#include "gclab/bench/bench_page.h"
#include "gclab/bench/run_report.h"
#include "gclab/bench/svg.h"
#include "gclab/data/video.h"
#include "gclab/train/trainer.h"

namespace gclab::bench {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The points of the polyline named `name` (data-name), as "x,y" pairs.
size_t points_of(const std::string& html, const std::string& name) {
  const std::regex re("data-name=\"" + name + "\" points=\"([^\"]*)\"");
  std::smatch m;
  if (!std::regex_search(html, m, re)) return 0;
  std::istringstream pairs(m[1].str());
  size_t n = 0;
  for (std::string p; pairs >> p;) n += p.find(',') != std::string::npos;
  return n;
}

TEST(Svg, ALineChartDrawsEachPointTheLimitAndTheMarkerAndEscapesText) {
  LineChart c;
  c.title = "a <b> & c";
  c.series = {{"measured", {{1, 10}, {2, 30}, {3, 20}}}, {"predicted", {{1, 12}, {2, 28}}, "#f00", true}};
  c.limit = 25, c.limit_label = "cap";
  c.marker = 2, c.marker_label = "out of memory";
  const std::string svg = line_chart_svg(c);
  EXPECT_EQ(points_of(svg, "measured"), 3u);
  EXPECT_EQ(points_of(svg, "predicted"), 2u);
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);
  EXPECT_NE(svg.find("class=\"limit\""), std::string::npos);
  EXPECT_NE(svg.find("class=\"marker\""), std::string::npos);
  EXPECT_NE(svg.find("a &lt;b&gt; &amp; c"), std::string::npos);
  EXPECT_EQ(svg.find("<b>"), std::string::npos);
  // The highest point sits above the lowest: y grows downwards in SVG.
  BarChart b;
  b.groups = {"forward", "backward"};
  b.bars = {{"measured", "#00f"}, {"predicted", "#0ff"}};
  b.values = {{10, 11}, {20, 19}};
  const std::string bars = bar_chart_svg(b);
  size_t rects = 0;
  for (size_t at = bars.find("class=\"bar\""); at != std::string::npos; at = bars.find("class=\"bar\"", at + 1))
    ++rects;
  EXPECT_EQ(rects, 4u);
}

// Every tick a round number: 1, 2 or 5 x 10^n apart (bytes in their binary unit), the range covered.
bool round_step(double step) {
  const double m = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
  return std::abs(m - 1) < 1e-6 || std::abs(m - 2) < 1e-6 || std::abs(m - 5) < 1e-6;
}

TEST(Svg, AxisTicksAreRoundAndStepsWhole) {
  struct Case {
    double lo, hi;
    bool bytes, integer;
  };
  for (const Case& c : {Case{0, 1.37, false, false}, Case{0.81, 2.93, false, false}, Case{1, 7, false, true},
                        Case{1, 1600, false, true}, Case{0, 3, false, true}, Case{0, 93.7 * 1048576, true, false},
                        Case{0, 22.4 * 1073741824.0, true, false}, Case{0, 700, true, false}}) {
    const std::vector<double> ticks = axis_ticks(c.lo, c.hi, c.bytes, c.integer);
    ASSERT_GE(ticks.size(), 3u) << c.hi;
    EXPECT_LE(ticks.size(), 12u) << c.hi;
    EXPECT_LE(ticks.front(), c.lo);
    EXPECT_GE(ticks.back(), c.hi);
    const double step = ticks[1] - ticks[0];
    double unit = 1;
    if (c.bytes)
      while (c.hi >= 1024 * unit) unit *= 1024;
    EXPECT_TRUE(round_step(step / unit)) << "step " << step << " over [" << c.lo << ", " << c.hi << "]";
    if (c.integer) {
      EXPECT_EQ(step, std::round(step));
    }
    for (const double t : ticks) EXPECT_NEAR(std::remainder(t, step), 0.0, step * 1e-9);
  }
  EXPECT_EQ(tick_label(512.0 * 1048576, true), "512 MiB");
  EXPECT_EQ(tick_label(1.5 * 1073741824.0, true), "1.5 GiB");
  EXPECT_EQ(tick_label(0.2, false), "0.2");
  EXPECT_EQ(tick_label(1200, false), "1200");
  // A chart of 7 steps labels whole steps only, and fills the page's width.
  LineChart c;
  c.series = {{"loss", {{1, 0.4}, {7, 0.31}}}};
  const std::string svg = line_chart_svg(c);
  const std::regex x_tick("class=\"tick x-tick\"[^>]*>([^<]*)<");
  size_t labels = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), x_tick); it != std::sregex_iterator(); ++it, ++labels)
    EXPECT_EQ((*it)[1].str().find('.'), std::string::npos) << (*it)[1].str();
  EXPECT_GE(labels, 3u);
}

TEST(RunReport, ATrainingRunsPageHasItsStepsPhasesAndPreviewsInside) {
  const fs::path dir = testing::fresh_dir("run_report");
  const auto config = testing::tiny_config(
      dir, "r",
      {"train.steps=3", "sample={prompts: [a red circle], sample_every: 2, sample_steps: 1, width: 64, height: 64}"});
  train::train(config, {});
  const fs::path page = write_run_report(dir / "r");
  ASSERT_TRUE(fs::exists(page));
  const std::string html = read(page);
  EXPECT_EQ(points_of(html, "loss"), 3u);
  EXPECT_EQ(points_of(html, "forward"), 3u);
  EXPECT_EQ(points_of(html, "forward predicted"), 3u);
  // The phase chart's legend names each phase once and "measured" / "predicted" once each, not per phase.
  const std::regex legend("class=\"tick legend\">([^<]*)<");
  std::map<std::string, int> named;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), legend); it != std::sregex_iterator(); ++it)
    ++named[(*it)[1].str()];
  EXPECT_EQ(named["measured"], 1);
  EXPECT_EQ(named["predicted"], 1);
  EXPECT_EQ(named["forward"], 1);
  EXPECT_EQ(named.count("forward predicted"), 0u);
  EXPECT_NE(html.find(".chart{display:block;margin:8px 0;background:#fff;width:100%"), std::string::npos);
  EXPECT_NE(html.find("data:image/jpeg;base64,"), std::string::npos);  // the previews, inside the page
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("64x64, batch 2"), std::string::npos);  // the buckets table
  // The resolved config, the keys set away from their defaults marked (lr 1e-3, not AI Toolkit's 1e-6), the
  // others not (noise_offset 0, the dataset's flip_x false).
  EXPECT_NE(html.find("<mark>  lr: 0.001</mark>"), std::string::npos);
  EXPECT_NE(html.find("\n  noise_offset: 0.0\n"), std::string::npos);
  EXPECT_NE(html.find("\n    flip_x: false\n"), std::string::npos);
  EXPECT_NE(html.find("<mark>    resolution: [64]</mark>"), std::string::npos);
  EXPECT_NE(html.find("\n      width: 64\n"), std::string::npos);       // a sample item's, from its block: not marked
  EXPECT_NE(html.find("<mark>  width: 64</mark>"), std::string::npos);  // the block's own: marked (512 by default)
  // A block the defaults have no key for (the job's meta) is drawn, all of it marked.
  std::ofstream(dir / "r" / "config.resolved.yaml", std::ios::app) << "meta:\n  name: \"[name]\"\n  version: '1.0'\n";
  const std::string with_meta = read(write_run_report(dir / "r"));
  EXPECT_NE(with_meta.find("<mark>  version: 1.0</mark>"), std::string::npos);
  EXPECT_THROW(write_run_report(dir), std::runtime_error);  // not a run folder
  // A video preview's MP4 plays in the page, inside it.
  data::write_video(dir / "r" / "samples" / "r_x_frames.mp4", torch::zeros({3, 16, 16, 3}, torch::kUInt8), 8);
  const std::string with_video = read(write_run_report(dir / "r"));
  EXPECT_NE(with_video.find("<video controls autoplay loop muted playsinline title=\"r_x_frames.mp4\" "
                            "src=\"data:video/mp4;base64,"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(RunReport, ARunThatRanOutMarksTheStepAndTheCap) {
  const fs::path dir = testing::fresh_dir("run_report_oom");
  const auto config = testing::tiny_config(
      dir, "o", {"train.steps=3", "train.gradient_checkpointing=false", "vram_cap=12MiB", "train.oom_policy=abort"});
  EXPECT_THROW(train::train(config, {}), train::OutOfMemoryStop);
  const std::string html = read(write_run_report(dir / "o"));
  EXPECT_NE(html.find("Out of memory"), std::string::npos);
  EXPECT_NE(html.find("class=\"marker\""), std::string::npos);
  EXPECT_NE(html.find("class=\"limit\""), std::string::npos);
  EXPECT_NE(html.find("cap 12.0 MiB"), std::string::npos);
  fs::remove_all(dir);
}

BenchRow row(const std::string& policy, int batch, double ms, int64_t peak, bool oom = false) {
  BenchRow r;
  r.policy = policy, r.resolution = 256, r.batch = batch, r.step_ms = ms, r.peak_bytes = peak, r.oom = oom;
  r.time_ratio = policy == "off" ? 1.0 : 1.3;
  return r;
}

// The bench page: a memory line per policy under the cap, the time ratios, and the Pareto front — the cells
// no other is both smaller and faster than (an OOM cell never on it).
TEST(BenchPage, PoliciesSideBySideWithTheCapAndTheParetoFront) {
  const std::vector<BenchRow> rows = {row("off", 1, 100, 900),  row("off", 2, 180, 1700),    row("full", 1, 130, 500),
                                      row("full", 2, 240, 800), row("every:2", 1, 140, 700), row("off", 4, 0, 0, true)};
  const auto front = pareto_front(rows);
  std::vector<std::string> on;
  for (const auto& r : front) on.push_back(r.policy + std::to_string(r.batch));
  // Per sample: off b2 90 ms, off b1 100, full b2 120, full b1 130 (each the smallest at its speed); every:2 b1
  // (140 ms, 700) is beaten by full b1 (130 ms, 500).
  EXPECT_EQ(on, (std::vector<std::string>{"off1", "off2", "full1", "full2"}));
  const fs::path dir = testing::fresh_dir("bench_page");
  write_bench_page(dir / "bench_report.html", rows, 1000);
  const std::string html = read(dir / "bench_report.html");
  EXPECT_EQ(points_of(html, "off"), 2u);  // batch 4 ran out: not drawn
  EXPECT_EQ(points_of(html, "full"), 2u);
  EXPECT_EQ(points_of(html, "Pareto front"), 4u);
  EXPECT_NE(html.find("cap 0.0 MiB"), std::string::npos);
  EXPECT_NE(html.find("out of memory in"), std::string::npos);
  write_fit_page(dir / "fit_report.html",
                 {{"off", 256, "batch", 2, 2, 900}, {"full", 256, "batch", 6, 6, 950}, {"off", 512, "batch", 0, 0, 0}},
                 1 << 20);
  const std::string fit = read(dir / "fit_report.html");
  EXPECT_NE(fit.find("none fits"), std::string::npos);
  EXPECT_NE(fit.find("under 1.0 MiB"), std::string::npos);
  EXPECT_EQ(fit.find("<script"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::bench
