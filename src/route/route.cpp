// Route vocabulary (all of it derived from the family tables' rows) and the rendering of
// explanations. Each op family's table lives in its own file (conv_routes.cpp,
// quantize_routes.cpp, ...); select() == explain().chosen by construction.
#include "lattice/route/route.h"

#include <algorithm>
#include <cstdio>

#include "route/route_table.h"

namespace lattice {

const std::vector<RouteInfo>& route_table() {
  static const std::vector<RouteInfo> rows = [] {
    std::vector<RouteInfo> all;
    for (auto family : {route_detail::conv_route_infos, route_detail::quantize_route_infos,
                        route_detail::point_voxel_route_infos, route_detail::pool_route_infos,
                        route_detail::algebra_route_infos, route_detail::coords_route_infos,
                        route_detail::quantized_route_infos, route_detail::relation_route_infos,
                        route_detail::pool_edges_route_infos, route_detail::point_index_route_infos,
                        route_detail::dequantize_route_infos, route_detail::batch_norm_route_infos}) {
      std::vector<RouteInfo> rows;
      family(rows);
      std::stable_sort(rows.begin(), rows.end(),
                       [](const RouteInfo& a, const RouteInfo& b) { return a.rank < b.rank; });
      all.insert(all.end(), rows.begin(), rows.end());
    }
    return all;
  }();
  return rows;
}

const RouteInfo& route_info(RouteId id) {
  // Indexed by the enum value; every RouteId has exactly one row (tests/cpp/test_route.cpp).
  static const std::vector<const RouteInfo*> by_id = [] {
    std::vector<const RouteInfo*> v;
    for (const auto& r : route_table()) {
      const auto i = static_cast<std::size_t>(r.id);
      if (v.size() <= i) v.resize(i + 1, nullptr);
      v[i] = &r;
    }
    return v;
  }();
  static const RouteInfo unknown{id, "unknown", "unknown", "", GpuTier::none, 0, "", {}};
  const auto i = static_cast<std::size_t>(id);
  return i < by_id.size() && by_id[i] ? *by_id[i] : unknown;
}

std::vector<std::string_view> route_families() {
  std::vector<std::string_view> out;
  for (const auto& r : route_table())
    if (std::find(out.begin(), out.end(), r.family) == out.end()) out.push_back(r.family);
  return out;
}

std::vector<std::string_view> route_names(std::string_view family) {
  std::vector<std::string_view> out;
  for (const auto& r : route_table())
    if (r.family == family) out.push_back(r.name);
  return out;
}

std::string route_name_list(std::string_view family) {
  const auto names = route_names(family);
  std::string s = names.size() > 2 ? "one of " : "";
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i) s += names.size() == 2 ? " or " : ", ";
    s.append("'").append(names[i]).append("'");
  }
  return s;
}

std::string_view to_string(RouteId id) { return route_info(id).name; }

std::string_view op_family(RouteId id) { return route_info(id).family; }

std::optional<RouteId> route_from_string(std::string_view family, std::string_view name) {
  for (const auto& r : route_table())
    if (r.family == family && r.name == name) return r.id;
  return std::nullopt;
}

const RouteRow* Explanation::row(RouteId id) const {
  for (const auto& r : rows)
    if (r.id == id) return &r;
  return nullptr;
}

namespace {

// Appends `inner`'s lines to `s`, each indented by four spaces.
void append_indented(std::string& s, const std::string& inner) {
  for (std::size_t at = 0; at < inner.size();) {
    const std::size_t end = inner.find('\n', at);
    s += "    " + inner.substr(at, end == std::string::npos ? std::string::npos : end - at + 1);
    at = end == std::string::npos ? inner.size() : end + 1;
  }
}

}  // namespace

std::string Explanation::to_string() const {
  std::string s;
  for (const auto& before : prior) {
    s += "first:\n";
    append_indented(s, before.to_string());
  }
  s += "route decision for " + problem + "\n";
  s += "  devices: " + caps + "\n";
  if (forced) {
    s += "  policy: forced route '" + std::string(lattice::to_string(*forced)) + "'";
    s += chosen ? " (admitted)\n" : " (rejected: " + forced_reason + ")\n";
  }
  if (!tuned.empty()) s += "  tuned: " + tuned + "\n";
  char line[96];
  std::snprintf(line, sizeof line, "     %-22s %4s  %s\n", "route", "rank", "verdict");
  s += line;
  for (const auto& r : rows) {
    const bool is_chosen = chosen && *chosen == r.id;
    std::snprintf(line, sizeof line, "  %s %-22s %4d  ", is_chosen ? "->" : "  ",
                  std::string(lattice::to_string(r.id)).c_str(), r.rank);
    s += line;
    if (is_chosen) {
      s += "chosen";
    } else if (r.verdict.admitted) {
      s += forced ? "admitted, not forced" : tuned_chosen ? "admitted, not the measured choice" : "admitted, lower preference";
    } else {
      s += "rejected: " + r.verdict.reason;
    }
    s += "\n";
  }
  if (!chosen) s += "  no route admitted\n";
  for (const auto& stage : stages) {
    s += "  then:\n";
    append_indented(s, stage.to_string());
  }
  return s;
}

}  // namespace lattice
