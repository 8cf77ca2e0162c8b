"""The relation cache of a coordinate set, exercised on ONE tensor across specs (issue 20, item 1).

Every other oracle test builds a fresh SparseTensor per call, so a cache key that forgets a
field (padding, expand, ...) hands a stale relation to the second call on the same tensor and
no test notices. Here one tensor is used for call A, then call B (differing from A in exactly
one field of the cache key: kernel size, stride, padding, dilation, expand, target coordinates,
relation kind, or pool instead of conv), then A again; every result is compared with the
float64 oracle (tests/oracle, its own relations) computed for that call's spec, and the number
of relations the input's coordinate set holds is asserted after each call:

* B with a different key must build a new relation (count + 1) and give B's oracle result;
* B with the same key (a pool over the relation of a conv, pool_transpose3d over the relation of
  conv_transpose3d, trilinear_upsample3d's generated support) must reuse it (count unchanged);
* A again must hit the cache (count unchanged) and return A's result, bitwise.

Features and weights are small integers stored in float32, so every conv and sum-pool output is
an exact integer (compared exactly); averages and trilinear weights are compared element-wise at
float32 precision. The count is read from the core coordinate set (``x._cs.cached_relation_count``,
the binding's read-only property that tests/python/test_relations.py uses too).

Runs on the CPU and, when a GPU is present, on CUDA (the only skip is "no GPU").
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import pytest
import torch

import lattice
import oracle
import oracle.pool as opool
from conftest import oracle_relation_for, random_coords

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]

C_IN, C_OUT = 3, 2
X_STRIDE = 2  # the input tensor's stride: transposed ops (stride 2) need an input stride it divides


# ---- the one input tensor and its targets --------------------------------------------------------


def _input_coords() -> np.ndarray:
    # two batches, clustered (neighbours are common, windows hold several rows), negative values
    return random_coords(np.random.default_rng(2020), 45, batches=2, extent=5, spread=5)


def _targets(coords: np.ndarray) -> dict[str, tuple[np.ndarray, int]]:
    """Named target coordinate sets (rows, stride) for the target / transposed_target calls.

    ``fwd_a`` / ``fwd_b``: at the output stride of a stride-2 forward call (4), each half of the
    generated support plus rows no input reaches (output rows without edges); ``fine``: at the
    output stride of a stride-2 transposed call (1), a third of its children plus extra rows.
    """
    gen = oracle.forward_relation(coords, 3, 2).out_coords.astype(np.int32)
    extra = np.array([[0, 40, 40, 40], [1, -30, 2, 7], [0, 0, 0, 9]], dtype=np.int32)
    children = oracle.transposed_relation(coords, 3, 2).out_coords.astype(np.int32)
    return {
        "fwd_a": (np.concatenate([gen[::2], extra]), 2 * X_STRIDE),
        "fwd_b": (np.concatenate([extra[:1], gen[1::2][::-1]]), 2 * X_STRIDE),
        "fine": (np.concatenate([children[::3], extra]), X_STRIDE // 2),
    }


class Setup:
    """One input tensor (integer-valued float32 features) and its target tensors on a device."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.coords = _input_coords()
        rng = np.random.default_rng(7)
        self.feats = rng.integers(-4, 5, size=(self.coords.shape[0], C_IN)).astype(np.float64)
        self.x = lattice.SparseTensor(
            torch.from_numpy(self.coords).to(device), torch.from_numpy(self.feats).float().to(device), stride=X_STRIDE
        )
        self.target_np: dict[str, np.ndarray] = {}
        self.targets: dict[str, lattice.SparseTensor] = {}
        for name, (rows, stride) in _targets(self.coords).items():
            self.target_np[name] = rows
            self.targets[name] = lattice.SparseTensor(
                torch.from_numpy(rows).to(device), torch.zeros(rows.shape[0], 1, device=device), stride=stride
            )

    def count(self) -> int:
        """Relations cached on the input's coordinate set."""
        return int(self.x._cs.cached_relation_count)


def _weight(kernel_size: Any) -> np.ndarray:
    """A fixed integer-valued kernel-major (K, C_in, C_out) weight for a kernel size."""
    k = oracle.kernel_volume(kernel_size)
    return np.random.default_rng(100 + k).integers(-3, 4, size=(k, C_IN, C_OUT)).astype(np.float64)


# ---- calls: (lattice result, oracle result) --------------------------------------------------------

CONV_OPS = ("conv3d", "subm_conv3d", "conv_transpose3d", "generative_conv_transpose3d")
LOCAL_POOLS = {"sum_pool3d": "sum", "avg_pool3d": "avg", "max_pool3d": "max"}


def _resolve(s: Setup, kw: dict) -> tuple[dict, Optional[np.ndarray]]:
    """Call keywords with ``coordinates`` (a target name) replaced by the target tensor."""
    kw = dict(kw)
    name = kw.pop("coordinates", None)
    if name is None:
        return kw, None
    return {**kw, "coordinates": s.targets[name]}, s.target_np[name]


def run_call(s: Setup, op: str, kw: dict) -> tuple[lattice.SparseTensor, np.ndarray, np.ndarray, tuple]:
    """Runs ``op(x, **kw)`` on the setup's tensor: (result, oracle rows, oracle features, out stride)."""
    call_kw, target = _resolve(s, kw)
    x, coords, feats = s.x, s.coords, s.feats
    if op in CONV_OPS:
        ks = kw["kernel_size"]
        wk = _weight(ks)
        w = torch.from_numpy(wk).float().to(s.device)
        y = getattr(lattice.ops, op)(x, w, **call_kw)
        okw = {k: v for k, v in kw.items() if k != "coordinates"}
        rel = oracle_relation_for(op, coords, target=target, **okw)
        ref = oracle.conv_forward(feats, wk, rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out)
        st = oracle.as_triple(kw.get("stride", 1))
        if op == "subm_conv3d":
            out_stride = (X_STRIDE,) * 3
        elif op in ("conv_transpose3d", "generative_conv_transpose3d"):
            out_stride = tuple(X_STRIDE // v for v in st)
        else:
            out_stride = tuple(X_STRIDE * v for v in st)
        return y, rel.out_coords, ref, out_stride
    if op in LOCAL_POOLS:
        ks = kw["kernel_size"]
        y = getattr(lattice.ops, op)(x, **call_kw)
        okw = {k: v for k, v in kw.items() if k not in ("coordinates", "kernel_size")}
        rows, ref, _, _ = opool.local_pool(coords, feats, ks, mode=LOCAL_POOLS[op], target=target, **okw)
        st = oracle.as_triple(kw.get("stride", ks))
        return y, rows, ref, tuple(X_STRIDE * v for v in st)
    if op == "pool_transpose3d":
        ks = kw["kernel_size"]
        y = lattice.ops.pool_transpose3d(x, **call_kw)
        okw = {k: v for k, v in kw.items() if k not in ("coordinates", "kernel_size")}
        rows, ref, _ = opool.pool_transpose(coords, feats, ks, target=target, **okw)
        st = oracle.as_triple(kw.get("stride", ks))
        return y, rows, ref, tuple(X_STRIDE // v for v in st)
    if op == "trilinear_upsample3d":
        stride = kw.get("stride", 2)
        y = lattice.ops.trilinear_upsample3d(x, **call_kw)
        rows, in_idx, out_idx, weights = opool.trilinear_edges(coords, X_STRIDE, stride=stride)
        ref, _ = opool.pool_forward(feats, in_idx, out_idx, rows.shape[0], "weighted", weights)
        return y, rows, ref, tuple(X_STRIDE // v for v in oracle.as_triple(stride))
    raise ValueError(op)


def check_call(s: Setup, op: str, kw: dict, what: str) -> torch.Tensor:
    """Runs a call and compares it with the oracle element-wise; returns its features (CPU)."""
    y, rows, ref, out_stride = run_call(s, op, kw)
    label = f"{what}: {op}({kw})"
    got_rows = y.coords.cpu().numpy()
    assert got_rows.shape == rows.shape, f"{label}: {got_rows.shape[0]} output rows, oracle {rows.shape[0]}"
    np.testing.assert_array_equal(got_rows, rows, err_msg=f"{label}: output rows")
    assert y.stride == out_stride, f"{label}: stride {y.stride}, expected {out_stride}"
    got = y.feats.detach().cpu().double().numpy()
    assert got.shape == ref.shape, f"{label}: features {got.shape}, oracle {ref.shape}"
    # integer sums are exact in float32; averages and trilinear weights round once in float32
    err = np.abs(got - ref)
    allowed = 2e-7 * np.maximum(np.abs(ref), 1.0)
    if np.any(err > allowed):
        r, c = np.unravel_index(int(np.argmax(err - allowed)), err.shape)
        raise AssertionError(f"{label}: features differ from the oracle at row {r}, channel {c}: "
                             f"got {got[r, c]!r}, expected {ref[r, c]!r} ({int((err > allowed).sum())} elements off)")
    return y.feats.detach().cpu()


# ---- one field of the key at a time: A, B, A ---------------------------------------------------

# (id, call A, call B, B shares A's relation). Every B differs from A in one field of the key
# (kind, KernelSpec{size, stride, padding, dilation, expand}, target) or, for the shared cases,
# only in what runs over the relation (pool vs conv).
FIELD_CASES = [
    ("kernel_size", ("conv3d", dict(kernel_size=3, stride=2)), ("conv3d", dict(kernel_size=2, stride=2)), False),
    ("stride", ("conv3d", dict(kernel_size=3, stride=2)), ("conv3d", dict(kernel_size=3, stride=(1, 2, 1))), False),
    ("padding", ("conv3d", dict(kernel_size=3, stride=2)), ("conv3d", dict(kernel_size=3, stride=2, padding=1)), False),
    ("dilation", ("conv3d", dict(kernel_size=3, stride=2)), ("conv3d", dict(kernel_size=3, stride=2, dilation=2)), False),
    ("expand", ("conv3d", dict(kernel_size=3, stride=2)), ("conv3d", dict(kernel_size=3, stride=2, expand=True)), False),
    ("expand_with_padding", ("conv3d", dict(kernel_size=2, stride=2, expand=True)),
     ("conv3d", dict(kernel_size=2, stride=2, padding=1, expand=True)), False),
    ("target_vs_none", ("conv3d", dict(kernel_size=3, stride=2)),
     ("conv3d", dict(kernel_size=3, stride=2, coordinates="fwd_a")), False),
    ("target_a_vs_b", ("conv3d", dict(kernel_size=3, stride=2, coordinates="fwd_a")),
     ("conv3d", dict(kernel_size=3, stride=2, coordinates="fwd_b")), False),
    ("target_padding", ("conv3d", dict(kernel_size=3, stride=2, coordinates="fwd_a")),
     ("conv3d", dict(kernel_size=3, stride=2, padding=1, coordinates="fwd_a")), False),
    ("kind_forward_vs_transposed", ("conv3d", dict(kernel_size=3, stride=2)),
     ("conv_transpose3d", dict(kernel_size=3, stride=2)), False),
    ("kind_forward_vs_submanifold", ("conv3d", dict(kernel_size=3)), ("subm_conv3d", dict(kernel_size=3)), False),
    ("kind_transposed_vs_generative", ("conv_transpose3d", dict(kernel_size=3, stride=2)),
     ("generative_conv_transpose3d", dict(kernel_size=3, stride=2)), False),
    ("kind_transposed_vs_transposed_target", ("conv_transpose3d", dict(kernel_size=3, stride=2)),
     ("conv_transpose3d", dict(kernel_size=3, stride=2, coordinates="fine")), False),
    ("transposed_padding", ("conv_transpose3d", dict(kernel_size=3, stride=2)),
     ("conv_transpose3d", dict(kernel_size=3, stride=2, padding=1)), False),
    ("transposed_target_padding", ("conv_transpose3d", dict(kernel_size=3, stride=2, coordinates="fine")),
     ("conv_transpose3d", dict(kernel_size=3, stride=2, padding=1, coordinates="fine")), False),
    ("generative_dilation", ("generative_conv_transpose3d", dict(kernel_size=2, stride=2)),
     ("generative_conv_transpose3d", dict(kernel_size=2, stride=2, dilation=2)), False),
    ("pool_padding", ("avg_pool3d", dict(kernel_size=3, stride=2)),
     ("sum_pool3d", dict(kernel_size=3, stride=2, padding=1)), False),
    ("pool_expand", ("avg_pool3d", dict(kernel_size=3, stride=2)),
     ("avg_pool3d", dict(kernel_size=3, stride=2, expand=True)), False),
    ("pool_target", ("max_pool3d", dict(kernel_size=3, stride=2)),
     ("max_pool3d", dict(kernel_size=3, stride=2, coordinates="fwd_b")), False),
    ("pool_transpose_padding", ("pool_transpose3d", dict(kernel_size=3, stride=2)),
     ("pool_transpose3d", dict(kernel_size=3, stride=2, padding=1)), False),
    ("trilinear_stride", ("trilinear_upsample3d", dict(stride=2)), ("trilinear_upsample3d", dict(stride=(2, 1, 2))), False),
    # same key, different consumer: the relation is shared
    ("pool_vs_conv", ("conv3d", dict(kernel_size=3, stride=2)), ("max_pool3d", dict(kernel_size=3, stride=2)), True),
    ("pool_mode", ("sum_pool3d", dict(kernel_size=2)), ("avg_pool3d", dict(kernel_size=2, stride=2)), True),
    ("pool_vs_conv_target", ("conv3d", dict(kernel_size=3, stride=2, padding=1, coordinates="fwd_a")),
     ("avg_pool3d", dict(kernel_size=3, stride=2, padding=1, coordinates="fwd_a")), True),
    ("pool_transpose_vs_conv_transpose", ("conv_transpose3d", dict(kernel_size=2, stride=2)),
     ("pool_transpose3d", dict(kernel_size=2)), True),
    ("trilinear_vs_generative", ("generative_conv_transpose3d", dict(kernel_size=2, stride=2)),
     ("trilinear_upsample3d", dict(stride=2)), True),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", FIELD_CASES, ids=[c[0] for c in FIELD_CASES])
def test_a_then_b_then_a_on_one_tensor_each_matches_its_oracle(case, device):
    """A, B, A on one tensor: each equals its own oracle; B builds a relation unless it shares
    A's key; the second A is a cache hit with A's bitwise result."""
    _, (op_a, kw_a), (op_b, kw_b), shares = case
    s = Setup(device)
    assert s.count() == 0
    first = check_call(s, op_a, kw_a, "A")
    assert s.count() == 1, f"A built {s.count()} relations"
    check_call(s, op_b, kw_b, "B after A")
    expected = 1 if shares else 2
    assert s.count() == expected, (f"after B: {s.count()} cached relations, expected {expected} "
                                   f"({'B reuses' if shares else 'B needs its own relation, not'} A's)")
    again = check_call(s, op_a, kw_a, "A after B")
    assert s.count() == expected, "A again built a relation: the cache lost A's entry"
    assert torch.equal(first, again), "A after B differs from A (not a bitwise cache hit)"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [c for c in FIELD_CASES if not c[3]], ids=[c[0] for c in FIELD_CASES if not c[3]])
def test_b_first_then_a_gives_the_same_results(case, device):
    """The same pairs in the other order: the first entry of a key must not shadow the other."""
    _, (op_a, kw_a), (op_b, kw_b), _ = case
    s = Setup(device)
    check_call(s, op_b, kw_b, "B")
    check_call(s, op_a, kw_a, "A after B")
    assert s.count() == 2


# ---- every field on one tensor, in sequence ------------------------------------------------------

# (op, kwargs, new relation?) in call order on ONE tensor; "new" is False where the call's key
# equals an earlier call's (the shared relation of a pool and a conv, or a repeat).
SEQUENCE = [
    ("conv3d", dict(kernel_size=3, stride=2), True),
    ("conv3d", dict(kernel_size=3, stride=2, padding=1), True),
    ("conv3d", dict(kernel_size=3, stride=2, expand=True), True),
    ("conv3d", dict(kernel_size=3, stride=2, padding=1, expand=True), True),
    ("conv3d", dict(kernel_size=3, stride=2, dilation=2), True),
    ("conv3d", dict(kernel_size=2, stride=2), True),
    ("conv3d", dict(kernel_size=3, stride=(2, 1, 2)), True),
    ("conv3d", dict(kernel_size=3), True),
    ("subm_conv3d", dict(kernel_size=3), True),
    ("subm_conv3d", dict(kernel_size=3, dilation=2), True),
    ("conv3d", dict(kernel_size=3, stride=2, coordinates="fwd_a"), True),
    ("conv3d", dict(kernel_size=3, stride=2, coordinates="fwd_b"), True),
    ("conv3d", dict(kernel_size=3, stride=2, padding=1, coordinates="fwd_b"), True),
    ("conv_transpose3d", dict(kernel_size=3, stride=2), True),
    ("conv_transpose3d", dict(kernel_size=3, stride=2, padding=1), True),
    ("conv_transpose3d", dict(kernel_size=3, stride=2, coordinates="fine"), True),
    ("generative_conv_transpose3d", dict(kernel_size=3, stride=2), True),
    ("generative_conv_transpose3d", dict(kernel_size=2, stride=2), True),
    ("max_pool3d", dict(kernel_size=3, stride=2), False),  # = conv3d k3 s2
    ("avg_pool3d", dict(kernel_size=3, stride=2, padding=1, expand=True), False),
    ("sum_pool3d", dict(kernel_size=2), False),  # = conv3d k2 s2 (stride defaults to the kernel)
    ("sum_pool3d", dict(kernel_size=2, padding=1), True),
    ("max_pool3d", dict(kernel_size=3, stride=2, coordinates="fwd_a"), False),
    ("pool_transpose3d", dict(kernel_size=3, stride=2, padding=1), False),
    ("pool_transpose3d", dict(kernel_size=2), True),
    ("trilinear_upsample3d", dict(stride=2), False),  # children = generative k2 s2
    ("trilinear_upsample3d", dict(stride=(2, 1, 2)), True),
]


@pytest.mark.parametrize("device", DEVICES)
def test_every_key_field_in_sequence_on_one_tensor_then_replayed(device):
    """All specs on one tensor: each new key adds exactly one relation, each shared key none,
    and replaying the whole sequence backwards (all cache hits) reproduces every result."""
    s = Setup(device)
    results = []
    expected = 0
    for i, (op, kw, new) in enumerate(SEQUENCE):
        results.append(check_call(s, op, kw, f"call {i}"))
        expected += int(new)
        assert s.count() == expected, f"after call {i} {op}({kw}): {s.count()} cached relations, expected {expected}"
    for i in reversed(range(len(SEQUENCE))):
        op, kw, _ = SEQUENCE[i]
        again = check_call(s, op, kw, f"replay of call {i}")
        assert torch.equal(again, results[i]), f"replay of call {i} {op}({kw}) differs from its first run"
    assert s.count() == expected, "the replay built relations (cache misses)"


@pytest.mark.parametrize("device", DEVICES)
def test_cache_is_per_identity_not_per_dtype_or_feature_tensor(device):
    """replace_feats / a dtype change keep the identity, so they reuse the relations (the features
    and their dtype are not part of the key) and still equal the oracle; a new tensor with the same
    coordinate values is a new identity with its own, empty cache."""
    s = Setup(device)
    check_call(s, "conv3d", dict(kernel_size=3, stride=2, padding=1), "f32")
    assert s.count() == 1
    x32 = s.x
    s.x = x32.replace_feats(x32.feats * 1)
    check_call(s, "conv3d", dict(kernel_size=3, stride=2, padding=1), "replace_feats")
    # another dtype (float64 on the CPU; CUDA convolutions take float16/bfloat16/float32, and float16
    # holds these small-integer sums exactly: |sum| < 2048)
    other = torch.float64 if device == "cpu" else torch.float16
    s.x = x32.to(other)
    assert s.x.key == x32.key
    y = lattice.ops.conv3d(s.x, torch.from_numpy(_weight(3)).to(device=device, dtype=other), kernel_size=3,
                           stride=2, padding=1)
    rel = oracle.forward_relation(s.coords, 3, 2, 1)
    assert y.feats.dtype == other
    np.testing.assert_array_equal(
        y.feats.double().cpu().numpy(), oracle.conv_forward(s.feats, _weight(3), rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out))
    assert s.count() == 1 and int(x32._cs.cached_relation_count) == 1
    fresh = lattice.SparseTensor(x32.coords.clone(), x32.feats, stride=X_STRIDE)
    assert fresh.key != x32.key and int(fresh._cs.cached_relation_count) == 0
    s.x = fresh
    check_call(s, "conv3d", dict(kernel_size=3, stride=2), "fresh identity")
    assert int(fresh._cs.cached_relation_count) == 1 and int(x32._cs.cached_relation_count) == 1
