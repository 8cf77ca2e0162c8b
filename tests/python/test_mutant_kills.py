"""Tests written to kill mutants of tests/mutants/ that the rest of the suite let survive.

Each test names the mutant(s) it kills (`make mutants ONLY=<name>` shows it failing on the
mutant and docs/testing.md has the last report). They check results against the float64 numpy
oracle (tests/oracle) or exact hand-computed values, never against lattice itself:

* TestRelationCacheKey: one tensor, several convs whose specs differ in one relation-key field
  (padding, expand, target); every result must equal the oracle and the cache must hold one
  relation per distinct spec (kills cache_key_padding, cache_key_expand, cache_key_target).
* test_pool_sum_half_rounds_once: integer inputs whose f32 sum is exact and whose f16 / bf16
  running sum would lose the small terms (kills pool_round_each_add).
* test_conv_large_offset_segments_match_reference: offsets with more than 256 edges (one full
  GEMM row tile plus a partial one) against the oracle (kills conv_ggs_tile_off_by_one).
* TestValidationBranches: `[op] argument:` errors of validation branches in src/ops reached
  through the core bindings (kills validation_conv_grad_out_dtype, validation_conv_feats_rows,
  validation_voxel_size_zero, validation_point_feats_rows).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lattice
import oracle
from conftest import random_coords
from lattice._core import core, to_core


def sparse(coords: np.ndarray, feats: torch.Tensor, stride=1) -> lattice.SparseTensor:
    return lattice.SparseTensor(torch.from_numpy(np.ascontiguousarray(coords, dtype=np.int32)), feats, stride=stride)


def conv_oracle(coords: np.ndarray, x: np.ndarray, w: np.ndarray, **kw) -> tuple[np.ndarray, np.ndarray]:
    """(output coords, output features) of conv3d by the oracle (its own relation)."""
    target = kw.pop("target", None)
    if target is None:
        rel = oracle.forward_relation(coords, **kw)
    else:
        rel = oracle.target_relation(coords, target, **kw)
    y = oracle.conv_forward(x, w, rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out)
    return rel.out_coords.astype(np.int32), y


class TestRelationCacheKey:
    """Reusing one SparseTensor across specs: a cache keyed on too few fields returns the first
    relation for the second call. Every oracle test elsewhere builds a fresh tensor per call, so
    only tests like these exercise a cache hit with a different spec."""

    def _setup(self, rng):
        coords = random_coords(rng, 60, batches=2)
        x_np = rng.standard_normal((coords.shape[0], 3))
        x = sparse(coords, torch.from_numpy(x_np))
        return coords, x_np, x

    def test_padding_is_part_of_the_key(self, rng):
        # cache_key_padding: conv3d(stride=2, padding=1) after padding=0 on the same tensor.
        coords, x_np, x = self._setup(rng)
        w_np = rng.standard_normal((27, 3, 2))
        w = torch.from_numpy(w_np)
        for padding in (0, 1, 0, 1):
            y = lattice.ops.conv3d(x, w, kernel_size=3, stride=2, padding=padding)
            ref_c, ref_y = conv_oracle(coords, x_np, w_np, kernel_size=3, stride=2, padding=padding)
            np.testing.assert_array_equal(y.coords.numpy(), ref_c)
            oracle.assert_close(y.feats, ref_y, "f64", f"conv3d padding={padding} on a reused tensor")
        assert x._cs.cached_relation_count == 2, "one cached relation per distinct padding"

    def test_expand_is_part_of_the_key(self, rng):
        # cache_key_expand: expand=True after expand=False returns the first call's rows.
        coords, x_np, x = self._setup(rng)
        w_np = rng.standard_normal((8, 3, 2))
        w = torch.from_numpy(w_np)
        sizes = set()
        for expand in (False, True, False):
            y = lattice.ops.conv3d(x, w, kernel_size=2, stride=1, expand=expand)
            ref_c, ref_y = conv_oracle(coords, x_np, w_np, kernel_size=2, stride=1, expand=expand)
            np.testing.assert_array_equal(y.coords.numpy(), ref_c)
            oracle.assert_close(y.feats, ref_y, "f64", f"conv3d expand={expand} on a reused tensor")
            sizes.add(ref_c.shape[0])
        assert len(sizes) == 2, "the two specs must give different supports, else the test proves nothing"
        assert x._cs.cached_relation_count == 2

    def test_target_is_part_of_the_key(self, rng):
        # cache_key_target: a conv onto a second target reuses the first target's edges.
        coords, x_np, x = self._setup(rng)
        w_np = rng.standard_normal((8, 3, 2))
        w = torch.from_numpy(w_np)
        down = oracle.forward_relation(coords, 2, 2).out_coords.astype(np.int32)
        targets = [down[::2], down[1::2]]
        for t in targets + targets:
            tt = sparse(t, torch.zeros(t.shape[0], 1, dtype=torch.float64), stride=2)
            y = lattice.ops.conv3d(x, w, kernel_size=2, stride=2, coordinates=tt)
            _, ref_y = conv_oracle(coords, x_np, w_np, kernel_size=2, stride=2, target=t)
            np.testing.assert_array_equal(y.coords.numpy(), t)
            oracle.assert_close(y.feats, ref_y, "f64", "conv3d onto a target on a reused tensor")


@pytest.mark.parametrize("route", ["reference", "csr_reduce"])
@pytest.mark.parametrize("mode", ["sum", "avg"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_pool_sum_half_rounds_once(dtype, mode, route):
    """Kills pool_round_each_add. One 2x2x2 window per batch holding a big value first and seven
    ones: in f32 the sum is exact (e.g. 2048 + 7 = 2055 for f16), rounded once to the storage
    dtype it is 2056; rounding the running sum after every add keeps 2048 (2048 + 1 rounds back,
    ties to even). Expected values are the exact sum rounded once, compared element-wise, exactly."""
    big = 2048.0 if dtype == torch.float16 else 256.0
    block = np.stack(np.meshgrid(range(2), range(2), range(2), indexing="ij"), -1).reshape(-1, 3)
    rows, vals = [], []
    for b in range(2):
        for j, xyz in enumerate(block):
            rows.append([b, *xyz])
            vals.append([big if j == 0 else 1.0, (big if j == 0 else 1.0) * (b + 1)])
    coords = np.array(rows, dtype=np.int32)
    x = sparse(coords, torch.tensor(vals, dtype=dtype))
    pool = lattice.ops.sum_pool3d if mode == "sum" else lattice.ops.avg_pool3d
    y = pool(x, 2, 2, route=route)
    exact = np.array(vals, dtype=np.float64).reshape(2, 8, 2).sum(axis=1)
    if mode == "avg":
        exact = exact / 8.0
    expected = torch.from_numpy(exact).to(dtype)  # one rounding of the exact value
    assert y.feats.dtype == dtype
    assert torch.equal(y.feats, expected), f"{mode} {route}: got {y.feats.tolist()}, expected {expected.tolist()}"


@pytest.mark.parametrize("route", ["gather_gemm_scatter", "reference"])
def test_conv_large_offset_segments_match_reference(rng, route):
    """Kills conv_ggs_tile_off_by_one. A dense 9x9x9 block (729 rows): every offset of a subm
    k3 has 512 to 729 edges, so each offset spans full 256-row GEMM tiles (and most a partial one);
    a tile end one short drops rows 255, 511, ... Forward and feature gradient vs the oracle."""
    g = np.stack(np.meshgrid(range(9), range(9), range(9), indexing="ij"), -1).reshape(-1, 3)
    coords = np.concatenate([np.zeros((g.shape[0], 1), np.int64), g], 1).astype(np.int32)
    x_np = rng.standard_normal((coords.shape[0], 4))
    w_np = rng.standard_normal((27, 4, 3))
    feats = torch.from_numpy(x_np).requires_grad_()
    y = lattice.ops.subm_conv3d(sparse(coords, feats), torch.from_numpy(w_np), kernel_size=3, route=route)
    rel = oracle.subm_relation(coords, 3)
    assert np.bincount(rel.k_idx).min() > 256  # 512 .. 729 edges: full tiles and partial ones
    oracle.assert_close(y.feats, oracle.conv_forward(x_np, w_np, rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out),
                        "f64", f"{route} forward")
    dy = rng.standard_normal(tuple(y.feats.shape))
    (dx,) = torch.autograd.grad(y.feats, [feats], torch.from_numpy(dy))
    ref_dx, _, _ = oracle.conv_backward(x_np, w_np, dy, rel.in_idx, rel.out_idx, rel.k_idx)
    oracle.assert_close(dx, ref_dx, "f64", f"{route} feats grad")


class TestValidationBranches:
    """Validation branches of src/ops reached directly through the core (the Python front end
    checks some of the same things first, which hides a missing C++ check)."""

    def _plan(self, rng):
        coords = random_coords(rng, 30, batches=1)
        x = sparse(coords, torch.zeros(coords.shape[0], 3))
        plan = lattice.ops.conv.plan("conv3d", "forward", x, torch.zeros(27, 3, 2), kernel_size=3)
        return x, plan

    def test_conv_backward_rejects_grad_out_of_another_dtype(self, rng):
        # validation_conv_grad_out_dtype (src/ops/conv.cpp conv_backward).
        x, plan = self._plan(rng)
        w = torch.zeros(27, 3, 2)
        dy = torch.zeros(plan.relation.n_out, 2, dtype=torch.float64)
        with pytest.raises(TypeError, match=r"^\[conv3d\] grad_out: expected float32"):
            core.conv_backward(plan, to_core(x.feats), to_core(w), to_core(dy), True, True, False)

    def test_conv_forward_rejects_feats_with_other_row_count(self, rng):
        # validation_conv_feats_rows (src/ops/conv.cpp check_weight).
        x, plan = self._plan(rng)
        n = plan.relation.n_in
        feats = torch.zeros(n + 5, 3)
        with pytest.raises(ValueError, match=rf"^\[conv3d\] feats: expected shape \(N_in={n}, C_in\)"):
            core.conv_forward(plan, to_core(feats), to_core(torch.zeros(27, 3, 2)), None)

    def test_zero_voxel_size_is_rejected(self):
        # validation_voxel_size_zero (src/ops/quantize.cpp check_grid).
        points = torch.rand(10, 3)
        with pytest.raises(ValueError, match=r"\[sparse_quantize\] voxel_size: expected positive finite sizes"):
            lattice.ops.sparse_quantize(points, voxel_size=(0.1, 0.0, 0.1))

    def test_devoxelize_rejects_voxel_feats_with_other_row_count(self):
        # validation_point_feats_rows (src/ops/point_voxel.cpp check_feats).
        points = torch.rand(20, 3, dtype=torch.float64)
        coords = lattice.ops.sparse_quantize(points, voxel_size=0.5)[0]
        voxels = sparse(coords.numpy(), torch.zeros(coords.shape[0], 2, dtype=torch.float64))
        m = lattice.ops.build_point_voxel_map(points, voxels, voxel_size=0.5, mode="nearest")
        bad = torch.zeros(coords.shape[0] + 3, 2, dtype=torch.float64)
        with pytest.raises(ValueError, match=r"^\[devoxelize\] \w+: expected shape"):
            core.devoxelize_forward(m._core, voxels._cs, to_core(bad), None)
