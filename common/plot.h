#pragma once
/// @file plot.h
/// @brief Line and scatter plots written as SVG: rooflines, latency sweeps, per-step costs.
///
/// Small on purpose: linear or log axes with readable ticks, polylines, labelled points and a
/// legend. SVG is text, so a plot is diffable in git and opens in any browser.

#include <string>
#include <vector>

namespace inferlab::plot {

struct Series {
  std::string label;
  std::vector<double> x, y;
  std::string color;          ///< any SVG colour; empty picks from a palette
  bool line = true;           ///< join the points
  bool markers = false;       ///< draw a dot at each point
  bool label_points = false;  ///< write `point_labels[i]` beside point i
  std::vector<std::string> point_labels;
  bool dashed = false;
};

struct Axis {
  std::string label;
  bool log = false;
  double min = 0, max = 0;  ///< both 0: fit the data
};

struct Figure {
  std::string title;
  Axis x, y;
  std::vector<Series> series;
  int width = 880, height = 560;
};

/// The figure as an SVG document.
std::string to_svg(const Figure& f);
/// Writes to_svg(f) to `path`; throws naming the path on failure.
void save_svg(const Figure& f, const std::string& path);

}  // namespace inferlab::plot
