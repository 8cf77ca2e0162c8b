// Shared pieces of the point-cloud readers: the file read, checked arithmetic, bounded byte and
// token readers, ASCII value parsing, columns, and the format dispatch of io.h.
#include "common.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <system_error>

namespace lattice::io {

std::string_view to_string(Scalar type) {
  switch (type) {
    case Scalar::i8:
      return "int8";
    case Scalar::u8:
      return "uint8";
    case Scalar::i16:
      return "int16";
    case Scalar::u16:
      return "uint16";
    case Scalar::i32:
      return "int32";
    case Scalar::u32:
      return "uint32";
    case Scalar::i64:
      return "int64";
    case Scalar::u64:
      return "uint64";
    case Scalar::f32:
      return "float32";
    case Scalar::f64:
      return "float64";
  }
  return "?";
}

std::size_t size_of(Scalar type) {
  switch (type) {
    case Scalar::i8:
    case Scalar::u8:
      return 1;
    case Scalar::i16:
    case Scalar::u16:
      return 2;
    case Scalar::i32:
    case Scalar::u32:
    case Scalar::f32:
      return 4;
    case Scalar::i64:
    case Scalar::u64:
    case Scalar::f64:
      return 8;
  }
  return 0;
}

const Column* PointCloud::find(std::string_view name) const {
  for (const Column& c : columns)
    if (c.name == name) return &c;
  return nullptr;
}

std::string_view to_string(Format format) {
  switch (format) {
    case Format::kitti:
      return "kitti";
    case Format::las:
      return "las";
    case Format::pcd:
      return "pcd";
    case Format::ply:
      return "ply";
  }
  return "?";
}

namespace {

std::string_view op_of(Format format) {
  switch (format) {
    case Format::kitti:
      return "read_kitti";
    case Format::las:
      return "read_las";
    case Format::pcd:
      return "read_pcd";
    case Format::ply:
      return "read_ply";
  }
  return "read";
}

PointCloud parse_by_format(std::span<const std::byte> bytes, Format format,
                           const detail::Source& src) {
  switch (format) {
    case Format::kitti:
      return detail::parse_kitti(bytes, src);
    case Format::las:
      return detail::parse_las(bytes, src);
    case Format::pcd:
      return detail::parse_pcd(bytes, src);
    case Format::ply:
      return detail::parse_ply(bytes, src);
  }
  src.fail("a known format", "an unknown format id");
}

// Every reader's text output (column names, meta keys and values) leaves as UTF-8 (io.h): the
// parsers work on bytes (binary fields never go through text decoding), and only here is header
// text turned into strings a caller (or Python) can decode.
PointCloud parse_as(std::span<const std::byte> bytes, Format format, const detail::Source& src) {
  PointCloud cloud = parse_by_format(bytes, format, src);
  for (Column& c : cloud.columns) c.name = detail::header_text(c.name);
  for (auto& [key, value] : cloud.meta) {
    key = detail::header_text(key);
    value = detail::header_text(value);
  }
  return cloud;
}

}  // namespace

Format format_from_path(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".bin") return Format::kitti;
  if (ext == ".las") return Format::las;
  if (ext == ".pcd") return Format::pcd;
  if (ext == ".ply") return Format::ply;
  const detail::Source src{"read", path};
  if (ext == ".laz") src.fail("an uncompressed point cloud (LAZ is not supported)", "'.laz'");
  src.fail("a file ending in .bin, .las, .pcd or .ply",
           ext.empty() ? std::string("no extension") : detail::quote(ext));
}

PointCloud read_point_cloud(const std::string& path, std::optional<Format> format) {
  const Format f = format ? *format : format_from_path(path);
  const detail::Source src{op_of(f), path};
  const std::vector<std::byte> bytes = detail::read_file(src);
  return parse_as(bytes, f, src);
}

PointCloud parse_point_cloud(std::span<const std::byte> bytes, Format format,
                             const std::string& name) {
  const detail::Source src{op_of(format), name};
  return parse_as(bytes, format, src);
}

PointCloud read_las(const std::string& path) { return read_point_cloud(path, Format::las); }
PointCloud read_pcd(const std::string& path) { return read_point_cloud(path, Format::pcd); }
PointCloud read_ply(const std::string& path) { return read_point_cloud(path, Format::ply); }

}  // namespace lattice::io

namespace lattice::io::detail {

// Messages are valid UTF-8 text whatever the file holds: in a part built from raw header words
// (a keyword, a field list), control bytes (a NUL would cut the message short) and, unless the
// part is valid UTF-8, bytes >= 0x80 are escaped as \xNN, as quote() does. (Python turns a message
// that does not decode into a ValueError without any text.)
std::string message_text(std::string_view text) {
  const bool utf8 = is_utf8(text);
  std::string out;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= 0x20 && c < 0x7f) || (c >= 0x80 && utf8)) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

void Source::fail(std::string_view expected, std::string_view got) const {
  throw_value_error(op, path, message_text(expected), message_text(got));
}

std::vector<std::byte> read_file(const Source& src) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(src.path, ec);
  if (ec || !fs::exists(st))
    src.fail("an existing file", ec ? quote(ec.message()) : std::string("no such file"));
  if (!fs::is_regular_file(st))
    src.fail("a regular file", fs::is_directory(st) ? "a directory" : "a special file");
  const std::uintmax_t size = fs::file_size(src.path, ec);
  if (ec) src.fail("a readable file", quote(ec.message()));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(src.path.c_str(), "rb"),
                                                    &std::fclose);
  if (!f)
    src.fail("a readable file", quote(std::error_code(errno, std::generic_category()).message()));
  std::vector<std::byte> bytes(static_cast<std::size_t>(size));
  const std::size_t got = bytes.empty() ? 0 : std::fread(bytes.data(), 1, bytes.size(), f.get());
  if (got != bytes.size())
    src.fail(plural(bytes.size(), "byte") + " (the file size)", "a read of " + plural(got, "byte"));
  return bytes;
}

std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, const Source& src,
                          std::string_view what) {
  std::uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r))
    src.fail(std::string(what) + " to fit in 64 bits",
             std::to_string(a) + " x " + std::to_string(b) + " (overflow)");
  return r;
}

std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, const Source& src,
                          std::string_view what) {
  std::uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r))
    src.fail(std::string(what) + " to fit in 64 bits",
             std::to_string(a) + " + " + std::to_string(b) + " (overflow)");
  return r;
}

std::string quote(std::string_view text, std::size_t max) {
  std::string out = "'";
  std::size_t shown = 0;
  for (char ch : text) {
    if (shown == max) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
    ++shown;
  }
  return out + "'";
}

bool is_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // Lead byte -> sequence length and the allowed range of the first continuation byte
    // (Unicode Table 3-7: no overlong forms, no surrogates U+D800..DFFF, nothing above U+10FFFF).
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return false;  // 0x80..0xc1 (continuation or overlong lead) or 0xf5..0xff
    }
    if (n - i < len) return false;
    if (s[i + 1] < lo || s[i + 1] > hi) return false;
    for (std::size_t k = 2; k < len; ++k)
      if (s[i + k] < 0x80 || s[i + k] > 0xbf) return false;
    i += len;
  }
  return true;
}

std::string header_text(std::string_view text) {
  if (is_utf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() * 2);
  for (char ch : text) {  // Latin-1: byte b is code point U+00bb
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      out += static_cast<char>(0xc0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3f));
    }
  }
  return out;
}

std::string quote(std::span<const std::byte> bytes, std::size_t max) {
  return quote(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), max);
}

std::string plural(std::uint64_t n, std::string_view unit) {
  std::string s = std::to_string(n) + " " + std::string(unit);
  if (n == 1) return s;
  if (!unit.empty() && unit.back() == 'y') return s.substr(0, s.size() - 1) + "ies";
  return s + "s";
}

void copy_values(std::byte* dst, const std::byte* src, std::uint64_t n, Scalar type,
                 bool big_endian) {
  const std::size_t size = size_of(type);
  const bool swap = size > 1 && big_endian != (std::endian::native == std::endian::big);
  if (!swap) {
    if (n) std::memcpy(dst, src, static_cast<std::size_t>(n) * size);
    return;
  }
  for (std::uint64_t i = 0; i < n; ++i, dst += size, src += size)
    std::reverse_copy(src, src + size, dst);
}

// ---- ByteReader -------------------------------------------------------------------------------

std::span<const std::byte> ByteReader::take(std::uint64_t n, std::string_view what) {
  if (n > remaining())
    src_.fail(plural(n, "byte") + " of " + std::string(what) + " at offset " + std::to_string(pos_),
              plural(remaining(), "byte") + " (file truncated?)");
  auto out = data_.subspan(static_cast<std::size_t>(pos_), static_cast<std::size_t>(n));
  pos_ += n;
  return out;
}

void ByteReader::seek(std::uint64_t offset, std::string_view what) {
  if (offset > data_.size())
    src_.fail(std::string(what) + " within the file (" + plural(data_.size(), "byte") + ")",
              "offset " + std::to_string(offset));
  pos_ = offset;
}

std::string_view ByteReader::line(std::string_view what, std::uint64_t max_length) {
  if (at_end()) src_.fail(what, "the end of the file");
  const auto* begin = reinterpret_cast<const char*>(data_.data()) + pos_;
  const std::uint64_t left = remaining();
  const std::uint64_t limit = std::min(left, max_length + 1);
  const auto* nl =
      static_cast<const char*>(std::memchr(begin, '\n', static_cast<std::size_t>(limit)));
  std::uint64_t len = 0;
  if (nl) {
    len = static_cast<std::uint64_t>(nl - begin);
    pos_ += len + 1;
  } else if (left <= max_length) {
    len = left;  // the last line has no newline
    pos_ += len;
  } else {
    src_.fail(std::string(what) + " (a line of at most " + plural(max_length, "byte") + ")",
              "no line end in the next " + plural(max_length, "byte"));
  }
  if (len && begin[len - 1] == '\r') --len;
  return {begin, static_cast<std::size_t>(len)};
}

// ---- TokenReader ------------------------------------------------------------------------------

namespace {
bool is_space(std::byte b) {
  const auto c = static_cast<unsigned char>(b);
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
}  // namespace

bool TokenReader::has_more() {
  while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
  return pos_ < text_.size();
}

bool TokenReader::try_next(std::string_view& out) {
  if (!has_more()) return false;
  const std::uint64_t start = pos_;
  while (pos_ < text_.size() && !is_space(text_[pos_])) ++pos_;
  out = {reinterpret_cast<const char*>(text_.data()) + start,
         static_cast<std::size_t>(pos_ - start)};
  return true;
}

std::string_view TokenReader::next(std::string_view what) {
  std::string_view out;
  if (!try_next(out)) src_.fail(what, "the end of the file");
  return out;
}

// ---- values -----------------------------------------------------------------------------------

namespace {

template <class T>
void store(std::byte* dst, T v) {
  std::memcpy(dst, &v, sizeof(T));
}

template <class T>
bool parse_int(std::string_view t, T& out) {
  if (t.size() > 1 && t[0] == '+' && t[1] != '-') t.remove_prefix(1);
  const auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), out);
  return ec == std::errc() && p == t.data() + t.size();
}

template <class T, class Wide>
bool parse_narrow(std::string_view t, std::byte* dst) {
  Wide w{};
  if (!parse_int(t, w)) return false;
  if (w < static_cast<Wide>(std::numeric_limits<T>::min()) ||
      w > static_cast<Wide>(std::numeric_limits<T>::max()))
    return false;
  store(dst, static_cast<T>(w));
  return true;
}

// For a decimal number from_chars found out of range: +-inf when it overflows, +-0 when it
// underflows (as strtod gives), told apart by the decimal exponent of its leading digit.
double out_of_range_value(std::string_view t) {
  const bool negative = !t.empty() && t[0] == '-';
  if (negative) t.remove_prefix(1);
  const std::size_t e = t.find_first_of("eE");
  const std::string_view mantissa = t.substr(0, e);
  long long exponent = 0;
  if (e != std::string_view::npos) {
    std::string_view digits = t.substr(e + 1);
    if (!digits.empty() && digits[0] == '+') digits.remove_prefix(1);
    const auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), exponent);
    if (ec == std::errc::result_out_of_range)
      exponent = digits[0] == '-' ? -(1LL << 40) : (1LL << 40);
  }
  const std::size_t point = std::min(mantissa.find('.'), mantissa.size());
  const std::size_t first = mantissa.find_first_of("123456789");
  long long magnitude = 0;  // decimal exponent of the leading non-zero digit
  if (first != std::string_view::npos)
    magnitude = first < point ? static_cast<long long>(point - first) - 1
                              : -static_cast<long long>(first - point);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const double v = magnitude + exponent > 0 ? kInf : 0.0;
  return negative ? -v : v;
}

bool parse_double(std::string_view t, double& out) {
  if (t.size() > 1 && t[0] == '+' && t[1] != '-') t.remove_prefix(1);
  const auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), out);
  if (p != t.data() + t.size()) return false;
  if (ec == std::errc::result_out_of_range) {
    out = out_of_range_value(t);
    return true;
  }
  return ec == std::errc();
}

}  // namespace

bool parse_value(std::string_view token, Scalar type, std::byte* dst) {
  switch (type) {
    case Scalar::i8:
      return parse_narrow<std::int8_t, std::int64_t>(token, dst);
    case Scalar::u8:
      return parse_narrow<std::uint8_t, std::uint64_t>(token, dst);
    case Scalar::i16:
      return parse_narrow<std::int16_t, std::int64_t>(token, dst);
    case Scalar::u16:
      return parse_narrow<std::uint16_t, std::uint64_t>(token, dst);
    case Scalar::i32:
      return parse_narrow<std::int32_t, std::int64_t>(token, dst);
    case Scalar::u32:
      return parse_narrow<std::uint32_t, std::uint64_t>(token, dst);
    case Scalar::i64:
      return parse_narrow<std::int64_t, std::int64_t>(token, dst);
    case Scalar::u64:
      return parse_narrow<std::uint64_t, std::uint64_t>(token, dst);
    case Scalar::f32: {
      double d = 0;
      if (!parse_double(token, d)) return false;
      // Values at or beyond FLT_MAX + half an ulp round to inf (IEEE round to nearest).
      constexpr double kFloatOverflow = 0x1.fffffep127 + 0x1p103;
      constexpr float kInf = std::numeric_limits<float>::infinity();
      float f = std::fabs(d) >= kFloatOverflow ? (d > 0 ? kInf : -kInf) : static_cast<float>(d);
      if (std::isnan(d)) f = std::numeric_limits<float>::quiet_NaN();
      store(dst, f);
      return true;
    }
    case Scalar::f64: {
      double d = 0;
      if (!parse_double(token, d)) return false;
      store(dst, d);
      return true;
    }
  }
  return false;
}

void fail_value(const Source& src, std::string_view what, Scalar type, std::string_view token) {
  const bool floating = type == Scalar::f32 || type == Scalar::f64;
  src.fail(std::string(what) + " as " + std::string(to_string(type)) +
               (floating ? " (a decimal number, nan or inf)" : " (a decimal integer in range)"),
           quote(token));
}

std::vector<std::string_view> split_words(std::string_view line) {
  std::vector<std::string_view> words;
  std::size_t i = 0;
  const auto space = [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
  };
  while (i < line.size()) {
    while (i < line.size() && space(line[i])) ++i;
    const std::size_t start = i;
    while (i < line.size() && !space(line[i])) ++i;
    if (i > start) words.push_back(line.substr(start, i - start));
  }
  return words;
}

std::uint64_t parse_count(std::string_view word, const Source& src, std::string_view what) {
  std::uint64_t v = 0;
  const auto [p, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
  if (ec != std::errc() || p != word.data() + word.size())
    src.fail(std::string(what) + " as a non-negative integer", quote(word));
  return v;
}

Column make_column(std::string name, Scalar type, std::int64_t count, std::int64_t n) {
  Column c;
  c.name = std::move(name);
  c.type = type;
  c.count = count;
  c.data = Array::empty({n, count * static_cast<std::int64_t>(size_of(type))}, Dtype::u8);
  return c;
}

namespace {

double value_as_double(const std::byte* p, Scalar type) {
  switch (type) {
    case Scalar::i8:
      return load<std::int8_t>(p, false);
    case Scalar::u8:
      return load<std::uint8_t>(p, false);
    case Scalar::i16:
      return load<std::int16_t>(p, false);
    case Scalar::u16:
      return load<std::uint16_t>(p, false);
    case Scalar::i32:
      return load<std::int32_t>(p, false);
    case Scalar::u32:
      return load<std::uint32_t>(p, false);
    case Scalar::i64:
      return static_cast<double>(load<std::int64_t>(p, false));
    case Scalar::u64:
      return static_cast<double>(load<std::uint64_t>(p, false));
    case Scalar::f32:
      return load<float>(p, false);
    case Scalar::f64:
      return load<double>(p, false);
  }
  return 0;
}

}  // namespace

void add_xyz(PointCloud& cloud) {
  if (cloud.find("xyz")) return;
  const Column* axes[3] = {cloud.find("x"), cloud.find("y"), cloud.find("z")};
  for (const Column* a : axes)
    if (!a || a->count != 1) return;
  const bool f32 = std::all_of(std::begin(axes), std::end(axes),
                               [](const Column* a) { return a->type == Scalar::f32; });
  const std::int64_t n = cloud.num_points;
  Column xyz = make_column("xyz", f32 ? Scalar::f32 : Scalar::f64, 3, n);
  for (int k = 0; k < 3; ++k) {
    const auto* src = static_cast<const std::byte*>(axes[k]->data.raw_data());
    const std::size_t step = size_of(axes[k]->type);
    if (f32) {
      auto* dst = static_cast<float*>(xyz.data.raw_data());
      for (std::int64_t i = 0; i < n; ++i) std::memcpy(dst + 3 * i + k, src + i * step, 4);
    } else {
      auto* dst = static_cast<double*>(xyz.data.raw_data());
      for (std::int64_t i = 0; i < n; ++i)
        dst[3 * i + k] = value_as_double(src + i * step, axes[k]->type);
    }
  }
  cloud.columns.push_back(std::move(xyz));
}

}  // namespace lattice::io::detail
