"""Issue 18 item 2: a property-based sweep of the public ops over the classes of bad input that
used to give silent wrong answers (docs/input_rules.md).

Generated inputs: duplicate rows, negative and huge coordinates (int32 extremes, and int64 values
beyond int32), negative batch ids, empty tensors, float / int64 coordinate dtypes, mismatched
feature dtypes, row and channel counts, non-contiguous (strided, column-major) coordinates and
features, NaN and inf features or points.

The property, for every generated call (``check`` below):

1. the call either raises ValueError / TypeError / lattice.UnsupportedError whose message has the
   documented form ``[op] argument: expected ..., got ...``, or returns a result;
2. the inputs are unchanged by the call (bytes, shape, dtype and strides);
3. the contract decides which of the two it must be: an input the contract rejects (the oracle
   wrapper raises ``Rejected``: duplicates where rows must be unique, a negative batch id where
   batch ids are read, a value outside int32, shapes, dtypes) must raise; any other input must
   return a result equal to the float64 oracle of tests/oracle (exact for coordinates, the
   SEMANTICS.md tolerance of the storage dtype for features; NaN/inf in the same places);
4. a returned result owns its values: writing into the caller's float inputs (features, points)
   after the call leaves it unchanged.

Hypothesis runs derandomized with a fixed example budget per op and no example database, so the
examples are the same on every run and machine and the file takes a few seconds.
"""
from __future__ import annotations

import collections
import re
from typing import Any, Callable, Optional

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lattice
import oracle
from lattice import ops
from oracle import algebra as algebra_oracle
from oracle import pool as pool_oracle
from oracle.quantize import sparse_quantize as quantize_oracle

SWEEP = settings(max_examples=120, derandomize=True, database=None, deadline=None, print_blob=False,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.filter_too_much])

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
ERROR_FORM = re.compile(r"^\[(?P<op>[A-Za-z_][\w.]*)\] (?P<arg>[^:\n]+?): expected .+, got .*$", re.S)
ERRORS = (ValueError, TypeError, lattice.UnsupportedError)
DTYPE_NAME = {torch.float64: "f64", torch.float32: "f32"}


OUTCOMES: collections.defaultdict = collections.defaultdict(set)  # op name -> {"ok", "error"} seen


class Rejected(Exception):
    """The contract rejects this input (raised by the oracle wrappers below)."""


# ---- strategies ---------------------------------------------------------------------------------

HUGE = [I32_MIN, I32_MIN + 1, -1, 0, 1, I32_MAX - 1, I32_MAX]


@st.composite
def coords(draw, max_n: int = 9, width: int = 4, batches: int = 3) -> torch.Tensor:
    """(N, width) coordinate tensors: small / negative / int32-extreme values, repeats, negative
    batch ids, int64 values beyond int32, float dtype, strided or column-major layout."""
    n = draw(st.integers(0, max_n))
    kind = draw(st.sampled_from(["small", "small", "negative", "huge"]))
    value = {"small": st.integers(0, 4), "negative": st.integers(-5, 5), "huge": st.sampled_from(HUGE)}[kind]
    batch = st.integers(0, batches - 1) if draw(st.integers(0, 4)) else st.integers(-2, batches - 1)
    rows = [([draw(batch)] if width == 4 else []) + [draw(value) for _ in range(3)] for _ in range(n)]
    if rows and draw(st.integers(0, 3)) == 0:  # a repeated row
        rows.insert(draw(st.integers(0, len(rows))), list(rows[draw(st.integers(0, len(rows) - 1))]))
    dtype = draw(st.sampled_from([torch.int32, torch.int32, torch.int32, torch.int64, torch.float32]))
    t = torch.tensor(rows, dtype=torch.int64).reshape(-1, width)
    if dtype == torch.int64 and n and draw(st.integers(0, 3)) == 0:  # beyond int32
        t[draw(st.integers(0, t.shape[0] - 1)), width - 1] = draw(st.sampled_from([2**31, -(2**31) - 1, 2**40]))
    t = t.to(dtype) if dtype != torch.int64 else t
    return _layout(draw, t)


def _layout(draw, t: torch.Tensor) -> torch.Tensor:
    layout = draw(st.sampled_from(["contiguous", "contiguous", "strided", "column_major"]))
    if layout == "strided":  # every other column of a wider tensor
        wide = torch.zeros(t.shape[0], 2 * t.shape[1], dtype=t.dtype)
        wide[:, ::2] = t
        return wide[:, ::2]
    if layout == "column_major":
        return t.t().contiguous().t()
    return t


@st.composite
def feats(draw, n: int, c: int) -> torch.Tensor:
    """(n', c') features: f64 or f32 (sometimes int64), sometimes one row or channel off, NaN / inf
    in some entries, sometimes non-contiguous."""
    dtype = draw(st.sampled_from([torch.float64, torch.float64, torch.float32, torch.int64]))
    rows = n + draw(st.sampled_from([0, 0, 0, 0, 0, 1, -1])) if n else n + draw(st.sampled_from([0, 0, 1]))
    cols = c + draw(st.sampled_from([0, 0, 0, 0, 1]))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(max(rows, 0), cols, generator=g, dtype=torch.float64)
    if f.numel() and draw(st.integers(0, 4)) == 0:
        f.view(-1)[draw(st.integers(0, f.numel() - 1))] = draw(st.sampled_from([float("nan"), float("inf"), -float("inf")]))
    f = f.to(dtype) if dtype != torch.int64 else (f.nan_to_num(0, 0, 0) * 3).to(torch.int64)
    return _layout(draw, f)


# ---- the property -------------------------------------------------------------------------------


def _snapshot(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        return (t.dtype, tuple(t.shape), t.stride(), t.detach().clone())
    return t


def _unchanged(t: Any, snap: Any) -> bool:
    if isinstance(t, torch.Tensor):
        dtype, shape, stride, copy = snap
        same = t.dtype == dtype and tuple(t.shape) == shape and t.stride() == stride
        return same and bool(torch.equal(_bits(t.detach()), _bits(copy)))
    return True


def _bits(t: torch.Tensor) -> torch.Tensor:
    """An integer view of the bytes (NaN == NaN bitwise)."""
    c = t.contiguous()
    return c.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[c.element_size()])


def check(name: str, inputs: list, call: Callable[[], Any], want: Callable[[], Any],
          compare: Callable[[Any, Any], None]) -> Optional[str]:
    """The sweep's property (module docstring). Returns "error" / "ok" for the statistics."""
    snaps = [_snapshot(t) for t in inputs]
    error: Optional[BaseException] = None
    try:
        got = call()
    except ERRORS as e:
        error = e
        assert ERROR_FORM.match(str(e)), f"{name}: {type(e).__name__} not of the form '[op] argument: expected ..., got ...': {e}"
    for i, (t, s) in enumerate(zip(inputs, snaps)):
        assert _unchanged(t, s), f"{name}: input {i} was modified by the call"
    try:
        expected = want()
    except Rejected as r:
        assert error is not None, f"{name}: returned a result for an input the contract rejects ({r})"
        OUTCOMES[name].add("error")
        return "error"
    assert error is None, f"{name}: raised for an input the contract accepts: {error}"
    compare(got, expected)
    # Inputs mutated after the call: the result owns its values (writing into the caller's
    # feature or point tensors afterwards does not change it).
    outputs = [t for t in _tensors(got)]
    kept = [_snapshot(t) for t in outputs]
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.numel():
            t.add_(1.0)
    for i, (t, snap) in enumerate(zip(outputs, kept)):
        assert _unchanged(t, snap), f"{name}: output {i} changed when an input was written after the call"
    OUTCOMES[name].add("ok")
    return "ok"


def _tensors(result: Any) -> list:
    """The tensors of an op's result (a SparseTensor's coordinates and features, tuple items)."""
    if isinstance(result, lattice.SparseTensor):
        return [result.coords, result.feats]
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in _tensors(r)]
    return [result] if isinstance(result, torch.Tensor) else []


# ---- oracle-side contract checks ----------------------------------------------------------------


def _np_coords(c: torch.Tensor, width: int = 4) -> np.ndarray:
    if c.dtype.is_floating_point:
        raise Rejected("float coordinates")
    a = c.numpy().astype(np.int64)
    if a.size and (a.min() < I32_MIN or a.max() > I32_MAX):
        raise Rejected("a coordinate outside int32")
    return a.reshape(-1, width)


def _np_feats(f: torch.Tensor, n: int, c: Optional[int] = None) -> np.ndarray:
    if not f.dtype.is_floating_point:
        raise Rejected("integer features")
    if f.dim() != 2 or f.shape[0] != n:
        raise Rejected("feature rows != coordinate rows")
    if c is not None and f.shape[1] != c:
        raise Rejected("channel count")
    return f.numpy().astype(np.float64)


def _unique(a: np.ndarray) -> None:
    if len({tuple(r) for r in a.tolist()}) != a.shape[0]:
        raise Rejected("repeated rows")


def _batch_ids(a: np.ndarray) -> None:
    if a.shape[0] and a[:, 0].min() < 0:
        raise Rejected("negative batch id")


def _fits_int32(a: np.ndarray) -> None:
    if a.size and (a.min() < I32_MIN or a.max() > I32_MAX):
        raise Rejected("an output coordinate outside int32")


def _same(got_coords: torch.Tensor, want_coords: np.ndarray) -> None:
    np.testing.assert_array_equal(got_coords.numpy().astype(np.int64), np.asarray(want_coords, np.int64).reshape(-1, 4))


def _close(got: torch.Tensor, want: np.ndarray, dtype: torch.dtype, what: str) -> None:
    oracle.assert_close(got.detach(), want, DTYPE_NAME[dtype], what)


# ---- convolution --------------------------------------------------------------------------------


@SWEEP
@given(st.data())
def _prop_subm_conv3d(data):
    c = data.draw(coords())
    f = data.draw(feats(c.shape[0], 2))
    w = torch.randn(27, 2, 3, dtype=f.dtype if f.dtype.is_floating_point else torch.float64,
                    generator=torch.Generator().manual_seed(1))

    def call():
        return ops.subm_conv3d(lattice.SparseTensor(c, f), w, kernel_size=3)

    def want():
        a = _np_coords(c)
        x = _np_feats(f, a.shape[0], 2)
        if f.dtype != w.dtype:
            raise Rejected("weight dtype")
        _unique(a)
        rel = oracle.subm_relation(a, 3, 1)
        return oracle.conv_forward(x, w.numpy(), rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out)

    check("subm_conv3d", [c, f, w], call, want, lambda y, e: _close(y.feats, e, f.dtype, "subm_conv3d"))


@SWEEP
@given(st.data())
def _prop_strided_conv3d(data):
    c = data.draw(coords())
    f = data.draw(feats(c.shape[0], 2))
    w = torch.randn(8, 2, 2, dtype=f.dtype if f.dtype.is_floating_point else torch.float64,
                    generator=torch.Generator().manual_seed(2))

    def call():
        return ops.conv3d(lattice.SparseTensor(c, f), w, kernel_size=2, stride=2)

    def want():
        a = _np_coords(c)
        x = _np_feats(f, a.shape[0], 2)
        if f.dtype != w.dtype:
            raise Rejected("weight dtype")
        _unique(a)
        rel = oracle.forward_relation(a, 2, 2, 0, 1, False)
        return rel.out_coords, oracle.conv_forward(x, w.numpy(), rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out)

    def compare(y, e):
        _same(y.coords, e[0])
        _close(y.feats, e[1], f.dtype, "conv3d")

    check("conv3d", [c, f, w], call, want, compare)


@SWEEP
@given(st.data())
def _prop_conv_transpose3d(data):
    """Generated output rows ``c*2 + k``: inputs near the int32 limit must raise, never wrap."""
    c = data.draw(coords())
    f = data.draw(feats(c.shape[0], 2))
    w = torch.randn(8, 2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def call():
        return ops.conv_transpose3d(lattice.SparseTensor(c, f, stride=2), w, kernel_size=2, stride=2)

    def want():
        a = _np_coords(c)
        x = _np_feats(f, a.shape[0], 2)
        if f.dtype != w.dtype:
            raise Rejected("weight dtype")
        _unique(a)
        rel = oracle.transposed_relation(a, 2, 2, 0, 1)
        _fits_int32(rel.out_coords)
        return rel.out_coords, oracle.conv_forward(x, w.numpy(), rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out)

    def compare(y, e):
        _same(y.coords, e[0])
        _close(y.feats, e[1], f.dtype, "conv_transpose3d")

    check("conv_transpose3d", [c, f, w], call, want, compare)


# ---- pooling ------------------------------------------------------------------------------------


@SWEEP
@given(st.data(), st.sampled_from(["sum", "avg", "max"]))
def _prop_global_pool(data, mode):
    c = data.draw(coords())
    f = data.draw(feats(c.shape[0], 2))
    op = f"global_{mode}_pool"

    def want():
        a = _np_coords(c)
        x = _np_feats(f, a.shape[0])
        _unique(a)
        _batch_ids(a)
        try:
            return pool_oracle.global_pool(a, x, mode)[0]
        except ValueError as e:  # max of an empty batch
            raise Rejected(str(e)) from None

    check(op, [c, f], lambda: getattr(ops, op)(lattice.SparseTensor(c, f)), want,
          lambda y, e: _close(y, e, f.dtype, op))


@SWEEP
@given(st.data(), st.sampled_from(["sum", "avg", "max"]))
def _prop_local_pool(data, mode):
    c = data.draw(coords())
    f = data.draw(feats(c.shape[0], 2))
    op = f"{mode}_pool3d"

    def want():
        a = _np_coords(c)
        x = _np_feats(f, a.shape[0])
        _unique(a)
        out, y, _, _ = pool_oracle.local_pool(a, x, 2, 2, 0, 1, mode)
        return out, y

    def compare(y, e):
        _same(y.coords, e[0])
        _close(y.feats, e[1], f.dtype, op)

    check(op, [c, f], lambda: getattr(ops, op)(lattice.SparseTensor(c, f), 2, 2), want, compare)


# ---- dense, collate, coordinate utilities, algebra -----------------------------------------------


@SWEEP
@given(st.data())
def _prop_dense(data):
    c = data.draw(coords())
    f = data.draw(feats(c.shape[0], 1))

    def want():
        a = _np_coords(c)
        x = _np_feats(f, a.shape[0])
        _unique(a)
        _batch_ids(a)
        if a.shape[0] == 0:
            return np.zeros((0, x.shape[1], 0, 0, 0))
        if a[:, 1:].min() < 0:
            raise Rejected("a coordinate below the default origin 0")
        shape = tuple(int(v) + 1 for v in a[:, 1:].max(0))
        b = int(a[:, 0].max()) + 1
        if b * x.shape[1] * shape[0] * shape[1] * shape[2] > 2**26:
            raise Rejected("a grid above 2^26 elements")
        return algebra_oracle.to_dense(a, x, b, shape)

    check("dense", [c, f], lambda: lattice.SparseTensor(c, f).dense(), want,
          lambda y, e: _close(y, e, f.dtype, "dense") if e.size else None)


@SWEEP
@given(st.data())
def _prop_sparse_collate(data):
    k = data.draw(st.integers(1, 3))
    samples = []
    for _ in range(k):
        c = data.draw(coords(max_n=5, width=3))
        samples.append((c, data.draw(feats(c.shape[0], 2))))
    flat = [t for s in samples for t in s]

    def want():
        np_samples = []
        for c, f in samples:
            a = _np_coords(c, 3)
            x = _np_feats(f, a.shape[0])
            _unique(a)
            np_samples.append((a, x))
        if len({x.shape[1] for _, x in np_samples}) > 1 or len({f.dtype for _, f in samples}) > 1:
            raise Rejected("samples with different channel counts or dtypes")
        return algebra_oracle.collate(np_samples)

    def compare(y, e):
        _same(y.coords, e[0])
        _close(y.feats, e[1], samples[0][1].dtype, "sparse_collate")
        assert y.batch_counts == e[2]

    check("sparse_collate", flat, lambda: ops.sparse_collate(samples), want, compare)


@SWEEP
@given(st.data(), st.sampled_from(["union_coords", "intersection_coords", "lookup_coords"]))
def _prop_coordinate_sets(data, op):
    a_t, b_t = data.draw(coords()), data.draw(coords())

    def want():
        a, b = _np_coords(a_t), _np_coords(b_t)
        _unique(a)
        if op == "lookup_coords":  # queries may repeat
            return algebra_oracle.lookup_coords(a, b)
        _unique(b)
        return getattr(algebra_oracle, op)(a, b)

    def compare(y, e):
        if op == "lookup_coords":
            np.testing.assert_array_equal(y.numpy(), e)
        else:
            _same(y, e)

    check(op, [a_t, b_t], lambda: getattr(ops, op)(a_t, b_t), want, compare)


@SWEEP
@given(st.data(), st.integers(1, 3))
def _prop_downsample_coords(data, stride):
    """Rows may repeat here (documented): the result is the unique floor_div rows."""
    c = data.draw(coords())

    def want():
        return algebra_oracle.downsample_coords(_np_coords(c), stride)

    def compare(y, e):
        _same(y[0], e[0])
        np.testing.assert_array_equal(y[1].numpy(), e[1])

    check("downsample_coords", [c], lambda: ops.downsample_coords(c, stride, return_inverse=True), want, compare)


@SWEEP
@given(st.data(), st.sampled_from(["sparse_add", "sparse_mul"]))
def _prop_sparse_algebra(data, op):
    ca, cb = data.draw(coords()), data.draw(coords())
    fa = data.draw(feats(ca.shape[0], 2))
    fb = data.draw(feats(cb.shape[0], 2))

    def want():
        a, b = _np_coords(ca), _np_coords(cb)
        xa, xb = _np_feats(fa, a.shape[0]), _np_feats(fb, b.shape[0])
        if xa.shape[1] != xb.shape[1] or fa.dtype != fb.dtype:
            raise Rejected("channel count or dtype differs")
        _unique(a)
        _unique(b)
        return algebra_oracle.sparse_binary(op.removeprefix("sparse_"), a, xa, b, xb)

    def compare(y, e):
        _same(y.coords, e[0])
        _close(y.feats, e[1], fa.dtype, op)

    check(op, [ca, cb, fa, fb], lambda: getattr(ops, op)(lattice.SparseTensor(ca, fa), lattice.SparseTensor(cb, fb)),
          want, compare)


# ---- points -------------------------------------------------------------------------------------


@st.composite
def points(draw) -> torch.Tensor:
    n = draw(st.integers(0, 12))
    scale = draw(st.sampled_from([1.0, 1.0, 1e3, 1e12]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    p = (torch.rand(n, 3, generator=g, dtype=torch.float64) - 0.5) * scale
    if n and draw(st.integers(0, 3)) == 0:
        p[draw(st.integers(0, n - 1)), draw(st.integers(0, 2))] = draw(st.sampled_from([float("nan"), float("inf")]))
    if draw(st.booleans()):
        p = p.to(torch.float32)
    return _layout(draw, p)


@SWEEP
@given(points(), st.sampled_from([0.5, 1.0, 1e-9, 0.0, -1.0]))
def _prop_sparse_quantize(p, voxel_size):
    def want():
        try:
            c, inv, cnt = quantize_oracle(p.numpy().astype(np.float64), voxel_size)
        except ValueError as e:  # NaN / inf, voxel_size <= 0
            raise Rejected(str(e)) from None
        _fits_int32(c)
        return c, inv, cnt

    def compare(y, e):
        _same(y[0], e[0])
        np.testing.assert_array_equal(y[1].numpy(), e[1])
        np.testing.assert_array_equal(y[2].numpy(), e[2])

    check("sparse_quantize", [p], lambda: ops.sparse_quantize(p, voxel_size), want, compare)


# ---- feature modules ----------------------------------------------------------------------------


@SWEEP
@given(st.data(), st.sampled_from(["BatchNorm", "linear", "LayerNorm"]))
def _prop_channel_counts(data, what):
    c = torch.tensor([[0, i, 0, 0] for i in range(4)], dtype=torch.int32)
    f = data.draw(feats(4, 3))
    c_expected = 3

    def call():
        x = lattice.SparseTensor(c, f)
        if what == "BatchNorm":
            return lattice.nn.BatchNorm(c_expected).to(f.dtype).eval()(x)
        if what == "LayerNorm":
            return lattice.nn.LayerNorm(c_expected).to(f.dtype)(x)
        return ops.linear(x, torch.eye(c_expected, dtype=f.dtype if f.dtype.is_floating_point else torch.float64))

    def want():
        x = _np_feats(f, 4, c_expected)
        if what == "BatchNorm":  # eval: running stats 0 / 1
            return x / np.sqrt(1 + 1e-5)
        if what == "LayerNorm":
            with np.errstate(invalid="ignore"):  # inf - inf in a row holding inf: NaN, as in torch
                m = x.mean(1, keepdims=True)
                return (x - m) / np.sqrt(((x - m) ** 2).mean(1, keepdims=True) + 1e-5)
        with np.errstate(invalid="ignore"):  # NaN / inf spread along the row as in any matmul
            return x @ np.eye(c_expected)

    check(what, [c, f], call, want, lambda y, e: _close(y.feats, e, f.dtype, what))


def test_sweep_error_form_rejects_torch_style_messages():
    """The form check itself: a torch-style message fails it, a lattice message passes."""
    assert not ERROR_FORM.match("running_mean should contain 4 elements not 8")
    assert not ERROR_FORM.match("'utf-8' codec can't decode byte 0xe9")
    assert ERROR_FORM.match("[dense] coords: expected unique rows, got row 3 (0, 1, 2, 3) equal to row 0")
    with pytest.raises(AssertionError, match="contract rejects"):
        check("x", [], lambda: 1, lambda: (_ for _ in ()).throw(Rejected("r")), lambda a, b: None)
    with pytest.raises(AssertionError, match="was modified"):
        t = torch.zeros(2)
        check("x", [t], lambda: t.add_(1), lambda: 0, lambda a, b: None)


PROPERTIES = {name[len("_prop_"):]: fn for name, fn in list(globals().items()) if name.startswith("_prop_")}


@pytest.mark.parametrize("name", sorted(PROPERTIES))
def test_sweep(name):
    """Runs one op's property over its fixed, derandomized examples, and checks that the examples
    reached both outcomes (some rejected with a clear error, some equal to the oracle), so no op's
    sweep is vacuous."""
    OUTCOMES.clear()
    PROPERTIES[name]()
    seen = set().union(*OUTCOMES.values()) if OUTCOMES else set()
    assert seen == {"ok", "error"}, f"{name}: the examples only reached {sorted(seen)}"
