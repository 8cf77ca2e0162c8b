// lattice::Array: a typed, strided view of shared storage on one device.
//
// Contract: shape and strides are in elements (int64); storage is shared (copies of an Array
// alias the same bytes); the storage's deleter runs when the last Array (or DLPack export)
// referencing it goes away. Arrays imported from DLPack keep the producer's buffer alive
// through its own deleter, so no copy happens at the framework boundary.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "lattice/core/device.h"
#include "lattice/core/dlpack.h"
#include "lattice/core/dtype.h"

namespace lattice {

using Shape = std::vector<std::int64_t>;

class Storage {
 public:
  Storage(void* data, std::size_t nbytes, Device device, std::function<void(void*)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  std::size_t nbytes_;
  Device device_;
  std::function<void(void*)> deleter_;
};

// What the device allocator did since the process started: driver calls (stream-ordered
// allocations/frees the allocator could not serve from its cache), cache hits, bytes it holds,
// and host synchronisations (copies that touch host memory wait for the stream).
struct DeviceMemoryStats {
  std::int64_t driver_allocs = 0;
  std::int64_t driver_frees = 0;
  std::int64_t cache_hits = 0;
  std::int64_t live_bytes = 0;
  std::int64_t cached_bytes = 0;
  std::int64_t host_syncs = 0;
  std::int64_t graph_allocs = 0;  // allocations made while the stream was being captured
};

// Allocation hook per device type: the CPU allocator is built in; the CUDA backend registers
// its stream-ordered allocator when it is compiled in. Without one, allocating on that device
// raises UnsupportedError ("built without CUDA").
struct DeviceAllocator {
  std::function<void*(std::size_t nbytes, int device_index)> allocate;
  std::function<void(void* ptr, int device_index)> release;
  std::function<void(void* ptr, std::size_t nbytes, int device_index)> zero;
  // Contiguous byte copy between host and device or within the device, ordered on the current
  // stream of the device involved; a copy to the host returns when the bytes have arrived.
  std::function<void(void* dst, Device dst_device, const void* src, Device src_device, std::size_t nbytes)> copy;
  // Gather of a strided array into contiguous row-major storage on the same device (shape and
  // strides in elements, `ndim` <= 8 axes, `esize` bytes per element), ordered on the current
  // stream of the device; optional (without it strided device arrays cannot be copied).
  std::function<void(void* dst, const void* src, const std::int64_t* shape, const std::int64_t* strides, int ndim,
                     std::size_t esize, int device_index)>
      strided_copy;
  // The same gather converting each element from `src_dtype` to `dst_dtype` (float dtypes: f16,
  // bf16, f32, f64; round to nearest even, as torch's Tensor.to); optional like strided_copy.
  std::function<void(void* dst, Dtype dst_dtype, const void* src, Dtype src_dtype, const std::int64_t* shape,
                     const std::int64_t* strides, int ndim, int device_index)>
      strided_convert;
  // Counters (optional; all zero when absent) and a cache flush (optional).
  std::function<DeviceMemoryStats()> stats;
  std::function<void()> empty_cache;
};

void register_device_allocator(DeviceType type, DeviceAllocator allocator);
bool has_device_allocator(DeviceType type);
DeviceMemoryStats device_memory_stats(DeviceType type);
// Returns every cached block of the device allocator to the device (no-op without one).
void device_empty_cache(DeviceType type);

class Array {
 public:
  Array() = default;

  // Fresh contiguous storage (CPU: 64-byte aligned). Contents of `empty` are unspecified.
  static Array empty(Shape shape, Dtype dtype, Device device = Device::cpu());
  static Array zeros(Shape shape, Dtype dtype, Device device = Device::cpu());
  // Wraps foreign memory; `owner` keeps it alive. Strides empty = contiguous.
  static Array wrap(void* data, Shape shape, Shape strides, Dtype dtype, Device device,
                    std::shared_ptr<void> owner);
  // Copies a host vector into a new CPU array of shape (n).
  template <class T>
  static Array from_vector(const std::vector<T>& values, Shape shape = {});

  // Takes ownership of a DLPack tensor (its deleter runs when the storage dies).
  static Array from_dlpack(LatticeDLManagedTensor* managed);
  // Exports a view; the returned tensor keeps this Array's storage alive until its deleter runs.
  LatticeDLManagedTensor* to_dlpack() const;

  bool defined() const { return static_cast<bool>(storage_); }
  Dtype dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  std::int64_t ndim() const { return static_cast<std::int64_t>(shape_.size()); }
  std::int64_t dim(std::int64_t axis) const;  // negative axes count from the end
  std::int64_t numel() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * size_of(dtype_); }
  bool is_contiguous() const;

  void* raw_data() const;
  template <class T>
  T* data() const {
    return static_cast<T*>(raw_data());
  }

  // Same contents, contiguous row-major (returns *this when already contiguous). A strided device
  // array is gathered on the device (its allocator's strided_copy; UnsupportedError without one).
  Array contiguous() const;
  // Deep copy, contiguous.
  Array clone() const;
  // Same contents, contiguous, in the float dtype `dtype` (this array is float too): one pass that
  // gathers and converts (round to nearest even, as torch's Tensor.to), on the array's device;
  // returns *this when it is already contiguous in `dtype`. TypeError for a non-float array or
  // dtype.
  Array contiguous_as(Dtype dtype) const;
  // A view of the same storage (same offset) with another shape and strides (in elements), e.g.
  // a permutation of the axes; every index it can address must lie inside the storage (checked).
  Array strided_view(Shape shape, Shape strides) const;
  // Contiguous copy on `device` (returns *this when already there and contiguous). Copies to
  // the host wait for the device stream.
  Array to(Device device) const;
  // New shape with equal numel: the same storage when contiguous, else a contiguous copy.
  Array reshape(Shape shape) const;

 private:
  std::shared_ptr<Storage> storage_;
  std::int64_t offset_ = 0;  // in elements
  Shape shape_;
  Shape strides_;
  Dtype dtype_ = Dtype::f32;
  Device device_;
};

Shape contiguous_strides(const Shape& shape);

template <class T>
Array Array::from_vector(const std::vector<T>& values, Shape shape) {
  if (shape.empty()) shape = {static_cast<std::int64_t>(values.size())};
  Array a = empty(std::move(shape), dtype_of<T>());
  std::copy(values.begin(), values.end(), a.data<T>());
  return a;
}

}  // namespace lattice
