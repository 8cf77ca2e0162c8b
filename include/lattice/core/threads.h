// The number of CPU threads lattice's own parallel regions use.
//
// Default: LATTICE_NUM_THREADS, else OMP_NUM_THREADS, else the hardware concurrency. It is kept
// apart from the OpenMP runtime's global setting on purpose: torch (which shares libgomp in the
// same process) may set that to 1, and lattice should neither inherit nor override torch's choice.
#pragma once

namespace lattice {

int num_threads();
// n >= 1; raises ValueError otherwise.
void set_num_threads(int n);

}  // namespace lattice
