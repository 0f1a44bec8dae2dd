#include "common/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "common/cli.h"
#include "common/error.h"

namespace inferlab::plot {

namespace {

const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '&') o += "&amp;";
    else if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else o += c;
  }
  return o;
}

std::string num(double v) {
  char b[32];
  const double a = std::fabs(v);
  if (a != 0 && (a >= 1e6 || a < 1e-3)) std::snprintf(b, sizeof b, "%.0e", v);
  else std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// The legend: its column is the right margin; a label wider than the column wraps at spaces onto
// further lines (a word wider than the column keeps a line to itself). Widths are estimated at
// 7 px a character of the 12 px sans-serif font (its average advance is about 0.55 em).
constexpr double kLegendMargin = 250, kLegendInset = 14, kLegendText = 28, kCharPx = 7, kLinePx = 15;

std::size_t glyphs(const std::string& s) {
  return static_cast<std::size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

std::vector<std::string> wrap(const std::string& label, std::size_t width) {
  std::vector<std::string> lines;
  std::istringstream words(label);
  std::string w;
  while (words >> w) {
    if (!lines.empty() && glyphs(lines.back()) + 1 + glyphs(w) <= width) lines.back() += " " + w;
    else lines.push_back(w);
  }
  if (lines.empty()) lines.push_back("");
  return lines;
}

struct Scale {
  double lo, hi;
  bool log;
  double px0, px1;
  double operator()(double v) const {
    const double t = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
    return px0 + t * (px1 - px0);
  }
  std::vector<double> ticks() const {
    std::vector<double> t;
    if (log) {
      for (double d = std::pow(10, std::floor(std::log10(lo))); d <= hi * 1.0001; d *= 10)
        if (d >= lo * 0.9999) t.push_back(d);
      return t;
    }
    const double raw = (hi - lo) / 6, mag = std::pow(10, std::floor(std::log10(raw)));
    const double step = raw / mag < 2 ? 2 * mag : raw / mag < 5 ? 5 * mag : 10 * mag;
    for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
      t.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
    return t;
  }
};

void range(const Figure& f, bool xaxis, double& lo, double& hi) {
  const Axis& a = xaxis ? f.x : f.y;
  if (a.min != 0 || a.max != 0) {
    lo = a.min, hi = a.max;
    return;
  }
  lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& s : f.series)
    for (double v : xaxis ? s.x : s.y)
      if (std::isfinite(v) && (!a.log || v > 0)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!std::isfinite(lo)) lo = a.log ? 1 : 0, hi = a.log ? 10 : 1;
  if (a.log) {
    lo = std::pow(10, std::floor(std::log10(lo))), hi = std::pow(10, std::ceil(std::log10(hi)));
    if (hi <= lo) hi = lo * 10;
  } else {
    if (lo > 0 && lo < hi * 0.5) lo = 0;
    const double pad = (hi - lo) * 0.05 + (hi == lo ? 1 : 0);
    hi += pad;
    if (lo != 0) lo -= pad;
  }
}

}  // namespace

namespace {

std::string header(double width, double height) {
  std::ostringstream o;
  o << R"(<svg xmlns="http://www.w3.org/2000/svg" width=")" << width << "\" height=\"" << height
    << R"(" font-family="sans-serif" font-size="12">)"
    << "\n";
  return o.str();
}

// The figure's elements (everything inside the <svg>); `clip` names its clip path, unique in the document.
void draw(std::ostringstream& o, const Figure& f, const std::string& clip) {
  const double L = 90, R = kLegendMargin, T = 50, B = 60;  // margins; the legend sits on the right
  const auto legend_width = static_cast<std::size_t>((R - kLegendInset - kLegendText - 8) / kCharPx);
  double ly = T + 14;  // the next legend entry's baseline
  double xlo, xhi, ylo, yhi;
  range(f, true, xlo, xhi);
  range(f, false, ylo, yhi);
  const Scale sx{xlo, xhi, f.x.log, L, f.width - R}, sy{ylo, yhi, f.y.log, f.height - B, T};
  o << "<rect width=\"" << f.width << "\" height=\"" << f.height << R"(" fill="white"/>)"
    << "\n"
    << "<text x=\"" << f.width / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">" << esc(f.title) << "</text>\n";
  // Grid and ticks.
  for (double t : sx.ticks())
    o << "<line x1=\"" << sx(t) << "\" y1=\"" << T << "\" x2=\"" << sx(t) << "\" y2=\"" << f.height - B
      << R"(" stroke="#ddd"/><text x=")" << sx(t) << "\" y=\"" << f.height - B + 16 << R"(" text-anchor="middle">)" << num(t)
      << "</text>\n";
  for (double t : sy.ticks())
    o << "<line x1=\"" << L << "\" y1=\"" << sy(t) << "\" x2=\"" << f.width - R << "\" y2=\"" << sy(t)
      << R"(" stroke="#ddd"/><text x=")" << L - 6 << "\" y=\"" << sy(t) + 4 << R"(" text-anchor="end">)" << num(t)
      << "</text>\n";
  o << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << f.width - R - L << "\" height=\"" << f.height - B - T
    << R"(" fill="none" stroke="#333"/>)"
    << "\n";
  o << "<text x=\"" << (L + f.width - R) / 2 << "\" y=\"" << f.height - 18 << R"(" text-anchor="middle" class="x-label">)"
    << esc(f.x.label) << "</text>\n";
  o << "<text transform=\"translate(22," << (T + f.height - B) / 2
    << R"svg() rotate(-90)" text-anchor="middle" class="y-label">)svg" << esc(f.y.label) << "</text>\n";
  // Series, clipped to the plot area.
  o << "<clipPath id=\"" << clip << "\"><rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << f.width - R - L
    << "\" height=\"" << f.height - B - T << "\"/></clipPath>\n";
  int k = 0;
  for (const auto& s : f.series) {
    const std::string color = s.color.empty() ? kPalette[k % 8] : s.color;
    auto ok = [&](std::size_t i) {
      return std::isfinite(s.x[i]) && std::isfinite(s.y[i]) && (!f.x.log || s.x[i] > 0) && (!f.y.log || s.y[i] > 0);
    };
    o << "<g class=\"series\" clip-path=\"url(#" << clip << ")\">";
    if (s.line) {
      o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\""
        << (s.dashed ? " stroke-dasharray=\"6,4\"" : "") << " points=\"";
      for (std::size_t i = 0; i < s.x.size(); ++i)
        if (ok(i)) o << sx(s.x[i]) << ',' << sy(s.y[i]) << ' ';
      o << "\"/>";
    }
    if (s.markers || s.label_points)
      for (std::size_t i = 0; i < s.x.size(); ++i)
        if (ok(i)) {
          o << "<circle cx=\"" << sx(s.x[i]) << "\" cy=\"" << sy(s.y[i]) << "\" r=\"4\" fill=\"" << color << "\"/>";
          if (s.label_points && i < s.point_labels.size())
            o << "<text x=\"" << sx(s.x[i]) + 6 << "\" y=\"" << sy(s.y[i]) - 6 << "\" fill=\"" << color << "\">"
              << esc(s.point_labels[i]) << "</text>";
        }
    o << "</g>\n";
    // Legend entry.
    const double lx = f.width - R + kLegendInset;
    if (s.line)
      o << "<line x1=\"" << lx << "\" y1=\"" << ly << "\" x2=\"" << lx + 22 << "\" y2=\"" << ly << "\" stroke=\"" << color
        << "\" stroke-width=\"3\"" << (s.dashed ? " stroke-dasharray=\"6,4\"" : "") << "/>";
    else o << "<circle cx=\"" << lx + 11 << "\" cy=\"" << ly << "\" r=\"4\" fill=\"" << color << "\"/>";
    const std::vector<std::string> lines = wrap(s.label, legend_width);
    o << "<text x=\"" << lx + kLegendText << "\" y=\"" << ly + 4 << "\">" << esc(lines[0]);
    for (std::size_t i = 1; i < lines.size(); ++i)
      o << "<tspan x=\"" << lx + kLegendText << "\" dy=\"" << kLinePx << "\">" << esc(lines[i]) << "</tspan>";
    o << "</text>\n";
    ly += 20 + kLinePx * static_cast<double>(lines.size() - 1);
    ++k;
  }
}

}  // namespace

std::string to_svg(const Figure& f) {
  std::ostringstream o;
  o << header(f.width, f.height);
  draw(o, f, "area");
  o << "</svg>\n";
  return o.str();
}

void save_svg(const Figure& f, const std::string& path) { write_text(path, to_svg(f)); }

std::string to_svg(const std::vector<Figure>& panels) {
  int width = 0, height = 0;
  for (const Figure& f : panels) width = std::max(width, f.width), height += f.height;
  std::ostringstream o;
  o << header(width, height);
  int y = 0;
  for (std::size_t i = 0; i < panels.size(); ++i) {
    o << "<g transform=\"translate(0," << y << ")\">\n";
    draw(o, panels[i], "area" + std::to_string(i));
    o << "</g>\n";
    y += panels[i].height;
  }
  o << "</svg>\n";
  return o.str();
}

void save_svg(const std::vector<Figure>& panels, const std::string& path) { write_text(path, to_svg(panels)); }

PowerLaw fit_power_law(const std::vector<double>& x, const std::vector<double>& y) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0, n = 0;
  for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    if (!(x[i] > 0 && y[i] > 0)) continue;
    const double lx = std::log(x[i]), ly = std::log(y[i]);
    sx += lx, sy += ly, sxx += lx * lx, sxy += lx * ly, n += 1;
  }
  const double spread = n * sxx - sx * sx;
  PowerLaw p;
  if (n < 2 || !(spread > 1e-12 * n * sxx)) return p;
  p.exponent = (n * sxy - sx * sy) / spread;
  p.coefficient = std::exp((sy - p.exponent * sx) / n);
  p.ok = true;
  return p;
}

std::string to_svg(const Grid& g) {
  const double L = 130, T = 50, B = 56, R = kLegendMargin, cw = g.cell_width, ch = g.cell_height;
  std::size_t cols = 0;
  for (const auto& r : g.rows) cols = std::max(cols, r.size());
  const double table = ch * static_cast<double>(g.rows.size());  // the legend may be the taller
  const double width = L + cw * static_cast<double>(cols) + R,
               height = T + std::max(table, 24.0 * static_cast<double>(g.kinds.size())) + B;
  std::ostringstream o;
  o << header(width, height) << "<rect width=\"" << width << "\" height=\"" << height << R"(" fill="white"/>)"
    << "\n<text x=\"" << width / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">" << esc(g.title) << "</text>\n";
  const auto color = [&](int kind) {
    return kind >= 0 && static_cast<std::size_t>(kind) < g.kinds.size() &&
                   !g.kinds[static_cast<std::size_t>(kind)].color.empty()
               ? g.kinds[static_cast<std::size_t>(kind)].color
               : std::string(kPalette[static_cast<std::size_t>(std::max(kind, 0)) % 8]);
  };
  for (std::size_t r = 0; r < g.rows.size(); ++r) {
    const double y = T + ch * static_cast<double>(r);
    o << "<g class=\"series\">";
    if (r < g.row_labels.size())
      o << "<text x=\"" << L - 8 << "\" y=\"" << y + ch / 2 + 4 << R"(" text-anchor="end">)" << esc(g.row_labels[r])
        << "</text>";
    for (std::size_t c = 0; c < g.rows[r].size(); ++c) {
      const Cell& cell = g.rows[r][c];
      const double x = L + cw * static_cast<double>(c);
      o << "<rect x=\"" << x + 1 << "\" y=\"" << y + 1 << "\" width=\"" << cw - 2 << "\" height=\"" << ch - 2 << "\" fill=\""
        << color(cell.kind) << R"(" fill-opacity="0.75"/>)";
      if (!cell.text.empty())
        o << "<text x=\"" << x + cw / 2 << "\" y=\"" << y + ch / 2 + 4 << R"(" text-anchor="middle">)" << esc(cell.text)
          << "</text>";
    }
    o << "</g>\n";
  }
  // Column numbers under the table, the axis labels, the legend.
  for (std::size_t c = 0; c < cols; ++c)
    o << "<text x=\"" << L + cw * (static_cast<double>(c) + 0.5) << "\" y=\"" << T + table + 16
      << R"(" text-anchor="middle" fill="#555">)" << c << "</text>";
  o << "\n<text x=\"" << L + cw * static_cast<double>(cols) / 2 << "\" y=\"" << T + table + 40
    << R"(" text-anchor="middle" class="x-label">)" << esc(g.x_label) << "</text>\n";
  o << "<text transform=\"translate(18," << T + table / 2 << R"svg() rotate(-90)" text-anchor="middle" class="y-label">)svg"
    << esc(g.y_label) << "</text>\n";
  const double lx = width - R + kLegendInset;
  double ly = T + 10;
  const auto legend_width = static_cast<std::size_t>((R - kLegendInset - kLegendText - 8) / kCharPx);
  for (std::size_t k = 0; k < g.kinds.size(); ++k) {
    o << "<rect x=\"" << lx << "\" y=\"" << ly - 8 << "\" width=\"22\" height=\"14\" fill=\"" << color(static_cast<int>(k))
      << R"(" fill-opacity="0.75"/>)";
    const std::vector<std::string> lines = wrap(g.kinds[k].label, legend_width);
    o << "<text x=\"" << lx + kLegendText << "\" y=\"" << ly + 4 << "\">" << esc(lines[0]);
    for (std::size_t i = 1; i < lines.size(); ++i)
      o << "<tspan x=\"" << lx + kLegendText << "\" dy=\"" << kLinePx << "\">" << esc(lines[i]) << "</tspan>";
    o << "</text>\n";
    ly += 20 + kLinePx * static_cast<double>(lines.size() - 1);
  }
  o << "</svg>\n";
  return o.str();
}

void save_svg(const Grid& g, const std::string& path) { write_text(path, to_svg(g)); }

}  // namespace inferlab::plot
