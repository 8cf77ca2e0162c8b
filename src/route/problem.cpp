#include "lattice/route/problem.h"

#include <cstdio>

namespace lattice {

std::string to_string(const ConvProblem& p) {
  char avg[32];
  std::snprintf(avg, sizeof avg, "%.2f", p.n_out ? static_cast<double>(p.n_edges) / p.n_out : 0.0);
  const std::string edges = p.n_edges >= 0
                                ? " edges=" + std::to_string(p.n_edges) + " (" + avg + " per output row)"
                                : std::string(" edges not counted");
  return p.op + " " + std::string(to_string(p.pass)) + ": " + std::string(to_string(p.relation)) +
         " relation, " + std::string(to_string(p.dtype)) + " on " + to_string(p.device) +
         ", N_in=" + std::to_string(p.n_in) + " N_out=" + std::to_string(p.n_out) +
         " C_in=" + std::to_string(p.c_in) + " C_out=" + std::to_string(p.c_out) +
         " K=" + std::to_string(p.kernel_volume) + edges + (p.identity_relation ? ", identity relation" : "") +
         (p.deterministic ? "" : ", non-deterministic allowed") + (p.allow_tf32 ? ", tf32 allowed" : "");
}

std::string to_string(const QuantizeProblem& p) {
  return p.op + ": " + std::to_string(p.n_points) + " points, " + std::string(to_string(p.dtype)) +
         " on " + to_string(p.device);
}

std::string_view to_string(PointVoxelPass p) {
  switch (p) {
    case PointVoxelPass::forward: return "forward";
    case PointVoxelPass::backward: return "backward";
    case PointVoxelPass::build_map: return "build_map";
  }
  return "unknown";
}

std::string to_string(const PointVoxelProblem& p) {
  return p.op + " " + std::string(to_string(p.pass)) + (p.detail.empty() ? "" : " (" + p.detail + ")") +
         ": " + std::string(to_string(p.dtype)) + " on " + to_string(p.device) +
         ", P=" + std::to_string(p.n_points) + " M=" + std::to_string(p.n_voxels) +
         " C=" + std::to_string(p.channels) + " pairs=" + std::to_string(p.n_pairs);
}

std::string_view to_string(PoolPass p) {
  switch (p) {
    case PoolPass::forward: return "forward";
    case PoolPass::input_grad: return "input_grad";
  }
  return "unknown";
}

std::string_view to_string(PoolEdges e) {
  switch (e) {
    case PoolEdges::forward: return "forward";
    case PoolEdges::target: return "target";
    case PoolEdges::transposed: return "transposed";
    case PoolEdges::transposed_target: return "transposed_target";
    case PoolEdges::batch: return "batch";
    case PoolEdges::trilinear: return "trilinear";
  }
  return "unknown";
}

std::string to_string(const PoolProblem& p) {
  char avg[32];
  std::snprintf(avg, sizeof avg, "%.2f", p.n_out ? static_cast<double>(p.n_edges) / p.n_out : 0.0);
  std::string s = p.op + " " + std::string(to_string(p.pass)) + " (" + std::string(to_string(p.mode)) +
                  "): " + std::string(to_string(p.edges)) + " edges";
  if (p.edges != PoolEdges::batch && p.edges != PoolEdges::trilinear) s += " (" + to_string(p.spec) + ")";
  s += ", " + std::string(to_string(p.dtype)) + " on " + to_string(p.device) + ", N_in=" +
       std::to_string(p.n_in) + " N_out=" + std::to_string(p.n_out) + " C=" + std::to_string(p.channels) +
       " edges=" + std::to_string(p.n_edges) + " (" + avg + " per output row)";
  if (!p.deterministic) s += ", non-deterministic allowed";
  return s;
}

std::string_view to_string(AlgebraPass pass) {
  switch (pass) {
    case AlgebraPass::align: return "align";
    case AlgebraPass::lookup: return "lookup";
    case AlgebraPass::forward: return "forward";
    case AlgebraPass::backward: return "backward";
  }
  return "unknown";
}

std::string to_string(const AlgebraProblem& p) {
  std::string s = p.op + " " + std::string(to_string(p.pass));
  switch (p.pass) {
    case AlgebraPass::align:
      s += " (" + std::string(to_string(p.join)) + " join)";
      break;
    case AlgebraPass::lookup: break;
    case AlgebraPass::forward:
    case AlgebraPass::backward: s += " (" + std::string(to_string(p.combine)) + ")"; break;
  }
  s += ": " + std::string(to_string(p.dtype)) + " on " + to_string(p.device);
  if (p.pass == AlgebraPass::lookup) {
    s += ", table=" + std::to_string(p.n_lhs) + " queries=" + std::to_string(p.n_rhs);
  } else {
    s += ", N_lhs=" + std::to_string(p.n_lhs) + " N_rhs=" + std::to_string(p.n_rhs);
  }
  if (p.pass == AlgebraPass::forward || p.pass == AlgebraPass::backward)
    s += " N_out=" + std::to_string(p.n_out) + " C=" + std::to_string(p.channels);
  if (p.same_key) s += ", same coordinate key (identity: no alignment)";
  return s;
}

std::string_view to_string(CoordsPass pass) {
  switch (pass) {
    case CoordsPass::downsample: return "downsample";
    case CoordsPass::morton_codes: return "morton_codes";
    case CoordsPass::morton_order: return "morton_order";
    case CoordsPass::prune: return "prune";
    case CoordsPass::crop: return "crop";
    case CoordsPass::collate: return "collate";
    case CoordsPass::dense: return "dense";
    case CoordsPass::from_dense: return "from_dense";
  }
  return "unknown";
}

std::string to_string(const CoordsProblem& p) {
  return p.op + ": " + std::to_string(p.n_rows) + " rows on " + to_string(p.device);
}

std::string_view to_string(RelationPass pass) { return pass == RelationPass::index ? "index" : "build"; }

std::string to_string(const RelationProblem& p) {
  std::string s = p.op + " relation " + std::string(to_string(p.pass)) + ": ";
  if (p.pass == RelationPass::build) {
    s += std::string(to_string(p.relation)) + " relation, K=" + std::to_string(p.kernel_volume) + ", ";
  }
  return s + std::to_string(p.n_rows) + " input rows on " + to_string(p.device);
}

std::string_view to_string(PoolEdgesPass pass) { return pass == PoolEdgesPass::batch ? "batch" : "trilinear"; }

std::string to_string(const PoolEdgesProblem& p) {
  return p.op + " " + std::string(to_string(p.pass)) + " edges: " + std::to_string(p.n_rows) + " rows on " +
         to_string(p.device);
}

std::string_view to_string(PointIndexPass pass) { return pass == PointIndexPass::batch_ids ? "batch_ids" : "group"; }

std::string to_string(const PointIndexProblem& p) {
  return p.op + " " + std::string(to_string(p.pass)) + ": " + std::to_string(p.n_points) + " points on " +
         to_string(p.device);
}

std::string to_string(const DequantizeProblem& p) {
  return p.op + " decode: " + std::string(to_string(p.dtype)) + " weight on " + to_string(p.device);
}

std::string_view to_string(BatchNormPass pass) { return pass == BatchNormPass::forward ? "forward" : "backward"; }

std::string to_string(const BatchNormProblem& p) {
  return p.op + " " + std::string(to_string(p.pass)) + " (" + (p.training ? "training" : "eval") +
         (p.relu ? ", fused relu" : "") +
         (p.residual ? ", residual" : "") + "): " + std::string(to_string(p.dtype)) + " on " + to_string(p.device) +
         ", N=" + std::to_string(p.n_rows) + " C=" + std::to_string(p.channels);
}

}  // namespace lattice
