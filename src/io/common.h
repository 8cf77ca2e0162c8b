// Bounded-reader helpers shared by the point-cloud readers (src/io/*.cpp).
//
// Every read goes through ByteReader / TokenReader, which check the bytes that are left before
// touching them and fail with "[read_<format>] <path>: expected ..., got ..."
// (lattice::ValueError). Sizes derived from header fields are multiplied and added with checked_mul
// / checked_add, and readers compare them with the bytes present before allocating outputs.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "lattice/io/io.h"

namespace lattice::io::detail {

// Names the reader and the file in every message.
struct Source {
  std::string_view op;  // "read_pcd"
  std::string path;

  [[noreturn]] void fail(std::string_view expected, std::string_view got) const;
};

// The whole file. The file size bounds every later allocation.
std::vector<std::byte> read_file(const Source& src);

// a * b and a + b, failing with "expected <what> to fit in 64 bits" on overflow.
std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, const Source& src,
                          std::string_view what);
std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, const Source& src,
                          std::string_view what);

// Header text as UTF-8: `text` itself when it is valid UTF-8, else its bytes read as Latin-1
// (ISO-8859-1, every byte one code point) and encoded as UTF-8. Never fails.
std::string header_text(std::string_view text);
bool is_utf8(std::string_view text);  // strict: no overlong forms, surrogates or > U+10FFFF

// 'text' for messages: quoted, non-printable bytes as \xNN, cut to `max` characters.
std::string quote(std::string_view text, std::size_t max = 48);
std::string quote(std::span<const std::byte> bytes, std::size_t max = 48);
std::string plural(std::uint64_t n, std::string_view unit);  // "1 byte", "3 bytes"
// Appends `sep` (when `s` is not empty) and `word`.
inline void append_word(std::string& s, std::string_view word, std::string_view sep = " ") {
  if (!s.empty()) s.append(sep);
  s.append(word);
}

// A T stored at p in little (big_endian false) or big endian order.
template <class T>
T load(const std::byte* p, bool big_endian) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::byte b[sizeof(T)];
  std::memcpy(b, p, sizeof(T));
  if (big_endian != (std::endian::native == std::endian::big)) std::reverse(b, b + sizeof(T));
  T v;
  std::memcpy(&v, b, sizeof(T));
  return v;
}

// Copies n values of `type` from file bytes `src` to `dst`, converting to host order.
void copy_values(std::byte* dst, const std::byte* src, std::uint64_t n, Scalar type,
                 bool big_endian);

class ByteReader {
 public:
  ByteReader(std::span<const std::byte> data, const Source& src) : data_(data), src_(src) {}

  std::uint64_t offset() const { return pos_; }
  std::uint64_t size() const { return data_.size(); }
  std::uint64_t remaining() const { return data_.size() - pos_; }
  const Source& source() const { return src_; }

  // n bytes at the current offset (advancing past them); fails when fewer are left.
  std::span<const std::byte> take(std::uint64_t n, std::string_view what);
  void skip(std::uint64_t n, std::string_view what) { take(n, what); }
  void seek(std::uint64_t offset, std::string_view what);
  template <class T>
  T read(std::string_view what, bool big_endian = false) {
    return load<T>(take(sizeof(T), what).data(), big_endian);
  }
  // A text line without its "\n" / "\r\n"; fails at the end of the data or past `max_length`.
  std::string_view line(std::string_view what, std::uint64_t max_length = 1u << 20);
  // Whether the remaining data starts a line at all (false at the end).
  bool at_end() const { return pos_ >= data_.size(); }

 private:
  std::span<const std::byte> data_;
  const Source& src_;
  std::uint64_t pos_ = 0;
};

// Whitespace-separated tokens of an ASCII body (line structure is not significant).
class TokenReader {
 public:
  TokenReader(std::span<const std::byte> text, const Source& src) : text_(text), src_(src) {}
  // The next token; fails with "expected <what>, got the end of the file" when none is left.
  std::string_view next(std::string_view what);
  // The next token into `out`, or false when none is left.
  bool try_next(std::string_view& out);
  // Whether any non-whitespace byte is left.
  bool has_more();
  std::uint64_t remaining_bytes() const { return text_.size() - pos_; }

 private:
  std::span<const std::byte> text_;
  const Source& src_;
  std::uint64_t pos_ = 0;
};

// Parses one ASCII value of `type` (integers: decimal, in the type's range; floats: decimal or
// nan/inf, float32 overflow gives inf) and stores it at dst in host byte order; false when the
// token is not such a value (dst untouched).
bool parse_value(std::string_view token, Scalar type, std::byte* dst);
// "expected <what> as <type> (...), got '<token>'".
[[noreturn]] void fail_value(const Source& src, std::string_view what, Scalar type,
                             std::string_view token);

// Splits a header line into whitespace-separated words.
std::vector<std::string_view> split_words(std::string_view line);
// A non-negative decimal integer header value (or fail naming `what`).
std::uint64_t parse_count(std::string_view word, const Source& src, std::string_view what);

// A column of n points x count values of type (uninitialised). Callers check n against the
// file's bytes first.
Column make_column(std::string name, Scalar type, std::int64_t count, std::int64_t n);

// Appends "xyz" (N, 3) when x, y, z are single-valued columns: float32 when all three are, else
// float64 (integers converted exactly up to 2^53). No-op when absent or already present.
void add_xyz(PointCloud& cloud);

// The byte offset of the `component` value of point i in a column (no checks).
inline std::byte* column_ptr(const Column& c, std::int64_t i) {
  return static_cast<std::byte*>(c.data.raw_data()) +
         static_cast<std::size_t>(i) * static_cast<std::size_t>(c.count) * size_of(c.type);
}

// Parsers over bytes in memory (the readers' whole work; read_* add the file read).
PointCloud parse_kitti(std::span<const std::byte> bytes, const Source& src);
PointCloud parse_las(std::span<const std::byte> bytes, const Source& src);
PointCloud parse_pcd(std::span<const std::byte> bytes, const Source& src);
PointCloud parse_ply(std::span<const std::byte> bytes, const Source& src);

// The most bytes LZF can produce per input byte: a 3-byte back reference yields 264 bytes.
inline constexpr std::uint64_t kLzfMaxExpansion = 88;
// Decompresses an LZF stream (the format of liblzf / PCL's binary_compressed) into exactly
// out.size() bytes; fails on a corrupt stream or a size mismatch.
void lzf_decompress(std::span<const std::byte> in, std::span<std::byte> out, const Source& src);

}  // namespace lattice::io::detail
