// Renders a Plan for people (aligned text), tools (JSON) and eyes (an SVG chart of memory against
// context length per KV format, with the device's usable line). Pure functions; thread-safe.
#pragma once

#include <string>

#include "bie/planner/planner.h"

namespace bie::planner {

[[nodiscard]] std::string render_plan_text(const Plan& plan);
[[nodiscard]] std::string render_plan_json(const Plan& plan);  // pretty-printed, ends in '\n'
[[nodiscard]] std::string render_plan_svg(const Plan& plan);

// "8.00 GiB", "36.0 KiB", "512 B": binary units, for reports.
[[nodiscard]] std::string format_bytes(double bytes);

}  // namespace bie::planner
