#include "lattice/core/array.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "lattice/core/error.h"

namespace lattice {

namespace {

constexpr std::size_t kCpuAlignment = 64;  // cache line; also what AVX-512 loads like

std::mutex& allocator_mutex() {
  static std::mutex m;
  return m;
}
// Shared so that a caller takes a reference under the lock, not a copy of every hook.
std::shared_ptr<const DeviceAllocator>& cuda_allocator_slot() {
  static std::shared_ptr<const DeviceAllocator> a = std::make_shared<const DeviceAllocator>();
  return a;
}
std::shared_ptr<const DeviceAllocator> cuda_allocator_ref() {
  std::lock_guard lock(allocator_mutex());
  return cuda_allocator_slot();
}

void* cpu_allocate(std::size_t nbytes) {
  const std::size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  void* p = std::aligned_alloc(kCpuAlignment, rounded == 0 ? kCpuAlignment : rounded);
  if (!p) throw Error("lattice: out of host memory allocating " + std::to_string(nbytes) + " bytes");
  return p;
}

std::int64_t checked_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) {
    if (d < 0) throw ValueError("[Array] shape: expected non-negative sizes, got " + format_shape(shape));
    if (d != 0 && n > (std::int64_t{1} << 62) / d)
      throw ValueError("[Array] shape: expected fewer than 2^62 elements, got " + format_shape(shape));
    n *= d;
  }
  return n;
}

Dtype dtype_from_dl(LatticeDLDataType t) {
  if (t.lanes != 1) throw TypeError("[from_dlpack] dtype: expected lanes=1, got lanes=" + std::to_string(t.lanes));
  switch (t.code) {
    case kLatticeDLFloat:
      if (t.bits == 16) return Dtype::f16;
      if (t.bits == 32) return Dtype::f32;
      if (t.bits == 64) return Dtype::f64;
      break;
    case kLatticeDLBfloat:
      if (t.bits == 16) return Dtype::bf16;
      break;
    case kLatticeDLInt:
      if (t.bits == 32) return Dtype::i32;
      if (t.bits == 64) return Dtype::i64;
      break;
    case kLatticeDLUInt:
      if (t.bits == 8) return Dtype::u8;
      if (t.bits == 32) return Dtype::u32;
      break;
    case kLatticeDLBool:
      if (t.bits == 8) return Dtype::boolean;
      break;
    default: break;
  }
  throw TypeError("[from_dlpack] dtype: expected float16/bfloat16/float32/float64/int32/int64/uint8/uint32/bool, got DLPack code " +
                  std::to_string(t.code) + " with " + std::to_string(t.bits) + " bits");
}

LatticeDLDataType dl_from_dtype(Dtype d) {
  switch (d) {
    case Dtype::f16: return {kLatticeDLFloat, 16, 1};
    case Dtype::bf16: return {kLatticeDLBfloat, 16, 1};
    case Dtype::f32: return {kLatticeDLFloat, 32, 1};
    case Dtype::f64: return {kLatticeDLFloat, 64, 1};
    case Dtype::i32: return {kLatticeDLInt, 32, 1};
    case Dtype::i64: return {kLatticeDLInt, 64, 1};
    case Dtype::u8: return {kLatticeDLUInt, 8, 1};
    case Dtype::u32: return {kLatticeDLUInt, 32, 1};
    case Dtype::boolean: return {kLatticeDLBool, 8, 1};
  }
  return {kLatticeDLFloat, 32, 1};
}

// Owns the shape/strides buffers and a reference to the exported Array.
struct ExportContext {
  Array array;
  Shape shape;
  Shape strides;
  LatticeDLManagedTensor managed{};
};

}  // namespace

Storage::Storage(void* data, std::size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (deleter_) deleter_(data_);
}

void register_device_allocator(DeviceType type, DeviceAllocator allocator) {
  LATTICE_ASSERT(type == DeviceType::cuda, "only the CUDA allocator is pluggable");
  std::lock_guard lock(allocator_mutex());
  cuda_allocator_slot() = std::make_shared<const DeviceAllocator>(std::move(allocator));
}

bool has_device_allocator(DeviceType type) {
  if (type == DeviceType::cpu) return true;
  return static_cast<bool>(cuda_allocator_ref()->allocate);
}

DeviceMemoryStats device_memory_stats(DeviceType type) {
  if (type == DeviceType::cpu) return {};
  const auto alloc = cuda_allocator_ref();
  return alloc->stats ? alloc->stats() : DeviceMemoryStats{};
}

void device_empty_cache(DeviceType type) {
  if (type == DeviceType::cpu) return;
  const auto alloc = cuda_allocator_ref();
  if (alloc->empty_cache) alloc->empty_cache();
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<std::int64_t>(shape[i], 1);
  }
  return strides;
}

Array Array::empty(Shape shape, Dtype dtype, Device device) {
  const std::int64_t n = checked_numel(shape);
  const std::size_t nbytes = static_cast<std::size_t>(n) * size_of(dtype);
  Array a;
  if (device.is_cpu()) {
    void* p = cpu_allocate(nbytes);
    a.storage_ = std::make_shared<Storage>(p, nbytes, device, [](void* q) { std::free(q); });
  } else {
    std::shared_ptr<const DeviceAllocator> alloc = cuda_allocator_ref();
    if (!alloc->allocate)
      throw UnsupportedError("[Array] device: expected cpu, got " + to_string(device) +
                             " (lattice was built without CUDA)");
    void* p = nbytes ? alloc->allocate(nbytes, device.index) : nullptr;
    const int index = device.index;
    a.storage_ = std::make_shared<Storage>(p, nbytes, device, [alloc = std::move(alloc), index](void* q) {
      if (q) alloc->release(q, index);
    });
  }
  a.shape_ = std::move(shape);
  a.strides_ = contiguous_strides(a.shape_);
  a.dtype_ = dtype;
  a.device_ = device;
  return a;
}

Array Array::zeros(Shape shape, Dtype dtype, Device device) {
  Array a = empty(std::move(shape), dtype, device);
  if (device.is_cpu()) {
    std::memset(a.raw_data(), 0, a.nbytes());
  } else {
    if (a.nbytes()) cuda_allocator_ref()->zero(a.raw_data(), a.nbytes(), device.index);
  }
  return a;
}

Array Array::wrap(void* data, Shape shape, Shape strides, Dtype dtype, Device device,
                  std::shared_ptr<void> owner) {
  Array a;
  const std::int64_t n = checked_numel(shape);
  a.storage_ = std::make_shared<Storage>(data, static_cast<std::size_t>(n) * size_of(dtype), device,
                                         [owner](void*) mutable { owner.reset(); });
  a.strides_ = strides.empty() ? contiguous_strides(shape) : std::move(strides);
  a.shape_ = std::move(shape);
  a.dtype_ = dtype;
  a.device_ = device;
  return a;
}

Array Array::from_dlpack(LatticeDLManagedTensor* managed) {
  if (!managed) throw ValueError("[from_dlpack] tensor: expected a DLPack tensor, got null");
  const LatticeDLTensor& t = managed->dl_tensor;
  // Take ownership first so the producer's deleter runs on every path below.
  std::shared_ptr<LatticeDLManagedTensor> owner(managed, [](LatticeDLManagedTensor* m) {
    if (m->deleter) m->deleter(m);
  });
  Device device;
  switch (t.device.device_type) {
    case kLatticeDLCPU:
    case kLatticeDLCUDAHost: device = Device::cpu(); break;
    case kLatticeDLCUDA:
    case kLatticeDLCUDAManaged: device = Device::cuda(t.device.device_id); break;
    default:
      throw TypeError("[from_dlpack] device: expected cpu or cuda, got DLPack device type " +
                      std::to_string(t.device.device_type));
  }
  const Dtype dtype = dtype_from_dl(t.dtype);
  if (t.ndim < 0) throw ValueError("[from_dlpack] ndim: expected >= 0, got " + std::to_string(t.ndim));
  Shape shape(t.shape, t.shape + t.ndim);
  const std::int64_t n = checked_numel(shape);
  // Zero-element tensors get canonical strides: producers export arbitrary ones for them.
  Shape strides = t.strides && n != 0 ? Shape(t.strides, t.strides + t.ndim) : contiguous_strides(shape);
  Array a;
  a.storage_ = std::make_shared<Storage>(
      static_cast<char*>(t.data) + t.byte_offset, static_cast<std::size_t>(n) * size_of(dtype), device,
      [owner](void*) mutable { owner.reset(); });
  a.shape_ = std::move(shape);
  a.strides_ = std::move(strides);
  a.dtype_ = dtype;
  a.device_ = device;
  return a;
}

LatticeDLManagedTensor* Array::to_dlpack() const {
  LATTICE_ASSERT(defined(), "to_dlpack on an undefined Array");
  auto* ctx = new ExportContext{*this, shape_, strides_, {}};
  LatticeDLTensor& t = ctx->managed.dl_tensor;
  t.data = raw_data();
  t.device = {device_.is_cpu() ? kLatticeDLCPU : kLatticeDLCUDA, device_.is_cpu() ? 0 : device_.index};
  t.ndim = static_cast<std::int32_t>(shape_.size());
  t.dtype = dl_from_dtype(dtype_);
  t.shape = ctx->shape.data();
  t.strides = ctx->strides.data();
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = [](LatticeDLManagedTensor* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
  };
  return &ctx->managed;
}

std::int64_t Array::dim(std::int64_t axis) const {
  const std::int64_t n = ndim();
  if (axis < 0) axis += n;
  LATTICE_ASSERT(axis >= 0 && axis < n, "Array::dim axis out of range");
  return shape_[static_cast<std::size_t>(axis)];
}

std::int64_t Array::numel() const {
  std::int64_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

bool Array::is_contiguous() const {
  // An array without elements is contiguous whatever its strides (like torch): producers export
  // arbitrary strides for them (torch.from_numpy of an (0, 4) array has strides (0, 0), and its
  // DLPack export (1, 0)), and a zero-element CUDA array must never need a clone.
  for (std::int64_t d : shape_) {
    if (d == 0) return true;
  }
  std::int64_t expected = 1;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* Array::raw_data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<std::int64_t>(size_of(dtype_));
}

Array Array::strided_view(Shape shape, Shape strides) const {
  if (!defined()) throw ValueError("[Array] strided_view: expected a defined array, got none");
  if (shape.size() != strides.size())
    throw ValueError("[Array] strided_view: expected as many strides as axes, got " + std::to_string(strides.size()) +
                     " for " + std::to_string(shape.size()));
  const std::int64_t n = checked_numel(shape);
  if (n > 0) {
    std::int64_t lo = offset_, hi = offset_;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      const std::int64_t span = (shape[d] - 1) * strides[d];
      (span < 0 ? lo : hi) += span;
    }
    const std::int64_t capacity = static_cast<std::int64_t>(storage_->nbytes() / size_of(dtype_));
    if (lo < 0 || hi >= capacity)
      throw ValueError("[Array] strided_view: expected indices inside the storage (" + std::to_string(capacity) +
                       " elements), got " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  Array v = *this;
  v.shape_ = std::move(shape);
  v.strides_ = std::move(strides);
  return v;
}

Array Array::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

namespace {
template <class D, class S>
void convert_rows_cpu(D* dst, const S* src, const Shape& shape, const Shape& strides, std::int64_t n) {
  const std::size_t nd = shape.size();
  std::vector<std::int64_t> idx(nd, 0);
  for (std::int64_t flat = 0; flat < n; ++flat) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < nd; ++d) off += idx[d] * strides[d];
    // one rounding to D: widening is exact, f64 -> f32 rounds once, 16-bit targets come from f32
    // or the other 16-bit type (contiguous_as refuses f64 <-> 16-bit)
    if constexpr (std::is_same_v<D, double>) dst[flat] = static_cast<double>(load(src[off]));
    else dst[flat] = store<D>(static_cast<Accum<D>>(load(src[off])));
    for (std::size_t d = nd; d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}
}  // namespace

Array Array::contiguous_as(Dtype dtype) const {
  if (!is_floating(dtype_) || !is_floating(dtype))
    throw TypeError(std::string("[Array] contiguous_as: expected float arrays and a float dtype, got ") +
                    std::string(to_string(dtype_)) + " -> " + std::string(to_string(dtype)));
  if (dtype == dtype_) return contiguous();
  // 16-bit from f64 would round twice through f32: no caller needs it (autocast leaves f64 alone)
  if ((dtype_ == Dtype::f64 && size_of(dtype) == 2) || (dtype == Dtype::f64 && size_of(dtype_) == 2))
    throw TypeError(std::string("[Array] contiguous_as: expected a conversion among float16, bfloat16, float32 "
                                "or between float32 and float64, got ") +
                    std::string(to_string(dtype_)) + " -> " + std::string(to_string(dtype)));
  Array out = empty(shape_, dtype, device_);
  const std::int64_t n = numel();
  if (n == 0) return out;
  if (!device_.is_cpu()) {
    std::shared_ptr<const DeviceAllocator> alloc = cuda_allocator_ref();
    if (!alloc->strided_convert || shape_.size() > 8)
      throw UnsupportedError("[Array] contiguous_as: expected an array of at most 8 axes on a device with a "
                             "converting copy, got " + std::to_string(shape_.size()) + " axes on " + to_string(device_));
    alloc->strided_convert(out.raw_data(), dtype, raw_data(), dtype_, shape_.data(), strides_.data(),
                           static_cast<int>(shape_.size()), device_.index);
    return out;
  }
  dispatch_float(dtype, "Array.contiguous_as", "dtype", [&](auto dt) {
    using D = typename decltype(dt)::type;
    dispatch_float(dtype_, "Array.contiguous_as", "array", [&](auto st) {
      using S = typename decltype(st)::type;
      convert_rows_cpu(out.data<D>(), data<S>(), shape_, strides_, n);
    });
  });
  return out;
}

namespace {
std::shared_ptr<const DeviceAllocator> copy_capable_allocator(Device a, Device b) {
  std::shared_ptr<const DeviceAllocator> alloc = cuda_allocator_ref();
  if (!alloc->copy)
    throw UnsupportedError("[Array] device: expected cpu, got " + to_string(a.is_cpu() ? b : a) +
                           " (lattice was built without CUDA)");
  return alloc;
}
}  // namespace

Array Array::to(Device device) const {
  if (device == device_) return device.is_cpu() ? contiguous() : clone();
  Array src = device_.is_cpu() ? contiguous() : *this;
  if (!src.is_contiguous())
    throw UnsupportedError("[Array] to: expected a contiguous " + to_string(device_) + " array, got strides " +
                           format_shape(strides_));
  Array out = empty(shape_, dtype_, device);
  if (out.nbytes()) copy_capable_allocator(device, device_)->copy(out.raw_data(), device, src.raw_data(), device_, out.nbytes());
  return out;
}

Array Array::clone() const {
  if (!device_.is_cpu()) {
    Array out = empty(shape_, dtype_, device_);
    if (!out.nbytes()) return out;
    const auto alloc = copy_capable_allocator(device_, device_);
    if (is_contiguous()) {
      alloc->copy(out.raw_data(), device_, raw_data(), device_, out.nbytes());
      return out;
    }
    if (!alloc->strided_copy || shape_.size() > 8)
      throw UnsupportedError("[Array] clone: expected a contiguous " + to_string(device_) + " array, got strides " +
                             format_shape(strides_));
    alloc->strided_copy(out.raw_data(), raw_data(), shape_.data(), strides_.data(), static_cast<int>(shape_.size()),
                        size_of(dtype_), device_.index);
    return out;
  }
  Array out = empty(shape_, dtype_, device_);
  const std::size_t es = size_of(dtype_);
  const std::int64_t n = numel();
  if (n == 0) return out;
  const char* src = static_cast<const char*>(raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  if (is_contiguous()) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * es);
    return out;
  }
  // Strided gather: walk the output in row-major order with a multi-index.
  const std::size_t nd = shape_.size();
  std::vector<std::int64_t> idx(nd, 0);
  for (std::int64_t flat = 0; flat < n; ++flat) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < nd; ++d) off += idx[d] * strides_[d];
    std::memcpy(dst + flat * static_cast<std::int64_t>(es), src + off * static_cast<std::int64_t>(es), es);
    for (std::size_t d = nd; d-- > 0;) {
      if (++idx[d] < shape_[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

Array Array::reshape(Shape shape) const {
  std::int64_t n = checked_numel(shape);
  if (n != numel())
    throw ValueError("[Array] reshape: expected " + std::to_string(numel()) + " elements, got shape " +
                     format_shape(shape));
  Array base = contiguous();
  base.strides_ = contiguous_strides(shape);
  base.shape_ = std::move(shape);
  return base;
}

}  // namespace lattice
