// The kernel table: route id -> backend functions, and the device capability report. This is
// the only file that knows which backends are compiled into the build.
#include "backend/kernel_table.h"

#include "backend/cpu/caps.h"
#include "lattice/core/threads.h"
#include "backend/cpu/conv/conv_routes.h"
#include "backend/cpu/quantize/quantize_routes.h"

#if LATTICE_HAS_CUDA
#include "backend/cuda/runtime/caps.h"
#endif

namespace lattice::backend {

const ConvKernels* find_conv_kernels(RouteId id) {
  static const ConvKernels reference{cpu::conv_reference_forward, cpu::conv_reference_input_grad,
                                     cpu::conv_reference_weight_grad};
  static const ConvKernels pointwise{cpu::conv_pointwise_matmul_forward,
                                     cpu::conv_pointwise_matmul_input_grad,
                                     cpu::conv_pointwise_matmul_weight_grad};
  static const ConvKernels gather{cpu::conv_gather_gemm_scatter_forward,
                                  cpu::conv_gather_gemm_scatter_input_grad,
                                  cpu::conv_gather_gemm_scatter_weight_grad};
  switch (id) {
    case RouteId::conv_reference: return &reference;
    case RouteId::conv_pointwise_matmul: return &pointwise;
    case RouteId::conv_gather_gemm_scatter: return &gather;
    default: return nullptr;
  }
}

QuantizeFn find_quantize_kernel(RouteId id) {
  switch (id) {
    case RouteId::quantize_reference: return cpu::quantize_reference;
    default: return nullptr;
  }
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
