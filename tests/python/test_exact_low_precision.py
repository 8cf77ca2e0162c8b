"""Exact float16 / bfloat16 results for every reduction, on every route (issue 20, item 2).

The contract (SEMANTICS.md "Numerics", the Numerics comment of every kernel file): float16 and
bfloat16 features accumulate in float32 and are rounded to the storage dtype ONCE per output
element. The norm-wise tolerances of the oracle suites (f16 2e-3, bf16 1e-2 relative) cannot
tell that apart from rounding the running sum after every add. Here the inputs are built so the
right answer is known to the last bit:

* integer-valued features (and dyadic weights where an op has weights) small enough that every
  float32 partial sum is exact, but whose sums exceed the dtype's integer range (2048 for f16,
  256 for bf16), so most outputs need rounding and a running sum rounded after every add goes
  wrong. The expected value is the float64 oracle rounded once (``oracle.round_to_dtype``),
  compared with 0 ulp of tolerance;
* a mean is the exact float32 sum divided once in float32, rounded once (0 ulp against that
  model, and within 1 ulp of the float64 oracle mean rounded once);
* where float32 itself rounds (non-dyadic trilinear weights, sums of ``dy / n``), within 1 ulp
  of the float64 oracle rounded once.

Every comparison is element-wise (``assert_close_elementwise`` reports the worst element and
its row), never norm-wise. Each test also asserts that its inputs really need rounding (a test
whose sums fit the dtype exactly could not fail).

Ops: local pooling sum/avg/max (overlapping and disjoint windows, onto a target), global pooling,
pool_transpose3d, trilinear_upsample3d, voxelize (sum/mean/max), devoxelize (nearest, trilinear),
sparse_from_coordinates (sum/mean, torch-side reduction, no route) and the conv ops (forward,
feature and weight gradients). Routes: every route ``lattice.explain`` admits for the problem on
the device, each forced with ``route=`` (a route admitted only for a backward pass, such as
pooling's input_exclusive, is forced on the backward plan). Parametrized over cpu and cuda; on a
machine without a GPU the cuda ids skip with reason "no GPU", the only skip.
"""
from __future__ import annotations

import zlib
from typing import Any, Callable, Optional

import numpy as np
import pytest
import torch

import lattice
import oracle
import oracle.algebra as oalg
import oracle.point_voxel as opv
import oracle.pool as opool
from lattice import ops
from lattice._core import core, from_core, to_core
from conftest import random_coords

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]
HALF = {"f16": torch.float16, "bf16": torch.bfloat16}
NAMES = list(HALF)
EXACT_INT = {"f16": 2048, "bf16": 256}  # every integer up to this is representable
F16_LIMIT = 60000.0  # below float16's largest finite value (65504)

# (significand bits after the point, smallest normal exponent) per storage dtype
_FORMAT = {"f16": (10, -14), "bf16": (7, -126), "f32": (23, -126)}


# ---- element-wise comparison -----------------------------------------------------------------------


def ulp(values: Any, dtype_name: str) -> np.ndarray:
    """The spacing of ``dtype_name`` at each value (the ulp of |value|'s binade; subnormal spacing
    at and below the smallest normal)."""
    bits, emin = _FORMAT[dtype_name]
    v = np.abs(np.asarray(values, dtype=np.float64))
    _, e = np.frexp(v)  # v = m * 2**e with m in [0.5, 1): the binade exponent is e - 1
    exp = np.where(v > 0, e - 1, emin)
    return np.ldexp(1.0, np.maximum(exp, emin) - bits)


def _f64(a: Any) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().double().numpy()
    return np.asarray(a, dtype=np.float64)


def assert_close_elementwise(actual: Any, expected: Any, ulps_or_atol: float, dtype_name: Optional[str] = None,
                             what: str = "") -> None:
    """Every element of ``actual`` within ``ulps_or_atol`` of ``expected``.

    With ``dtype_name`` the bound is in ulps of that dtype at the expected value (0 = bitwise
    equal); without, it is an absolute tolerance. Shapes must match and every value must be
    finite. On failure the message names the worst element (row, channel, both values, the error),
    how many elements are outside, and the worst row in full.
    """
    a, e = _f64(actual), _f64(expected)
    label = f"{what}: " if what else ""
    assert a.shape == e.shape, f"{label}shape {a.shape}, expected {e.shape}"
    if e.size == 0:
        return
    assert np.all(np.isfinite(e)), f"{label}the expected values are not all finite (test construction)"
    if not np.all(np.isfinite(a)):
        idx = tuple(int(v) for v in np.argwhere(~np.isfinite(a))[0])
        raise AssertionError(f"{label}non-finite value {a[idx]!r} at {idx}, expected {e[idx]!r}")
    err = np.abs(a - e)
    if dtype_name is not None:
        err_units = err / ulp(e, dtype_name)
        unit = f" ulp({dtype_name})"
    else:
        err_units = err
        unit = ""
    bad = err_units > ulps_or_atol
    if not np.any(bad):
        return
    flat = int(np.argmax(err_units))
    idx = np.unravel_index(flat, err_units.shape)
    row = idx[0]
    a2, e2 = a.reshape(a.shape[0], -1), e.reshape(e.shape[0], -1)
    raise AssertionError(
        f"{label}{int(bad.sum())} of {bad.size} elements off by more than {ulps_or_atol}{unit}; worst at "
        f"{tuple(int(i) for i in idx)}: got {a[idx]!r}, expected {e[idx]!r} (error {err_units[idx]:.3g}{unit}); "
        f"row {row}: got {a2[row].tolist()}, expected {e2[row].tolist()}"
    )


def needs_rounding(exact: np.ndarray, name: str, at_least: float = 0.25, what: str = "") -> None:
    """Guards the construction: at least ``at_least`` of the exact results are not representable
    in the storage dtype, so a wrong rounding step changes results."""
    exact = np.asarray(exact, dtype=np.float64)
    frac = float(np.mean(oracle.round_to_dtype(exact, name) != exact)) if exact.size else 0.0
    assert frac >= at_least, f"{what}: only {frac:.0%} of the exact results need rounding in {name}"
    if name == "f16":
        assert np.abs(exact).max() < F16_LIMIT, f"{what}: results reach {np.abs(exact).max()}, near f16 overflow"


def f32_exact(exact: np.ndarray, what: str) -> None:
    """Guards the construction: the float64 oracle values are exactly representable in float32,
    so an f32 accumulation reproduces them bit for bit."""
    assert np.array_equal(exact.astype(np.float32).astype(np.float64), exact), f"{what}: not exact in float32"


def mean_model(total: np.ndarray, counts: np.ndarray, name: str) -> np.ndarray:
    """Accumulate in float32 (exact here), divide once in float32, round once to the dtype."""
    n = np.maximum(np.asarray(counts, dtype=np.float64), 1).reshape(-1, 1)
    q = (total.astype(np.float32) / n.astype(np.float32)).astype(np.float64)
    return oracle.round_to_dtype(q, name)


def check_mean(actual: Any, total: np.ndarray, counts: np.ndarray, name: str, what: str) -> None:
    """A mean: bitwise the float32 model, and within 1 ulp of the float64 mean rounded once."""
    f32_exact(total, what)
    assert_close_elementwise(actual, mean_model(total, counts, name), 0, name, what + " (f32 sum / n, rounded once)")
    n = np.maximum(np.asarray(counts, dtype=np.float64), 1).reshape(-1, 1)
    assert_close_elementwise(actual, oracle.round_to_dtype(total / n, name), 1, name, what + " (oracle mean)")


def check_exact(actual: Any, exact: np.ndarray, name: str, what: str) -> None:
    """0 ulp from the float64 oracle rounded once (the oracle value being exact in float32)."""
    f32_exact(exact, what)
    assert_close_elementwise(actual, oracle.round_to_dtype(exact, name), 0, name, what)


# ---- inputs ---------------------------------------------------------------------------------------


def int_feats(rng: np.random.Generator, shape: tuple, name: str, max_terms: int) -> np.ndarray:
    """Integer features (float64) exactly representable in ``name``, large enough that sums of a
    few rows leave the dtype's integer range, small enough that ``max_terms`` of them stay below
    f16 overflow. Channels alternate in sign (all terms of one channel have the same sign, so the
    partial sums grow and every add rounds)."""
    hi = EXACT_INT[name]
    if name == "f16":
        hi = min(hi, int(F16_LIMIT // max(max_terms, 1)))
    lo = max(1, hi // 3)
    vals = rng.integers(lo, hi + 1, size=shape).astype(np.float64)
    if len(shape) == 2:
        vals *= np.where(np.arange(shape[1]) % 2 == 0, 1.0, -1.0)
    return vals


def to_t(a: np.ndarray, name: str, device: str) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a)).to(HALF[name]).to(device)
    assert np.array_equal(t.cpu().double().numpy(), a), "input not representable in the storage dtype"
    return t


def admitted(explanation: Any) -> list[str]:
    return [r["route"] for r in explanation.rows if r["admitted"]]


def routes_for(device: str, explain_pass: Callable[[str], Any], passes: tuple[str, ...]) -> dict[str, list[str]]:
    """Admitted routes per pass, read from ``lattice.explain`` rows. Non-empty for every pass; on
    the CPU every family has its scalar reference route."""
    out = {p: admitted(explain_pass(p)) for p in passes}
    for p, names in out.items():
        assert names, f"no admitted route for pass {p} on {device}"
        if device == "cpu":
            assert "reference" in names, f"pass {p}: reference not admitted on cpu ({names})"
    return out


def max_fan(idx: np.ndarray, n: int) -> int:
    return int(np.bincount(np.asarray(idx, dtype=np.int64), minlength=max(n, 1)).max()) if len(idx) else 1


# ---- pooling over edges (local, global, transposed, trilinear) -------------------------------------

C = 4


def _pool_routes(device: str, op: str, x: lattice.SparseTensor, args: tuple, kw: dict) -> dict[str, list[str]]:
    return routes_for(device, lambda p: lattice.explain(op, x, *args, pass_=p, **kw), ("forward", "input_grad"))


_PLANNERS = {
    "local": lambda x, args, kw, mode, route: ops.pool.plan_pool("pool3d", x, *args, route=route, **kw),  # kw has mode
    "global": lambda x, args, kw, mode, route: ops.pool.plan_global_pool("global_pool", x, mode, route=route),
    "transpose": lambda x, args, kw, mode, route: ops.pool.plan_pool_transpose("pool_transpose3d", x, *args,
                                                                               route=route, **kw),
    "trilinear": lambda x, args, kw, mode, route: ops.pool.plan_trilinear_upsample("trilinear_upsample3d", x, *args,
                                                                                   route=route, **kw),
}


def run_pool_routes(device: str, kind: str, op: str, x: lattice.SparseTensor, args: tuple, kw: dict, mode: str,
                    dy: torch.Tensor, check_fwd: Callable[[torch.Tensor, str], None],
                    check_bwd: Callable[[torch.Tensor, str], None]) -> list[str]:
    """Forward with every forward-admitted route (``op(..., route=r)``), backward with every
    input_grad-admitted route (autograd through the forced op when the route runs both passes,
    else the core backward on a plan forced to it). Returns the routes run."""
    fn = getattr(ops, op)
    routes = _pool_routes(device, op, x, args, kw)
    for r in routes["forward"]:
        f = x.feats.detach().clone().requires_grad_()
        y = fn(x.replace_feats(f), *args, route=r, **kw)
        out = y.feats if isinstance(y, lattice.SparseTensor) else y
        assert out.dtype == x.dtype
        check_fwd(out, f"{op} {x.dtype} forward, route {r}")
        if r in routes["input_grad"]:
            (dx,) = torch.autograd.grad(out, [f], dy)
            check_bwd(dx, f"{op} {x.dtype} input grad, route {r}")
    for r in routes["input_grad"]:
        if r in routes["forward"]:
            continue
        argmax = None
        if mode == "max":  # the winners of the forward (default route)
            _, am = core.pool_forward(_PLANNERS[kind](x, args, kw, mode, None), to_core(x.feats))
            argmax = am
        plan = _PLANNERS[kind](x, args, kw, mode, r)
        dx = from_core(core.pool_backward(plan, to_core(dy.contiguous()), argmax))
        check_bwd(dx, f"{op} {x.dtype} input grad, route {r} (backward-only)")
    return sorted(set(routes["forward"]) | set(routes["input_grad"]))


def _pool_checks(name: str, mode: str, rows_sum: np.ndarray, counts_out: np.ndarray, winners_y: Optional[np.ndarray],
                 dx_exact: np.ndarray, dx_mean_terms: bool):
    def check_fwd(out: torch.Tensor, what: str) -> None:
        if mode == "sum":
            check_exact(out, rows_sum, name, what)
        elif mode == "avg":
            check_mean(out, rows_sum, counts_out, name, what)
        else:  # max selects one input element: exact in every dtype
            assert_close_elementwise(out, winners_y, 0, name, what)

    def check_bwd(dx: torch.Tensor, what: str) -> None:
        if dx_mean_terms:  # sums of dy / n: float32 rounds each term, so 1 ulp of the oracle
            assert_close_elementwise(dx, oracle.round_to_dtype(dx_exact, name), 1, name, what)
        else:
            check_exact(dx, dx_exact, name, what)

    return check_fwd, check_bwd


LOCAL_CASES = [
    ("k3_s2_overlapping", (3, 2), {}),
    ("k2_s2_disjoint", (2,), {}),
    ("k3_s1_p1", (3, 1, 1), {}),
    ("k3_s1_expand", (3, 1), {"expand": True}),
    ("k2_s2_target", (2,), {"coordinates": "target"}),
]


def _dense_coords(seed: int, n: int = 150) -> np.ndarray:
    # two dense clusters per batch: most windows hold many rows
    return random_coords(np.random.default_rng(seed), n, batches=2, extent=5, spread=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["sum", "avg", "max"])
@pytest.mark.parametrize("case", LOCAL_CASES, ids=[c[0] for c in LOCAL_CASES])
def test_local_pool_is_the_f32_sum_rounded_once_on_every_route(case, mode, name, device):
    _, args, kw = case
    rng = np.random.default_rng(zlib.crc32(f"{case[0]}-{mode}-{name}".encode()))
    coords = _dense_coords(11)
    ks = args[0]
    st = args[1] if len(args) > 1 else ks
    pd = args[2] if len(args) > 2 else 0
    target = None
    call_kw = dict(kw)
    if kw.get("coordinates") == "target":
        gen = opool.pool_edges(coords, ks, st, pd).out_coords.astype(np.int32)
        target = np.concatenate([gen[::-2], np.array([[0, 50, 50, 50]], dtype=np.int32)])
        call_kw["coordinates"] = lattice.SparseTensor(torch.from_numpy(target).to(device),
                                                      torch.zeros(target.shape[0], 1, device=device), stride=st)
    rel = opool.pool_edges(coords, ks, st, pd, expand=kw.get("expand", False), target=target)
    n = coords.shape[0]
    feats = int_feats(rng, (n, C), name, max_fan(rel.out_idx, rel.n_out))
    dy = int_feats(rng, (rel.n_out, C), name, max_fan(rel.in_idx, n))
    x = lattice.SparseTensor(torch.from_numpy(coords).to(device), to_t(feats, name, device))
    total, _ = opool.pool_forward(feats, rel.in_idx, rel.out_idx, rel.n_out, "sum")
    counts = np.bincount(rel.out_idx, minlength=rel.n_out)
    y_max, winners = opool.pool_forward(feats, rel.in_idx, rel.out_idx, rel.n_out, "max")
    dx_exact = opool.pool_backward(dy, rel.in_idx, rel.out_idx, n, mode, winners)
    if mode != "max":
        needs_rounding(total, name, what="forward sums")
    if mode == "sum" and max_fan(rel.in_idx, n) > 1:  # overlapping windows: the input grad sums too
        needs_rounding(dx_exact[np.any(dx_exact != 0, axis=1)], name, at_least=0.1, what="input grad sums")
    check_fwd, check_bwd = _pool_checks(name, mode, total, counts, y_max, dx_exact, mode == "avg")
    call_kw["mode"] = mode
    ran = run_pool_routes(device, "local", "pool3d", x, args, call_kw, mode, to_t(dy, name, device),
                          check_fwd, check_bwd)
    if device == "cpu":
        assert {"reference", "csr_reduce"} <= set(ran), ran
        if case[0] == "k2_s2_disjoint":
            assert "input_exclusive" in ran, ran


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["sum", "avg", "max"])
def test_global_pool_is_the_f32_sum_rounded_once_on_every_route(mode, name, device):
    rng = np.random.default_rng({"sum": 1, "avg": 2, "max": 3}[mode] + 10 * NAMES.index(name))
    coords = random_coords(rng, 80, batches=3, extent=4, spread=8)
    n = coords.shape[0]
    batch = coords[:, 0].astype(np.int64)
    B = int(batch.max()) + 1
    feats = int_feats(rng, (n, C), name, max_fan(batch, B))
    dy = int_feats(rng, (B, C), name, 1)
    x = lattice.SparseTensor(torch.from_numpy(coords).to(device), to_t(feats, name, device))
    total, _ = opool.global_pool(coords, feats, "sum")
    y_max, winners = opool.global_pool(coords, feats, "max")
    dx_exact = opool.global_pool_backward(coords, dy, mode, winners)
    if mode != "max":
        needs_rounding(total, name, what="batch sums")
    check_fwd, check_bwd = _pool_checks(name, mode, total, np.bincount(batch, minlength=B), y_max, dx_exact,
                                        mode == "avg")
    op = {"sum": "global_sum_pool", "avg": "global_avg_pool", "max": "global_max_pool"}[mode]
    fn = getattr(ops, op)
    routes = routes_for(device, lambda p: lattice.explain(op, x, pass_=p), ("forward", "input_grad"))
    for r in routes["forward"]:
        f = x.feats.detach().clone().requires_grad_()
        out = fn(x.replace_feats(f), route=r)
        check_fwd(out, f"{op} forward, route {r}")
        if r in routes["input_grad"]:
            check_bwd(torch.autograd.grad(out, [f], to_t(dy, name, device))[0], f"{op} input grad, route {r}")
    for r in routes["input_grad"]:
        if r not in routes["forward"]:
            am = core.pool_forward(ops.pool.plan_global_pool(op, x, mode), to_core(x.feats))[1] if mode == "max" else None
            plan = ops.pool.plan_global_pool(op, x, mode, route=r)
            dx = from_core(core.pool_backward(plan, to_core(to_t(dy, name, device)), am))
            check_bwd(dx, f"{op} input grad, route {r} (backward-only)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("ks", [3, 2], ids=["k3_s2_overlapping", "k2_s2_copy"])
def test_pool_transpose3d_is_the_f32_mean_rounded_once_on_every_route(ks, name, device):
    rng = np.random.default_rng(40 + ks + 10 * NAMES.index(name))
    coords = _dense_coords(12, 120)
    _, _, rel = opool.pool_transpose(coords, np.zeros((coords.shape[0], 1)), ks, 2)
    n = coords.shape[0]
    feats = int_feats(rng, (n, C), name, max_fan(rel.out_idx, rel.n_out))
    dy = int_feats(rng, (rel.n_out, C), name, max_fan(rel.in_idx, n))
    x = lattice.SparseTensor(torch.from_numpy(coords).to(device), to_t(feats, name, device), stride=2)
    total, _ = opool.pool_forward(feats, rel.in_idx, rel.out_idx, rel.n_out, "sum")
    counts = np.bincount(rel.out_idx, minlength=rel.n_out)
    if ks == 3:
        assert counts.max() >= 4, "no fine row with several parents"
    dx_exact = opool.pool_backward(dy, rel.in_idx, rel.out_idx, n, "avg")
    check_fwd, check_bwd = _pool_checks(name, "avg", total, counts, None, dx_exact, True)
    ran = run_pool_routes(device, "transpose", "pool_transpose3d", x, (ks, 2), {}, "avg", to_t(dy, name, device),
                          check_fwd, check_bwd)
    if device == "cpu":
        assert {"reference", "csr_reduce"} <= set(ran), ran


def _trilinear_setup(rng: np.random.Generator, name: str, onto_target: bool):
    """A dense coarse block (batch 0, [0, 4]^3 at stride 2). With a target: fine rows (stride 1)
    whose 8 coarse corners all exist, so the weights are products of 1/4 and 3/4 (dyadic) and
    need no renormalisation: every float32 product and sum is exact. Without: the generated
    children, renormalised at the block's faces (non-dyadic weights)."""
    g = np.arange(5)
    coarse = np.array([[0, a, b, c] for a in g for b in g for c in g], dtype=np.int32)
    coarse = coarse[rng.permutation(coarse.shape[0])]
    target = None
    if onto_target:
        f = np.arange(1, 9)
        fine = np.array([[0, a, b, c] for a in f for b in f for c in f], dtype=np.int32)
        target = fine[rng.permutation(fine.shape[0])[:260]]
    fine_c, in_idx, out_idx, w = opool.trilinear_edges(coarse, 2, target, None if target is None else 1, 2)
    return coarse, target, fine_c, in_idx, out_idx, w


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("onto_target", [True, False], ids=["dyadic_target", "generated_renormalised"])
def test_trilinear_upsample3d_is_the_f32_weighted_sum_rounded_once_on_every_route(onto_target, name, device):
    rng = np.random.default_rng(60 + int(onto_target) + 10 * NAMES.index(name))
    coarse, target, fine_c, in_idx, out_idx, w = _trilinear_setup(rng, name, onto_target)
    n_fine, n = fine_c.shape[0], coarse.shape[0]
    feats = int_feats(rng, (n, C), name, 1)  # a weighted mean: bounded by the largest input
    dy = int_feats(rng, (n_fine, C), name, 8)
    y_exact, _ = opool.pool_forward(feats, in_idx, out_idx, n_fine, "weighted", w)
    dx_exact = opool.pool_backward(dy, in_idx, out_idx, n, "weighted", weights=w)
    needs_rounding(y_exact, name, what="interpolated values")
    needs_rounding(dx_exact, name, what="coarse gradients")
    x = lattice.SparseTensor(torch.from_numpy(coarse).to(device), to_t(feats, name, device), stride=2)
    kw = {}
    if onto_target:
        assert np.all(np.bincount(out_idx, minlength=n_fine) == 8), "a fine row lost a corner"
        kw["coordinates"] = lattice.SparseTensor(torch.from_numpy(target).to(device),
                                                 torch.zeros(target.shape[0], 1, device=device))

    def check_fwd(out: torch.Tensor, what: str) -> None:
        if onto_target:
            check_exact(out, y_exact, name, what)
        else:
            assert_close_elementwise(out, oracle.round_to_dtype(y_exact, name), 1, name, what)

    def check_bwd(dx: torch.Tensor, what: str) -> None:
        if onto_target:
            check_exact(dx, dx_exact, name, what)
        else:
            assert_close_elementwise(dx, oracle.round_to_dtype(dx_exact, name), 1, name, what)

    y = ops.trilinear_upsample3d(x, **kw)
    np.testing.assert_array_equal(y.coords.cpu().numpy(), fine_c)
    ran = run_pool_routes(device, "trilinear", "trilinear_upsample3d", x, (), kw, "weighted",
                          to_t(dy, name, device), check_fwd, check_bwd)
    if device == "cpu":
        assert {"reference", "csr_reduce"} <= set(ran), ran


# ---- point <-> voxel -------------------------------------------------------------------------------


def _points(rng: np.random.Generator, n_points: int, n_cells: int) -> tuple[np.ndarray, np.ndarray]:
    """Points (float32-exact) strictly inside ``n_cells`` random unit voxels of two batches."""
    cells = np.unique(rng.integers(-3, 4, size=(n_cells * 2, 3)), axis=0)[:n_cells]
    pick = rng.integers(0, cells.shape[0], size=n_points)
    frac = rng.integers(1, 16, size=(n_points, 3)) / 16.0
    pts = (cells[pick] + frac).astype(np.float32)
    batch = (pick % 2).astype(np.int64)
    return pts, batch


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("reduction", ["sum", "mean", "max"])
def test_voxelize_is_the_f32_reduction_rounded_once_on_every_route(reduction, name, device):
    rng = np.random.default_rng(80 + {"sum": 0, "mean": 1, "max": 2}[reduction] + 10 * NAMES.index(name))
    pts, batch = _points(rng, 320, 14)
    _, inverse, counts = oracle.sparse_quantize(pts, 1.0, batch)
    m = counts.shape[0]
    feats = int_feats(rng, (pts.shape[0], C), name, int(counts.max()))
    dy = int_feats(rng, (m, C), name, 1)
    ref_coords, y_ref, argmax = opv.voxelize(pts, feats, 1.0, reduction, batch)
    total = opv.voxelize(pts, feats, 1.0, "sum", batch)[1]
    dx_exact = opv.voxelize_backward(dy, inverse, counts, reduction, argmax)
    if reduction != "max":
        needs_rounding(total, name, what="voxel sums")
    P = torch.from_numpy(pts).to(device)
    b = torch.from_numpy(batch).to(device)
    f0 = to_t(feats, name, device)
    routes = routes_for(device, lambda p: lattice.explain("voxelize", P, f0, 1.0, reduction, b, pass_=p),
                        ("forward", "backward"))
    assert set(routes["backward"]) <= set(routes["forward"]), routes  # route= forces both passes
    for r in routes["forward"]:
        f = f0.clone().requires_grad_()
        v = ops.voxelize(P, f, 1.0, reduction, b, route=r)
        what = f"voxelize {reduction} {name}, route {r}"
        np.testing.assert_array_equal(v.coords.cpu().numpy(), ref_coords, err_msg=what)
        if reduction == "sum":
            check_exact(v.feats, total, name, what)
        elif reduction == "mean":
            check_mean(v.feats, total, counts, name, what)
        else:
            assert_close_elementwise(v.feats, y_ref, 0, name, what)
        if r in routes["backward"]:
            (dx,) = torch.autograd.grad(v.feats, [f], to_t(dy, name, device))
            if reduction == "mean":  # dy / count: one f32 division, rounded once
                dv = dy[inverse]
                check_mean(dx, dv, counts[inverse], name, what + " backward")
            else:
                check_exact(dx, dx_exact, name, what + " backward")
    if device == "cpu":
        assert {"parallel", "reference"} <= set(routes["forward"]), routes


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["trilinear", "nearest"])
def test_devoxelize_and_its_gradient_are_the_f32_sums_rounded_once_on_every_route(mode, name, device):
    """Voxels: a dense block [0, 5]^3. Trilinear points sit at eighths of a voxel inside
    [0.5, 5.5)^3, so all 8 corners exist and every weight is a multiple of 1/512: the weighted
    sums are exact in float32. The backward sums over the points of each voxel (many terms)."""
    rng = np.random.default_rng(90 + int(mode == "nearest") + 10 * NAMES.index(name))
    g = np.arange(6)
    vox = np.array([[0, a, b, c] for a in g for b in g for c in g], dtype=np.int32)
    vox = vox[rng.permutation(vox.shape[0])]
    n_points = 700
    pts = (0.5 + rng.integers(0, 40, size=(n_points, 3)) / 8.0).astype(np.float32)
    idx, w = opv.point_voxel_map(pts, vox, 1.0, mode)
    assert np.all(idx[:, 0] >= 0) and (mode == "nearest" or np.all(idx >= 0)), "a point lost a voxel"
    vfeats = int_feats(rng, (vox.shape[0], C), name, 1)
    fan_in = max_fan(idx[idx >= 0], vox.shape[0])
    dy = int_feats(rng, (n_points, C), name, fan_in)
    y_exact = opv.devoxelize(vfeats, idx, w)
    dv_exact = opv.devoxelize_backward(dy, idx, w, vox.shape[0])
    if mode == "trilinear":
        needs_rounding(y_exact, name, what="interpolated values")
    needs_rounding(dv_exact, name, at_least=0.25, what="voxel gradients")
    v = lattice.SparseTensor(torch.from_numpy(vox).to(device), to_t(vfeats, name, device))
    P = torch.from_numpy(pts).to(device)
    routes = {}
    for r in routes_for(device, lambda p: lattice.explain("build_point_voxel_map", P, v, mode), ("forward",))["forward"]:
        pmap = ops.build_point_voxel_map(P, v, mode, voxel_size=1.0, route=r)
        np.testing.assert_array_equal(pmap.indices.cpu().numpy(), idx, err_msg=f"map indices, route {r}")
        np.testing.assert_array_equal(pmap.weights.cpu().double().numpy(), w, err_msg=f"map weights, route {r}")
    routes = routes_for(device, lambda p: lattice.explain("devoxelize", v, pmap, pass_=p), ("forward", "backward"))
    assert set(routes["backward"]) <= set(routes["forward"]), routes
    for r in routes["forward"]:
        f = v.feats.detach().clone().requires_grad_()
        out = ops.devoxelize(v.replace_feats(f), pmap, route=r)
        what = f"devoxelize {mode} {name}, route {r}"
        check_exact(out, y_exact, name, what)
        if r in routes["backward"]:
            (dv,) = torch.autograd.grad(out, [f], to_t(dy, name, device))
            check_exact(dv, dv_exact, name, what + " backward")
    if device == "cpu":
        assert {"parallel", "reference"} <= set(routes["forward"]), routes


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_sparse_from_coordinates_is_the_f32_reduction_rounded_once(reduction, name, device):
    """Repeated rows reduced in float32 (torch index_add / segment sums), rounded once; no route
    keyword (the reduction runs in torch)."""
    rng = np.random.default_rng(100 + int(reduction == "mean") + 10 * NAMES.index(name))
    uniq = random_coords(rng, 20, batches=2, extent=4, spread=6)
    coords = uniq[rng.integers(0, uniq.shape[0], size=300)]
    _, total, inverse = oalg.from_coordinates(coords, np.zeros((300, 1)), "sum")
    counts = np.bincount(inverse, minlength=int(inverse.max()) + 1)
    feats = int_feats(rng, (300, C), name, int(counts.max()))
    unique, total, inverse = oalg.from_coordinates(coords, feats, "sum")
    dy = int_feats(rng, (unique.shape[0], C), name, 1)
    needs_rounding(total, name, what="row sums")
    f = to_t(feats, name, device).requires_grad_()
    x = ops.sparse_from_coordinates(torch.from_numpy(coords).to(device), f, reduction=reduction)
    np.testing.assert_array_equal(x.coords.cpu().numpy(), unique)
    what = f"sparse_from_coordinates {reduction} {name}"
    (dx,) = torch.autograd.grad(x.feats, [f], to_t(dy, name, device))
    if reduction == "sum":
        check_exact(x.feats, total, name, what)
        check_exact(dx, dy[inverse], name, what + " backward")
    else:
        check_mean(x.feats, total, counts, name, what)
        check_mean(dx, dy[inverse], counts[inverse], name, what + " backward")


# ---- convolution -----------------------------------------------------------------------------------

CONV_CASES = [
    ("subm_k3", "subm_conv3d", dict(kernel_size=3), 4, 3),
    ("conv3d_k1_pointwise", "conv3d", dict(kernel_size=1), 16, 12),
    ("conv3d_k2_s2", "conv3d", dict(kernel_size=2, stride=2), 6, 8),
    ("transpose_k3_s2", "conv_transpose3d", dict(kernel_size=3, stride=2), 16, 3),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_output_and_gradients_are_the_f32_sums_rounded_once_on_every_route(case, name, device):
    """Integer features, weights and output gradient: every f32 partial sum is exact, so output,
    feature and weight gradients have exactly one right value, round(exact sum) in the dtype."""
    label, op, kw, c_in, c_out = case
    rng = np.random.default_rng(120 + CONV_CASES.index(case) + 10 * NAMES.index(name))
    stride = kw.get("stride", 1)
    tensor_stride = stride if op == "conv_transpose3d" else 1
    coords = _dense_coords(13, 110)
    K = oracle.kernel_volume(kw["kernel_size"])
    okw = {k: v for k, v in kw.items() if k != "kernel_size"}
    if op == "subm_conv3d":
        rel = oracle.subm_relation(coords, kw["kernel_size"])
    elif op == "conv3d":
        rel = oracle.forward_relation(coords, kw["kernel_size"], **okw)
    else:
        rel = oracle.transposed_relation(coords, kw["kernel_size"], **okw)
    # positive integers (partial sums only grow, so they leave the dtype's integer range), at most
    # hi**2 * (terms of the longest sum) below f16 overflow; bf16 holds integers up to 256
    terms = max(max_fan(rel.out_idx, rel.n_out) * c_in, max_fan(rel.in_idx, coords.shape[0]) * c_out,
                max_fan(rel.k_idx, K))
    hi = int(np.sqrt(F16_LIMIT / terms)) if name == "f16" else 16
    feats = rng.integers(hi // 3, hi + 1, size=(coords.shape[0], c_in)).astype(np.float64)
    wk = rng.integers(hi // 3, hi + 1, size=(K, c_in, c_out)).astype(np.float64)
    dy = rng.integers(hi // 3, hi + 1, size=(rel.n_out, c_out)).astype(np.float64)
    y_exact = oracle.conv_forward(feats, wk, rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out)
    dx_exact, dw_exact, _ = oracle.conv_backward(feats, wk, dy, rel.in_idx, rel.out_idx, rel.k_idx)
    for what, exact in (("output", y_exact), ("feature grad", dx_exact), ("weight grad", dw_exact)):
        needs_rounding(exact, name, at_least=0.1, what=f"{label} {what}")
    x0 = lattice.SparseTensor(torch.from_numpy(coords).to(device), to_t(feats, name, device), stride=tensor_stride)
    w0 = to_t(wk, name, device)
    fn = getattr(ops, op)
    routes = routes_for(device, lambda p: lattice.explain(op, x0, w0, pass_=p, **kw),
                        ("forward", "input_grad", "weight_grad"))
    # route= forces every pass, so a backward route can only run under a forward it shares
    assert set(routes["input_grad"]) | set(routes["weight_grad"]) <= set(routes["forward"]), routes
    for r in routes["forward"]:
        need_dx, need_dw = r in routes["input_grad"], r in routes["weight_grad"]
        f = x0.feats.detach().clone().requires_grad_(need_dx)
        w = w0.detach().clone().requires_grad_(need_dw)
        y = fn(x0.replace_feats(f), w, route=r, **kw)
        what = f"{label} {name}, route {r}"
        np.testing.assert_array_equal(y.coords.cpu().numpy(), rel.out_coords, err_msg=what)
        check_exact(y.feats, y_exact, name, what + " output")
        wanted = [t for t, need in ((f, need_dx), (w, need_dw)) if need]
        grads = list(torch.autograd.grad(y.feats, wanted, to_t(dy, name, device))) if wanted else []
        if need_dx:
            check_exact(grads.pop(0), dx_exact, name, what + " feature grad")
        if need_dw:
            check_exact(grads.pop(0).reshape(K, c_in * c_out), dw_exact.reshape(K, c_in * c_out), name,
                        what + " weight grad")
    if device == "cpu":
        assert {"reference", "gather_gemm_scatter"} <= set(routes["forward"]), routes
        if K == 1:
            assert "pointwise_matmul" in routes["forward"], routes


# ---- the comparison helper itself -------------------------------------------------------------------


def test_assert_close_elementwise_counts_ulps_and_reports_the_worst_row():
    e = np.array([[1.0, 2048.0], [3.0, 0.0]])
    assert_close_elementwise(e, e, 0, "f16")
    assert_close_elementwise(np.array([[1.0 + 2**-10, 2050.0], [3.0, 0.0]]), e, 1, "f16")
    with pytest.raises(AssertionError, match=r"1 of 4 elements off by more than 1 ulp\(f16\); worst at \(0, 1\)"):
        assert_close_elementwise(np.array([[1.0, 2052.0], [3.0, 0.0]]), e, 1, "f16")
    with pytest.raises(AssertionError, match=r"worst at \(1, 0\).*row 1: got \[3\.0625, 0\.0\]"):
        assert_close_elementwise(np.array([[1.0, 2048.0], [3.0625, 0.0]]), e, 1, "bf16")
    assert_close_elementwise(np.array([[1.0, 2048.0], [3.0078125, 0.0]]), e, 1, "bf16")  # 1 bf16 ulp at 3
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close_elementwise(np.array([[np.nan, 2048.0], [3.0, 0.0]]), e, 5, "f16")
    with pytest.raises(AssertionError, match="shape"):
        assert_close_elementwise(e[:1], e, 5, "f16")
    with pytest.raises(AssertionError, match=r"off by more than 0\.5;"):
        assert_close_elementwise(e + 1.0, e, 0.5)
    assert ulp(0.0, "f16") == 2.0**-24 and ulp(1.0, "bf16") == 2.0**-7 and ulp(-3.0, "f16") == 2.0**-9
