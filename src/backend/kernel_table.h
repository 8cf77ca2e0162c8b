// Kernel table: maps a route id to the backend functions that run it, and reports device
// capabilities. The semantic layer includes only this header (and args.h, kernels.h) from
// backend/.
//
// The per-family entry-point structs are in kernels.h; each route's struct is registered by its
// kernel file (LATTICE_ROUTE_KERNELS) and the build generates the list the lookups below read
// (cmake/kernel_registry.cmake), so adding a route edits neither this header nor kernel_table.cpp.
#pragma once

#include <string>
#include <vector>

#include "backend/args.h"
#include "backend/kernels.h"
#include "lattice/core/array.h"
#include "lattice/route/caps.h"
#include "lattice/route/route.h"

namespace lattice::backend {

// Each returns nullptr when the route has no kernels of that family in this build (a CUDA route
// in a build without CUDA, or a route of another family).
const ConvKernels* find_conv_kernels(RouteId id);
const QuantizedKernels* find_quantized_kernels(RouteId id);
DequantizeFn find_dequantize_kernel(RouteId id);
QuantizeFn find_quantize_kernel(RouteId id);
const PointVoxelKernels* find_point_voxel_kernels(RouteId id);
const PoolKernels* find_pool_kernels(RouteId id);
const PoolEdgeKernels* find_pool_edge_kernels(RouteId id);
const PointIndexKernels* find_point_index_kernels(RouteId id);
const AlgebraKernels* find_algebra_kernels(RouteId id);
const CoordsKernels* find_coords_kernels(RouteId id);
const RelationKernels* find_relation_kernels(RouteId id);
const BatchNormKernels* find_batch_norm_kernels(RouteId id);

// One route's registration in this build: LATTICE_ROUTE_KERNELS(Kernels, route, ...) in `file`.
struct KernelRegistration {
  RouteId id;
  std::string_view family;  // Kernels::family of the registered struct
  std::string_view file;    // the registering source, relative to the repository root
};
// Every registration compiled into this build (CUDA kernel files only when built with CUDA).
const std::vector<KernelRegistration>& kernel_registrations();
// What is wrong between route rows and registrations, one line per problem naming the route
// ("conv:implicit_gemm_sm80: ..."); empty when every row that runs in this build (device "cpu" or
// "cpu, cuda" always, "cuda" when `cuda_built`) has exactly one registration of its own family
// from one of its kernel files, and every registration belongs to a row.
std::vector<std::string> kernel_registry_problems(const std::vector<RouteInfo>& rows,
                                                  const std::vector<KernelRegistration>& registered,
                                                  bool cuda_built);
// Whether this build compiled the CUDA backend.
bool built_with_cuda();

// Capabilities of this process's devices: queried once and cached, except the CPU thread
// count, which is lattice's current setting (core/threads.h).
DeviceCaps device_caps();

}  // namespace lattice::backend
