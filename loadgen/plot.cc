#include "loadgen/plot.h"

#include <algorithm>
#include <cmath>
#include <fmt/core.h>

#include "loadgen/png.h"

namespace m3::loadgen {

namespace {

constexpr int kWidth = 900, kHeight = 600;
constexpr int kLeft = 90, kRight = 220, kTop = 56, kBottom = 70;  // margins: the legend sits right

const Rgb kColors[] = {{31, 119, 180}, {214, 39, 40}, {44, 160, 44}, {255, 127, 14},
                       {148, 103, 189}, {140, 86, 75}, {227, 119, 194}, {23, 190, 207}};
const Rgb kInk{30, 30, 30}, kGrid{225, 225, 225};

// What the plot is drawn with: SVG elements or raster pixels.
class Surface {
 public:
  virtual ~Surface() = default;
  virtual void line(double x0, double y0, double x1, double y1, Rgb c, int width) = 0;
  virtual void disc(double x, double y, double r, Rgb c) = 0;
  // anchor: 0 left, 1 middle, 2 right; y is the text's vertical middle.
  virtual void text(double x, double y, const std::string& s, Rgb c, int anchor, bool large) = 0;
};

std::string hex(Rgb c) { return fmt::format("#{:02x}{:02x}{:02x}", c.r, c.g, c.b); }

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

class SvgSurface : public Surface {
 public:
  std::string body;
  void line(double x0, double y0, double x1, double y1, Rgb c, int width) override {
    body += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"{}\"/>\n",
                        x0, y0, x1, y1, hex(c), width);
  }
  void disc(double x, double y, double r, Rgb c) override {
    body += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{:.1f}\" fill=\"{}\"/>\n", x, y, r, hex(c));
  }
  void text(double x, double y, const std::string& s, Rgb c, int anchor, bool large) override {
    static const char* anchors[] = {"start", "middle", "end"};
    body += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"{}\" font-family=\"sans-serif\" font-size=\"{}\" "
        "text-anchor=\"{}\" dominant-baseline=\"middle\">{}</text>\n",
        x, y, hex(c), large ? 16 : 12, anchors[anchor], escape_xml(s));
  }
};

class RasterSurface : public Surface {
 public:
  Canvas canvas{kWidth, kHeight, {255, 255, 255}};
  void line(double x0, double y0, double x1, double y1, Rgb c, int width) override {
    canvas.line(x0, y0, x1, y1, c, width);
  }
  void disc(double x, double y, double r, Rgb c) override { canvas.disc(x, y, r, c); }
  void text(double x, double y, const std::string& s, Rgb c, int anchor, bool large) override {
    const int scale = large ? 2 : 1;
    const int w = Canvas::text_width(s, scale);
    const int left = static_cast<int>(anchor == 0 ? x : anchor == 1 ? x - w / 2.0 : x - w);
    canvas.text(left, static_cast<int>(y - Canvas::text_height(scale) / 2.0), s, c, scale);
  }
};

// Round tick steps (1, 2, 5 x 10^k) covering [lo, hi] with about `count` ticks.
std::vector<double> ticks(double lo, double hi, int count) {
  const double raw = (hi - lo) / count;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  std::vector<double> out;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push_back(v);
  return out;
}

std::string tick_label(double v) {
  if (v != 0 && (std::abs(v) >= 1e5 || std::abs(v) < 1e-2)) return fmt::format("{:.0e}", v);
  if (std::abs(v - std::round(v)) < 1e-9) return fmt::format("{:.0f}", v);
  return fmt::format("{:g}", v);
}

void draw(Surface& s, const std::vector<PlotSeries>& series, const std::string& title) {
  double max_x = 0, max_y = 0;
  for (const PlotSeries& one : series)
    for (const PlotPoint& p : one.points) max_x = std::max(max_x, p.x), max_y = std::max(max_y, p.y);
  if (max_x <= 0) max_x = 1;
  if (max_y <= 0) max_y = 1;
  const std::vector<double> xt = ticks(0, max_x * 1.08, 6), yt = ticks(0, max_y * 1.08, 6);
  const double x_hi = xt.back() > max_x ? xt.back() : max_x * 1.08;
  const double y_hi = yt.back() > max_y ? yt.back() : max_y * 1.08;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto px = [&](double x) { return kLeft + x / x_hi * plot_w; };
  auto py = [&](double y) { return kTop + plot_h - y / y_hi * plot_h; };

  for (double v : xt) {
    s.line(px(v), kTop, px(v), kTop + plot_h, kGrid, 1);
    s.line(px(v), kTop + plot_h, px(v), kTop + plot_h + 5, kInk, 1);
    s.text(px(v), kTop + plot_h + 16, tick_label(v), kInk, 1, false);
  }
  for (double v : yt) {
    s.line(kLeft, py(v), kLeft + plot_w, py(v), kGrid, 1);
    s.line(kLeft - 5, py(v), kLeft, py(v), kInk, 1);
    s.text(kLeft - 8, py(v), tick_label(v), kInk, 2, false);
  }
  s.line(kLeft, kTop, kLeft, kTop + plot_h, kInk, 2);
  s.line(kLeft, kTop + plot_h, kLeft + plot_w, kTop + plot_h, kInk, 2);
  s.text(kLeft + plot_w / 2, kTop + plot_h + 42, "interactivity: 1/p90(E2EL/OSL)  tok/s/user", kInk, 1, false);
  s.text(12, kTop - 12, "total tok/s per GPU", kInk, 0, false);
  s.text(kWidth / 2.0, 16, title, kInk, 1, true);

  for (size_t i = 0; i < series.size(); ++i) {
    const Rgb color = kColors[i % (sizeof kColors / sizeof kColors[0])];
    const std::vector<PlotPoint>& pts = series[i].points;
    const std::vector<size_t> frontier = pareto_frontier(pts);
    for (size_t k = 1; k < frontier.size(); ++k) {
      const PlotPoint &a = pts[frontier[k - 1]], &b = pts[frontier[k]];
      s.line(px(a.x), py(a.y), px(b.x), py(b.y), color, 2);
    }
    for (const PlotPoint& p : pts) {
      s.disc(px(p.x), py(p.y), 4.5, color);
      if (p.concurrency > 0) s.text(px(p.x) + 7, py(p.y) - 9, fmt::format("c{}", p.concurrency), color, 0, false);
    }
    const double ly = kTop + 10 + 22.0 * static_cast<double>(i);
    const double lx = kLeft + plot_w + 20;
    s.line(lx, ly, lx + 24, ly, color, 2);
    s.disc(lx + 12, ly, 4.5, color);
    s.text(lx + 32, ly, series[i].label, kInk, 0, false);
  }
}

}  // namespace

std::vector<size_t> pareto_frontier(const std::vector<PlotPoint>& points) {
  std::vector<size_t> out;
  for (size_t i = 0; i < points.size(); ++i) {
    bool dominated = false;
    for (size_t j = 0; j < points.size() && !dominated; ++j) {
      if (j == i) continue;
      const PlotPoint &p = points[i], &q = points[j];
      dominated = q.x >= p.x && q.y >= p.y && (q.x > p.x || q.y > p.y);
    }
    if (!dominated) out.push_back(i);
  }
  std::sort(out.begin(), out.end(), [&](size_t a, size_t b) { return points[a].x < points[b].x; });
  return out;
}

std::string render_svg(const std::vector<PlotSeries>& series, const std::string& title) {
  SvgSurface svg;
  draw(svg, series, title);
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n{2}</svg>\n",
      kWidth, kHeight, svg.body);
}

std::string render_png(const std::vector<PlotSeries>& series, const std::string& title) {
  RasterSurface raster;
  draw(raster, series, title);
  return encode_png(raster.canvas);
}

}  // namespace m3::loadgen
