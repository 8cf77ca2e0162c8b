"""Sparse algebra vs the float64 numpy oracle (SEMANTICS.md "Sparse algebra and coordinate
utilities"): alignment by coordinate value with inner/left/right/outer joins and fills, the
combine ops and their gradients in both operands, the output identity rule, both CPU routes, the
operators on SparseTensor and every validation message."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lattice
import oracle
from lattice import ops
from lattice.routes import route_names
from oracle import algebra as OA
from conftest import random_coords

OPS = ["sparse_add", "sparse_sub", "sparse_mul", "sparse_maximum", "sparse_minimum", "sparse_cat_aligned"]
COMBINE = {"sparse_add": "add", "sparse_sub": "sub", "sparse_mul": "mul", "sparse_maximum": "maximum",
           "sparse_minimum": "minimum", "sparse_cat_aligned": "cat"}
JOINS = ["inner", "left", "right", "outer"]
ROUTES = route_names("algebra", device="cpu")  # ["hashed", "reference"], from the route table
TORCH_DTYPE = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def _pair(rng, n=60, c=3, c_rhs=None, dtype=torch.float64, stride=1, batch_counts=False):
    """Two SparseTensors over overlapping random supports (shuffled independently)."""
    pool = random_coords(rng, n, batches=2, extent=4, spread=3)
    m = pool.shape[0]
    take_l = rng.random(m) < 0.7
    take_r = rng.random(m) < 0.6
    lc, rc = pool[take_l], pool[take_r]
    lc, rc = lc[rng.permutation(len(lc))], rc[rng.permutation(len(rc))]
    lf = torch.from_numpy(rng.standard_normal((len(lc), c))).to(dtype)
    rf = torch.from_numpy(rng.standard_normal((len(rc), c if c_rhs is None else c_rhs))).to(dtype)

    def counts(cc):
        return np.bincount(cc[:, 0], minlength=2).tolist() if batch_counts else None

    a = lattice.SparseTensor(torch.from_numpy(lc), lf, stride, counts(lc))
    b = lattice.SparseTensor(torch.from_numpy(rc), rf, stride, counts(rc))
    return a, b


def _np(t):
    return t.detach().double().numpy() if t.dtype == torch.bfloat16 else t.detach().numpy()


def _expected(op, a, b, join, fill=0.0, dtype_name="f64"):
    lf = oracle.round_to_dtype(a.feats, dtype_name)
    rf = oracle.round_to_dtype(b.feats, dtype_name)
    fill_r = float(oracle.round_to_dtype(np.array([fill]), dtype_name)[0]) if np.isfinite(fill) else fill
    coords, l, r = OA.align(a.coords.numpy(), b.coords.numpy(), join)
    return coords, l, r, OA.combine(COMBINE[op], lf, rf, l, r, fill_r)


# ---- forward vs the oracle ---------------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("join", JOINS)
@pytest.mark.parametrize("op", OPS)
def test_sparse_op_random_supports_equal_oracle(rng, op, join, route):
    a, b = _pair(rng, c_rhs=2 if op == "sparse_cat_aligned" else None)
    y = getattr(ops, op)(a, b, join=join, route=route)
    coords, _, _, feats = _expected(op, a, b, join)
    np.testing.assert_array_equal(y.coords.numpy(), coords)
    oracle.assert_close(y.feats, feats, "f64", f"{op} {join} {route}")
    assert y.stride == a.stride and y.feats.dtype == torch.float64


@pytest.mark.parametrize("op", OPS)
def test_sparse_op_default_join_follows_semantics(rng, op):
    a, b = _pair(rng)
    y = getattr(ops, op)(a, b)
    join = "outer" if op in ("sparse_add", "sparse_sub") else "inner"
    coords, _, _, feats = _expected(op, a, b, join)
    np.testing.assert_array_equal(y.coords.numpy(), coords)
    oracle.assert_close(y.feats, feats, "f64", op)


@pytest.mark.parametrize("fill", [2.5, -np.inf])
@pytest.mark.parametrize("op", ["sparse_add", "sparse_maximum", "sparse_cat_aligned"])
def test_sparse_op_fill_reaches_every_missing_side(rng, op, fill):
    a, b = _pair(rng)
    y = getattr(ops, op)(a, b, join="outer", fill=fill)
    _, l, r, feats = _expected(op, a, b, "outer", fill)
    assert (l < 0).any() and (r < 0).any(), "no missing side exercised"
    oracle.assert_close(y.feats, feats, "f64", f"{op} fill={fill}")


@pytest.mark.parametrize("dtype_name", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_sparse_op_low_precision_equals_oracle_at_tolerance(rng, op, dtype_name):
    a, b = _pair(rng, dtype=TORCH_DTYPE[dtype_name])
    y = getattr(ops, op)(a, b, join="outer", fill=0.3)
    coords, _, _, feats = _expected(op, a, b, "outer", 0.3, dtype_name)
    assert y.feats.dtype == TORCH_DTYPE[dtype_name]
    np.testing.assert_array_equal(y.coords.numpy(), coords)
    oracle.assert_close(y.feats, feats, dtype_name, f"{op} {dtype_name}")


def test_sparse_add_three_points_on_a_line_hand_computed():
    a = lattice.SparseTensor(torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0]]), torch.tensor([[1.0], [2.0], [3.0]]))
    b = lattice.SparseTensor(torch.tensor([[0, 2, 0, 0], [0, 5, 0, 0], [0, 1, 0, 0]]), torch.tensor([[10.0], [20.0], [30.0]]))
    y = ops.sparse_add(a, b)
    assert y.coords[:, 1].tolist() == [0, 1, 2, 5] and y.feats[:, 0].tolist() == [1.0, 32.0, 13.0, 20.0]
    y = ops.sparse_sub(a, b, join="right")
    assert y.key == b.key and y.feats[:, 0].tolist() == [-7.0, -20.0, -28.0]
    y = ops.sparse_mul(a, b)
    assert y.coords[:, 1].tolist() == [1, 2] and y.feats[:, 0].tolist() == [60.0, 30.0]


def test_sparse_add_cube_2x2x2_against_its_shifted_copy_hand_computed():
    cube = torch.tensor([[0, x, y, z] for x in (0, 1) for y in (0, 1) for z in (0, 1)], dtype=torch.int32)
    a = lattice.SparseTensor(cube, torch.ones(8, 1, dtype=torch.float64))
    shifted = cube.clone()
    shifted[:, 1] += 1  # x + 1: the x=1 face overlaps
    b = lattice.SparseTensor(shifted, torch.full((8, 1), 2.0, dtype=torch.float64))
    y = ops.sparse_add(a, b)
    assert len(y) == 12
    by_coord = {tuple(c): float(f) for c, f in zip(y.coords.tolist(), y.feats[:, 0])}
    assert sum(v == 3.0 for v in by_coord.values()) == 4  # overlap face x=1
    assert by_coord[(0, 0, 0, 0)] == 1.0 and by_coord[(0, 2, 1, 1)] == 2.0 and by_coord[(0, 1, 0, 1)] == 3.0
    inner = ops.sparse_mul(a, b)
    assert sorted(inner.coords[:, 1].tolist()) == [1, 1, 1, 1] and torch.all(inner.feats == 2.0)


def test_sparse_maximum_ties_choose_lhs_and_get_the_gradient():
    c = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.int32)
    xf = torch.tensor([[1.0, 5.0], [2.0, 0.0]], dtype=torch.float64, requires_grad=True)
    yf = torch.tensor([[1.0, 4.0], [3.0, 0.0]], dtype=torch.float64, requires_grad=True)
    x = lattice.SparseTensor(c, xf)
    y = lattice.SparseTensor(c.clone(), yf)
    out = ops.sparse_maximum(x, y)
    assert out.feats.tolist() == [[1.0, 5.0], [3.0, 0.0]]
    out.feats.sum().backward()
    assert xf.grad.tolist() == [[1.0, 1.0], [0.0, 1.0]]  # ties (1 vs 1, 0 vs 0) go to lhs
    assert yf.grad.tolist() == [[0.0, 0.0], [1.0, 0.0]]
    xf.grad = yf.grad = None
    ops.sparse_minimum(x, y).feats.sum().backward()
    assert xf.grad.tolist() == [[1.0, 0.0], [1.0, 1.0]] and yf.grad.tolist() == [[0.0, 1.0], [0.0, 0.0]]


def test_sparse_maximum_nan_propagates_from_either_side():
    c = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.int32)
    x = lattice.SparseTensor(c, torch.tensor([[float("nan")], [1.0]]))
    y = lattice.SparseTensor(c.clone(), torch.tensor([[1.0], [float("nan")]]))
    for fn in (ops.sparse_maximum, ops.sparse_minimum):
        assert torch.isnan(fn(x, y).feats).all()


def test_sparse_op_non_contiguous_features_equal_oracle(rng):
    a, b = _pair(rng)
    wide_l = torch.from_numpy(rng.standard_normal((len(a), 6)))
    wide_r = torch.from_numpy(rng.standard_normal((3, len(b)))).t()
    x, y = a.replace_feats(wide_l[:, ::2]), b.replace_feats(wide_r)
    assert not x.feats.is_contiguous() and not y.feats.is_contiguous()
    out = ops.sparse_sub(x, y)
    _, _, _, feats = _expected("sparse_sub", x, y, "outer")
    oracle.assert_close(out.feats, feats, "f64", "non-contiguous")


def test_sparse_op_empty_operands_give_defined_results():
    e = lattice.SparseTensor(torch.zeros(0, 4, dtype=torch.int32), torch.zeros(0, 2))
    a = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2))
    assert len(ops.sparse_mul(a, e)) == 0
    y = ops.sparse_add(e, a)
    assert y.key == a.key and y.feats.tolist() == [[1.0, 1.0]]  # rows are exactly rhs's
    assert len(ops.sparse_add(e, e)) == 0


# ---- identity of the output --------------------------------------------------------------------


def test_same_key_is_the_identity_fast_path_without_alignment(rng):
    a, _ = _pair(rng)
    b = a.replace_feats(a.feats * 2)
    for op in OPS:
        y = getattr(ops, op)(a, b, join="inner")
        assert y.key == a.key
    e = lattice.explain("sparse_add", a, b)
    assert "identity: no alignment" in e.problem and e.problem.startswith("sparse_add forward")
    torch.testing.assert_close(ops.sparse_add(a, b).feats, a.feats * 3)


def test_output_identity_rule_reuses_the_operand_whose_rows_it_has(rng):
    a, b = _pair(rng)
    assert ops.sparse_add(a, b, join="left").key == a.key
    assert ops.sparse_add(a, b, join="right").key == b.key
    fresh = ops.sparse_add(a, b, join="outer")
    assert fresh.key not in (a.key, b.key)
    inner = ops.sparse_mul(a, b)
    assert inner.key not in (a.key, b.key)
    # equal values in another array: every lhs row found -> lhs's key (inner and outer)
    perm = torch.randperm(len(a), generator=torch.Generator().manual_seed(0))
    same_values = lattice.SparseTensor(a.coords[perm].clone(), a.feats[perm])
    assert same_values.key != a.key
    assert ops.sparse_mul(a, same_values).key == a.key
    assert ops.sparse_add(a, same_values).key == a.key
    torch.testing.assert_close(ops.sparse_add(a, same_values).feats, 2 * a.feats)
    # inner join whose rows are exactly rhs's, in rhs order -> rhs's key
    sub = lattice.SparseTensor(a.coords[:5].clone(), a.feats[:5])
    assert ops.sparse_mul(a, sub).key == sub.key


def test_new_output_set_counts_batches_when_operands_have_them(rng):
    a, b = _pair(rng, batch_counts=True)
    y = ops.sparse_add(a, b)
    assert y.batch_counts == np.bincount(y.coords[:, 0].numpy(), minlength=2).tolist()
    a2 = lattice.SparseTensor(a.coords, a.feats)
    assert ops.sparse_add(a2, b).batch_counts is None


def test_output_keeps_the_stride_and_relations_work_on_it(rng):
    a, b = _pair(rng, stride=2)
    y = ops.sparse_add(a, b)
    assert y.stride == (2, 2, 2)
    w = torch.randn(4, 3, 3, 3, 3, dtype=torch.float64)
    z = ops.subm_conv3d(y, w)
    assert z.key == y.key


# ---- gradients ---------------------------------------------------------------------------------


@pytest.mark.parametrize("join", JOINS)
@pytest.mark.parametrize("op", OPS)
def test_sparse_op_gradcheck_f64_both_operands(rng, op, join):
    a, b = _pair(rng, n=30, c=2, c_rhs=3 if op == "sparse_cat_aligned" else None)
    if op in ("sparse_maximum", "sparse_minimum"):  # keep clear of ties for finite differences
        b = b.replace_feats(b.feats + 0.05)
    lf = a.feats.clone().requires_grad_(True)
    rf = b.feats.clone().requires_grad_(True)

    def fn(x, y):
        return getattr(ops, op)(a.replace_feats(x), b.replace_feats(y), join=join, fill=0.7).feats

    assert torch.autograd.gradcheck(fn, (lf, rf), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("op", OPS)
def test_sparse_op_backward_equals_oracle(rng, op, route):
    a, b = _pair(rng)
    lf = a.feats.clone().requires_grad_(True)
    rf = b.feats.clone().requires_grad_(True)
    y = getattr(ops, op)(a.replace_feats(lf), b.replace_feats(rf), join="outer", fill=0.4, route=route)
    g = torch.from_numpy(rng.standard_normal(tuple(y.feats.shape)))
    y.feats.backward(g)
    _, l, r, _ = _expected(op, a, b, "outer", 0.4)
    dl, dr = OA.combine_backward(COMBINE[op], a.feats.numpy(), b.feats.numpy(), l, r, g.numpy(), 0.4)
    oracle.assert_close(lf.grad, dl, "f64", f"{op} d lhs")
    oracle.assert_close(rf.grad, dr, "f64", f"{op} d rhs")


def test_sparse_op_gradient_of_one_operand_only(rng):
    a, b = _pair(rng)
    lf = a.feats.clone().requires_grad_(True)
    y = ops.sparse_mul(a.replace_feats(lf), b)
    y.feats.sum().backward()
    _, l, r, _ = _expected("sparse_mul", a, b, "inner")
    dl, _ = OA.combine_backward("mul", a.feats.numpy(), b.feats.numpy(), l, r, np.ones(tuple(y.feats.shape)))
    oracle.assert_close(lf.grad, dl, "f64", "d lhs only")


def test_sparse_add_same_key_gradient_reaches_both(rng):
    a, _ = _pair(rng)
    lf = a.feats.clone().requires_grad_(True)
    rf = a.feats.clone().requires_grad_(True)
    ops.sparse_sub(a.replace_feats(lf), a.replace_feats(rf)).feats.sum().backward()
    assert torch.all(lf.grad == 1) and torch.all(rf.grad == -1)


# ---- routes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_hashed_route_is_bitwise_equal_to_reference_on_large_inputs_for_any_thread_count(rng, op):
    """Large enough to pass the parallel thresholds of the hashed route (rows and elements)."""
    pool = random_coords(rng, 20000, batches=4, extent=40, spread=60)
    lc = pool[rng.random(len(pool)) < 0.7]
    rc = pool[rng.random(len(pool)) < 0.7]
    a = lattice.SparseTensor(torch.from_numpy(lc), torch.from_numpy(rng.standard_normal((len(lc), 8))).float())
    b = lattice.SparseTensor(torch.from_numpy(rc), torch.from_numpy(rng.standard_normal((len(rc), 8))).float())
    results = {}
    before = lattice.get_num_threads()
    try:
        for threads in (1, 2):
            lattice.set_num_threads(threads)
            for route in ROUTES:
                lf = a.feats.clone().requires_grad_(True)
                rf = b.feats.clone().requires_grad_(True)
                y = getattr(ops, op)(a.replace_feats(lf), b.replace_feats(rf), join="outer", route=route)
                y.feats.backward(torch.ones_like(y.feats))
                results[(threads, route)] = (y.coords, y.feats.detach(), lf.grad, rf.grad)
    finally:
        lattice.set_num_threads(before)
    ref = results[(1, "reference")]
    for key, got in results.items():
        for name, x, e in zip(("coords", "feats", "d lhs", "d rhs"), got, ref):
            assert torch.equal(x, e), f"{key} {name}"


def test_explain_lists_both_routes_and_names_the_join(rng):
    a, b = _pair(rng)
    e = lattice.explain("sparse_mul", a, b)
    assert e.chosen == "hashed" and [r["route"] for r in e.rows] == ["hashed", "cuda_hashed", "reference"]
    assert not e.rows[1]["admitted"] and "cuda" in e.rows[1]["reason"]  # the data is on the CPU
    assert e.problem.startswith("sparse_mul align (inner join)")
    e = lattice.explain("sparse_add", a, b, join="left", pass_="backward")
    assert e.problem.startswith("sparse_add backward (add)") and e.chosen == "hashed"
    e = lattice.explain("sparse_cat_aligned", a, b, pass_="combine")
    assert "C=6" in e.problem


def test_forcing_the_reference_route_by_environment(rng, monkeypatch):
    a, b = _pair(rng)
    monkeypatch.setenv("LATTICE_FORCE_ROUTE", "algebra:reference")
    e = lattice.explain("sparse_add", a, b)
    assert e.chosen == "reference" and e.forced == "reference"
    y = ops.sparse_add(a, b)
    coords, _, _, feats = _expected("sparse_add", a, b, "outer")
    oracle.assert_close(y.feats, feats, "f64", "forced reference")


# ---- operators ---------------------------------------------------------------------------------


def test_operators_between_sparse_tensors_use_default_joins(rng):
    a, b = _pair(rng)
    for sym, op in (("+", "sparse_add"), ("-", "sparse_sub"), ("*", "sparse_mul")):
        y = eval(f"a {sym} b")
        z = getattr(ops, op)(a, b)
        assert torch.equal(y.coords, z.coords) and torch.equal(y.feats, z.feats), sym


def test_operators_with_numbers_and_broadcast_tensors_keep_identity(rng):
    a, _ = _pair(rng)
    row = torch.arange(3, dtype=torch.float64)
    for y, expected in (
        (a + 1.5, a.feats + 1.5), (2 + a, a.feats + 2), (a - row, a.feats - row), (1 - a, 1 - a.feats),
        (a * 3, a.feats * 3), (0.5 * a, a.feats * 0.5), (-a, -a.feats),
    ):
        assert y.key == a.key
        torch.testing.assert_close(y.feats, expected)


def test_operator_with_a_non_broadcasting_tensor_raises():
    a = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2))
    with pytest.raises(ValueError, match=r"^\[sparse_add\] rhs: expected a number or a tensor broadcasting to the features \(1, 2\), got shape \(3, 1, 2\)"):
        a + torch.ones(3, 1, 2)


def test_operator_with_an_unsupported_type_raises_type_error():
    a = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2))
    with pytest.raises(TypeError):
        a + "x"
    with pytest.raises(TypeError):
        a * True


# ---- validation: one test per branch -----------------------------------------------------------


def test_sparse_add_rejects_a_non_sparse_lhs():
    a = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2))
    with pytest.raises(TypeError, match=r"^\[sparse_add\] lhs: expected a lattice.SparseTensor, got Tensor$"):
        ops.sparse_add(torch.ones(1, 2), a)


def test_sparse_mul_rejects_a_non_sparse_rhs():
    a = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2))
    with pytest.raises(TypeError, match=r"^\[sparse_mul\] rhs: expected a lattice.SparseTensor, got ndarray$"):
        ops.sparse_mul(a, np.ones((1, 2)))


def test_sparse_op_rejects_mismatched_strides():
    a = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2), stride=1)
    b = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2), stride=(2, 2, 1))
    with pytest.raises(ValueError, match=r"^\[sparse_sub\] rhs: expected stride \(1, 1, 1\) \(the stride of lhs\), got stride \(2, 2, 1\)$"):
        ops.sparse_sub(a, b)


def test_sparse_op_rejects_mismatched_channels():
    a = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2))
    b = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"^\[sparse_maximum\] rhs: expected C=2 feature columns \(those of lhs\), got 3$"):
        ops.sparse_maximum(a, b)
    assert ops.sparse_cat_aligned(a, b).feats.shape == (1, 5)  # concatenation takes any widths


def test_sparse_op_rejects_mismatched_dtypes():
    a = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2))
    b = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"^\[sparse_minimum\] rhs: expected float32 features \(the dtype of lhs\), got float64$"):
        ops.sparse_minimum(a, b)


def test_sparse_op_rejects_an_unknown_join():
    a = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2))
    with pytest.raises(ValueError, match=r"^\[sparse_add\] join: expected one of 'inner', 'left', 'right', 'outer', got 'full'$"):
        ops.sparse_add(a, a, join="full")


def test_sparse_op_rejects_a_join_that_is_not_a_string():
    a = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2))
    with pytest.raises(TypeError, match=r"^\[sparse_add\] join: expected one of 'inner', 'left', 'right', 'outer' or None, got int$"):
        ops.sparse_add(a, a, join=1)


def test_sparse_op_rejects_a_fill_that_is_not_a_number():
    a = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2))
    with pytest.raises(TypeError, match=r"^\[sparse_cat_aligned\] fill: expected a real number, got str$"):
        ops.sparse_cat_aligned(a, a, fill="0")
    with pytest.raises(TypeError, match=r"^\[sparse_add\] fill: expected a real number, got bool$"):
        ops.sparse_add(a, a, fill=True)


def test_sparse_op_rejects_an_unknown_route():
    a = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2))
    b = lattice.SparseTensor(torch.tensor([[0, 1, 2, 4]]), torch.ones(1, 2))
    with pytest.raises(ValueError, match=r"^\[sparse_add\] route: expected one of 'hashed', 'cuda_hashed', 'reference', got 'fast'$"):
        ops.sparse_add(a, b, route="fast")


def test_sparse_op_rejects_a_route_that_is_not_a_string():
    a = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2))
    with pytest.raises(TypeError, match=r"^\[sparse_add\] route: expected a route name \(str\) or None, got int$"):
        ops.sparse_add(a, a, route=3)


def test_sparse_op_rejects_repeated_coordinate_rows():
    a = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]]), torch.ones(2, 2))
    b = lattice.SparseTensor(torch.tensor([[0, 1, 2, 3]]), torch.ones(1, 2))
    with pytest.raises(ValueError, match=r"^\[sparse_add\] coords: expected unique rows, got row 1 \(0, 1, 2, 3\) equal to row 0$"):
        ops.sparse_add(a, b)
    with pytest.raises(ValueError, match=r"^\[sparse_mul\] coords: expected unique rows"):
        ops.sparse_mul(b, a)


def test_explain_rejects_an_unknown_pass(rng):
    a, b = _pair(rng)
    with pytest.raises(ValueError, match=r"^\[explain\] pass_: expected 'forward', 'align', 'combine' or 'backward', got 'input_grad'$"):
        lattice.explain("sparse_add", a, b, pass_="input_grad")


def test_cat_of_equal_keys_still_concatenates_and_rejects_other_keys(rng):
    a, b = _pair(rng)
    y = ops.cat([a, a.replace_feats(a.feats * 2)])
    assert y.key == a.key and y.feats.shape[1] == 6
    with pytest.raises(ValueError, match=r"^\[cat\] tensors\[1\]: expected the coordinate identity of tensors\[0\]"):
        ops.cat([a, b])
