// The DLPack ABI (v0.8 unversioned DLManagedTensor), written from the public ABI specification
// so that any framework's tensor crosses into lattice without copies. Only the fields lattice
// reads or writes are named; the layout matches the specification exactly.
#pragma once

#include <cstdint>

extern "C" {

enum LatticeDLDeviceType : std::int32_t {
  kLatticeDLCPU = 1,
  kLatticeDLCUDA = 2,
  kLatticeDLCUDAHost = 3,
  kLatticeDLCUDAManaged = 13,
};

struct LatticeDLDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};

enum LatticeDLTypeCode : std::uint8_t {
  kLatticeDLInt = 0,
  kLatticeDLUInt = 1,
  kLatticeDLFloat = 2,
  kLatticeDLOpaqueHandle = 3,
  kLatticeDLBfloat = 4,
  kLatticeDLComplex = 5,
  kLatticeDLBool = 6,
};

struct LatticeDLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};

struct LatticeDLTensor {
  void* data;
  LatticeDLDevice device;
  std::int32_t ndim;
  LatticeDLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements; may be null for compact row-major
  std::uint64_t byte_offset;
};

struct LatticeDLManagedTensor {
  LatticeDLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(LatticeDLManagedTensor* self);
};

}  // extern "C"
