"""voxelize, build_point_voxel_map and devoxelize vs the float64 numpy oracle
(tests/oracle/point_voxel.py; SEMANTICS.md "Point <-> voxel"): values, gradients, hand cases,
dtypes, routes (parallel vs reference, bitwise) and every validation branch."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import lattice
import oracle
from lattice import SparseTensor, ops
from lattice._core import core, to_core
from lattice.routes import route_names
from oracle import point_voxel as pvo

DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
REDUCTIONS = ["sum", "mean", "max"]
ROUTES = route_names("point_voxel", device="cpu")  # ["parallel", "reference"], from the route table


def _np(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy().astype(np.float64)


def _cloud(rng, n, batches=1, scale=1.5, dtype=torch.float64):
    """Points in [-scale, scale)^3 (negative coordinates included) and batch ids."""
    p = torch.from_numpy(rng.uniform(-scale, scale, (n, 3))).to(dtype)
    b = torch.from_numpy(rng.integers(0, batches, n))
    return p, b


def _feats(rng, n, c, name):
    return torch.from_numpy(rng.standard_normal((n, c))).to(DTYPES[name])


def _voxels_for(rng, points, voxel_size, batch=None, keep=0.7, c=3, dtype=torch.float64):
    """A voxel tensor holding a random subset (``keep``) of the voxels of ``points``."""
    coords, _, _ = ops.sparse_quantize(points, voxel_size, batch)
    sel = torch.from_numpy(rng.random(coords.shape[0]) < keep)
    coords = coords[sel]
    return SparseTensor(coords, torch.from_numpy(rng.standard_normal((coords.shape[0], c))).to(dtype))


# ---- voxelize ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("route", ROUTES)
def test_voxelize_random_batched_points_equal_oracle(rng, name, reduction, route):
    p, b = _cloud(rng, 300, batches=3)
    f = _feats(rng, 300, 4, name)
    x = ops.voxelize(p, f, (0.4, 0.5, 0.6), reduction, b, origin=(0.1, -0.2, 0.05), route=route)
    coords, out, _ = pvo.voxelize(p.numpy(), oracle.round_to_dtype(f, name), (0.4, 0.5, 0.6), reduction,
                                  b.numpy(), (0.1, -0.2, 0.05))
    assert isinstance(x, SparseTensor) and x.stride == (1, 1, 1) and x.feats.dtype == f.dtype
    np.testing.assert_array_equal(x.coords.numpy(), coords)
    assert (x.coords[:, 1:] < 0).any() and len(set(x.coords[:, 0].tolist())) == 3
    oracle.assert_close(x.feats, out, name, f"voxelize {reduction}")


@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_voxelize_backward_equals_oracle(rng, name, reduction):
    p, b = _cloud(rng, 250, batches=2)
    f = _feats(rng, 250, 3, name).requires_grad_()
    x = ops.voxelize(p, f, 0.5, reduction, b)
    dy = torch.from_numpy(rng.standard_normal(tuple(x.feats.shape))).to(f.dtype)
    (g,) = torch.autograd.grad(x.feats, f, dy)
    _, inverse, counts = oracle.sparse_quantize(p.numpy(), 0.5, b.numpy())
    _, _, argmax = pvo.voxelize(p.numpy(), oracle.round_to_dtype(f, name), 0.5, reduction, b.numpy())
    ref = pvo.voxelize_backward(oracle.round_to_dtype(dy, name), inverse, counts, reduction, argmax)
    assert g.dtype == f.dtype
    oracle.assert_close(g, ref, name, f"voxelize {reduction} grad")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_voxelize_gradcheck_f64(rng, reduction):
    p, b = _cloud(rng, 40, batches=2, scale=1.0)
    f = torch.from_numpy(rng.standard_normal((40, 2))).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: ops.voxelize(p, t, 0.6, reduction, b).feats, (f,), eps=1e-6, atol=1e-8)


def test_voxelize_max_ties_take_the_first_point_and_its_gradient():
    p = torch.tensor([[0.1, 0.1, 0.1], [0.2, 0.2, 0.2], [0.3, 0.3, 0.3], [1.5, 0, 0]], dtype=torch.float64)
    f = torch.tensor([[2.0, 1.0], [5.0, 7.0], [5.0, 7.0], [-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    x = ops.voxelize(p, f, 1.0, "max")
    assert x.feats.tolist() == [[5.0, 7.0], [-1.0, -2.0]]
    (g,) = torch.autograd.grad(x.feats, f, torch.tensor([[10.0, 20.0], [30.0, 40.0]], dtype=torch.float64))
    assert g.tolist() == [[0, 0], [10, 20], [0, 0], [30, 40]]


@pytest.mark.parametrize("route", ROUTES)
def test_voxelize_max_nan_feature_is_the_maximum(route):
    p = torch.zeros(3, 3)
    f = torch.tensor([[1.0], [float("nan")], [3.0]], requires_grad=True)
    x = ops.voxelize(p, f, 1.0, "max", route=route)
    assert torch.isnan(x.feats).all()
    (g,) = torch.autograd.grad(x.feats, f, torch.ones(1, 1))
    assert g.tolist() == [[0.0], [1.0], [0.0]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_voxelize_points_on_voxel_borders_use_the_float64_floor(rng, dtype):
    p = (torch.from_numpy(rng.integers(-30, 30, (400, 3))) * 0.1).to(dtype)
    f = torch.ones(400, 1, dtype=torch.float64)
    x = ops.voxelize(p, f, 0.1, "sum")
    coords, counts, _ = pvo.voxelize(p.numpy(), np.ones((400, 1)), 0.1, "sum")
    np.testing.assert_array_equal(x.coords.numpy(), coords)
    np.testing.assert_array_equal(x.feats.numpy(), counts)


def test_voxelize_hand_computed_mean_with_negative_coordinates():
    p = torch.tensor([[0.5, 0.5, 0.5], [-0.5, -0.01, 2.0], [0.9, 0.1, 0.2], [-0.9, -0.9, 2.9]])
    f = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    x = ops.voxelize(p, f, 1.0)
    assert x.coords.tolist() == [[0, 0, 0, 0], [0, -1, -1, 2]]
    assert x.feats.tolist() == [[3.0, 4.0], [5.0, 6.0]]


def test_voxelize_empty_points_give_an_empty_tensor_with_channels():
    x = ops.voxelize(torch.zeros(0, 3), torch.zeros(0, 5), 0.5, "max")
    assert tuple(x.coords.shape) == (0, 4) and tuple(x.feats.shape) == (0, 5)


def test_voxelize_numpy_inputs_and_int32_batch_equal_torch(rng):
    p, b = _cloud(rng, 60, batches=2)
    f = _feats(rng, 60, 2, "f32")
    a = ops.voxelize(p.numpy(), f.numpy(), 0.5, "sum", b.numpy().astype(np.int32))
    c = ops.voxelize(p, f, 0.5, "sum", b)
    assert torch.equal(a.coords, c.coords) and torch.equal(a.feats, c.feats)


def test_voxelize_output_feeds_a_submanifold_conv(rng):
    p, b = _cloud(rng, 200, batches=2)
    x = ops.voxelize(p, _feats(rng, 200, 3, "f32"), 0.3, "mean", b)
    y = ops.subm_conv3d(x, torch.randn(4, 3, 3, 3, 3))
    assert y.key == x.key and tuple(y.feats.shape) == (len(x), 4)


# ---- build_point_voxel_map ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["nearest", "trilinear"])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("pdtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("route", ROUTES)
def test_build_point_voxel_map_random_batched_equals_oracle(rng, mode, normalize, pdtype, route):
    p, b = _cloud(rng, 300, batches=2, dtype=pdtype)
    vs = (0.3, 0.4, 0.5)
    v = _voxels_for(rng, p, vs, b)
    m = ops.build_point_voxel_map(p, v, mode, normalize, voxel_size=vs, origin=0.05, batch_indices=b, route=route)
    idx, w = pvo.point_voxel_map(p.numpy(), v.coords.numpy(), vs, mode, normalize, b.numpy(), 0.05)
    assert m.indices.dtype == torch.int64 and m.weights.dtype == pdtype
    assert tuple(m.indices.shape) == (300, 8) and tuple(m.weights.shape) == (300, 8)
    np.testing.assert_array_equal(m.indices.numpy(), idx)
    oracle.assert_close(m.weights, w, "f64" if pdtype == torch.float64 else "f32", "weights")
    assert (m.indices >= 0).any() and (m.indices < 0).any()
    assert m.mode == mode and m.normalize == normalize and m.voxel_key == v.key
    assert (m.n_points, m.n_voxels) == (300, len(v))


def test_build_point_voxel_map_nearest_matches_voxelize_inverse(rng):
    p, b = _cloud(rng, 200, batches=3)
    x = ops.voxelize(p, torch.zeros(200, 1), 0.25, "sum", b)
    _, inverse, _ = ops.sparse_quantize(p, 0.25, b)
    m = ops.build_point_voxel_map(p, x, "nearest", voxel_size=0.25, batch_indices=b)
    assert torch.equal(m.indices[:, 0], inverse) and (m.weights[:, 0] == 1).all()
    assert (m.indices[:, 1:] == -1).all() and (m.weights[:, 1:] == 0).all()


def test_build_point_voxel_map_points_on_borders_and_negative_coordinates():
    v = SparseTensor(torch.tensor([[0, 0, 0, 0], [0, -1, 0, 0], [0, -1, -1, -1]]), torch.zeros(3, 1))
    p = torch.tensor([[0.0, 0.0, 0.0], [-1e-12, 0.5, 0.5], [-0.25, -0.25, -0.25], [1.0, 0.0, 0.0]],
                     dtype=torch.float64)
    m = ops.build_point_voxel_map(p, v, "nearest", voxel_size=1.0)
    assert m.indices[:, 0].tolist() == [0, 1, 2, -1]
    t = ops.build_point_voxel_map(p, v, "trilinear", False, voxel_size=1.0)
    # (-0.25,)*3: lower corner (-1,-1,-1) = row 2 at k=0 with 0.75^3, (0,0,0) = row 0 at k=7 with 0.25^3
    assert t.indices[2, 0] == 2 and t.indices[2, 7] == 0
    assert t.weights[2, 0].item() == pytest.approx(27 / 64, abs=1e-15)
    assert t.weights[2, 7].item() == pytest.approx(1 / 64, abs=1e-15)


def test_build_point_voxel_map_point_with_all_corners_missing_gets_zeros():
    v = SparseTensor(torch.tensor([[0, 0, 0, 0]]), torch.ones(1, 2))
    p = torch.tensor([[0.5, 0.5, 0.5], [10.0, 10.0, 10.0]])
    for mode in ("nearest", "trilinear"):
        m = ops.build_point_voxel_map(p, v, mode, voxel_size=1.0)
        assert (m.indices[1] == -1).all() and (m.weights[1] == 0).all()
        out = ops.devoxelize(v, m)
        assert out.tolist() == [[1.0, 1.0], [0.0, 0.0]]


def test_build_point_voxel_map_other_batch_does_not_match():
    v = SparseTensor(torch.tensor([[1, 0, 0, 0]]), torch.ones(1, 1))
    p = torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]])
    m = ops.build_point_voxel_map(p, v, voxel_size=1.0, batch_indices=torch.tensor([0, 1]))
    assert m.indices[:, 0].tolist() == [-1, 0]


@pytest.mark.parametrize("mode", ["nearest", "trilinear"])
def test_build_point_voxel_map_stride2_tensor_uses_voxel_size_times_stride(rng, mode):
    p, b = _cloud(rng, 200, batches=2)
    x = ops.voxelize(p, torch.ones(200, 2, dtype=torch.float64), 0.2, "sum", b)
    y = ops.conv3d(x, torch.ones(2, 2, 2, 2, 2, dtype=torch.float64), stride=2)
    assert y.stride == (2, 2, 2)
    m = ops.build_point_voxel_map(p, y, mode, voxel_size=0.2, batch_indices=b)
    idx, w = pvo.point_voxel_map(p.numpy(), y.coords.numpy(), 0.2, mode, True, b.numpy(), stride=2)
    np.testing.assert_array_equal(m.indices.numpy(), idx)
    oracle.assert_close(m.weights, w, "f64")
    if mode == "nearest":  # every point lies in the downsampled voxel of its own voxel
        assert (m.indices[:, 0] >= 0).all()
        coords, _, _ = ops.sparse_quantize(p, 0.4, b)
        assert torch.equal(y.coords[m.indices[:, 0]], coords[ops.sparse_quantize(p, 0.4, b)[1]])


def test_build_point_voxel_map_voxel_csr_lists_every_entry_by_voxel(rng):
    p, _ = _cloud(rng, 150)
    v = _voxels_for(rng, p, 0.5)
    m = ops.build_point_voxel_map(p, v, "trilinear", voxel_size=0.5)
    ptr, entries = m.voxel_csr()
    flat = m.indices.reshape(-1)
    assert ptr[0] == 0 and ptr[-1] == int((flat >= 0).sum()) and len(ptr) == len(v) + 1
    for r in range(len(v)):
        seg = entries[ptr[r]:ptr[r + 1]]
        assert (flat[seg] == r).all() and torch.equal(seg, torch.sort(seg).values)


# ---- devoxelize --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("mode", ["nearest", "trilinear"])
@pytest.mark.parametrize("route", ROUTES)
def test_devoxelize_forward_and_backward_equal_oracle(rng, name, mode, route):
    p, b = _cloud(rng, 250, batches=2)
    v = _voxels_for(rng, p, 0.4, b, c=4, dtype=DTYPES[name])
    m = ops.build_point_voxel_map(p, v, mode, voxel_size=0.4, batch_indices=b)
    vf = v.feats.clone().requires_grad_()
    out = ops.devoxelize(v.replace_feats(vf), m, route=route)
    ref = pvo.devoxelize(oracle.round_to_dtype(vf, name), m.indices.numpy(), m.weights.numpy())
    assert out.dtype == vf.dtype and tuple(out.shape) == (250, 4)
    oracle.assert_close(out, ref, name, "devoxelize")
    dy = torch.from_numpy(rng.standard_normal((250, 4))).to(vf.dtype)
    (g,) = torch.autograd.grad(out, vf, dy)
    ref_g = pvo.devoxelize_backward(oracle.round_to_dtype(dy, name), m.indices.numpy(), m.weights.numpy(), len(v))
    oracle.assert_close(g, ref_g, name, "devoxelize grad")


@pytest.mark.parametrize("mode", ["nearest", "trilinear"])
@pytest.mark.parametrize("normalize", [True, False])
def test_devoxelize_gradcheck_f64(rng, mode, normalize):
    p, b = _cloud(rng, 40, batches=2, scale=1.0)
    v = _voxels_for(rng, p, 0.5, b, keep=0.8, c=2)
    m = ops.build_point_voxel_map(p, v, mode, normalize, voxel_size=0.5, batch_indices=b)
    f = v.feats.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: ops.devoxelize(v.replace_feats(t), m), (f,), eps=1e-6, atol=1e-8)


def test_devoxelize_after_voxelize_mean_gives_each_point_its_voxel_mean(rng):
    p, b = _cloud(rng, 120, batches=2)
    f = _feats(rng, 120, 3, "f64")
    x = ops.voxelize(p, f, 0.5, "mean", b)
    m = ops.build_point_voxel_map(p, x, voxel_size=0.5, batch_indices=b)
    _, inverse, _ = ops.sparse_quantize(p, 0.5, b)
    assert torch.equal(ops.devoxelize(x, m), x.feats[inverse])


def test_devoxelize_trilinear_reproduces_a_linear_field_inside_full_cells():
    # voxels on a full 4^3 grid with feature = centre x + 2y - z: trilinear interpolation is exact
    g = torch.stack(torch.meshgrid(*[torch.arange(4)] * 3, indexing="ij"), -1).reshape(-1, 3)
    coords = torch.cat([torch.zeros(64, 1, dtype=torch.int64), g], 1)
    centres = (g.double() + 0.5) * 0.5
    v = SparseTensor(coords, (centres @ torch.tensor([[1.0], [2.0], [-1.0]], dtype=torch.float64)))
    p = torch.rand(50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 1.5 + 0.25
    m = ops.build_point_voxel_map(p, v, "trilinear", voxel_size=0.5)
    expected = p @ torch.tensor([[1.0], [2.0], [-1.0]], dtype=torch.float64)
    torch.testing.assert_close(ops.devoxelize(v, m), expected, rtol=1e-12, atol=1e-12)


def test_devoxelize_map_is_reusable_across_feature_tensors_of_one_identity(rng):
    p, _ = _cloud(rng, 80)
    v = _voxels_for(rng, p, 0.5)
    m = ops.build_point_voxel_map(p, v, "trilinear", voxel_size=0.5)
    a = ops.devoxelize(v, m)
    w = v.replace_feats(v.feats * 2)
    torch.testing.assert_close(ops.devoxelize(w, m), 2 * a)


# ---- routes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_voxelize_parallel_route_is_bitwise_the_reference(rng, name, reduction):
    p, b = _cloud(rng, 6000, batches=2, scale=3.0)
    f = _feats(rng, 6000, 8, name)
    dy = None
    outs = []
    for route in ROUTES:
        fe = f.clone().requires_grad_()
        x = ops.voxelize(p, fe, 0.2, reduction, b, route=route)
        if dy is None:
            dy = torch.from_numpy(rng.standard_normal(tuple(x.feats.shape))).to(f.dtype)
        outs.append((x.feats.detach(), torch.autograd.grad(x.feats, fe, dy)[0]))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("mode", ["nearest", "trilinear"])
def test_devoxelize_and_map_parallel_route_is_bitwise_the_reference(rng, name, mode):
    p, b = _cloud(rng, 5000, batches=2, scale=3.0)
    v = _voxels_for(rng, p, 0.25, b, c=8, dtype=DTYPES[name])
    maps = [ops.build_point_voxel_map(p, v, mode, voxel_size=0.25, batch_indices=b, route=r) for r in ROUTES]
    assert torch.equal(maps[0].indices, maps[1].indices) and torch.equal(maps[0].weights, maps[1].weights)
    assert all(torch.equal(a, c) for a, c in zip(maps[0].voxel_csr(), maps[1].voxel_csr()))
    dy = torch.from_numpy(rng.standard_normal((5000, 8))).to(v.dtype)
    outs = []
    for route in ROUTES:
        vf = v.feats.clone().requires_grad_()
        out = ops.devoxelize(v.replace_feats(vf), maps[0], route=route)
        outs.append((out.detach(), torch.autograd.grad(out, vf, dy)[0]))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_point_voxel_results_do_not_depend_on_the_thread_count(rng):
    p, b = _cloud(rng, 5000, batches=2, scale=3.0)
    f = _feats(rng, 5000, 8, "f32").requires_grad_()
    old = lattice.get_num_threads()

    def run():
        x = ops.voxelize(p, f, 0.25, "mean", b)
        m = ops.build_point_voxel_map(p, x, "trilinear", voxel_size=0.25, batch_indices=b)
        out = ops.devoxelize(x, m)
        (g,) = torch.autograd.grad(out.sum() + x.feats.square().sum(), f)
        return out.detach(), g

    try:
        lattice.set_num_threads(1)
        one = run()
        lattice.set_num_threads(2)
        two = run()
    finally:
        lattice.set_num_threads(old)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


def test_explain_point_voxel_ops_choose_parallel_and_report_forcing(rng):
    p, _ = _cloud(rng, 50)
    f = _feats(rng, 50, 2, "f32")
    x = ops.voxelize(p, f, 0.5)
    m = ops.build_point_voxel_map(p, x, "trilinear", voxel_size=0.5)
    for e in (lattice.explain("voxelize", p, f, 0.5, "max"),
              lattice.explain("voxelize", p, f, 0.5, reduction="sum", pass_="backward"),
              lattice.explain("build_point_voxel_map", p, x, "trilinear", voxel_size=0.5),
              lattice.explain("devoxelize", x, m),
              lattice.explain("devoxelize", x, m, pass_="backward")):
        assert e.chosen == "parallel"
        assert {r["route"] for r in e.rows} == {"cuda", "parallel", "reference"}
        assert "runs on cuda" in next(r for r in e.rows if r["route"] == "cuda")["reason"]
        assert re.search(r"->\s+parallel\b.*chosen", str(e))
    e = lattice.explain("devoxelize", x, m, route="reference")
    assert e.chosen == "reference" and e.forced == "reference"
    assert "voxelize forward (max)" in str(lattice.explain("voxelize", p, f, 0.5, "max"))


def test_point_voxel_route_table_rejects_cuda_and_integer_features_with_reasons():
    e = core.explain_point_voxel_problem({"op": "devoxelize", "device": "cuda:0", "n_points": 10})
    assert e.chosen in (None, "cuda")  # the cuda route where this build has a device
    assert all("runs on cpu" in r["reason"] for r in e.rows if r["route"] != "cuda")
    e = core.explain_point_voxel_problem({"op": "voxelize", "dtype": "int32"})
    cpu_rows = [r for r in e.rows if r["route"] != "cuda"]
    assert e.chosen is None and all("needs a float dtype" in r["reason"] for r in cpu_rows)
    e = core.explain_point_voxel_problem({"op": "build_point_voxel_map", "pass": "build_map", "dtype": "float16"})
    cpu_rows = [r for r in e.rows if r["route"] != "cuda"]
    assert e.chosen is None and all("needs float32 or float64 points" in r["reason"] for r in cpu_rows)
    e = core.explain_point_voxel_problem({"op": "voxelize", "dtype": "bfloat16"}, route="reference")
    assert e.chosen == "reference"


def test_force_route_environment_variable_applies_to_point_voxel(rng, monkeypatch):
    p, _ = _cloud(rng, 20)
    f = _feats(rng, 20, 2, "f32")
    monkeypatch.setenv("LATTICE_FORCE_ROUTE", "point_voxel:reference")
    assert lattice.explain("voxelize", p, f, 0.5).chosen == "reference"
    monkeypatch.setenv("LATTICE_FORCE_ROUTE", "conv:reference")
    assert lattice.explain("voxelize", p, f, 0.5).chosen == "parallel"


# ---- validation: every branch raises `[op] argument: expected ..., got ...` --------------------


def _v(rows=((0, 0, 0, 0),), stride=1):
    return SparseTensor(torch.tensor(rows, dtype=torch.int32).reshape(-1, 4), torch.zeros(len(rows), 2), stride=stride)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_voxelize_non_finite_point_raises_naming_the_row(bad):
    p = torch.zeros(4, 3)
    p[2, 0] = bad
    with pytest.raises(ValueError, match=r"^\[voxelize\] points: expected finite values \(no NaN or inf\), got a non-finite value at row 2$"):
        ops.voxelize(p, torch.zeros(4, 1), 1.0)


def test_voxelize_integer_points_raise_type_error():
    with pytest.raises(TypeError, match=r"^\[voxelize\] points: expected float32 or float64, got torch.int64"):
        ops.voxelize(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 1), 1.0)


def test_voxelize_points_of_wrong_shape_raise_value_error():
    with pytest.raises(ValueError, match=r"^\[voxelize\] points: expected shape \(P, 3\), got \(2, 2\)"):
        ops.voxelize(torch.zeros(2, 2), torch.zeros(2, 1), 1.0)


def test_voxelize_points_of_wrong_container_raise_type_error():
    with pytest.raises(TypeError, match=r"^\[voxelize\] points: expected a torch.Tensor or numpy.ndarray, got list"):
        ops.voxelize([[0.0, 0.0, 0.0]], torch.zeros(1, 1), 1.0)


def test_voxelize_integer_feats_raise_type_error():
    with pytest.raises(TypeError, match=r"^\[voxelize\] feats: expected float16, bfloat16, float32 or float64, got int64"):
        ops.voxelize(torch.zeros(2, 3), torch.zeros(2, 1, dtype=torch.int64), 1.0)


@pytest.mark.parametrize("shape", [(3, 1), (2,), (2, 1, 1)])
def test_voxelize_feats_of_wrong_shape_raise_value_error(shape):
    with pytest.raises(ValueError, match=r"^\[voxelize\] feats: expected shape \(P=2, C\)"):
        ops.voxelize(torch.zeros(2, 3), torch.zeros(shape), 1.0)


def test_voxelize_unknown_reduction_raises_value_error():
    with pytest.raises(ValueError, match=r"^\[voxelize\] reduction: expected one of 'mean', 'sum', 'max', got 'avg'"):
        ops.voxelize(torch.zeros(2, 3), torch.zeros(2, 1), 1.0, "avg")


def test_voxelize_reduction_of_wrong_type_raises_type_error():
    with pytest.raises(TypeError, match=r"^\[voxelize\] reduction: expected a str"):
        ops.voxelize(torch.zeros(2, 3), torch.zeros(2, 1), 1.0, 1)


def test_core_voxelize_unknown_reduction_raises_value_error():
    g = core.group_points(to_core(torch.zeros(2, 3)), (1.0,) * 3, (0.0,) * 3, None, "voxelize")
    with pytest.raises(ValueError, match=r"^\[voxelize\] reduction: expected 'mean', 'sum' or 'max', got 'avg'"):
        core.voxelize_forward(g, to_core(torch.zeros(2, 1)), "avg")


@pytest.mark.parametrize("vs, kind, msg", [
    (0.0, ValueError, r"voxel_size: expected positive finite sizes, got 0\.0+ on axis 0"),
    ((1.0, -1.0, 1.0), ValueError, r"voxel_size: expected positive finite sizes, got -1\.0+ on axis 1"),
    ((1.0, 1.0), ValueError, r"voxel_size: expected a number or 3 numbers, got 2 values"),
    ("a", TypeError, r"voxel_size: expected a number or 3 numbers, got str"),
])
def test_voxelize_bad_voxel_size_raises(vs, kind, msg):
    with pytest.raises(kind, match=r"^\[voxelize\] " + msg):
        ops.voxelize(torch.zeros(2, 3), torch.zeros(2, 1), vs)


def test_voxelize_non_finite_origin_raises_value_error():
    with pytest.raises(ValueError, match=r"^\[voxelize\] origin: expected finite values, got nan"):
        ops.voxelize(torch.zeros(2, 3), torch.zeros(2, 1), 1.0, origin=float("nan"))


def test_voxelize_bad_batch_indices_raise():
    p, f = torch.zeros(2, 3), torch.zeros(2, 1)
    with pytest.raises(ValueError, match=r"^\[voxelize\] batch_indices: expected batch ids >= 0, got batch id -1 at row 1"):
        ops.voxelize(p, f, 1.0, batch_indices=torch.tensor([0, -1]))
    with pytest.raises(ValueError, match=r"^\[voxelize\] batch_indices: expected shape \(P=2,\)"):
        ops.voxelize(p, f, 1.0, batch_indices=torch.tensor([0, 0, 0]))
    with pytest.raises(TypeError, match=r"^\[voxelize\] batch_indices: expected int32 or int64, got float32"):
        ops.voxelize(p, f, 1.0, batch_indices=torch.tensor([0.0, 1.0]))


def test_voxelize_voxel_index_outside_int32_raises_value_error():
    with pytest.raises(ValueError, match=r"^\[voxelize\] points: expected voxel indices within int32 \(use a larger voxel_size\), got an out-of-range voxel at row 1"):
        ops.voxelize(torch.tensor([[0.0, 0, 0], [3e9, 0, 0]], dtype=torch.float64), torch.zeros(2, 1), 1.0)


def test_voxelize_unknown_route_raises_value_error():
    with pytest.raises(ValueError, match=r"^\[voxelize\] route: expected one of 'cuda', 'parallel', 'reference', got 'fast'"):
        ops.voxelize(torch.zeros(2, 3), torch.zeros(2, 1), 1.0, route="fast")


def test_voxelize_route_of_wrong_type_raises_type_error():
    with pytest.raises(TypeError, match=r"^\[voxelize\] route: expected a route name \(str\) or None, got int"):
        ops.voxelize(torch.zeros(2, 3), torch.zeros(2, 1), 1.0, route=1)


def test_core_voxelize_backward_checks_grad_out_and_argmax():
    g = core.group_points(to_core(torch.zeros(2, 3)), (1.0,) * 3, (0.0,) * 3, None, "voxelize")
    with pytest.raises(ValueError, match=r"^\[voxelize\] grad_out: expected shape \(M=1, C\), got \(2, 1\)"):
        core.voxelize_backward(g, to_core(torch.zeros(2, 1)), None, "sum")
    with pytest.raises(ValueError, match=r"^\[voxelize\] argmax: expected the forward's \(M=1, C=1\) int64 argmax for reduction 'max', got nothing"):
        core.voxelize_backward(g, to_core(torch.zeros(1, 1)), None, "max")
    with pytest.raises(TypeError, match=r"^\[voxelize\] grad_out: expected float16, bfloat16, float32 or float64, got int32"):
        core.voxelize_backward(g, to_core(torch.zeros(1, 1, dtype=torch.int32)), None, "sum")


def test_build_point_voxel_map_voxels_of_wrong_type_raise_type_error():
    with pytest.raises(TypeError, match=r"^\[build_point_voxel_map\] voxels: expected a lattice.SparseTensor, got Tensor"):
        ops.build_point_voxel_map(torch.zeros(2, 3), torch.zeros(2, 4), voxel_size=1.0)


def test_build_point_voxel_map_unknown_mode_raises_value_error():
    with pytest.raises(ValueError, match=r"^\[build_point_voxel_map\] mode: expected one of 'nearest', 'trilinear', got 'linear'"):
        ops.build_point_voxel_map(torch.zeros(2, 3), _v(), "linear", voxel_size=1.0)
    with pytest.raises(ValueError, match=r"^\[build_point_voxel_map\] mode: expected 'nearest' or 'trilinear', got 'linear'"):
        core.build_point_voxel_map(to_core(torch.zeros(2, 3)), _v()._cs, (1.0,) * 3, (0.0,) * 3, "linear", True, None)


def test_build_point_voxel_map_mode_of_wrong_type_raises_type_error():
    with pytest.raises(TypeError, match=r"^\[build_point_voxel_map\] mode: expected a str"):
        ops.build_point_voxel_map(torch.zeros(2, 3), _v(), None, voxel_size=1.0)


def test_build_point_voxel_map_normalize_of_wrong_type_raises_type_error():
    with pytest.raises(TypeError, match=r"^\[build_point_voxel_map\] normalize: expected a bool, got str"):
        ops.build_point_voxel_map(torch.zeros(2, 3), _v(), "trilinear", "yes", voxel_size=1.0)


def test_build_point_voxel_map_missing_voxel_size_raises_type_error():
    with pytest.raises(TypeError, match=r"^\[build_point_voxel_map\] voxel_size: expected a number or 3 numbers, got NoneType"):
        ops.build_point_voxel_map(torch.zeros(2, 3), _v())


def test_build_point_voxel_map_non_positive_voxel_size_raises_value_error():
    with pytest.raises(ValueError, match=r"^\[build_point_voxel_map\] voxel_size: expected positive finite sizes"):
        ops.build_point_voxel_map(torch.zeros(2, 3), _v(), voxel_size=(1.0, 0.0, 1.0))


def test_build_point_voxel_map_non_finite_origin_raises_value_error():
    with pytest.raises(ValueError, match=r"^\[build_point_voxel_map\] origin: expected finite values, got inf"):
        ops.build_point_voxel_map(torch.zeros(2, 3), _v(), voxel_size=1.0, origin=float("inf"))


def test_build_point_voxel_map_non_finite_point_raises_naming_the_row():
    p = torch.zeros(3, 3, dtype=torch.float64)
    p[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"^\[build_point_voxel_map\] points: expected finite values \(no NaN or inf\), got a non-finite value at row 1$"):
        ops.build_point_voxel_map(p, _v(), "trilinear", voxel_size=1.0)


def test_build_point_voxel_map_points_of_wrong_dtype_or_shape_raise():
    with pytest.raises(TypeError, match=r"^\[build_point_voxel_map\] points: expected float32 or float64, got torch.float16"):
        ops.build_point_voxel_map(torch.zeros(2, 3, dtype=torch.float16), _v(), voxel_size=1.0)
    with pytest.raises(ValueError, match=r"^\[build_point_voxel_map\] points: expected shape \(P, 3\), got \(2, 4\)"):
        ops.build_point_voxel_map(torch.zeros(2, 4), _v(), voxel_size=1.0)


def test_build_point_voxel_map_bad_batch_indices_raise():
    with pytest.raises(ValueError, match=r"^\[build_point_voxel_map\] batch_indices: expected shape \(P=2,\)"):
        ops.build_point_voxel_map(torch.zeros(2, 3), _v(), voxel_size=1.0, batch_indices=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^\[build_point_voxel_map\] batch_indices: expected batch ids >= 0"):
        ops.build_point_voxel_map(torch.zeros(2, 3), _v(), voxel_size=1.0, batch_indices=torch.tensor([-3, 0]))


def test_build_point_voxel_map_duplicate_voxel_rows_raise_value_error():
    with pytest.raises(ValueError, match=r"^\[build_point_voxel_map\] coords: expected unique rows"):
        ops.build_point_voxel_map(torch.zeros(2, 3), _v(((0, 1, 2, 3), (0, 1, 2, 3))), voxel_size=1.0)


def test_build_point_voxel_map_unknown_route_raises_value_error():
    with pytest.raises(ValueError, match=r"^\[build_point_voxel_map\] route: expected one of 'cuda', 'parallel', 'reference', got 'gpu'"):
        ops.build_point_voxel_map(torch.zeros(2, 3), _v(), voxel_size=1.0, route="gpu")


def test_devoxelize_arguments_of_wrong_type_raise_type_error():
    m = ops.build_point_voxel_map(torch.zeros(2, 3), _v(), voxel_size=1.0)
    with pytest.raises(TypeError, match=r"^\[devoxelize\] voxels: expected a lattice.SparseTensor, got Tensor"):
        ops.devoxelize(torch.zeros(1, 2), m)
    with pytest.raises(TypeError, match=r"^\[devoxelize\] map: expected a lattice.ops.PointVoxelMap, got tuple"):
        ops.devoxelize(_v(), (m.indices, m.weights))


def test_devoxelize_map_of_other_coordinates_raises_value_error():
    v = _v()
    m = ops.build_point_voxel_map(torch.zeros(2, 3), v, voxel_size=1.0)
    other = _v()  # equal values, different identity
    with pytest.raises(ValueError, match=rf"^\[devoxelize\] map: expected a map built for these voxels \(coordinate key {other.key}, 1 rows\), got a map built for coordinate key {v.key} \(1 rows\)"):
        ops.devoxelize(other, m)


def test_devoxelize_unknown_route_raises_value_error():
    v = _v()
    m = ops.build_point_voxel_map(torch.zeros(2, 3), v, voxel_size=1.0)
    with pytest.raises(ValueError, match=r"^\[devoxelize\] route: expected one of 'cuda', 'parallel', 'reference', got 'x'"):
        ops.devoxelize(v, m, route="x")


def test_core_devoxelize_checks_feats_and_grad_out_shapes():
    v = _v()
    m = ops.build_point_voxel_map(torch.zeros(2, 3), v, voxel_size=1.0)
    with pytest.raises(ValueError, match=r"^\[devoxelize\] feats: expected shape \(M=1, C\), got \(3, 2\)"):
        core.devoxelize_forward(m._core, v._cs, to_core(torch.zeros(3, 2)))
    with pytest.raises(ValueError, match=r"^\[devoxelize\] grad_out: expected shape \(P=2, C\), got \(1, 2\)"):
        core.devoxelize_backward(m._core, to_core(torch.zeros(1, 2)))


def test_explain_point_voxel_bad_pass_raises_value_error(rng):
    p, _ = _cloud(rng, 5)
    with pytest.raises(ValueError, match=r"^\[voxelize\] pass: expected 'forward' or 'backward', got 'sideways'"):
        lattice.explain("voxelize", p, torch.zeros(5, 1, dtype=torch.float64), 1.0, pass_="sideways")


def test_point_voxel_ops_never_mutate_their_inputs(rng):
    p, b = _cloud(rng, 60, batches=2)
    f = _feats(rng, 60, 2, "f64").requires_grad_()
    saved = [t.detach().clone() for t in (p, b, f)]
    x = ops.voxelize(p, f, 0.5, "max", b)
    m = ops.build_point_voxel_map(p, x, "trilinear", voxel_size=0.5, batch_indices=b)
    vf = x.feats.detach().clone()
    out = ops.devoxelize(x, m)
    dy = torch.randn(out.shape, dtype=torch.float64)
    dy0 = dy.clone()
    out.backward(dy)
    for before, after in zip(saved, (p, b, f)):
        assert torch.equal(before, after.detach())
    assert torch.equal(dy, dy0) and torch.equal(x.feats.detach(), vf)
