// LAS 1.0-1.4 (ASPRS), point data record formats 0-3 and 6-8, uncompressed, little endian.
//
// Public header block fields used (byte offsets): 0 "LASF"; 24/25 version major/minor; 94 header
// size (u16); 96 offset to point data (u32); 104 point data format (u8; bits 6-7 set = LAZ);
// 105 point record length (u16); 107 legacy point count (u32); 131 scale x y z, 155 offset x y z,
// 179 max x, min x, max y, min y, max z, min z (f64); 1.4 only: 247 point count (u64).
#include <charconv>

#include "common.h"

namespace lattice::io::detail {

namespace {

constexpr std::uint64_t kHeaderSize12 = 227;  // LAS 1.0-1.2 public header block
constexpr std::uint64_t kHeaderSize13 = 235;  // + start of waveform data packet record
constexpr std::uint64_t kHeaderSize14 = 375;  // + EVLRs and 64-bit point counts

// Where the optional fields of a point record format sit (0 = absent).
struct RecordLayout {
  std::uint64_t min_length;
  bool extended;  // formats 6-10: 4-bit return numbers, full-byte classification
  std::uint64_t gps_time;
  std::uint64_t rgb;
  std::uint64_t nir;
};

bool layout_of(unsigned format, RecordLayout& out) {
  switch (format) {
    case 0:
      out = {20, false, 0, 0, 0};
      return true;
    case 1:
      out = {28, false, 20, 0, 0};
      return true;
    case 2:
      out = {26, false, 0, 20, 0};
      return true;
    case 3:
      out = {34, false, 20, 28, 0};
      return true;
    case 6:
      out = {30, true, 22, 0, 0};
      return true;
    case 7:
      out = {36, true, 22, 30, 0};
      return true;
    case 8:
      out = {38, true, 22, 30, 36};
      return true;
    default:
      return false;
  }
}

// "a b c", each the shortest text that reads back as the same double.
std::string triple(double a, double b, double c) {
  std::string s;
  for (double v : {a, b, c}) {
    char buf[32];
    const auto res = std::to_chars(buf, buf + sizeof buf, v);
    append_word(s, std::string_view(buf, static_cast<std::size_t>(res.ptr - buf)));
  }
  return s;
}

std::string fixed_text(std::span<const std::byte> bytes) {
  std::string s;
  for (std::byte b : bytes) {
    if (b == std::byte{0}) break;
    s += static_cast<char>(b);
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace

PointCloud parse_las(std::span<const std::byte> bytes, const Source& src) {
  ByteReader r(bytes, src);
  if (bytes.size() < 4 || std::memcmp(bytes.data(), "LASF", 4) != 0)
    src.fail("the LAS signature 'LASF'",
             quote(bytes.first(std::min<std::size_t>(bytes.size(), 4))));
  if (bytes.size() < kHeaderSize12)
    src.fail("a LAS public header of at least " + plural(kHeaderSize12, "byte"),
             "a file of " + plural(bytes.size(), "byte"));
  const auto at = [&](std::uint64_t offset) { return bytes.data() + offset; };

  const unsigned major = load<std::uint8_t>(at(24), false);
  const unsigned minor = load<std::uint8_t>(at(25), false);
  if (major != 1 || minor > 4)
    src.fail("LAS version 1.0-1.4", std::to_string(major) + "." + std::to_string(minor));
  const std::uint64_t header_size = load<std::uint16_t>(at(94), false);
  const std::uint64_t min_header = minor >= 4   ? kHeaderSize14
                                   : minor == 3 ? kHeaderSize13
                                                : kHeaderSize12;
  if (header_size < min_header)
    src.fail("a header size of at least " + plural(min_header, "byte") + " for LAS 1." +
                 std::to_string(minor),
             plural(header_size, "byte"));
  if (header_size > bytes.size())
    src.fail("a header of " + plural(header_size, "byte") + " (its header size field)",
             "a file of " + plural(bytes.size(), "byte"));
  const std::uint64_t point_offset = load<std::uint32_t>(at(96), false);
  if (point_offset < header_size)
    src.fail("an offset to point data at or after the header (" + plural(header_size, "byte") + ")",
             std::to_string(point_offset));

  const unsigned format_byte = load<std::uint8_t>(at(104), false);
  if (format_byte & 0xc0u)
    src.fail("an uncompressed point format (LAZ is not supported)",
             "point format byte " + std::to_string(format_byte) + " (compression bits set)");
  RecordLayout layout{};
  if (!layout_of(format_byte, layout))
    src.fail("point data format 0, 1, 2, 3, 6, 7 or 8", std::to_string(format_byte));
  const std::uint64_t record_length = load<std::uint16_t>(at(105), false);
  if (record_length < layout.min_length)
    src.fail("a point record length of at least " + plural(layout.min_length, "byte") +
                 " for point format " + std::to_string(format_byte),
             plural(record_length, "byte"));

  const std::uint64_t legacy_count = load<std::uint32_t>(at(107), false);
  std::uint64_t count = legacy_count;
  if (minor >= 4) {
    const std::uint64_t count64 = load<std::uint64_t>(at(247), false);
    if (count64 != 0 && legacy_count != 0 && count64 != legacy_count)
      src.fail("a legacy point count of 0 or equal to the LAS 1.4 point count (" +
                   std::to_string(count64) + ")",
               std::to_string(legacy_count));
    if (count64 != 0) count = count64;
  }

  const std::uint64_t data_bytes = checked_mul(count, record_length, src, "the point data size");
  const std::uint64_t data_end =
      checked_add(point_offset, data_bytes, src, "the end of the point data");
  if (data_end > bytes.size())
    src.fail(std::to_string(count) + " points x " + plural(record_length, "byte") + " = " +
                 plural(data_bytes, "byte") + " of point data at offset " +
                 std::to_string(point_offset),
             "a file of " + plural(bytes.size(), "byte") + " (truncated, or a wrong point count)");

  double scale[3], offset[3], bounds[6];
  for (int k = 0; k < 3; ++k) {
    scale[k] = load<double>(at(131 + 8 * k), false);
    offset[k] = load<double>(at(155 + 8 * k), false);
  }
  for (int k = 0; k < 6; ++k) bounds[k] = load<double>(at(179 + 8 * k), false);

  const auto n = static_cast<std::int64_t>(count);
  PointCloud cloud;
  cloud.format = "las";
  cloud.num_points = n;
  cloud.width = n;
  cloud.meta = {
      {"version", std::to_string(major) + "." + std::to_string(minor)},
      {"point_format", std::to_string(format_byte)},
      {"point_record_length", std::to_string(record_length)},
      {"point_count", std::to_string(count)},
      {"scale", triple(scale[0], scale[1], scale[2])},
      {"offset", triple(offset[0], offset[1], offset[2])},
      {"min", triple(bounds[1], bounds[3], bounds[5])},
      {"max", triple(bounds[0], bounds[2], bounds[4])},
      {"system_identifier", fixed_text(bytes.subspan(26, 32))},
      {"generating_software", fixed_text(bytes.subspan(58, 32))},
  };

  Column xyz = make_column("xyz", Scalar::f64, 3, n);
  Column intensity = make_column("intensity", Scalar::u16, 1, n);
  Column return_number = make_column("return_number", Scalar::u8, 1, n);
  Column number_of_returns = make_column("number_of_returns", Scalar::u8, 1, n);
  Column classification = make_column("classification", Scalar::u8, 1, n);
  Column user_data = make_column("user_data", Scalar::u8, 1, n);
  Column point_source_id = make_column("point_source_id", Scalar::u16, 1, n);
  Column gps_time, rgb, nir;
  if (layout.gps_time) gps_time = make_column("gps_time", Scalar::f64, 1, n);
  if (layout.rgb) rgb = make_column("rgb", Scalar::u16, 3, n);
  if (layout.nir) nir = make_column("nir", Scalar::u16, 1, n);

  auto* out_xyz = static_cast<double*>(xyz.data.raw_data());
  auto* out_intensity = static_cast<std::uint16_t*>(intensity.data.raw_data());
  auto* out_return = static_cast<std::uint8_t*>(return_number.data.raw_data());
  auto* out_returns = static_cast<std::uint8_t*>(number_of_returns.data.raw_data());
  auto* out_class = static_cast<std::uint8_t*>(classification.data.raw_data());
  auto* out_user = static_cast<std::uint8_t*>(user_data.data.raw_data());
  auto* out_source = static_cast<std::uint16_t*>(point_source_id.data.raw_data());
  r.seek(point_offset, "the offset to point data");
  for (std::int64_t i = 0; i < n; ++i) {
    const std::byte* p = r.take(record_length, "a point record").data();
    for (std::size_t k = 0; k < 3; ++k)
      out_xyz[3 * i + static_cast<std::int64_t>(k)] =
          static_cast<double>(load<std::int32_t>(p + 4 * k, false)) * scale[k] + offset[k];
    out_intensity[i] = load<std::uint16_t>(p + 12, false);
    const auto returns = load<std::uint8_t>(p + 14, false);
    if (layout.extended) {
      out_return[i] = returns & 0x0fu;
      out_returns[i] = returns >> 4;
      out_class[i] = load<std::uint8_t>(p + 16, false);
      out_user[i] = load<std::uint8_t>(p + 17, false);
      out_source[i] = load<std::uint16_t>(p + 20, false);
    } else {
      out_return[i] = returns & 0x07u;
      out_returns[i] = (returns >> 3) & 0x07u;
      out_class[i] = load<std::uint8_t>(p + 15, false) & 0x1fu;
      out_user[i] = load<std::uint8_t>(p + 17, false);
      out_source[i] = load<std::uint16_t>(p + 18, false);
    }
    if (layout.gps_time)
      static_cast<double*>(gps_time.data.raw_data())[i] = load<double>(p + layout.gps_time, false);
    if (layout.rgb)
      for (std::size_t k = 0; k < 3; ++k)
        static_cast<std::uint16_t*>(rgb.data.raw_data())[3 * i + static_cast<std::int64_t>(k)] =
            load<std::uint16_t>(p + layout.rgb + 2 * k, false);
    if (layout.nir)
      static_cast<std::uint16_t*>(nir.data.raw_data())[i] =
          load<std::uint16_t>(p + layout.nir, false);
  }

  cloud.columns.push_back(std::move(xyz));
  cloud.columns.push_back(std::move(intensity));
  cloud.columns.push_back(std::move(return_number));
  cloud.columns.push_back(std::move(number_of_returns));
  cloud.columns.push_back(std::move(classification));
  cloud.columns.push_back(std::move(user_data));
  cloud.columns.push_back(std::move(point_source_id));
  if (layout.gps_time) cloud.columns.push_back(std::move(gps_time));
  if (layout.rgb) cloud.columns.push_back(std::move(rgb));
  if (layout.nir) cloud.columns.push_back(std::move(nir));
  return cloud;
}

}  // namespace lattice::io::detail
