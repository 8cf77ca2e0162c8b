#include "backend/cpu/caps.h"

#include "lattice/core/threads.h"

#if defined(__linux__)
#include <sched.h>
#endif

#ifndef LATTICE_BLAS_NAME
#define LATTICE_BLAS_NAME "blas"
#endif

namespace lattice::backend::cpu {

namespace {

// CPUs in this process's affinity mask (taskset, container cpusets), 0 when unknown: core's
// default thread count (lattice/core/threads.h) starts from it.
int affinity_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
#endif
  return 0;
}

const bool affinity_registered = (set_available_cpus_source(&affinity_cpus), true);

}  // namespace

CpuCaps query_cpu_caps() {
  (void)affinity_registered;
  CpuCaps caps;
  caps.threads = num_threads();  // lattice's own setting, see core/threads.h
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) caps.isa = "avx512f";
  else if (__builtin_cpu_supports("avx2")) caps.isa = "avx2";
  else if (__builtin_cpu_supports("avx") && __builtin_cpu_supports("fma")) caps.isa = "avx+fma";  // e.g. VMs hiding AVX2
  else if (__builtin_cpu_supports("sse4.2")) caps.isa = "sse4.2";
  else caps.isa = "generic";
#elif defined(__aarch64__)
  caps.isa = "neon";
#else
  caps.isa = "generic";
#endif
  caps.blas = LATTICE_BLAS_NAME;
  return caps;
}

}  // namespace lattice::backend::cpu
