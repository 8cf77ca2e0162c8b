// Route vocabulary and the rendering of explanations. Each op family's table lives in its own
// file (conv_routes.cpp, quantize_routes.cpp, ...); select() == explain().chosen by construction.
#include "lattice/route/route.h"

#include <cstdio>

namespace lattice {

std::string_view to_string(RouteId id) {
  switch (id) {
    case RouteId::conv_reference: return "reference";
    case RouteId::conv_pointwise_matmul: return "pointwise_matmul";
    case RouteId::conv_gather_gemm_scatter: return "gather_gemm_scatter";
    case RouteId::quantize_reference: return "reference";
    case RouteId::point_voxel_reference: return "reference";
    case RouteId::point_voxel_parallel: return "parallel";
    case RouteId::pool_reference: return "reference";
    case RouteId::pool_csr_reduce: return "csr_reduce";
    case RouteId::pool_input_exclusive: return "input_exclusive";
    case RouteId::algebra_reference: return "reference";
    case RouteId::algebra_hashed: return "hashed";
    case RouteId::coords_reference: return "reference";
    case RouteId::conv_cuda_gather_gemm_scatter: return "cuda_gather_gemm_scatter";
    case RouteId::conv_implicit_gemm_sm80: return "implicit_gemm_sm80";
    case RouteId::quantize_cuda: return "cuda";
    case RouteId::point_voxel_cuda: return "cuda";
    case RouteId::pool_cuda_csr_reduce: return "cuda_csr_reduce";
    case RouteId::algebra_cuda_hashed: return "cuda_hashed";
    case RouteId::coords_cuda: return "cuda";
    case RouteId::quantized_dequant_reference: return "dequant_reference";
    case RouteId::quantized_fused_dequant_gemm: return "fused_dequant_gemm";
    case RouteId::quantized_cuda_dequant_gemm: return "cuda_dequant_gemm";
  }
  return "unknown";
}

std::string_view op_family(RouteId id) {
  switch (id) {
    case RouteId::conv_reference:
    case RouteId::conv_pointwise_matmul:
    case RouteId::conv_gather_gemm_scatter:
    case RouteId::conv_cuda_gather_gemm_scatter:
    case RouteId::conv_implicit_gemm_sm80: return "conv";
    case RouteId::quantize_reference:
    case RouteId::quantize_cuda: return "quantize";
    case RouteId::point_voxel_reference:
    case RouteId::point_voxel_parallel:
    case RouteId::point_voxel_cuda: return "point_voxel";
    case RouteId::pool_reference:
    case RouteId::pool_csr_reduce:
    case RouteId::pool_input_exclusive:
    case RouteId::pool_cuda_csr_reduce: return "pool";
    case RouteId::algebra_reference:
    case RouteId::algebra_hashed:
    case RouteId::algebra_cuda_hashed: return "algebra";
    case RouteId::coords_reference:
    case RouteId::coords_cuda: return "coords";
    case RouteId::quantized_dequant_reference:
    case RouteId::quantized_fused_dequant_gemm:
    case RouteId::quantized_cuda_dequant_gemm: return "quantized";
  }
  return "unknown";
}

std::optional<RouteId> route_from_string(std::string_view family, std::string_view name) {
  for (RouteId id : {RouteId::conv_reference, RouteId::conv_pointwise_matmul,
                     RouteId::conv_gather_gemm_scatter, RouteId::quantize_reference,
                     RouteId::point_voxel_reference, RouteId::point_voxel_parallel,
                     RouteId::pool_reference, RouteId::pool_csr_reduce, RouteId::pool_input_exclusive,
                     RouteId::algebra_reference, RouteId::algebra_hashed, RouteId::coords_reference,
                     RouteId::conv_cuda_gather_gemm_scatter, RouteId::conv_implicit_gemm_sm80,
                     RouteId::quantize_cuda, RouteId::point_voxel_cuda, RouteId::pool_cuda_csr_reduce,
                     RouteId::algebra_cuda_hashed, RouteId::coords_cuda,
                     RouteId::quantized_dequant_reference, RouteId::quantized_fused_dequant_gemm,
                     RouteId::quantized_cuda_dequant_gemm}) {
    if (op_family(id) == family && to_string(id) == name) return id;
  }
  return std::nullopt;
}

const RouteRow* Explanation::row(RouteId id) const {
  for (const auto& r : rows)
    if (r.id == id) return &r;
  return nullptr;
}

std::string Explanation::to_string() const {
  std::string s = "route decision for " + problem + "\n";
  s += "  devices: " + caps + "\n";
  if (forced) {
    s += "  policy: forced route '" + std::string(lattice::to_string(*forced)) + "'";
    s += chosen ? " (admitted)\n" : " (rejected: " + forced_reason + ")\n";
  }
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
      s += forced ? "admitted, not forced" : "admitted, lower preference";
    } else {
      s += "rejected: " + r.verdict.reason;
    }
    s += "\n";
  }
  if (!chosen) s += "  no route admitted\n";
  return s;
}

}  // namespace lattice
