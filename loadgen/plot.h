// The AgentX "North Star" view of concurrency sweeps: total tokens/s per GPU (y) against
// E2E-normalised interactivity (x), every run's points, and each run's Pareto frontier (the
// points no other point of that run beats on both axes) as a line. Drawn once against a small
// Surface, written as SVG and as PNG (loadgen/png).
#pragma once
#include <string>
#include <vector>

namespace m3::loadgen {

struct PlotPoint {
  double x = 0, y = 0;
  int concurrency = 0;
};

struct PlotSeries {
  std::string label;
  std::vector<PlotPoint> points;
};

// Indices of the non-dominated points (no other point has x and y both >= it, one of them >),
// sorted by x.
std::vector<size_t> pareto_frontier(const std::vector<PlotPoint>& points);

std::string render_svg(const std::vector<PlotSeries>& series, const std::string& title);
std::string render_png(const std::vector<PlotSeries>& series, const std::string& title);

}  // namespace m3::loadgen
