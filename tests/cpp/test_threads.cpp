// lattice's default CPU thread count: the CPUs the process may use (affinity mask, cgroup quota),
// not the machine's hardware threads, so a container limited to 2 CPUs on a 64-core host does not
// run 64 threads whose barriers wait on descheduled threads.
#include <gtest/gtest.h>

#include <thread>

#include "lattice/core/threads.h"

#if defined(__linux__)
#include <sched.h>
#endif

namespace lattice {
namespace {

TEST(Threads, CgroupV2CpuMaxLines) {
  EXPECT_EQ(detail::cpus_from_cgroup_v2("max 100000"), 0);       // no limit
  EXPECT_EQ(detail::cpus_from_cgroup_v2("200000 100000"), 2);    // docker --cpus=2
  EXPECT_EQ(detail::cpus_from_cgroup_v2("150000 100000"), 2);    // 1.5 CPUs: a second thread for the half
  EXPECT_EQ(detail::cpus_from_cgroup_v2("50000 100000"), 1);     // half a CPU: still one thread
  EXPECT_EQ(detail::cpus_from_cgroup_v2("100000 100000\n"), 1);
  EXPECT_EQ(detail::cpus_from_cgroup_v2(""), 0);                 // file missing
  EXPECT_EQ(detail::cpus_from_cgroup_v2("garbage"), 0);
  EXPECT_EQ(detail::cpus_from_cgroup_v2("-5 100000"), 0);
  EXPECT_EQ(detail::cpus_from_cgroup_v2("400000 0"), 0);         // a zero period is no limit, not a crash
}

TEST(Threads, CgroupV1QuotaAndPeriod) {
  EXPECT_EQ(detail::cpus_from_cgroup_v1(-1, 100000), 0);  // cpu.cfs_quota_us = -1: no limit
  EXPECT_EQ(detail::cpus_from_cgroup_v1(300000, 100000), 3);
  EXPECT_EQ(detail::cpus_from_cgroup_v1(1, 100000), 1);
  EXPECT_EQ(detail::cpus_from_cgroup_v1(1LL << 50, 1), 4096);  // capped like the environment variables
}

TEST(Threads, AvailableCpusIsWithinTheAffinityMask) {
  const int n = cpus_available();
  EXPECT_GE(n, 1);
  const unsigned hw = std::thread::hardware_concurrency();
  if (hw) EXPECT_LE(n, static_cast<int>(hw));
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_LE(n, CPU_COUNT(&set));
#endif
}

}  // namespace
}  // namespace lattice
