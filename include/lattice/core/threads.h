// The number of CPU threads lattice's own parallel regions use.
//
// Default: LATTICE_NUM_THREADS, else OMP_NUM_THREADS, else the CPUs this process may use: the
// affinity mask (taskset, container cpusets) capped by a cgroup CPU quota (docker --cpus,
// Kubernetes CPU limits), rounded up. It is kept apart from the OpenMP runtime's global setting
// on purpose: torch (which shares libgomp in the same process) may set that to 1, and lattice
// should neither inherit nor override torch's choice. Results do not depend on the count.
#pragma once

#include <string_view>

namespace lattice {

int num_threads();
// n >= 1; raises ValueError otherwise.
void set_num_threads(int n);
// The CPUs this process may use (affinity mask and cgroup quota; the default of num_threads()).
int cpus_available();
// The platform's count of CPUs this process may run on, registered by the CPU backend (the
// affinity mask; core itself stays on the standard library). Without one: the hardware threads.
using CpuCountFn = int (*)();
void set_available_cpus_source(CpuCountFn fn);

namespace detail {
// CPUs allowed by a cgroup v2 `cpu.max` line ("<quota> <period>" or "max <period>"), or by a
// cgroup v1 quota / period in microseconds (quota -1: none); 0 when there is no limit.
int cpus_from_cgroup_v2(std::string_view cpu_max);
int cpus_from_cgroup_v1(long long quota_us, long long period_us);
}  // namespace detail

}  // namespace lattice
