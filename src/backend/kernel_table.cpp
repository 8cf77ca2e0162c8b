// The kernel table: route id -> backend functions, and the device capability report. This is
// the only file that knows which backends are compiled into the build.
#include "backend/kernel_table.h"

#include "backend/cpu/caps.h"
#include "lattice/core/threads.h"
#include "backend/cpu/conv/conv_routes.h"
#include "backend/cpu/quantize/quantize_routes.h"
#include "backend/cpu/point_voxel/point_voxel_routes.h"
#include "backend/cpu/pool/pool_routes.h"
#include "backend/cpu/algebra/algebra_routes.h"
#include "backend/cpu/coords/coords_routes.h"
#include "backend/cpu/quantized/dequantize_routes.h"
#include "backend/cpu/quantized/quantized_routes.h"
#include "backend/cpu/relation/relation_routes.h"

#if LATTICE_HAS_CUDA
#include "backend/cuda/runtime/caps.h"
#include "backend/cuda/runtime/memory.h"
#include "backend/cuda/conv/conv_routes.h"
#include "backend/cuda/algebra/algebra_routes.h"
#include "backend/cuda/coords/coords_routes.h"
#include "backend/cuda/relation/relation_routes.h"
#include "backend/cuda/point_voxel/point_voxel_routes.h"
#include "backend/cuda/pool/pool_routes.h"
#include "backend/cuda/pool/pool_edges_routes.h"
#include "backend/cuda/point_voxel/point_index_routes.h"
#include "backend/cuda/quantized/dequantize_routes.h"
#include "backend/cuda/quantized/quantized_routes.h"
#endif

namespace lattice::backend {

#if LATTICE_HAS_CUDA
namespace {
// Arrays on cuda devices allocate through the CUDA backend's stream-ordered allocator; this
// translation unit is linked into every program that runs an op, so registering here at load
// time covers every path (no driver call happens until the first allocation).
const bool kCudaAllocatorRegistered = (cuda::register_cuda_allocator(), true);
}  // namespace
#endif

const ConvKernels* find_conv_kernels(RouteId id) {
  static const ConvKernels reference{cpu::conv_reference_forward, cpu::conv_reference_input_grad,
                                     cpu::conv_reference_weight_grad, cpu::conv_reference_bias_grad};
  static const ConvKernels pointwise{cpu::conv_pointwise_matmul_forward,
                                     cpu::conv_pointwise_matmul_input_grad,
                                     cpu::conv_pointwise_matmul_weight_grad, cpu::conv_reference_bias_grad};
  static const ConvKernels gather{cpu::conv_gather_gemm_scatter_forward,
                                  cpu::conv_gather_gemm_scatter_input_grad,
                                  cpu::conv_gather_gemm_scatter_weight_grad, cpu::conv_reference_bias_grad};
#if LATTICE_HAS_CUDA
  static const ConvKernels cuda_gather{
      cuda::conv_cuda_gather_gemm_scatter_forward, cuda::conv_cuda_gather_gemm_scatter_input_grad,
      cuda::conv_cuda_gather_gemm_scatter_weight_grad, cuda::conv_cuda_bias_grad};
  static const ConvKernels implicit_sm80{
      cuda::conv_implicit_gemm_sm80_forward, cuda::conv_implicit_gemm_sm80_input_grad,
      cuda::conv_implicit_gemm_sm80_weight_grad, cuda::conv_cuda_bias_grad};
  if (id == RouteId::conv_cuda_gather_gemm_scatter) return &cuda_gather;
  if (id == RouteId::conv_implicit_gemm_sm80) return &implicit_sm80;
#endif
  switch (id) {
    case RouteId::conv_reference: return &reference;
    case RouteId::conv_pointwise_matmul: return &pointwise;
    case RouteId::conv_gather_gemm_scatter: return &gather;
    default: return nullptr;
  }
}

QuantizeFn find_quantize_kernel(RouteId id) {
#if LATTICE_HAS_CUDA
  if (id == RouteId::quantize_cuda) return cuda::quantize;
#endif
  switch (id) {
    case RouteId::quantize_reference: return cpu::quantize_reference;
    default: return nullptr;
  }
}

const PointVoxelKernels* find_point_voxel_kernels(RouteId id) {
  static const PointVoxelKernels reference{
      cpu::voxelize_reference_forward, cpu::voxelize_reference_backward,
      cpu::devoxelize_reference_forward, cpu::devoxelize_reference_backward,
      cpu::point_voxel_map_reference};
  static const PointVoxelKernels parallel{
      cpu::voxelize_parallel_forward, cpu::voxelize_parallel_backward,
      cpu::devoxelize_parallel_forward, cpu::devoxelize_parallel_backward,
      cpu::point_voxel_map_parallel};
#if LATTICE_HAS_CUDA
  static const PointVoxelKernels cuda_kernels{cuda::voxelize_forward, cuda::voxelize_backward,
                                              cuda::devoxelize_forward, cuda::devoxelize_backward,
                                              cuda::point_voxel_map};
  if (id == RouteId::point_voxel_cuda) return &cuda_kernels;
#endif
  switch (id) {
    case RouteId::point_voxel_reference: return &reference;
    case RouteId::point_voxel_parallel: return &parallel;
    default: return nullptr;
  }
}

const PoolKernels* find_pool_kernels(RouteId id) {
  static const PoolKernels reference{cpu::pool_reference_forward, cpu::pool_reference_input_grad};
  static const PoolKernels csr_reduce{cpu::pool_csr_reduce_forward, cpu::pool_csr_reduce_input_grad};
  static const PoolKernels input_exclusive{nullptr, cpu::pool_input_exclusive_input_grad};
#if LATTICE_HAS_CUDA
  static const PoolKernels cuda_csr_reduce{cuda::pool_csr_reduce_forward,
                                           cuda::pool_csr_reduce_input_grad};
  if (id == RouteId::pool_cuda_csr_reduce) return &cuda_csr_reduce;
#endif
  switch (id) {
    case RouteId::pool_reference: return &reference;
    case RouteId::pool_csr_reduce: return &csr_reduce;
    case RouteId::pool_input_exclusive: return &input_exclusive;
    default: return nullptr;
  }
}

const AlgebraKernels* find_algebra_kernels(RouteId id) {
  static const AlgebraKernels reference{cpu::algebra_reference_align, cpu::algebra_reference_lookup,
                                        cpu::algebra_reference_forward, cpu::algebra_reference_backward};
  static const AlgebraKernels hashed{cpu::algebra_hashed_align, cpu::algebra_hashed_lookup,
                                     cpu::algebra_hashed_forward, cpu::algebra_hashed_backward};
#if LATTICE_HAS_CUDA
  static const AlgebraKernels cuda_hashed{cuda::algebra_cuda_hashed_align, cuda::algebra_cuda_hashed_lookup,
                                          cuda::algebra_cuda_hashed_forward, cuda::algebra_cuda_hashed_backward};
  if (id == RouteId::algebra_cuda_hashed) return &cuda_hashed;
#endif
  switch (id) {
    case RouteId::algebra_reference: return &reference;
    case RouteId::algebra_hashed: return &hashed;
    default: return nullptr;
  }
}

const CoordsKernels* find_coords_kernels(RouteId id) {
  static const CoordsKernels reference{
      cpu::coords_reference_downsample, cpu::coords_reference_morton,
      cpu::coords_reference_select, cpu::coords_reference_collate,
      cpu::coords_reference_dense_index, cpu::coords_reference_nonzero};
#if LATTICE_HAS_CUDA
  static const CoordsKernels cuda_utilities{
      cuda::coords_cuda_downsample, cuda::coords_cuda_morton, cuda::coords_cuda_select,
      cuda::coords_cuda_collate, cuda::coords_cuda_dense_index, cuda::coords_cuda_nonzero};
  if (id == RouteId::coords_cuda) return &cuda_utilities;
#endif
  switch (id) {
    case RouteId::coords_reference: return &reference;
    default: return nullptr;
  }
}

const PoolEdgeKernels* find_pool_edge_kernels(RouteId id) {
  static const PoolEdgeKernels reference{cpu::pool_edges_reference_batch, cpu::pool_edges_reference_trilinear};
#if LATTICE_HAS_CUDA
  static const PoolEdgeKernels cuda_kernels{cuda::pool_edges_cuda_batch, cuda::pool_edges_cuda_trilinear};
  if (id == RouteId::pool_edges_cuda) return &cuda_kernels;
#endif
  return id == RouteId::pool_edges_reference ? &reference : nullptr;
}

const PointIndexKernels* find_point_index_kernels(RouteId id) {
  static const PointIndexKernels reference{cpu::point_index_reference_batch_ids, cpu::point_index_reference_group};
#if LATTICE_HAS_CUDA
  static const PointIndexKernels cuda_kernels{cuda::point_index_cuda_batch_ids, cuda::point_index_cuda_group};
  if (id == RouteId::point_index_cuda) return &cuda_kernels;
#endif
  return id == RouteId::point_index_reference ? &reference : nullptr;
}

const RelationKernels* find_relation_kernels(RouteId id) {
  static const RelationKernels cpu_hash{
      cpu::relation_cpu_hash_build_table, cpu::relation_cpu_hash_find_duplicate,
      cpu::relation_cpu_hash_batch_histogram, cpu::relation_cpu_hash_support, cpu::relation_cpu_hash_edges,
      cpu::relation_cpu_hash_row_masks, cpu::relation_cpu_hash_input_grouping, cpu::relation_cpu_hash_transpose,
      cpu::relation_cpu_hash_input_map, cpu::relation_cpu_hash_row_order};
#if LATTICE_HAS_CUDA
  static const RelationKernels cuda_hash{
      cuda::device_build_table, cuda::device_find_duplicate, cuda::device_batch_histogram,
      cuda::device_support, cuda::device_edges, cuda::device_row_masks,
      cuda::device_input_grouping, cuda::device_transpose, cuda::device_input_map, cuda::device_row_order};
  if (id == RouteId::relation_cuda_hash) return &cuda_hash;
#endif
  return id == RouteId::relation_cpu_hash ? &cpu_hash : nullptr;
}

const QuantizedKernels* find_quantized_kernels(RouteId id) {
  static const QuantizedKernels dequant_reference{cpu::quantized_dequantize_reference, nullptr};
  static const QuantizedKernels fused{nullptr, cpu::quantized_fused_dequant_gemm_forward};
#if LATTICE_HAS_CUDA
  // The CUDA route's entry also carries the device decoder that dequant_reference uses for CUDA data.
  static const QuantizedKernels cuda_dequant_gemm{cuda::quantized_cuda_dequantize,
                                                  cuda::quantized_cuda_dequant_gemm_forward};
  if (id == RouteId::quantized_cuda_dequant_gemm) return &cuda_dequant_gemm;
#endif
  switch (id) {
    case RouteId::quantized_dequant_reference: return &dequant_reference;
    case RouteId::quantized_fused_dequant_gemm: return &fused;
    default: return nullptr;
  }
}

DequantizeFn find_dequantize_kernel(RouteId id) {
#if LATTICE_HAS_CUDA
  if (id == RouteId::dequantize_cuda) return cuda::dequantize_cuda;
#endif
  return id == RouteId::dequantize_reference ? cpu::dequantize_reference : nullptr;
}

DeviceCaps device_caps() {
  static const DeviceCaps cached = [] {
    DeviceCaps c;
    c.cpu = cpu::query_cpu_caps();
#if LATTICE_HAS_CUDA
    c.cuda = cuda::query_cuda_caps();
#else
    c.cuda.built = false;
    c.cuda.status = "built without CUDA";
#endif
    return c;
  }();
  DeviceCaps caps = cached;
  caps.cpu.threads = num_threads();
  return caps;
}

}  // namespace lattice::backend
