"""Relations built by lattice vs the float64 numpy oracle (SEMANTICS.md "Relations").

For every kind (submanifold, forward incl. expand, target, transposed, transposed onto a target,
generative) the output coordinates (in order) and the edge list (output-major, sorted by (o, k))
must equal the oracle's exactly; the views (out_ptr, per-offset grouping, gemm map, row masks)
must agree with the edges; and the relation cache must hand back the same relation for the same
call and keep / mint identities as the contract says.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lattice
import oracle
from conftest import (
    make_plan,
    oracle_relation_for,
    output_stride_for,
    random_coords,
    relation_arrays,
    tensor_stride_for,
)

# (id, op, conv kwargs, onto a target)
CASES = [
    ("subm_k3", "subm_conv3d", dict(kernel_size=3), False),
    ("subm_k315", "subm_conv3d", dict(kernel_size=(3, 1, 5)), False),
    ("subm_k1", "subm_conv3d", dict(kernel_size=1), False),
    ("subm_k3_dil2", "subm_conv3d", dict(kernel_size=3, dilation=2), False),
    ("subm_k5_two_mask_words", "subm_conv3d", dict(kernel_size=5), False),
    ("fwd_k3_s1", "conv3d", dict(kernel_size=3), False),
    ("fwd_k315_s1_p1", "conv3d", dict(kernel_size=(3, 1, 5), padding=1), False),
    ("fwd_k2_s2", "conv3d", dict(kernel_size=2, stride=2), False),
    ("fwd_k232_s213", "conv3d", dict(kernel_size=(2, 3, 2), stride=(2, 1, 3)), False),
    ("fwd_k3_s2_p1", "conv3d", dict(kernel_size=3, stride=2, padding=1), False),
    ("fwd_k3_s213_dil2", "conv3d", dict(kernel_size=3, stride=(2, 1, 3), dilation=2), False),
    ("fwd_k3_s2_expand", "conv3d", dict(kernel_size=3, stride=2, expand=True), False),
    ("fwd_k2_s2_p1_expand", "conv3d", dict(kernel_size=2, stride=2, padding=1, expand=True), False),
    ("fwd_k315_s1_expand", "conv3d", dict(kernel_size=(3, 1, 5), expand=True), False),
    ("target_k3_s1", "conv3d", dict(kernel_size=3), True),
    ("target_k2_s2", "conv3d", dict(kernel_size=2, stride=2), True),
    ("target_k232_s213_p1", "conv3d", dict(kernel_size=(2, 3, 2), stride=(2, 1, 3), padding=1), True),
    ("tr_k2_s2", "conv_transpose3d", dict(kernel_size=2, stride=2), False),
    ("tr_k3_s2_p1", "conv_transpose3d", dict(kernel_size=3, stride=2, padding=1), False),
    ("tr_k232_s213", "conv_transpose3d", dict(kernel_size=(2, 3, 2), stride=(2, 1, 3)), False),
    ("tr_k3_s1_dil2", "conv_transpose3d", dict(kernel_size=3, dilation=2), False),
    ("tr_target_k2_s2", "conv_transpose3d", dict(kernel_size=2, stride=2), True),
    ("tr_target_k315_s213_p1", "conv_transpose3d", dict(kernel_size=(3, 1, 5), stride=(2, 1, 3), padding=1), True),
    ("gen_k2_s2", "generative_conv_transpose3d", dict(kernel_size=2, stride=2), False),
    ("gen_k3_s2_overlapping", "generative_conv_transpose3d", dict(kernel_size=3, stride=2), False),
    ("gen_k232_s213_dil2", "generative_conv_transpose3d", dict(kernel_size=(2, 3, 2), stride=(2, 1, 3), dilation=2), False),
]
CASE_IDS = [c[0] for c in CASES]


def _sparse(coords: np.ndarray, stride: Any = 1) -> lattice.SparseTensor:
    return lattice.SparseTensor(torch.from_numpy(coords.copy()), torch.zeros(coords.shape[0], 1), stride=stride)


def _weight(kernel_size: Any) -> torch.Tensor:
    kx, ky, kz = oracle.as_triple(kernel_size)
    return torch.zeros(1, kx, ky, kz, 1)


def _target_coords(rng: np.random.Generator, op: str, coords: np.ndarray, kw: dict) -> np.ndarray:
    """A target support that shares some rows with the generated output and adds others."""
    spec = {k: v for k, v in kw.items() if k != "expand"}
    generated = oracle_relation_for(op, coords, **spec).out_coords.astype(np.int32)
    keep = generated[rng.random(generated.shape[0]) < 0.6]
    extra = random_coords(rng, 8, batches=3)
    rows = {tuple(r) for r in keep.tolist()}
    extra = np.array([r for r in extra.tolist() if tuple(r) not in rows], dtype=np.int32).reshape(-1, 4)
    target = np.concatenate([keep, extra]).astype(np.int32)
    return target[rng.permutation(target.shape[0])]


def _build(rng: np.random.Generator, op: str, kw: dict, onto_target: bool, n: int):
    coords = random_coords(rng, n)
    x = _sparse(coords, tensor_stride_for(op, kw.get("stride", 1)))
    target_np: Optional[np.ndarray] = None
    call_kw = dict(kw)
    if onto_target:
        target_np = _target_coords(rng, op, coords, kw)
        call_kw["coordinates"] = _sparse(target_np, output_stride_for(op, kw.get("stride", 1)))
    return coords, x, target_np, call_kw


def _assert_relation_equals_oracle(got: dict, ref: "oracle.Relation", n_in: int) -> None:
    np.testing.assert_array_equal(got["out_coords"], ref.out_coords.astype(np.int32), err_msg="output coords")
    assert got["n_in"] == n_in
    assert got["n_out"] == ref.n_out
    assert got["kernel_volume"] == ref.kernel_volume
    assert got["n_edges"] == ref.n_edges
    np.testing.assert_array_equal(got["out_idx"], ref.out_idx, err_msg="out_idx")
    np.testing.assert_array_equal(got["k_idx"], ref.k_idx, err_msg="k_idx")
    np.testing.assert_array_equal(got["in_idx"], ref.in_idx, err_msg="in_idx")


@pytest.mark.parametrize("n", [40, 1, 0], ids=["n40", "one_row", "empty"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_relation_random_input_equals_oracle_coords_and_edges(rng, case, n):
    _, op, kw, onto_target = case
    coords, x, target_np, call_kw = _build(rng, op, kw, onto_target, n)
    got = relation_arrays(make_plan(op, x, _weight(kw["kernel_size"]), **call_kw))
    spec = {k: v for k, v in kw.items()}
    ref = oracle_relation_for(op, coords, target=target_np, **spec)
    _assert_relation_equals_oracle(got, ref, coords.shape[0])
    if n == 40:
        assert ref.n_edges >= 5, "test input too sparse to be meaningful"


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_relation_views_agree_with_edge_list(rng, case):
    _, op, kw, onto_target = case
    coords, x, target_np, call_kw = _build(rng, op, kw, onto_target, 40)
    got = relation_arrays(make_plan(op, x, _weight(kw["kernel_size"]), **call_kw))
    K, n_out = got["kernel_volume"], got["n_out"]
    i, o, k = got["in_idx"].astype(np.int64), got["out_idx"].astype(np.int64), got["k_idx"].astype(np.int64)
    # out_ptr: CSR over the output-major edge list
    expected_out_ptr = np.concatenate([[0], np.cumsum(np.bincount(o, minlength=n_out))])
    np.testing.assert_array_equal(got["out_ptr"], expected_out_ptr, err_msg="out_ptr")
    # per-offset grouping == stable sort of the edges by k
    order = np.argsort(k, kind="stable")
    np.testing.assert_array_equal(got["k_in"], i[order], err_msg="k_in")
    np.testing.assert_array_equal(got["k_out"], o[order], err_msg="k_out")
    expected_k_ptr = np.concatenate([[0], np.cumsum(np.bincount(k, minlength=K))])
    np.testing.assert_array_equal(got["k_ptr"], expected_k_ptr, err_msg="k_ptr")


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_relation_gemm_map_and_row_masks_equal_oracle_dense_map(rng, case):
    _, op, kw, onto_target = case
    coords, x, target_np, call_kw = _build(rng, op, kw, onto_target, 40)
    p = make_plan(op, x, _weight(kw["kernel_size"]), **call_kw)
    ref = oracle_relation_for(op, coords, target=target_np, **kw)
    dense = ref.dense_map()
    gemm = torch.utils.dlpack.from_dlpack(p.relation.gemm_map()).numpy()
    assert gemm.shape == dense.shape
    np.testing.assert_array_equal(gemm, dense, err_msg="gemm_map")
    masks = torch.utils.dlpack.from_dlpack(p.relation.row_masks()).numpy().view(np.uint64)
    K = ref.kernel_volume
    words = (K + 63) // 64
    assert masks.shape == (ref.n_out, words)
    expected = np.zeros((ref.n_out, words), dtype=np.uint64)
    for o_row, k_row in zip(*np.nonzero(dense >= 0)):
        expected[o_row, k_row // 64] |= np.uint64(1) << np.uint64(k_row % 64)
    np.testing.assert_array_equal(masks, expected, err_msg="row_masks")


def test_relation_hand_computed_subm_k3_edges_match_offsets():
    # Three voxels on a line in batch 0 and one in batch 1: the center offset is row 13,
    # +x is row 22 ((2*3+1)*3+1), -x is row 4 ((0*3+1)*3+1).
    coords = np.array([[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0], [1, 1, 0, 0]], dtype=np.int32)
    got = relation_arrays(make_plan("subm_conv3d", _sparse(coords), _weight(3)))
    edges = list(zip(got["in_idx"].tolist(), got["out_idx"].tolist(), got["k_idx"].tolist()))
    assert edges == [(0, 0, 13), (1, 0, 22), (0, 1, 4), (1, 1, 13), (2, 1, 22), (1, 2, 4), (2, 2, 13), (3, 3, 13)]


def test_relation_forward_negative_coords_floor_divide_toward_minus_infinity():
    coords = np.array([[0, -1, -2, -3], [0, 1, 2, 3], [0, -2, -1, 0]], dtype=np.int32)
    got = relation_arrays(make_plan("conv3d", _sparse(coords), _weight(2), stride=2))
    np.testing.assert_array_equal(got["out_coords"], [[0, -1, -1, -2], [0, 0, 1, 1], [0, -1, -1, 0]])


def test_relation_generative_overlapping_children_are_deduplicated():
    # kernel 3 stride 2 on neighbouring parents: child x=2 comes from parent 0 (k=2) and parent 1 (k=0)
    coords = np.array([[0, 0, 0, 0], [0, 1, 0, 0]], dtype=np.int32)
    x = _sparse(coords, stride=2)
    got = relation_arrays(make_plan("generative_conv_transpose3d", x, _weight((3, 1, 1)), stride=(2, 1, 1)))
    np.testing.assert_array_equal(got["out_coords"], [[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0], [0, 3, 0, 0], [0, 4, 0, 0]])
    edges = list(zip(got["in_idx"].tolist(), got["out_idx"].tolist(), got["k_idx"].tolist()))
    assert edges == [(0, 0, 0), (0, 1, 1), (1, 2, 0), (0, 2, 2), (1, 3, 1), (1, 4, 2)]  # sorted by (o, k)


@settings(max_examples=25, deadline=None, database=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    op=st.sampled_from(["subm_conv3d", "conv3d", "conv_transpose3d", "generative_conv_transpose3d"]),
    ks=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)),
    stride=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)),
    padding=st.integers(0, 2),
    dilation=st.integers(1, 2),
    expand=st.booleans(),
)
def test_relation_random_spec_equals_oracle(seed, op, ks, stride, padding, dilation, expand):
    rng = np.random.default_rng(seed)
    kw: dict[str, Any] = dict(kernel_size=ks, dilation=dilation)
    if op == "subm_conv3d":
        kw["kernel_size"] = tuple(k | 1 for k in ks)
    else:
        kw["stride"] = stride
    if op in ("conv3d", "conv_transpose3d"):
        kw["padding"] = padding
    if op == "conv3d":
        kw["expand"] = expand
    coords = random_coords(rng, 25, batches=2, extent=4, spread=6)
    x = _sparse(coords, tensor_stride_for(op, kw.get("stride", 1)))
    got = relation_arrays(make_plan(op, x, _weight(kw["kernel_size"]), **kw))
    ref = oracle_relation_for(op, coords, **kw)
    _assert_relation_equals_oracle(got, ref, coords.shape[0])


# ---- identity and the relation cache -----------------------------------------------------------


def test_relation_cache_same_call_twice_returns_same_relation_and_output_key(make_coords):
    x = _sparse(make_coords(30), 1)
    w = _weight(2)
    p1 = make_plan("conv3d", x, w, stride=2)
    r1 = p1.relation
    before = x._cs.cached_relation_count
    p2 = make_plan("conv3d", x, w, stride=2)
    assert p2.relation is r1
    assert x._cs.cached_relation_count == before
    a1, a2 = relation_arrays(p1), relation_arrays(p2)
    assert (a1["n_out"], a1["n_edges"]) == (a2["n_out"], a2["n_edges"])
    t1 = torch.utils.dlpack.from_dlpack(r1.arrays()["in_idx"])
    t2 = torch.utils.dlpack.from_dlpack(p2.relation.arrays()["in_idx"])
    assert t1.data_ptr() == t2.data_ptr(), "the second call rebuilt the edge list"
    assert p1.output.key == p2.output.key != x.key
    y1 = lattice.ops.conv3d(x, w, stride=2)
    y2 = lattice.ops.conv3d(x, w, stride=2)
    assert y1.key == y2.key == p1.output.key


def test_relation_cache_different_spec_builds_a_new_relation(make_coords):
    x = _sparse(make_coords(30), 2)
    w = _weight(2)
    p1 = make_plan("conv_transpose3d", x, w, stride=2)
    r1 = p1.relation
    count = x._cs.cached_relation_count
    p2 = make_plan("conv_transpose3d", x, _weight(3), stride=2)
    assert p2.relation is not r1
    assert p2.relation.kernel_volume == 27 and r1.kernel_volume == 8
    assert p2.output.key != p1.output.key
    assert x._cs.cached_relation_count == count + 1
    p3 = make_plan("conv_transpose3d", x, w, stride=2, dilation=2)
    assert p3.relation is not r1 and p3.output.key not in (p1.output.key, p2.output.key)


def test_conv3d_stride1_keeps_input_key_and_subm_keeps_input_key(make_coords):
    x = _sparse(make_coords(30), 1)
    y = lattice.ops.conv3d(x, _weight(3))
    assert y.key == x.key
    np.testing.assert_array_equal(y.coords.numpy(), x.coords.numpy())
    z = lattice.ops.subm_conv3d(x, _weight(3))
    assert z.key == x.key


def test_conv3d_stride2_mints_a_new_key_at_output_stride(make_coords):
    x = _sparse(make_coords(30), (1, 2, 1))
    y = lattice.ops.conv3d(x, _weight(2), stride=(2, 1, 3))
    assert y.key != x.key
    assert y.stride == (2, 2, 3)


def test_conv_transpose3d_onto_target_returns_target_key_and_rows(make_coords):
    fine = _sparse(make_coords(30), 1)
    coarse = lattice.ops.conv3d(fine, _weight(2), stride=2)
    up = lattice.ops.conv_transpose3d(coarse, _weight(2), stride=2, coordinates=fine)
    assert up.key == fine.key
    assert up.stride == (1, 1, 1)
    np.testing.assert_array_equal(up.coords.numpy(), fine.coords.numpy())
    onto = lattice.ops.conv3d(fine, _weight(2), stride=2, coordinates=coarse)
    assert onto.key == coarse.key


def test_sparse_tensor_equal_values_in_different_arrays_are_different_identities(make_coords):
    c = make_coords(10)
    a, b = _sparse(c), _sparse(c.copy())
    assert a.key != b.key
    assert a.replace_feats(torch.ones(len(a), 3)).key == a.key
    assert a.to(torch.float64).key == a.key


def test_relation_output_batch_counts_follow_input_batch_counts():
    coords = np.array([[0, 0, 0, 0], [0, 1, 0, 0], [2, 5, 5, 5]], dtype=np.int32)
    x = lattice.SparseTensor(torch.from_numpy(coords), torch.zeros(3, 1), batch_counts=[2, 0, 1])
    y = lattice.ops.conv3d(x, _weight(2), stride=2)
    assert y.batch_counts == [1, 0, 1]
    np.testing.assert_array_equal(y.coords.numpy(), [[0, 0, 0, 0], [2, 2, 2, 2]])


# ---- int32 extremes: no wrap-around, no packed-key collisions ----------------------------------

I32_MAX, I32_MIN = 2**31 - 1, -(2**31)
EXTREME = [
    ("subm_wrap_x", "subm_conv3d", [[0, I32_MAX, 0, 0], [0, I32_MIN, 0, 0], [0, I32_MAX - 1, 0, 0]], dict(kernel_size=3)),
    ("subm_corners", "subm_conv3d", [[0, I32_MAX, I32_MAX, I32_MAX], [0, I32_MIN, I32_MIN, I32_MIN],
                                     [0, I32_MAX - 1, I32_MAX, I32_MAX], [0, I32_MIN + 1, I32_MIN, I32_MIN + 1]],
     dict(kernel_size=3)),
    ("subm_packed_key_aliases", "subm_conv3d", [[0, 0, 0, 0], [0, 2**21, 0, 0], [0, 2**16, 0, 0], [0, 0, 2**20, 0],
                                               [1, 0, 0, 0], [2**20, 0, 0, 0], [I32_MAX, 0, 0, 0], [0, 0, 0, -(2**21)]],
     dict(kernel_size=3)),
    ("subm_huge_dilation", "subm_conv3d", [[0, 0, 0, 0], [0, 2**30, 0, 0], [0, -(2**30), 0, 0], [0, I32_MIN, 0, 0]],
     dict(kernel_size=5, dilation=2**30)),
    ("fwd_floor_div_extremes", "conv3d", [[0, I32_MIN, I32_MIN, I32_MIN], [0, I32_MIN + 1, I32_MIN, I32_MIN],
                                          [0, I32_MAX, I32_MAX, I32_MAX]], dict(kernel_size=2, stride=2)),
    ("fwd_stride3_extremes", "conv3d", [[0, I32_MIN, 0, 0], [0, I32_MAX, 0, 0], [0, -1, 0, 0]], dict(kernel_size=3, stride=3)),
    ("fwd_max_stride_padding", "conv3d", [[0, 1, 0, 0], [0, I32_MAX - 1, 0, 0], [0, I32_MIN, 0, 0]],
     dict(kernel_size=3, stride=I32_MAX, padding=I32_MAX, expand=True)),
    ("fwd_padding_at_max", "conv3d", [[0, I32_MAX, 0, 0], [0, I32_MAX - 2, 0, 0]], dict(kernel_size=3, padding=1)),
    ("tr_to_int32_min", "conv_transpose3d", [[0, I32_MIN // 2, 0, 0]], dict(kernel_size=2, stride=2)),
    ("gen_to_int32_max", "generative_conv_transpose3d", [[0, I32_MAX // 2, 0, 0]], dict(kernel_size=2, stride=2)),
]


@pytest.mark.parametrize("case", EXTREME, ids=[c[0] for c in EXTREME])
def test_relation_int32_extreme_coordinates_equal_oracle(case):
    _, op, rows, kw = case
    coords = np.array(rows, dtype=np.int64).astype(np.int32)
    x = _sparse(coords, tensor_stride_for(op, kw.get("stride", 1)))
    got = relation_arrays(make_plan(op, x, _weight(kw["kernel_size"]), **kw))
    ref = oracle_relation_for(op, coords, **kw)
    _assert_relation_equals_oracle(got, ref, coords.shape[0])


@pytest.mark.skipif(not hasattr(lattice, "set_num_threads"), reason="this build has no lattice.set_num_threads")
@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("subm_k3", "fwd_k3_s2_expand", "target_k2_s2",
                                                                "tr_k3_s2_p1", "gen_k3_s2_overlapping")],
                         ids=lambda c: c[0])
def test_relation_built_with_two_threads_equals_oracle(rng, case):
    # enough rows and edges that the parallel relation builder splits its work
    _, op, kw, onto_target = case
    before = lattice.get_num_threads()
    lattice.set_num_threads(2)
    try:
        coords = random_coords(rng, 1200, batches=2, extent=12, spread=10)
        x = _sparse(coords, tensor_stride_for(op, kw.get("stride", 1)))
        target_np = None
        call_kw = dict(kw)
        if onto_target:
            target_np = _target_coords(rng, op, coords, kw)
            call_kw["coordinates"] = _sparse(target_np, output_stride_for(op, kw.get("stride", 1)))
        p = make_plan(op, x, _weight(kw["kernel_size"]), **call_kw)
        got = relation_arrays(p)
        ref = oracle_relation_for(op, coords, target=target_np, **kw)
        _assert_relation_equals_oracle(got, ref, coords.shape[0])
        order = np.argsort(got["k_idx"], kind="stable")
        np.testing.assert_array_equal(got["k_in"], got["in_idx"][order])
        np.testing.assert_array_equal(got["k_out"], got["out_idx"][order])
        gemm = torch.utils.dlpack.from_dlpack(p.relation.gemm_map()).numpy()
        np.testing.assert_array_equal(gemm, ref.dense_map())
    finally:
        lattice.set_num_threads(before)


def test_relation_views_and_outputs_outlive_plan_and_tensors(make_coords):
    import gc

    coords = make_coords(200)
    x = lattice.SparseTensor(torch.from_numpy(coords.copy()), torch.ones(coords.shape[0], 1))
    p = make_plan("conv3d", x, _weight(2), stride=2)
    views = {k: torch.utils.dlpack.from_dlpack(v) for k, v in p.relation.arrays().items()}
    gemm = torch.utils.dlpack.from_dlpack(p.relation.gemm_map())
    out_coords = torch.utils.dlpack.from_dlpack(p.output.coords())
    y = lattice.ops.conv3d(x, torch.ones(1, 2, 2, 2, 1), stride=2)
    y_feats, y_coords = y.feats, y.coords
    del p, x, y
    gc.collect()
    _ = [torch.full((4096,), -7, dtype=torch.int32) for _ in range(64)]  # reuse freed memory, if any
    ref = oracle.forward_relation(coords, 2, 2)
    np.testing.assert_array_equal(views["in_idx"].numpy(), ref.in_idx)
    np.testing.assert_array_equal(views["k_idx"].numpy(), ref.k_idx)
    np.testing.assert_array_equal(gemm.numpy(), ref.dense_map())
    np.testing.assert_array_equal(out_coords.numpy(), ref.out_coords)
    np.testing.assert_array_equal(y_coords.numpy(), ref.out_coords)
    np.testing.assert_array_equal(y_feats.numpy()[:, 0], np.bincount(ref.out_idx, minlength=ref.n_out))


def test_sparse_tensor_keeps_coords_alive_after_caller_drops_them(make_coords):
    import gc

    coords = make_coords(100)
    c = torch.from_numpy(coords.copy())
    x = _sparse(coords)
    x2 = lattice.SparseTensor(c, torch.zeros(coords.shape[0], 1))
    del c
    gc.collect()
    _ = [torch.full((4096,), -7, dtype=torch.int32) for _ in range(64)]
    got = relation_arrays(make_plan("subm_conv3d", x2, _weight(3)))
    _assert_relation_equals_oracle(got, oracle.subm_relation(coords, 3), coords.shape[0])
    assert x.key != x2.key


def test_relation_on_strided_tensor_uses_logical_coordinates(make_coords):
    # coordinates are logical indices at the tensor stride: a stride-(2, 4, 2) tensor relates
    # exactly as a stride-1 tensor with the same stored values (dilation is in logical units too)
    coords = make_coords(40)
    x = _sparse(coords, (2, 4, 2))
    for op, kw in (("subm_conv3d", dict(kernel_size=3, dilation=(1, 2, 1))), ("conv3d", dict(kernel_size=2, stride=2))):
        got = relation_arrays(make_plan(op, x, _weight(kw["kernel_size"]), **kw))
        _assert_relation_equals_oracle(got, oracle_relation_for(op, coords, **kw), coords.shape[0])
    assert lattice.ops.subm_conv3d(x, _weight(3)).stride == (2, 4, 2)
    assert lattice.ops.conv3d(x, _weight(2), stride=2).stride == (4, 8, 4)


def test_relation_cache_target_with_equal_values_but_other_identity_builds_a_new_relation(make_coords):
    coords = make_coords(30)
    x = _sparse(coords)
    t1, t2 = _sparse(coords[::2].copy()), _sparse(coords[::2].copy())
    p1 = make_plan("conv3d", x, _weight(3), coordinates=t1)
    r1 = p1.relation
    assert make_plan("conv3d", x, _weight(3), coordinates=t1).relation is r1
    p2 = make_plan("conv3d", x, _weight(3), coordinates=t2)
    assert p2.relation is not r1 and p2.output.key == t2.key and p1.output.key == t1.key
    np.testing.assert_array_equal(relation_arrays(p1)["in_idx"], relation_arrays(p2)["in_idx"])


# ---- lazy views (include/lattice/tensor/relation.h "Views") ---------------------------------

def _subm3_plan(seed: int = 4, n: int = 3000):
    coords = random_coords(np.random.default_rng(seed), n, batches=2, extent=12)
    x = lattice.SparseTensor(torch.from_numpy(coords), torch.randn(coords.shape[0], 8, dtype=torch.float64))
    w = torch.randn(8, 3, 3, 3, 8, dtype=torch.float64) * 0.1
    return coords, x, w, make_plan("subm_conv3d", x, w)


def test_fresh_subm3_relation_holds_its_gemm_map_alone():
    """What an implicit-GEMM forward reads (the gemm map) is all a fresh submanifold relation
    holds: no edge list, no grouping, no edge count (whose device read-back the forward never
    needs), 4 * K bytes per output row; the count and each view are built when first asked for
    and equal the oracle's."""
    coords, x, _, p = _subm3_plan()
    rel = p.relation
    assert rel.built_views() == ["gemm_map"]
    assert rel.known_edges is None
    n = int(rel.n_out)
    assert rel.view_bytes == n * 27 * 4
    rel.gemm_map()
    assert rel.built_views() == ["gemm_map"]  # reading the map builds nothing
    edges = int(rel.n_edges)  # counted now
    assert rel.known_edges == edges and "edge_count" in rel.built_views()
    assert "edge_list" not in rel.built_views()
    _assert_relation_equals_oracle(relation_arrays(p), oracle.subm_relation(coords, 3), coords.shape[0])


@pytest.mark.parametrize("route, views", [
    ("gather_gemm_scatter", ["gemm_map", "out_ptr", "offset_grouping", "edge_count"]),
    ("reference", ["gemm_map", "edge_list", "out_ptr", "edge_count"]),
])
def test_conv_forward_builds_only_the_views_its_route_reads(route, views):
    """A CPU conv forward builds exactly the relation views its route declares
    (conv_relation_reads): gather_gemm_scatter never builds the output-major edge list (12 bytes
    per edge), the reference never builds the per-offset grouping. The result equals the float64
    oracle over the oracle's own edges."""
    coords, x, w, p = _subm3_plan(seed=6)
    admitted = [r["route"] for r in lattice.explain("subm_conv3d", x, w).rows if r["admitted"]]
    if route not in admitted:
        pytest.skip(f"{route} is not admitted in this build")
    y = lattice.ops.subm_conv3d(x, w, route=route)
    assert sorted(p.relation.built_views()) == sorted(views)
    ref_rel = oracle.subm_relation(coords, 3)
    ref = oracle.conv_forward(x.feats.numpy(), oracle.weight_to_kcc(w.numpy()), ref_rel.in_idx, ref_rel.out_idx,
                              ref_rel.k_idx, ref_rel.n_out)
    np.testing.assert_allclose(y.feats.numpy(), ref, rtol=1e-12, atol=1e-12)
