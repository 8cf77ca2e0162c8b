#include "backend/cuda/common/conv_support.cuh"

#include <string>

#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/memory.h"
#include "backend/cuda/runtime/stream.h"
#include "lattice/core/error.h"

namespace lattice::backend::cuda {

namespace {

constexpr int kThreads = 256;
// cuBLAS workspace per call: the size NVIDIA recommends for Hopper (32 MiB); ample for sm_80.
constexpr std::int64_t kCublasWorkspaceBytes = std::int64_t{32} << 20;

unsigned grid_for(std::int64_t n) {
  const unsigned b = blocks_for(n, kThreads);
  return b > 65535u * 32u ? 65535u * 32u : b;  // grid-stride loops cover the rest
}

template <class E>
__global__ void fill_kernel(float* acc, std::int64_t rows, std::int64_t c, const E* bias) {
  const std::int64_t n = rows * c;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    acc[i] = bias ? to_f32(bias[i % c]) : 0.0f;
}

template <class E>
__global__ void round_kernel(const float* acc, E* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_f32<E>(acc[i]);
}

// Nearest tf32 value of v (drops the low 13 mantissa bits, ties to even); inf / NaN unchanged.
__device__ __forceinline__ float nearest_tf32(float v) {
  std::uint32_t u = __float_as_uint(v);
  if ((u & 0x7f800000u) != 0x7f800000u) {
    u += 0xfffu + ((u >> 13) & 1u);
    u &= 0xffffe000u;
  }
  return __uint_as_float(u);
}

template <class E>
__global__ void gather_kernel(const E* src, std::int64_t c, const std::int32_t* rows, std::int64_t m, E* dst,
                              bool tf32) {
  const std::int64_t n = m * c;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j = i / c;
    const E v = src[static_cast<std::int64_t>(rows[j]) * c + (i - j * c)];
    if constexpr (std::is_same_v<E, float>) {
      dst[i] = tf32 ? nearest_tf32(v) : v;
    } else {
      dst[i] = v;
    }
  }
}

__global__ void tf32_kernel(const float* src, float* dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    dst[i] = nearest_tf32(src[i]);
}

__global__ void scatter_add_kernel(const float* part, std::int64_t c, const std::int32_t* rows, std::int64_t m,
                                   float* acc) {
  const std::int64_t n = m * c;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t j = i / c;
    acc[static_cast<std::int64_t>(rows[j]) * c + (i - j * c)] += part[i];
  }
}

__global__ void edge_map_kernel(const std::int32_t* key, const std::int32_t* value, const std::int32_t* k,
                                std::int64_t n_edges, std::int64_t kernel_volume, std::int32_t* map) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n_edges;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    map[static_cast<std::int64_t>(key[e]) * kernel_volume + k[e]] = value[e];
}

// Column sums, pass 1: block (32 columns x 8 lanes) sums rows [chunk * rows_per_chunk, ...) of
// its columns; lane l takes rows l, l + 8, ... in order, then lane sums are added in lane order.
constexpr int kSumCols = 32;
constexpr int kSumLanes = 8;

template <class E>
__global__ void column_partials(const E* dy, std::int64_t n, std::int64_t c, std::int64_t rows_per_chunk,
                                float* partial) {
  __shared__ float lanes[kSumLanes][kSumCols];
  const std::int64_t col = blockIdx.x * static_cast<std::int64_t>(kSumCols) + threadIdx.x;
  const std::int64_t r0 = blockIdx.y * rows_per_chunk;
  const std::int64_t r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
  float s = 0.0f;
  if (col < c)
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kSumLanes) s += to_f32(dy[r * c + col]);
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    float t = lanes[0][threadIdx.x];
    for (int l = 1; l < kSumLanes; ++l) t += lanes[l][threadIdx.x];
    partial[static_cast<std::int64_t>(blockIdx.y) * c + col] = t;
  }
}

template <class E>
__global__ void column_finish(const float* partial, std::int64_t chunks, std::int64_t c, E* db) {
  for (std::int64_t col = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; col < c;
       col += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float t = 0.0f;
    for (std::int64_t j = 0; j < chunks; ++j) t += partial[j * c + col];
    db[col] = from_f32<E>(t);
  }
}

}  // namespace

void throw_unsupported_dtype(const char* op, Dtype dtype) {
  throw UnsupportedError(std::string("[") + op + "] dtype: expected float16, bfloat16 or float32, got " +
                         std::string(to_string(dtype)));
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw Error(std::string("cuBLAS error ") + cublasGetStatusName(status) + " (" + cublasGetStatusString(status) +
              ") in " + call + " at " + file + ":" + std::to_string(line));
}

CublasBinding bind_cublas(Device device) {
  // One handle per (host thread, device): a handle is not safe to share between threads that
  // bind it to different streams. Handles live until the thread ends (never destroyed, so no
  // teardown-order issues with the CUDA context).
  thread_local std::vector<cublasHandle_t> handles;
  if (static_cast<int>(handles.size()) <= device.index) handles.resize(static_cast<std::size_t>(device.index) + 1);
  cublasHandle_t& h = handles[static_cast<std::size_t>(device.index)];
  if (!h) {
    DeviceGuard guard(device.index);
    LATTICE_CUBLAS_CHECK(cublasCreate(&h));
  }
  CublasBinding b;
  b.handle = h;
  b.workspace = Array::empty({kCublasWorkspaceBytes}, Dtype::u8, device);
  LATTICE_CUBLAS_CHECK(cublasSetStream(h, stream_of(device)));
  LATTICE_CUBLAS_CHECK(cublasSetWorkspace(h, b.workspace.raw_data(), static_cast<std::size_t>(kCublasWorkspaceBytes)));
  LATTICE_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
  LATTICE_CUBLAS_CHECK(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED));
  return b;
}

template <class E>
void fill_accumulator(float* acc, std::int64_t rows, std::int64_t c, const E* bias, cudaStream_t s) {
  if (rows * c == 0) return;
  fill_kernel<E><<<grid_for(rows * c), kThreads, 0, s>>>(acc, rows, c, bias);
  LATTICE_CUDA_CHECK_LAUNCH();
}

template <class E>
void round_to(const float* acc, E* out, std::int64_t n, cudaStream_t s) {
  if (n == 0) return;
  round_kernel<E><<<grid_for(n), kThreads, 0, s>>>(acc, out, n);
  LATTICE_CUDA_CHECK_LAUNCH();
}

template <class E>
void gather_rows(const E* src, std::int64_t c, const std::int32_t* rows, std::int64_t m, E* dst, cudaStream_t s,
                 bool tf32) {
  if (m * c == 0) return;
  gather_kernel<E><<<grid_for(m * c), kThreads, 0, s>>>(src, c, rows, m, dst, tf32);
  LATTICE_CUDA_CHECK_LAUNCH();
}

void round_to_tf32(const float* src, float* dst, std::int64_t n, cudaStream_t s) {
  if (n == 0) return;
  tf32_kernel<<<grid_for(n), kThreads, 0, s>>>(src, dst, n);
  LATTICE_CUDA_CHECK_LAUNCH();
}

void scatter_add_rows(const float* part, std::int64_t c, const std::int32_t* rows, std::int64_t m, float* acc,
                      cudaStream_t s) {
  if (m * c == 0) return;
  scatter_add_kernel<<<grid_for(m * c), kThreads, 0, s>>>(part, c, rows, m, acc);
  LATTICE_CUDA_CHECK_LAUNCH();
}

Array build_edge_map(const std::int32_t* key, const std::int32_t* value, const std::int32_t* k,
                     std::int64_t n_edges, std::int64_t n_rows, std::int64_t kernel_volume, Device device) {
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  Array map = Array::empty({n_rows, kernel_volume}, Dtype::i32, device);
  const std::int64_t n = n_rows * kernel_volume;
  if (n > 0) LATTICE_CUDA_CHECK(cudaMemsetAsync(map.raw_data(), 0xff, static_cast<std::size_t>(n) * 4, s));
  if (n_edges > 0) {
    edge_map_kernel<<<grid_for(n_edges), kThreads, 0, s>>>(key, value, k, n_edges, kernel_volume,
                                                           map.data<std::int32_t>());
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  return map;
}

template <class E>
void column_sums(const E* dy, std::int64_t n, std::int64_t c, E* db, Device device) {
  if (c == 0) return;
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  // Rows per chunk: a data-only rule (results do not depend on the device), at most 65535 chunks.
  std::int64_t rows_per_chunk = 1024;
  if ((n + rows_per_chunk - 1) / rows_per_chunk > 65535) rows_per_chunk = (n + 65534) / 65535;
  const std::int64_t chunks = n == 0 ? 0 : (n + rows_per_chunk - 1) / rows_per_chunk;
  Array partial = Array::empty({chunks > 0 ? chunks * c : 1}, Dtype::f32, device);
  if (chunks > 0) {
    const dim3 grid(static_cast<unsigned>((c + kSumCols - 1) / kSumCols), static_cast<unsigned>(chunks));
    column_partials<E><<<grid, dim3(kSumCols, kSumLanes), 0, s>>>(dy, n, c, rows_per_chunk,
                                                                 partial.data<float>());
    LATTICE_CUDA_CHECK_LAUNCH();
  }
  column_finish<E><<<grid_for(c), kThreads, 0, s>>>(partial.data<float>(), chunks, c, db);
  LATTICE_CUDA_CHECK_LAUNCH();
}

std::vector<std::int64_t> offsets_to_host(const std::int64_t* k_ptr, std::int64_t kernel_volume, Device device) {
  std::vector<std::int64_t> h(static_cast<std::size_t>(kernel_volume + 1));
  copy_to_host(h.data(), k_ptr, h.size() * sizeof(std::int64_t), device);
  return h;
}

void conv_cuda_bias_grad(const ConvArgs& a) {
  dispatch_conv_dtype(a.dtype, "conv3d", [&](auto tag) {
    using E = typename decltype(tag)::type;
    column_sums<E>(static_cast<const E*>(a.dy), a.rel.n_out, a.c_out, static_cast<E*>(a.dbias), a.device);
  });
}

#define LATTICE_CONV_SUPPORT_INSTANTIATE(E)                                                               \
  template void fill_accumulator<E>(float*, std::int64_t, std::int64_t, const E*, cudaStream_t);           \
  template void round_to<E>(const float*, E*, std::int64_t, cudaStream_t);                                 \
  template void gather_rows<E>(const E*, std::int64_t, const std::int32_t*, std::int64_t, E*, cudaStream_t, bool); \
  template void column_sums<E>(const E*, std::int64_t, std::int64_t, E*, Device);
LATTICE_CONV_SUPPORT_INSTANTIATE(float)
LATTICE_CONV_SUPPORT_INSTANTIATE(__half)
LATTICE_CONV_SUPPORT_INSTANTIATE(__nv_bfloat16)
#undef LATTICE_CONV_SUPPORT_INSTANTIATE

}  // namespace lattice::backend::cuda
