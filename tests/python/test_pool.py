"""Pooling (SEMANTICS.md "Pooling"): local, global, transposed pooling and trilinear upsampling.

Every op is compared with the float64 numpy oracle (tests/oracle/pool.py, its own relations),
forward and backward, in f64/f32/f16/bf16 at the SEMANTICS.md tolerances (inputs rounded to the
storage dtype first); gradcheck in f64; hand-computed cases; the fast routes against the
reference route (bitwise: they share one summation order) and across thread counts; the route
decisions; and the message of every validation branch.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

import lattice
import oracle
import oracle.pool as opool
from lattice import SparseTensor, nn, ops
from lattice._core import core, from_core, to_core
from conftest import random_coords

DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
ROUTES = [None, "reference", "csr_reduce"]
C = 3

# (id, pooling kwargs, onto a target)
LOCAL_CASES = [
    ("k2_s2", dict(kernel_size=2), False),
    ("k3_s2_p1", dict(kernel_size=3, stride=2, padding=1), False),
    ("k3_s1", dict(kernel_size=3, stride=1), False),
    ("k232_s213_expand", dict(kernel_size=(2, 3, 2), stride=(2, 1, 3), expand=True), False),
    ("k2_s3_dil2", dict(kernel_size=2, stride=3, dilation=2), False),
    ("k1_s2", dict(kernel_size=1, stride=2), False),
    ("target_k2_s2", dict(kernel_size=2), True),
]
LOCAL_IDS = [c[0] for c in LOCAL_CASES]


def rounded(rng: np.random.Generator, shape: tuple, name: str, scale: float = 1.0) -> tuple[torch.Tensor, np.ndarray]:
    """A random tensor of storage dtype ``name`` and its exact float64 value."""
    ref = oracle.round_to_dtype(rng.standard_normal(shape) * scale, name)
    return torch.from_numpy(ref).to(DTYPES[name]), ref


def st(coords: Any, feats: Any = None, stride: Any = 1, c: int = 1, dtype=torch.float64, **kw) -> SparseTensor:
    coords = torch.as_tensor(np.asarray(coords), dtype=torch.int32).reshape(-1, 4)
    if feats is None:
        feats = torch.zeros(coords.shape[0], c, dtype=dtype)
    feats = torch.as_tensor(feats, dtype=dtype) if not isinstance(feats, torch.Tensor) else feats
    return SparseTensor(coords, feats, stride=stride, **kw)


def grad_of(fn, x: SparseTensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(output feats, d feats) of ``fn(x)`` for the output gradient ``dy``."""
    f = x.feats.detach().clone().requires_grad_()
    y = fn(x.replace_feats(f))
    out = y.feats if isinstance(y, SparseTensor) else y
    (dx,) = torch.autograd.grad(out, [f], dy)
    return out.detach(), dx


def _stride_kw(kw: dict) -> Any:
    return kw.get("stride", kw["kernel_size"])


def _local_setup(rng, case, name, n=40):
    _, kw, onto_target = case
    coords = random_coords(rng, n)
    feats, ref = rounded(rng, (coords.shape[0], C), name)
    x = st(coords, feats, dtype=DTYPES[name])
    call_kw = dict(kw)
    target_np = None
    if onto_target:
        gen = opool.pool_edges(coords, **kw).out_coords.astype(np.int32)
        extra = random_coords(rng, 5, batches=1, spread=40) + np.array([[7, 0, 0, 0]], dtype=np.int32)
        target_np = np.concatenate([gen[::2], extra]).astype(np.int32)
        call_kw["coordinates"] = st(target_np, stride=_stride_kw(kw), dtype=DTYPES[name])
    oracle_kw = {k: v for k, v in kw.items()}
    rel = opool.pool_edges(coords, target=target_np, **oracle_kw)
    return coords, x, ref, call_kw, rel


# ---- oracle comparisons -------------------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r or "default")
@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("mode", ["sum", "avg", "max"])
@pytest.mark.parametrize("case", LOCAL_CASES, ids=LOCAL_IDS)
def test_pool3d_matches_oracle_forward_and_backward(rng, case, mode, name, route):
    coords, x, ref, call_kw, rel = _local_setup(rng, case, name)
    assert rel.n_edges > 0
    y_ref, winners = opool.pool_forward(ref, rel.in_idx, rel.out_idx, rel.n_out, mode)
    dy, dy_ref = rounded(rng, (rel.n_out, C), name)
    dx_ref = opool.pool_backward(dy_ref, rel.in_idx, rel.out_idx, coords.shape[0], mode, winners)

    y_feats, dx = grad_of(lambda t: ops.pool3d(t, mode=mode, route=route, **call_kw), x, dy)
    y = ops.pool3d(x, mode=mode, route=route, **call_kw)
    assert y.coords.numpy().tolist() == rel.out_coords.tolist()
    assert y.stride == oracle.as_triple(_stride_kw(case[1]))
    assert y_feats.dtype == DTYPES[name] and dx.dtype == DTYPES[name]
    if mode == "max":  # max selects an element: exact in every dtype
        assert np.array_equal(y_feats.double().numpy(), y_ref)
    oracle.assert_close(y_feats, y_ref, name, "forward")
    oracle.assert_close(dx, dx_ref, name, "input grad")


@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("mode", ["sum", "avg", "max"])
def test_global_pool_matches_oracle_forward_and_backward(rng, mode, name):
    coords = random_coords(rng, 30, batches=4)
    coords = coords[coords[:, 0] != 2]  # batch 2 empty (max needs batch_counts without it)
    feats, ref = rounded(rng, (coords.shape[0], C), name)
    counts = None if mode == "max" else np.bincount(coords[:, 0], minlength=5).tolist()
    if mode == "max":
        coords = coords.copy()
        coords[:, 0] = np.where(coords[:, 0] == 3, 2, coords[:, 0])
    x = st(coords, feats, dtype=DTYPES[name], batch_counts=counts)
    y_ref, winners = opool.global_pool(coords, ref, mode, counts)
    dy, dy_ref = rounded(rng, y_ref.shape, name)
    dx_ref = opool.global_pool_backward(coords, dy_ref, mode, winners)
    fn = {"sum": ops.global_sum_pool, "avg": ops.global_avg_pool, "max": ops.global_max_pool}[mode]
    y, dx = grad_of(fn, x, dy)
    assert tuple(y.shape) == y_ref.shape
    oracle.assert_close(y, y_ref, name, "forward")
    oracle.assert_close(dx, dx_ref, name, "input grad")


@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize(
    "kw, onto_target",
    [(dict(kernel_size=2), False), (dict(kernel_size=3, stride=2, padding=1), False),
     (dict(kernel_size=(3, 2, 1), stride=(2, 2, 1)), True)],
    ids=["k2_s2", "k3_s2_p1", "k321_s221_target"],
)
def test_pool_transpose3d_matches_oracle(rng, kw, onto_target, name):
    coords = random_coords(rng, 25)
    feats, ref = rounded(rng, (coords.shape[0], C), name)
    s = oracle.as_triple(_stride_kw(kw))
    x = st(coords, feats, stride=s, dtype=DTYPES[name])
    target_np, call_kw = None, dict(kw)
    if onto_target:
        gen = opool.pool_transpose(coords, ref, **kw)[0].astype(np.int32)
        target_np = np.concatenate([gen[::3], random_coords(rng, 4, batches=1, spread=60)]).astype(np.int32)
        target_np = np.unique(target_np, axis=0)
        call_kw["coordinates"] = st(target_np, dtype=DTYPES[name])
    out_ref, y_ref, rel = opool.pool_transpose(coords, ref, target=target_np, **kw)
    dy, dy_ref = rounded(rng, y_ref.shape, name)
    dx_ref = opool.pool_backward(dy_ref, rel.in_idx, rel.out_idx, coords.shape[0], "avg")
    y, dx = grad_of(lambda t: ops.pool_transpose3d(t, **call_kw), x, dy)
    out = ops.pool_transpose3d(x, **call_kw)
    assert out.coords.numpy().tolist() == out_ref.tolist() and out.stride == (1, 1, 1)
    oracle.assert_close(y, y_ref, name, "forward")
    oracle.assert_close(dx, dx_ref, name, "input grad")


@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("geometry", ["generated_s2", "generated_s313", "target_ratio2", "target_ratio4_2_1"])
def test_trilinear_upsample3d_matches_oracle(rng, geometry, name):
    coords = random_coords(rng, 30, extent=4)
    feats, ref = rounded(rng, (coords.shape[0], C), name)
    if geometry.startswith("generated"):
        stride = 2 if geometry == "generated_s2" else (3, 1, 3)
        cs = (2, 2, 2) if stride == 2 else (3, 2, 6)
        x = st(coords, feats, stride=cs, dtype=DTYPES[name])
        fine, ins, outs, ws = opool.trilinear_edges(coords, cs, stride=stride)
        call = lambda t: ops.trilinear_upsample3d(t, stride)  # noqa: E731
        fs = tuple(cs[a] // oracle.as_triple(stride)[a] for a in range(3))
    else:
        cs, fs = ((2, 2, 2), (1, 1, 1)) if geometry == "target_ratio2" else ((4, 4, 4), (1, 2, 4))
        x = st(coords, feats, stride=cs, dtype=DTYPES[name])
        ratio = tuple(cs[a] // fs[a] for a in range(3))
        fine_np = np.unique(np.concatenate([
            coords * np.array([1, *ratio]) + rng.integers(0, 2, size=(coords.shape[0], 4)) * np.array([0, 1, 1, 1]),
            random_coords(rng, 10, spread=30),
        ]), axis=0).astype(np.int32)
        target = st(fine_np, stride=fs, dtype=DTYPES[name])
        fine, ins, outs, ws = opool.trilinear_edges(coords, cs, fine_np, fs)
        call = lambda t: ops.trilinear_upsample3d(t, coordinates=target)  # noqa: E731
    y_ref, _ = opool.pool_forward(ref, ins, outs, fine.shape[0], "weighted", ws)
    dy, dy_ref = rounded(rng, y_ref.shape, name)
    dx_ref = opool.pool_backward(dy_ref, ins, outs, coords.shape[0], "weighted", weights=ws)
    out = call(x)
    assert out.coords.numpy().tolist() == fine.tolist() and out.stride == fs
    y, dx = grad_of(call, x, dy)
    oracle.assert_close(y, y_ref, name, "forward")
    oracle.assert_close(dx, dx_ref, name, "input grad")


def test_trilinear_upsample3d_edges_equal_oracle_edges(rng):
    coords = random_coords(rng, 30, extent=4)
    x = st(coords, c=1, stride=4)
    p = ops.pool.plan_trilinear_upsample("trilinear_upsample3d", x, 4)
    a = {k: (None if v is None else from_core(v).numpy()) for k, v in p.arrays().items()}
    fine, ins, outs, ws = opool.trilinear_edges(coords, 4, stride=4)
    assert from_core(p.output.coords()).numpy().tolist() == fine.tolist()
    assert a["in_idx"].tolist() == ins.tolist()
    assert np.repeat(np.arange(p.n_out), np.diff(a["out_ptr"])).tolist() == outs.tolist()
    np.testing.assert_allclose(a["weights"], ws, rtol=0, atol=1e-15)


# ---- gradcheck ----------------------------------------------------------------------------------


def _gradcheck(fn, x: SparseTensor) -> None:
    f = x.feats.detach().clone().requires_grad_()

    def run(feats):
        y = fn(x.replace_feats(feats))
        return y.feats if isinstance(y, SparseTensor) else y

    assert torch.autograd.gradcheck(run, (f,), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("route", ["reference", "csr_reduce", None], ids=lambda r: r or "default")
@pytest.mark.parametrize("mode", ["sum", "avg", "max"])
@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1)], ids=["k2_s2", "k3_s2_p1"])
def test_pool3d_gradcheck_f64(rng, kw, mode, route):
    coords = random_coords(rng, 24)
    x = st(coords, torch.from_numpy(rng.standard_normal((coords.shape[0], 2))))
    _gradcheck(lambda t: ops.pool3d(t, mode=mode, route=route, **kw), x)


@pytest.mark.parametrize("op", ["global_sum_pool", "global_avg_pool", "global_max_pool"])
def test_global_pool_gradcheck_f64(rng, op):
    coords = random_coords(rng, 20)
    x = st(coords, torch.from_numpy(rng.standard_normal((coords.shape[0], 2))))
    _gradcheck(getattr(ops, op), x)


def test_pool_transpose3d_and_trilinear_gradcheck_f64(rng):
    coords = random_coords(rng, 15)
    x = st(coords, torch.from_numpy(rng.standard_normal((coords.shape[0], 2))), stride=2)
    _gradcheck(lambda t: ops.pool_transpose3d(t, 3, 2, 1), x)
    _gradcheck(lambda t: ops.trilinear_upsample3d(t, 2), x)


# ---- hand cases ---------------------------------------------------------------------------------

LINE = [[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0]]
CUBE = [[0, a, b, c] for a in (0, 1) for b in (0, 1) for c in (0, 1)]


@pytest.mark.parametrize(
    "mode, values, grads",
    [("sum", [3.0, 3.0], [1.0, 1.0, 1.0]), ("avg", [1.5, 3.0], [0.5, 0.5, 1.0]), ("max", [2.0, 3.0], [0.0, 1.0, 1.0])],
)
def test_three_points_on_a_line_pool_by_two_by_hand(mode, values, grads):
    x = st(LINE, [[1.0], [2.0], [3.0]])
    y, dx = grad_of(lambda t: ops.pool3d(t, 2, mode=mode), x, torch.ones(2, 1, dtype=torch.float64))
    out = ops.pool3d(x, 2, mode=mode)
    assert out.coords.tolist() == [[0, 0, 0, 0], [0, 1, 0, 0]] and out.stride == (2, 2, 2)
    assert y[:, 0].tolist() == values and dx[:, 0].tolist() == grads


def test_cube_pools_into_one_voxel_by_hand():
    x = st(CUBE, torch.arange(1.0, 9.0, dtype=torch.float64).reshape(8, 1))
    assert ops.sum_pool3d(x, 2).feats.tolist() == [[36.0]]
    assert ops.avg_pool3d(x, 2).feats.tolist() == [[4.5]]
    assert ops.max_pool3d(x, 2).feats.tolist() == [[8.0]]
    assert ops.global_avg_pool(x).tolist() == [[4.5]]


def test_avg_pool3d_divides_by_present_rows_not_kernel_volume():
    x = st(CUBE[:3], [[3.0], [6.0], [9.0]])
    assert ops.avg_pool3d(x, 2).feats.tolist() == [[6.0]]
    y, dx = grad_of(lambda t: ops.avg_pool3d(t, 2), x, torch.tensor([[3.0]], dtype=torch.float64))
    assert dx[:, 0].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("route", ROUTES + ["input_exclusive"], ids=lambda r: r or "default")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_max_pool3d_all_equal_ties_go_to_smallest_input_row(route, dtype):
    # Row 0 is at kernel row 7 (1, 1, 1) and row 3 at kernel row 0 (0, 0, 0): the first edge in
    # (input row, kernel row) order is row 0, not the first edge in output-major (o, k) order.
    coords = [[0, 1, 1, 1], [0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]]
    x = st(coords, torch.full((4, 2), 5.0, dtype=dtype), dtype=dtype)
    fwd_route = None if route == "input_exclusive" else route
    f = x.feats.detach().clone().requires_grad_()
    y = ops.max_pool3d(x.replace_feats(f), 2, route=fwd_route)
    assert y.feats.float().tolist() == [[5.0, 5.0]]
    dy = torch.tensor([[1.0, 2.0]], dtype=dtype)
    if route == "input_exclusive":
        p = ops.pool.plan_pool("max_pool3d", x, 2, route="input_exclusive")
        _, am = core.pool_forward(ops.pool.plan_pool("max_pool3d", x, 2), to_core(f.detach()))
        dx = from_core(core.pool_backward(p, to_core(dy), am))
    else:
        (dx,) = torch.autograd.grad(y.feats, [f], dy)
    assert dx.float().tolist() == [[1.0, 2.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]


def test_max_pool3d_ties_per_channel_and_global_max_ties():
    x = st(LINE, [[1.0, 7.0], [2.0, 7.0], [2.0, 0.0]])
    y, dx = grad_of(lambda t: ops.max_pool3d(t, 3, 1), x, torch.ones(3, 2, dtype=torch.float64))
    # windows: row0 {0,1}, row1 {0,1,2}, row2 {1,2}
    assert y.tolist() == [[2.0, 7.0], [2.0, 7.0], [2.0, 7.0]]
    assert dx.tolist() == [[0.0, 2.0], [3.0, 1.0], [0.0, 0.0]]
    g, dg = grad_of(ops.global_max_pool, x, torch.ones(1, 2, dtype=torch.float64))
    assert g.tolist() == [[2.0, 7.0]] and dg.tolist() == [[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]]


def test_max_pool3d_nan_propagates():
    x = st(LINE, [[1.0], [math.nan], [3.0]])
    y = ops.max_pool3d(x, 2)
    assert math.isnan(y.feats[0, 0]) and y.feats[1, 0] == 3.0


def test_pool3d_row_without_edges_is_zero_with_no_gradient():
    # kernel 1, stride 2: coordinate 1 generates output 0 but its window holds only coordinate 0.
    x = st([[0, 1, 0, 0], [0, 2, 0, 0]], [[4.0], [6.0]])
    for mode in ("sum", "avg", "max"):
        y, dx = grad_of(lambda t: ops.pool3d(t, 1, 2, mode=mode), x, torch.ones(2, 1, dtype=torch.float64))
        assert y[:, 0].tolist() == [0.0, 6.0] and dx[:, 0].tolist() == [0.0, 1.0]


def test_global_pools_by_batch_with_empty_batches():
    x = st([[2, 0, 0, 0], [0, 1, 1, 1], [2, 5, 5, 5], [0, 2, 2, 2]], [[1.0], [2.0], [3.0], [4.0]])
    assert ops.global_sum_pool(x).tolist() == [[6.0], [0.0], [4.0]]
    assert ops.global_avg_pool(x).tolist() == [[3.0], [0.0], [2.0]]
    xb = st([[2, 0, 0, 0], [0, 1, 1, 1], [2, 5, 5, 5], [0, 2, 2, 2]], [[1.0], [2.0], [3.0], [4.0]],
            batch_counts=[2, 0, 2, 0])
    assert ops.global_avg_pool(xb).tolist() == [[3.0], [0.0], [2.0], [0.0]]
    y, dx = grad_of(ops.global_avg_pool, xb, torch.tensor([[2.0], [5.0], [4.0], [9.0]], dtype=torch.float64))
    assert dx[:, 0].tolist() == [2.0, 1.0, 2.0, 1.0]
    empty = st(np.zeros((0, 4)), c=3)
    assert tuple(ops.global_sum_pool(empty).shape) == (0, 3) and tuple(ops.global_max_pool(empty).shape) == (0, 3)


def test_pool_transpose3d_unpools_blocks_and_averages_overlaps_by_hand():
    x = st([[0, 1, 0, 0]], [[7.0]], stride=2)
    y = ops.pool_transpose3d(x, 2)
    assert y.stride == (1, 1, 1) and y.feats[:, 0].tolist() == [7.0] * 8
    assert y.coords.tolist() == [[0, 2 + a, b, c] for a in (0, 1) for b in (0, 1) for c in (0, 1)]
    x = st([[0, 0, 0, 0], [0, 1, 0, 0]], [[2.0], [4.0]], stride=2)
    y = ops.pool_transpose3d(x, (3, 1, 1), (2, 1, 1))
    assert y.coords[:, 1].tolist() == [0, 1, 2, 3, 4] and y.feats[:, 0].tolist() == [2.0, 2.0, 3.0, 4.0, 4.0]


def test_pool_transpose3d_onto_skip_keeps_its_identity_and_inverts_max_pool_support():
    skip = st(LINE, [[1.0], [2.0], [3.0]])
    down = ops.max_pool3d(skip, 2)
    up = ops.pool_transpose3d(down, 2, coordinates=skip)
    assert up.key == skip.key and up.feats[:, 0].tolist() == [2.0, 2.0, 3.0]


def test_trilinear_upsample3d_line_by_hand():
    x = st(LINE, [[1.0], [2.0], [3.0]], stride=2)
    fine = st([[0, f, 0, 0] for f in range(6)])
    y = ops.trilinear_upsample3d(x, coordinates=fine)
    assert y.key == fine.key and y.feats[:, 0].tolist() == [1.0, 1.25, 1.75, 2.25, 2.75, 3.0]
    gen = ops.trilinear_upsample3d(x)  # stride 2: children of every coarse row
    assert gen.stride == (1, 1, 1) and len(gen) == 24
    assert ops.trilinear_upsample3d(x, 2).key == gen.key  # generated support is cached


def test_trilinear_upsample3d_same_stride_copies_present_rows_and_zero_elsewhere():
    x = st(LINE, [[1.0], [2.0], [3.0]], stride=2)
    t = st([[0, 2, 0, 0], [0, 9, 9, 9], [0, 0, 0, 0]], stride=2)
    assert ops.trilinear_upsample3d(x, coordinates=t).feats[:, 0].tolist() == [3.0, 0.0, 1.0]


def test_stride_one_max_pool_keeps_identity_and_shares_conv_relation_cache(rng):
    coords = random_coords(rng, 20)
    x = st(coords, torch.randn(coords.shape[0], 2, dtype=torch.float64))
    assert ops.max_pool3d(x, 3, 1).key == x.key
    y = ops.max_pool3d(x, 2)
    before = x._cs.cached_relation_count
    w = torch.randn(1, 2, 2, 2, 2, dtype=torch.float64)
    assert lattice.ops.conv3d(x, w, stride=2).key == y.key  # same relation, same generated output
    assert x._cs.cached_relation_count == before


def test_pool3d_empty_input_gives_empty_output():
    x = st(np.zeros((0, 4)), c=2)
    for mode in ("sum", "avg", "max"):
        y = ops.pool3d(x, 2, mode=mode)
        assert tuple(y.feats.shape) == (0, 2)


# ---- routes -------------------------------------------------------------------------------------


def _all_routes(x: SparseTensor, fn, dy: torch.Tensor, routes) -> dict:
    out = {}
    for r in routes:
        out[r] = grad_of(lambda t: fn(t, r), x, dy)
    return out


@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize(
    "op, kw",
    [("max_pool3d", dict(kernel_size=2)), ("avg_pool3d", dict(kernel_size=3, stride=2)),
     ("sum_pool3d", dict(kernel_size=3, stride=3, padding=1)), ("max_pool3d", dict(kernel_size=3, stride=1)),
     ("global_max_pool", {}), ("global_avg_pool", {}), ("pool_transpose3d", dict(kernel_size=3, stride=2)),
     ("trilinear_upsample3d", dict(stride=2))],
    ids=["max_k2", "avg_k3_s2", "sum_k3_s3_p1", "max_k3_s1", "global_max", "global_avg", "transpose_k3_s2",
         "trilinear"],
)
def test_fast_routes_equal_reference_bitwise_over_thread_counts(rng, op, kw, name):
    coords = random_coords(rng, 3000, batches=3, extent=16, spread=30)
    stride = 2 if op in ("pool_transpose3d", "trilinear_upsample3d") else 1
    # 96 channels: every pass is above the routes' parallel threshold (2^18 touched elements)
    x = st(coords, torch.from_numpy(rng.standard_normal((coords.shape[0], 96))).to(DTYPES[name]), stride=stride,
           dtype=DTYPES[name])
    fn = lambda t, r: getattr(ops, op)(t, **kw, route=r)  # noqa: E731
    y0 = fn(x, "reference")
    y0 = y0.feats if isinstance(y0, SparseTensor) else y0
    dy = torch.from_numpy(rng.standard_normal(tuple(y0.shape))).to(DTYPES[name])
    ref_y, ref_dx = grad_of(lambda t: fn(t, "reference"), x, dy)
    before = lattice.get_num_threads()
    try:
        for threads in (1, 2, 3):
            lattice.set_num_threads(threads)
            for r in ("csr_reduce", None):
                y, dx = grad_of(lambda t: fn(t, r), x, dy)
                assert torch.equal(y, ref_y), (r, threads)
                assert torch.equal(dx, ref_dx), (r, threads)
    finally:
        lattice.set_num_threads(before)


@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("mode", ["sum", "avg", "max"])
@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=3, padding=1),
                                dict(kernel_size=(2, 1, 3), stride=(3, 1, 5), dilation=(2, 1, 2))],
                         ids=["k2_s2", "k3_s3_p1", "k213_s315_dil212"])
def test_input_exclusive_route_equals_reference_bitwise(rng, kw, mode, name):
    coords = random_coords(rng, 2000, extent=12, spread=30)
    x = st(coords, torch.from_numpy(rng.standard_normal((coords.shape[0], 160))).to(DTYPES[name]),
           dtype=DTYPES[name])
    p = ops.pool.plan_pool("pool3d", x, mode=mode, **kw)
    explained = core.explain_pool(p, to_core(torch.zeros(int(p.n_out), 160, dtype=DTYPES[name])), "input_grad")
    assert explained.chosen == "input_exclusive"
    _, am = core.pool_forward(p, to_core(x.feats))
    dy = torch.from_numpy(rng.standard_normal((int(p.n_out), 160))).to(DTYPES[name])
    am_t = None if am is None else from_core(am)
    dxs = {}
    for r in ("reference", "input_exclusive", "csr_reduce"):
        pr = ops.pool.plan_pool("pool3d", x, mode=mode, route=r, **kw)
        dxs[r] = from_core(core.pool_backward(pr, to_core(dy), None if am_t is None else to_core(am_t)))
    assert torch.equal(dxs["input_exclusive"], dxs["reference"])
    assert torch.equal(dxs["csr_reduce"], dxs["reference"])


def test_global_pool_input_grad_takes_the_input_exclusive_route(rng):
    x = st(random_coords(rng, 30), c=2)
    e = lattice.explain("global_avg_pool", x, pass_="input_grad")
    assert e.chosen == "input_exclusive"
    assert lattice.explain("global_avg_pool", x).chosen == "csr_reduce"


@pytest.mark.parametrize(
    "kw, reason",
    [(dict(kernel_size=3, stride=2), "windows overlap on axis x: stride 2 < (size-1)*dilation+1 = 3"),
     (dict(kernel_size=(2, 2, 3), stride=(2, 2, 2)), "windows overlap on axis z: stride 2 < (size-1)*dilation+1 = 3"),
     (dict(kernel_size=2, stride=2, dilation=(1, 2, 1)), "windows overlap on axis y: stride 2 < (size-1)*dilation+1 = 3")],
)
def test_input_exclusive_rejects_overlapping_windows_with_reason(rng, kw, reason):
    x = st(random_coords(rng, 30), c=2)
    e = lattice.explain("max_pool3d", x, pass_="input_grad", **kw)
    row = next(r for r in e.rows if r["route"] == "input_exclusive")
    assert not row["admitted"] and row["reason"] == reason
    assert e.chosen == "csr_reduce"


def test_input_exclusive_admitted_for_disjoint_windows_and_explained(rng):
    x = st(random_coords(rng, 30), c=2)
    assert lattice.explain("max_pool3d", x, 2, pass_="input_grad").chosen == "input_exclusive"
    assert lattice.explain("avg_pool3d", x, 3, 4, 1, pass_="input_grad").chosen == "input_exclusive"
    fwd = lattice.explain("max_pool3d", x, 2)
    assert fwd.chosen == "csr_reduce"
    assert "runs the input gradient only" in next(r for r in fwd.rows if r["route"] == "input_exclusive")["reason"]
    t = lattice.explain("pool_transpose3d", st(random_coords(rng, 10), c=2, stride=2), 2, pass_="input_grad")
    assert t.chosen == "csr_reduce"
    assert "transposed relation" in next(r for r in t.rows if r["route"] == "input_exclusive")["reason"]
    text = str(lattice.explain("trilinear_upsample3d", st(random_coords(rng, 10), c=2, stride=2), pass_="input_grad"))
    assert "trilinear edges" in text and "-> csr_reduce" in text


def test_pool_route_table_rejects_cuda_data_and_integer_dtypes():
    e = core.explain_pool_problem({"device": "cuda:0"})
    assert e.chosen in (None, "cuda_csr_reduce")  # the cuda route where this build has a device
    assert all("runs on cpu" in r["reason"] for r in e.rows if r["route"] != "cuda_csr_reduce")
    e = core.explain_pool_problem({"dtype": "int32", "pass": "input_grad", "edges": "batch"})
    cpu_rows = [r for r in e.rows if r["route"] != "cuda_csr_reduce"]
    assert e.chosen is None and all("float dtype" in r["reason"] for r in cpu_rows)
    e = core.explain_pool_problem({"pass": "input_grad", "kernel_size": 3, "stride": 3})
    assert e.chosen == "input_exclusive"


def test_forced_route_env_variable_selects_pool_route(monkeypatch, rng):
    x = st(random_coords(rng, 20), c=2)
    monkeypatch.setenv("LATTICE_FORCE_ROUTE", "pool:reference")
    assert lattice.explain("max_pool3d", x, 2).chosen == "reference"
    monkeypatch.setenv("LATTICE_FORCE_ROUTE", "csr_reduce")
    assert lattice.explain("max_pool3d", x, 2, pass_="input_grad").chosen == "csr_reduce"


def test_pool3d_is_deterministic_run_to_run(rng):
    coords = random_coords(rng, 2000, extent=12)
    x = st(coords, torch.randn(coords.shape[0], 16, dtype=torch.float32), dtype=torch.float32)
    dy = None
    results = []
    for _ in range(2):
        y = ops.avg_pool3d(x, 3, 2)
        dy = torch.ones_like(y.feats) if dy is None else dy
        results.append(grad_of(lambda t: ops.avg_pool3d(t, 3, 2), x, dy))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


# ---- nn modules ---------------------------------------------------------------------------------


def test_nn_pool_modules_match_functional(rng):
    coords = random_coords(rng, 30)
    x = st(coords, torch.randn(coords.shape[0], 4, dtype=torch.float64))
    assert torch.equal(nn.MaxPool3d(2)(x).feats, ops.max_pool3d(x, 2).feats)
    assert torch.equal(nn.AvgPool3d(3, 2, 1)(x).feats, ops.avg_pool3d(x, 3, 2, 1).feats)
    assert torch.equal(nn.SumPool3d(2, dilation=2)(x).feats, ops.sum_pool3d(x, 2, dilation=2).feats)
    assert torch.equal(nn.GlobalAvgPool()(x), ops.global_avg_pool(x))
    assert torch.equal(nn.GlobalMaxPool()(x), ops.global_max_pool(x))
    assert torch.equal(nn.GlobalSumPool()(x), ops.global_sum_pool(x))
    down = nn.MaxPool3d(2)(x)
    up = nn.PoolTranspose3d(2)(down, coordinates=x)
    assert up.key == x.key
    assert torch.equal(up.feats, ops.pool_transpose3d(down, 2, coordinates=x).feats)
    tri = nn.TrilinearUpsample3d()(down, coordinates=x)
    assert tri.key == x.key and torch.equal(tri.feats, ops.trilinear_upsample3d(down, coordinates=x).feats)
    assert nn.TrilinearUpsample3d(2)(down).stride == (1, 1, 1)
    assert "kernel_size=(2, 2, 2)" in repr(nn.MaxPool3d(2))


def test_nn_pool_modules_in_a_small_model_train(rng):
    coords = random_coords(rng, 60)
    x = st(coords, torch.randn(coords.shape[0], 3, dtype=torch.float32), dtype=torch.float32)
    conv = nn.SubmConv3d(3, 8, 3)
    lin = torch.nn.Linear(8, 1)
    pool, gpool = nn.MaxPool3d(2), nn.GlobalAvgPool()
    opt = torch.optim.SGD([*conv.parameters(), *lin.parameters()], lr=0.05)
    target = torch.ones(3, 1)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        h = conv(x)
        h = h.replace_feats(torch.relu(h.feats))
        loss = ((lin(gpool(pool(h))) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]


# ---- validation ---------------------------------------------------------------------------------


@pytest.fixture
def x(rng):
    c = random_coords(rng, 20)
    return st(c, torch.randn(c.shape[0], 2, dtype=torch.float64))


def test_pool3d_non_sparse_input_raises_type_error():
    with pytest.raises(TypeError, match=r"^\[max_pool3d\] input: expected a lattice.SparseTensor, got Tensor"):
        ops.max_pool3d(torch.zeros(3, 4), 2)


def test_pool3d_unknown_mode_raises_value_error(x):
    with pytest.raises(ValueError, match=r"^\[pool3d\] mode: expected 'sum', 'avg' or 'max', got 'mean'"):
        ops.pool3d(x, 2, mode="mean")


def test_pool3d_core_unknown_mode_raises_value_error(x):
    with pytest.raises(ValueError, match=r"^\[pool3d\] mode: expected 'sum', 'avg' or 'max', got 'weighted'"):
        core.plan_pool("pool3d", "weighted", x._cs, 2, 2, 0, 1, False, True, None, None)


@pytest.mark.parametrize(
    "kw, arg, expected",
    [(dict(kernel_size=(0, 2, 2)), "kernel_size", r"sizes >= 1, got \(0, 2, 2\)"),
     (dict(kernel_size=2, stride=(1, 0, 1)), "stride", r"strides >= 1, got \(1, 0, 1\)"),
     (dict(kernel_size=2, padding=-1), "padding", r"paddings >= 0, got \(-1, -1, -1\)"),
     (dict(kernel_size=2, dilation=0), "dilation", r"dilations >= 1, got \(0, 0, 0\)"),
     (dict(kernel_size=128), "kernel_size", r"a kernel volume <= 2\^20, got \(128, 128, 128\)")],
)
def test_max_pool3d_bad_geometry_raises_value_error(x, kw, arg, expected):
    with pytest.raises(ValueError, match=rf"^\[max_pool3d\] {arg}: expected {expected}"):
        ops.max_pool3d(x, **kw)


def test_max_pool3d_kernel_size_wrong_arity_raises_value_error(x):
    with pytest.raises(ValueError, match=r"^\[max_pool3d\] kernel_size: expected an int or 3 ints, got \(2, 2\)"):
        ops.max_pool3d(x, (2, 2))


def test_max_pool3d_expand_with_target_raises_value_error(x):
    t = ops.max_pool3d(x, 2)
    with pytest.raises(ValueError, match=r"^\[max_pool3d\] expand: expected False \(expand applies to max_pool3d without a target\), got True"):
        ops.max_pool3d(x, 2, coordinates=t, expand=True)


def test_max_pool3d_target_at_wrong_stride_raises_value_error(x):
    with pytest.raises(ValueError, match=r"^\[max_pool3d\] coordinates: expected a target at the output stride \(2, 2, 2\), got stride \(1, 1, 1\)"):
        ops.max_pool3d(x, 2, coordinates=x)


def test_max_pool3d_target_not_sparse_raises_type_error(x):
    with pytest.raises(TypeError, match=r"^\[max_pool3d\] coordinates: expected a lattice.SparseTensor, got Tensor"):
        ops.max_pool3d(x, 2, coordinates=torch.zeros(2, 4))


def test_max_pool3d_route_not_str_raises_type_error(x):
    with pytest.raises(TypeError, match=r"^\[max_pool3d\] route: expected a route name \(str\) or None, got int"):
        ops.max_pool3d(x, 2, route=3)


def test_max_pool3d_unknown_route_raises_value_error(x):
    with pytest.raises(ValueError, match=r"^\[max_pool3d\] route: expected one of 'cuda_csr_reduce', 'input_exclusive', 'csr_reduce', 'reference', got 'fast'$"):
        ops.max_pool3d(x, 2, route="fast")


def test_max_pool3d_forced_input_exclusive_forward_raises_value_error(x):
    with pytest.raises(ValueError, match=r"^\[max_pool3d\] route: expected an admitted route, got 'input_exclusive' \(rejected: runs the input gradient only"):
        ops.max_pool3d(x, 2, route="input_exclusive")


def test_max_pool3d_forced_input_exclusive_overlapping_backward_raises_value_error(x):
    p = ops.pool.plan_pool("max_pool3d", x, 3, 2, route="input_exclusive")
    dy = torch.zeros(int(p.n_out), 2, dtype=torch.float64)
    am = torch.zeros(int(p.n_out), 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^\[max_pool3d\] route: expected an admitted route, got 'input_exclusive' \(rejected: windows overlap on axis x"):
        core.pool_backward(p, to_core(dy), to_core(am))


def test_max_pool3d_duplicate_coords_raise_value_error():
    x = st([[0, 1, 1, 1], [0, 1, 1, 1]], c=1)
    with pytest.raises(ValueError, match=r"^\[max_pool3d\] coords: expected unique rows"):
        ops.max_pool3d(x, 2)


def test_pool_forward_core_feats_wrong_rows_raise_value_error(x):
    p = ops.pool.plan_pool("max_pool3d", x, 2)
    with pytest.raises(ValueError, match=rf"^\[max_pool3d\] feats: expected shape \(N_in={len(x)}, C\), got \(3, 2\)"):
        core.pool_forward(p, to_core(torch.zeros(3, 2)))


def test_pool_forward_core_integer_feats_raise_type_error(x):
    p = ops.pool.plan_pool("max_pool3d", x, 2)
    with pytest.raises(TypeError, match=r"^\[max_pool3d\] feats: expected float16, bfloat16, float32 or float64, got int32"):
        core.pool_forward(p, to_core(torch.zeros(len(x), 2, dtype=torch.int32)))


def test_pool_backward_core_grad_out_wrong_shape_raises_value_error(x):
    p = ops.pool.plan_pool("sum_pool3d", x, 2, mode="sum")
    with pytest.raises(ValueError, match=rf"^\[sum_pool3d\] grad_out: expected shape \(N_out={p.n_out}, C\), got \(1, 2, 3\)"):
        core.pool_backward(p, to_core(torch.zeros(1, 2, 3)), None)


def test_pool_backward_core_max_without_argmax_raises_value_error(x):
    p = ops.pool.plan_pool("max_pool3d", x, 2)
    with pytest.raises(ValueError, match=rf"^\[max_pool3d\] argmax: expected the forward's int32 \(N_out={p.n_out}, C=2\) argmax on the device of grad_out, got nothing"):
        core.pool_backward(p, to_core(torch.zeros(int(p.n_out), 2)), None)
    with pytest.raises(ValueError, match=r"^\[max_pool3d\] argmax: expected the forward's int32 .* got int64"):
        core.pool_backward(p, to_core(torch.zeros(int(p.n_out), 2)), to_core(torch.zeros(int(p.n_out), 2, dtype=torch.int64)))


def test_global_pool_negative_batch_id_raises_value_error():
    x = st([[0, 0, 0, 0], [-1, 0, 0, 0]], c=1)
    with pytest.raises(ValueError, match=r"^\[global_sum_pool\] coords: expected batch ids >= 0, got batch id -1 at row 1"):
        ops.global_sum_pool(x)


def test_global_max_pool_empty_batch_raises_value_error():
    x = st([[0, 0, 0, 0], [2, 0, 0, 0]], c=1)
    with pytest.raises(ValueError, match=r"^\[global_max_pool\] input: expected at least one row in every batch \(the max of an empty batch is undefined\), got no rows in batch 1 of 3"):
        ops.global_max_pool(x)
    xb = st([[0, 0, 0, 0]], c=1, batch_counts=[1, 0])
    with pytest.raises(ValueError, match=r"^\[global_max_pool\] input: .* got no rows in batch 1 of 2"):
        ops.global_max_pool(xb)


def test_global_pool_non_sparse_input_raises_type_error():
    with pytest.raises(TypeError, match=r"^\[global_avg_pool\] input: expected a lattice.SparseTensor, got ndarray"):
        ops.global_avg_pool(np.zeros((2, 4)))


def test_pool_transpose3d_stride_not_dividing_raises_value_error(x):
    with pytest.raises(ValueError, match=r"^\[pool_transpose3d\] stride: expected a divisor of the input tensor stride \(1, 1, 1\)"):
        ops.pool_transpose3d(x, 2)


def test_pool_transpose3d_target_at_wrong_stride_raises_value_error(x):
    coarse = st(random_coords(np.random.default_rng(0), 5), c=2, stride=2)
    with pytest.raises(ValueError, match=r"^\[pool_transpose3d\] coordinates: expected a target at the output stride \(1, 1, 1\), got stride \(2, 2, 2\)"):
        ops.pool_transpose3d(coarse, 2, coordinates=coarse)


def test_trilinear_upsample3d_stride_not_dividing_raises_value_error(x):
    with pytest.raises(ValueError, match=r"^\[trilinear_upsample3d\] stride: expected a divisor of the input tensor stride \(1, 1, 1\)"):
        ops.trilinear_upsample3d(x, 2)


def test_trilinear_upsample3d_stride_below_one_raises_value_error(x):
    with pytest.raises(ValueError, match=r"^\[trilinear_upsample3d\] stride: expected strides >= 1, got \(0, 0, 0\)"):
        ops.trilinear_upsample3d(x, 0)


def test_trilinear_upsample3d_target_stride_not_dividing_raises_value_error():
    coarse = st(LINE, c=1, stride=4)
    fine = st(LINE, c=1, stride=3)
    with pytest.raises(ValueError, match=r"^\[trilinear_upsample3d\] coordinates: expected a tensor stride dividing the input stride \(4, 4, 4\), got stride \(3, 3, 3\)"):
        ops.trilinear_upsample3d(coarse, coordinates=fine)


def test_trilinear_upsample3d_stride_disagreeing_with_target_raises_value_error():
    coarse = st(LINE, c=1, stride=4)
    fine = st(LINE, c=1, stride=2)
    with pytest.raises(ValueError, match=r"^\[trilinear_upsample3d\] stride: expected \(2, 2, 2\) \(input stride \(4, 4, 4\) / coordinates stride \(2, 2, 2\)\) or None, got \(4, 4, 4\)"):
        ops.trilinear_upsample3d(coarse, 4, coordinates=fine)
    assert len(ops.trilinear_upsample3d(coarse, 2, coordinates=fine)) == 3


@pytest.mark.parametrize(
    "make, message",
    [(lambda: nn.MaxPool3d(0), r"^\[MaxPool3d\] kernel_size: expected values >= 1, got \(0, 0, 0\)"),
     (lambda: nn.AvgPool3d(2, stride=0), r"^\[AvgPool3d\] stride: expected values >= 1, got \(0, 0, 0\)"),
     (lambda: nn.SumPool3d(2, padding=-1), r"^\[SumPool3d\] padding: expected values >= 0, got \(-1, -1, -1\)"),
     (lambda: nn.MaxPool3d(2, dilation=0), r"^\[MaxPool3d\] dilation: expected values >= 1, got \(0, 0, 0\)"),
     (lambda: nn.PoolTranspose3d(0), r"^\[PoolTranspose3d\] kernel_size: expected values >= 1, got \(0, 0, 0\)"),
     (lambda: nn.TrilinearUpsample3d(0), r"^\[TrilinearUpsample3d\] stride: expected values >= 1, got \(0, 0, 0\)")],
)
def test_nn_pool_module_bad_geometry_raises_value_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_explain_pool_bad_pass_raises_value_error(x):
    with pytest.raises(ValueError, match=r"^\[explain\] pass: expected 'forward' or 'input_grad' for a pooling op, got 'weight_grad'"):
        lattice.explain("max_pool3d", x, 2, pass_="weight_grad")


def test_explain_unknown_op_lists_pool_ops(x):
    with pytest.raises(ValueError, match=r"^\[explain\] op: expected one of .*global_max_pool.*trilinear_upsample3d"):
        lattice.explain("min_pool3d", x, 2)
