// The kernel registry (docs/architecture.md, "Recipe: add a route"): every route's kernel file
// registers its own entry points (LATTICE_ROUTE_KERNELS, src/backend/kernels.h) and the build
// collects the registrations (cmake/kernel_registry.cmake) into the kernel table's lookups, so
// adding a route edits no kernel table and no declaration header. These tests prove that
//
// * in this build every route row that can run here (device "cpu" or "cpu, cuda" always; "cuda"
//   when built with CUDA) has exactly one registration, of its own family, from one of the
//   row's kernel files, and no registration lacks a row (so a route whose kernel file forgot to
//   register, or a recipe that grew a hand-written table back, fails here);
// * each lookup finds exactly the routes of its own family (find_conv_kernels never returns a
//   pool route's struct) and the struct it returns is the registered one;
// * the check names the route: a row without kernels, a registration of the wrong family or
//   from a file the row does not name, a duplicate, a CUDA registration in a build without CUDA,
//   and a registration no row declares are each reported as "family:name: ...".
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "backend/kernel_table.h"
#include "lattice/route/route.h"

namespace lattice {
namespace {

using backend::KernelRegistration;

bool runs_in_this_build(const RouteInfo& row) {
  return row.device.find("cpu") != std::string_view::npos || backend::built_with_cuda();
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += "\n  " + l;
  return out;
}

bool has_line(const std::vector<std::string>& lines, const std::string& prefix, const std::string& part) {
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) {
    return l.rfind(prefix, 0) == 0 && l.find(part) != std::string::npos;
  });
}

// The struct the family's own lookup returns for `id` (nullptr when none), type-erased.
const void* lookup(std::string_view family, RouteId id) {
  if (family == "conv") return backend::find_conv_kernels(id);
  if (family == "quantized") return backend::find_quantized_kernels(id);
  if (family == "dequantize") return reinterpret_cast<const void*>(backend::find_dequantize_kernel(id));
  if (family == "quantize") return reinterpret_cast<const void*>(backend::find_quantize_kernel(id));
  if (family == "point_voxel") return backend::find_point_voxel_kernels(id);
  if (family == "pool") return backend::find_pool_kernels(id);
  if (family == "pool_edges") return backend::find_pool_edge_kernels(id);
  if (family == "point_index") return backend::find_point_index_kernels(id);
  if (family == "algebra") return backend::find_algebra_kernels(id);
  if (family == "coords") return backend::find_coords_kernels(id);
  if (family == "relation") return backend::find_relation_kernels(id);
  if (family == "batch_norm") return backend::find_batch_norm_kernels(id);
  ADD_FAILURE() << "family " << family << " has no lookup in this test (add it with its find_* function)";
  return nullptr;
}

TEST(KernelRegistry, EveryRouteThatRunsInThisBuildHasItsKernels) {
  const auto& rows = route_table();
  const auto& registered = backend::kernel_registrations();
  const auto problems = backend::kernel_registry_problems(rows, registered, backend::built_with_cuda());
  EXPECT_TRUE(problems.empty()) << "route rows and kernel registrations disagree:" << joined(problems);
  // Not vacuous: one registration per row that runs here (18 CPU rows; 30 with CUDA).
  const auto expected = std::count_if(rows.begin(), rows.end(), runs_in_this_build);
  EXPECT_GE(expected, 18);
  EXPECT_EQ(static_cast<long>(registered.size()), static_cast<long>(expected));
}

TEST(KernelRegistry, EachLookupFindsExactlyTheRoutesOfItsFamily) {
  const auto families = route_families();
  for (const RouteInfo& row : route_table()) {
    for (std::string_view family : families) {
      const void* k = lookup(family, row.id);
      if (family == row.family && runs_in_this_build(row))
        EXPECT_NE(k, nullptr) << row.family << ":" << row.name << " not found by its family's lookup";
      else
        EXPECT_EQ(k, nullptr) << row.family << ":" << row.name << " found by the " << family << " lookup";
    }
  }
  // The conv lookup returns the registered entry points, bias gradient included.
  const backend::ConvKernels* ref = backend::find_conv_kernels(RouteId::conv_reference);
  ASSERT_NE(ref, nullptr);
  EXPECT_TRUE(ref->forward && ref->input_grad && ref->weight_grad && ref->bias_grad);
  const backend::ConvKernels* gather = backend::find_conv_kernels(RouteId::conv_gather_gemm_scatter);
  ASSERT_NE(gather, nullptr);
  EXPECT_NE(gather->forward, ref->forward);
  EXPECT_EQ(gather->bias_grad, ref->bias_grad);  // every CPU route's bias gradient is the reference's
  // pool_input_exclusive registers the input gradient only.
  const backend::PoolKernels* excl = backend::find_pool_kernels(RouteId::pool_input_exclusive);
  ASSERT_NE(excl, nullptr);
  EXPECT_EQ(excl->forward, nullptr);
  EXPECT_NE(excl->input_grad, nullptr);
}

TEST(KernelRegistry, ARowWithoutKernelsIsReportedByName) {
  const auto& rows = route_table();
  std::vector<KernelRegistration> regs = backend::kernel_registrations();
  // Drop conv_reference's registration: the check names conv:reference, and nothing else.
  std::erase_if(regs, [](const KernelRegistration& r) { return r.id == RouteId::conv_reference; });
  auto problems = backend::kernel_registry_problems(rows, regs, backend::built_with_cuda());
  ASSERT_EQ(problems.size(), 1u) << joined(problems);
  EXPECT_TRUE(has_line(problems, "conv:reference: ", "no kernels registered")) << joined(problems);

  // A CUDA build whose CUDA kernel files registered nothing: every cuda-only row is named.
  std::vector<KernelRegistration> cpu_only;
  for (const auto& r : backend::kernel_registrations())
    if (r.file.rfind("src/backend/cpu/", 0) == 0) cpu_only.push_back(r);
  problems = backend::kernel_registry_problems(rows, cpu_only, true);
  std::size_t cuda_rows = 0;
  for (const RouteInfo& row : rows) {
    if (row.device != "cuda") continue;
    ++cuda_rows;
    EXPECT_TRUE(has_line(problems, std::string(row.family) + ":" + std::string(row.name) + ": ",
                         "no kernels registered"))
        << row.family << ":" << row.name << joined(problems);
  }
  EXPECT_GE(cuda_rows, 10u);
  EXPECT_EQ(problems.size(), cuda_rows) << joined(problems);
}

TEST(KernelRegistry, WrongRegistrationsAreReportedByName) {
  const auto& rows = route_table();
  const auto& real = backend::kernel_registrations();
  const auto find = [&](RouteId id) {
    for (const auto& r : real)
      if (r.id == id) return r;
    ADD_FAILURE() << "no registration of " << to_string(id);
    return KernelRegistration{id, "", ""};
  };
  const bool cuda = backend::built_with_cuda();

  auto regs = real;
  for (auto& r : regs)
    if (r.id == RouteId::pool_reference) r.family = "conv";  // registered with the wrong struct
  EXPECT_TRUE(has_line(backend::kernel_registry_problems(rows, regs, cuda), "pool:reference: ",
                       "registered as conv kernels"));

  regs = real;
  for (auto& r : regs)
    if (r.id == RouteId::pool_reference) r.file = "src/backend/cpu/pool/csr_reduce.cpp";  // another route's file
  EXPECT_TRUE(has_line(backend::kernel_registry_problems(rows, regs, cuda), "pool:reference: ",
                       "not a kernel file of its row"));

  regs = real;
  regs.push_back(find(RouteId::algebra_hashed));  // registered twice
  EXPECT_TRUE(has_line(backend::kernel_registry_problems(rows, regs, cuda), "algebra:hashed: ", "registered 2 times"));

  // A CUDA route registered in a build without CUDA.
  regs = real;
  regs.push_back({RouteId::conv_implicit_gemm_sm80, "conv", "src/backend/cuda/conv/implicit_gemm_sm80.cu"});
  EXPECT_TRUE(has_line(backend::kernel_registry_problems(rows, regs, false), "conv:implicit_gemm_sm80: ",
                       "build without CUDA"));

  // A registration whose route has no row (rows without relation:cpu_hash).
  std::vector<RouteInfo> fewer;
  for (const auto& row : rows)
    if (row.id != RouteId::relation_cpu_hash) fewer.push_back(row);
  EXPECT_TRUE(has_line(backend::kernel_registry_problems(fewer, real, cuda), "RouteId ",
                       "src/backend/cpu/relation/hash.cpp but no route row declares it"));
}

}  // namespace
}  // namespace lattice
