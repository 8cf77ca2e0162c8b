#include "backend/cuda/runtime/memory.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "lattice/core/error.h"

#include "backend/cuda/runtime/check.h"
#include "backend/cuda/runtime/stream.h"

// The allocator behind lattice::Array on CUDA devices: a caching, stream-ordered pool with the
// semantics of torch's caching allocator.
//
// - A block belongs to the stream that was current when it was allocated. Freed, it goes to that
//   stream's free list and is handed out again only to allocations on the same stream, so stream
//   order alone makes reuse safe (no events, no synchronisation). Blocks are never split; a
//   request takes the smallest cached block of at least its rounded size and at most twice it.
// - Misses go to cudaMallocAsync on the device's default memory pool (release threshold
//   unlimited), so even a miss is no driver allocation once the pool has grown.
// - While the stream is being captured into a CUDA graph, allocations bypass the cache
//   (cudaMallocAsync becomes a graph allocation node, with an address the graph owns), and a free
//   inside the capture of a block that was allocated outside it is deferred until capture ends
//   (it must not be reused by eager work while the graph may still read it).
// - When cudaMallocAsync fails, every cached block is returned and the allocation retried once.
// - Cached bytes above LATTICE_CUDA_CACHE_BYTES (default 4 GiB) go back to the memory pool.

namespace lattice::backend::cuda {

namespace {

constexpr std::size_t kSmall = 1 << 20;

std::size_t round_size(std::size_t n) {
  if (n <= kSmall) return (n + 511) / 512 * 512;
  return (n + (1 << 17) - 1) / (1 << 17) * (1 << 17);  // 128 KiB granules above 1 MiB
}

std::size_t cache_limit() {
  static const std::size_t limit = [] {
    const char* v = std::getenv("LATTICE_CUDA_CACHE_BYTES");
    if (v && *v) return static_cast<std::size_t>(std::strtoull(v, nullptr, 10));
    return static_cast<std::size_t>(4) << 30;
  }();
  return limit;
}

int device_count() {
  static const int count = [] {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return c;
  }();
  return count;
}

// UnsupportedError (not a raw CUDA error) when the device cannot be used at all.
void require_device(int index) {
  const int count = device_count();
  if (count <= 0 || index < 0 || index >= count) {
    int c = 0;
    const cudaError_t err = cudaGetDeviceCount(&c);
    cudaGetLastError();
    throw UnsupportedError("[Array] device: expected an available CUDA device, got cuda:" + std::to_string(index) +
                           " (" + (err != cudaSuccess ? std::string(cudaGetErrorString(err))
                                                      : std::to_string(c) + " device(s) visible") + ")");
  }
}

// Keeps freed blocks in the pool instead of returning them at every synchronisation.
void configure_pool(int index) {
  cudaMemPool_t pool;
  LATTICE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index));
  std::uint64_t threshold = UINT64_MAX;
  LATTICE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
}

// Whether `s` is being captured. The legacy default stream cannot be captured, and querying it
// while another stream captures in global mode is an error that would invalidate that capture:
// it is never queried.
bool capturing(cudaStream_t s) {
  if (s == nullptr) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &status) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

struct Block {
  std::size_t size = 0;  // rounded size
  cudaStream_t stream = nullptr;
  int device = 0;
  bool graph = false;  // allocated during a capture: the graph owns the address
};

struct StreamKey {
  int device;
  cudaStream_t stream;
  bool operator==(const StreamKey& o) const { return device == o.device && stream == o.stream; }
};
struct StreamKeyHash {
  std::size_t operator()(const StreamKey& k) const {
    return std::hash<void*>()(k.stream) ^ (static_cast<std::size_t>(k.device) * 0x9e3779b97f4a7c15ull);
  }
};

class Pool {
 public:
  void* allocate(std::size_t nbytes, int index) {
    require_device(index);
    DeviceGuard guard(index);
    configure_once(index);
    const cudaStream_t s = stream_of(Device::cuda(index));
    const std::size_t size = round_size(nbytes);
    const bool in_capture = capturing(s);
    {
      std::lock_guard lock(mutex_);
      if (!in_capture) release_deferred_locked();
      if (!in_capture) {
        auto fl = free_.find({index, s});
        if (fl != free_.end()) {
          auto it = fl->second.lower_bound(size);
          if (it != fl->second.end() && it->first <= 2 * size) {
            void* p = it->second;
            const std::size_t got = it->first;
            fl->second.erase(it);
            cached_bytes_ -= static_cast<std::int64_t>(got);
            live_[p] = Block{got, s, index, false};
            live_bytes_ += static_cast<std::int64_t>(got);
            ++cache_hits_;
            return p;
          }
        }
      }
    }
    void* p = nullptr;
    cudaError_t err = cudaMallocAsync(&p, size, s);
    if (err == cudaErrorMemoryAllocation && !in_capture) {
      cudaGetLastError();
      empty_cache();
      err = cudaMallocAsync(&p, size, s);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      if (err == cudaErrorMemoryAllocation)
        throw Error("[Array] device memory: expected " + std::to_string(nbytes) + " more bytes on cuda:" +
                    std::to_string(index) + ", got out of memory (lattice holds " + std::to_string(live_bytes()) +
                    " bytes in use after returning its cache)");
      throw_cuda_error(err, "cudaMallocAsync", __FILE__, __LINE__);
    }
    std::lock_guard lock(mutex_);
    live_[p] = Block{size, s, index, in_capture};
    live_bytes_ += static_cast<std::int64_t>(size);
    ++driver_allocs_;
    if (in_capture) ++graph_allocs_;
    return p;
  }

  // Runs from destructors: never throws.
  void release(void* p) {
    Block b;
    {
      std::lock_guard lock(mutex_);
      auto it = live_.find(p);
      if (it == live_.end()) return;  // not ours (cannot happen through Array)
      b = it->second;
      live_.erase(it);
      live_bytes_ -= static_cast<std::int64_t>(b.size);
      if (!b.graph) {
        const cudaStream_t current = stream_of(Device::cuda(b.device));
        if (capturing(current) || (b.stream != current && capturing(b.stream))) {
          // freed inside a capture: eager work must not reuse it before the capture is over
          deferred_.push_back({p, b});
          return;
        }
        free_[{b.device, b.stream}].emplace(b.size, p);
        cached_bytes_ += static_cast<std::int64_t>(b.size);
        if (static_cast<std::size_t>(cached_bytes_) <= cache_limit()) return;
      }
    }
    if (b.graph) {
      free_to_device(p, b);
      return;
    }
    trim_to(cache_limit());
  }

  void empty_cache() {
    trim_to(0);
    // Also give the memory pool's reserve back to the driver.
    const int count = device_count();
    for (int d = 0; d < count; ++d) {
      cudaMemPool_t pool;
      if (cudaDeviceGetDefaultMemPool(&pool, d) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
    }
    cudaGetLastError();
  }

  DeviceMemoryStats stats() {
    std::lock_guard lock(mutex_);
    DeviceMemoryStats out;
    out.driver_allocs = driver_allocs_;
    out.driver_frees = driver_frees_;
    out.cache_hits = cache_hits_;
    out.live_bytes = live_bytes_;
    out.cached_bytes = cached_bytes_;
    out.host_syncs = host_syncs_.load();
    out.graph_allocs = graph_allocs_;
    return out;
  }

  void count_host_sync() { ++host_syncs_; }

 private:
  std::int64_t live_bytes() {
    std::lock_guard lock(mutex_);
    return live_bytes_;
  }

  void configure_once(int index) {
    std::lock_guard lock(mutex_);
    if (static_cast<int>(configured_.size()) <= index) configured_.resize(static_cast<std::size_t>(index) + 1, false);
    if (configured_[static_cast<std::size_t>(index)]) return;
    configure_pool(index);
    configured_[static_cast<std::size_t>(index)] = true;
  }

  void free_to_device(void* p, const Block& b) {
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) return;
    if (previous != b.device) cudaSetDevice(b.device);
    cudaFreeAsync(p, b.stream);
    if (previous != b.device) cudaSetDevice(previous);
    cudaGetLastError();
    std::lock_guard lock(mutex_);
    ++driver_frees_;
  }

  // Returns cached blocks (largest first) until at most `limit` bytes stay cached.
  void trim_to(std::size_t limit) {
    std::vector<std::pair<void*, Block>> out;
    {
      std::lock_guard lock(mutex_);
      while (static_cast<std::size_t>(cached_bytes_) > limit) {
        auto best = free_.end();
        for (auto it = free_.begin(); it != free_.end(); ++it)
          if (!it->second.empty() && (best == free_.end() || it->second.rbegin()->first > best->second.rbegin()->first))
            best = it;
        if (best == free_.end()) break;
        auto last = std::prev(best->second.end());
        out.push_back({last->second, Block{last->first, best->first.stream, best->first.device, false}});
        cached_bytes_ -= static_cast<std::int64_t>(last->first);
        best->second.erase(last);
      }
    }
    for (const auto& [p, b] : out) free_to_device(p, b);
  }

  // Frees deferred during a capture become reusable once the capture is over (mutex_ held).
  void release_deferred_locked() {
    if (deferred_.empty()) return;
    std::vector<std::pair<void*, Block>> still;
    for (const auto& [p, b] : deferred_) {
      if (capturing(b.stream)) {
        still.push_back({p, b});
        continue;
      }
      free_[{b.device, b.stream}].emplace(b.size, p);
      cached_bytes_ += static_cast<std::int64_t>(b.size);
    }
    deferred_.swap(still);
  }

  std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::unordered_map<StreamKey, std::multimap<std::size_t, void*>, StreamKeyHash> free_;
  std::vector<std::pair<void*, Block>> deferred_;
  std::vector<bool> configured_;
  std::int64_t driver_allocs_ = 0, driver_frees_ = 0, cache_hits_ = 0, live_bytes_ = 0, cached_bytes_ = 0,
               graph_allocs_ = 0;
  std::atomic<std::int64_t> host_syncs_{0};
};

// Never destroyed: blocks may be released by Arrays that outlive static destruction.
Pool& pool() {
  static Pool* p = new Pool();
  return *p;
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
  if (kind != cudaMemcpyDeviceToDevice) {
    pool().count_host_sync();
    LATTICE_CUDA_CHECK(cudaStreamSynchronize(s));
  }
}

// dst (contiguous row-major) = src (shape, strides in elements), one element per thread step;
// `W` is an integer type of the element's size. Indices are decomposed from the last axis.
struct StridedLayout {
  std::int64_t shape[8];
  std::int64_t strides[8];
  int ndim;
};

template <class W>
__global__ void strided_copy_kernel(W* dst, const W* src, StridedLayout l, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t rest = i, off = 0;
    for (int d = l.ndim - 1; d >= 0; --d) {
      const std::int64_t q = rest / l.shape[d];
      off += (rest - q * l.shape[d]) * l.strides[d];
      rest = q;
    }
    dst[i] = src[off];
  }
}

void strided_copy(void* dst, const void* src, const std::int64_t* shape, const std::int64_t* strides, int ndim,
                  std::size_t esize, int index) {
  require_device(index);
  DeviceGuard guard(index);
  LATTICE_ASSERT(ndim >= 0 && ndim <= 8, "strided_copy: at most 8 axes");
  StridedLayout l{};
  l.ndim = ndim;
  std::int64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    l.shape[d] = shape[d];
    l.strides[d] = strides[d];
    n *= shape[d];
  }
  if (n == 0) return;
  cudaStream_t s = stream_of(Device::cuda(index));
  const std::int64_t want = (n + 255) / 256;
  const unsigned blocks = static_cast<unsigned>(want < 65535 * 8 ? want : 65535 * 8);
  switch (esize) {
    case 1: strided_copy_kernel<<<blocks, 256, 0, s>>>(static_cast<std::uint8_t*>(dst), static_cast<const std::uint8_t*>(src), l, n); break;
    case 2: strided_copy_kernel<<<blocks, 256, 0, s>>>(static_cast<std::uint16_t*>(dst), static_cast<const std::uint16_t*>(src), l, n); break;
    case 4: strided_copy_kernel<<<blocks, 256, 0, s>>>(static_cast<std::uint32_t*>(dst), static_cast<const std::uint32_t*>(src), l, n); break;
    case 8: strided_copy_kernel<<<blocks, 256, 0, s>>>(static_cast<std::uint64_t*>(dst), static_cast<const std::uint64_t*>(src), l, n); break;
    default: LATTICE_ASSERT(false, "strided_copy: element size 1, 2, 4 or 8");
  }
  LATTICE_CUDA_CHECK_LAUNCH();
}

// Element conversions of strided_convert: widening exact, narrowing round to nearest even.
template <class D> __device__ __forceinline__ D convert_from(double v);
template <> __device__ __forceinline__ double convert_from<double>(double v) { return v; }
template <> __device__ __forceinline__ float convert_from<float>(double v) { return static_cast<float>(v); }
template <class S> __device__ __forceinline__ double widen(S v) { return static_cast<double>(v); }
template <> __device__ __forceinline__ double widen<__half>(__half v) { return static_cast<double>(__half2float(v)); }
template <> __device__ __forceinline__ double widen<__nv_bfloat16>(__nv_bfloat16 v) {
  return static_cast<double>(__bfloat162float(v));
}
// 16-bit targets are converted from f32 (contiguous_as admits f16 / bf16 / f32 sources for them):
// the double holds that f32 exactly, so one rounding.
template <> __device__ __forceinline__ __half convert_from<__half>(double v) {
  return __float2half_rn(static_cast<float>(v));
}
template <> __device__ __forceinline__ __nv_bfloat16 convert_from<__nv_bfloat16>(double v) {
  return __float2bfloat16_rn(static_cast<float>(v));
}

template <class D, class S>
__global__ void strided_convert_kernel(D* dst, const S* src, StridedLayout l, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t rest = i, off = 0;
    for (int d = l.ndim - 1; d >= 0; --d) {
      const std::int64_t q = rest / l.shape[d];
      off += (rest - q * l.shape[d]) * l.strides[d];
      rest = q;
    }
    dst[i] = convert_from<D>(widen(src[off]));
  }
}

template <class F>
void with_float_type(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::f16: f(static_cast<__half*>(nullptr)); break;
    case Dtype::bf16: f(static_cast<__nv_bfloat16*>(nullptr)); break;
    case Dtype::f32: f(static_cast<float*>(nullptr)); break;
    case Dtype::f64: f(static_cast<double*>(nullptr)); break;
    default: LATTICE_ASSERT(false, "strided_convert: float dtypes only");
  }
}

void strided_convert(void* dst, Dtype dst_dtype, const void* src, Dtype src_dtype, const std::int64_t* shape,
                     const std::int64_t* strides, int ndim, int index) {
  require_device(index);
  DeviceGuard guard(index);
  LATTICE_ASSERT(ndim >= 0 && ndim <= 8, "strided_convert: at most 8 axes");
  StridedLayout l{};
  l.ndim = ndim;
  std::int64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    l.shape[d] = shape[d];
    l.strides[d] = strides[d];
    n *= shape[d];
  }
  if (n == 0) return;
  cudaStream_t s = stream_of(Device::cuda(index));
  const std::int64_t want = (n + 255) / 256;
  const unsigned blocks = static_cast<unsigned>(want < 65535 * 8 ? want : 65535 * 8);
  with_float_type(dst_dtype, [&](auto* d_tag) {
    using D = std::remove_pointer_t<decltype(d_tag)>;
    with_float_type(src_dtype, [&](auto* s_tag) {
      using S = std::remove_pointer_t<decltype(s_tag)>;
      strided_convert_kernel<D, S><<<blocks, 256, 0, s>>>(static_cast<D*>(dst), static_cast<const S*>(src), l, n);
    });
  });
  LATTICE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void register_cuda_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    DeviceAllocator a;
    a.allocate = [](std::size_t nbytes, int index) { return pool().allocate(nbytes, index); };
    a.release = [](void* p, int) { pool().release(p); };
    a.zero = zero;
    a.copy = copy;
    a.strided_copy = strided_copy;
    a.strided_convert = strided_convert;
    a.stats = [] { return pool().stats(); };
    a.empty_cache = [] { pool().empty_cache(); };
    register_device_allocator(DeviceType::cuda, std::move(a));
  });
}

void copy_to_host(void* dst, const void* src, std::size_t nbytes, Device device) {
  copy(dst, Device::cpu(), src, device, nbytes);
}

namespace {

// Pinned int64 slots and events for pending counts, recycled: a slot and its event go back to the
// free lists once the event has passed (a count dropped before its copy landed waits in
// `draining` until then, so a late copy never writes into a slot handed out again). Never
// destroyed (counts may be released during static destruction).
class PendingPool {
 public:
  struct Entry {
    std::int64_t* slot = nullptr;
    cudaEvent_t event = nullptr;
    int device = 0;
  };

  Entry acquire(int device) {
    std::lock_guard lock(mutex_);
    recycle_locked();
    Entry e;
    e.device = device;
    if (free_slots_.empty()) {
      constexpr std::size_t kSlots = 512;
      void* chunk = nullptr;
      LATTICE_CUDA_CHECK(cudaHostAlloc(&chunk, kSlots * sizeof(std::int64_t), cudaHostAllocPortable));
      auto* p = static_cast<std::int64_t*>(chunk);
      for (std::size_t i = 0; i < kSlots; ++i) free_slots_.push_back(p + i);
    }
    e.slot = free_slots_.back();
    free_slots_.pop_back();
    auto& events = free_events_[device];
    if (events.empty()) {
      LATTICE_CUDA_CHECK(cudaEventCreateWithFlags(&e.event, cudaEventDisableTiming));
    } else {
      e.event = events.back();
      events.pop_back();
    }
    return e;
  }

  void release(const Entry& e, bool landed) {
    std::lock_guard lock(mutex_);
    if (landed) {
      free_slots_.push_back(e.slot);
      free_events_[e.device].push_back(e.event);
    } else {
      draining_.push_back(e);
    }
  }

 private:
  void recycle_locked() {
    for (std::size_t i = 0; i < draining_.size();) {
      if (cudaEventQuery(draining_[i].event) == cudaSuccess) {
        free_slots_.push_back(draining_[i].slot);
        free_events_[draining_[i].device].push_back(draining_[i].event);
        draining_[i] = draining_.back();
        draining_.pop_back();
      } else {
        ++i;
      }
    }
    cudaGetLastError();  // a query of an event not yet passed leaves cudaErrorNotReady behind
  }

  std::mutex mutex_;
  std::vector<std::int64_t*> free_slots_;
  std::unordered_map<int, std::vector<cudaEvent_t>> free_events_;
  std::vector<Entry> draining_;
};

PendingPool& pending_pool() {
  static PendingPool* p = new PendingPool;
  return *p;
}

class CudaPendingCount final : public PendingCount {
 public:
  explicit CudaPendingCount(PendingPool::Entry e) : e_(e) {}
  ~CudaPendingCount() override {
    const bool landed = taken_ || cudaEventQuery(e_.event) == cudaSuccess;
    cudaGetLastError();
    pending_pool().release(e_, landed);
  }
  std::int64_t get(bool wait) override {
    if (!taken_) {
      const cudaError_t q = cudaEventQuery(e_.event);
      if (q == cudaErrorNotReady) {
        cudaGetLastError();
        if (!wait) return -1;
        pool().count_host_sync();
        LATTICE_CUDA_CHECK(cudaEventSynchronize(e_.event));
      } else {
        LATTICE_CUDA_CHECK(q);
      }
      value_ = *e_.slot;
      taken_ = true;
    }
    return value_;
  }

 private:
  PendingPool::Entry e_;
  std::int64_t value_ = -1;
  bool taken_ = false;
};

}  // namespace

std::shared_ptr<PendingCount> copy_count_async(const std::int64_t* value, Device device) {
  require_device(device.index);
  DeviceGuard guard(device.index);
  cudaStream_t s = stream_of(device);
  if (capturing(s)) return nullptr;
  const PendingPool::Entry e = pending_pool().acquire(device.index);
  *e.slot = -1;
  auto pending = std::make_shared<CudaPendingCount>(e);
  LATTICE_CUDA_CHECK(cudaMemcpyAsync(e.slot, value, sizeof(std::int64_t), cudaMemcpyDeviceToHost, s));
  LATTICE_CUDA_CHECK(cudaEventRecord(e.event, s));
  return pending;
}

}  // namespace lattice::backend::cuda
