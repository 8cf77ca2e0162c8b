// PLY 1.0 (Stanford polygon format): a text header ("ply", "format <kind> 1.0", comment/obj_info,
// "element <name> <count>", "property <type> <name>", "property list <count type> <item type>
// <name>", "end_header"), then the elements in header order: whitespace-separated text (ascii)
// or packed records (binary_little_endian / binary_big_endian).
//
// Only the "vertex" element is returned. Elements before it are parsed to be skipped: records of
// scalar properties have a fixed size and are skipped in one step; records with list properties
// are walked one by one (each list's length is read to find the next record), which costs at
// least one byte per record, so the walk is bounded by the file size.
#include <algorithm>

#include "common.h"

namespace lattice::io::detail {

namespace {

constexpr std::size_t kMaxElements = 10000;
constexpr std::size_t kMaxProperties = 10000;

struct Property {
  std::string name;
  bool is_list = false;
  Scalar type = Scalar::f32;       // scalar type, or the list's item type
  Scalar count_type = Scalar::u8;  // lists only
};

struct Element {
  std::string name;
  std::uint64_t count = 0;
  std::vector<Property> properties;
};

enum class Encoding { ascii, little_endian, big_endian };

struct Header {
  Encoding encoding = Encoding::ascii;
  std::string format_word;
  std::vector<Element> elements;
  std::string comments;
};

bool scalar_named(std::string_view t, Scalar& out) {
  static constexpr std::pair<std::string_view, Scalar> kNames[] = {
      {"char", Scalar::i8},     {"int8", Scalar::i8},     {"uchar", Scalar::u8},
      {"uint8", Scalar::u8},    {"short", Scalar::i16},   {"int16", Scalar::i16},
      {"ushort", Scalar::u16},  {"uint16", Scalar::u16},  {"int", Scalar::i32},
      {"int32", Scalar::i32},   {"uint", Scalar::u32},    {"uint32", Scalar::u32},
      {"float", Scalar::f32},   {"float32", Scalar::f32}, {"double", Scalar::f64},
      {"float64", Scalar::f64},
  };
  for (const auto& [name, type] : kNames)
    if (name == t) {
      out = type;
      return true;
    }
  return false;
}

Scalar type_of(std::string_view t, const Source& src) {
  Scalar s;
  if (!scalar_named(t, s))
    src.fail(
        "a PLY property type (char, uchar, short, ushort, int, uint, float, double, or int8 ... "
        "float64)",
        quote(t));
  return s;
}

bool is_integer(Scalar s) { return s != Scalar::f32 && s != Scalar::f64; }

Header read_header(ByteReader& r, const Source& src) {
  const std::string_view magic = r.at_end() ? std::string_view() : r.line("the PLY signature", 64);
  if (magic != "ply") src.fail("the PLY signature 'ply' on the first line", quote(magic));
  Header h;
  bool has_format = false;
  while (true) {
    const std::string_view line = r.line("a PLY header line (the header ends with end_header)");
    const std::vector<std::string_view> w = split_words(line);
    if (w.empty()) continue;
    const std::string_view key = w[0];
    if (key == "end_header") break;
    if (key == "comment" || key == "obj_info") {
      std::string_view text = line.substr(line.find(key) + key.size());
      const std::size_t start = text.find_first_not_of(" \t");
      text = start == std::string_view::npos ? std::string_view() : text.substr(start);
      append_word(h.comments, text, "\n");
    } else if (key == "format") {
      if (has_format) src.fail("one format line", "two");
      has_format = true;
      if (w.size() != 3)
        src.fail("'format <ascii|binary_little_endian|binary_big_endian> 1.0'", quote(line));
      if (w[1] == "ascii")
        h.encoding = Encoding::ascii;
      else if (w[1] == "binary_little_endian")
        h.encoding = Encoding::little_endian;
      else if (w[1] == "binary_big_endian")
        h.encoding = Encoding::big_endian;
      else
        src.fail("format ascii, binary_little_endian or binary_big_endian", quote(w[1]));
      if (w[2] != "1.0" && w[2] != "1") src.fail("PLY format version 1.0", quote(w[2]));
      h.format_word = std::string(w[1]);
    } else if (key == "element") {
      if (w.size() != 3) src.fail("'element <name> <count>'", quote(line));
      if (h.elements.size() == kMaxElements)
        src.fail("at most " + std::to_string(kMaxElements) + " elements", "more");
      h.elements.push_back(
          {std::string(w[1]), parse_count(w[2], src, "the count of element " + quote(w[1])), {}});
    } else if (key == "property") {
      if (h.elements.empty()) src.fail("an element line before the first property", quote(line));
      Element& e = h.elements.back();
      if (e.properties.size() == kMaxProperties)
        src.fail("at most " + std::to_string(kMaxProperties) + " properties per element", "more");
      Property p;
      if (w.size() >= 2 && w[1] == "list") {
        if (w.size() != 5) src.fail("'property list <count type> <item type> <name>'", quote(line));
        p.is_list = true;
        p.count_type = type_of(w[2], src);
        if (!is_integer(p.count_type))
          src.fail("an integer list count type for property " + quote(w[4]), quote(w[2]));
        p.type = type_of(w[3], src);
        p.name = std::string(w[4]);
      } else {
        if (w.size() != 3) src.fail("'property <type> <name>'", quote(line));
        p.type = type_of(w[1], src);
        p.name = std::string(w[2]);
      }
      for (const Property& q : e.properties)
        if (q.name == p.name)
          src.fail("distinct property names in element " + quote(e.name), quote(p.name) + " twice");
      e.properties.push_back(std::move(p));
    } else {
      src.fail("a PLY header keyword (format, comment, obj_info, element, property, end_header)",
               quote(key));
    }
  }
  if (!has_format) src.fail("a 'format' line in the PLY header", "none");
  return h;
}

// The size of a record without lists (`fixed`), or the least size with lists (count fields only).
std::uint64_t min_record_size(const Element& e, bool& fixed) {
  std::uint64_t size = 0;
  fixed = true;
  for (const Property& p : e.properties) {
    if (p.is_list) {
      fixed = false;
      size += size_of(p.count_type);
    } else {
      size += size_of(p.type);
    }
  }
  return size;
}

// A list length (an integer of the count type: PLY has no 64-bit types) as a non-negative count.
std::uint64_t list_length(const std::byte* p, Scalar type, bool big_endian, const Source& src,
                          const Element& e, const Property& prop) {
  std::int64_t v = 0;
  switch (type) {
    case Scalar::i8:
      v = load<std::int8_t>(p, big_endian);  // NOLINT(bugprone-signed-char-misuse): a signed count
      break;
    case Scalar::u8:
      v = load<std::uint8_t>(p, big_endian);
      break;
    case Scalar::i16:
      v = load<std::int16_t>(p, big_endian);
      break;
    case Scalar::u16:
      v = load<std::uint16_t>(p, big_endian);
      break;
    case Scalar::i32:
      v = load<std::int32_t>(p, big_endian);
      break;
    case Scalar::u32:
      v = load<std::uint32_t>(p, big_endian);
      break;
    default:
      break;
  }
  if (v < 0)
    src.fail("a non-negative list length of property " + quote(prop.name) + " in element " +
                 quote(e.name),
             std::to_string(v));
  return static_cast<std::uint64_t>(v);
}

void skip_binary(ByteReader& r, const Element& e, bool big_endian, const Source& src) {
  bool fixed = false;
  const std::uint64_t record = min_record_size(e, fixed);
  const std::string what = "element " + quote(e.name);
  if (fixed) {
    r.skip(checked_mul(e.count, record, src, "the size of " + what),
           what + " (" + std::to_string(e.count) + " records)");
    return;
  }
  for (std::uint64_t i = 0; i < e.count; ++i)  // each record takes >= 1 byte: bounded by the file
    for (const Property& p : e.properties) {
      if (!p.is_list) {
        r.skip(size_of(p.type), what);
        continue;
      }
      const std::uint64_t len = list_length(r.take(size_of(p.count_type), what).data(),
                                            p.count_type, big_endian, src, e, p);
      r.skip(checked_mul(len, size_of(p.type), src, "a list size"), what);
    }
}

void skip_ascii(TokenReader& t, const Element& e, const Source& src) {
  if (e.properties.empty()) return;  // records without properties hold no tokens
  const std::string what = "a value of element " + quote(e.name);
  std::string_view token;
  for (std::uint64_t i = 0; i < e.count; ++i)  // each record takes >= 1 token: bounded by the file
    for (const Property& p : e.properties) {
      token = t.next(what);
      if (!p.is_list) continue;
      std::uint64_t len = 0;
      std::byte scratch[8];
      if (!parse_value(token, Scalar::u64, scratch))
        src.fail("a non-negative list length of property " + quote(p.name) + " in element " +
                     quote(e.name),
                 quote(token));
      std::memcpy(&len, scratch, 8);
      for (std::uint64_t k = 0; k < len; ++k) t.next(what);
    }
}

void add_colors(PointCloud& cloud) {
  if (cloud.find("colors")) return;
  const Column* ch[4] = {cloud.find("red"), cloud.find("green"), cloud.find("blue"),
                         cloud.find("alpha")};
  for (int k = 0; k < 3; ++k)
    if (!ch[k] || ch[k]->type != Scalar::u8 || ch[k]->count != 1) return;
  const int channels = ch[3] && ch[3]->type == Scalar::u8 && ch[3]->count == 1 ? 4 : 3;
  Column colors = make_column("colors", Scalar::u8, channels, cloud.num_points);
  auto* dst = static_cast<std::uint8_t*>(colors.data.raw_data());
  for (int k = 0; k < channels; ++k) {
    const auto* src = static_cast<const std::uint8_t*>(ch[k]->data.raw_data());
    for (std::int64_t i = 0; i < cloud.num_points; ++i) dst[channels * i + k] = src[i];
  }
  cloud.columns.push_back(std::move(colors));
}

}  // namespace

PointCloud parse_ply(std::span<const std::byte> bytes, const Source& src) {
  ByteReader r(bytes, src);
  const Header h = read_header(r, src);

  const auto vertex_it = std::find_if(h.elements.begin(), h.elements.end(),
                                      [](const Element& e) { return e.name == "vertex"; });
  if (vertex_it == h.elements.end()) {
    std::string names;
    for (const Element& e : h.elements) append_word(names, quote(e.name), ", ");
    src.fail("an element named 'vertex'", names.empty() ? "no elements" : "elements " + names);
  }
  const Element& vertex = *vertex_it;
  for (const char* axis : {"x", "y", "z"}) {
    const auto it = std::find_if(vertex.properties.begin(), vertex.properties.end(),
                                 [&](const Property& p) { return p.name == axis; });
    if (it == vertex.properties.end() || it->is_list)
      src.fail("scalar vertex properties x, y and z", std::string("no scalar '") + axis + "'");
  }
  const auto n = vertex.count;
  std::uint64_t scalar_count = 0;
  for (const Property& p : vertex.properties) scalar_count += p.is_list ? 0 : 1;

  PointCloud cloud;
  cloud.format = "ply";
  std::string elements;
  for (const Element& e : h.elements)
    append_word(elements, e.name + " " + std::to_string(e.count), ", ");
  cloud.meta = {{"format", h.format_word},
                {"version", "1.0"},
                {"elements", elements},
                {"comments", h.comments}};

  const bool big_endian = h.encoding == Encoding::big_endian;
  const std::size_t vertex_index = static_cast<std::size_t>(vertex_it - h.elements.begin());
  std::vector<Column*> column_of(vertex.properties.size(), nullptr);
  const auto allocate = [&] {
    // Callers have checked n against the bytes left, so n fits in int64.
    cloud.num_points = static_cast<std::int64_t>(n);
    cloud.width = cloud.num_points;
    cloud.columns.reserve(vertex.properties.size() + 2);
    for (std::size_t k = 0; k < vertex.properties.size(); ++k) {
      const Property& p = vertex.properties[k];
      if (p.is_list) continue;
      cloud.columns.push_back(make_column(p.name, p.type, 1, cloud.num_points));
      column_of[k] = &cloud.columns.back();
    }
  };

  if (h.encoding == Encoding::ascii) {
    TokenReader t(r.take(r.remaining(), "ascii data"), src);
    for (std::size_t e = 0; e < vertex_index; ++e) skip_ascii(t, h.elements[e], src);
    if (checked_mul(n, scalar_count, src, "the number of vertex values") > t.remaining_bytes())
      src.fail(std::to_string(n) + " vertices x " + plural(scalar_count, "value") +
                   " of ascii data (at least one byte each)",
               plural(t.remaining_bytes(), "byte") + " left");
    allocate();
    std::string_view token;
    for (std::int64_t i = 0; i < cloud.num_points; ++i)
      for (std::size_t k = 0; k < vertex.properties.size(); ++k) {
        const Property& p = vertex.properties[k];
        if (!t.try_next(token))
          src.fail("property " + quote(p.name) + " of vertex " + std::to_string(i) + " (of " +
                       std::to_string(n) + ")",
                   "the end of the file");
        if (!p.is_list) {
          if (!parse_value(token, p.type, column_ptr(*column_of[k], i)))
            fail_value(src, "property " + quote(p.name) + " of vertex " + std::to_string(i), p.type,
                       token);
          continue;
        }
        std::byte scratch[8];
        if (!parse_value(token, Scalar::u64, scratch))
          src.fail("a non-negative list length of vertex property " + quote(p.name), quote(token));
        std::uint64_t len = 0;
        std::memcpy(&len, scratch, 8);
        for (std::uint64_t j = 0; j < len; ++j) t.next("an item of vertex list " + quote(p.name));
      }
  } else {
    for (std::size_t e = 0; e < vertex_index; ++e) skip_binary(r, h.elements[e], big_endian, src);
    bool fixed = false;
    const std::uint64_t record = min_record_size(vertex, fixed);
    const std::uint64_t need = checked_mul(n, record, src, "the vertex data size");
    if (need > r.remaining())
      src.fail(std::to_string(n) + " vertices x " + plural(record, "byte") +
                   (fixed ? "" : " (at least)") + " = " + plural(need, "byte") + " at offset " +
                   std::to_string(r.offset()),
               plural(r.remaining(), "byte") + " (file truncated?)");
    allocate();
    for (std::int64_t i = 0; i < cloud.num_points; ++i)
      for (std::size_t k = 0; k < vertex.properties.size(); ++k) {
        const Property& p = vertex.properties[k];
        if (!p.is_list) {
          copy_values(column_ptr(*column_of[k], i), r.take(size_of(p.type), "vertex data").data(),
                      1, p.type, big_endian);
          continue;
        }
        const std::uint64_t len = list_length(r.take(size_of(p.count_type), "vertex data").data(),
                                              p.count_type, big_endian, src, vertex, p);
        r.skip(checked_mul(len, size_of(p.type), src, "a list size"),
               "vertex list " + quote(p.name));
      }
  }

  add_xyz(cloud);
  add_colors(cloud);
  return cloud;
}

}  // namespace lattice::io::detail
