"""lattice's default CPU thread count: the CPUs the process may use, and one thread inside
DataLoader workers (as torch does for itself), so neither a CPU-limited container nor a loader's
workers oversubscribe the cores (each OpenMP barrier would then wait on a descheduled thread)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import lattice
from lattice import ops
from lattice.tensor import SparseTensor

_ENV = {k: v for k, v in os.environ.items() if k not in ("LATTICE_NUM_THREADS", "OMP_NUM_THREADS")}


def _child_threads(preexec=None, env=None) -> int:
    code = "import lattice; print(lattice.get_num_threads())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env or _ENV,
                         preexec_fn=preexec, check=True, timeout=120)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_default_threads_follow_the_affinity_mask() -> None:
    """A process pinned to one CPU (taskset, a container cpuset) defaults to one thread; the
    environment variable still wins."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    assert _child_threads(preexec=lambda: os.sched_setaffinity(0, {cpu})) == 1
    assert _child_threads(preexec=lambda: os.sched_setaffinity(0, {cpu}), env=dict(_ENV, LATTICE_NUM_THREADS="3")) == 3
    assert 1 <= _child_threads() <= len(os.sched_getaffinity(0))  # never more than the mask allows


class _ThreadsSeen(torch.utils.data.Dataset):
    """Each item runs a lattice CPU op first (as a dataset that voxelizes would), then reports the
    thread count lattice used in this worker."""

    def __init__(self, set_in_worker: int = 0) -> None:
        self.set_in_worker = set_in_worker

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        if self.set_in_worker and not getattr(self, "_set", False):
            lattice.set_num_threads(self.set_in_worker)
            self._set = True
        c = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.int32)
        ops.subm_conv3d(SparseTensor(c, torch.ones(2, 1)), torch.ones(1, 3, 3, 3, 1), kernel_size=3)
        return lattice.get_num_threads()


def test_dataloader_workers_run_lattice_on_one_thread() -> None:
    before = lattice.get_num_threads()
    lattice.set_num_threads(2)
    try:
        loader = torch.utils.data.DataLoader(_ThreadsSeen(), batch_size=None, num_workers=2)
        assert list(loader) == [1, 1]
        # A worker's own choice wins, and the main process keeps its count.
        loader = torch.utils.data.DataLoader(_ThreadsSeen(set_in_worker=2), batch_size=None, num_workers=1)
        assert list(loader) == [2, 2]
        assert lattice.get_num_threads() == 2
        # Without workers the main process's setting is used.
        assert list(torch.utils.data.DataLoader(_ThreadsSeen(), batch_size=None, num_workers=0)) == [2, 2]
    finally:
        lattice.set_num_threads(before)
