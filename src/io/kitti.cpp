// KITTI velodyne scans (.bin: float32 x, y, z, reflectance per point, little endian, no header)
// and SemanticKITTI labels (.label: uint32 per point, class id low 16 bits, instance high 16).
#include "common.h"

namespace lattice::io {

namespace {

constexpr std::uint64_t kKittiPointBytes = 16;  // 4 x float32
constexpr std::uint64_t kLabelBytes = 4;        // uint32

void check_multiple(std::uint64_t size, std::uint64_t unit, std::string_view what,
                    const detail::Source& src) {
  if (size % unit != 0)
    src.fail("a file size that is a multiple of " + detail::plural(unit, "byte") + " (" +
                 std::string(what) + ")",
             detail::plural(size, "byte"));
}

// (N, 4) f32 from the file bytes.
Array kitti_points(std::span<const std::byte> bytes, const detail::Source& src) {
  check_multiple(bytes.size(), kKittiPointBytes, "4 float32 per point", src);
  const auto n = static_cast<std::int64_t>(bytes.size() / kKittiPointBytes);
  Array out = Array::empty({n, 4}, Dtype::f32);
  detail::copy_values(static_cast<std::byte*>(out.raw_data()), bytes.data(),
                      static_cast<std::uint64_t>(n) * 4, Scalar::f32, /*big_endian=*/false);
  return out;
}

}  // namespace

Array read_kitti(const std::string& path) {
  const detail::Source src{"read_kitti", path};
  return kitti_points(detail::read_file(src), src);
}

KittiLabels read_kitti_labels(const std::string& path) {
  const detail::Source src{"read_kitti_labels", path};
  const std::vector<std::byte> bytes = detail::read_file(src);
  check_multiple(bytes.size(), kLabelBytes, "one uint32 per point", src);
  const auto n = static_cast<std::int64_t>(bytes.size() / kLabelBytes);
  KittiLabels out{Array::empty({n}, Dtype::i64), Array::empty({n}, Dtype::i64)};
  auto* semantic = out.semantic.data<std::int64_t>();
  auto* instance = out.instance.data<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto v = detail::load<std::uint32_t>(bytes.data() + i * kLabelBytes, false);
    semantic[i] = v & 0xffffu;
    instance[i] = v >> 16;
  }
  return out;
}

namespace detail {

PointCloud parse_kitti(std::span<const std::byte> bytes, const Source& src) {
  const Array points = kitti_points(bytes, src);
  PointCloud cloud;
  cloud.format = "kitti";
  cloud.num_points = points.dim(0);
  cloud.width = cloud.num_points;
  Column xyz = make_column("xyz", Scalar::f32, 3, cloud.num_points);
  Column reflectance = make_column("reflectance", Scalar::f32, 1, cloud.num_points);
  const float* p = points.data<float>();
  auto* x = static_cast<float*>(xyz.data.raw_data());
  auto* r = static_cast<float*>(reflectance.data.raw_data());
  for (std::int64_t i = 0; i < cloud.num_points; ++i) {
    x[3 * i] = p[4 * i];
    x[3 * i + 1] = p[4 * i + 1];
    x[3 * i + 2] = p[4 * i + 2];
    r[i] = p[4 * i + 3];
  }
  cloud.columns.push_back(std::move(xyz));
  cloud.columns.push_back(std::move(reflectance));
  return cloud;
}

}  // namespace detail

}  // namespace lattice::io
