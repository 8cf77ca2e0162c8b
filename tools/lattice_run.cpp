// lattice-run: runs an exported network (lattice.export) on a point-cloud scan, no Python.
//
//   lattice-run MODEL_DIR SCAN [--out LABELS] [--logits LOGITS.npy] [--outputs PREFIX]
//               [--device cpu|cuda[:N]] [--threads N] [--repeat N] [--profile]
//
// SCAN: KITTI .bin (x, y, z, reflectance f32), .las, .pcd or .ply (xyz + "intensity" when the
// file has it, else 0). The scan is voxelized as graph.json's metadata["voxelize"] says, the
// network runs, the first output's per-voxel logits are mapped back to the points (each point
// takes its voxel's row) and written: LABELS ending in .label = SemanticKITTI uint32 per point
// (argmax class in the low 16 bits), .npy = int64 (P,) argmax; LOGITS.npy = float32 (P, C).
// --outputs PREFIX writes every output i of the graph as voxels, not points: PREFIX<i>.coords.npy
// int32 (N_i, 4) (batch, x, y, z) and PREFIX<i>.feats.npy float32 (N_i, C_i) (for networks whose
// outputs are not per input voxel, e.g. a strided encoder such as VoxelBackBone8x; without --out /
// --logits the map back is then skipped).
// Prints the time of each stage (read, voxelize, network, map back, write) and, with --profile,
// of each node. Exit status 0 on success, 1 with a message on stderr otherwise.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "lattice/core/error.h"
#include "lattice/core/threads.h"
#include "lattice/io/io.h"
#include "lattice/runtime.h"

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  if (s.size() < suffix.size()) return false;
  return std::equal(suffix.rbegin(), suffix.rend(), s.rbegin(),
                    [](char a, char b) { return std::tolower(a) == std::tolower(b); });
}

template <class T>
void column_as_float(const lattice::io::Column& c, std::int64_t n, std::int64_t width, int first, float* out,
                     std::int64_t out_stride) {
  auto v = c.values<T>();
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t a = 0; a < width; ++a) out[i * out_stride + first + a] = static_cast<float>(v[i * c.count + a]);
}

void to_float(const lattice::io::Column& c, std::int64_t n, std::int64_t width, int first, float* out,
              std::int64_t stride) {
  using lattice::io::Scalar;
  switch (c.type) {
    case Scalar::i8: return column_as_float<std::int8_t>(c, n, width, first, out, stride);
    case Scalar::u8: return column_as_float<std::uint8_t>(c, n, width, first, out, stride);
    case Scalar::i16: return column_as_float<std::int16_t>(c, n, width, first, out, stride);
    case Scalar::u16: return column_as_float<std::uint16_t>(c, n, width, first, out, stride);
    case Scalar::i32: return column_as_float<std::int32_t>(c, n, width, first, out, stride);
    case Scalar::u32: return column_as_float<std::uint32_t>(c, n, width, first, out, stride);
    case Scalar::i64: return column_as_float<std::int64_t>(c, n, width, first, out, stride);
    case Scalar::u64: return column_as_float<std::uint64_t>(c, n, width, first, out, stride);
    case Scalar::f32: return column_as_float<float>(c, n, width, first, out, stride);
    case Scalar::f64: return column_as_float<double>(c, n, width, first, out, stride);
  }
}

// (P, 4) float32 x, y, z, intensity.
lattice::Array read_scan(const std::string& path) {
  using namespace lattice;
  if (ends_with(path, ".bin")) return io::read_kitti(path);
  io::PointCloud pc = io::read_point_cloud(path);
  const io::Column* xyz = pc.find("xyz");
  if (!xyz || xyz->count != 3) throw_value_error("lattice-run", path, "a point cloud with x, y, z", "no xyz column");
  const io::Column* inten = pc.find("intensity");
  if (!inten) inten = pc.find("reflectance");
  Array pts = Array::zeros({pc.num_points, 4}, Dtype::f32);
  to_float(*xyz, pc.num_points, 3, 0, pts.data<float>(), 4);
  if (inten) to_float(*inten, pc.num_points, 1, 3, pts.data<float>(), 4);
  return pts;
}

void write_npy(const std::string& path, const char* descr, const std::vector<std::int64_t>& shape, const void* data,
               std::size_t nbytes) {
  std::string dims;
  for (auto s : shape) dims += std::to_string(s) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) lattice::throw_value_error("lattice-run", path, "a writable output path", "cannot open");
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  f.write(reinterpret_cast<const char*>(magic), 8);
  const std::uint16_t hl = static_cast<std::uint16_t>(header.size());
  f.write(reinterpret_cast<const char*>(&hl), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(nbytes));
  if (!f) lattice::throw_value_error("lattice-run", path, "a complete write", "a write error");
}

int usage() {
  std::cerr << "usage: lattice-run MODEL_DIR SCAN [--out LABELS(.label|.npy)] [--logits LOGITS.npy]\n"
               "                   [--outputs PREFIX] [--device cpu|cuda[:N]] [--threads N] [--repeat N] [--profile]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lattice;
  std::vector<std::string> pos;
  std::string out_path, logits_path, outputs_prefix, device_name = "cpu";
  int threads = 0, repeat = 1;
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--out") out_path = next();
      else if (a == "--logits") logits_path = next();
      else if (a == "--outputs") outputs_prefix = next();
      else if (a == "--device") device_name = next();
      else if (a == "--threads") threads = std::stoi(next());
      else if (a == "--repeat") repeat = std::max(1, std::stoi(next()));
      else if (a == "--profile") profile = true;
      else if (a == "-h" || a == "--help") return usage();
      else if (!a.empty() && a[0] == '-') throw std::invalid_argument("unknown option " + a);
      else pos.push_back(a);
    } catch (const std::exception& e) {
      std::cerr << "lattice-run: " << e.what() << "\n";
      return usage();
    }
  }
  if (pos.size() != 2) return usage();
  try {
    Device device = Device::cpu();
    if (device_name.rfind("cuda", 0) == 0) {
      device = Device::cuda(device_name.size() > 5 ? std::stoi(device_name.substr(5)) : 0);
    } else if (device_name != "cpu") {
      throw_value_error("lattice-run", "--device", "cpu or cuda[:N]", device_name);
    }
    if (threads > 0) set_num_threads(threads);
    std::map<std::string, double> t;
    double t0 = now();
    Runtime net = Runtime::load(pos[0], device);
    t["load"] = now() - t0;
    t0 = now();
    Array points = read_scan(pos[1]);
    t["read"] = now() - t0;
    t0 = now();
    VoxelizedScan scan = net.voxelize(points);
    t["voxelize"] = now() - t0;
    std::vector<SparseTensor> outs;
    std::vector<NodeTiming> nodes;
    double best = 1e300;
    for (int r = 0; r < repeat; ++r) {
      t0 = now();
      outs = net.run(scan.tensor, profile ? &nodes : nullptr);
      Array logits_dev = outs[0].feats();
      (void)logits_dev.to(Device::cpu());  // the run is over when the logits are on the host
      best = std::min(best, now() - t0);
      if (r == 0) t["network (first run)"] = now() - t0;
    }
    t0 = now();
    Array logits = outs[0].feats().to(Device::cpu()).contiguous();
    const bool per_voxel = outs[0].size() == scan.tensor.size();
    if (!per_voxel && (!out_path.empty() || !logits_path.empty() || outputs_prefix.empty()))
      throw_value_error("lattice-run", "output0", std::to_string(scan.tensor.size()) + " rows (the input voxels)",
                        std::to_string(outs[0].size()) + " rows (use --outputs PREFIX for outputs that are not "
                        "per input voxel)");
    const std::int64_t P = scan.inverse.dim(0), C = logits.dim(1);
    const std::int64_t* inv = scan.inverse.data<std::int64_t>();
    const float* lg = logits.data<float>();
    std::vector<std::int64_t> labels(per_voxel ? P : 0);
    std::vector<float> point_logits;
    if (!logits_path.empty()) point_logits.resize(static_cast<std::size_t>(P * C));
    for (std::int64_t i = 0; i < (per_voxel ? P : 0); ++i) {
      const float* row = lg + inv[i] * C;
      std::int64_t best_c = 0;
      for (std::int64_t c = 1; c < C; ++c)
        if (row[c] > row[best_c]) best_c = c;  // first maximum, as torch.argmax / numpy.argmax
      labels[i] = best_c;
      if (!point_logits.empty()) std::memcpy(&point_logits[i * C], row, C * sizeof(float));
    }
    t["map back"] = now() - t0;
    t0 = now();
    if (!out_path.empty()) {
      if (ends_with(out_path, ".label")) {
        std::vector<std::uint32_t> raw(labels.begin(), labels.end());
        std::ofstream f(out_path, std::ios::binary);
        f.write(reinterpret_cast<const char*>(raw.data()), static_cast<std::streamsize>(raw.size() * 4));
        if (!f) throw_value_error("lattice-run", out_path, "a complete write", "a write error");
      } else {
        write_npy(out_path, "<i8", {P}, labels.data(), labels.size() * 8);
      }
    }
    if (!logits_path.empty()) write_npy(logits_path, "<f4", {P, C}, point_logits.data(), point_logits.size() * 4);
    for (std::size_t o = 0; !outputs_prefix.empty() && o < outs.size(); ++o) {
      const Array c = outs[o].coords().to(Device::cpu()).contiguous();
      const Array f = outs[o].feats().to(Device::cpu()).contiguous();
      const std::string base = outputs_prefix + std::to_string(o);
      write_npy(base + ".coords.npy", "<i4", {c.dim(0), c.dim(1)}, c.raw_data(), c.nbytes());
      write_npy(base + ".feats.npy", "<f4", {f.dim(0), f.dim(1)}, f.raw_data(), f.nbytes());
    }
    t["write"] = now() - t0;
    std::printf("lattice-run: %s on %s: %lld points -> %lld voxels -> %lld x %lld logits (%zu nodes, %s, %d threads)\n",
                pos[0].c_str(), pos[1].c_str(), static_cast<long long>(P), static_cast<long long>(scan.tensor.size()),
                static_cast<long long>(logits.dim(0)), static_cast<long long>(C), net.num_nodes(),
                to_string(device).c_str(), num_threads());
    for (const char* k : {"load", "read", "voxelize"}) std::printf("  %-26s %9.2f ms\n", k, 1e3 * t[k]);
    std::printf("  %-26s %9.2f ms\n", "network (first run)", 1e3 * t["network (first run)"]);
    if (repeat > 1)
      std::printf("  %-26s %9.2f ms\n", ("network (best of " + std::to_string(repeat) + ")").c_str(), 1e3 * best);
    if (per_voxel) std::printf("  %-26s %9.2f ms\n", "map back", 1e3 * t["map back"]);
    else std::printf("  %-26s %9s (output0 is not per input voxel: %zu outputs written as voxels)\n", "map back",
                     "skipped", outs.size());
    std::printf("  %-26s %9.2f ms\n", "write", 1e3 * t["write"]);
    if (profile) {
      std::map<std::string, std::pair<double, int>> by_op;
      for (const auto& n : nodes) {
        by_op[n.op].first += n.seconds;
        by_op[n.op].second += 1;
      }
      std::printf("  per op (last run):\n");
      for (const auto& [op, v] : by_op) std::printf("    %-28s %3d x %9.2f ms\n", op.c_str(), v.second, 1e3 * v.first);
      std::printf("  per node (last run):\n");
      for (const auto& n : nodes) std::printf("    %-40s %-22s %9.3f ms\n", n.name.c_str(), n.op.c_str(), 1e3 * n.seconds);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lattice-run: %s\n", e.what());
    return 1;
  }
}
