#pragma once
/// @file plot.h
/// @brief Line and scatter plots written as SVG: rooflines, latency sweeps, per-step costs.
///
/// Small on purpose: linear or log axes with readable ticks, polylines, labelled points and a
/// legend. SVG is text, so a plot is diffable in git and opens in any browser.

#include <cmath>
#include <string>
#include <utility>
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

/// The figure as an SVG document. The axis labels are text of class "x-label" and "y-label", and
/// each series a group of class "series", so a test can find them.
std::string to_svg(const Figure& f);
/// Writes to_svg(f) to `path`; throws naming the path on failure.
void save_svg(const Figure& f, const std::string& path);

/// Several figures stacked top to bottom in one document: two quantities with different units
/// measured in the same run (bytes and tokens/s against K), each on its own axes.
std::string to_svg(const std::vector<Figure>& panels);
void save_svg(const std::vector<Figure>& panels, const std::string& path);

/// `n` points of y = fn(x) from `lo` to `hi` (spaced evenly in log x when `log_x`): a formula's
/// curve drawn beside the points measured against it.
template <class Fn>
Series curve(std::string label, double lo, double hi, int n, bool log_x, Fn fn) {
  Series s;
  s.label = std::move(label);
  for (int i = 0; i < n; ++i) {
    const double t = n > 1 ? static_cast<double>(i) / (n - 1) : 0;
    const double x = log_x ? lo * std::pow(hi / lo, t) : lo + t * (hi - lo);
    s.x.push_back(x), s.y.push_back(fn(x));
  }
  return s;
}

/// y ≈ coefficient · x^exponent, by least squares on log y against log x over the points with
/// x, y > 0; `ok` is false without two distinct x to fit over.
struct PowerLaw {
  double exponent = 0, coefficient = 0;
  bool ok = false;
  double operator()(double x) const { return coefficient * std::pow(x, exponent); }
};
PowerLaw fit_power_law(const std::vector<double>& x, const std::vector<double>& y);

/// A table of coloured cells, not a plot: a block table (rows are requests, columns logical
/// blocks, each cell a physical block), the canvas of a diffusion model (rows are steps, cells
/// tokens). Each row is a group of class "series"; `kinds` is the legend, `Cell::kind` its index.
struct Cell {
  std::string text;
  int kind = 0;
};
struct Kind {
  std::string label, color;
};
struct Grid {
  std::string title, x_label, y_label;  ///< what a column is, what a row is
  std::vector<std::string> row_labels;
  std::vector<std::vector<Cell>> rows;
  std::vector<Kind> kinds;
  int cell_width = 44, cell_height = 26;
};
std::string to_svg(const Grid& g);
void save_svg(const Grid& g, const std::string& path);

}  // namespace inferlab::plot
