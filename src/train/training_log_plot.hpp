// A small hand-written SVG line chart of loss curves (`laoyao compare-logs --plot`): no plotting
// library, opens in any browser.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace laoyao::train {

struct PlotSeries {
  std::string label;                               // legend text (escaped here)
  std::vector<std::pair<double, double>> points;   // (iteration, value); non-finite values skipped
};

// An 800x480 SVG document with axes, ticks, a legend and one polyline per series (at most a
// few series; colours repeat after 4). `marker_x`, when set, draws a dashed vertical line there
// (the iteration where two runs part).
std::string line_chart_svg(const std::string& title, const std::string& y_label,
                           const std::vector<PlotSeries>& series,
                           std::optional<double> marker_x = std::nullopt);

}  // namespace laoyao::train
