// Point-cloud file readers: KITTI velodyne .bin, SemanticKITTI .label, LAS 1.0-1.4 (point formats
// 0-3 and 6-8), PCD v0.7 (ascii, binary, binary_compressed) and PLY 1.0 (ascii, binary little and
// big endian).
//
// Contract:
// - A reader reads the whole file once; every size its header claims (points x record size,
//   compressed and decompressed sizes, list lengths, offsets) is checked against the bytes that
//   are actually there BEFORE anything is allocated, so no file can request more memory than a
//   small multiple of its own size (binary_compressed PCD: LZF expands at most 88x).
// - Malformed input throws lattice::ValueError "[read_<format>] <path>: expected ..., got ..."
//   (wrong magic, truncation, impossible counts, unknown types, overflowing sizes); nothing else
//   escapes for bad bytes. A missing or unreadable file is a ValueError of the same format.
// - Header text (column names, `meta` keys and values) is returned as UTF-8: text that is valid
//   UTF-8 is kept, any other string is read as Latin-1 (ISO-8859-1; LAS generating_software,
//   PLY comments and property names, PCD fields written by Windows tools) and converted, so a
//   non-UTF-8 byte never makes a file unreadable. Binary fields are parsed from bytes and never
//   depend on text decoding. Error messages quote file bytes as ASCII (others as \xNN).
// - Outputs are contiguous CPU arrays in host byte order. Values keep the file's types (a PLY
//   `ushort` stays uint16); derived columns ("xyz", "colors") are documented per reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lattice/core/array.h"
#include "lattice/core/error.h"

namespace lattice::io {

// Element types a file can hold. lattice::Dtype lacks int8/int16/uint16/uint64, so columns carry
// their own type and their bytes (see Column).
enum class Scalar : std::uint8_t { i8, u8, i16, u16, i32, u32, i64, u64, f32, f64 };
// numpy spelling: "int8", "uint8", ..., "float32", "float64".
std::string_view to_string(Scalar type);
std::size_t size_of(Scalar type);

template <class T>
constexpr Scalar scalar_of();
template <>
constexpr Scalar scalar_of<std::int8_t>() {
  return Scalar::i8;
}
template <>
constexpr Scalar scalar_of<std::uint8_t>() {
  return Scalar::u8;
}
template <>
constexpr Scalar scalar_of<std::int16_t>() {
  return Scalar::i16;
}
template <>
constexpr Scalar scalar_of<std::uint16_t>() {
  return Scalar::u16;
}
template <>
constexpr Scalar scalar_of<std::int32_t>() {
  return Scalar::i32;
}
template <>
constexpr Scalar scalar_of<std::uint32_t>() {
  return Scalar::u32;
}
template <>
constexpr Scalar scalar_of<std::int64_t>() {
  return Scalar::i64;
}
template <>
constexpr Scalar scalar_of<std::uint64_t>() {
  return Scalar::u64;
}
template <>
constexpr Scalar scalar_of<float>() {
  return Scalar::f32;
}
template <>
constexpr Scalar scalar_of<double>() {
  return Scalar::f64;
}

// One per-point attribute: `count` values of `type` per point.
// data: contiguous CPU Array of dtype u8, shape (num_points, count * size_of(type)), holding the
// bytes of a row-major (num_points, count) array of `type` in host byte order.
struct Column {
  std::string name;
  Scalar type = Scalar::f32;
  std::int64_t count = 1;
  Array data;

  // The num_points * count values; throws lattice::TypeError when T is not `type`.
  template <class T>
  std::span<const T> values() const {
    if (scalar_of<T>() != type)
      throw_type_error("Column::values", name, to_string(type), to_string(scalar_of<T>()));
    return {reinterpret_cast<const T*>(data.raw_data()),
            static_cast<std::size_t>(data.numel()) / sizeof(T)};
  }
};

// A point cloud as read from a file: columns in file order, then derived columns.
struct PointCloud {
  std::string format;  // "kitti", "las", "pcd", "ply"
  std::int64_t num_points = 0;
  // Organized clouds (PCD HEIGHT > 1): num_points == width * height, points row by row (a row is
  // `width` points), invalid points kept as NaN. Every other cloud: width = num_points, height 1.
  std::int64_t width = 0;
  std::int64_t height = 1;
  std::vector<Column> columns;
  // Header facts as text, in header order (e.g. {"version", "1.4"}, {"scale", "0.01 0.01 0.01"}).
  std::vector<std::pair<std::string, std::string>> meta;

  const Column* find(std::string_view name) const;  // nullptr when absent
};

// KITTI velodyne scan: (N, 4) f32 rows (x, y, z, reflectance); file size must be a multiple of 16.
Array read_kitti(const std::string& path);

// SemanticKITTI labels: per point uint32, class id in the low 16 bits, instance id in the high 16.
struct KittiLabels {
  Array semantic;  // (N,) i64
  Array instance;  // (N,) i64
};
KittiLabels read_kitti_labels(const std::string& path);

// Columns: "xyz" (N, 3) f64 = raw * scale + offset; "intensity" u16; "return_number",
// "number_of_returns" u8; "classification" u8 (formats 0-3: the low 5 bits, 6-8: the full byte);
// "user_data" u8; "point_source_id" u16; "gps_time" f64 (formats 1, 3, 6, 7, 8); "rgb" (N, 3) u16
// (formats 2, 3, 7, 8); "nir" u16 (format 8). Point count: the 64-bit count of a 1.4 header when
// non-zero, else the legacy 32-bit one. Records are read at offset-to-point-data with the
// header's record length (which may exceed the format's minimum; the extra bytes are skipped).
PointCloud read_las(const std::string& path);

// Every field by name (padding fields named "_" are dropped), shape (N, COUNT) or (N,) when
// COUNT is 1, with the file's type (TYPE/SIZE: I1 int8 ... F8 float64). Derived: "xyz" (N, 3)
// when x, y, z are single-valued fields (f32 when all three are F4, else f64); "colors" (N, 3) u8
// (R, G, B) from a 4-byte "rgb" field packed 0x00RRGGBB, or (N, 4) RGBA from "rgba" 0xAARRGGBB.
PointCloud read_pcd(const std::string& path);

// Every scalar property of the "vertex" element by name with its type (char/int8 ... double/
// float64); list properties of the vertex element are skipped. x, y, z are required. Derived:
// "xyz" as for PCD (f32 when all three are float32); "colors" (N, 3) or (N, 4) u8 from uchar
// red, green, blue (and alpha). Elements before "vertex" are parsed to be skipped (lists
// included); elements after it are not read.
PointCloud read_ply(const std::string& path);

enum class Format : std::uint8_t { kitti, las, pcd, ply };
std::string_view to_string(Format format);
// By extension, case-insensitive: .bin (KITTI), .las, .pcd, .ply; ValueError otherwise (.laz too).
Format format_from_path(const std::string& path);
// read_las / read_pcd / read_ply, or KITTI as columns "xyz" (N, 3) f32 and "reflectance" f32.
PointCloud read_point_cloud(const std::string& path, std::optional<Format> format = std::nullopt);
// The same parsers over bytes already in memory; `name` stands for the path in messages.
PointCloud parse_point_cloud(std::span<const std::byte> bytes, Format format,
                             const std::string& name);

}  // namespace lattice::io
