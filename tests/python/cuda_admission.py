"""What the CUDA suites assert before they compare anything: the one skip rule, the admission
table, and the element-wise comparison (shared by test_cuda_parity.py, test_cuda_python.py and
test_cuda_quantized.py; the pure-Python parts are tested on the CPU in test_cuda_parity.py).

**The skip rule.** A CUDA test is skipped only when there is no GPU to run it on:
``torch.cuda.is_available()`` is False, or lattice was built without the CUDA backend
(``lattice.backend_info()`` says "CUDA backend not compiled"). The reason always starts with
"no GPU". Everything else -- lattice built with CUDA but seeing no device, an exception from
``lattice.explain``, a route that the table says is admitted but is not -- is a failure.

**The admission table.** For every op family with CUDA routes, every route that family's
explain() lists, every pass, dtype (``tf32`` = float32 with ``allow_tf32=True``), geometry class and
capability tier (``classic`` = any supported GPU, ``tensor_core`` = sm80+, ``hopper`` = sm90;
src/route/caps.cpp ``tier_for_sm``), the EXPECTED verdict for CUDA data: :data:`ADMITTED` or
``Rejected(substring of the reason)``. It is written by hand from the Constraints comments of the
kernel files (src/backend/cuda/*/*.cu) and the admit() functions of src/route/*_routes.cpp, so it
is an independent statement of what must be admitted: a regression in admission (a route that
stops being admitted, starts being admitted, changes its reason, or changes which route is
chosen) makes the tests fail instead of quietly skipping a comparison.

The table is written as a short list of rules per family (:data:`RULES`), each covering the
product of its route / passes / dtypes / geometry classes with one verdict per tier;
:data:`TABLE` expands them into one cell per (family, route, pass, dtype, geometry, tier), and a
CPU test checks that every cell of every family's product is defined exactly once. The route order
of :data:`ROUTES` is the order explain() lists its rows (rank, then table order) and so decides
which admitted route is chosen (:func:`expected_chosen`).

**The comparison.** :func:`compare` checks a CUDA result against the CPU ``reference`` route with
the SEMANTICS.md tolerance ``tol`` of the dtype (f32 1e-5, tf32 5e-4, f16 2e-3, bf16 1e-2, f64 1e-12)
twice: norm-wise ``||a - b|| <= tol * ||b||`` and element-wise ``|a - b| <= atol + tol * |b|`` for
every element, with ``atol = ELEMENT_ATOL_FACTOR * tol * rms(b)`` (SEMANTICS.md's "absolute floor
for tiny values": an element that cancels to near zero has an accumulation error relative to the
typical magnitude, not to itself). The factor 8 leaves the element-wise check silent for
independent rounding noise at the norm tolerance (the largest of 10^5 such errors is about 4.5
standard deviations) while a few wrong rows -- a partial tile at the end of a scan -- fail it even
when they move the norm by less than ``tol``. A failure names the worst row.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Optional, Union

import pytest
import torch

import lattice

# ---- the one skip rule ---------------------------------------------------------------------------

NO_GPU = "no GPU"


def gpu_skip_reason() -> Optional[str]:
    """``"no GPU (...)"`` when this machine cannot run CUDA tests, else None."""
    if not torch.cuda.is_available():
        return f"{NO_GPU} (torch.cuda.is_available() is False)"
    if "CUDA backend compiled" not in lattice.backend_info():
        return f"{NO_GPU} (lattice was built without the CUDA backend)"
    return None


def needs_gpu() -> pytest.MarkDecorator:
    """The skip marker of every CUDA test (the only skip the CUDA suites use)."""
    reason = gpu_skip_reason()
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def device_tier() -> str:
    """The capability tier lattice reports for cuda:0 (asserted to be a known tier)."""
    caps = lattice.device_caps()["cuda"]
    assert caps["built"] and caps["device_count"] >= 1, f"lattice sees no CUDA device: {caps}"
    assert caps["tier"] in TIERS, f"unknown tier {caps['tier']!r} for sm_{caps['sm']}"
    return caps["tier"]


# ---- the admission table -------------------------------------------------------------------------

ADMITTED = "admitted"


@dataclasses.dataclass(frozen=True)
class Rejected:
    """An expected rejection: ``reason`` is a substring of the route's verdict reason."""

    reason: str


Verdict = Union[str, Rejected]
TIERS = ("classic", "tensor_core", "hopper")
# sm versions that simulate each tier through core.explain_conv_problem (caps.cpp tier_for_sm)
SIMULATED_SM = {"classic": 75, "tensor_core": 86, "hopper": 90}

# family -> the routes explain() lists, in its row order (rank, then table order): the first
# admitted one is chosen.
ROUTES = {
    "conv": ("pointwise_matmul", "gather_gemm_scatter", "cuda_pointwise_matmul", "implicit_gemm_sm80",
             "cuda_gather_gemm_scatter", "reference"),
    "pool": ("cuda_csr_reduce", "input_exclusive", "csr_reduce", "reference"),
    "algebra": ("hashed", "cuda_hashed", "reference"),
    "coords": ("cuda", "reference"),
    "quantize": ("cuda", "reference"),
    "point_voxel": ("cuda", "parallel", "reference"),
    "quantized": ("cuda_decode_conv", "fused_dequant_gemm", "cuda_dequant_gemm", "dequant_reference"),
    "relation": ("cuda_hash", "cpu_hash"),
    "pool_edges": ("cuda", "reference"),
    "point_index": ("cuda", "reference"),
    "dequantize": ("cuda", "reference"),
    "batch_norm": ("cuda", "parallel", "reference"),
}
CPU_ROUTES = {
    "conv": ("pointwise_matmul", "gather_gemm_scatter", "reference"),
    "pool": ("input_exclusive", "csr_reduce", "reference"),
    "algebra": ("hashed", "reference"),
    "coords": ("reference",),
    "quantize": ("reference",),
    "point_voxel": ("parallel", "reference"),
    "quantized": ("fused_dequant_gemm",),
    "relation": ("cpu_hash",),
    "pool_edges": ("reference",),
    "point_index": ("reference",),
    "dequantize": ("reference",),
    "batch_norm": ("parallel", "reference"),
}

CONV_KINDS = ("submanifold", "forward", "target", "transposed", "transposed_target", "generative")
FLOATS = ("f32", "f16", "bf16", "f64")

# family -> (passes, dtypes per pass, geometry classes per pass)
AXES: dict[str, tuple[tuple[str, ...], Callable[[str], tuple[str, ...]], Callable[[str], tuple[str, ...]]]] = {
    # geometry: relation kind ("pointwise" = 1x1x1 identity relation) / channel alignment (both channel
    # counts times the element size multiples of 16 bytes: the 16-byte vector-copy path of
    # implicit_gemm_sm80, element loads otherwise)
    "conv": (("forward", "input_grad", "weight_grad"), lambda p: ("f32", "tf32", "f16", "bf16", "f64"),
             lambda p: tuple(f"{k}/{c}" for k in (*CONV_KINDS, "pointwise") for c in ("aligned", "unaligned"))),
    # geometry: the edge source (problem.h PoolEdges)
    "pool": (("forward", "input_grad"), lambda p: FLOATS,
             lambda p: ("forward", "target", "transposed", "transposed_target", "batch", "trilinear")),
    # align / lookup read int32 coordinates; geometry: the join (align), "-" (lookup), whether the
    # operands share one coordinate key (combine passes); every set below 2^30 rows
    "algebra": (("align", "lookup", "forward", "backward"),
                lambda p: ("i32",) if p in ("align", "lookup") else FLOATS,
                lambda p: {"align": ("inner", "left", "right", "outer"), "lookup": ("-",)}.get(p, ("aligned", "same_key"))),
    # coordinate utilities: one pass per op, below 2^30 rows
    "coords": (("downsample", "morton_codes", "morton_order", "prune", "crop", "collate", "dense", "from_dense"),
               lambda p: ("i32",), lambda p: ("-",)),
    # point dtype
    "quantize": (("forward",), lambda p: ("f32", "f64", "f16"), lambda p: ("-",)),
    # geometry: the op; build_map reads the points (dtype = point dtype)
    "point_voxel": (("forward", "backward", "build_map"), lambda p: FLOATS,
                    lambda p: ("build_point_voxel_map",) if p == "build_map" else ("voxelize", "devoxelize")),
    # packed int4 / int8 weights, forward only; geometry: linear or the relation kind
    "quantized": (("forward",), lambda p: FLOATS, lambda p: ("linear", *CONV_KINDS)),
    # the coordinate index (pass index) and relation building (pass build, by relation kind)
    "relation": (("index", "build"), lambda p: ("i32",), lambda p: CONV_KINDS if p == "build" else ("-",)),
    # edge lists of global pooling (batch) and trilinear_upsample3d (trilinear)
    "pool_edges": (("batch", "trilinear"), lambda p: ("i32",), lambda p: ("-",)),
    # batch id checks and the CSR of points per voxel
    "point_index": (("batch_ids", "group"), lambda p: ("i32",), lambda p: ("-",)),
    # the whole-weight decoder, by output dtype
    "dequantize": (("forward",), lambda p: FLOATS, lambda p: ("-",)),
    # batch norm (+ fused ReLU) of the feature matrix; geometry: training or eval
    "batch_norm": (("forward", "backward"), lambda p: FLOATS, lambda p: ("training", "eval")),
}

ALL = None  # a rule field that covers every value of its axis


def _every_tier(v: Verdict) -> dict[str, Verdict]:
    return {t: v for t in TIERS}


_ON_CPU = Rejected("runs on cpu; the data is on cuda:0")
_TC = Rejected("needs GPU tier tensor_core or above, device has classic")
# conv geometries of the 1x1x1 identity relation, and of the kernel-27 relations that move rows
_POINTWISE = tuple(f"pointwise/{c}" for c in ("aligned", "unaligned"))
_MOVES_ROWS = tuple(f"{k}/{c}" for k in CONV_KINDS for c in ("aligned", "unaligned"))

# family -> [(route, passes, dtypes, geometries, {tier: verdict})]
RULES: dict[str, list[tuple[str, Any, Any, Any, dict[str, Verdict]]]] = {
    "conv": [
        # implicit_gemm_sm80.cu: tier tensor_core+, f16 / bf16, f32 only with allow_tf32, any geometry
        ("implicit_gemm_sm80", ALL, ("f16", "bf16", "tf32"), ALL,
         {"classic": _TC, "tensor_core": ADMITTED, "hopper": ADMITTED}),
        ("implicit_gemm_sm80", ALL, ("f32",), ALL, _every_tier(Rejected("float32 needs allow_tf32=True"))),
        ("implicit_gemm_sm80", ALL, ("f64",), ALL,
         _every_tier(Rejected("needs float16 or bfloat16 (or float32 with allow_tf32), got float64"))),
        # pointwise_matmul.cu: any tier, f16 / bf16 / f32 (tf32 or not), the 1x1x1 identity relation only
        ("cuda_pointwise_matmul", ALL, ("f32", "tf32", "f16", "bf16"), _POINTWISE, _every_tier(ADMITTED)),
        ("cuda_pointwise_matmul", ALL, ("f32", "tf32", "f16", "bf16"), _MOVES_ROWS,
         _every_tier(Rejected("needs kernel volume 1, got "))),
        ("cuda_pointwise_matmul", ALL, ("f64",), ALL,
         _every_tier(Rejected("float64 convolutions run on cpu), got float64"))),
        # gather_gemm_scatter.cu: any tier, f16 / bf16 / f32 (tf32 or not), any geometry
        ("cuda_gather_gemm_scatter", ALL, ("f32", "tf32", "f16", "bf16"), ALL, _every_tier(ADMITTED)),
        ("cuda_gather_gemm_scatter", ALL, ("f64",), ALL,
         _every_tier(Rejected("float64 convolutions run on cpu), got float64"))),
        *[(r, ALL, ALL, ALL, _every_tier(_ON_CPU)) for r in CPU_ROUTES["conv"]],
    ],
    "pool": [
        # csr_reduce.cu: every mode, edge source and pass, any float dtype, any tier
        ("cuda_csr_reduce", ALL, ALL, ALL, _every_tier(ADMITTED)),
        *[(r, ALL, ALL, ALL, _every_tier(_ON_CPU)) for r in CPU_ROUTES["pool"]],
    ],
    "algebra": [
        ("cuda_hashed", ALL, ALL, ALL, _every_tier(ADMITTED)),
        *[(r, ALL, ALL, ALL, _every_tier(_ON_CPU)) for r in CPU_ROUTES["algebra"]],
    ],
    "coords": [
        ("cuda", ALL, ALL, ALL, _every_tier(ADMITTED)),
        ("reference", ALL, ALL, ALL, _every_tier(_ON_CPU)),
    ],
    "quantize": [
        # quantize.cu: float32 / float64 points
        ("cuda", ALL, ("f32", "f64"), ALL, _every_tier(ADMITTED)),
        ("cuda", ALL, ("f16",), ALL, _every_tier(Rejected("needs float32 or float64 points, got float16"))),
        ("reference", ALL, ALL, ALL, _every_tier(_ON_CPU)),
    ],
    "point_voxel": [
        # point_voxel.cu: every pass; features of any float dtype, float32 / float64 points for the map
        ("cuda", ("forward", "backward"), ALL, ALL, _every_tier(ADMITTED)),
        ("cuda", ("build_map",), ("f32", "f64"), ALL, _every_tier(ADMITTED)),
        ("cuda", ("build_map",), ("f16", "bf16"), ALL, _every_tier(Rejected("needs float32 or float64 points"))),
        *[(r, ALL, ALL, ALL, _every_tier(_ON_CPU)) for r in CPU_ROUTES["point_voxel"]],
    ],
    "quantized": [
        # decode_conv.cpp: f32 / f16 / bf16 activations (the device decode, then the float route)
        ("cuda_decode_conv", ALL, ("f32", "f16", "bf16"), ALL, _every_tier(ADMITTED)),
        ("cuda_decode_conv", ALL, ("f64",), ALL,
         _every_tier(Rejected("needs float32, float16 or bfloat16 activations, got float64"))),
        # dequant_gemm.cu: f32 / f16 / bf16 activations
        ("cuda_dequant_gemm", ALL, ("f32", "f16", "bf16"), ALL, _every_tier(ADMITTED)),
        ("cuda_dequant_gemm", ALL, ("f64",), ALL,
         _every_tier(Rejected("needs float32, float16 or bfloat16 activations, got float64"))),
        ("fused_dequant_gemm", ALL, ALL, ALL, _every_tier(_ON_CPU)),
        # dequant_reference.cu: device decode, then the float CUDA conv route (f32 / f16 / bf16)
        ("dequant_reference", ALL, ("f32", "f16", "bf16"), ALL, _every_tier(ADMITTED)),
        ("dequant_reference", ALL, ("f64",), ALL, _every_tier(Rejected("(float64 runs on cpu), got float64"))),
    ],
    "relation": [
        # relation/hash.cu: every pass, relation kind and tier
        ("cuda_hash", ALL, ALL, ALL, _every_tier(ADMITTED)),
        ("cpu_hash", ALL, ALL, ALL, _every_tier(_ON_CPU)),
    ],
    "pool_edges": [
        ("cuda", ALL, ALL, ALL, _every_tier(ADMITTED)),
        ("reference", ALL, ALL, ALL, _every_tier(_ON_CPU)),
    ],
    "point_index": [
        ("cuda", ALL, ALL, ALL, _every_tier(ADMITTED)),
        ("reference", ALL, ALL, ALL, _every_tier(_ON_CPU)),
    ],
    "dequantize": [
        ("cuda", ALL, ALL, ALL, _every_tier(ADMITTED)),
        ("reference", ALL, ALL, ALL, _every_tier(_ON_CPU)),
    ],
    "batch_norm": [
        # batch_norm/blocked.cu: every float dtype, pass and mode, any shape, any tier
        ("cuda", ALL, ALL, ALL, _every_tier(ADMITTED)),
        *[(r, ALL, ALL, ALL, _every_tier(_ON_CPU)) for r in CPU_ROUTES["batch_norm"]],
    ],
}

Cell = tuple[str, str, str, str, str, str]  # (family, route, pass, dtype, geometry, tier)


def cells(family: str) -> Iterable[tuple[str, str, str, str]]:
    """Every (route, pass, dtype, geometry) of a family's product (the table defines each one)."""
    passes, dtypes, geometries = AXES[family]
    for route in ROUTES[family]:
        for p in passes:
            for d in dtypes(p):
                for g in geometries(p):
                    yield route, p, d, g


def _expand() -> tuple[dict[Cell, Verdict], list[str]]:
    table: dict[Cell, Verdict] = {}
    problems: list[str] = []
    for family, rules in RULES.items():
        passes, dtypes, geometries = AXES[family]
        for route, r_passes, r_dtypes, r_geoms, by_tier in rules:
            if route not in ROUTES[family]:
                problems.append(f"{family}: rule for unknown route {route!r}")
            if set(by_tier) != set(TIERS):
                problems.append(f"{family}/{route}: tiers {sorted(by_tier)} != {sorted(TIERS)}")
            for p in passes if r_passes is ALL else r_passes:
                for d in dtypes(p) if r_dtypes is ALL else r_dtypes:
                    if d not in dtypes(p):
                        continue  # a dtype this pass does not take
                    for g in geometries(p) if r_geoms is ALL else r_geoms:
                        for t in TIERS:
                            key = (family, route, p, d, g, t)
                            if key in table:
                                problems.append(f"cell {key} defined twice")
                            table[key] = by_tier[t]
    for family in RULES:
        for route, p, d, g in cells(family):
            for t in TIERS:
                if (family, route, p, d, g, t) not in table:
                    problems.append(f"cell {(family, route, p, d, g, t)} not defined")
    return table, problems


TABLE, TABLE_PROBLEMS = _expand()


def verdict(family: str, route: str, pass_: str, dtype: str, geometry: str, tier: str) -> Verdict:
    """The table's expected verdict; a cell the table does not define is an error (a test case
    outside the table is a defect of the suite, not a skip)."""
    key = (family, route, pass_, dtype, geometry, tier)
    try:
        return TABLE[key]
    except KeyError:
        raise AssertionError(f"the admission table has no cell {key}; add it to cuda_admission.RULES") from None


def expected_chosen(family: str, pass_: str, dtype: str, geometry: str, tier: str) -> Optional[str]:
    """The route explain() must choose: the first admitted one in row order (None: none admitted)."""
    for route in ROUTES[family]:
        if verdict(family, route, pass_, dtype, geometry, tier) == ADMITTED:
            return route
    return None


def is_admitted(family: str, route: str, pass_: str, dtype: str, geometry: str, tier: str) -> bool:
    return verdict(family, route, pass_, dtype, geometry, tier) == ADMITTED


def table_size() -> dict[str, int]:
    """Cells per family (each a (route, pass, dtype, geometry, tier) verdict)."""
    out: dict[str, int] = {}
    for (family, *_rest) in TABLE:
        out[family] = out.get(family, 0) + 1
    return out


def dtype_key(dtype: torch.dtype, allow_tf32: bool = False) -> str:
    """The table's dtype name of a torch dtype (float32 with allow_tf32 -> "tf32")."""
    names = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
             torch.int32: "i32"}
    name = names[dtype]
    return "tf32" if allow_tf32 and name == "f32" else name


def conv_geometry(kind: str, kernel_volume: int, c_in: int, c_out: int, itemsize: int) -> str:
    """The conv geometry class of a call: relation kind (or "pointwise" for a 1x1x1 submanifold
    conv, whose relation is the identity) and whether both channel counts are 16-byte multiples."""
    base = "pointwise" if kind == "submanifold" and kernel_volume == 1 else kind
    aligned = (c_in * itemsize) % 16 == 0 and (c_out * itemsize) % 16 == 0
    return f"{base}/{'aligned' if aligned else 'unaligned'}"


def _describe(e: Any) -> str:
    return str(e)


def assert_explanation(e: Any, family: str, pass_: str, dtype: str, geometry: str, tier: str) -> Optional[str]:
    """explain()'s rows equal the table for this cell: the routes listed (in order), every verdict
    (a rejection's reason contains the table's substring) and the chosen route. Returns the chosen
    route (None when the table says nothing is admitted)."""
    where = f"{family} {pass_} {dtype} {geometry} on tier {tier}"
    routes = [r["route"] for r in e.rows]
    assert routes == list(ROUTES[family]), f"{where}: explain lists routes {routes}, table {list(ROUTES[family])}\n{_describe(e)}"
    for row in e.rows:
        want = verdict(family, row["route"], pass_, dtype, geometry, tier)
        if want == ADMITTED:
            assert row["admitted"], (f"{where}: {row['route']} must be admitted, explain rejects it: "
                                     f"{row['reason']}\n{_describe(e)}")
        else:
            assert not row["admitted"], f"{where}: {row['route']} must be rejected ({want.reason!r}), explain admits it\n{_describe(e)}"
            assert want.reason in row["reason"], (f"{where}: {row['route']} rejected with {row['reason']!r}, "
                                                  f"expected a reason containing {want.reason!r}")
    chosen = expected_chosen(family, pass_, dtype, geometry, tier)
    assert e.chosen == chosen, f"{where}: explain chose {e.chosen!r}, the table says {chosen!r}\n{_describe(e)}"
    return chosen


def assert_forced_explanation(e: Any, route: str, want: Verdict) -> None:
    """explain() with ``route=`` forced: chosen is the route when admitted, else None with the
    rejection as ``forced_reason``."""
    assert e.forced == route, f"forced {route!r}, explain says forced {e.forced!r}\n{e}"
    if want == ADMITTED:
        assert e.chosen == route, f"forced {route!r} must run, explain: {e.forced_reason}\n{e}"
    else:
        assert e.chosen is None, f"forced {route!r} must be rejected ({want.reason!r}), explain chose {e.chosen!r}\n{e}"
        assert want.reason in e.forced_reason, f"forced {route!r}: reason {e.forced_reason!r}, expected {want.reason!r}"


def assert_forced_call_raises(call: Callable[[], Any], op: str, route: str, want: Rejected) -> None:
    """Forcing a rejected route raises the documented ValueError (src/ops/common.cpp
    chosen_or_throw): ``[op] route: expected an admitted route, got 'route' (rejected: reason)``."""
    with pytest.raises(ValueError) as info:
        call()
    msg = str(info.value)
    prefix = f"[{op}] route: expected an admitted route, got '{route}' (rejected: "
    assert msg.startswith(prefix), f"forcing {route!r}: {msg!r} does not start with {prefix!r}"
    assert want.reason in msg, f"forcing {route!r}: {msg!r} does not give the reason {want.reason!r}"


def assert_no_route_raises(call: Callable[[], Any], op: str) -> None:
    """A call that no route admits raises UnsupportedError ``[op] no route admitted this problem``."""
    with pytest.raises(lattice.UnsupportedError, match=rf"^\[{op}\] no route admitted this problem"):
        call()


# ---- comparisons ---------------------------------------------------------------------------------

TOLERANCES = {"f64": 1e-12, "f32": 1e-5, "tf32": 5e-4, "f16": 2e-3, "bf16": 1e-2}  # SEMANTICS.md
ELEMENT_ATOL_FACTOR = 8.0
# tf32 rounds both GEMM operands to 10-bit mantissas (unit roundoff 2^-11 each): an element of a
# weight gradient that sums L products carries an error of about sqrt(2 L) * 2^-11 * |term| against
# an rms of about sqrt(L) * |term|, i.e. sigma ~ 1.4 * tol * rms, and the worst of ~1e5 elements sits
# at 4-8 sigma. Measured on the H200 (2026-12-01, subm3 tile_plus1/minus1, C=40->70 and 32->72): worst
# 11.3 * tol * rms. 24 is twice that; a wrong row (error ~ rms) is still ~80x over the bound.
ELEMENT_ATOL_FACTORS = {"tf32": 24.0}


def tolerance(tol_name: str) -> float:
    try:
        return TOLERANCES[tol_name]
    except KeyError:
        raise ValueError(f"unknown tolerance name {tol_name!r}; expected one of {sorted(TOLERANCES)}") from None


def rel_err(actual: torch.Tensor, ref: torch.Tensor) -> float:
    """||a - b|| / ||b|| over the finite reference elements (||a - b|| when ||b|| = 0)."""
    a = actual.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    if a.numel() == 0:
        return 0.0
    fin = torch.isfinite(r)
    num = float((a[fin] - r[fin]).norm())
    den = float(r[fin].norm())
    return num / den if den > 0 else num


def compare(actual: torch.Tensor, ref: torch.Tensor, tol_name: str, rtol: Optional[float] = None) -> list[str]:
    """Everything wrong with ``actual`` against ``ref`` (same shape; any devices), empty if nothing:
    non-finite positions and values, the norm-wise bound and the element-wise bound (module doc)."""
    tol = tolerance(tol_name) if rtol is None else float(rtol)
    a = actual.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    if tuple(a.shape) != tuple(r.shape):
        return [f"shape {tuple(a.shape)} vs {tuple(r.shape)}"]
    if r.numel() == 0:
        return []
    problems = []
    fa, fr = torch.isfinite(a), torch.isfinite(r)
    if not torch.equal(fa, fr):
        bad = (fa != fr).reshape(r.shape[0], -1).any(1) if r.dim() else (fa != fr).reshape(1)
        problems.append(f"non-finite positions differ in {int(bad.sum())} rows (first row {int(bad.nonzero()[0, 0])})")
        return problems
    if (~fr).any() and not torch.equal(a[~fr].nan_to_num(1.0, 2.0, -2.0), r[~fr].nan_to_num(1.0, 2.0, -2.0)):
        problems.append("non-finite values differ")
    err = rel_err(a, r)
    if err > tol:
        problems.append(f"||a - b|| / ||b|| = {err:.3e} > {tol:g} ({tol_name})")
    a0, r0 = torch.where(fr, a, 0.0), torch.where(fr, r, 0.0)
    rms = float(r0[fr].square().mean().sqrt()) if fr.any() else 0.0
    atol = ELEMENT_ATOL_FACTORS.get(tol_name, ELEMENT_ATOL_FACTOR) * tol * rms if rms > 0 else tol
    diff = (a0 - r0).abs()
    allowed = atol + tol * r0.abs()
    ratio = diff / allowed
    worst = int(ratio.reshape(-1).argmax())
    if float(ratio.reshape(-1)[worst]) > 1.0:
        n_rows = r.shape[0] if r.dim() else 1
        per_row = r.numel() // max(1, n_rows)
        bad = ratio > 1.0
        bad_rows = bad.reshape(n_rows, -1).any(1)
        row, col = divmod(worst, max(1, per_row))
        first_bad, last_bad = int(bad_rows.nonzero()[0, 0]), int(bad_rows.nonzero()[-1, 0])
        problems.append(
            f"{int(bad.sum())} of {r.numel()} elements in {int(bad_rows.sum())} of {n_rows} rows exceed "
            f"|a - b| <= {atol:.3e} + {tol:g}*|b| (rows {first_bad}..{last_bad}); worst row {row}, column {col}: "
            f"a={float(a.reshape(-1)[worst])!r} b={float(r.reshape(-1)[worst])!r} |a-b|={float(diff.reshape(-1)[worst]):.3e}"
        )
    return problems


# Partial tiles: row counts just past and just short of a multiple of the 128-row tiles of
# implicit_gemm_sm80 (also 1 and 63 past a multiple of dequant_gemm's 64-row tiles).
TILE_ROWS = 128
PARTIAL_TILE_NS = (TILE_ROWS * 8 + 1, TILE_ROWS * 8 + 127)

