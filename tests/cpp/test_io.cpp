// Specification tests for the point-cloud readers (include/lattice/io/io.h, src/io): the LZF
// decoder on hand-made streams, each format on small files built here (values checked), the
// error messages of representative malformed inputs, an in-process sweep of truncations and byte
// flips (only lattice::ValueError may come out), and the shared real files when present.
// tests/python/test_io.py and test_io_fuzz.py cover every variant and error branch from Python.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "io/common.h"
#include "lattice/core/error.h"
#include "lattice/io/io.h"

namespace lattice::io {
namespace {

using Bytes = std::vector<std::byte>;

template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception, none was thrown";
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

Bytes bytes_of(std::string_view s) {
  Bytes b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

template <class T>
void put(Bytes& b, T v, bool big_endian = false) {
  std::byte tmp[sizeof(T)];
  std::memcpy(tmp, &v, sizeof(T));
  if (big_endian) std::reverse(tmp, tmp + sizeof(T));
  b.insert(b.end(), tmp, tmp + sizeof(T));
}

template <class T>
void put_at(Bytes& b, std::size_t offset, T v) {
  std::memcpy(b.data() + offset, &v, sizeof(T));
}

std::filesystem::path temp_file(const std::string& name, const Bytes& data) {
  const auto dir = std::filesystem::temp_directory_path() / "lattice_test_io";
  std::filesystem::create_directories(dir);
  const auto path = dir / name;
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  return path;
}

template <class T>
std::vector<T> column(const PointCloud& c, std::string_view name) {
  const Column* col = c.find(name);
  if (!col) {
    ADD_FAILURE() << "no column " << name;
    return {};
  }
  auto v = col->values<T>();
  return {v.begin(), v.end()};
}

// ---- LZF ---------------------------------------------------------------------------------------

std::string lzf(const Bytes& in, std::size_t out_size) {
  const detail::Source src{"read_pcd", "mem.pcd"};
  Bytes out(out_size);
  detail::lzf_decompress(in, out, src);
  return {reinterpret_cast<const char*>(out.data()), out.size()};
}

TEST(IoLzf, LiteralRunsAndBackReferencesDecode) {
  // "abc" literal, then a back reference of length 2 + 4 = 6 at distance 3: "abcabcabc".
  EXPECT_EQ(lzf({std::byte{2}, std::byte{'a'}, std::byte{'b'}, std::byte{'c'}, std::byte{4 << 5},
                 std::byte{2}},
                9),
            "abcabcabc");
  // Long reference: length field 7 + 10 = 17, + 2 = 19 bytes of 'x' from distance 1 (a run).
  EXPECT_EQ(lzf({std::byte{0}, std::byte{'x'}, std::byte{7 << 5}, std::byte{10}, std::byte{0}}, 20),
            std::string(20, 'x'));
  EXPECT_EQ(lzf({}, 0), "");
}

TEST(IoLzf, CorruptStreamsFailWithValueError) {
  const auto msg = [](Bytes in, std::size_t n) {
    return message_of<ValueError>([&] { lzf(in, n); });
  };
  EXPECT_TRUE(contains(msg({std::byte{1 << 5}, std::byte{0}}, 3), "before the start"))
      << msg({std::byte{1 << 5}, std::byte{0}}, 3);
  EXPECT_TRUE(contains(msg({std::byte{5}, std::byte{'a'}}, 6), "literal run of 6 bytes cut off"));
  EXPECT_TRUE(contains(msg({std::byte{1}, std::byte{'a'}, std::byte{'b'}}, 1), "more output"));
  EXPECT_TRUE(contains(msg({std::byte{0}, std::byte{'a'}}, 2),
                       "expected LZF data that decompresses to 2 bytes, got 1 byte"));
  EXPECT_TRUE(contains(msg({std::byte{0}, std::byte{'a'}, std::byte{7 << 5}}, 40), "cut off"));
  EXPECT_TRUE(contains(msg({std::byte{0}, std::byte{'a'}, std::byte{1 << 5}}, 40), "cut off"));
  EXPECT_TRUE(contains(msg({std::byte{0}, std::byte{'a'}, std::byte{1 << 5}, std::byte{0}}, 3),
                       "more output"));
}

// ---- KITTI -------------------------------------------------------------------------------------

TEST(IoKitti, ScanAndLabelsDecode) {
  Bytes scan;
  for (float v : {1.5f, -2.0f, 0.25f, 0.5f, 3.0f, 4.0f, -5.0f, 1.0f}) put(scan, v);
  const Array a = read_kitti(temp_file("scan.bin", scan).string());
  ASSERT_EQ(a.shape(), (Shape{2, 4}));
  EXPECT_EQ(a.dtype(), Dtype::f32);
  EXPECT_EQ(a.data<float>()[1], -2.0f);
  EXPECT_EQ(a.data<float>()[6], -5.0f);
  Bytes labels;
  put<std::uint32_t>(labels, (7u << 16) | 10u);
  put<std::uint32_t>(labels, 40u);
  const KittiLabels l = read_kitti_labels(temp_file("scan.label", labels).string());
  EXPECT_EQ(l.semantic.data<std::int64_t>()[0], 10);
  EXPECT_EQ(l.instance.data<std::int64_t>()[0], 7);
  EXPECT_EQ(l.semantic.data<std::int64_t>()[1], 40);
  const PointCloud c = read_point_cloud(temp_file("scan.bin", scan).string());
  EXPECT_EQ(c.num_points, 2);
  EXPECT_EQ(column<float>(c, "xyz"), (std::vector<float>{1.5f, -2.0f, 0.25f, 3.0f, 4.0f, -5.0f}));
  EXPECT_EQ(column<float>(c, "reflectance"), (std::vector<float>{0.5f, 1.0f}));
}

TEST(IoKitti, SizeNotAMultipleOf16NamesFileAndSize) {
  const std::string path = temp_file("bad.bin", Bytes(17)).string();
  const std::string m = message_of<ValueError>([&] { read_kitti(path); });
  EXPECT_EQ(m, "[read_kitti] " + path +
                   ": expected a file size that is a multiple of 16 bytes (4 float32 per point), "
                   "got 17 bytes");
  EXPECT_TRUE(contains(
      message_of<ValueError>([&] { read_kitti_labels(temp_file("bad.label", Bytes(6)).string()); }),
      "multiple of 4 bytes"));
}

TEST(IoFiles, MissingFileAndUnknownExtensionAreValueErrors) {
  EXPECT_TRUE(contains(message_of<ValueError>([] { read_pcd("/nonexistent/x.pcd"); }),
                       "[read_pcd] /nonexistent/x.pcd: expected an existing file"));
  EXPECT_TRUE(
      contains(message_of<ValueError>([] { read_point_cloud("cloud.xyz"); }),
               "[read] cloud.xyz: expected a file ending in .bin, .las, .pcd or .ply, got '.xyz'"));
  EXPECT_TRUE(contains(message_of<ValueError>([] { read_point_cloud("cloud.LAZ"); }),
                       "LAZ is not supported"));
  EXPECT_EQ(format_from_path("A.PLY"), Format::ply);
}

// ---- LAS ---------------------------------------------------------------------------------------

// A LAS file of `n` points of `format` (version 1.minor), record length min + extra.
Bytes make_las(int minor, int format, int n, int extra = 0) {
  const int header = minor >= 4 ? 375 : minor == 3 ? 235 : 227;
  const int min_len[] = {20, 28, 26, 34, 0, 0, 30, 36, 38};
  const int len = min_len[format] + extra;
  Bytes b(static_cast<std::size_t>(header + 10),
          std::byte{0});  // 10 bytes of padding (a fake VLR area)
  std::memcpy(b.data(), "LASF", 4);
  b[24] = std::byte{1};
  b[25] = static_cast<std::byte>(minor);
  put_at<std::uint16_t>(b, 94, static_cast<std::uint16_t>(header));
  put_at<std::uint32_t>(b, 96, static_cast<std::uint32_t>(header + 10));
  b[104] = static_cast<std::byte>(format);
  put_at<std::uint16_t>(b, 105, static_cast<std::uint16_t>(len));
  put_at<std::uint32_t>(b, 107, minor >= 4 && format >= 6 ? 0u : static_cast<std::uint32_t>(n));
  for (int k = 0; k < 3; ++k) {
    put_at<double>(b, 131 + 8 * k, 0.01);
    put_at<double>(b, 155 + 8 * k, 100.0 * (k + 1));
  }
  if (minor >= 4) put_at<std::uint64_t>(b, 247, static_cast<std::uint64_t>(n));
  for (int i = 0; i < n; ++i) {
    Bytes rec(static_cast<std::size_t>(len), std::byte{0});
    for (int k = 0; k < 3; ++k) put_at<std::int32_t>(rec, 4 * k, (i + 1) * (k == 1 ? -7 : 5));
    put_at<std::uint16_t>(rec, 12, static_cast<std::uint16_t>(1000 + i));
    if (format >= 6) {
      rec[14] = std::byte{0x32};  // return 2 of 3
      rec[16] = std::byte{200};   // a class above 31: formats 6-8 keep the whole byte
      put_at<std::uint16_t>(rec, 20, 77);
      put_at<double>(rec, 22, 1.25 * i);
    } else {
      rec[14] = std::byte{0x1a};  // return 2 of 3: 0b011'010
      rec[15] = std::byte{0xe2};  // flags 0b111 + class 2
      put_at<std::uint16_t>(rec, 18, 77);
      if (format == 1 || format == 3) put_at<double>(rec, 20, 1.25 * i);
    }
    const int rgb = format == 2 ? 20 : format == 3 ? 28 : format >= 7 ? 30 : 0;
    if (rgb)
      for (int k = 0; k < 3; ++k)
        put_at<std::uint16_t>(rec, rgb + 2 * k, static_cast<std::uint16_t>(256 * (k + 1) + i));
    if (format == 8) put_at<std::uint16_t>(rec, 36, 4242);
    b.insert(b.end(), rec.begin(), rec.end());
  }
  return b;
}

PointCloud las(const Bytes& b) { return parse_point_cloud(b, Format::las, "mem.las"); }

TEST(IoLas, Format3Version12Decodes) {
  const PointCloud c = las(make_las(2, 3, 3, /*extra=*/4));
  ASSERT_EQ(c.num_points, 3);
  const auto xyz = column<double>(c, "xyz");
  EXPECT_DOUBLE_EQ(xyz[3], 2 * 5 * 0.01 + 100.0);
  EXPECT_DOUBLE_EQ(xyz[4], 2 * -7 * 0.01 + 200.0);
  EXPECT_EQ(column<std::uint16_t>(c, "intensity"), (std::vector<std::uint16_t>{1000, 1001, 1002}));
  EXPECT_EQ(column<std::uint8_t>(c, "classification")[0], 2);
  EXPECT_EQ(column<std::uint8_t>(c, "return_number")[0], 2);
  EXPECT_EQ(column<std::uint8_t>(c, "number_of_returns")[0], 3);
  EXPECT_EQ(column<std::uint16_t>(c, "point_source_id")[2], 77);
  EXPECT_DOUBLE_EQ(column<double>(c, "gps_time")[2], 2.5);
  EXPECT_EQ(column<std::uint16_t>(c, "rgb")[3 * 1 + 2], 3 * 256 + 1);
  EXPECT_EQ(c.find("nir"), nullptr);
}

TEST(IoLas, Format8Version14Decodes) {
  const PointCloud c = las(make_las(4, 8, 2));
  ASSERT_EQ(c.num_points, 2);
  EXPECT_EQ(column<std::uint8_t>(c, "classification")[1], 200);
  EXPECT_EQ(column<std::uint8_t>(c, "return_number")[1], 2);
  EXPECT_EQ(column<std::uint8_t>(c, "number_of_returns")[1], 3);
  EXPECT_EQ(column<std::uint16_t>(c, "nir")[0], 4242);
  EXPECT_DOUBLE_EQ(column<double>(c, "gps_time")[1], 1.25);
}

TEST(IoLas, HugeClaimedCountFailsBeforeAllocating) {
  Bytes b = make_las(4, 6, 1);
  put_at<std::uint64_t>(b, 247, 1'000'000'000'000ull);
  const std::string m = message_of<ValueError>([&] { las(b); });
  EXPECT_TRUE(contains(m, "[read_las] mem.las: expected 1000000000000 points x 30 bytes")) << m;
  put_at<std::uint64_t>(b, 247, ~0ull);
  EXPECT_TRUE(contains(message_of<ValueError>([&] { las(b); }), "to fit in 64 bits"));
}

TEST(IoLas, WrongMagicAndLazFail) {
  Bytes b = make_las(2, 0, 1);
  b[104] = std::byte{0x83};
  EXPECT_TRUE(contains(message_of<ValueError>([&] { las(b); }), "LAZ is not supported"));
  b[0] = std::byte{'X'};
  EXPECT_EQ(message_of<ValueError>([&] { las(b); }),
            "[read_las] mem.las: expected the LAS signature 'LASF', got 'XASF'");
}

// ---- PCD ---------------------------------------------------------------------------------------

const char* kPcdHeader =
    "# .PCD v0.7 - Point Cloud Data file format\n"
    "VERSION 0.7\nFIELDS x y z rgb normal\nSIZE 4 4 4 4 2\nTYPE F F F U I\nCOUNT 1 1 1 1 2\n"
    "WIDTH 2\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS 2\n";

TEST(IoPcd, AsciiWithCountAndPackedRgbDecodes) {
  const std::string text =
      std::string(kPcdHeader) + "DATA ascii\n1 2 3 16711935 -1 2\nnan inf -0.5 255 3 -4\n";
  const PointCloud c = parse_point_cloud(bytes_of(text), Format::pcd, "mem.pcd");
  ASSERT_EQ(c.num_points, 2);
  EXPECT_EQ(column<std::int16_t>(c, "normal"), (std::vector<std::int16_t>{-1, 2, 3, -4}));
  EXPECT_EQ(c.find("normal")->count, 2);
  const auto xyz = column<float>(c, "xyz");
  EXPECT_TRUE(std::isnan(xyz[3]));
  EXPECT_TRUE(std::isinf(xyz[4]));
  EXPECT_EQ(column<std::uint8_t>(c, "colors"), (std::vector<std::uint8_t>{255, 0, 255, 0, 0, 255}));
}

// kPcdHeader's two points as DATA binary, or binary_compressed (two LZF literal runs).
Bytes make_pcd_binary(bool compressed) {
  const float xs[2][3] = {{1, 2, 3}, {4, 5, 6}};
  if (!compressed) {
    Bytes b = bytes_of(std::string(kPcdHeader) + "DATA binary\n");
    for (int i = 0; i < 2; ++i) {
      for (float v : xs[i]) put(b, v);
      put<std::uint32_t>(b, 0x00102030u + i);
      put<std::int16_t>(b, static_cast<std::int16_t>(-i));
      put<std::int16_t>(b, 9);
    }
    return b;
  }
  Bytes field_major;
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < 2; ++i) put(field_major, xs[i][k]);
  for (int i = 0; i < 2; ++i) put<std::uint32_t>(field_major, 0x00102030u + i);
  for (int i = 0; i < 2; ++i) {
    put<std::int16_t>(field_major, static_cast<std::int16_t>(-i));
    put<std::int16_t>(field_major, 9);
  }
  Bytes b = bytes_of(std::string(kPcdHeader) + "DATA binary_compressed\n");
  put<std::uint32_t>(b, static_cast<std::uint32_t>(field_major.size() + 2));
  put<std::uint32_t>(b, static_cast<std::uint32_t>(field_major.size()));
  b.push_back(std::byte{31});
  b.insert(b.end(), field_major.begin(), field_major.begin() + 32);
  b.push_back(static_cast<std::byte>(field_major.size() - 32 - 1));
  b.insert(b.end(), field_major.begin() + 32, field_major.end());
  return b;
}

TEST(IoPcd, BinaryAndCompressedDecodeAlike) {
  const Bytes binary = make_pcd_binary(false);
  const Bytes compressed = make_pcd_binary(true);
  for (const Bytes* b : {&binary, &compressed}) {
    const PointCloud c = parse_point_cloud(*b, Format::pcd, "mem.pcd");
    EXPECT_EQ(column<float>(c, "xyz"), (std::vector<float>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(column<std::uint32_t>(c, "rgb")[1], 0x00102031u);
    EXPECT_EQ(column<std::int16_t>(c, "normal"), (std::vector<std::int16_t>{0, 9, -1, 9}));
  }
}

TEST(IoPcd, HeaderErrorsNameTheProblem) {
  const auto msg = [](const std::string& text) {
    return message_of<ValueError>([&] { parse_point_cloud(bytes_of(text), Format::pcd, "m.pcd"); });
  };
  EXPECT_EQ(msg("ply\n"),
            "[read_pcd] m.pcd: expected a PCD header starting with 'VERSION 0.7' (after # "
            "comments), got 'ply'");
  EXPECT_TRUE(contains(msg("VERSION 0.7\nFIELDS x\nSIZE 4\nTYPE Q\nWIDTH 1\nDATA ascii\n1\n"),
                       "got TYPE 'Q' SIZE '4'"));
  EXPECT_TRUE(
      contains(msg("VERSION 0.7\nFIELDS x\nSIZE 4\nTYPE F\nWIDTH 1000000000000\nDATA binary\n"),
               "expected 1000000000000 points x 4 bytes = 4000000000000 bytes of binary data"));
  EXPECT_TRUE(contains(msg("VERSION 0.7\nFIELDS x\nSIZE 4\nTYPE F\nWIDTH 4294967296\nHEIGHT "
                           "4294967296\nDATA binary\n"),
                       "WIDTH x HEIGHT to fit in 64 bits"));
}

// ---- PLY ---------------------------------------------------------------------------------------

Bytes make_ply(const std::string& format, bool big_endian) {
  std::string header =
      "ply\nformat " + format +
      " 1.0\ncomment made by test_io\n"
      "element face 2\nproperty list uchar int vertex_indices\n"
      "element vertex 2\nproperty float x\nproperty float y\nproperty double z\n"
      "property uchar red\nproperty uchar green\nproperty uchar blue\nproperty ushort quality\n"
      "end_header\n";
  if (format == "ascii")
    return bytes_of(header + "3 0 1 2\n4 0 1 2 3\n1 2 3 10 20 30 65535\n-4 5.5 -6 1 2 3 7\n");
  Bytes b = bytes_of(header);
  b.push_back(std::byte{3});
  for (std::int32_t v : {0, 1, 2}) put(b, v, big_endian);
  b.push_back(std::byte{4});
  for (std::int32_t v : {0, 1, 2, 3}) put(b, v, big_endian);
  put(b, 1.0f, big_endian), put(b, 2.0f, big_endian), put(b, 3.0, big_endian);
  for (int v : {10, 20, 30}) b.push_back(static_cast<std::byte>(v));
  put<std::uint16_t>(b, 65535, big_endian);
  put(b, -4.0f, big_endian), put(b, 5.5f, big_endian), put(b, -6.0, big_endian);
  for (int v : {1, 2, 3}) b.push_back(static_cast<std::byte>(v));
  put<std::uint16_t>(b, 7, big_endian);
  return b;
}

TEST(IoPly, AsciiAndBinaryBothEndiansDecodeAlike) {
  for (const auto& [format, be] :
       {std::pair{"ascii", false}, {"binary_little_endian", false}, {"binary_big_endian", true}}) {
    const PointCloud c = parse_point_cloud(make_ply(format, be), Format::ply, "m.ply");
    ASSERT_EQ(c.num_points, 2) << format;
    EXPECT_EQ(column<double>(c, "xyz"), (std::vector<double>{1, 2, 3, -4, 5.5, -6})) << format;
    EXPECT_EQ(column<std::uint16_t>(c, "quality"), (std::vector<std::uint16_t>{65535, 7}))
        << format;
    EXPECT_EQ(column<std::uint8_t>(c, "colors"), (std::vector<std::uint8_t>{10, 20, 30, 1, 2, 3}))
        << format;
  }
}

TEST(IoPly, NoVertexAndUnknownTypeFail) {
  const auto msg = [](const std::string& text) {
    return message_of<ValueError>([&] { parse_point_cloud(bytes_of(text), Format::ply, "m.ply"); });
  };
  EXPECT_EQ(msg("ply\nformat ascii 1.0\nelement face 0\nproperty list uchar int i\nend_header\n"),
            "[read_ply] m.ply: expected an element named 'vertex', got elements 'face'");
  EXPECT_TRUE(
      contains(msg("ply\nformat ascii 1.0\nelement vertex 1\nproperty int128 x\nend_header\n"),
               "got 'int128'"));
  EXPECT_TRUE(
      contains(msg("PLY\n"), "expected the PLY signature 'ply' on the first line, got 'PLY'"));
}

// ---- robustness: every truncation and many byte flips give a result or a ValueError ------------

TEST(IoRobustness, TruncationsAndByteFlipsOnlyRaiseValueError) {
  std::vector<std::pair<Format, Bytes>> samples = {
      {Format::las, make_las(2, 3, 2)},
      {Format::las, make_las(4, 7, 2)},
      {Format::ply, make_ply("ascii", false)},
      {Format::ply, make_ply("binary_big_endian", true)},
      {Format::pcd, bytes_of(std::string(kPcdHeader) + "DATA ascii\n1 2 3 4 5 6\n7 8 9 1 2 3\n")},
      {Format::pcd, make_pcd_binary(false)},
      {Format::pcd, make_pcd_binary(true)},
      {Format::kitti, Bytes(64, std::byte{1})},
  };
  std::mt19937 rng(1234);
  int cases = 0, errors = 0;
  const auto run = [&](Format f, const Bytes& b) {
    ++cases;
    try {
      parse_point_cloud(b, f, "fuzz");
    } catch (const ValueError&) {
      ++errors;
    }
  };
  for (const auto& [f, b] : samples) {
    for (std::size_t cut = 0; cut < b.size(); ++cut) run(f, Bytes(b.begin(), b.begin() + cut));
    for (int k = 0; k < 300; ++k) {
      Bytes m = b;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int j = 0; j < flips; ++j) m[rng() % m.size()] = static_cast<std::byte>(rng() & 0xff);
      run(f, m);
    }
  }
  EXPECT_GT(cases, 2000);
  EXPECT_GT(errors, cases / 3);
}

// ---- the shared real files ---------------------------------------------------------------------

// <repo>/../shared/data (the repository root is two folders above this file).
std::filesystem::path shared_data() {
  const auto repo = std::filesystem::absolute(__FILE__)
                        .lexically_normal()
                        .parent_path()
                        .parent_path()
                        .parent_path();
  return repo.parent_path() / "shared" / "data";
}

TEST(IoSharedData, RealFilesHaveTheDocumentedCounts) {
  const auto root = shared_data();
  if (!std::filesystem::exists(root / "pcl" / "office1.pcd"))
    GTEST_SKIP() << "no shared data at " << root;
  EXPECT_EQ(read_kitti((root / "semantickitti" / "000000.bin").string()).dim(0), 123389);
  EXPECT_EQ(read_kitti_labels((root / "semantickitti" / "000000.label").string()).semantic.dim(0),
            123389);
  const PointCloud las_cloud = read_las((root / "autzen" / "autzen_trim.las").string());
  EXPECT_EQ(las_cloud.num_points, 110000);
  int ground = 0;
  for (std::uint8_t c : column<std::uint8_t>(las_cloud, "classification")) ground += c == 2;
  EXPECT_EQ(ground, 26107);
  const PointCloud pcd = read_pcd((root / "pcl" / "office1.pcd").string());
  EXPECT_EQ(pcd.num_points, 307200);
  EXPECT_EQ(pcd.width, 640);
  EXPECT_EQ(pcd.height, 480);
  int finite = 0;
  const auto xyz = column<float>(pcd, "xyz");
  for (std::size_t i = 0; i < xyz.size(); i += 3)
    finite += std::isfinite(xyz[i]) && std::isfinite(xyz[i + 1]) && std::isfinite(xyz[i + 2]);
  EXPECT_EQ(finite, 254456);
}

// Header text leaves the readers as UTF-8: valid UTF-8 kept as it is, anything else read as
// Latin-1 (io.h). The validator is strict, like Python's decoder: what it accepts, Python decodes.
TEST(IoText, HeaderTextIsUtf8OrLatin1) {
  using detail::header_text;
  using detail::is_utf8;
  EXPECT_TRUE(is_utf8("plain ascii"));
  EXPECT_TRUE(is_utf8("Caf\xc3\xa9"));          // é, 2 bytes
  EXPECT_TRUE(is_utf8("\xe2\x82\xac"));          // €, 3 bytes
  EXPECT_TRUE(is_utf8("\xf0\x9f\x98\x80"));      // U+1F600, 4 bytes
  EXPECT_TRUE(is_utf8("\xf4\x8f\xbf\xbf"));      // U+10FFFF, the last code point
  EXPECT_FALSE(is_utf8("Caf\xe9"));              // Latin-1 é
  EXPECT_FALSE(is_utf8("\xc0\x80"));             // overlong NUL
  EXPECT_FALSE(is_utf8("\xe0\x80\xaf"));         // overlong '/'
  EXPECT_FALSE(is_utf8("\xed\xa0\x80"));         // surrogate U+D800
  EXPECT_FALSE(is_utf8("\xf4\x90\x80\x80"));     // above U+10FFFF
  EXPECT_FALSE(is_utf8("\xe2\x82"));             // truncated sequence
  EXPECT_FALSE(is_utf8("\x80"));                 // lone continuation byte
  EXPECT_EQ(header_text("Caf\xc3\xa9"), "Caf\xc3\xa9");
  EXPECT_EQ(header_text("Caf\xe9"), "Caf\xc3\xa9");
  EXPECT_EQ(header_text("\xff\x80"), "\xc3\xbf\xc2\x80");
}

TEST(IoText, LatinOneSoftwareFieldReadsAndValuesAreUnchanged) {
  // a LAS 1.2 format-0 file of one point with "Syst\xe8me" / "Caf\xe9" in its text fields
  std::vector<std::byte> b(227 + 20);
  auto put = [&](std::size_t at, const void* p, std::size_t n) { std::memcpy(b.data() + at, p, n); };
  put(0, "LASF", 4);
  b[24] = std::byte{1};
  b[25] = std::byte{2};
  put(26, "Syst\xe8me", 7);
  put(58, "Caf\xe9", 4);
  const std::uint16_t header = 227, record = 20;
  const std::uint32_t offset = 227, count = 1;
  put(94, &header, 2);
  put(96, &offset, 4);
  b[104] = std::byte{0};
  put(105, &record, 2);
  put(107, &count, 4);
  const double scale[3] = {1, 1, 1};
  put(131, scale, sizeof scale);
  const std::int32_t xyz[3] = {7, -8, 9};
  put(227, xyz, sizeof xyz);
  const PointCloud cloud = parse_point_cloud(b, Format::las, "t.las");
  std::string software, system;
  for (const auto& [k, v] : cloud.meta) {
    if (k == "generating_software") software = v;
    if (k == "system_identifier") system = v;
  }
  EXPECT_EQ(software, "Caf\xc3\xa9");
  EXPECT_EQ(system, "Syst\xc3\xa8me");
  const Column* c = cloud.find("xyz");
  ASSERT_NE(c, nullptr);
  const auto* v = c->data.data<double>();
  EXPECT_EQ(v[0], 7.0);
  EXPECT_EQ(v[1], -8.0);
  EXPECT_EQ(v[2], 9.0);
}

}  // namespace
}  // namespace lattice::io
