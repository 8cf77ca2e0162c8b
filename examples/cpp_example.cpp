// The C++ API in a few lines: a tiny sparse tensor, a submanifold conv, a strided conv, a
// transposed conv back onto the input support, and the route decision.
//
// ctest runs this program (CMakeLists.txt: add_test lattice_example); it checks its own answer
// against the values worked out by hand below and exits 1 on a wrong one.
#include <cmath>
#include <cstdio>
#include <vector>

#include <lattice/lattice.h>

int main() {
  using namespace lattice;
  // Eight points of a 2x2x2 cube plus one far away, batch 0.
  std::vector<std::int32_t> c;
  for (int x = 0; x < 2; ++x)
    for (int y = 0; y < 2; ++y)
      for (int z = 0; z < 2; ++z) c.insert(c.end(), {0, x, y, z});
  c.insert(c.end(), {0, 10, 10, 10});
  const std::int64_t n = static_cast<std::int64_t>(c.size() / 4);
  std::vector<float> f(static_cast<std::size_t>(n * 4), 1.0f);
  SparseTensor x(Array::from_vector(c, {n, 4}), Array::from_vector(f, {n, 4}));

  std::vector<float> w3(27 * 4 * 8, 0.01f);  // (K=27, C_in=4, C_out=8)
  ops::ConvOptions subm{.kernel_size = {3, 3, 3}};
  SparseTensor y = ops::subm_conv3d(x, Array::from_vector(w3, {27, 4, 8}), subm);

  std::vector<float> w2(8 * 8 * 16, 0.01f);  // (K=8, C_in=8, C_out=16)
  ops::ConvOptions down{.kernel_size = {2, 2, 2}, .stride = {2, 2, 2}};
  SparseTensor z = ops::conv3d(y, Array::from_vector(w2, {8, 8, 16}), down);

  std::vector<float> wt(8 * 16 * 8, 0.01f);
  SparseTensor u = ops::conv_transpose3d(z, Array::from_vector(wt, {8, 16, 8}), down, nullptr, &y);

  std::printf("x: %lld rows, y: %lld rows, z: %lld rows (stride %d), u: %lld rows (same key as y: %s)\n",
              static_cast<long long>(x.size()), static_cast<long long>(y.size()),
              static_cast<long long>(z.size()), z.stride()[0], static_cast<long long>(u.size()),
              u.key() == y.key() ? "yes" : "no");

  // Worked by hand (all features 1, all weights 0.01):
  //  y: every cube point sees the 8 cube points in its 3x3x3 window -> 0.01 * 4 ch * 8 = 0.32;
  //     the far point sees only itself -> 0.01 * 4 = 0.04.
  //  z: the cube pools into one stride-2 row: 0.01 * 8 ch * 8 rows * 0.32 = 0.2048; the far point
  //     into its own row: 0.01 * 8 * 0.04 = 0.0032.
  //  u: each fine row has exactly one coarse parent: 0.01 * 16 * 0.2048 (cube), 0.01 * 16 * 0.0032.
  bool ok = x.size() == 9 && y.size() == 9 && z.size() == 2 && u.size() == 9 && u.key() == y.key() &&
            z.stride()[0] == 2;
  auto check = [&](const SparseTensor& t, std::int64_t channels, double cube, double far) {
    const float* v = t.feats().contiguous().data<float>();
    if (t.channels() != channels) return false;
    for (std::int64_t r = 0; r < t.size(); ++r) {
      const std::int32_t* c = t.coords().contiguous().data<std::int32_t>() + 4 * r;
      const double want = c[1] >= 5 ? far : cube;
      for (std::int64_t j = 0; j < channels; ++j)
        if (std::abs(v[r * channels + j] - want) > 1e-6 * std::abs(want)) {
          std::printf("wrong value at row %lld channel %lld: %.9g, expected %.9g\n", static_cast<long long>(r),
                      static_cast<long long>(j), v[r * channels + j], want);
          return false;
        }
    }
    return true;
  };
  ok = ok && check(y, 8, 0.32, 0.04) && check(z, 16, 0.2048, 0.0032) && check(u, 8, 0.032768, 0.000512);
  if (!ok) {
    std::printf("cpp_example: WRONG RESULT\n");
    return 1;
  }
  std::printf("cpp_example: results match the hand-computed values\n");

  const ops::ConvPlan plan = ops::plan_conv("subm_conv3d", RelationKind::submanifold, x, subm);
  std::printf("%s", ops::explain_conv(plan, x.feats(), Array::from_vector(w3, {27, 4, 8})).to_string().c_str());
  std::printf("%s", backend_info().c_str());
  return 0;
}
