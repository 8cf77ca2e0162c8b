#include "lattice/route/problem.h"

#include <cstdio>

namespace lattice {

std::string to_string(const ConvProblem& p) {
  char avg[32];
  std::snprintf(avg, sizeof avg, "%.2f", p.n_out ? static_cast<double>(p.n_edges) / p.n_out : 0.0);
  return p.op + " " + std::string(to_string(p.pass)) + ": " + std::string(to_string(p.relation)) +
         " relation, " + std::string(to_string(p.dtype)) + " on " + to_string(p.device) +
         ", N_in=" + std::to_string(p.n_in) + " N_out=" + std::to_string(p.n_out) +
         " C_in=" + std::to_string(p.c_in) + " C_out=" + std::to_string(p.c_out) +
         " K=" + std::to_string(p.kernel_volume) + " edges=" + std::to_string(p.n_edges) + " (" + avg +
         " per output row)" + (p.identity_relation ? ", identity relation" : "") +
         (p.deterministic ? "" : ", non-deterministic allowed") + (p.allow_tf32 ? ", tf32 allowed" : "");
}

std::string to_string(const QuantizeProblem& p) {
  return p.op + ": " + std::to_string(p.n_points) + " points, " + std::string(to_string(p.dtype)) +
         " on " + to_string(p.device);
}

}  // namespace lattice
