// PCD v0.7 (Point Cloud Library): a text header of KEYWORD lines (# comments allowed) ending in
// "DATA ascii|binary|binary_compressed", then the points.
//   ascii:             whitespace-separated values, point after point, field after field;
//   binary:            point-major records of sum(SIZE x COUNT) bytes, little endian;
//   binary_compressed: uint32 compressed size, uint32 uncompressed size, then LZF data that
//                      decompresses to a field-major layout (all points' values of field 0, then
//                      field 1, ...); padding fields ("_") are not stored (as PCL writes them).
// Organized clouds (HEIGHT > 1) are read row by row with their invalid (NaN) points kept.
#include <algorithm>

#include "common.h"

namespace lattice::io::detail {

namespace {

constexpr std::uint64_t kMaxFields = 10000;  // a header limit no real file approaches
constexpr std::uint64_t kMaxHeaderLine = 1u << 20;

struct Field {
  std::string name;
  Scalar type;
  std::uint64_t size;
  std::uint64_t count;
  bool padding;  // PCL's "_" fields: bytes without meaning, not returned
};

enum class DataKind { ascii, binary, binary_compressed };

struct Header {
  std::vector<std::string_view> fields, sizes, types, counts, viewpoint;
  std::string_view version;
  bool has_width = false, has_height = false, has_points = false;
  std::uint64_t width = 0, height = 1, points = 0;
  DataKind data = DataKind::ascii;
  std::string_view data_word;
};

Scalar scalar_for(char type, std::uint64_t size, bool& ok) {
  ok = true;
  if (type == 'F' && size == 4) return Scalar::f32;
  if (type == 'F' && size == 8) return Scalar::f64;
  if (type == 'I' && size == 1) return Scalar::i8;
  if (type == 'I' && size == 2) return Scalar::i16;
  if (type == 'I' && size == 4) return Scalar::i32;
  if (type == 'I' && size == 8) return Scalar::i64;
  if (type == 'U' && size == 1) return Scalar::u8;
  if (type == 'U' && size == 2) return Scalar::u16;
  if (type == 'U' && size == 4) return Scalar::u32;
  if (type == 'U' && size == 8) return Scalar::u64;
  ok = false;
  return Scalar::u8;
}

std::string join(const std::vector<std::string_view>& words) {
  std::string s;
  for (std::string_view w : words) append_word(s, w);
  return s;
}

// Reads header lines up to and including DATA; leaves `r` at the first data byte.
Header read_header(ByteReader& r, const Source& src) {
  Header h;
  bool seen_version = false, seen_data = false;
  std::vector<std::string> seen;
  while (!seen_data) {
    const std::string_view line = r.line("a PCD header line ending in DATA", kMaxHeaderLine);
    const std::vector<std::string_view> words = split_words(line);
    if (words.empty() || words[0][0] == '#') continue;
    const std::string_view key = words[0];
    const std::vector<std::string_view> values(words.begin() + 1, words.end());
    if (!seen_version && key != "VERSION")
      src.fail("a PCD header starting with 'VERSION 0.7' (after # comments)", quote(line));
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      src.fail("each PCD header keyword once", quote(key) + " twice");
    seen.emplace_back(key);
    const auto one_value = [&]() -> std::string_view {
      if (values.size() != 1)
        src.fail("one value after " + std::string(key), plural(values.size(), "value"));
      return values[0];
    };
    if (key == "VERSION") {
      seen_version = true;
      h.version = one_value();
      if (h.version != "0.7" && h.version != ".7") src.fail("VERSION 0.7", quote(h.version));
    } else if (key == "FIELDS") {
      h.fields = values;
    } else if (key == "SIZE") {
      h.sizes = values;
    } else if (key == "TYPE") {
      h.types = values;
    } else if (key == "COUNT") {
      h.counts = values;
    } else if (key == "WIDTH") {
      h.has_width = true;
      h.width = parse_count(one_value(), src, "WIDTH");
    } else if (key == "HEIGHT") {
      h.has_height = true;
      h.height = parse_count(one_value(), src, "HEIGHT");
    } else if (key == "POINTS") {
      h.has_points = true;
      h.points = parse_count(one_value(), src, "POINTS");
    } else if (key == "VIEWPOINT") {
      h.viewpoint = values;
    } else if (key == "DATA") {
      seen_data = true;
      h.data_word = one_value();
      if (h.data_word == "ascii")
        h.data = DataKind::ascii;
      else if (h.data_word == "binary")
        h.data = DataKind::binary;
      else if (h.data_word == "binary_compressed")
        h.data = DataKind::binary_compressed;
      else
        src.fail("DATA ascii, binary or binary_compressed", quote(h.data_word));
    } else {
      src.fail(
          "a PCD header keyword (VERSION, FIELDS, SIZE, TYPE, COUNT, WIDTH, HEIGHT, VIEWPOINT, "
          "POINTS, DATA)",
          quote(key));
    }
  }
  return h;
}

std::vector<Field> fields_of(const Header& h, const Source& src) {
  if (h.fields.empty()) src.fail("a FIELDS line naming at least one field", "none");
  const std::size_t nf = h.fields.size();
  if (nf > kMaxFields)
    src.fail("at most " + std::to_string(kMaxFields) + " FIELDS", std::to_string(nf));
  const auto check_len = [&](const std::vector<std::string_view>& v, std::string_view key) {
    if (v.size() != nf)
      src.fail(std::string(key) + " with " + plural(nf, "entry") +
                   " (one per field: " + join(h.fields) + ")",
               plural(v.size(), "entry"));
  };
  check_len(h.sizes, "SIZE");
  check_len(h.types, "TYPE");
  if (!h.counts.empty()) check_len(h.counts, "COUNT");
  std::vector<Field> fields;
  for (std::size_t i = 0; i < nf; ++i) {
    Field f;
    f.name = std::string(h.fields[i]);
    f.padding = f.name == "_";
    f.size = parse_count(h.sizes[i], src, "SIZE of field " + quote(f.name));
    f.count =
        h.counts.empty() ? 1 : parse_count(h.counts[i], src, "COUNT of field " + quote(f.name));
    if (f.count == 0) src.fail("COUNT of field " + quote(f.name) + " at least 1", "0");
    if (f.count > (std::uint64_t{1} << 32))
      src.fail("COUNT of field " + quote(f.name) + " at most 2^32", std::to_string(f.count));
    const std::string_view t = h.types[i];
    bool ok = t.size() == 1;
    if (ok) f.type = scalar_for(t[0], f.size, ok);
    if (!ok)
      src.fail("TYPE I or U with SIZE 1, 2, 4, 8, or F with SIZE 4, 8 for field " + quote(f.name),
               "TYPE " + quote(t) + " SIZE " + quote(h.sizes[i]));
    if (!f.padding)
      for (const Field& g : fields)
        if (g.name == f.name) src.fail("distinct field names", quote(f.name) + " twice");
    fields.push_back(std::move(f));
  }
  return fields;
}

// "colors" (N, 3) u8 from a packed 0x00RRGGBB "rgb" field, or (N, 4) from 0xAARRGGBB "rgba".
void add_colors(PointCloud& cloud) {
  if (cloud.find("colors")) return;
  const Column* packed = cloud.find("rgb");
  std::int64_t channels = 3;
  if (!packed || size_of(packed->type) != 4 || packed->count != 1) {
    packed = cloud.find("rgba");
    channels = 4;
  }
  if (!packed || size_of(packed->type) != 4 || packed->count != 1) return;
  const std::int64_t n = cloud.num_points;
  Column colors = make_column("colors", Scalar::u8, channels, n);
  const auto* src = static_cast<const std::byte*>(packed->data.raw_data());
  auto* dst = static_cast<std::uint8_t*>(colors.data.raw_data());
  for (std::int64_t i = 0; i < n; ++i) {
    const auto bits = load<std::uint32_t>(src + 4 * i, std::endian::native == std::endian::big);
    dst[channels * i] = static_cast<std::uint8_t>(bits >> 16);
    dst[channels * i + 1] = static_cast<std::uint8_t>(bits >> 8);
    dst[channels * i + 2] = static_cast<std::uint8_t>(bits);
    if (channels == 4) dst[channels * i + 3] = static_cast<std::uint8_t>(bits >> 24);
  }
  cloud.columns.push_back(std::move(colors));
}

}  // namespace

PointCloud parse_pcd(std::span<const std::byte> bytes, const Source& src) {
  ByteReader r(bytes, src);
  const Header h = read_header(r, src);
  const std::vector<Field> fields = fields_of(h, src);

  std::uint64_t width = h.width, height = h.has_height ? h.height : 1;
  if (!h.has_width) {
    if (!h.has_points) src.fail("WIDTH and HEIGHT (or POINTS)", "neither");
    width = h.points;
    height = 1;
  }
  const std::uint64_t n = checked_mul(width, height, src, "WIDTH x HEIGHT");
  if (h.has_points && h.points != n)
    src.fail("POINTS = WIDTH x HEIGHT = " + std::to_string(width) + " x " + std::to_string(height) +
                 " = " + std::to_string(n),
             std::to_string(h.points));

  // point_bytes: a binary record; packed_bytes: what binary_compressed stores per point (PCL
  // leaves the "_" padding fields out of the field-major blocks).
  std::uint64_t point_bytes = 0, packed_bytes = 0, point_values = 0;
  for (const Field& f : fields) {
    const std::uint64_t bytes = checked_mul(f.size, f.count, src, "the point size");
    point_bytes = checked_add(point_bytes, bytes, src, "the point size");
    if (!f.padding) packed_bytes += bytes;
    point_values = checked_add(point_values, f.count, src, "the values per point");
  }
  const bool compressed_data = h.data == DataKind::binary_compressed;
  const std::uint64_t data_bytes =
      checked_mul(n, compressed_data ? packed_bytes : point_bytes, src, "the point data size");

  // Every size is checked against the bytes present before columns are allocated.
  const std::uint64_t data_offset = r.offset();
  std::uint64_t total_values = 0;
  std::uint32_t compressed = 0;
  if (h.data == DataKind::ascii) {
    total_values = checked_mul(n, point_values, src, "the number of ascii values");
    if (total_values > r.remaining())  // every value takes at least one byte
      src.fail(std::to_string(n) + " points x " + plural(point_values, "value") +
                   " of ascii data (at least one byte each)",
               plural(r.remaining(), "byte") + " of data");
  } else if (h.data == DataKind::binary) {
    if (data_bytes > r.remaining())
      src.fail(std::to_string(n) + " points x " + plural(point_bytes, "byte") + " = " +
                   plural(data_bytes, "byte") + " of binary data at offset " +
                   std::to_string(data_offset),
               plural(r.remaining(), "byte") + " (file truncated?)");
  } else {
    compressed = r.read<std::uint32_t>("the compressed size");
    const std::uint64_t uncompressed = r.read<std::uint32_t>("the uncompressed size");
    if (uncompressed != data_bytes)
      src.fail("an uncompressed size of " + std::to_string(n) + " points x " +
                   plural(packed_bytes, "byte") + " = " + std::to_string(data_bytes),
               std::to_string(uncompressed));
    if (compressed > r.remaining())
      src.fail(plural(compressed, "byte") + " of compressed data at offset " +
                   std::to_string(r.offset()),
               plural(r.remaining(), "byte") + " (file truncated?)");
    if (data_bytes > std::uint64_t{compressed} * kLzfMaxExpansion)
      src.fail("an uncompressed size LZF can reach from " + plural(compressed, "byte") +
                   " (at most " + std::to_string(kLzfMaxExpansion) + "x)",
               plural(data_bytes, "byte"));
  }

  PointCloud cloud;
  cloud.format = "pcd";
  cloud.num_points = static_cast<std::int64_t>(n);
  cloud.width = static_cast<std::int64_t>(width);
  cloud.height = static_cast<std::int64_t>(height);
  std::string sizes, types, counts;
  for (const Field& f : fields) {
    append_word(sizes, std::to_string(f.size));
    append_word(types, to_string(f.type));
    append_word(counts, std::to_string(f.count));
  }
  cloud.meta = {{"version", std::string(h.version)},
                {"fields", join(h.fields)},
                {"size", sizes},
                {"type", types},
                {"count", counts},
                {"width", std::to_string(width)},
                {"height", std::to_string(height)},
                {"viewpoint", join(h.viewpoint)},
                {"points", std::to_string(n)},
                {"data", std::string(h.data_word)}};

  std::vector<Column*> column_of(fields.size(), nullptr);
  cloud.columns.reserve(fields.size() + 2);
  for (std::size_t k = 0; k < fields.size(); ++k) {
    if (fields[k].padding) continue;
    cloud.columns.push_back(make_column(fields[k].name, fields[k].type,
                                        static_cast<std::int64_t>(fields[k].count),
                                        cloud.num_points));
    column_of[k] = &cloud.columns.back();
  }

  const std::int64_t np = cloud.num_points;
  if (h.data == DataKind::ascii) {
    TokenReader t(r.take(r.remaining(), "ascii data"), src);
    std::uint64_t read = 0;
    std::string_view token;
    for (std::int64_t i = 0; i < np; ++i) {
      for (std::size_t k = 0; k < fields.size(); ++k) {
        const Field& f = fields[k];
        std::byte scratch[8];
        std::byte* dst = column_of[k] ? column_ptr(*column_of[k], i) : nullptr;
        for (std::uint64_t c = 0; c < f.count; ++c, ++read) {
          if (!t.try_next(token))
            src.fail(std::to_string(total_values) + " ascii values (" + std::to_string(n) +
                         " points x " + std::to_string(point_values) + ")",
                     "the end of the data after " + plural(read, "value"));
          if (!parse_value(token, f.type, dst ? dst + c * f.size : scratch))
            fail_value(src, "field " + quote(f.name) + " of point " + std::to_string(i), f.type,
                       token);
        }
      }
    }
    if (t.has_more())
      src.fail(std::to_string(total_values) + " ascii values (" + std::to_string(n) + " points x " +
                   std::to_string(point_values) + ")",
               "more data after the last point");
  } else if (h.data == DataKind::binary) {
    const std::byte* base = r.take(data_bytes, "binary point data").data();
    std::uint64_t field_offset = 0;
    for (std::size_t k = 0; k < fields.size(); ++k) {
      const Field& f = fields[k];
      if (column_of[k]) {
        for (std::int64_t i = 0; i < np; ++i)
          copy_values(column_ptr(*column_of[k], i), base + i * point_bytes + field_offset, f.count,
                      f.type, /*big_endian=*/false);
      }
      field_offset += f.size * f.count;
    }
  } else {
    std::vector<std::byte> plain(static_cast<std::size_t>(data_bytes));
    lzf_decompress(r.take(compressed, "compressed point data"), plain, src);
    std::uint64_t block_offset = 0;
    for (std::size_t k = 0; k < fields.size(); ++k) {
      const Field& f = fields[k];
      if (!column_of[k]) continue;  // padding: not stored
      copy_values(static_cast<std::byte*>(column_of[k]->data.raw_data()),
                  plain.data() + block_offset, n * f.count, f.type, /*big_endian=*/false);
      block_offset += n * f.size * f.count;
    }
  }

  add_xyz(cloud);
  add_colors(cloud);
  return cloud;
}

}  // namespace lattice::io::detail
