#include "gclab/data/synth.h"
#include "gclab/data/video.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>

namespace gclab::data {

namespace fs = std::filesystem;

namespace {

struct Colour {
  const char* name;
  std::array<uint8_t, 3> rgb;
};
constexpr Colour kColours[] = {{"red", {220, 40, 40}},     {"green", {40, 170, 60}},   {"blue", {40, 70, 210}},
                               {"yellow", {235, 210, 40}}, {"purple", {140, 50, 170}}, {"orange", {240, 140, 30}},
                               {"white", {245, 245, 245}}, {"black", {20, 20, 20}}};
constexpr const char* kShapes[] = {"circle", "square", "triangle"};

struct Shape {
  int kind;       // index into kShapes
  int colour;     // index into kColours
  double cx, cy;  // centre, as a fraction of width / height
  double r;       // half-size, as a fraction of the shorter side
};

bool inside(const Shape& s, double x, double y, double w, double h) {
  const double side = std::min(w, h), dx = (x - s.cx * w) / side, dy = (y - s.cy * h) / side;
  switch (s.kind) {
    case 0:
      return dx * dx + dy * dy <= s.r * s.r;
    case 1:
      return std::abs(dx) <= s.r && std::abs(dy) <= s.r;
    default:
      return dy <= s.r && dy >= -s.r && std::abs(dx) <= (dy + s.r) * 0.5;  // apex up
  }
}

const char* where(double cx) { return cx < 0.4 ? "on the left" : cx > 0.6 ? "on the right" : "in the middle"; }

}  // namespace

std::vector<fs::path> write_synthetic_dataset(const fs::path& dir, const SynthOptions& options) {
  fs::create_directories(dir);
  std::mt19937_64 rng(options.seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<fs::path> written;
  for (int i = 0; i < options.count; ++i) {
    const ImageSize size = options.sizes[static_cast<size_t>(i) % options.sizes.size()];
    int background = static_cast<int>(rng() % std::size(kColours));
    std::vector<Shape> shapes;
    const int n = options.simple ? 1 : 1 + static_cast<int>(rng() % 2);
    if (options.simple) {  // shape x colour (red, yellow, white, black) x background (blue, green), in turn
      constexpr int kSimpleColours[] = {0, 3, 6, 7}, kSimpleBackgrounds[] = {2, 1};
      const int combo = i % 24;
      background = kSimpleBackgrounds[combo % 2];
      shapes.push_back({combo / 8, kSimpleColours[(combo / 2) % 4], 0.5, 0.5, 0.3});
    }
    for (int k = 0; k < n && !options.simple; ++k) {
      Shape s;
      s.kind = static_cast<int>(rng() % std::size(kShapes));
      do s.colour = static_cast<int>(rng() % std::size(kColours));
      while (s.colour == background);
      s.r = u(rng) < 0.5 ? 0.12 : 0.24;
      s.cx = n == 1 ? 0.3 + 0.4 * u(rng) : (k == 0 ? 0.28 : 0.72);
      s.cy = 0.35 + 0.3 * u(rng);
      shapes.push_back(s);
    }
    // A clip's shapes move a quarter of the width from the left of where they are to the right of it.
    auto draw = [&](double shift) {
      torch::Tensor image = torch::empty({size.height, size.width, 3}, torch::kUInt8);
      auto px = image.accessor<uint8_t, 3>();
      for (int y = 0; y < size.height; ++y)
        for (int x = 0; x < size.width; ++x) {
          std::array<uint8_t, 3> c = kColours[background].rgb;
          for (Shape s : shapes) {
            s.cx += shift;
            if (inside(s, x + 0.5, y + 0.5, size.width, size.height)) c = kColours[s.colour].rgb;
          }
          for (int ch = 0; ch < 3; ++ch) px[y][x][ch] = c[static_cast<size_t>(ch)];
        }
      return image;
    };
    std::string caption;
    for (size_t k = 0; k < shapes.size(); ++k) {
      const auto& s = shapes[k];
      caption += std::string(k == 0 ? "a " : " and a ") + (s.r > 0.2 ? "large " : "small ") + kColours[s.colour].name +
                 " " + kShapes[s.kind] + " " + where(s.cx);
    }
    caption +=
        std::string(options.frames > 1 ? " moving right" : "") + " on a " + kColours[background].name + " background";
    char name[32];
    std::snprintf(name, sizeof name, "synth_%04d", i);
    fs::path png = dir / (std::string(name) + ".png");
    if (options.frames > 1 && !options.video_format.empty()) {
      png = dir / (std::string(name) + "." + options.video_format);
      std::vector<torch::Tensor> frames;
      for (int f = 0; f < options.frames; ++f)
        frames.push_back(draw(0.25 * (static_cast<double>(f) / (options.frames - 1) - 0.5)));
      write_video(png, torch::stack(frames), options.fps);
    } else if (options.frames > 1) {
      png = dir / name;
      for (int f = 0; f < options.frames; ++f) {
        char frame[32];
        std::snprintf(frame, sizeof frame, "frame_%04d.png", f);
        write_png(png / frame, draw(0.25 * (static_cast<double>(f) / (options.frames - 1) - 0.5)));
      }
    } else {
      write_png(png, draw(0.0));
    }
    // No trailing newline: AI Toolkit trains on a caption file's text as it is.
    std::ofstream(dir / (std::string(name) + ".txt")) << caption;
    written.push_back(png);
  }
  return written;
}

}  // namespace gclab::data
