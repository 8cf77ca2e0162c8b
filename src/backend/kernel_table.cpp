// The kernel table: route id -> backend functions, and the device capability report. This is
// the only file that knows which backends are compiled into the build.
//
// It names no route and no kernel file: the build generates backend/kernel_registry.inc
// (cmake/kernel_registry.cmake) with one line
//   LATTICE_REGISTERED(Kernels, route, "src/backend/<device>/<family>/<file>")
// per LATTICE_ROUTE_KERNELS registration (backend/kernels.h) in the backend sources it compiles,
// and the lookups below expand those lines. Referencing each registered object from here is what
// links its kernel file into every program, including consumers of the installed liblattice.a.
#include "backend/kernel_table.h"

#include <string>
#include <type_traits>

#include "backend/cpu/caps.h"
#include "lattice/core/threads.h"

#if LATTICE_HAS_CUDA
#include "backend/cuda/runtime/caps.h"
#include "backend/cuda/runtime/memory.h"
#endif

namespace lattice::backend {

// The registered objects (defined by LATTICE_ROUTE_KERNELS in the kernel files).
namespace registered {
#define LATTICE_REGISTERED(Kernels, route, file) extern const Kernels route;
#include "backend/kernel_registry.inc"
#undef LATTICE_REGISTERED
}  // namespace registered

namespace {

#if LATTICE_HAS_CUDA
// Arrays on cuda devices allocate through the CUDA backend's stream-ordered allocator; this
// translation unit is linked into every program that runs an op, so registering here at load
// time covers every path (no driver call happens until the first allocation).
const bool kCudaAllocatorRegistered = (cuda::register_cuda_allocator(), true);
#endif

// The registered struct of `id` when it is of family `Kernels`, else nullptr. A registration
// whose route is misspelt fails to compile here (RouteId has no such enumerator).
template <class Kernels>
const Kernels* registered_kernels(RouteId id) {
#define LATTICE_REGISTERED(K, route, file)                  \
  if constexpr (std::is_same_v<K, Kernels>) {               \
    if (id == RouteId::route) return &registered::route;    \
  }
#include "backend/kernel_registry.inc"
#undef LATTICE_REGISTERED
  (void)id;
  return nullptr;
}

}  // namespace

const ConvKernels* find_conv_kernels(RouteId id) { return registered_kernels<ConvKernels>(id); }
const QuantizedKernels* find_quantized_kernels(RouteId id) { return registered_kernels<QuantizedKernels>(id); }
DequantizeFn find_dequantize_kernel(RouteId id) {
  const DequantizeKernels* k = registered_kernels<DequantizeKernels>(id);
  return k ? k->dequantize : nullptr;
}
QuantizeFn find_quantize_kernel(RouteId id) {
  const QuantizeKernels* k = registered_kernels<QuantizeKernels>(id);
  return k ? k->quantize : nullptr;
}
const PointVoxelKernels* find_point_voxel_kernels(RouteId id) { return registered_kernels<PointVoxelKernels>(id); }
const PoolKernels* find_pool_kernels(RouteId id) { return registered_kernels<PoolKernels>(id); }
const PoolEdgeKernels* find_pool_edge_kernels(RouteId id) { return registered_kernels<PoolEdgeKernels>(id); }
const PointIndexKernels* find_point_index_kernels(RouteId id) { return registered_kernels<PointIndexKernels>(id); }
const AlgebraKernels* find_algebra_kernels(RouteId id) { return registered_kernels<AlgebraKernels>(id); }
const CoordsKernels* find_coords_kernels(RouteId id) { return registered_kernels<CoordsKernels>(id); }
const RelationKernels* find_relation_kernels(RouteId id) { return registered_kernels<RelationKernels>(id); }
const BatchNormKernels* find_batch_norm_kernels(RouteId id) { return registered_kernels<BatchNormKernels>(id); }

const std::vector<KernelRegistration>& kernel_registrations() {
  static const std::vector<KernelRegistration> all{
#define LATTICE_REGISTERED(Kernels, route, file) {RouteId::route, Kernels::family, file},
#include "backend/kernel_registry.inc"
#undef LATTICE_REGISTERED
  };
  return all;
}

std::vector<std::string> kernel_registry_problems(const std::vector<RouteInfo>& rows,
                                                  const std::vector<KernelRegistration>& registered,
                                                  bool cuda_built) {
  std::vector<std::string> out;
  const auto key = [](const RouteInfo& r) { return std::string(r.family) + ":" + std::string(r.name); };
  for (const RouteInfo& row : rows) {
    const bool runs_here = row.device.find("cpu") != std::string_view::npos || cuda_built;
    std::vector<const KernelRegistration*> mine;
    for (const KernelRegistration& reg : registered)
      if (reg.id == row.id) mine.push_back(&reg);
    if (mine.empty()) {
      if (runs_here)
        out.push_back(key(row) + ": no kernels registered in this build (LATTICE_ROUTE_KERNELS(..., " +
                      std::string(row.family) + "_" + std::string(row.name) + ", ...) in its kernel file)");
      continue;
    }
    if (!runs_here) out.push_back(key(row) + ": registered in a build without CUDA, but the row runs on cuda only");
    if (mine.size() > 1) out.push_back(key(row) + ": registered " + std::to_string(mine.size()) + " times");
    for (const KernelRegistration* reg : mine) {
      if (reg->family != row.family)
        out.push_back(key(row) + ": registered as " + std::string(reg->family) + " kernels by " + std::string(reg->file));
      bool own_file = false;
      for (const KernelFile& f : row.files) own_file = own_file || (!f.path.empty() && f.path == reg->file);
      if (!own_file) out.push_back(key(row) + ": registered by " + std::string(reg->file) + ", which is not a kernel file of its row");
    }
  }
  for (const KernelRegistration& reg : registered) {
    bool has_row = false;
    for (const RouteInfo& row : rows) has_row = has_row || row.id == reg.id;
    if (!has_row)
      out.push_back("RouteId " + std::to_string(static_cast<int>(reg.id)) + " (" + std::string(reg.family) +
                    "): registered by " + std::string(reg.file) + " but no route row declares it");
  }
  return out;
}

bool built_with_cuda() {
#if LATTICE_HAS_CUDA
  return true;
#else
  return false;
#endif
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
