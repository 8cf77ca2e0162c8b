#include "backend/cuda/runtime/memory.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "lattice/core/error.h"

#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/stream.h"

namespace lattice::backend::cuda {

namespace {

// Keeps freed blocks in the pool instead of returning them at every synchronisation.
void configure_pool(int index) {
  static std::mutex mutex;
  static std::vector<bool> done;
  std::lock_guard lock(mutex);
  if (static_cast<int>(done.size()) <= index) done.resize(static_cast<std::size_t>(index) + 1, false);
  if (done[static_cast<std::size_t>(index)]) return;
  cudaMemPool_t pool;
  LATTICE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index));
  std::uint64_t threshold = UINT64_MAX;
  LATTICE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  done[static_cast<std::size_t>(index)] = true;
}

// UnsupportedError (not a raw CUDA error) when the device cannot be used at all.
void require_device(int index) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || index < 0 || index >= count) {
    cudaGetLastError();
    throw UnsupportedError("[Array] device: expected an available CUDA device, got cuda:" + std::to_string(index) +
                           " (" + (err != cudaSuccess ? std::string(cudaGetErrorString(err))
                                                      : std::to_string(count) + " device(s) visible") + ")");
  }
}

void* allocate(std::size_t nbytes, int index) {
  require_device(index);
  DeviceGuard guard(index);
  configure_pool(index);
  void* p = nullptr;
  LATTICE_CUDA_CHECK(cudaMallocAsync(&p, nbytes, stream_of(Device::cuda(index))));
  return p;
}

void release(void* p, int index) {
  // Runs from destructors: never throws (a failing free during teardown is ignored).
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  if (previous != index) cudaSetDevice(index);
  cudaFreeAsync(p, stream_of(Device::cuda(index)));
  if (previous != index) cudaSetDevice(previous);
  cudaGetLastError();
}

void zero(void* p, std::size_t nbytes, int index) {
  require_device(index);
  DeviceGuard guard(index);
  LATTICE_CUDA_CHECK(cudaMemsetAsync(p, 0, nbytes, stream_of(Device::cuda(index))));
}

void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t nbytes) {
  const Device device = dst_device.is_cuda() ? dst_device : src_device;
  require_device(device.index);
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  const cudaMemcpyKind kind = dst_device.is_cpu()   ? cudaMemcpyDeviceToHost
                              : src_device.is_cpu() ? cudaMemcpyHostToDevice
                                                    : cudaMemcpyDeviceToDevice;
  LATTICE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, s));
  // Host memory may be pageable and reused by the caller right away: wait for every copy that
  // touches the host.
  if (kind != cudaMemcpyDeviceToDevice) LATTICE_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace

void register_cuda_allocator() {
  static std::once_flag once;
  std::call_once(once, [] { register_device_allocator(DeviceType::cuda, {allocate, release, zero, copy}); });
}

void copy_to_host(void* dst, const void* src, std::size_t nbytes, Device device) {
  copy(dst, Device::cpu(), src, device, nbytes);
}

}  // namespace lattice::backend::cuda
