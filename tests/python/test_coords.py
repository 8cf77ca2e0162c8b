"""Coordinate utilities vs the float64 numpy oracle: union / intersection / lookup / contains by
value (both algebra routes), downsample_coords, Morton codes and order, prune, crop,
sparse_collate, sparse_from_coordinates, SparseTensor.dense / from_dense, and every validation
message."""
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

ROUTES = route_names("algebra", device="cpu")  # set ops run the algebra routes: ["hashed", "reference"]


def _sets(rng, n=80):
    pool = random_coords(rng, n, batches=3, extent=4, spread=5)
    a = pool[rng.random(len(pool)) < 0.7]
    b = pool[rng.random(len(pool)) < 0.6]
    return a[rng.permutation(len(a))], b[rng.permutation(len(b))]


# ---- set operations and lookups ----------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
def test_union_and_intersection_equal_oracle(rng, route):
    a, b = _sets(rng)
    u = ops.union_coords(torch.from_numpy(a), torch.from_numpy(b), route=route)
    i = ops.intersection_coords(a, b, route=route)  # numpy accepted
    assert u.dtype == torch.int32 and i.dtype == torch.int32
    np.testing.assert_array_equal(u.numpy(), OA.union_coords(a, b))
    np.testing.assert_array_equal(i.numpy(), OA.intersection_coords(a, b))
    assert 0 < len(i) < min(len(a), len(b)) < len(u)


def test_union_of_sparse_tensors_reuses_their_sets_and_strides(rng):
    a, b = _sets(rng)
    x = lattice.SparseTensor(torch.from_numpy(a), torch.zeros(len(a), 1), stride=2)
    u = ops.union_coords(x, torch.from_numpy(b))  # the plain tensor takes x's stride
    np.testing.assert_array_equal(u.numpy(), OA.union_coords(a, b))
    assert torch.equal(ops.union_coords(x, x), x.coords)


def test_union_rejects_sparse_tensors_of_different_strides(rng):
    a, b = _sets(rng)
    x = lattice.SparseTensor(torch.from_numpy(a), torch.zeros(len(a), 1), stride=2)
    y = lattice.SparseTensor(torch.from_numpy(b), torch.zeros(len(b), 1), stride=1)
    with pytest.raises(ValueError, match=r"^\[union_coords\] rhs: expected stride \(2, 2, 2\) \(the stride of lhs\), got stride \(1, 1, 1\)$"):
        ops.union_coords(x, y)


def test_intersection_rejects_repeated_rows():
    with pytest.raises(ValueError, match=r"^\[intersection_coords\] coords: expected unique rows, got row 2 \(0, 1, 1, 1\) equal to row 0$"):
        ops.intersection_coords(torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2], [0, 1, 1, 1]]), torch.tensor([[0, 1, 1, 1]]))


@pytest.mark.parametrize("route", ROUTES)
def test_lookup_and_contains_equal_oracle_with_repeated_and_extreme_queries(rng, route):
    a, b = _sets(rng)
    extreme = np.array([[0, 2**31 - 1, -(2**31), 0], [2**31 - 1, 0, 0, 0]], dtype=np.int32)
    q = np.concatenate([b, b[:5], extreme, a[:3]])
    rows = ops.lookup_coords(torch.from_numpy(a), torch.from_numpy(q), route=route)
    assert rows.dtype == torch.int64
    np.testing.assert_array_equal(rows.numpy(), OA.lookup_coords(a, q))
    found = ops.contains_coords(a, q, route=route)
    assert found.dtype == torch.bool
    np.testing.assert_array_equal(found.numpy(), OA.lookup_coords(a, q) >= 0)


def test_lookup_in_a_sparse_tensor_hand_computed():
    x = lattice.SparseTensor(torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [1, 0, 0, 0]]), torch.zeros(3, 1))
    q = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.int64)
    assert ops.lookup_coords(x, q).tolist() == [2, -1, 1, 2]
    assert ops.contains_coords(x, q).tolist() == [True, False, True, True]
    assert ops.lookup_coords(x, torch.zeros(0, 4, dtype=torch.int32)).shape == (0,)


def test_lookup_rejects_queries_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"^\[lookup_coords\] queries: expected shape \(N, 4\), got \(2, 3\)$"):
        ops.lookup_coords(torch.zeros(1, 4, dtype=torch.int32), torch.zeros(2, 3, dtype=torch.int32))


def test_contains_rejects_float_queries():
    with pytest.raises(TypeError, match=r"^\[contains_coords\] queries: expected an integer tensor \(int32\), got torch.float32$"):
        ops.contains_coords(torch.zeros(1, 4, dtype=torch.int32), torch.zeros(2, 4))


def test_lookup_rejects_coordinates_outside_int32():
    with pytest.raises(ValueError, match=r"^\[lookup_coords\] coords: expected values within int32 \[-2147483648, 2147483647\], got range \[0, 4294967296\]$"):
        ops.lookup_coords(torch.tensor([[0, 0, 0, 2**32]]), torch.zeros(1, 4, dtype=torch.int32))


def test_lookup_rejects_a_coords_argument_that_is_not_a_tensor():
    with pytest.raises(TypeError, match=r"^\[lookup_coords\] coords: expected a torch.Tensor or numpy.ndarray, got list$"):
        ops.lookup_coords([[0, 0, 0, 0]], torch.zeros(1, 4, dtype=torch.int32))


def test_set_operation_rejects_an_unknown_route():
    c = torch.zeros(1, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^\[union_coords\] route: expected one of 'hashed', 'cuda_hashed', 'reference', got 'x'$"):
        ops.union_coords(c, c + 1, route="x")


def test_explain_set_operations_and_lookups(rng):
    a, b = _sets(rng)
    e = lattice.explain("union_coords", torch.from_numpy(a), torch.from_numpy(b))
    assert e.problem.startswith("union_coords align (outer join)") and e.chosen == "hashed"
    e = lattice.explain("lookup_coords", torch.from_numpy(a), torch.from_numpy(b))
    assert e.problem.startswith("lookup_coords lookup") and f"queries={len(b)}" in e.problem


# ---- downsampling and Morton codes -------------------------------------------------------------


@pytest.mark.parametrize("stride", [1, 2, (2, 1, 3), 5])
def test_downsample_coords_equals_oracle(rng, stride):
    c = random_coords(rng, 200, batches=3, extent=8, spread=20)
    c = np.concatenate([c, c[:20]])  # repeated input rows are allowed
    out, inverse = ops.downsample_coords(torch.from_numpy(c), stride, return_inverse=True)
    ref, ref_inv = OA.downsample_coords(c, stride)
    np.testing.assert_array_equal(out.numpy(), ref)
    np.testing.assert_array_equal(inverse.numpy(), ref_inv)
    assert (c[:, 1:] < 0).any()


def test_downsample_coords_equals_the_strided_conv_output_support(rng):
    c = random_coords(rng, 100)
    x = lattice.SparseTensor(torch.from_numpy(c), torch.zeros(len(c), 1, dtype=torch.float64))
    y = ops.conv3d(x, torch.zeros(1, 2, 2, 2, 1, dtype=torch.float64), stride=2)
    assert torch.equal(ops.downsample_coords(x, 2), y.coords)


def test_downsample_coords_rejects_a_non_positive_stride():
    with pytest.raises(ValueError, match=r"^\[downsample_coords\] stride: expected positive integers, got \(2, 0, 2\)$"):
        ops.downsample_coords(torch.zeros(1, 4, dtype=torch.int32), (2, 0, 2))


def test_downsample_coords_rejects_an_unknown_route():
    with pytest.raises(ValueError, match=r"^\[downsample_coords\] route: expected 'cuda' or 'reference', got 'hashed'$"):
        ops.downsample_coords(torch.zeros(1, 4, dtype=torch.int32), 2, route="hashed")


def test_morton_codes_equal_oracle_for_3_and_4_columns(rng):
    c = random_coords(rng, 150, batches=3, spread=2000)
    c[0, 1:] = [-(2**20), 2**20 - 1, 0]
    codes = ops.morton_codes(torch.from_numpy(c))
    assert codes.dtype == torch.int64 and bool((codes >= 0).all())
    np.testing.assert_array_equal(codes.numpy(), OA.morton_codes(c))
    np.testing.assert_array_equal(ops.morton_codes(c[:, 1:]).numpy(), OA.morton_codes(c[:, 1:]))
    assert len(set(codes.tolist())) == len(set(map(tuple, c[:, 1:].tolist())))


def test_morton_codes_hand_computed_bit_layout():
    c = torch.tensor([[0, 0, 0], [-(2**20), -(2**20), -(2**20) + 1], [-(2**20) + 1, -(2**20), -(2**20)]])
    assert ops.morton_codes(c).tolist() == [7 << 60, 1, 4]


def test_morton_order_sorts_by_batch_then_code_stably(rng):
    c = random_coords(rng, 120, batches=3)
    c = np.concatenate([c, c[:10]])  # ties keep input order
    order = ops.morton_order(torch.from_numpy(c))
    np.testing.assert_array_equal(order.numpy(), OA.morton_order(c))
    assert ops.morton_order(torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]])).tolist() == [2, 1, 0]


@pytest.mark.parametrize("value, axis", [(2**20, "x"), (-(2**20) - 1, "z")])
def test_morton_codes_reject_values_outside_the_21_bit_range(value, axis):
    row = [0, 0, 0, 0]
    row[1 + "xyz".index(axis)] = value
    c = torch.tensor([[0, 1, 2, 3], row], dtype=torch.int32)
    with pytest.raises(ValueError, match=rf"^\[morton_codes\] coords: expected x, y, z within \[-1048576, 1048575\] \(the 21-bit Morton range\), got {value} at row 1, axis {axis}$"):
        ops.morton_codes(c)
    with pytest.raises(ValueError, match=r"^\[morton_order\] coords: expected x, y, z within \[-1048576, 1048575\]"):
        ops.morton_order(c)


def test_morton_codes_reject_the_wrong_shape():
    with pytest.raises(ValueError, match=r"^\[morton_codes\] coords: expected shape \(N, 3\) or \(N, 4\), got \(2, 5\)$"):
        ops.morton_codes(torch.zeros(2, 5, dtype=torch.int32))


def test_explain_downsample_and_morton(rng):
    c = torch.from_numpy(random_coords(rng, 10))
    for op in ("downsample_coords", "morton_codes", "morton_order", "sparse_from_coordinates"):
        e = lattice.explain(op, c, torch.zeros(len(c), 1))
        assert e.chosen == "reference", op


# ---- prune and crop ----------------------------------------------------------------------------


def test_prune_keeps_masked_rows_in_order_with_gradients(rng):
    c = random_coords(rng, 40)
    counts = np.bincount(c[:, 0], minlength=3).tolist()
    f = torch.from_numpy(rng.standard_normal((len(c), 2))).requires_grad_(True)
    x = lattice.SparseTensor(torch.from_numpy(c), f, stride=2, batch_counts=counts)
    mask = torch.from_numpy(rng.random(len(c)) < 0.5)
    y = ops.prune(x, mask)
    np.testing.assert_array_equal(y.coords.numpy(), c[mask.numpy()])
    assert y.key != x.key and y.stride == (2, 2, 2)
    assert y.batch_counts == np.bincount(c[mask.numpy()][:, 0], minlength=3).tolist()
    y.feats.sum().backward()
    assert torch.equal(f.grad, mask.double().unsqueeze(1).expand(-1, 2))


def test_prune_with_an_all_true_mask_keeps_the_identity(rng):
    c = random_coords(rng, 10)
    x = lattice.SparseTensor(torch.from_numpy(c), torch.ones(len(c), 1))
    assert ops.prune(x, torch.ones(len(c), dtype=torch.bool)).key == x.key
    assert len(ops.prune(x, np.zeros(len(c), dtype=bool))) == 0


def test_prune_rejects_a_non_bool_mask():
    x = lattice.SparseTensor(torch.zeros(2, 4, dtype=torch.int32) + torch.tensor([[0], [1]], dtype=torch.int32), torch.ones(2, 1))
    with pytest.raises(TypeError, match=r"^\[prune\] mask: expected a bool tensor of shape \(N=2,\), got torch.int64$"):
        ops.prune(x, torch.tensor([1, 0]))


def test_prune_rejects_a_mask_of_the_wrong_length():
    x = lattice.SparseTensor(torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0]]), torch.ones(2, 1))
    with pytest.raises(ValueError, match=r"^\[prune\] mask: expected shape \(N=2,\), got \(3,\)$"):
        ops.prune(x, torch.ones(3, dtype=torch.bool))


def test_prune_rejects_a_non_sparse_input():
    with pytest.raises(TypeError, match=r"^\[prune\] input: expected a lattice.SparseTensor, got Tensor$"):
        ops.prune(torch.ones(2, 1), torch.ones(2, dtype=torch.bool))


def test_crop_lo_inclusive_hi_exclusive_hand_computed():
    c = torch.tensor([[0, 0, 0, 0], [0, 1, 1, 1], [0, 2, 0, 0], [1, -1, 0, 0], [1, 1, 0, 1]])
    x = lattice.SparseTensor(c, torch.arange(5.0).unsqueeze(1))
    y = ops.crop(x, 0, 2)
    assert y.coords.tolist() == [[0, 0, 0, 0], [0, 1, 1, 1], [1, 1, 0, 1]] and y.feats[:, 0].tolist() == [0.0, 1.0, 4.0]
    y = ops.crop(x, (-1, 0, 0), (1, 1, 1))
    assert y.coords.tolist() == [[0, 0, 0, 0], [1, -1, 0, 0]]
    assert len(ops.crop(x, 1, 1)) == 0


def test_crop_equals_oracle_mask(rng):
    c = random_coords(rng, 100)
    x = lattice.SparseTensor(torch.from_numpy(c), torch.zeros(len(c), 1))
    y = ops.crop(x, (-3, -5, 0), (4, 2, 9))
    np.testing.assert_array_equal(y.coords.numpy(), c[OA.crop_mask(c, (-3, -5, 0), (4, 2, 9))])


def test_crop_rejects_hi_below_lo():
    x = lattice.SparseTensor(torch.tensor([[0, 0, 0, 0]]), torch.ones(1, 1))
    with pytest.raises(ValueError, match=r"^\[crop\] hi: expected values >= lo \(0, 0, 0\) on every axis, got \(1, -1, 1\)$"):
        ops.crop(x, 0, (1, -1, 1))


def test_crop_rejects_a_malformed_box():
    x = lattice.SparseTensor(torch.tensor([[0, 0, 0, 0]]), torch.ones(1, 1))
    with pytest.raises(ValueError, match=r"^\[crop\] lo: expected an int or 3 ints, got \(1, 2\)$"):
        ops.crop(x, (1, 2), 3)


# ---- sparse_collate and sparse_from_coordinates ------------------------------------------------


def test_sparse_collate_equals_oracle_and_keeps_gradients(rng):
    samples, ref = [], []
    for i, n in enumerate((5, 0, 7)):
        c = random_coords(rng, n, batches=1) if n else np.zeros((0, 4), dtype=np.int32)
        xyz = c[:, 1:] if i != 2 else c  # a (N, 4) sample: its batch column is ignored
        f = torch.from_numpy(rng.standard_normal((len(c), 3))).requires_grad_(True)
        samples.append((torch.from_numpy(xyz), f))
        ref.append((xyz, f.detach().numpy()))
    x = ops.sparse_collate(samples, stride=2)
    coords, feats, counts = OA.collate(ref)
    np.testing.assert_array_equal(x.coords.numpy(), coords)
    oracle.assert_close(x.feats, feats, "f64", "collate")
    assert x.batch_counts == counts == [5, 0, 7] and x.stride == (2, 2, 2)
    x.feats.sum().backward()
    assert torch.all(samples[0][1].grad == 1)


def test_sparse_collate_accepts_sparse_tensors():
    a = lattice.SparseTensor(torch.tensor([[3, 1, 1, 1]]), torch.ones(1, 2))
    x = ops.sparse_collate([a, (np.array([[0, 0, 0]]), np.zeros((1, 2), dtype=np.float32))], validate=True)
    assert x.coords.tolist() == [[0, 1, 1, 1], [1, 0, 0, 0]] and x.batch_counts == [1, 1]


def test_sparse_collate_rejects_an_empty_list():
    with pytest.raises(ValueError, match=r"^\[sparse_collate\] samples: expected at least one sample, got an empty sequence$"):
        ops.sparse_collate([])


def test_sparse_collate_rejects_a_non_sequence():
    with pytest.raises(TypeError, match=r"^\[sparse_collate\] samples: expected a sequence of samples, got Tensor$"):
        ops.sparse_collate(torch.zeros(2, 4))


def test_sparse_collate_rejects_a_malformed_sample():
    with pytest.raises(TypeError, match=r"^\[sparse_collate\] samples\[0\]: expected a \(coords, feats\) pair or a lattice.SparseTensor, got Tensor$"):
        ops.sparse_collate([torch.zeros(2, 4)])


def test_sparse_collate_rejects_coords_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"^\[sparse_collate\] samples\[0\] coords: expected shape \(N, 3\) or \(N, 4\), got \(2, 2\)$"):
        ops.sparse_collate([(torch.zeros(2, 2, dtype=torch.int32), torch.zeros(2, 1))])


def test_sparse_collate_rejects_integer_features():
    with pytest.raises(TypeError, match=r"^\[sparse_collate\] samples\[0\] feats: expected a float tensor, got torch.int64$"):
        ops.sparse_collate([(torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, 1, dtype=torch.int64))])


def test_sparse_collate_rejects_features_of_the_wrong_length():
    with pytest.raises(ValueError, match=r"^\[sparse_collate\] samples\[0\] feats: expected shape \(N=2, C\), got \(3, 1\)$"):
        ops.sparse_collate([(torch.zeros(2, 3, dtype=torch.int32), torch.zeros(3, 1))])


def test_sparse_collate_rejects_mismatched_channels():
    s0 = (torch.zeros(1, 3, dtype=torch.int32), torch.zeros(1, 2))
    s1 = (torch.zeros(1, 3, dtype=torch.int32), torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"^\[sparse_collate\] samples\[1\] feats: expected C=2 columns \(those of samples\[0\]\), got 3$"):
        ops.sparse_collate([s0, s1])


def test_sparse_collate_rejects_mismatched_dtypes():
    s0 = (torch.zeros(1, 3, dtype=torch.int32), torch.zeros(1, 2))
    s1 = (torch.zeros(1, 3, dtype=torch.int32), torch.zeros(1, 2, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"^\[sparse_collate\] samples\[1\] feats: expected torch.float32 \(the dtype of samples\[0\]\), got torch.float64$"):
        ops.sparse_collate([s0, s1])


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_sparse_from_coordinates_reduces_repeats_like_oracle(rng, reduction):
    c = random_coords(rng, 30)
    c = np.concatenate([c, c[rng.integers(0, len(c), 25)]])[rng.permutation(55)]
    f = rng.standard_normal((len(c), 4))
    x, inverse = ops.sparse_from_coordinates(torch.from_numpy(c), torch.from_numpy(f), reduction=reduction,
                                             return_inverse=True)
    u, ref, ref_inv = OA.from_coordinates(c, f, reduction)
    np.testing.assert_array_equal(x.coords.numpy(), u)
    np.testing.assert_array_equal(inverse.numpy(), ref_inv)
    oracle.assert_close(x.feats, ref, "f64", reduction)
    x.validate()


@pytest.mark.parametrize("dtype_name, dtype", [("f16", torch.float16), ("bf16", torch.bfloat16)])
def test_sparse_from_coordinates_low_precision_equals_oracle(rng, dtype_name, dtype):
    c = random_coords(rng, 20)
    c = np.concatenate([c, c])
    f = torch.from_numpy(rng.standard_normal((len(c), 3))).to(dtype)
    x = ops.sparse_from_coordinates(c, f)
    _, ref, _ = OA.from_coordinates(c, oracle.round_to_dtype(f, dtype_name))
    assert x.feats.dtype == dtype
    oracle.assert_close(x.feats, ref, dtype_name, "mean")


def test_sparse_from_coordinates_gradcheck_f64(rng):
    c = np.concatenate([random_coords(rng, 8)] * 2)
    f = torch.from_numpy(rng.standard_normal((len(c), 2))).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: ops.sparse_from_coordinates(c, v).feats, (f,))


def test_sparse_from_coordinates_rejects_an_unknown_reduction():
    with pytest.raises(ValueError, match=r"^\[sparse_from_coordinates\] reduction: expected 'mean' or 'sum', got 'max'$"):
        ops.sparse_from_coordinates(torch.zeros(1, 4, dtype=torch.int32), torch.zeros(1, 1), reduction="max")


def test_sparse_from_coordinates_rejects_integer_features():
    with pytest.raises(TypeError, match=r"^\[sparse_from_coordinates\] feats: expected a float tensor, got torch.int64$"):
        ops.sparse_from_coordinates(torch.zeros(1, 4, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int64))


def test_sparse_from_coordinates_rejects_features_of_the_wrong_length():
    with pytest.raises(ValueError, match=r"^\[sparse_from_coordinates\] feats: expected shape \(N=1, C\), got \(2, 1\)$"):
        ops.sparse_from_coordinates(torch.zeros(1, 4, dtype=torch.int32), torch.zeros(2, 1))


# ---- dense grids -------------------------------------------------------------------------------


def test_dense_equals_oracle_and_round_trips_through_from_dense(rng):
    c = random_coords(rng, 40, batches=2, extent=4, spread=2)
    f = rng.standard_normal((len(c), 3))
    counts = np.bincount(c[:, 0], minlength=3).tolist()  # an empty third batch
    x = lattice.SparseTensor(torch.from_numpy(c), torch.from_numpy(f), batch_counts=counts)
    origin = tuple(int(v) for v in c[:, 1:].min(0))
    shape = tuple(int(v) for v in c[:, 1:].max(0) - c[:, 1:].min(0) + 1)
    g = x.dense(origin=origin)
    assert tuple(g.shape) == (3, 3, *shape)
    oracle.assert_close(g, OA.to_dense(c, f, 3, shape, origin), "f64", "dense")
    y = lattice.SparseTensor.from_dense(g, origin=origin)
    rc, rf = OA.from_dense(g.numpy(), origin)
    np.testing.assert_array_equal(y.coords.numpy(), rc)
    oracle.assert_close(y.feats, rf, "f64", "from_dense")
    assert y.batch_counts == counts
    assert sorted(map(tuple, y.coords.tolist())) == sorted(map(tuple, c.tolist()))


def test_dense_hand_computed_with_explicit_shape():
    x = lattice.SparseTensor(torch.tensor([[0, 1, 0, 0], [1, 0, 1, 0]]), torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    g = x.dense((2, 2, 1))
    assert tuple(g.shape) == (2, 2, 2, 2, 1)
    assert g[0, :, 1, 0, 0].tolist() == [1.0, 2.0] and g[1, :, 0, 1, 0].tolist() == [3.0, 4.0] and float(g.sum()) == 10.0


def test_dense_and_from_dense_are_differentiable(rng):
    f = torch.from_numpy(rng.standard_normal((2, 2))).requires_grad_(True)
    x = lattice.SparseTensor(torch.tensor([[0, 1, 0, 0], [0, 0, 1, 1]]), f)
    assert torch.autograd.gradcheck(lambda v: x.replace_feats(v).dense((2, 2, 2)), (f,))
    grid = torch.zeros(1, 2, 2, 2, 2, dtype=torch.float64)
    grid[0, :, 1, 1, 0] = torch.tensor([1.0, -2.0])
    grid.requires_grad_(True)
    lattice.SparseTensor.from_dense(grid).feats.sum().backward()
    assert float(grid.grad.sum()) == 2.0 and grid.grad[0, :, 1, 1, 0].tolist() == [1.0, 1.0]


def test_dense_builds_grids_above_2_26_elements():
    """The old fixed limit (2^26 elements, below a detection BEV at batch 8-16) is gone: a
    2*1*1024*1024*33 = 69,206,016-element grid (> 2^26) is built, every voxel at its cell and
    nothing elsewhere. float16 and one channel keep it at 132 MiB (the grid is allocated once:
    index_put_ in place), so the test is cheap in CI."""
    coords = torch.tensor([[0, 0, 0, 0], [1, 1023, 1023, 32], [1, 5, 700, 17], [0, 512, 3, 31]], dtype=torch.int32)
    feats = torch.tensor([[1.0], [2.0], [3.0], [-4.0]], dtype=torch.float16)
    x = lattice.SparseTensor(coords, feats)
    g = x.dense((1024, 1024, 33))
    assert g.shape == (2, 1, 1024, 1024, 33) and g.numel() > 2**26 and g.dtype == torch.float16
    for (b, cx, cy, cz), v in zip(coords.tolist(), feats[:, 0].tolist()):
        assert float(g[b, 0, cx, cy, cz]) == v
    assert int(torch.count_nonzero(g)) == 4  # the four voxels above, nothing else


def test_dense_refusal_names_the_memory_it_would_take():
    """A grid above ``max_bytes`` (or above the memory available on its device) raises the clear
    ValueError with the element count and the bytes it would take, before any allocation."""
    x = lattice.SparseTensor(torch.tensor([[0, 0, 0, 0], [0, 511, 511, 511]]), torch.zeros(2, 1))
    with pytest.raises(ValueError, match=r"^\[dense\] shape: expected a grid of at most max_bytes=1000000 bytes "
                                         r"\(0\.00 GiB\), got 1\*1\*512\*512\*512 = 134217728 elements "
                                         r"\(0\.50 GiB of float32\)$"):
        x.dense(max_bytes=10**6)
    one = lattice.SparseTensor(torch.tensor([[0, 0, 0, 0]]), torch.zeros(1, 1))
    with pytest.raises(ValueError, match=r"^\[dense\] shape: expected a grid that fits in the memory available on cpu "
                                         r"\([0-9.]+ GiB\), got 1\*1\*1048576\*1048576\*1024 = 1125899906842624 "
                                         r"elements \(4194304\.00 GiB of float32\); crop first"):
        one.dense((2**20, 2**20, 2**10))
    with pytest.raises(ValueError, match=r"fewer than 2\^63 elements \(int64 cell indices\)"):
        one.dense((2**31 - 1, 2**31 - 1, 2**31 - 1))


def test_dense_rejects_rows_outside_the_box():
    x = lattice.SparseTensor(torch.tensor([[0, 0, 0, 0], [0, 3, 0, 0]]), torch.zeros(2, 1))
    with pytest.raises(ValueError, match=r"^\[dense\] coords: expected x, y, z within \[origin, origin \+ shape\) = \[\(0, 0, 0\), \(2, 2, 2\)\), got row 1 \(0, 3, 0, 0\)$"):
        x.dense((2, 2, 2))


def test_dense_needs_an_origin_for_negative_coordinates():
    x = lattice.SparseTensor(torch.tensor([[0, -1, 0, 0]]), torch.zeros(1, 1))
    with pytest.raises(ValueError, match=r"^\[dense\] origin: expected a corner <= every coordinate"):
        x.dense()
    assert tuple(x.dense(origin=(-1, 0, 0)).shape) == (1, 1, 1, 1, 1)


def test_dense_rejects_negative_sizes():
    x = lattice.SparseTensor(torch.tensor([[0, 0, 0, 0]]), torch.zeros(1, 1))
    with pytest.raises(ValueError, match=r"^\[dense\] shape: expected non-negative sizes, got \(1, -1, 1\)$"):
        x.dense((1, -1, 1))


def test_dense_rejects_negative_batch_ids():
    x = lattice.SparseTensor(torch.tensor([[-1, 0, 0, 0]]), torch.zeros(1, 1))
    with pytest.raises(ValueError, match=r"^\[dense\] coords: expected batch ids >= 0, got batch id -1 at row 0$"):
        x.dense()


def test_from_dense_rejects_a_grid_of_the_wrong_rank():
    with pytest.raises(ValueError, match=r"^\[from_dense\] dense: expected shape \(B, C, X, Y, Z\), got \(2, 3\)$"):
        lattice.SparseTensor.from_dense(torch.zeros(2, 3))


def test_from_dense_rejects_an_integer_grid():
    with pytest.raises(TypeError, match=r"^\[from_dense\] dense: expected a float tensor, got torch.int64$"):
        ops.from_dense(torch.zeros(1, 1, 1, 1, 1, dtype=torch.int64))


def test_from_dense_rejects_an_origin_that_overflows_int32():
    with pytest.raises(ValueError, match=r"^\[from_dense\] origin: expected origin \+ shape within int32"):
        ops.from_dense(torch.ones(1, 1, 2, 1, 1), origin=(2**31 - 1, 0, 0))


# ---- routes of prune, crop, sparse_collate, dense, from_dense --------------------------------------


def _routed_inputs(rng):
    c = random_coords(rng, 20)
    x = lattice.SparseTensor(torch.from_numpy(c), torch.from_numpy(rng.standard_normal((len(c), 2))))
    samples = [(torch.from_numpy(c[:7, 1:]), torch.ones(7, 2)), (torch.from_numpy(c[7:]), torch.ones(13, 2))]
    return x, samples


def test_explain_prune_crop_collate_dense_name_the_reference_route(rng):
    x, samples = _routed_inputs(rng)
    mask = torch.from_numpy(rng.random(len(x)) < 0.5)
    cases = [("prune", (x, mask)), ("crop", (x, (0, 0, 0), (3, 3, 3))), ("sparse_collate", (samples,)),
             ("dense", (x,)), ("from_dense", (torch.ones(2, 1, 2, 2, 2),))]
    for op, args in cases:
        e = lattice.explain(op, *args)
        assert e.chosen == "reference", op
        assert "reference" in str(e), op


def test_prune_crop_collate_dense_run_on_a_forced_reference_route(rng, monkeypatch):
    x, samples = _routed_inputs(rng)
    monkeypatch.setenv("LATTICE_FORCE_ROUTE", "coords:reference")
    assert len(ops.prune(x, torch.zeros(len(x), dtype=torch.bool))) == 0
    assert ops.crop(x, (-100, -100, -100), (100, 100, 100)).key == x.key
    assert ops.sparse_collate(samples).batch_counts == [7, 13]
    y = ops.from_dense(ops.dense(x, origin=tuple(int(v) for v in x.coords[:, 1:].min(0).values)),
                       origin=tuple(int(v) for v in x.coords[:, 1:].min(0).values))
    assert len(y) == len(x)


def test_prune_crop_collate_dense_reject_an_unknown_forced_route(rng, monkeypatch):
    x, samples = _routed_inputs(rng)
    monkeypatch.setenv("LATTICE_FORCE_ROUTE", "coords:nope")
    message = r"^\[LATTICE_FORCE_ROUTE\] route: expected a route name of coords, got 'coords:nope'$"
    calls = [lambda: ops.prune(x, torch.ones(len(x), dtype=torch.bool)),
             lambda: ops.crop(x, 0, 3),
             lambda: ops.sparse_collate(samples),
             lambda: x.dense(origin=-20),
             lambda: lattice.SparseTensor.from_dense(torch.ones(1, 1, 2, 2, 2)),
             lambda: lattice.explain("dense", x)]
    for call in calls:
        with pytest.raises(ValueError, match=message):
            call()
