#include "train/training_log_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace laoyao::train {
namespace {

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string fmt(const char* spec, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, spec, x);
  return buf;
}

// "Nice" tick step (1, 2 or 5 times a power of ten) giving about `count` ticks over `span`.
double tick_step(double span, int count) {
  if (!(span > 0)) return 1.0;
  double raw = span / count;
  double p = std::pow(10.0, std::floor(std::log10(raw)));
  double m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

std::string tick_label(double v, double step) {
  if (std::fabs(v) < step * 1e-9) v = 0.0;
  int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", std::min(decimals, 10), v);
  return buf;
}

}  // namespace

std::string line_chart_svg(const std::string& title, const std::string& y_label,
                           const std::vector<PlotSeries>& series, std::optional<double> marker_x) {
  const double W = 800, H = 480, left = 80, right = 20, top = 40, bottom = 60;
  const double pw = W - left - right, ph = H - top - bottom;
  static const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"};

  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y0 -= 0.5, y1 += 0.5;
  double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;
  auto X = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return top + (y1 - y) / (y1 - y0) * ph; };

  std::string svg;
  svg += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"800\" height=\"480\" viewBox=\"0 0 800 480\" "
         "font-family=\"sans-serif\" font-size=\"12\">\n";
  svg += "<rect x=\"0\" y=\"0\" width=\"800\" height=\"480\" fill=\"white\"/>\n";
  svg += "<text x=\"400\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">" + xml_escape(title) + "</text>\n";

  // Grid, ticks and labels.
  double xs = tick_step(x1 - x0, 8), ys = tick_step(y1 - y0, 6);
  for (double t = std::ceil(x0 / xs) * xs; t <= x1 + xs * 1e-9; t += xs) {
    std::string px = fmt("%.2f", X(t));
    svg += "<line x1=\"" + px + "\" y1=\"" + fmt("%.2f", top) + "\" x2=\"" + px + "\" y2=\"" +
           fmt("%.2f", top + ph) + "\" stroke=\"#e0e0e0\"/>\n";
    svg += "<text x=\"" + px + "\" y=\"" + fmt("%.2f", top + ph + 18) +
           "\" text-anchor=\"middle\">" + tick_label(t, xs) + "</text>\n";
  }
  for (double t = std::ceil(y0 / ys) * ys; t <= y1 + ys * 1e-9; t += ys) {
    std::string py = fmt("%.2f", Y(t));
    svg += "<line x1=\"" + fmt("%.2f", left) + "\" y1=\"" + py + "\" x2=\"" + fmt("%.2f", left + pw) +
           "\" y2=\"" + py + "\" stroke=\"#e0e0e0\"/>\n";
    svg += "<text x=\"" + fmt("%.2f", left - 6) + "\" y=\"" + py +
           "\" text-anchor=\"end\" dominant-baseline=\"middle\">" + tick_label(t, ys) + "</text>\n";
  }
  svg += "<rect x=\"" + fmt("%.2f", left) + "\" y=\"" + fmt("%.2f", top) + "\" width=\"" + fmt("%.2f", pw) +
         "\" height=\"" + fmt("%.2f", ph) + "\" fill=\"none\" stroke=\"black\"/>\n";
  svg += "<text x=\"" + fmt("%.2f", left + pw / 2) + "\" y=\"" + fmt("%.2f", H - 16) +
         "\" text-anchor=\"middle\">iteration</text>\n";
  svg += "<text x=\"18\" y=\"" + fmt("%.2f", top + ph / 2) + "\" text-anchor=\"middle\" transform=\"rotate(-90 18 " +
         fmt("%.2f", top + ph / 2) + ")\">" + xml_escape(y_label) + "</text>\n";

  if (marker_x && std::isfinite(*marker_x)) {
    std::string px = fmt("%.2f", X(*marker_x));
    svg += "<line x1=\"" + px + "\" y1=\"" + fmt("%.2f", top) + "\" x2=\"" + px + "\" y2=\"" +
           fmt("%.2f", top + ph) + "\" stroke=\"#d62728\" stroke-dasharray=\"6 4\"/>\n";
  }

  for (size_t i = 0; i < series.size(); ++i) {
    const char* color = kColors[i % 4];
    std::string pts;
    for (const auto& [x, y] : series[i].points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      if (!pts.empty()) pts += ' ';
      pts += fmt("%.2f", X(x)) + "," + fmt("%.2f", Y(y));
    }
    svg += "<polyline fill=\"none\" stroke=\"" + std::string(color) + "\" stroke-width=\"1.5\" points=\"" +
           pts + "\"/>\n";
    double ly = top + 16 + 18 * static_cast<double>(i);
    svg += "<line x1=\"" + fmt("%.2f", left + pw - 220) + "\" y1=\"" + fmt("%.2f", ly) + "\" x2=\"" +
           fmt("%.2f", left + pw - 196) + "\" y2=\"" + fmt("%.2f", ly) + "\" stroke=\"" + color +
           "\" stroke-width=\"2\"/>\n";
    svg += "<text x=\"" + fmt("%.2f", left + pw - 190) + "\" y=\"" + fmt("%.2f", ly) +
           "\" dominant-baseline=\"middle\">" + xml_escape(series[i].label) + "</text>\n";
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace laoyao::train
