"""Execution routes: every admitted CPU route computes the reference route's function, forcing
works or fails loudly, the default route is deterministic, and the pure route table decides as
documented (core.explain_conv_problem with simulated capabilities, CUDA tiers included)."""
from __future__ import annotations

import re

import pytest
import torch

import lattice
import oracle
from lattice._core import core
from conftest import op_fn, random_coords, tensor_stride_for

DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
HAS_BLAS = bool(lattice.device_caps()["cpu"]["blas"])

# (id, op, conv kwargs, pointwise admitted)
PROBLEMS = [
    ("subm_k3", "subm_conv3d", dict(kernel_size=3), False),
    ("subm_k1", "subm_conv3d", dict(kernel_size=1), True),
    ("conv3d_k1_s1", "conv3d", dict(kernel_size=1), True),
    ("conv3d_k3_s2_p1", "conv3d", dict(kernel_size=3, stride=2, padding=1), False),
    ("conv3d_k1_s2", "conv3d", dict(kernel_size=1, stride=2), False),
    ("transpose_k2_s2", "conv_transpose3d", dict(kernel_size=2, stride=2), False),
    ("generative_k3_s2", "generative_conv_transpose3d", dict(kernel_size=(3, 1, 3), stride=2), False),
    ("transpose_k1_s1_identity", "conv_transpose3d", dict(kernel_size=1), True),
    ("conv3d_k1_s1_p1_shifted", "conv3d", dict(kernel_size=1, padding=1), False),
]


def _problem(rng, op, kw, name, n=48, c_in=5, c_out=6):
    coords = random_coords(rng, n)
    dt = DTYPES[name]
    feats = torch.from_numpy(rng.standard_normal((coords.shape[0], c_in))).to(dt)
    x = lattice.SparseTensor(torch.from_numpy(coords), feats, stride=tensor_stride_for(op, kw.get("stride", 1)))
    k = kw["kernel_size"]
    ks = (k, k, k) if isinstance(k, int) else tuple(k)
    w = (torch.from_numpy(rng.standard_normal((c_out, *ks, c_in))) * 0.4).to(dt)
    b = torch.from_numpy(rng.standard_normal(c_out)).to(dt)
    return x, w, b


def _run(x, w, b, op, kw, route, dy=None):
    fe = x.feats.detach().clone().requires_grad_()
    we = w.detach().clone().requires_grad_()
    be = b.detach().clone().requires_grad_()
    y = op_fn(op)(x.replace_feats(fe), we, be, route=route, **kw)
    if dy is None:
        g = torch.Generator().manual_seed(7)
        dy = torch.randn(y.feats.shape, generator=g, dtype=torch.float64).to(y.feats.dtype)
    dx, dw, db = torch.autograd.grad(y.feats, [fe, we, be], dy)
    return y.feats.detach(), dx, dw, db


def _admitted(x, w, op, kw, pass_="forward"):
    e = lattice.explain(op, x, w, pass_=pass_, **kw)
    return {r["route"] for r in e.rows if r["admitted"]}


@pytest.mark.parametrize("problem", PROBLEMS, ids=[p[0] for p in PROBLEMS])
def test_conv_admitted_routes_are_the_documented_cpu_routes(rng, problem):
    _, op, kw, pointwise = problem
    x, w, b = _problem(rng, op, kw, "f32")
    # the documented CPU routes; a route added later may join (and is then compared below)
    expected = {"reference"} | ({"gather_gemm_scatter"} if HAS_BLAS else set())
    for pass_ in ("forward", "input_grad", "weight_grad"):
        admitted = _admitted(x, w, op, kw, pass_)
        assert expected <= admitted, pass_
        assert ("pointwise_matmul" in admitted) == pointwise, pass_


@pytest.mark.parametrize("name", ["f64", "f32", "f16", "bf16"])
@pytest.mark.parametrize("problem", PROBLEMS, ids=[p[0] for p in PROBLEMS])
def test_conv_every_admitted_route_equals_reference_route_forward_and_grads(rng, problem, name):
    _, op, kw, _ = problem
    x, w, b = _problem(rng, op, kw, name)
    ref = _run(x, w, b, op, kw, "reference")
    routes = _admitted(x, w, op, kw) - {"reference"}
    assert routes, "no route other than reference to compare"
    for route in sorted(routes):
        got = _run(x, w, b, op, kw, route)
        for what, a, e in zip(("forward", "feats grad", "weight grad", "bias grad"), got, ref):
            assert a.dtype == e.dtype and a.shape == e.shape
            oracle.assert_close(a, e, name, f"{route} {what}")


@pytest.mark.skipif(not HAS_BLAS, reason="gather_gemm_scatter needs BLAS")
@pytest.mark.parametrize("name", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("problem", PROBLEMS[:4], ids=[p[0] for p in PROBLEMS[:4]])
def test_conv_gather_gemm_scatter_is_bitwise_deterministic(rng, problem, name):
    _, op, kw, _ = problem
    x, w, b = _problem(rng, op, kw, name, n=120, c_in=16, c_out=24)
    first = _run(x, w, b, op, kw, "gather_gemm_scatter")
    second = _run(x, w, b, op, kw, "gather_gemm_scatter")
    for a, c in zip(first, second):
        assert torch.equal(a, c)


def test_subm_conv3d_forced_pointwise_with_kernel3_raises_with_reason(rng):
    x, w, b = _problem(rng, "subm_conv3d", dict(kernel_size=3), "f32")
    with pytest.raises(ValueError, match=r"^\[subm_conv3d\] route: expected an admitted route") as info:
        lattice.ops.subm_conv3d(x, w, route="pointwise_matmul")
    assert "needs kernel volume 1, got 27" in str(info.value)
    assert "'pointwise_matmul'" in str(info.value)


def test_conv3d_forced_pointwise_on_strided_kernel1_raises_identity_reason(rng):
    x, w, b = _problem(rng, "conv3d", dict(kernel_size=1, stride=2), "f32")
    with pytest.raises(ValueError, match=r"^\[conv3d\] route: expected an admitted route") as info:
        lattice.ops.conv3d(x, w, stride=2, route="pointwise_matmul")
    assert "identity relation" in str(info.value)


@pytest.mark.parametrize("route", ["fast", "Reference", "", "quantize"])
def test_conv_unknown_route_name_raises_value_error(rng, route):
    x, w, b = _problem(rng, "subm_conv3d", dict(kernel_size=3), "f32")
    with pytest.raises(ValueError, match=r"^\[subm_conv3d\] route: expected one of 'pointwise_matmul', 'gather_gemm_scatter', "):
        lattice.ops.subm_conv3d(x, w, route=route)


def test_explain_subm_conv3d_prints_chosen_and_every_rejected_route_with_reason(rng):
    x, w, b = _problem(rng, "subm_conv3d", dict(kernel_size=3), "f32")
    e = lattice.explain("subm_conv3d", x, w, kernel_size=3)
    text = str(e)
    # select() == the first admitted route by rank (gather_gemm_scatter in this table with BLAS)
    expected_chosen = next(r["route"] for r in e.rows if r["admitted"])
    assert e.chosen == expected_chosen
    assert e.chosen != "reference" or not HAS_BLAS
    assert re.search(rf"->\s+{expected_chosen}\b.*chosen", text)
    assert "pointwise_matmul" in text and "rejected: needs kernel volume 1, got 27" in text
    assert "reference" in text
    assert {r["route"] for r in e.rows} >= {"pointwise_matmul", "gather_gemm_scatter", "reference"}
    assert [r["rank"] for r in e.rows] == sorted(r["rank"] for r in e.rows)
    for r in e.rows:
        assert r["chosen"] == (r["route"] == e.chosen)
        assert r["admitted"] or r["reason"], f"rejected route {r['route']} without a reason"
        if not r["admitted"]:
            assert r["reason"] in text
    # .chosen is what runs: the default call is bitwise the forced chosen route
    default = lattice.ops.subm_conv3d(x, w, b).feats
    forced = lattice.ops.subm_conv3d(x, w, b, route=e.chosen).feats
    assert torch.equal(default, forced)


def test_explain_with_forced_route_reports_policy(rng):
    x, w, b = _problem(rng, "subm_conv3d", dict(kernel_size=1), "f32")
    e = lattice.explain("subm_conv3d", x, w, kernel_size=1, route="reference")
    assert e.chosen == "reference" and e.forced == "reference"
    assert "forced route 'reference'" in str(e)
    e2 = lattice.explain("subm_conv3d", x, w, kernel_size=1)
    assert e2.chosen == "pointwise_matmul" and e2.forced is None


def test_explain_kernel1_subm_chooses_pointwise_matmul_for_every_pass(rng):
    x, w, b = _problem(rng, "subm_conv3d", dict(kernel_size=1), "f32")
    for pass_ in ("forward", "input_grad", "weight_grad"):
        assert lattice.explain("subm_conv3d", x, w, kernel_size=1, pass_=pass_).chosen == "pointwise_matmul"
    with pytest.raises(ValueError, match=r"^\[explain\] pass: expected"):
        lattice.explain("subm_conv3d", x, w, kernel_size=1, pass_="backward")


def test_explain_dense_weight_without_kernel_size_takes_the_ops_arguments(rng):
    # explain() takes exactly the arguments of the op; the op infers kernel_size from a 5-D weight.
    x, w, b = _problem(rng, "subm_conv3d", dict(kernel_size=3), "f32")
    lattice.ops.subm_conv3d(x, w, b)  # accepted by the op
    e = lattice.explain("subm_conv3d", x, w, b)
    assert e.chosen == lattice.explain("subm_conv3d", x, w, kernel_size=3).chosen
    y, wt, _ = _problem(rng, "conv_transpose3d", dict(kernel_size=2, stride=2), "f32")
    assert lattice.explain("conv_transpose3d", y, wt, stride=2).chosen is not None


def test_explain_sparse_quantize_chooses_reference():
    e = lattice.explain("sparse_quantize", torch.zeros(4, 3))
    assert e.chosen == "reference"


def test_force_route_environment_variable_forces_and_unknown_name_raises(rng, monkeypatch):
    x, w, b = _problem(rng, "subm_conv3d", dict(kernel_size=3), "f32")
    monkeypatch.setenv("LATTICE_FORCE_ROUTE", "conv:reference")
    assert lattice.explain("subm_conv3d", x, w, kernel_size=3).chosen == "reference"
    monkeypatch.setenv("LATTICE_FORCE_ROUTE", "conv:nope")
    with pytest.raises(ValueError, match=r"^\[LATTICE_FORCE_ROUTE\] route: expected"):
        lattice.ops.subm_conv3d(x, w)
    monkeypatch.delenv("LATTICE_FORCE_ROUTE")
    assert lattice.explain("subm_conv3d", x, w, kernel_size=3).chosen == ("gather_gemm_scatter" if HAS_BLAS else "reference")


# ---- the pure route table ----------------------------------------------------------------------

BASE = dict(op="subm_conv3d", relation="submanifold", dtype="float32", device="cpu", n_in=1000, n_out=1000,
            c_in=32, c_out=32, n_edges=8000)


CUDA_CONV_ROUTES = ("cuda_pointwise_matmul", "implicit_gemm_sm80", "cuda_gather_gemm_scatter")


def _rows(e):
    return {r["route"]: r for r in e.rows}


def test_route_table_kernel_volume1_identity_chooses_pointwise_matmul():
    e = core.explain_conv_problem(dict(BASE, kernel_volume=1, n_edges=1000, identity_relation=True), {"blas": "openblas"})
    assert e.chosen == "pointwise_matmul"
    assert all(r["admitted"] for r in e.rows if r["route"] not in CUDA_CONV_ROUTES)
    assert _rows(e)["cuda_gather_gemm_scatter"]["reason"] == "runs on cuda; the data is on cpu"
    assert "allow_tf32" in _rows(e)["implicit_gemm_sm80"]["reason"]
    half = core.explain_conv_problem(dict(BASE, kernel_volume=1, n_edges=1000, identity_relation=True, dtype="float16"),
                                     {"blas": "openblas"})
    assert _rows(half)["implicit_gemm_sm80"]["reason"] == "runs on cuda; the data is on cpu"


def test_route_table_kernel_volume1_non_identity_rejects_pointwise():
    e = core.explain_conv_problem(dict(BASE, relation="forward", kernel_volume=1, identity_relation=False),
                                  {"blas": "openblas"})
    assert e.chosen == "gather_gemm_scatter"
    assert "identity relation" in _rows(e)["pointwise_matmul"]["reason"]


def test_route_table_k27_chooses_gather_gemm_scatter_and_rejects_pointwise_with_reason():
    e = core.explain_conv_problem(dict(BASE, kernel_volume=27), {"blas": "openblas"})
    assert e.chosen == "gather_gemm_scatter"
    rows = _rows(e)
    assert not rows["pointwise_matmul"]["admitted"]
    assert rows["pointwise_matmul"]["reason"] == "needs kernel volume 1, got 27"
    assert rows["reference"]["admitted"]


def test_route_table_without_blas_chooses_reference():
    e = core.explain_conv_problem(dict(BASE, kernel_volume=27), {"blas": ""})
    assert e.chosen == "reference"
    assert "BLAS" in _rows(e)["gather_gemm_scatter"]["reason"]


@pytest.mark.parametrize("sm, tier", [(90, "hopper"), (80, "tensor_core"), (75, "classic")])
def test_route_table_cuda_problem_admits_no_cpu_route_and_every_reason_mentions_cpu(sm, tier):
    e = core.explain_conv_problem(dict(BASE, kernel_volume=27, device="cuda:0"), {"sm": sm, "cuda_built": True})
    # float32 without allow_tf32: the cuBLAS route (implicit GEMM takes float32 only with tf32).
    assert e.chosen == "cuda_gather_gemm_scatter"
    assert e.rows, "empty route table"
    for r in e.rows:
        if r["route"] in CUDA_CONV_ROUTES:
            continue
        assert not r["admitted"]
        assert "cpu" in r["reason"], r
    assert not _rows(e)["implicit_gemm_sm80"]["admitted"]
    half = core.explain_conv_problem(dict(BASE, kernel_volume=27, device="cuda:0", dtype="float16"),
                                     {"sm": sm, "cuda_built": True})
    assert half.chosen == ("implicit_gemm_sm80" if sm >= 80 else "cuda_gather_gemm_scatter")
    f64 = core.explain_conv_problem(dict(BASE, kernel_volume=27, device="cuda:0", dtype="float64"),
                                    {"sm": sm, "cuda_built": True})
    assert f64.chosen is None
    assert "no route admitted" in str(f64)
    assert tier in e.caps or str(sm) in e.caps


@pytest.mark.parametrize("sm, tier", [(90, "hopper"), (100, "tensor_core"), (120, "tensor_core"), (80, "tensor_core"), (86, "tensor_core"),
                                      (75, "classic"), (70, "classic"), (0, "none")])
def test_tier_for_sm_maps_compute_capability_to_tier(sm, tier):
    assert core.tier_for_sm(sm) == tier


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "bool"])
def test_route_table_integer_dtype_admits_nothing(dtype):
    e = core.explain_conv_problem(dict(BASE, kernel_volume=1, identity_relation=True, dtype=dtype), {"blas": "openblas"})
    assert e.chosen is None
    for r in e.rows:
        assert not r["admitted"] and "float" in r["reason"]


def test_route_table_forced_rejected_route_gives_reason_and_no_choice():
    e = core.explain_conv_problem(dict(BASE, kernel_volume=27), {"blas": "openblas"}, "pointwise_matmul")
    assert e.chosen is None
    assert e.forced == "pointwise_matmul"
    assert e.forced_reason == "needs kernel volume 1, got 27"
    e2 = core.explain_conv_problem(dict(BASE, kernel_volume=27), {"blas": "openblas"}, "reference")
    assert e2.chosen == "reference"


def test_route_table_unknown_forced_route_raises():
    with pytest.raises(ValueError, match=r"route: expected one of"):
        core.explain_conv_problem(dict(BASE, kernel_volume=27), {}, "warp_speed")


def test_backend_info_mentions_cuda_status():
    info = lattice.backend_info()
    caps = lattice.device_caps()
    assert re.search(r"built without CUDA|no CUDA device|hopper|tensor_core|classic", info), info
    if not caps["cuda"]["built"]:
        assert "built without CUDA" in info
    elif caps["cuda"]["device_count"] == 0:
        assert "no CUDA device" in info
    else:
        assert caps["cuda"]["tier"] in info
    assert caps["cpu"]["blas"] in info
    assert torch.__version__ in info


# ---- thread count ------------------------------------------------------------------------------

HAS_THREADS = hasattr(core, "set_num_threads") and hasattr(lattice, "set_num_threads")


@pytest.fixture
def restore_threads():
    before = lattice.get_num_threads() if HAS_THREADS else None
    yield
    if HAS_THREADS:
        lattice.set_num_threads(before)


@pytest.mark.skipif(not HAS_THREADS, reason="this build has no lattice.set_num_threads")
def test_set_num_threads_is_reported_and_rejects_zero(restore_threads):
    lattice.set_num_threads(2)
    assert lattice.get_num_threads() == 2
    assert lattice.device_caps()["cpu"]["threads"] == 2
    assert "2 threads" in lattice.backend_info()
    with pytest.raises(ValueError):
        lattice.set_num_threads(0)
    assert lattice.get_num_threads() == 2


@pytest.mark.skipif(not HAS_THREADS, reason="this build has no lattice.set_num_threads")
@pytest.mark.parametrize("route", ["reference"] + (["gather_gemm_scatter"] if HAS_BLAS else []))
@pytest.mark.parametrize("name", ["f32", "bf16"])
def test_conv_results_are_bitwise_independent_of_thread_count(rng, restore_threads, route, name):
    # large enough (N*C*K well above 2^15) that the parallel loops really split the work
    coords = random_coords(rng, 1500, batches=2, extent=14, spread=10)
    dt = DTYPES[name]
    feats = torch.from_numpy(rng.standard_normal((coords.shape[0], 16))).to(dt)
    w = (torch.from_numpy(rng.standard_normal((16, 3, 3, 3, 16))) * 0.2).to(dt)
    b = torch.from_numpy(rng.standard_normal(16)).to(dt)
    results = []
    for threads in (1, 2):
        lattice.set_num_threads(threads)
        x = lattice.SparseTensor(torch.from_numpy(coords.copy()), feats)  # fresh identity: relation rebuilt
        results.append(_run(x, w, b, "subm_conv3d", dict(kernel_size=3), route))
    for what, a, c in zip(("forward", "feats grad", "weight grad", "bias grad"), *results):
        assert torch.equal(a, c), f"{route} {what} differs between 1 and 2 threads"


@pytest.mark.skipif(not (HAS_THREADS and HAS_BLAS), reason="needs lattice.set_num_threads and a BLAS route")
def test_conv_gather_gemm_scatter_many_chunks_matches_reference_and_thread_count(rng, restore_threads):
    # > 8192 edges per destination chunk several times over, and > 256 edges per offset, so the
    # chunked, barrier-free forward and input-gradient passes split work across threads
    coords = random_coords(rng, 12000, batches=2, extent=40, spread=14)
    feats = torch.from_numpy(rng.standard_normal((coords.shape[0], 8))).float()
    w = (torch.from_numpy(rng.standard_normal((8, 3, 3, 3, 8))) * 0.2).float()
    b = torch.from_numpy(rng.standard_normal(8)).float()
    x = lattice.SparseTensor(torch.from_numpy(coords.copy()), feats)
    p = lattice.ops.conv.plan("subm_conv3d", "submanifold", x, w, kernel_size=3)
    assert p.relation.n_edges > 4 * 8192
    dy = torch.from_numpy(rng.standard_normal((coords.shape[0], 8))).float()
    runs = {}
    for threads in (1, 2):
        lattice.set_num_threads(threads)
        runs[threads] = _run(x, w, b, "subm_conv3d", dict(kernel_size=3), "gather_gemm_scatter", dy)
    # truth: the reference route in float64 on the same (f32-representable) inputs; a long f32
    # reference sum would itself be off by more than the f32 tolerance
    x64 = x.replace_feats(feats.double())
    truth = _run(x64, w.double(), b.double(), "subm_conv3d", dict(kernel_size=3), "reference", dy.double())
    for what, exact, one, two in zip(("forward", "feats grad", "weight grad", "bias grad"), truth, runs[1], runs[2]):
        assert torch.equal(one, two), f"{what} differs between 1 and 2 threads"
        oracle.assert_close(one.double().numpy(), exact.numpy(), "f32", what)
