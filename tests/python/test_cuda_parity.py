"""Cross-device parity: every op and every CUDA route against the CPU ``reference`` route, with the
admission of every route asserted against the admission table (cuda_admission.py).

Each case builds its inputs once on the CPU and first asks ``lattice.explain`` for every pass the
case runs (no exception is caught): every route's verdict and the chosen route must equal the
table's cell for (family, route, pass, dtype, geometry class, the device's tier). Then:

* a route the table admits runs (forced, or chosen when the case forces nothing) on the same values
  moved to ``cuda:0`` and is compared with the CPU ``reference`` route: floating outputs and every
  gradient (always; the route that runs each pass is the one the table names) norm-wise and
  element-wise at the SEMANTICS.md tolerance of the dtype (``cuda_admission.compare``, which names
  the worst row); integer outputs (coordinates, row maps, relation arrays, counts) exactly;
  determinism: the CUDA call runs twice and every output and gradient is bitwise identical;
* a route the table rejects is asserted rejected: forcing it raises the documented ValueError
  with the table's reason (a problem no route admits raises UnsupportedError).

The only skip is "no GPU" (no CUDA device for torch, or lattice built without CUDA); lattice
built with CUDA but seeing no device fails. Inputs: random clustered coordinates (several
batches, negative values), a large workload (the shared KITTI scan when present, else the
synthetic lidar scan), edge cases (empty, one row, isolated rows, all-negative coordinates) and
row counts just past / short of a multiple of the 128-row tile (partial tiles).

The tests at the top (``test_table_*``, ``test_compare_*``) check the table and the comparison
themselves and run on every machine.

``LATTICE_PARITY_REDUCED=1`` keeps a handful of small cases per op (for compute-sanitizer); the
large-input and network tests are then not collected.
"""
from __future__ import annotations

import functools
import math
import os
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pytest
import torch

import cuda_admission as adm
import lattice
from lattice.routes import route_names
import oracle
from conftest import random_coords
from lattice import ops
from lattice.bench import workloads
from lattice.tensor import SparseTensor

needs_gpu = adm.needs_gpu()
REDUCED = os.environ.get("LATTICE_PARITY_REDUCED", "") not in ("", "0")
DEV = torch.device("cuda", 0)
CPU = torch.device("cpu")
DTYPES = {"f32": torch.float32, "tf32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
          "f64": torch.float64}

# The CUDA routes of each family, from the route table's rows (src/route/<family>_routes.cpp).
CONV_ROUTES = tuple(route_names("conv", device="cuda"))  # cuda_pointwise_matmul, implicit_gemm_sm80, cuda_gather_gemm_scatter
POOL_ROUTES = tuple(route_names("pool", device="cuda"))  # cuda_csr_reduce
ALGEBRA_ROUTES = tuple(route_names("algebra", device="cuda"))  # cuda_hashed
COORDS_ROUTES = tuple(route_names("coords", device="cuda"))  # cuda
QUANTIZE_ROUTES = tuple(route_names("quantize", device="cuda"))  # cuda
POINT_VOXEL_ROUTES = tuple(route_names("point_voxel", device="cuda"))  # cuda


def pick(full: Sequence[Any], reduced: Sequence[Any]) -> list:
    """The full parameter list, or the reduced one under LATTICE_PARITY_REDUCED=1."""
    return list(reduced if REDUCED else full)


@functools.lru_cache(maxsize=None)
def tier() -> str:
    return adm.device_tier()


# ---- the table and the comparison themselves (every machine) ------------------------------------


def test_table_defines_every_cell_once():
    """Every (route, pass, dtype, geometry, tier) of every family is defined by exactly one rule,
    and the table names exactly the routes of each family's route table."""
    assert adm.TABLE_PROBLEMS == []
    n = sum(1 for f in adm.RULES for _ in adm.cells(f)) * len(adm.TIERS)
    assert len(adm.TABLE) == n
    assert set(adm.table_size()) == set(adm.ROUTES)


def test_table_lookup_and_chosen_route():
    """Spot checks of the lookup against the documented constraints, and that a cell outside the
    table is an error, not a default."""
    g = "submanifold/aligned"
    assert adm.verdict("conv", "implicit_gemm_sm80", "forward", "f16", g, "hopper") == adm.ADMITTED
    assert adm.verdict("conv", "implicit_gemm_sm80", "forward", "f16", g, "classic") == adm.Rejected(
        "needs GPU tier tensor_core or above, device has classic")
    assert adm.expected_chosen("conv", "weight_grad", "bf16", g, "tensor_core") == "implicit_gemm_sm80"
    assert adm.expected_chosen("conv", "weight_grad", "bf16", g, "classic") == "cuda_gather_gemm_scatter"
    assert adm.expected_chosen("conv", "forward", "f32", g, "hopper") == "cuda_gather_gemm_scatter"
    assert adm.expected_chosen("conv", "forward", "tf32", g, "hopper") == "implicit_gemm_sm80"
    assert adm.expected_chosen("conv", "input_grad", "f64", g, "hopper") is None
    assert adm.expected_chosen("pool", "input_grad", "f16", "transposed", "classic") == "cuda_csr_reduce"
    assert adm.expected_chosen("quantize", "forward", "f16", "-", "hopper") is None
    assert adm.expected_chosen("quantized", "forward", "f64", "linear", "hopper") is None
    assert adm.conv_geometry("submanifold", 1, 16, 24, 2) == "pointwise/aligned"
    assert adm.conv_geometry("target", 8, 3, 5, 4) == "target/unaligned"
    assert adm.dtype_key(torch.float32, True) == "tf32" and adm.dtype_key(torch.bfloat16) == "bf16"
    with pytest.raises(AssertionError, match="no cell"):
        adm.verdict("conv", "implicit_gemm_sm80", "forward", "f16", "no_such_geometry", "hopper")
    with pytest.raises(AssertionError, match="no cell"):
        adm.verdict("conv", "implicit_gemm_sm80", "forward", "f16", g, "volta")


@pytest.mark.parametrize("sim_tier", adm.TIERS)
def test_table_matches_the_conv_route_table_on_every_tier(sim_tier):
    """The conv family (the one with tier-dependent routes) against the real route table on
    simulated capabilities of each tier (core.explain_conv_problem; runs without a GPU): every
    cell's verdict, the forced-route verdict and the chosen route."""
    core = lattice._core.core
    names = {"f32": "float32", "tf32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64"}
    sizes = {"f32": 4, "tf32": 4, "f16": 2, "bf16": 2, "f64": 8}
    caps = {"sm": adm.SIMULATED_SM[sim_tier], "cuda_built": True}
    passes, dtypes, geometries = adm.AXES["conv"]
    checked = 0
    for p in passes:
        for d in dtypes(p):
            for g in geometries(p):
                kind, channels = g.split("/")
                c_in, c_out = (16, 24) if channels == "aligned" else (3, 5)
                assert adm.conv_geometry("submanifold" if kind == "pointwise" else kind, 1 if kind == "pointwise" else 27,
                                         c_in, c_out, sizes[d]) == g
                problem = {"op": "subm_conv3d" if kind in ("submanifold", "pointwise") else "conv3d",
                           "relation": "submanifold" if kind == "pointwise" else kind, "pass": p, "dtype": names[d],
                           "device": "cuda:0", "n_in": 1000, "n_out": 1000 if kind == "pointwise" else 700,
                           "c_in": c_in, "c_out": c_out, "kernel_volume": 1 if kind == "pointwise" else 27,
                           "n_edges": 1000 if kind == "pointwise" else 9000, "identity_relation": kind == "pointwise",
                           "allow_tf32": d == "tf32"}
                e = core.explain_conv_problem(problem, caps)
                adm.assert_explanation(e, "conv", p, d, g, sim_tier)
                for route in adm.ROUTES["conv"]:
                    adm.assert_forced_explanation(core.explain_conv_problem(problem, caps, route), route,
                                                  adm.verdict("conv", route, p, d, g, sim_tier))
                checked += 1
    assert checked == 3 * 5 * 14


def test_compare_accepts_rounding_noise_at_the_norm_tolerance():
    """Independent errors of 0.6*tol*rms on 10^5 elements (norm-wise 0.6*tol) pass both checks: the
    element-wise bound is not stricter than the norm-wise one for noise."""
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(20000, 5, generator=g, dtype=torch.float64)
    for name in ("f32", "tf32", "f16", "bf16"):
        tol = adm.tolerance(name)
        noisy = ref + torch.randn(ref.shape, generator=g, dtype=torch.float64) * (0.6 * tol)
        assert adm.compare(noisy, ref, name) == [], name
    assert adm.compare(ref.clone(), ref, "f64") == []


def test_compare_finds_a_wrong_partial_tile_the_norm_misses():
    """The last row of 12801 = 100*128 + 1 (a partial tile) zeroed: norm-wise error 0.9% < bf16's 1%,
    but the element-wise check fails and names row 12800; a wrong middle row is found the same way."""
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(12801, 16, generator=g).to(torch.bfloat16)
    bad = ref.clone()
    bad[-1] = 0
    assert adm.rel_err(bad, ref) < adm.tolerance("bf16")  # the old whole-array check passes
    problems = adm.compare(bad, ref, "bf16")
    assert len(problems) == 1 and "worst row 12800," in problems[0] and "in 1 of 12801 rows" in problems[0], problems
    bad = ref.clone()
    bad[5000, 3] *= 1.5
    problems = adm.compare(bad, ref, "bf16")
    assert any("worst row 5000, column 3" in p for p in problems), problems


def test_compare_reports_non_finite_mismatches_and_shapes():
    assert {k: adm.tolerance(k) for k in adm.TOLERANCES} == {k: oracle.tolerance(k) for k in adm.TOLERANCES}
    ref = torch.ones(4, 3)
    a = ref.clone()
    a[2, 1] = float("nan")
    assert "non-finite positions differ" in adm.compare(a, ref, "f32")[0]
    r2 = ref.clone()
    r2[2, 1] = float("inf")
    assert adm.compare(a, r2, "f32") == ["non-finite values differ"]
    assert adm.compare(r2.clone(), r2, "f32") == []
    assert adm.compare(torch.ones(3), ref, "f32")[0].startswith("shape")
    assert adm.compare(torch.zeros(0, 3), torch.zeros(0, 3), "f16") == []
    assert adm.compare(torch.zeros(5), torch.zeros(5), "f32") == []
    assert adm.compare(torch.full((5,), 1e-3), torch.zeros(5), "f32") != []


def test_forcing_a_rejected_route_raises_the_documented_error():
    """The helper the GPU tests use for rejected routes, on a CPU rejection: pointwise_matmul
    forced on a 3x3x3 convolution."""
    c = torch.from_numpy(random_coords(np.random.default_rng(3), 200, batches=1, extent=5, spread=4))
    x = SparseTensor(c, torch.randn(c.shape[0], 4))
    w = torch.randn(6, 3, 3, 3, 4)
    adm.assert_forced_call_raises(lambda: ops.subm_conv3d(x, w, route="pointwise_matmul"), "subm_conv3d",
                                  "pointwise_matmul", adm.Rejected("needs kernel volume 1, got 27"))
    with pytest.raises(AssertionError):  # a wrong reason is caught
        adm.assert_forced_call_raises(lambda: ops.subm_conv3d(x, w, route="pointwise_matmul"), "subm_conv3d",
                                      "pointwise_matmul", adm.Rejected("needs a BLAS library"))
    e = lattice.explain("subm_conv3d", x, w, route="pointwise_matmul")
    adm.assert_forced_explanation(e, "pointwise_matmul", adm.Rejected("needs kernel volume 1"))


def test_skip_reason_is_no_gpu_only():
    """The one skip reason starts with "no GPU"; on a machine with a GPU and a CUDA build there is none."""
    reason = adm.gpu_skip_reason()
    if torch.cuda.is_available() and "CUDA backend compiled" in lattice.backend_info():
        assert reason is None
    else:
        assert reason is not None and reason.startswith("no GPU (")


@needs_gpu
def test_lattice_sees_the_gpu_torch_sees():
    """With a GPU and a CUDA build, lattice must see the device (not a skip) at the sm torch reports."""
    caps = lattice.device_caps()["cuda"]
    assert caps["built"] and caps["device_count"] >= 1, caps
    major, minor = torch.cuda.get_device_capability(0)
    assert caps["sm"] == 10 * major + minor, caps
    assert tier() == {True: "hopper"}.get(90 <= caps["sm"] < 100, "tensor_core" if caps["sm"] >= 80 else "classic")


# ---- comparisons -------------------------------------------------------------------------------


def assert_close(actual: torch.Tensor, ref: torch.Tensor, tol_name: str, what: str,
                 rtol: Optional[float] = None) -> None:
    """``actual`` (CUDA) against ``ref`` (CPU reference): shape, dtype, non-finite values, then
    norm-wise and element-wise (``cuda_admission.compare``)."""
    assert isinstance(actual, torch.Tensor) and isinstance(ref, torch.Tensor), what
    assert actual.device.type == "cuda", f"{what}: expected a CUDA tensor, got {actual.device}"
    assert ref.device.type == "cpu", f"{what}: reference on {ref.device}"
    assert tuple(actual.shape) == tuple(ref.shape), f"{what}: shape {tuple(actual.shape)} vs {tuple(ref.shape)}"
    assert actual.dtype == ref.dtype, f"{what}: dtype {actual.dtype} vs {ref.dtype}"
    problems = adm.compare(actual, ref, tol_name, rtol)
    assert not problems, f"{what} (cuda vs cpu reference): " + "; ".join(problems)


def assert_equal(actual: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """Exact equality of (integer / bool) arrays across devices."""
    a = actual.detach().cpu()
    assert tuple(a.shape) == tuple(ref.shape), f"{what}: shape {tuple(a.shape)} vs {tuple(ref.shape)}"
    assert a.dtype == ref.dtype, f"{what}: dtype {a.dtype} vs {ref.dtype}"
    if not torch.equal(a, ref.detach().cpu()):
        diff = (a != ref.detach().cpu())
        if diff.dim() > 1:
            diff = diff.flatten(1).any(1)
        i = int(diff.nonzero()[0, 0])
        raise AssertionError(f"{what}: first difference at row {i}: cuda {a[i].tolist()} vs cpu {ref[i].tolist()} "
                             f"({int(diff.sum())} rows differ)")


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.contiguous().view(torch.int16)
    if t.dtype == torch.float32:
        return t.contiguous().view(torch.int32)
    if t.dtype == torch.float64:
        return t.contiguous().view(torch.int64)
    return t


def assert_bitwise(first: Sequence[Optional[torch.Tensor]], second: Sequence[Optional[torch.Tensor]], what: str) -> None:
    """Two CUDA runs of one call: every output bitwise identical (NaN payloads included)."""
    assert len(first) == len(second), what
    for i, (a, b) in enumerate(zip(first, second)):
        if a is None or b is None:
            assert a is None and b is None, f"{what}[{i}]: one run returned None"
            continue
        assert torch.equal(_bits(a), _bits(b)), f"{what}[{i}]: repeated CUDA runs differ (not deterministic)"


def check_explain(family: str, op: str, args: tuple, kwargs: dict, passes: dict[str, str], dtype: str,
                  geometry: str, route: Optional[str]) -> dict[str, Optional[str]]:
    """explain() of every pass (``passes``: explain's pass_ name -> the table's pass name) against
    the table, and, when ``route`` is forced, the forced explanation. Returns, per table pass, the
    route that runs: the forced one when admitted, else the chosen one; None when nothing runs."""
    runs: dict[str, Optional[str]] = {}
    for pass_, table_pass in passes.items():
        e = lattice.explain(op, *args, pass_=pass_, **kwargs)
        chosen = adm.assert_explanation(e, family, table_pass, dtype, geometry, tier())
        runs[table_pass] = chosen
        if route is not None:
            want = adm.verdict(family, route, table_pass, dtype, geometry, tier())
            if family in FORCEABLE:
                adm.assert_forced_explanation(lattice.explain(op, *args, pass_=pass_, route=route, **kwargs), route, want)
            runs[table_pass] = route if want == adm.ADMITTED else None
    return runs


# families whose explain() takes a forced route (algebra / coords / quantize explain the full table)
FORCEABLE = ("conv", "pool", "point_voxel", "quantized")


# ---- inputs ------------------------------------------------------------------------------------


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(shape: Sequence[int], dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    """CPU random values (never zeros) in ``dtype``."""
    return (torch.randn(*shape, generator=_gen(seed), dtype=torch.float64) * scale).to(dtype)


@functools.lru_cache(maxsize=None)
def large_name() -> str:
    return "kitti" if workloads.kitti_path() is not None else "lidar"


@functools.lru_cache(maxsize=None)
def coords_np(name: str) -> np.ndarray:
    """int32 (N, 4) coordinates of a named input (read-only)."""
    rng = np.random.default_rng(abs(hash(name)) % (2**32) if name not in _SEEDS else _SEEDS[name])
    if name == "small":
        c = random_coords(rng, 1500, batches=3, extent=14, spread=20)
    elif name == "medium":
        c = random_coords(rng, 20000, batches=2, extent=40, spread=60)
    elif name == "large":
        c = np.array(workloads.coords(large_name()))
    elif name == "empty":
        c = np.zeros((0, 4), np.int32)
    elif name == "one_row":
        c = np.array([[0, -3, 5, 7]], np.int32)
    elif name == "isolated":  # no two rows within a 3x3x3 (or 2x2x2 stride-2) window
        g = np.stack(np.meshgrid(np.arange(6), np.arange(6), np.arange(6), indexing="ij"), -1).reshape(-1, 3) * 4 - 9
        c = np.concatenate([np.zeros((g.shape[0], 1), np.int64), g], 1)
        c = c[rng.permutation(c.shape[0])]
    elif name == "negative":
        c = random_coords(rng, 800, batches=2, extent=8, spread=4)
        c[:, 1:] -= 40
    elif name in TILE_INPUTS:  # exactly 128k+1 / 128k+127 rows: the last 128-row tile is partial
        c = np.array(coords_np("medium"))[: TILE_INPUTS[name]]
        assert c.shape[0] == TILE_INPUTS[name]
    else:
        raise ValueError(name)
    out = np.ascontiguousarray(c, dtype=np.int32)
    out.setflags(write=False)
    return out


_SEEDS = {"small": 11, "medium": 12, "large": 13, "empty": 14, "one_row": 15, "isolated": 16, "negative": 17}
EDGES = ("empty", "one_row", "isolated", "negative")
TILE_INPUTS = {"tile_plus1": adm.PARTIAL_TILE_NS[0], "tile_minus1": adm.PARTIAL_TILE_NS[1]}


def coords_t(name: str) -> torch.Tensor:
    return torch.from_numpy(np.array(coords_np(name)))


def pair(coords: torch.Tensor, feats: torch.Tensor, stride: Any = 1) -> tuple[SparseTensor, SparseTensor]:
    """The same SparseTensor on the CPU and on cuda:0 (independent coordinate identities)."""
    return SparseTensor(coords, feats, stride), SparseTensor(coords.to(DEV), feats.to(DEV), stride)


def coarse_coords(name: str, stride: int = 2) -> torch.Tensor:
    """The stride-``stride`` parents of a named input (first-occurrence order, computed on the CPU)."""
    return ops.downsample_coords(coords_t(name), stride, route="reference")


# ---- convolution -------------------------------------------------------------------------------

# name -> (op, kernel_size, kwargs, input: "fine" | "coarse", target: None | "coarse" | "fine")
CONV_GEOMS = {
    "subm3": ("subm_conv3d", 3, {}, "fine", None),
    "subm3_dil2": ("subm_conv3d", 3, {"dilation": 2}, "fine", None),
    "subm_1x3x5": ("subm_conv3d", (1, 3, 5), {}, "fine", None),
    "pw": ("subm_conv3d", 1, {}, "fine", None),
    "k2s2": ("conv3d", 2, {"stride": 2}, "fine", None),
    "k3s2p1": ("conv3d", 3, {"stride": 2, "padding": 1}, "fine", None),
    "k3s2_expand": ("conv3d", 3, {"stride": 2, "expand": True}, "fine", None),
    "k4s1": ("conv3d", 4, {}, "fine", None),
    "k3s1_dil2": ("conv3d", 3, {"dilation": 2}, "fine", None),
    "k2s2_target": ("conv3d", 2, {"stride": 2}, "fine", "coarse"),
    "tr_k2s2": ("conv_transpose3d", 2, {"stride": 2}, "coarse", None),
    "tr_k2s2_target": ("conv_transpose3d", 2, {"stride": 2}, "coarse", "fine"),
    "tr_k3s2p1_target": ("conv_transpose3d", 3, {"stride": 2, "padding": 1}, "coarse", "fine"),
    "gen_k2s2": ("generative_conv_transpose3d", 2, {"stride": 2}, "coarse", None),
    "gen_k3s1": ("generative_conv_transpose3d", 3, {}, "fine", None),
}


class ConvInputs:
    """CPU and CUDA tensors of one conv case (same values)."""

    def __init__(self, geom: str, name: str, dtype: torch.dtype, c_in: int, c_out: int) -> None:
        op, k, kw, inp, tgt = CONV_GEOMS[geom]
        self.op, self.geom = op, geom
        stride = 2 if inp == "coarse" else 1
        coords = coarse_coords(name) if inp == "coarse" else coords_t(name)
        feats = randn((coords.shape[0], c_in), dtype, 1)
        self.x_cpu, self.x_cuda = pair(coords, feats, stride)
        kvol = math.prod(oracle.as_triple(k))
        self.w = randn((c_out, *oracle.as_triple(k), c_in), dtype, 2, 1.0 / math.sqrt(max(1, c_in * kvol)))
        self.b = randn((c_out,), dtype, 3)
        self.kw = dict(kw, kernel_size=k)
        self.t_cpu = self.t_cuda = None
        kind = {"subm_conv3d": "submanifold", "generative_conv_transpose3d": "generative"}.get(op)
        if kind is None:
            base = "forward" if op == "conv3d" else "transposed"
            kind = base if tgt is None else ("target" if base == "forward" else "transposed_target")
        self.kind, self.c_in, self.c_out = kind, c_in, c_out
        self.geometry = adm.conv_geometry(kind, kvol, c_in, c_out, torch.empty(0, dtype=dtype).element_size())
        if tgt == "coarse" and name in TILE_INPUTS:  # exactly as many target rows as the input
            c = coarse_coords("medium")[: TILE_INPUTS[name]]
            assert c.shape[0] == TILE_INPUTS[name]
            self.t_cpu, self.t_cuda = pair(c, torch.empty(c.shape[0], 0, dtype=dtype), 2)
        elif tgt == "coarse":  # every other parent, plus parents of nothing (rows with no edge)
            c = coarse_coords(name)
            extra = c[: max(1, c.shape[0] // 10)].clone()
            extra[:, 1] += 100_003  # far from every workload row: parents with no edge
            tc = torch.cat([c[::2], extra]) if c.shape[0] else c
            self.t_cpu, self.t_cuda = pair(tc, torch.empty(tc.shape[0], 0, dtype=dtype), 2)
        elif tgt == "fine":
            fc = coords_t(name)
            self.t_cpu, self.t_cuda = pair(fc, torch.empty(fc.shape[0], 0, dtype=dtype), 1)

    def kwargs(self, device: str, route: Optional[str], allow_tf32: bool = False) -> dict:
        kw = dict(self.kw, route=route, allow_tf32=allow_tf32)
        t = self.t_cpu if device == "cpu" else self.t_cuda
        if t is not None:
            kw["coordinates"] = t
        return kw


def run_conv(ci: ConvInputs, device: str, route: Optional[str], gy: Optional[torch.Tensor], need: Sequence[str],
             allow_tf32: bool = False) -> tuple[SparseTensor, list[Optional[torch.Tensor]]]:
    """Forward (and the requested gradients, by torch autograd) on one device."""
    dev = CPU if device == "cpu" else DEV
    x = ci.x_cpu if device == "cpu" else ci.x_cuda
    fx = x.feats.detach().clone().requires_grad_("x" in need)
    fw = ci.w.to(dev).requires_grad_("w" in need)
    fb = ci.b.to(dev).requires_grad_("b" in need)
    y = getattr(ops, ci.op)(x.replace_feats(fx), fw, fb, **ci.kwargs(device, route, allow_tf32))
    grads: list[Optional[torch.Tensor]] = [None, None, None]
    leaves = [t for t in (fx, fw, fb) if t.requires_grad]
    if gy is not None and leaves:
        got = torch.autograd.grad(y.feats, leaves, gy.to(dev), allow_unused=True)
        it = iter(got)
        grads = [next(it) if t.requires_grad else None for t in (fx, fw, fb)]
    return y, grads


@functools.lru_cache(maxsize=64)
def conv_reference(geom: str, name: str, dtype_name: str, c_in: int, c_out: int):
    """The CPU reference route's output, output gradient and gradients (cached across CUDA routes)."""
    ci = ConvInputs(geom, name, DTYPES[dtype_name], c_in, c_out)
    y0, _ = run_conv(ci, "cpu", "reference", None, ())
    gy = randn(tuple(y0.feats.shape), DTYPES[dtype_name], 4)
    y, grads = run_conv(ci, "cpu", "reference", gy, ("x", "w", "b"))
    return y.coords.clone(), y.feats.detach().clone(), gy, grads


CONV_PASSES = {"forward": "forward", "input_grad": "input_grad", "weight_grad": "weight_grad"}


def check_conv(geom: str, name: str, route: Optional[str], dtype_name: str, c_in: int, c_out: int) -> None:
    """Admission of every pass against the table, then (when the route runs) forward, input,
    weight and bias gradients against the CPU reference, twice for determinism; a rejected route
    is asserted rejected when forced, a problem no route admits raises UnsupportedError."""
    dtype = DTYPES[dtype_name]
    tf32 = dtype_name == "tf32"
    ci = ConvInputs(geom, name, dtype, c_in, c_out)
    args = (ci.x_cuda, ci.w.to(DEV))
    kw = ci.kwargs("cuda", None, tf32)
    kw.pop("route")
    runs_on = check_explain("conv", ci.op, args, kw, CONV_PASSES, dtype_name, ci.geometry, route)
    if runs_on["forward"] is None:
        if route is not None:
            want = adm.verdict("conv", route, "forward", dtype_name, ci.geometry, tier())
            adm.assert_forced_call_raises(lambda: run_conv(ci, "cuda", route, None, ()), ci.op, route, want)
        else:
            adm.assert_no_route_raises(lambda: run_conv(ci, "cuda", None, None, ()), ci.op)
        return
    ref_coords, ref_y, gy, ref_grads = conv_reference(geom, name, "f32" if tf32 else dtype_name, c_in, c_out)
    if runs_on["input_grad"] is None or runs_on["weight_grad"] is None:
        # forward runs but a gradient pass does not: the forward is compared, the backward must raise
        y, _ = run_conv(ci, "cuda", route, None, (), tf32)
        assert_close(y.feats, ref_y, dtype_name, f"{geom} {route} forward")
        need = ("x",) if runs_on["input_grad"] is None else ("w", "b")
        if route is not None:
            p = "input_grad" if runs_on["input_grad"] is None else "weight_grad"
            want = adm.verdict("conv", route, p, dtype_name, ci.geometry, tier())
            adm.assert_forced_call_raises(lambda: run_conv(ci, "cuda", route, gy, need, tf32), ci.op, route, want)
        else:
            adm.assert_no_route_raises(lambda: run_conv(ci, "cuda", None, gy, need, tf32), ci.op)
        return
    runs = [run_conv(ci, "cuda", route, gy, ("x", "w", "b"), tf32) for _ in range(2)]
    y, grads = runs[0]
    label = f"{geom}/{name} C={c_in}->{c_out} {dtype_name} " + "/".join(f"{p}:{r}" for p, r in runs_on.items())
    assert y.feats.is_cuda and y.coords.is_cuda
    assert_equal(y.coords, ref_coords, f"{label} output coords")
    assert_close(y.feats, ref_y, dtype_name, f"{label} forward")
    for i, what in enumerate(("input grad", "weight grad", "bias grad")):
        assert grads[i] is not None and grads[i].is_cuda, f"{label}: no CUDA {what}"
        assert_close(grads[i], ref_grads[i], dtype_name, f"{label} {what}")
    assert_bitwise([runs[0][0].feats, *runs[0][1]], [runs[1][0].feats, *runs[1][1]], label)


CONV_DTYPES = ("f32", "tf32", "f16", "bf16")
CONV_SMALL = pick(
    [(g, r, d) for g in CONV_GEOMS for r in CONV_ROUTES for d in CONV_DTYPES],
    [(g, r, d) for g in ("subm3", "k2s2", "tr_k2s2_target", "gen_k2s2") for r in CONV_ROUTES for d in ("f32", "f16")],
)


@needs_gpu
@pytest.mark.parametrize("geom,route,dtype_name", CONV_SMALL)
def test_conv_parity_small(geom, route, dtype_name):
    check_conv(geom, "small", route, dtype_name, 16, 24)


@needs_gpu
@pytest.mark.parametrize("geom,route,dtype_name", pick(
    [(g, r, d) for g in ("subm3", "k2s2", "tr_k2s2_target") for r in (None, *CONV_ROUTES) for d in ("f32", "f16", "bf16")]
    + [("pw", r, d) for r in (None, "cuda_pointwise_matmul") for d in CONV_DTYPES],
    [("subm3", r, "f16") for r in CONV_ROUTES] + [("pw", "cuda_pointwise_matmul", "f16")]))
def test_conv_parity_odd_channels(geom, route, dtype_name):
    """Channel counts that are not multiples of a vector width or an mma tile."""
    check_conv(geom, "small", route, dtype_name, 3, 5)


@needs_gpu
@pytest.mark.parametrize("channels", [(40, 70), (32, 72)])
@pytest.mark.parametrize("name", list(TILE_INPUTS))
@pytest.mark.parametrize("geom,route,dtype_name", pick(
    [(g, r, d) for g in ("subm3", "k2s2_target", "tr_k2s2_target") for r in CONV_ROUTES for d in CONV_DTYPES]
    + [("pw", "cuda_pointwise_matmul", d) for d in CONV_DTYPES],
    [("subm3", r, "f16") for r in CONV_ROUTES] + [("pw", "cuda_pointwise_matmul", "bf16")]))
def test_conv_parity_partial_tiles(geom, route, dtype_name, name, channels):
    """Output rows (forward) and input rows (input gradient) 128k+1 and 128k+127: the last
    128-row tile holds 1 or 127 rows; C_out 70 / 72 leaves a partial 64-channel tile, C_in 40 a
    partial 32-channel step (unaligned: element loads; 32 -> 72 aligned: 16-byte copies)."""
    check_conv(geom, name, route, dtype_name, *channels)


@needs_gpu
@pytest.mark.parametrize("geom", pick(["subm3", "k2s2", "tr_k2s2_target", "gen_k2s2", "pw"], ["subm3"]))
@pytest.mark.parametrize("route", [None, *CONV_ROUTES])
def test_conv_float64_is_rejected_on_cuda(geom, route):
    """float64 convolutions run on the CPU only: every CUDA route rejects them (the table's reason),
    forcing one raises ValueError and the default call raises UnsupportedError."""
    check_conv(geom, "small", route, "f64", 8, 8)


if not REDUCED:
    @needs_gpu
    @pytest.mark.parametrize("geom,route,dtype_name", [
        (g, r, d) for g in ("subm3", "k2s2", "tr_k2s2_target") for r in CONV_ROUTES for d in ("f32", "f16")])
    def test_conv_parity_large(geom, route, dtype_name):
        check_conv(geom, "large", route, dtype_name, 32, 32)

    @needs_gpu
    @pytest.mark.parametrize("geom,route,dtype_name",
                             [(g, r, "f32") for g in ("subm3", "k3s2p1") for r in CONV_ROUTES]
                             + [("subm3", r, "f16") for r in CONV_ROUTES])
    def test_conv_parity_medium(geom, route, dtype_name):
        check_conv(geom, "medium", route, dtype_name, 64, 64)


@needs_gpu
@pytest.mark.parametrize("edge", EDGES)
@pytest.mark.parametrize("geom", pick(["subm3", "k2s2", "tr_k2s2_target", "gen_k2s2"], ["subm3", "k2s2"]))
@pytest.mark.parametrize("route", [None, *CONV_ROUTES])
def test_conv_parity_edges(edge, geom, route):
    check_conv(geom, edge, route, "f32", 8, 8)


def _relation_arrays(p: Any) -> dict[str, torch.Tensor]:
    """Every array of a plan's relation, its output coordinates and the lazily built views (the
    N_out x K gemm map, the row masks, the input-side map and both mask orders of the rows, which
    the implicit-GEMM tiles follow); an error building a view fails the test."""
    rel = p.relation
    out = {k: lattice._core.from_core(v) for k, v in rel.arrays().items()}
    out["out_coords"] = lattice._core.from_core(p.output.coords())
    out["gemm_map"] = lattice._core.from_core(rel.gemm_map())
    out["row_masks"] = lattice._core.from_core(rel.row_masks())
    out["input_gemm_map"] = lattice._core.from_core(rel.input_gemm_map())
    for name in ("gemm_order", "input_gemm_order"):
        order = getattr(rel, name)()
        assert (order is None) == (rel.kernel_volume > 64 or rel.identity), \
            f"{name} defined iff K <= 64 and the relation is not the identity"
        out[name] = torch.zeros(0) if order is None else lattice._core.from_core(order)
    return out


@needs_gpu
@pytest.mark.parametrize("name", pick(["small", "large", *EDGES, *TILE_INPUTS], ["small", "one_row"]))
@pytest.mark.parametrize("geom", pick(list(CONV_GEOMS), ["subm3", "k2s2", "tr_k2s2_target"]))
def test_relation_arrays_identical_across_devices(geom, name):
    """The relation built on the GPU equals the CPU one bitwise: the edge list, both groupings, the
    output coordinates, the gemm map, the row masks, the input-side map and the two row orders
    (all thirteen arrays, each on its device)."""
    ci = ConvInputs(geom, name, torch.float32, 4, 4)
    kw_cpu, kw_cuda = ci.kwargs("cpu", None), ci.kwargs("cuda", None)
    p_cpu = ops.conv.plan(ci.op, ci.kind, ci.x_cpu, ci.w, **kw_cpu)
    p_cuda = ops.conv.plan(ci.op, ci.kind, ci.x_cuda, ci.w.to(DEV), **kw_cuda)
    assert p_cpu.kind == p_cuda.kind == ci.kind
    a, b = _relation_arrays(p_cpu), _relation_arrays(p_cuda)
    assert p_cpu.relation.n_edges == p_cuda.relation.n_edges and p_cpu.relation.n_out == p_cuda.relation.n_out
    assert p_cpu.relation.identity == p_cuda.relation.identity
    assert sorted(a) == sorted(b) and len(a) == 13, sorted(a)
    for k in a:
        if b[k].numel() == 0 and k.endswith("_order"):
            continue  # no order (K > 64) on either device, checked above
        assert b[k].device.type == "cuda", f"{geom}/{name} relation {k} on {b[k].device}"
        assert_equal(b[k], a[k], f"{geom}/{name} relation {k}")


# ---- pooling -----------------------------------------------------------------------------------

# name -> (op, args, kwargs, input "fine"|"coarse", target None|"coarse"|"fine")
POOL_GEOMS = {
    "max_k2s2": ("max_pool3d", (2, 2), {}, "fine", None),
    "avg_k2s2": ("avg_pool3d", (2, 2), {}, "fine", None),
    "sum_k2s2": ("sum_pool3d", (2, 2), {}, "fine", None),
    "max_k3s1": ("max_pool3d", (3, 1), {}, "fine", None),
    "avg_k3s2p1": ("avg_pool3d", (3, 2, 1), {}, "fine", None),
    "sum_k3s2_expand": ("sum_pool3d", (3, 2), {"expand": True}, "fine", None),
    "max_k2s2_target": ("max_pool3d", (2, 2), {}, "fine", "coarse"),
    "avg_k3s1_dil2": ("avg_pool3d", (3, 1, 0, 2), {}, "fine", None),
    "global_sum": ("global_sum_pool", (), {}, "fine", None),
    "global_avg": ("global_avg_pool", (), {}, "fine", None),
    "global_max": ("global_max_pool", (), {}, "fine", None),
    "unpool_k2s2": ("pool_transpose3d", (2,), {}, "coarse", None),
    "unpool_k2s2_target": ("pool_transpose3d", (2,), {}, "coarse", "fine"),
    "unpool_k3s2_target": ("pool_transpose3d", (3, 2), {}, "coarse", "fine"),
    "trilinear": ("trilinear_upsample3d", (), {}, "coarse", None),
    "trilinear_target": ("trilinear_upsample3d", (), {}, "coarse", "fine"),
}


class PoolInputs:
    def __init__(self, geom: str, name: str, dtype: torch.dtype, channels: int = 12) -> None:
        op, args, kw, inp, tgt = POOL_GEOMS[geom]
        self.op, self.args, self.kw = op, args, dict(kw)
        coords = coarse_coords(name) if inp == "coarse" else coords_t(name)
        feats = randn((coords.shape[0], channels), dtype, 5)
        self.x_cpu, self.x_cuda = pair(coords, feats, 2 if inp == "coarse" else 1)
        self.t_cpu = self.t_cuda = None
        if tgt == "coarse" and name in TILE_INPUTS:  # exactly 128k+1 / 128k+127 output rows
            tc = coarse_coords("medium")[: TILE_INPUTS[name]]
            self.t_cpu, self.t_cuda = pair(tc, torch.empty(tc.shape[0], 0, dtype=dtype), 2)
        elif tgt == "coarse":
            c = coarse_coords(name)
            tc = torch.cat([c[1::2], c[:3] + torch.tensor([0, 100_003, 0, 0], dtype=torch.int32)]) if c.shape[0] else c
            self.t_cpu, self.t_cuda = pair(tc, torch.empty(tc.shape[0], 0, dtype=dtype), 2)
        elif tgt == "fine":
            fc = coords_t(name)
            self.t_cpu, self.t_cuda = pair(fc, torch.empty(fc.shape[0], 0, dtype=dtype), 1)

    def call(self, device: str, feats: torch.Tensor, route: Optional[str]) -> Any:
        x = (self.x_cpu if device == "cpu" else self.x_cuda).replace_feats(feats)
        kw = dict(self.kw, route=route)
        t = self.t_cpu if device == "cpu" else self.t_cuda
        if t is not None:
            kw["coordinates"] = t
        return getattr(ops, self.op)(x, *self.args, **kw)

    def explain_args(self) -> tuple[tuple, dict]:
        kw = dict(self.kw)
        if self.t_cuda is not None:
            kw["coordinates"] = self.t_cuda
        return (self.x_cuda, *self.args), kw


def _out_feats(y: Any) -> torch.Tensor:
    return y.feats if isinstance(y, SparseTensor) else y


def run_pool(pi: PoolInputs, device: str, route: Optional[str], gy: Optional[torch.Tensor]):
    x = pi.x_cpu if device == "cpu" else pi.x_cuda
    f = x.feats.detach().clone().requires_grad_(gy is not None)
    y = pi.call(device, f, route)
    g = None
    if gy is not None:
        (g,) = torch.autograd.grad(_out_feats(y), (f,), gy.to(f.device))
    return y, g


POOL_PASSES = {"forward": "forward", "input_grad": "input_grad"}


def pool_edges(pi: "PoolInputs") -> str:
    """The pool geometry class of a case: where its edges come from (problem.h PoolEdges)."""
    if pi.op.startswith("global_"):
        return "batch"
    if pi.op == "trilinear_upsample3d":
        return "trilinear"
    base = "transposed" if pi.op == "pool_transpose3d" else "forward"
    if pi.t_cuda is None:
        return base
    return "target" if base == "forward" else "transposed_target"


def check_pool(geom: str, name: str, route: Optional[str], dtype_name: str) -> None:
    """Admission of both passes against the table, then forward and input gradient against the
    CPU reference (twice, bitwise). An input the CPU reference rejects (global max of an empty
    batch) must be rejected on CUDA with the same error."""
    dtype = DTYPES[dtype_name]
    pi = PoolInputs(geom, name, dtype)
    args, kw = pi.explain_args()
    try:
        y0, _ = run_pool(pi, "cpu", "reference", None)
    except ValueError as exc:  # the same error on the device, from explain and from the call
        for call in (lambda: lattice.explain(pi.op, *args, **kw), lambda: run_pool(pi, "cuda", route, None)):
            with pytest.raises(ValueError) as info:
                call()
            assert str(info.value) == str(exc), f"{geom}/{name}: cpu {exc!s} vs cuda {info.value!s}"
        return
    runs_on = check_explain("pool", pi.op, args, kw, POOL_PASSES, dtype_name, pool_edges(pi), route)
    assert runs_on["forward"] is not None and runs_on["input_grad"] is not None, (
        f"{geom}: the table admits no CUDA pool route for {dtype_name}; extend check_pool for rejections")
    gy = randn(tuple(_out_feats(y0).shape), dtype, 6)
    ref, ref_g = run_pool(pi, "cpu", "reference", gy)
    runs = [run_pool(pi, "cuda", route, gy) for _ in range(2)]
    y, g = runs[0]
    label = f"{geom}/{name} {dtype_name} {runs_on['forward']}"
    if isinstance(y, SparseTensor):
        assert_equal(y.coords, ref.coords, f"{label} output coords")
    assert_close(_out_feats(y), _out_feats(ref), dtype_name, f"{label} forward")
    assert g is not None and g.is_cuda
    assert_close(g, ref_g, dtype_name, f"{label} input grad")
    assert_bitwise([_out_feats(runs[0][0]), runs[0][1]], [_out_feats(runs[1][0]), runs[1][1]], label)


@needs_gpu
@pytest.mark.parametrize("geom,route,dtype_name", pick(
    [(g, r, d) for g in POOL_GEOMS for r in (None, *POOL_ROUTES) for d in ("f32", "f16", "bf16")],
    [(g, r, "f32") for g in ("max_k2s2", "avg_k3s2p1", "global_max", "unpool_k2s2_target", "trilinear_target")
     for r in POOL_ROUTES]))
def test_pool_parity_small(geom, route, dtype_name):
    check_pool(geom, "small", route, dtype_name)


@needs_gpu
@pytest.mark.parametrize("geom", pick(["max_k2s2", "avg_k2s2", "global_max", "unpool_k2s2"], ["max_k2s2"]))
def test_pool_parity_float64(geom):
    """float64 pooling is admitted on CUDA (any float dtype) and compared at the f64 tolerance."""
    check_pool(geom, "small", None, "f64")


@needs_gpu
@pytest.mark.parametrize("name", list(TILE_INPUTS))
@pytest.mark.parametrize("geom", pick(["max_k2s2_target", "avg_k3s2p1", "unpool_k2s2_target", "trilinear_target"],
                                      ["unpool_k2s2_target"]))
def test_pool_parity_partial_tiles(geom, name):
    """128k+1 / 128k+127 rows (targets of exactly that many rows): the last block of rows is partial."""
    check_pool(geom, name, None, "bf16")


if not REDUCED:
    @needs_gpu
    @pytest.mark.parametrize("geom,route", [
        (g, r) for g in ("max_k2s2", "avg_k2s2", "global_avg", "unpool_k2s2_target", "trilinear_target")
        for r in POOL_ROUTES])
    def test_pool_parity_large(geom, route):
        check_pool(geom, "large", route, "f16")


@needs_gpu
@pytest.mark.parametrize("edge", EDGES)
@pytest.mark.parametrize("geom", pick(["max_k2s2", "avg_k3s2p1", "global_sum", "global_max", "unpool_k2s2_target",
                                       "trilinear"], ["max_k2s2", "global_sum"]))
def test_pool_parity_edges(edge, geom):
    check_pool(geom, edge, None, "f32")


# ---- sparse algebra ----------------------------------------------------------------------------

ALGEBRA_OPS = ("sparse_add", "sparse_sub", "sparse_mul", "sparse_maximum", "sparse_minimum", "sparse_cat_aligned")
JOINS = ("inner", "left", "right", "outer")


def algebra_inputs(name: str, dtype: torch.dtype, op: str, same_key: bool = False):
    a = coords_t(name)
    n = a.shape[0]
    # rhs: every other lhs row (reordered) plus rows absent from lhs
    shifted = a[: max(0, n // 3)].clone()
    shifted[:, 1] += 100_003  # absent from lhs on every input
    b = torch.cat([a[::2].flip(0), shifted]) if n else a
    c_r = 5 if op == "sparse_cat_aligned" else 7
    fa, fb = randn((n, 7), dtype, 7), randn((b.shape[0], c_r), dtype, 8)
    lhs_cpu, lhs_cuda = pair(a, fa)
    if same_key:
        fb = randn((n, c_r), dtype, 8)
        return lhs_cpu, lhs_cpu.replace_feats(fb), lhs_cuda, lhs_cuda.replace_feats(fb.to(DEV))
    rhs_cpu, rhs_cuda = pair(b, fb)
    return lhs_cpu, rhs_cpu, lhs_cuda, rhs_cuda


def run_algebra(op: str, lhs: SparseTensor, rhs: SparseTensor, join: str, route: Optional[str],
                gy: Optional[torch.Tensor]):
    fl = lhs.feats.detach().clone().requires_grad_(gy is not None)
    fr = rhs.feats.detach().clone().requires_grad_(gy is not None)
    l2 = lhs.replace_feats(fl)
    r2 = l2.replace_feats(fr) if lhs.key == rhs.key else rhs.replace_feats(fr)
    y = getattr(ops, op)(l2, r2, join=join, fill=0.25, route=route)
    grads = [None, None]
    if gy is not None:
        grads = list(torch.autograd.grad(y.feats, (fl, fr), gy.to(fl.device), allow_unused=True))
    return y, grads


def check_algebra(op: str, join: str, name: str, route: Optional[str], dtype_name: str, same_key: bool = False):
    """Admission of the alignment, the combine and its backward against the table, then output
    coordinates, features and both gradients against the CPU reference (twice, bitwise)."""
    dtype = DTYPES[dtype_name]
    lc, rc, lg, rg = algebra_inputs(name, dtype, op, same_key)
    combine_geometry = "same_key" if same_key else "aligned"
    runs_on = check_explain("algebra", op, (lg, rg), {"join": join}, {"align": "align"}, "i32", join, route)
    runs_on.update(check_explain("algebra", op, (lg, rg), {"join": join}, {"combine": "forward", "backward": "backward"},
                                 dtype_name, combine_geometry, route))
    assert all(r is not None for r in runs_on.values()), (
        f"{op}: the table admits no CUDA algebra route here; extend check_algebra for rejections")
    y0, _ = run_algebra(op, lc, rc, join, "reference", None)
    gy = randn(tuple(y0.feats.shape), dtype, 9)
    ref, ref_g = run_algebra(op, lc, rc, join, "reference", gy)
    runs = [run_algebra(op, lg, rg, join, route, gy) for _ in range(2)]
    y, g = runs[0]
    label = f"{op}/{join}/{name} {dtype_name} {runs_on['forward']}"
    assert_equal(y.coords, ref.coords, f"{label} output coords")
    assert (y.key == lg.key) == (ref.key == lc.key), f"{label}: identity rule differs between devices"
    assert_close(y.feats, ref.feats, dtype_name, f"{label} forward")
    for i, side in enumerate(("lhs", "rhs")):
        if ref_g[i] is None:
            assert g[i] is None or float(g[i].abs().sum()) == 0.0, f"{label} {side} grad: cpu has none, cuda nonzero"
        else:
            assert g[i] is not None, f"{label} {side} grad: cuda has none"
            assert_close(g[i], ref_g[i], dtype_name, f"{label} {side} grad")
    assert_bitwise([runs[0][0].feats, *runs[0][1]], [runs[1][0].feats, *runs[1][1]], label)


@needs_gpu
@pytest.mark.parametrize("op,join,route,dtype_name", pick(
    [(o, j, r, d) for o in ALGEBRA_OPS for j in JOINS for r in (None, *ALGEBRA_ROUTES) for d in ("f32", "f16", "bf16")],
    [(o, "outer", "cuda_hashed", "f32") for o in ("sparse_add", "sparse_maximum", "sparse_cat_aligned")]))
def test_algebra_parity_small(op, join, route, dtype_name):
    check_algebra(op, join, "small", route, dtype_name)


@needs_gpu
@pytest.mark.parametrize("op", pick(ALGEBRA_OPS, ["sparse_mul"]))
def test_algebra_parity_same_key(op):
    check_algebra(op, "inner", "small", None, "f32", same_key=True)


@needs_gpu
@pytest.mark.parametrize("name", list(TILE_INPUTS))
@pytest.mark.parametrize("op,join", pick([("sparse_add", "outer"), ("sparse_mul", "left")], [("sparse_add", "outer")]))
def test_algebra_parity_partial_tiles(op, join, name):
    check_algebra(op, join, name, None, "bf16")


if not REDUCED:
    @needs_gpu
    @pytest.mark.parametrize("op,join", [(o, j) for o in ("sparse_add", "sparse_mul") for j in JOINS])
    def test_algebra_parity_large(op, join):
        check_algebra(op, join, "large", None, "f16")


@needs_gpu
@pytest.mark.parametrize("edge", EDGES)
@pytest.mark.parametrize("op,join", pick([("sparse_add", "outer"), ("sparse_mul", "inner"), ("sparse_maximum", "left")],
                                         [("sparse_add", "outer")]))
def test_algebra_parity_edges(edge, op, join):
    check_algebra(op, join, edge, None, "f32")


# ---- coordinate utilities ----------------------------------------------------------------------

COORD_OPS = ("union_coords", "intersection_coords", "lookup_coords", "contains_coords", "downsample_coords",
             "downsample_coords_inverse", "downsample_anisotropic", "morton_codes", "morton_order", "prune", "crop",
             "sparse_collate", "sparse_from_coordinates_mean", "sparse_from_coordinates_sum", "dense", "from_dense")


def _with_duplicates(c: torch.Tensor) -> torch.Tensor:
    return torch.cat([c, c[::3].flip(0)]) if c.shape[0] else c


def coord_op(op: str, name: str, device: torch.device, route_of: Callable[[str], Optional[str]]) -> list:
    """The outputs of one coordinate utility on ``device`` (inputs built identically on both)."""
    c = coords_t(name)
    n = c.shape[0]
    q = torch.cat([c[::2], c[:5] + torch.tensor([0, 0, 0, 100_003], dtype=torch.int32), c[:4]]) if n else c
    other = torch.cat([c[1::2], c[:7] + torch.tensor([0, 100_019, 0, 0], dtype=torch.int32)]) if n else c
    d = lambda t: t.to(device)  # noqa: E731
    if op == "union_coords":
        return [ops.union_coords(d(c), d(other), route=route_of("algebra"))]
    if op == "intersection_coords":
        return [ops.intersection_coords(d(c), d(other), route=route_of("algebra"))]
    if op == "lookup_coords":
        return [ops.lookup_coords(d(c), d(q), route=route_of("algebra"))]
    if op == "contains_coords":
        return [ops.contains_coords(d(c), d(q), route=route_of("algebra"))]
    if op == "downsample_coords":
        return [ops.downsample_coords(d(_with_duplicates(c)), 2, route=route_of("coords"))]
    if op == "downsample_coords_inverse":
        return list(ops.downsample_coords(d(_with_duplicates(c)), 3, return_inverse=True, route=route_of("coords")))
    if op == "downsample_anisotropic":
        return list(ops.downsample_coords(d(c), (1, 2, 4), return_inverse=True, route=route_of("coords")))
    if op == "morton_codes":
        return [ops.morton_codes(d(c), route=route_of("coords")), ops.morton_codes(d(c[:, 1:].contiguous()))]
    if op == "morton_order":
        return [ops.morton_order(d(_with_duplicates(c)), route=route_of("coords"))]
    f = randn((n, 6), torch.float32, 10)
    x = SparseTensor(d(c), d(f))
    if op == "prune":
        mask = torch.arange(n) % 3 != 1
        y = ops.prune(x, d(mask))
        return [y.coords, y.feats]
    if op == "crop":
        y = ops.crop(x, (-5, -5, -5), (6, 7, 8))
        return [y.coords, y.feats]
    if op == "sparse_collate":
        # sample i gets batch id i, so rows must be unique by (x, y, z) within a sample (the
        # workloads repeat (x, y, z) across batches): keep each sample's first occurrences
        a, b = _first_unique_xyz(c[: n // 2]), _first_unique_xyz(c[n // 2:])
        fa, fb = f[: n // 2][a], f[n // 2:][b]
        samples = [(d(c[: n // 2][a]), d(fa)), (d(c[n // 2:][b][:, 1:].contiguous()), d(fb))]
        y = ops.sparse_collate(samples)
        return [y.coords, y.feats, torch.tensor(y.batch_counts)]
    if op.startswith("sparse_from_coordinates"):
        cd = _with_duplicates(c)
        fd = randn((cd.shape[0], 6), torch.float32, 11)
        y, inv = ops.sparse_from_coordinates(d(cd), d(fd), reduction=op.rsplit("_", 1)[1], return_inverse=True)
        return [y.coords, y.feats, inv]
    if op == "dense":
        if n == 0:
            return [torch.zeros(0)]
        lo = c[:, 1:].min(0).values
        # max_bytes: a device-independent refusal of the large workload's ~6e9-cell grid (the
        # default limit is the memory available on each device, which differs between them)
        g = ops.dense(x, origin=tuple(int(v) for v in lo), max_bytes=2**30)
        return [g]
    if op == "from_dense":
        g = randn((2, 3, 5, 6, 4), torch.float32, 12)
        g = g * (torch.rand(2, 1, 5, 6, 4, generator=_gen(13)) < 0.3)
        y = ops.from_dense(d(g), origin=(-2, 3, -1))
        return [y.coords, y.feats, torch.tensor(y.batch_counts)]
    raise ValueError(op)


def _first_unique_xyz(rows: torch.Tensor) -> torch.Tensor:
    """Indices of the rows whose (x, y, z) has not occurred before, in order."""
    seen: set[tuple[int, ...]] = set()
    keep = []
    for i, r in enumerate(rows[:, 1:].tolist()):
        if tuple(r) not in seen:
            seen.add(tuple(r))
            keep.append(i)
    return torch.tensor(keep, dtype=torch.long)


# coordinate utility -> (family, table pass, geometry) of its explain() on CUDA data
COORD_ADMISSION = {
    "union_coords": ("algebra", "align", "outer"), "intersection_coords": ("algebra", "align", "inner"),
    "lookup_coords": ("algebra", "lookup", "-"), "contains_coords": ("algebra", "lookup", "-"),
    "downsample_coords": ("coords", "downsample", "-"), "downsample_coords_inverse": ("coords", "downsample", "-"),
    "downsample_anisotropic": ("coords", "downsample", "-"), "morton_codes": ("coords", "morton_codes", "-"),
    "morton_order": ("coords", "morton_order", "-"), "prune": ("coords", "prune", "-"), "crop": ("coords", "crop", "-"),
    "sparse_collate": ("coords", "collate", "-"), "sparse_from_coordinates_mean": ("coords", "downsample", "-"),
    "sparse_from_coordinates_sum": ("coords", "downsample", "-"), "dense": ("coords", "dense", "-"),
    "from_dense": ("coords", "from_dense", "-"),
}


def coord_explain(op: str, name: str) -> Any:
    """explain() of a coordinate utility on the CUDA inputs coord_op builds."""
    c = coords_t(name).to(DEV)
    n = c.shape[0]
    x = SparseTensor(c, torch.zeros(n, 6, device=DEV))
    if op in ("union_coords", "intersection_coords", "lookup_coords", "contains_coords"):
        return lattice.explain(op, c, c)
    if op in ("prune", "crop", "dense"):
        return lattice.explain(op, x)
    if op == "sparse_collate":
        return lattice.explain(op, [(c[: n // 2], x.feats[: n // 2]), (c[n // 2:], x.feats[n // 2:])])
    if op == "from_dense":
        return lattice.explain(op, torch.zeros(2, 3, 5, 6, 4, device=DEV))
    if op.startswith("sparse_from_coordinates"):
        return lattice.explain("sparse_from_coordinates", c)
    return lattice.explain(op.replace("_inverse", "").replace("_anisotropic", "_coords"), c)


@needs_gpu
@pytest.mark.parametrize("name", pick(["small", "large", *EDGES, *TILE_INPUTS], ["small", "one_row"]))
@pytest.mark.parametrize("op", pick(COORD_OPS, ["union_coords", "lookup_coords", "downsample_coords_inverse",
                                               "morton_order", "sparse_from_coordinates_mean"]))
def test_coordinate_utilities_parity(op, name):
    """explain() on the CUDA inputs against the table, then every output against the CPU reference
    (exact for integers), twice bitwise. The dense grid of the large workload is too big on both
    devices: the same ValueError on both."""
    family, table_pass, geometry = COORD_ADMISSION[op]
    chosen = adm.assert_explanation(coord_explain(op, name), family, table_pass, "i32", geometry, tier())
    assert chosen == {"algebra": ALGEBRA_ROUTES[0], "coords": COORDS_ROUTES[0]}[family]
    routes = {"algebra": ALGEBRA_ROUTES[0], "coords": COORDS_ROUTES[0]}
    if name == "large" and op == "dense":
        with pytest.raises(ValueError, match="at most max_bytes") as on_cpu:
            coord_op(op, name, CPU, lambda fam: "reference" if fam in ("algebra", "coords") else None)
        with pytest.raises(ValueError) as on_cuda:
            coord_op(op, name, DEV, lambda fam: routes.get(fam))
        assert str(on_cuda.value) == str(on_cpu.value)
        return
    ref = coord_op(op, name, CPU, lambda fam: "reference" if fam in ("algebra", "coords") else None)
    runs = [coord_op(op, name, DEV, lambda fam: routes.get(fam)) for _ in range(2)]
    assert len(runs[0]) == len(ref)
    for i, (a, r) in enumerate(zip(runs[0], ref)):
        if a.dtype.is_floating_point:
            assert_close(a, r, "f32", f"{op}[{i}]") if a.numel() else assert_equal(a.cpu(), r, f"{op}[{i}]")
        else:
            assert_equal(a, r, f"{op}[{i}]")
    assert_bitwise([t for t in runs[0] if t.is_cuda], [t for t in runs[1] if t.is_cuda], op)


# ---- sparse_quantize and point <-> voxel --------------------------------------------------------


@functools.lru_cache(maxsize=None)
def points_np(name: str) -> np.ndarray:
    if name == "large":
        return np.array(workloads.points("kitti_points" if workloads.kitti_path() else "lidar_points"))
    rng = np.random.default_rng(21)
    if name == "small":
        return (rng.normal(size=(5000, 3)) * 3.0).astype(np.float32)
    if name == "empty":
        return np.zeros((0, 3), np.float32)
    if name == "one_row":
        return np.array([[-1.25, 0.5, 3.75]], np.float32)
    if name == "negative":
        return (rng.normal(size=(2000, 3)) - 50.0).astype(np.float32)
    if name == "isolated":
        return (np.arange(300, dtype=np.float32).reshape(100, 3) * 7.1).astype(np.float32)
    raise ValueError(name)


@needs_gpu
@pytest.mark.parametrize("name", pick(["small", "large", *EDGES], ["small", "one_row"]))
@pytest.mark.parametrize("variant", pick(["plain", "f64", "batched", "anisotropic_origin", "drop_invalid"],
                                         ["plain", "drop_invalid"]))
@pytest.mark.parametrize("route", [None, *QUANTIZE_ROUTES])
def test_sparse_quantize_parity(variant, name, route):
    p = torch.from_numpy(points_np(name).copy())
    if variant == "f64":
        p = p.double()
    kw: dict[str, Any] = {}
    voxel: Any = 0.2
    b = None
    if variant == "batched":
        b = torch.arange(p.shape[0]) % 3
    if variant == "anisotropic_origin":
        voxel, kw["origin"] = (0.1, 0.25, 0.5), (-0.3, 0.1, 2.0)
    if variant == "drop_invalid":
        p = p.clone()
        if p.shape[0]:
            p[:: 7, 1] = float("nan")
            p[3:: 11, 0] = float("inf")
        kw["drop_invalid"] = True
    # explain() lists the whole table (a route cannot be forced through it)
    runs_on = adm.assert_explanation(lattice.explain("sparse_quantize", p.to(DEV)), "quantize", "forward",
                                     adm.dtype_key(p.dtype), "-", tier())
    if route is not None:
        assert adm.is_admitted("quantize", route, "forward", adm.dtype_key(p.dtype), "-", tier())
    assert runs_on is not None
    ref = ops.sparse_quantize(p, voxel, b, route="reference", **kw)
    runs = [ops.sparse_quantize(p.to(DEV), voxel, None if b is None else b.to(DEV), route=route, **kw)
            for _ in range(2)]
    for i, (a, r) in enumerate(zip(runs[0], ref)):
        assert a.is_cuda
        assert_equal(a, r, f"sparse_quantize[{i}]")
    assert_bitwise(runs[0], runs[1], "sparse_quantize")


def _pv_inputs(name: str, dtype: torch.dtype):
    p = torch.from_numpy(points_np(name).copy())
    f = randn((p.shape[0], 6), dtype, 22)
    return p, f


# Every input in f32; the 16-bit dtypes on the small input and the empty one (the edge cases and
# the large input in f32 only keep the suite short).
_VOXELIZE_INPUTS = [(name, dt) for name in ("small", "large", *EDGES) for dt in ("f32", "f16", "bf16")
                    if dt == "f32" or name not in EDGES[1:] + ("large",)]


@needs_gpu
@pytest.mark.parametrize("name,dtype_name", pick(_VOXELIZE_INPUTS, [("small", "f32")]))
@pytest.mark.parametrize("reduction", pick(["mean", "sum", "max"], ["mean", "max"]))
@pytest.mark.parametrize("route", [None, *POINT_VOXEL_ROUTES])
def test_voxelize_parity(name, dtype_name, reduction, route):
    dtype = DTYPES[dtype_name]
    p, f = _pv_inputs(name, dtype)
    runs_on = check_explain("point_voxel", "voxelize", (p.to(DEV), f.to(DEV), 0.3, reduction), {},
                            {"forward": "forward", "backward": "backward"}, dtype_name, "voxelize", route)
    assert all(r is not None for r in runs_on.values()), runs_on

    def run(device: torch.device, rt: Optional[str]):
        ff = f.to(device).requires_grad_(True)
        v = ops.voxelize(p.to(device), ff, 0.3, reduction, route=rt)
        gy = randn(tuple(v.feats.shape), dtype, 23).to(device)
        (g,) = torch.autograd.grad(v.feats, (ff,), gy) if v.feats.numel() else (torch.zeros_like(ff),)
        return v, g

    ref, ref_g = run(CPU, "reference")
    runs = [run(DEV, route) for _ in range(2)]
    v, g = runs[0]
    assert_equal(v.coords, ref.coords, "voxelize coords")
    assert_close(v.feats, ref.feats, dtype_name, f"voxelize {reduction} forward")
    assert_close(g, ref_g, dtype_name, f"voxelize {reduction} grad")
    assert_bitwise([runs[0][0].feats, runs[0][1]], [runs[1][0].feats, runs[1][1]], "voxelize")


@needs_gpu
@pytest.mark.parametrize("name", pick(["small", "large", *EDGES], ["small"]))
@pytest.mark.parametrize("mode,normalize", pick([("nearest", True), ("trilinear", True), ("trilinear", False)],
                                                [("nearest", True), ("trilinear", True)]))
@pytest.mark.parametrize("stride", pick([1, 2], [2]))
@pytest.mark.parametrize("route", [None, *POINT_VOXEL_ROUTES])
def test_point_voxel_map_and_devoxelize_parity(name, mode, normalize, stride, route):
    p, f = _pv_inputs(name, torch.float32)
    vs = 0.3

    def voxels(device: torch.device) -> SparseTensor:
        v = ops.voxelize(p.to(device), f.to(device), vs, "mean", route="reference" if device == CPU else None)
        if stride == 1:
            return v
        c = ops.downsample_coords(v.coords, 2, route="reference" if device == CPU else None)
        return SparseTensor(c, randn((c.shape[0], 6), torch.float32, 24).to(device), 2)

    v_cpu, v_cuda = voxels(CPU), voxels(DEV)
    runs_on = check_explain("point_voxel", "build_point_voxel_map", (p.to(DEV), v_cuda, mode), {},
                            {"forward": "build_map"}, "f32", "build_point_voxel_map", route)
    m_cuda = ops.build_point_voxel_map(p.to(DEV), v_cuda, mode, normalize, voxel_size=vs)
    runs_on.update(check_explain("point_voxel", "devoxelize", (v_cuda, m_cuda), {},
                                 {"forward": "forward", "backward": "backward"}, "f32", "devoxelize", route))
    assert all(r is not None for r in runs_on.values()), runs_on

    def run(device: torch.device, v: SparseTensor, rt: Optional[str]):
        m = ops.build_point_voxel_map(p.to(device), v, mode, normalize, voxel_size=vs, route=rt)
        fv = v.feats.detach().clone().requires_grad_(True)
        out = ops.devoxelize(v.replace_feats(fv), m, route=rt)
        gy = randn(tuple(out.shape), torch.float32, 25).to(device)
        (g,) = torch.autograd.grad(out, (fv,), gy) if out.numel() else (torch.zeros_like(fv),)
        return m, out, g

    m_ref, out_ref, g_ref = run(CPU, v_cpu, "reference")
    runs = [run(DEV, v_cuda, route) for _ in range(2)]
    m, out, g = runs[0]
    assert_equal(m.indices, m_ref.indices, f"{mode} map indices")
    assert_close(m.weights, m_ref.weights, "f32", f"{mode} map weights")
    assert_close(out, out_ref, "f32", f"devoxelize {mode} forward")
    assert_close(g, g_ref, "f32", f"devoxelize {mode} grad")
    ptr_a, ent_a = m.voxel_csr()
    ptr_r, ent_r = m_ref.voxel_csr()
    assert_equal(ptr_a, ptr_r, "voxel_csr ptr")
    assert_equal(ent_a, ent_r, "voxel_csr entries")
    assert_bitwise([runs[0][0].weights, runs[0][1], runs[0][2]], [runs[1][0].weights, runs[1][1], runs[1][2]],
                   "point_voxel")


# ---- feature ops (torch's kernels on the feature matrix) ------------------------------------------

FEATURE_CASES = ("linear", "relu", "leaky_relu", "gelu", "silu", "sigmoid", "tanh", "softplus", "batch_norm_train",
                 "batch_norm_eval", "layer_norm", "rms_norm", "cat")


@needs_gpu
@pytest.mark.parametrize("case", pick(FEATURE_CASES, ["linear", "batch_norm_train", "rms_norm"]))
@pytest.mark.parametrize("dtype_name", pick(["f32", "f16", "bf16"], ["f32"]))
def test_feature_ops_parity(case, dtype_name):
    dtype = DTYPES[dtype_name]
    c = coords_t("small")
    f = randn((c.shape[0], 16), dtype, 30)
    w = randn((24, 16), dtype, 31, 0.25)
    bias = randn((24,), dtype, 32)
    gamma, beta = randn((16,), dtype, 33), randn((16,), dtype, 34)

    def run(device: torch.device):
        ff = f.to(device).requires_grad_(True)
        x = SparseTensor(c.to(device), ff)
        d = lambda t: t.to(device)  # noqa: E731
        if case == "linear":
            y = ops.linear(x, d(w), d(bias))
        elif case == "batch_norm_train":
            # running statistics in the feature dtype (torch's CUDA batch norm takes one dtype or float params)
            y = ops.batch_norm(x, torch.zeros(16, dtype=dtype, device=device), torch.ones(16, dtype=dtype, device=device),
                               d(gamma), d(beta), True)
        elif case == "batch_norm_eval":
            y = ops.batch_norm(x, d(beta), d(gamma.abs() + 0.5), d(gamma), d(beta), False)
        elif case == "layer_norm":
            y = ops.layer_norm(x, d(gamma), d(beta))
        elif case == "rms_norm":
            y = ops.rms_norm(x, d(gamma))
        elif case == "cat":
            y = ops.cat([x, ops.relu(x)])
        else:
            y = getattr(ops, case)(x)
        assert y.key == x.key
        gy = randn(tuple(y.feats.shape), dtype, 35).to(device)
        (g,) = torch.autograd.grad(y.feats, (ff,), gy)
        return y.feats, g

    ref, ref_g = run(CPU)
    got, g = run(DEV)
    assert_close(got, ref, dtype_name, f"{case} forward")
    assert_close(g, ref_g, dtype_name, f"{case} grad")


# ---- end to end: a sparse U-Net on both devices ---------------------------------------------------


if not REDUCED:  # (not collected in reduced mode)
    @needs_gpu
    def test_minkunet_forward_backward_parity():
        """MinkUNet42 (lattice.bench) in float32 eval mode on a ~4k-row scan: logits and every parameter
        gradient against the same model on the CPU. Forty-odd layers compound rounding, so the bound is
        1e-4 (norm-wise and element-wise, not the single-op 1e-5)."""
        from lattice.bench.cases import MinkUNet42

        coords = torch.from_numpy(np.array(workloads.coords("lidar_tiny")))
        feats = randn((coords.shape[0], 4), torch.float32, 40)
        torch.manual_seed(0)
        model = MinkUNet42().eval()
        model_cuda = MinkUNet42().eval()
        model_cuda.load_state_dict(model.state_dict())
        model_cuda = model_cuda.to(DEV)
        labels = torch.randint(0, 19, (coords.shape[0],), generator=_gen(41))
        outs = []
        for m, dev in ((model, CPU), (model_cuda, DEV)):
            y = m(SparseTensor(coords.to(dev), feats.to(dev)))
            loss = torch.nn.functional.cross_entropy(y.feats, labels.to(dev))
            loss.backward()
            outs.append((y.feats, {n: p.grad for n, p in m.named_parameters()}))
        (ref, ref_g), (got, g) = outs
        assert_close(got, ref, "f32", "MinkUNet42 logits", rtol=1e-4)
        assert set(g) == set(ref_g)
        for n in ref_g:
            assert (g[n] is None) == (ref_g[n] is None), f"parameter gradient {n}: present on one device only"
            if ref_g[n] is not None:
                assert_close(g[n], ref_g[n], "f32", f"MinkUNet42 parameter gradient {n}", rtol=1e-4)
