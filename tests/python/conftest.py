"""Shared fixtures of the lattice Python suite.

* puts the repo's ``tests/`` folder on ``sys.path`` so ``import oracle`` finds the independent
  float64 numpy oracle (tests/oracle, a package with relative imports);
* seeded generators (numpy and torch), seeded per test so that every test is reproducible;
* ``random_coords`` / fixture ``make_coords``: random unique coordinates (several batches,
  negative values, clustered so that relations have edges);
* ``make_plan`` + ``relation_arrays``: the edge list and views of the relation lattice built for
  one conv call, read through ``plan.relation.arrays()`` (DLPack capsules -> torch -> numpy);
* ``oracle_relation_for``: the oracle's relation for the same call.

Test modules import the plain helpers with ``from conftest import ...`` (pytest's default
"prepend" import mode puts this folder on sys.path and registers this module as ``conftest``).
"""
from __future__ import annotations

import sys
import zlib
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pytest

_TESTS = Path(__file__).resolve().parents[1]
_REPO = _TESTS.parent
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))
try:  # the documented command sets PYTHONPATH=python; fall back to the in-tree package
    import lattice  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(_REPO / "python"))
    import lattice  # noqa: F401

import torch  # noqa: E402
import torch.utils.dlpack  # noqa: E402

import oracle  # noqa: E402

# op name -> relation kind, as lattice.ops.conv chooses it (target / no target)
OP_KIND = {
    ("conv3d", False): "forward",
    ("conv3d", True): "target",
    ("subm_conv3d", False): "submanifold",
    ("conv_transpose3d", False): "transposed",
    ("conv_transpose3d", True): "transposed_target",
    ("generative_conv_transpose3d", False): "generative",
}


def _seed(request: pytest.FixtureRequest) -> int:
    return zlib.crc32(request.node.nodeid.encode()) & 0x7FFFFFFF


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A numpy generator seeded from the test id (reproducible, different per test)."""
    return np.random.default_rng(_seed(request))


@pytest.fixture
def torch_gen(request: pytest.FixtureRequest) -> torch.Generator:
    """A torch CPU generator seeded from the test id."""
    return torch.Generator().manual_seed(_seed(request))


def random_coords(
    rng: np.random.Generator,
    n: int,
    batches: int = 3,
    extent: int = 5,
    spread: int = 12,
) -> np.ndarray:
    """``(<=n, 4)`` int32 unique rows ``(batch, x, y, z)`` in random order.

    Each batch is one or two clusters: boxes of side ``extent`` around centers drawn from
    ``[-spread, spread]`` (so negative coordinates appear), which makes neighbours common and
    relations have edges. Rows are unique; fewer than ``n`` come back only when the boxes are full.
    """
    if n == 0:
        return np.zeros((0, 4), dtype=np.int32)
    rows: list[tuple[int, int, int, int]] = []
    seen: set[tuple[int, int, int, int]] = set()
    centers = {b: rng.integers(-spread, spread + 1, size=(2, 3)) for b in range(batches)}
    attempts = 0
    while len(rows) < n and attempts < 50 * n:
        attempts += 1
        b = int(rng.integers(0, batches))
        c = centers[b][int(rng.integers(0, 2))]
        p = c + rng.integers(-(extent // 2), extent - extent // 2, size=3)
        key = (b, int(p[0]), int(p[1]), int(p[2]))
        if key not in seen:
            seen.add(key)
            rows.append(key)
    out = np.array(rows, dtype=np.int32).reshape(-1, 4)
    return out[rng.permutation(out.shape[0])]


@pytest.fixture
def make_coords(rng: np.random.Generator) -> Callable[..., np.ndarray]:
    """``make_coords(n, batches=3, extent=5, spread=12)`` -> unique int32 (N, 4) numpy rows."""
    return lambda n, **kw: random_coords(rng, n, **kw)


def from_capsule(capsule: Any) -> np.ndarray:
    """A core DLPack capsule as a numpy array (through torch)."""
    t = torch.utils.dlpack.from_dlpack(capsule)
    return t.cpu().numpy().copy()


def relation_arrays(p: Any) -> dict[str, Any]:
    """Everything a ConvPlan's relation exposes, as numpy arrays / ints.

    Keys: in_idx, out_idx, k_idx (edges, output-major), out_ptr, k_ptr, k_in, k_out (views),
    out_coords (the plan's output support), n_in, n_out, n_edges, kernel_volume, identity.
    """
    rel = p.relation
    out = {k: from_capsule(v) for k, v in rel.arrays().items()}
    out["out_coords"] = from_capsule(p.output.coords())
    out["n_in"] = int(rel.n_in)
    out["n_out"] = int(rel.n_out)
    out["n_edges"] = int(rel.n_edges)
    out["kernel_volume"] = int(rel.kernel_volume)
    out["identity"] = bool(rel.identity)
    return out


def make_plan(op: str, x: "lattice.SparseTensor", weight: torch.Tensor, **kw: Any) -> Any:
    """``lattice.ops.conv.plan`` for ``op`` with the relation kind the op itself would use."""
    kind = OP_KIND[(op, kw.get("coordinates") is not None)]
    kw.setdefault("kernel_size", None)
    return lattice.ops.conv.plan(op, kind, x, weight, **kw)


def oracle_relation_for(
    op: str,
    coords: np.ndarray,
    kernel_size: Any,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    expand: bool = False,
    target: Optional[np.ndarray] = None,
) -> "oracle.Relation":
    """The oracle relation of a lattice conv op call (coordinates as numpy arrays)."""
    if op == "subm_conv3d":
        return oracle.subm_relation(coords, kernel_size, dilation)
    if op == "conv3d" and target is None:
        return oracle.forward_relation(coords, kernel_size, stride, padding, dilation, expand)
    if op == "conv3d":
        return oracle.target_relation(coords, target, kernel_size, stride, padding, dilation)
    if op == "conv_transpose3d":
        return oracle.transposed_relation(coords, kernel_size, stride, padding, dilation, target=target)
    if op == "generative_conv_transpose3d":
        return oracle.generative_relation(coords, kernel_size, stride, dilation)
    raise ValueError(op)


def op_fn(op: str) -> Callable[..., "lattice.SparseTensor"]:
    return getattr(lattice.ops, op)


def tensor_stride_for(op: str, stride: Any) -> Any:
    """Input tensor stride an op needs: transposed/generative divide the input stride exactly."""
    if op in ("conv_transpose3d", "generative_conv_transpose3d"):
        return stride
    return 1


def output_stride_for(op: str, stride: Any) -> tuple[int, int, int]:
    s = oracle.as_triple(stride)
    if op in ("conv_transpose3d", "generative_conv_transpose3d"):
        return (1, 1, 1)
    if op == "subm_conv3d":
        return (1, 1, 1)
    return s


def dense_weight_shape(c_out: int, kernel_size: Any, c_in: int) -> tuple[int, ...]:
    kx, ky, kz = oracle.as_triple(kernel_size)
    return (c_out, kx, ky, kz, c_in)


# ---- fixture-gated tests (marker torchsparse_fixtures) ------------------------------------------
# tests/python/test_convert_torchsparse.py compares lattice with TorchSparse 2.1's outputs, stored in
# tests/fixtures/torchsparse_*.npz by scripts/make_torchsparse_fixtures.py (CUDA + TorchSparse
# only). While those files are missing the marked tests are deselected and the summary says so;
# `-m torchsparse_fixtures` selects them anyway (then they fail, naming the script).
_TORCHSPARSE_SCRIPT = "scripts/make_torchsparse_fixtures.py"
_deselected_torchsparse: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "torchsparse_fixtures: needs tests/fixtures/torchsparse_*.npz (made by "
        f"{_TORCHSPARSE_SCRIPT} on a CUDA machine with TorchSparse 2.1); deselected while they are missing")


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    if "torchsparse_fixtures" in (config.getoption("markexpr", "") or ""):
        return  # asked for explicitly: run (and fail with the script's name if the files are missing)
    if list((_TESTS / "fixtures").glob("torchsparse_*.npz")):
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("torchsparse_fixtures") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
        _deselected_torchsparse.extend(i.nodeid for i in drop)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _deselected_torchsparse:
        terminalreporter.write_line(
            f"torchsparse_fixtures: {len(_deselected_torchsparse)} test(s) deselected: tests/fixtures/torchsparse_*.npz "
            f"missing; make them with `PYTHONPATH=python python3 {_TORCHSPARSE_SCRIPT}` on a machine with CUDA and "
            f"TorchSparse 2.1, or run `pytest -m torchsparse_fixtures` to see them fail")
