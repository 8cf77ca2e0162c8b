"""Self-checks of the float64 numpy oracle on hand-computed cases.

Every expectation here is computed by hand (or by an independent dense
numpy formulation), never by calling the function under test twice.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from . import (
    Relation,
    as_triple,
    assert_close,
    conv_backward,
    conv_forward,
    floor_div,
    forward_relation,
    generative_relation,
    kernel_offsets,
    relation_dense_map,
    round_to_dtype,
    sparse_quantize,
    subm_relation,
    target_relation,
    tolerance,
    transposed_relation,
    weight_from_kcc,
    weight_to_kcc,
)


def k3(kx: int, ky: int, kz: int) -> int:
    """Row of kernel index (kx, ky, kz) in a 3x3x3 kernel."""
    return (kx * 3 + ky) * 3 + kz


def edge_set(rel: Relation) -> set[tuple[int, int, int]]:
    return set(rel.edges())


def assert_sorted_output_major(rel: Relation) -> None:
    keys = list(zip(rel.out_idx.tolist(), rel.k_idx.tolist()))
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys)


# ---------------------------------------------------------------------------
# geometry


def test_as_triple_int_and_sequence_give_three_ints() -> None:
    assert as_triple(3) == (3, 3, 3)
    assert as_triple((1, 2, 3)) == (1, 2, 3)
    assert as_triple(np.array([4, 5, 6])) == (4, 5, 6)


@pytest.mark.parametrize("bad", [(1, 2), (1, 2, 3, 4), True, (1.5, 2, 3)])
def test_as_triple_bad_value_raises(bad: object) -> None:
    with pytest.raises(ValueError):
        as_triple(bad)  # type: ignore[arg-type]


def test_floor_div_matches_python_floor_semantics() -> None:
    a = np.arange(-9, 10)
    for b in (1, 2, 3, -2, -3):
        got = floor_div(a, b)
        assert got.dtype == np.int64
        assert got.tolist() == [int(v) // b for v in a]
    assert floor_div(np.array([-1, -2, -3]), 2).tolist() == [-1, -1, -2]


def test_kernel_offsets_non_cubic_315_centered_order() -> None:
    off = kernel_offsets((3, 1, 5), 1, centered=True)
    assert off.shape == (15, 3) and off.dtype == np.int64
    assert off[0].tolist() == [-1, 0, -2]
    assert off[1].tolist() == [-1, 0, -1]  # z fastest
    assert off[5].tolist() == [0, 0, -2]  # then x
    assert off[-1].tolist() == [1, 0, 2]
    center = [r for r in range(15) if off[r].tolist() == [0, 0, 0]]
    assert center == [(1 * 1 + 0) * 5 + 2] == [7]


def test_kernel_offsets_non_cubic_315_indexed_order() -> None:
    off = kernel_offsets((3, 1, 5), 1, centered=False)
    assert off[0].tolist() == [0, 0, 0]
    assert off[1].tolist() == [0, 0, 1]
    assert off[-1].tolist() == [2, 0, 4]


def test_kernel_offsets_even_size_indexed_even_when_centered() -> None:
    off = kernel_offsets((2, 3, 4), (1, 2, 3), centered=True)
    assert off[0].tolist() == [0, -2, 0]
    assert off[-1].tolist() == [1, 2, 9]
    assert sorted(set(off[:, 0].tolist())) == [0, 1]
    assert sorted(set(off[:, 1].tolist())) == [-2, 0, 2]
    assert sorted(set(off[:, 2].tolist())) == [0, 3, 6, 9]


def test_kernel_offsets_dilation_2_scales_offsets() -> None:
    off = kernel_offsets(3, 2, centered=True)
    assert off[0].tolist() == [-2, -2, -2]
    assert off[13].tolist() == [0, 0, 0]
    assert off[26].tolist() == [2, 2, 2]
    off_t = kernel_offsets(3, 2, centered=False)
    assert off_t[26].tolist() == [4, 4, 4]


# ---------------------------------------------------------------------------
# submanifold


def test_subm_k3_three_points_on_x_line_gives_seven_exact_edges() -> None:
    coords = np.array([[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0]])
    rel = subm_relation(coords, 3)
    assert rel.out_coords.tolist() == coords.tolist()
    # (in, out, k): out 0 sees itself (center 13) and x+1 (k 22), etc.
    assert rel.edges() == [
        (0, 0, 13),
        (1, 0, 22),
        (0, 1, 4),
        (1, 1, 13),
        (2, 1, 22),
        (1, 2, 4),
        (2, 2, 13),
    ]
    for arr in (rel.in_idx, rel.out_idx, rel.k_idx):
        assert arr.dtype == np.int64


def test_subm_even_kernel_raises() -> None:
    with pytest.raises(ValueError):
        subm_relation(np.zeros((1, 4), dtype=np.int32), 2)
    with pytest.raises(ValueError):
        subm_relation(np.zeros((1, 4), dtype=np.int32), (3, 3, 2))


def test_subm_duplicate_rows_raise() -> None:
    with pytest.raises(ValueError):
        subm_relation(np.array([[0, 1, 2, 3], [0, 1, 2, 3]]), 3)


def test_subm_dilation_2_skips_neighbours_at_distance_1() -> None:
    coords = np.array([[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0]])
    rel = subm_relation(coords, 3, dilation=2)
    assert rel.edges() == [(0, 0, 13), (2, 0, 22), (1, 1, 13), (0, 2, 4), (2, 2, 13)]


def test_subm_two_batches_never_mix() -> None:
    xyz = [[0, 0, 0], [0, 0, 1], [1, 1, 1]]
    coords = np.array([[b] + p for b in (0, 1) for p in xyz])
    rel = subm_relation(coords, 3)
    # within one batch: 3 self edges, (0,0,0)-(0,0,1) both ways,
    # (0,0,1)-(1,1,1) both ways; (0,0,0)-(1,1,1) both ways => 9
    assert rel.n_edges == 18
    for i, o, _ in rel.edges():
        assert coords[i, 0] == coords[o, 0]


def test_subm_negative_and_int32_extreme_coordinates() -> None:
    big = 2**31 - 1
    coords = np.array(
        [[0, big, -(2**31), 5], [0, big - 1, -(2**31), 5], [0, -1, -1, -1]], dtype=np.int32
    )
    rel = subm_relation(coords, 3)
    # row 1 sits at x-1 of row 0: out 0 sees it through kx=0, out 1 sees row 0 through kx=2
    assert rel.edges() == [(1, 0, k3(0, 1, 1)), (0, 0, 13), (1, 1, 13), (0, 1, k3(2, 1, 1)), (2, 2, 13)]


# ---------------------------------------------------------------------------
# forward / target


def test_forward_k2_s2_cube_one_output_eight_edges() -> None:
    cube = [[0, x, y, z] for x in (0, 1) for y in (0, 1) for z in (0, 1)]
    # shuffle the input order so input row != kernel row
    order = [5, 2, 7, 0, 3, 6, 1, 4]
    coords = np.array([cube[j] for j in order])
    rel = forward_relation(coords, 2, stride=2)
    assert rel.out_coords.tolist() == [[0, 0, 0, 0]]
    assert rel.n_edges == 8
    expected_k = {i: (coords[i, 1] * 2 + coords[i, 2]) * 2 + coords[i, 3] for i in range(8)}
    assert rel.out_idx.tolist() == [0] * 8
    assert rel.k_idx.tolist() == list(range(8))
    for i, _, k in rel.edges():
        assert k == expected_k[i]


def test_forward_k3_s2_negative_coords_floor_division() -> None:
    coords = np.array([[0, -1, 0, 0], [0, -2, 0, 0], [0, -3, 0, 0]])
    rel = forward_relation(coords, 3, stride=2)
    # -1 -> -1, -2 -> -1, -3 -> -2 (floor), first-occurrence order
    assert rel.out_coords.tolist() == [[0, -1, 0, 0], [0, -2, 0, 0]]
    # out -1 covers x in {-3,-2,-1}; out -2 covers {-5,-4,-3}
    assert rel.edges() == [
        (2, 0, k3(0, 1, 1)),
        (1, 0, k3(1, 1, 1)),
        (0, 0, k3(2, 1, 1)),
        (2, 1, k3(2, 1, 1)),
    ]


def test_forward_stride1_odd_kernel_equals_subm() -> None:
    rng = np.random.default_rng(0)
    pts = {tuple(int(v) for v in rng.integers(-3, 3, size=3)) for _ in range(40)}
    coords = np.array([[0, *p] for p in sorted(pts)])
    a = forward_relation(coords, 3)
    b = subm_relation(coords, 3)
    assert a.out_coords.tolist() == b.out_coords.tolist() == coords.tolist()
    assert a.edges() == b.edges()


def test_forward_k1_s2_odd_coordinate_output_without_edges() -> None:
    # literal contract: support is floor_div(c, s); edge needs c == 2*o
    coords = np.array([[0, 1, 0, 0], [0, 2, 0, 0]])
    rel = forward_relation(coords, 1, stride=2)
    assert rel.out_coords.tolist() == [[0, 0, 0, 0], [0, 1, 0, 0]]
    assert rel.edges() == [(1, 1, 0)]


def test_forward_padding_stride1_keeps_input_rows_and_shifts_edges() -> None:
    coords = np.array([[0, 0, 0, 0], [0, 1, 0, 0]])
    rel = forward_relation(coords, 3, stride=1, padding=(1, 0, 0))
    assert rel.out_coords.tolist() == coords.tolist()
    # c_i == o + off - p, p=(1,0,0): out 0 needs c-o = off-(1,0,0) in x {-2,-1,0}
    assert rel.edges() == [(0, 0, k3(2, 1, 1)), (0, 1, k3(1, 1, 1)), (1, 1, k3(2, 1, 1))]


def test_forward_expand_one_point_k3_s1_gives_27_outputs() -> None:
    c = np.array([[2, 5, -7, 0]])
    rel = forward_relation(c, 3, stride=1, expand=True)
    assert rel.n_out == 27
    off = kernel_offsets(3, 1, centered=True)
    # candidate for kernel row k is c - off_k, in k order
    expected = [[2, 5 - o[0], -7 - o[1], 0 - o[2]] for o in off.tolist()]
    assert rel.out_coords.tolist() == expected
    assert rel.out_coords[0].tolist() == [2, 6, -6, 1]
    assert rel.out_coords[-1].tolist() == [2, 4, -8, -1]
    assert rel.edges() == [(0, k, k) for k in range(27)]


def test_forward_expand_support_matches_brute_force_window_search() -> None:
    rng = np.random.default_rng(1)
    pts = {tuple(int(v) for v in rng.integers(-4, 4, size=3)) for _ in range(15)}
    coords = np.array([[0, *p] for p in sorted(pts)] + [[1, 0, 0, 0]])
    s, p = (2, 1, 3), (1, 0, 2)
    rel = forward_relation(coords, (3, 2, 3), stride=s, padding=p, expand=True)
    off = kernel_offsets((3, 2, 3), 1, centered=True)
    inputs = {tuple(r) for r in coords.tolist()}
    brute = set()
    for b in (0, 1):
        for o in itertools.product(range(-8, 9), repeat=3):
            for d in off.tolist():
                c = (b,) + tuple(o[a] * s[a] + d[a] - p[a] for a in range(3))
                if c in inputs:
                    brute.add((b,) + o)
    got = [tuple(r) for r in rel.out_coords.tolist()]
    assert len(got) == len(set(got))
    assert set(got) == brute
    assert set(rel.out_idx.tolist()) == set(range(rel.n_out))  # every output has an edge
    assert_sorted_output_major(rel)


def test_target_relation_uses_target_rows_and_order() -> None:
    coords = np.array([[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0]])
    target = np.array([[0, 1, 0, 0], [0, 7, 7, 7], [0, 0, 0, 0], [1, 0, 0, 0]])
    rel = target_relation(coords, target, 3, stride=2)
    assert rel.out_coords.tolist() == target.tolist()
    # t=(0,1,0,0): window x in {1,2,3} -> inputs 1 (kx 0), 2 (kx 1)
    # t=(0,7,7,7): nothing; t=(0,0,0,0): x in {-1,0,1} -> inputs 0 (kx 1), 1 (kx 2)
    # t=(1,0,0,0): input 3 (kx 1) only, batch 0 rows excluded
    assert rel.edges() == [
        (1, 0, k3(0, 1, 1)),
        (2, 0, k3(1, 1, 1)),
        (0, 2, k3(1, 1, 1)),
        (1, 2, k3(2, 1, 1)),
        (3, 3, k3(1, 1, 1)),
    ]
    dense = rel.dense_map()
    assert dense.shape == (4, 27)
    assert (dense[1] == -1).all()
    assert dense[0, k3(1, 1, 1)] == 2


# ---------------------------------------------------------------------------
# transposed / generative


def test_transposed_k2_s2_one_point_gives_eight_children() -> None:
    rel = transposed_relation(np.array([[0, 1, -1, 2]]), 2, stride=2)
    expected = [
        [0, 2, -2, 4],
        [0, 2, -2, 5],
        [0, 2, -1, 4],
        [0, 2, -1, 5],
        [0, 3, -2, 4],
        [0, 3, -2, 5],
        [0, 3, -1, 4],
        [0, 3, -1, 5],
    ]
    assert rel.out_coords.tolist() == expected
    assert rel.edges() == [(0, k, k) for k in range(8)]


def test_transposed_padding_shifts_children() -> None:
    rel = transposed_relation(np.array([[0, 0, 0, 0]]), 3, stride=2, padding=1)
    assert rel.out_coords[0].tolist() == [0, -1, -1, -1]
    assert rel.out_coords[-1].tolist() == [0, 1, 1, 1]
    assert rel.n_out == 27


def test_generative_k3_s2_two_adjacent_points_deduplicates() -> None:
    coords = np.array([[0, 0, 0, 0], [0, 1, 0, 0]])
    rel = generative_relation(coords, 3, stride=2)
    # children x: {0,1,2} and {2,3,4}; y, z in {0,1,2}: 45 unique, 54 edges
    assert rel.n_out == 45
    assert rel.n_edges == 54
    first27 = [[0, x, y, z] for x in range(3) for y in range(3) for z in range(3)]
    rest = [[0, x, y, z] for x in (3, 4) for y in range(3) for z in range(3)]
    assert rel.out_coords.tolist() == first27 + rest
    # a shared child (0,2,1,1) gets one edge from each parent
    o = first27.index([0, 2, 1, 1])
    assert [(i, k) for i, oo, k in rel.edges() if oo == o] == [(1, k3(0, 1, 1)), (0, k3(2, 1, 1))]


def test_transposed_with_target_uses_target_rows() -> None:
    coords = np.array([[0, 0, 0, 0], [0, 1, 0, 0]])
    target = np.array([[0, 3, 1, 0], [0, 9, 9, 9], [0, 1, 0, 0]])
    rel = transposed_relation(coords, 2, stride=2, target=target)
    assert rel.out_coords.tolist() == target.tolist()
    # (0,3,1,0) = 2*(1,0,0) + (1,1,0); (0,1,0,0) = 2*(0,0,0) + (1,0,0)
    assert rel.edges() == [(1, 0, (1 * 2 + 1) * 2 + 0), (0, 2, (1 * 2 + 0) * 2 + 0)]


def test_transposed_to_source_is_forward_relation_reversed() -> None:
    # even kernel: forward and transposed share the indexed offsets, so the
    # transposed relation back onto the fine rows is the forward relation
    # with in/out swapped (the input-gradient relation of the contract).
    rng = np.random.default_rng(2)
    pts = {tuple(int(v) for v in rng.integers(-5, 5, size=3)) for _ in range(30)}
    fine = np.array([[int(i % 2), *p] for i, p in enumerate(sorted(pts))])
    fwd = forward_relation(fine, 2, stride=2, padding=1)
    back = transposed_relation(fwd.out_coords, 2, stride=2, padding=1, target=fine)
    assert {(o, i, k) for i, o, k in fwd.edges()} == edge_set(back)


def test_transposed_two_batches_keep_batch() -> None:
    coords = np.array([[0, 0, 0, 0], [1, 0, 0, 0]])
    rel = transposed_relation(coords, 2, stride=2)
    assert rel.n_out == 16
    assert rel.out_coords[:8, 0].tolist() == [0] * 8
    assert rel.out_coords[8:, 0].tolist() == [1] * 8
    for i, o, _ in rel.edges():
        assert coords[i, 0] == rel.out_coords[o, 0]


# ---------------------------------------------------------------------------
# empty inputs and dense map


@pytest.mark.parametrize(
    "build",
    [
        lambda c: subm_relation(c, 3),
        lambda c: forward_relation(c, 3),
        lambda c: forward_relation(c, 3, stride=2),
        lambda c: forward_relation(c, 3, stride=2, expand=True),
        lambda c: target_relation(c, c, 3, stride=2),
        lambda c: transposed_relation(c, 2, stride=2),
        lambda c: generative_relation(c, 3, stride=2),
    ],
)
def test_relation_empty_input_gives_empty_output(build) -> None:  # type: ignore[no-untyped-def]
    rel = build(np.zeros((0, 4), dtype=np.int32))
    assert rel.out_coords.shape == (0, 4) and rel.out_coords.dtype == np.int64
    for arr in (rel.in_idx, rel.out_idx, rel.k_idx):
        assert arr.shape == (0,) and arr.dtype == np.int64


def test_target_relation_empty_input_nonempty_target_has_no_edges() -> None:
    rel = target_relation(np.zeros((0, 4), dtype=np.int64), np.array([[0, 1, 1, 1]]), 3)
    assert rel.n_out == 1 and rel.n_edges == 0
    y = conv_forward(np.zeros((0, 2)), np.ones((27, 2, 3)), rel.in_idx, rel.out_idx, rel.k_idx, 1, bias=[1.0, 2.0, 3.0])
    assert y.tolist() == [[1.0, 2.0, 3.0]]


def test_relation_dense_map_fills_minus_one_and_rejects_duplicates() -> None:
    m = relation_dense_map(np.array([4, 2]), np.array([0, 1]), np.array([1, 0]), 2, 3)
    assert m.tolist() == [[-1, 4, -1], [2, -1, -1]]
    with pytest.raises(AssertionError):
        relation_dense_map(np.array([0, 1]), np.array([0, 0]), np.array([1, 1]), 1, 2)


# ---------------------------------------------------------------------------
# convolution against dense numpy volumes


def _random_sites(rng: np.random.Generator, grid: tuple[int, int, int], origin: tuple[int, int, int], n_batch: int, p: float) -> np.ndarray:
    rows = []
    for b in range(n_batch):
        mask = rng.random(grid) < p
        for x, y, z in np.argwhere(mask).tolist():
            rows.append([b, x + origin[0], y + origin[1], z + origin[2]])
    coords = np.array(rows, dtype=np.int64)
    return coords[rng.permutation(len(coords))]


def _to_dense(coords: np.ndarray, feats: np.ndarray, lo: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    vol = np.zeros(shape + (feats.shape[1],))
    for r, (b, x, y, z) in enumerate(coords.tolist()):
        vol[b, x - lo[0], y - lo[1], z - lo[2]] = feats[r]
    return vol


def test_subm_conv_matches_dense_3d_convolution_at_active_sites() -> None:
    rng = np.random.default_rng(3)
    grid, origin = (5, 6, 4), (-2, -3, 1)
    coords = _random_sites(rng, grid, origin, n_batch=2, p=0.4)
    c_in, c_out, ks = 3, 2, (3, 1, 5)
    x = rng.standard_normal((len(coords), c_in))
    w_dense = rng.standard_normal((c_out, *ks, c_in))
    bias = rng.standard_normal(c_out)

    rel = subm_relation(coords, ks)
    y = conv_forward(x, weight_to_kcc(w_dense), rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out, bias)

    # dense: zero-padded volume, cross-correlation with centered taps
    r = [k // 2 for k in ks]
    lo = np.array(origin) - np.array(r)
    shape = (2,) + tuple(g + 2 * rr for g, rr in zip(grid, r))
    vol = _to_dense(coords, x, lo, shape)
    out = np.zeros((2, *grid, c_out))
    for tx, ty, tz in itertools.product(*(range(k) for k in ks)):
        shifted = vol[:, tx : tx + grid[0], ty : ty + grid[1], tz : tz + grid[2]]
        out += shifted @ w_dense[:, tx, ty, tz, :].T
    expected = np.array(
        [out[b, xx - origin[0], yy - origin[1], zz - origin[2]] for b, xx, yy, zz in coords.tolist()]
    ) + bias
    assert_close(y, expected, "f64", "subm vs dense")


def test_strided_conv_matches_dense_strided_convolution() -> None:
    rng = np.random.default_rng(4)
    grid, origin = (7, 5, 6), (-3, -2, -4)
    coords = _random_sites(rng, grid, origin, n_batch=1, p=0.3)
    c_in, c_out = 2, 3
    x = rng.standard_normal((len(coords), c_in))
    w_dense = rng.standard_normal((c_out, 3, 3, 3, c_in))
    s, p = 2, 1
    rel = forward_relation(coords, 3, stride=s, padding=p)
    y = conv_forward(x, weight_to_kcc(w_dense), rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out)

    lo = np.array(origin) - 8
    vol = _to_dense(coords, x, lo, (1, grid[0] + 16, grid[1] + 16, grid[2] + 16))
    expected = np.zeros((rel.n_out, c_out))
    for r_o, (b, ox, oy, oz) in enumerate(rel.out_coords.tolist()):
        # window of o: c = o*s + (t - 1) - p for t in 0..2 on each axis
        base = np.array([ox, oy, oz]) * s - 1 - p - lo
        patch = vol[b, base[0] : base[0] + 3, base[1] : base[1] + 3, base[2] : base[2] + 3]
        expected[r_o] = np.einsum("xyzi,oxyzi->o", patch, w_dense)
    assert_close(y, expected, "f64", "strided vs dense")
    # support: floor(c/2) of every input
    assert {tuple(r) for r in rel.out_coords.tolist()} == {
        (b, xx // 2, yy // 2, zz // 2) for b, xx, yy, zz in coords.tolist()
    }


def test_transposed_conv_matches_dense_scatter() -> None:
    rng = np.random.default_rng(5)
    grid, origin = (3, 4, 3), (-1, 0, -2)
    coords = _random_sites(rng, grid, origin, n_batch=1, p=0.5)
    c_in, c_out, ks, s, p = 2, 2, (3, 2, 3), 2, 1
    x = rng.standard_normal((len(coords), c_in))
    w_dense = rng.standard_normal((c_out, *ks, c_in))
    rel = transposed_relation(coords, ks, stride=s, padding=p)
    y = conv_forward(x, weight_to_kcc(w_dense), rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out)

    # dense scatter: fine[c*s + t - p] += X[c] @ W_t^T, with strided slices
    lo_in = np.array(origin)
    vol_in = _to_dense(coords, x, lo_in, (1, *grid))
    lo_out = lo_in * s - p
    fine = np.zeros((1, grid[0] * s + 4, grid[1] * s + 4, grid[2] * s + 4, c_out))
    hit = np.zeros(fine.shape[:4], dtype=bool)
    active = np.zeros((1, *grid), dtype=bool)
    for b, xx, yy, zz in coords.tolist():
        active[b, xx - lo_in[0], yy - lo_in[1], zz - lo_in[2]] = True
    for tx, ty, tz in itertools.product(*(range(k) for k in ks)):
        sl = (
            slice(0, 1),
            slice(tx, tx + s * grid[0], s),
            slice(ty, ty + s * grid[1], s),
            slice(tz, tz + s * grid[2], s),
        )
        fine[sl] += vol_in @ w_dense[:, tx, ty, tz, :].T
        hit[sl] |= active
    got_support = {tuple(r) for r in rel.out_coords.tolist()}
    want_support = {
        (0, int(a + lo_out[0]), int(bb + lo_out[1]), int(c + lo_out[2])) for _, a, bb, c in np.argwhere(hit).tolist()
    }
    assert got_support == want_support
    expected = np.array(
        [fine[b, xx - lo_out[0], yy - lo_out[1], zz - lo_out[2]] for b, xx, yy, zz in rel.out_coords.tolist()]
    )
    assert_close(y, expected, "f64", "transposed vs dense")


def test_conv_kernel1_stride1_is_plain_matmul() -> None:
    rng = np.random.default_rng(6)
    coords = np.array([[0, 0, 0, 0], [0, 5, -1, 2], [1, 0, 0, 0]])
    x = rng.standard_normal((3, 4))
    w = rng.standard_normal((1, 4, 5))
    rel = forward_relation(coords, 1)
    y = conv_forward(x, w, rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out)
    assert_close(y, x @ w[0], "f64")


def test_conv_backward_matches_central_finite_differences() -> None:
    rng = np.random.default_rng(7)
    coords = np.array([[0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [0, -1, 0, 1]])
    rel = forward_relation(coords, 3, stride=2, padding=1, expand=True)
    x = rng.standard_normal((4, 2))
    w = rng.standard_normal((27, 2, 3))
    bias = rng.standard_normal(3)
    dy = rng.standard_normal((rel.n_out, 3))

    def loss(xx: np.ndarray, ww: np.ndarray, bb: np.ndarray) -> float:
        y = conv_forward(xx, ww, rel.in_idx, rel.out_idx, rel.k_idx, rel.n_out, bb)
        return float(np.sum(y * dy))

    def numeric(arr: np.ndarray, which: int) -> np.ndarray:
        g = np.zeros_like(arr)
        h = 1e-5
        for idx in np.ndindex(arr.shape):
            args = [x.copy(), w.copy(), bias.copy()]
            args[which][idx] += h
            up = loss(*args)
            args[which][idx] -= 2 * h
            g[idx] = (up - loss(*args)) / (2 * h)
        return g

    dx, dw, db = conv_backward(x, w, dy, rel.in_idx, rel.out_idx, rel.k_idx)
    assert dx.shape == x.shape and dw.shape == w.shape and db.shape == (3,)
    assert_close(dx, numeric(x, 0), "f64", "dx", rtol=1e-7)
    assert_close(dw, numeric(w, 1), "f64", "dw", rtol=1e-7)
    assert_close(db, numeric(bias, 2), "f64", "db", rtol=1e-7)
    assert np.abs(dw).sum() > 0  # the case really exercises edges


def test_weight_kcc_layout_element_mapping_and_roundtrip() -> None:
    rng = np.random.default_rng(8)
    w = rng.standard_normal((4, 3, 1, 5, 2))  # (C_out, Kx, Ky, Kz, C_in)
    wk = weight_to_kcc(w)
    assert wk.shape == (15, 2, 4)
    for co, kx, ky, kz, ci in itertools.product(range(4), range(3), range(1), range(5), range(2)):
        assert wk[(kx * 1 + ky) * 5 + kz, ci, co] == w[co, kx, ky, kz, ci]
    assert np.array_equal(weight_from_kcc(wk, (3, 1, 5)), w)


# ---------------------------------------------------------------------------
# dtype rounding and tolerances


def test_round_bf16_known_values() -> None:
    vals = np.array(
        [
            1.0,
            1 + 2**-9,  # quarter ulp -> down
            1 + 3 * 2**-9,  # three quarter ulp -> up
            1 + 2**-8,  # tie, even mantissa 0 -> down
            1 + 3 * 2**-8,  # tie, odd mantissa 1 -> up to 2
            -(1 + 3 * 2**-9),
            3.0,
            0.0,
        ]
    )
    want = [1.0, 1.0, 1 + 2**-7, 1.0, 1 + 2**-6, -(1 + 2**-7), 3.0, 0.0]
    assert round_to_dtype(vals, "bf16").tolist() == want


def test_round_bf16_overflow_inf_and_nan() -> None:
    max_bf16 = (2 - 2**-7) * 2.0**127
    got = round_to_dtype(np.array([max_bf16, np.finfo(np.float32).max, np.inf, np.nan]), "bf16")
    assert got[0] == max_bf16
    assert got[1] == np.inf and got[2] == np.inf and np.isnan(got[3])


def test_round_bf16_matches_nearest_even_by_enumeration() -> None:
    rng = np.random.default_rng(9)
    vals = (rng.standard_normal(2000) * 10.0 ** rng.integers(-20, 20, 2000)).astype(np.float32)
    got = round_to_dtype(vals, "bf16")
    for v, g in zip(vals.astype(np.float64).tolist(), got.tolist()):
        e = np.floor(np.log2(abs(v)))
        ulp = 2.0 ** (e - 7)
        down = np.floor(v / ulp) * ulp
        up = down + ulp
        if v - down < up - v:
            want = down
        elif v - down > up - v:
            want = up
        else:
            want = down if int(round(down / ulp)) % 2 == 0 else up
        assert g == want, (v, g, want)


def test_round_f16_f32_known_values() -> None:
    got = round_to_dtype(np.array([1 + 2**-11, 1 + 3 * 2**-11, 65520.0, 1.0 / 3.0]), "f16")
    assert got[:3].tolist() == [1.0, 1 + 2**-9, np.inf]
    assert got[3] == float(np.float16(1.0 / 3.0))
    assert round_to_dtype(np.array([1 + 2**-30]), "f32").tolist() == [1.0]
    assert round_to_dtype(np.array([1 + 2**-30]), "f64").tolist() == [1 + 2**-30]
    with pytest.raises(ValueError):
        round_to_dtype(np.array([1.0]), "int8")


def test_tolerance_table_matches_contract() -> None:
    assert [tolerance(d) for d in ("f64", "f32", "tf32", "f16", "bf16")] == [1e-12, 1e-5, 5e-4, 2e-3, 1e-2]
    with pytest.raises(ValueError):
        tolerance("f8")


def test_assert_close_passes_within_and_fails_outside_tolerance() -> None:
    e = np.array([[1.0, -2.0], [100.0, 0.0]])
    assert_close(e * (1 + 0.5e-5), e, "f32")
    with pytest.raises(AssertionError, match=r"worst at \(1, 0\)"):
        assert_close(e + np.array([[0, 0], [0.01, 0]]), e, "f32", "y")
    # a zero element is judged against the mean magnitude (25.75)
    assert_close(e + np.array([[0, 0], [0, 1e-4]]), e, "f32")
    with pytest.raises(AssertionError, match="ratio"):
        assert_close(e + np.array([[0, 0], [0, 1e-3]]), e, "f32")


def test_assert_close_all_zero_reference_uses_absolute_floor() -> None:
    z = np.zeros(5)
    assert_close(z + 5e-9, z, "f32")  # 1e-5 * 1e-3 = 1e-8 allowed
    with pytest.raises(AssertionError):
        assert_close(z + 1e-7, z, "f32")


def test_assert_close_shape_mismatch_empty_and_nonfinite() -> None:
    with pytest.raises(AssertionError, match="shape"):
        assert_close(np.zeros((2, 3)), np.zeros((3, 2)), "f64")
    with pytest.raises(AssertionError, match="shape"):
        assert_close(np.zeros((0, 3)), np.zeros((0, 2)), "f64")
    assert_close(np.zeros((0, 3)), np.zeros((0, 3)), "f64")
    assert_close(np.array([np.nan, np.inf, 1.0]), np.array([np.nan, np.inf, 1.0]), "f64")
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close(np.array([np.nan, 1.0]), np.array([0.0, 1.0]), "f64")
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close(np.array([-np.inf]), np.array([np.inf]), "f64")


# ---------------------------------------------------------------------------
# quantize


def test_sparse_quantize_floor_first_occurrence_inverse_counts() -> None:
    pts = np.array(
        [
            [0.5, 0.5, 0.5],
            [-0.1, 0.0, 0.0],
            [0.9, 0.2, 0.99],
            [-1.0, 0.0, 0.0],
            [-1.0001, 0.0, 0.0],
        ]
    )
    coords, inv, counts = sparse_quantize(pts, 1.0)
    assert coords.tolist() == [[0, 0, 0, 0], [0, -1, 0, 0], [0, -2, 0, 0]]
    assert inv.tolist() == [0, 1, 0, 1, 2]
    assert counts.tolist() == [2, 2, 1]
    assert coords.dtype == inv.dtype == counts.dtype == np.int64


def test_sparse_quantize_anisotropic_origin_and_batches() -> None:
    pts = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [2.9, -0.5, 3.0]])
    coords, inv, counts = sparse_quantize(
        pts, (0.5, 2.0, 1.0), batch_indices=np.array([1, 0, 1]), origin=(0.0, 1.0, -1.0)
    )
    # (p - o)/v: (2, 0, 2), (2, 0, 2), (5.8, -0.75, 4) -> floor
    assert coords.tolist() == [[1, 2, 0, 2], [0, 2, 0, 2], [1, 5, -1, 4]]
    assert inv.tolist() == [0, 1, 2]
    assert counts.tolist() == [1, 1, 1]


def test_sparse_quantize_nan_or_inf_raises() -> None:
    with pytest.raises(ValueError):
        sparse_quantize(np.array([[0.0, np.nan, 0.0]]), 1.0)
    with pytest.raises(ValueError):
        sparse_quantize(np.array([[0.0, 0.0, -np.inf]]), 1.0)
    with pytest.raises(ValueError):
        sparse_quantize(np.array([[0.0, 0.0, 0.0]]), 0.0)


def test_sparse_quantize_empty_points() -> None:
    coords, inv, counts = sparse_quantize(np.zeros((0, 3)), 0.1)
    assert coords.shape == (0, 4) and inv.shape == (0,) and counts.shape == (0,)
