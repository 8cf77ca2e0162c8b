"""sparse_quantize vs the float64 numpy oracle: unique voxels in first-occurrence order, the
point -> voxel inverse and the counts (SEMANTICS.md "Point <-> voxel")."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lattice
import oracle


def _check(points, voxel_size, batch=None, origin=0.0):
    got = lattice.ops.sparse_quantize(points, voxel_size, batch, origin=origin)
    pts = points.numpy() if isinstance(points, torch.Tensor) else points
    b = batch.numpy() if isinstance(batch, torch.Tensor) else batch
    ref = oracle.sparse_quantize(pts, voxel_size, b, origin=origin)
    coords, inverse, counts = got
    assert coords.dtype == torch.int32 and inverse.dtype == torch.int64 and counts.dtype == torch.int64
    np.testing.assert_array_equal(coords.numpy(), ref[0], err_msg="coords")
    np.testing.assert_array_equal(inverse.numpy(), ref[1], err_msg="inverse")
    np.testing.assert_array_equal(counts.numpy(), ref[2], err_msg="counts")
    return got


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("voxel_size", [0.1, 0.25, (0.1, 0.2, 0.3)], ids=["0.1", "0.25", "per_axis"])
def test_sparse_quantize_random_points_equal_oracle(rng, dtype, voxel_size):
    p = torch.from_numpy(rng.standard_normal((400, 3)) * 0.4).to(dtype)
    coords, inverse, counts = _check(p, voxel_size)
    assert (coords[:, 1:] < 0).any(), "no negative voxel exercised"
    assert counts.max() > 1, "no voxel with several points exercised"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sparse_quantize_grid_aligned_points_floor_like_float64_oracle(rng, dtype):
    # points exactly on (or a rounding away from) voxel boundaries: p = i * 0.1
    p = (rng.integers(-40, 40, size=(600, 3)) * 0.1).astype(dtype)
    _check(p, 0.1)
    _check(p, (0.1, 0.3, 0.7), origin=(0.05, -0.1, 0.2))


def test_sparse_quantize_batch_indices_are_part_of_the_key(rng):
    p = torch.from_numpy(rng.standard_normal((300, 3)))
    b = torch.from_numpy(rng.integers(0, 4, 300))
    coords, inverse, counts = _check(p, 0.5, b)
    assert set(coords[:, 0].tolist()) == {0, 1, 2, 3}
    _check(p, 0.5, b.to(torch.int32))


def test_sparse_quantize_origin_shifts_before_dividing(rng):
    p = torch.from_numpy(rng.uniform(-3, 3, size=(200, 3)))
    _check(p, (0.4, 0.5, 0.6), origin=(0.1, -0.2, 0.3))
    _check(p, 0.5, origin=-0.25)


def test_sparse_quantize_numpy_input_equals_oracle(rng):
    p = rng.standard_normal((100, 3)).astype(np.float32)
    b = rng.integers(0, 2, 100)
    coords, _, _ = _check(p, 0.3, b)
    assert isinstance(coords, torch.Tensor)


def test_sparse_quantize_non_contiguous_points_equal_oracle(rng):
    base = torch.from_numpy(rng.standard_normal((80, 6)))
    _check(base[:, ::2], 0.4)
    _check(base.t().contiguous().t()[:, :3], 0.4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparse_quantize_empty_input_gives_empty_outputs(dtype):
    coords, inverse, counts = lattice.ops.sparse_quantize(torch.zeros(0, 3, dtype=dtype), 1.0)
    assert tuple(coords.shape) == (0, 4) and coords.dtype == torch.int32
    assert tuple(inverse.shape) == (0,) and tuple(counts.shape) == (0,)
    coords, inverse, counts = lattice.ops.sparse_quantize(np.zeros((0, 3)), 1.0, np.zeros(0, np.int64))
    assert tuple(coords.shape) == (0, 4)


def test_sparse_quantize_hand_computed_first_occurrence_inverse_counts():
    p = torch.tensor([[0.5, 0.5, 0.5], [-0.5, 0.0, 0.0], [0.9, 0.1, 0.2], [-0.0, -1e-9, 2.0], [-0.4, 0.9, 0.9]],
                     dtype=torch.float64)
    coords, inverse, counts = lattice.ops.sparse_quantize(p, 1.0)
    assert coords.tolist() == [[0, 0, 0, 0], [0, -1, 0, 0], [0, 0, -1, 2]]
    assert inverse.tolist() == [0, 1, 0, 2, 1]
    assert counts.tolist() == [2, 2, 1]


def test_sparse_quantize_output_builds_a_valid_sparse_tensor(rng):
    p = torch.from_numpy(rng.standard_normal((120, 3)))
    coords, inverse, counts = lattice.ops.sparse_quantize(p, 0.5)
    feats = torch.zeros(coords.shape[0], 3, dtype=torch.float64).index_add_(0, inverse, p) / counts[:, None]
    x = lattice.SparseTensor(coords, feats, validate=True)
    assert len(x) == int(counts.numel()) and int(counts.sum()) == 120


# ---- drop_invalid -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparse_quantize_drop_invalid_returns_kept_mask_and_equals_oracle_on_kept_points(rng, dtype):
    p = torch.from_numpy(rng.standard_normal((300, 3))).to(dtype)
    bad = torch.from_numpy(rng.choice(300, 40, replace=False))
    p[bad[:15], 0] = float("nan")
    p[bad[15:30], 1] = float("inf")
    p[bad[30:], 2] = -float("inf")
    b = torch.from_numpy(rng.integers(0, 3, 300))
    coords, inverse, counts, kept = lattice.ops.sparse_quantize(p, (0.3, 0.4, 0.5), b, origin=0.1, drop_invalid=True)
    assert kept.dtype == torch.bool and tuple(kept.shape) == (300,)
    assert not kept[bad].any() and int(kept.sum()) == 260
    ref = oracle.sparse_quantize(p.numpy(), (0.3, 0.4, 0.5), b.numpy(), origin=0.1, drop_invalid=True)
    np.testing.assert_array_equal(kept.numpy(), ref[3])
    np.testing.assert_array_equal(coords.numpy(), ref[0])
    np.testing.assert_array_equal(inverse.numpy(), ref[1])
    np.testing.assert_array_equal(counts.numpy(), ref[2])
    # the same as quantizing the kept points alone
    alone = lattice.ops.sparse_quantize(p[kept], (0.3, 0.4, 0.5), b[kept], origin=0.1)
    assert all(torch.equal(x, y) for x, y in zip(alone, (coords, inverse, counts)))


def test_sparse_quantize_drop_invalid_without_bad_points_keeps_every_point(rng):
    p = torch.from_numpy(rng.standard_normal((50, 3)))
    coords, inverse, counts, kept = lattice.ops.sparse_quantize(p, 0.5, drop_invalid=True)
    assert kept.all()
    assert all(torch.equal(x, y) for x, y in zip(lattice.ops.sparse_quantize(p, 0.5), (coords, inverse, counts)))


def test_sparse_quantize_drop_invalid_all_points_bad_gives_empty_outputs():
    coords, inverse, counts, kept = lattice.ops.sparse_quantize(torch.full((3, 3), float("nan")), 1.0, drop_invalid=True)
    assert tuple(coords.shape) == (0, 4) and inverse.numel() == 0 and counts.numel() == 0
    assert kept.tolist() == [False, False, False]


def test_sparse_quantize_non_finite_error_names_row_and_suggests_drop_invalid():
    p = torch.zeros(4, 3)
    p[2, 1] = float("nan")
    with pytest.raises(ValueError, match=r"^\[sparse_quantize\] points: expected finite values \(no NaN or inf\), "
                                         r"got a non-finite value at row 2 \(drop_invalid=True drops such points\)$"):
        lattice.ops.sparse_quantize(p, 1.0)


def test_sparse_quantize_drop_invalid_still_raises_for_voxel_index_outside_int32():
    p = torch.tensor([[float("nan"), 0, 0], [3e9, 0.0, 0.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^\[sparse_quantize\] points: expected voxel indices within int32 .* row 1"):
        lattice.ops.sparse_quantize(p, 1.0, drop_invalid=True)


def test_sparse_quantize_drop_invalid_of_wrong_type_raises_type_error():
    with pytest.raises(TypeError, match=r"^\[sparse_quantize\] drop_invalid: expected a bool, got str"):
        lattice.ops.sparse_quantize(torch.zeros(2, 3), 1.0, drop_invalid="yes")


def test_sparse_quantize_forced_reference_route_equals_default(rng):
    p = torch.from_numpy(rng.standard_normal((100, 3)))
    a = lattice.ops.sparse_quantize(p, 0.3)
    b = lattice.ops.sparse_quantize(p, 0.3, route="reference")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
