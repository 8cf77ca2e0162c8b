"""Issue 18 item 1: the inputs that used to give a silently wrong or confusing answer, each with
its defined behaviour (docs/input_rules.md).

| input | behaviour now (tested below) |
|---|---|
| duplicate rows into ``dense()``, global pooling, ``sparse_collate`` | ValueError naming the first repeated row, its coordinate and the row it repeats |
| ``build_point_voxel_map`` with a voxel_size the voxels were not built with | ValueError (mismatch rule), unless ``allow_mismatch=True`` |
| LAS / PLY / PCD header text that is not UTF-8 | read as Latin-1; binary values unaffected |
| ``BatchNorm(8)`` on 4 channels | ``[BatchNorm] input: expected ... C=8 ...`` |
| negative batch ids | one rule and one message: ``validate=True`` / ``x.validate()`` and every op that reads batch ids |
| ``ConvTranspose3d`` output without ``coordinates=`` concatenated with the skip | the ``[cat]`` error names the cause and the fix |

Each error test also checks that the valid neighbour of the bad input gives the float64 oracle's
answer, so a check that rejected everything would fail here too.
"""
from __future__ import annotations

import re
import struct

import numpy as np
import pytest
import torch

import lattice
import lattice.io as lio
import lattice.nn as lnn
import oracle
from lattice import ops
from oracle import algebra as algebra_oracle
from oracle import features as features_oracle
from oracle import point_voxel as pv_oracle
from oracle import pool as pool_oracle

import io_samples


def _coords(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32)


# ---- duplicates ---------------------------------------------------------------------------------

DUP = [[0, 1, 2, 3], [0, 0, 0, 0], [1, 5, 5, 5], [0, 1, 2, 3], [0, 0, 0, 0]]  # row 3 repeats row 0


def test_dense_rejects_duplicate_rows_naming_the_first_repeat():
    """dense() used to keep the last of two rows of one cell (10.0 instead of an error)."""
    x = lattice.SparseTensor(_coords(DUP), torch.arange(5, dtype=torch.float64)[:, None] + 1)
    with pytest.raises(ValueError, match=r"^\[dense\] coords: expected unique rows, got row 3 \(0, 1, 2, 3\) "
                                         r"equal to row 0$"):
        x.dense()
    # the unique neighbour gives the oracle's grid
    u = lattice.SparseTensor(_coords(DUP[:3]), torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64))
    np.testing.assert_array_equal(u.dense().numpy(),
                                  algebra_oracle.to_dense(DUP[:3], [[1.0], [2.0], [3.0]], 2, (6, 6, 6)))


@pytest.mark.parametrize("mode", ["sum", "avg", "max"])
def test_global_pooling_rejects_duplicate_rows(mode):
    """global_sum_pool used to add both copies of a repeated row."""
    op = getattr(ops, f"global_{mode}_pool")
    x = lattice.SparseTensor(_coords(DUP), torch.ones(5, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=rf"^\[global_{mode}_pool\] coords: expected unique rows, got row 3 "
                                         r"\(0, 1, 2, 3\) equal to row 0$"):
        op(x)
    f = torch.tensor([[1.0, -2.0], [3.0, 4.0], [5.0, 0.5]], dtype=torch.float64)
    got = op(lattice.SparseTensor(_coords(DUP[:3]), f))
    want, _ = pool_oracle.global_pool(np.array(DUP[:3]), f.numpy(), mode)
    oracle.assert_close(got, want, "f64", f"global_{mode}_pool")


def test_global_pool_duplicate_check_reuses_the_index_of_a_convolved_tensor():
    """The check is the coordinate index: a tensor that a convolution has indexed is not indexed
    again (the relation cache count is unchanged and the pool still answers)."""
    rng = np.random.default_rng(0)
    c = np.unique(rng.integers(0, 6, (40, 4)) * [0, 1, 1, 1], axis=0).astype(np.int32)
    x = lattice.SparseTensor(torch.from_numpy(c), torch.randn(len(c), 3, dtype=torch.float64))
    y = ops.subm_conv3d(x, torch.randn(3, 3, 3, 3, 3, dtype=torch.float64))
    before = y._cs.cached_relation_count
    got = ops.global_sum_pool(y)
    assert y._cs.cached_relation_count == before
    oracle.assert_close(got, y.feats.detach().numpy().sum(0, keepdims=True), "f64", "global_sum_pool")


def test_sparse_collate_rejects_a_repeated_row_naming_the_sample():
    a = (_coords([[0, 0, 0], [1, 1, 1]]), torch.ones(2, 1))
    b = (_coords([[2, 2, 2], [0, 0, 0], [3, 3, 3], [2, 2, 2]]), torch.ones(4, 1))
    with pytest.raises(ValueError, match=r"^\[sparse_collate\] samples\[1\] coords: expected unique rows within a "
                                         r"sample, got row 3 \(2, 2, 2\) equal to row 0 \(merge repeats first"):
        ops.sparse_collate([a, b])
    # the same row in two samples is fine (different batch ids), and the result is the oracle's
    b_ok = (b[0][:3], b[1][:3])
    x = ops.sparse_collate([a, b_ok])
    want_c, want_f, want_n = algebra_oracle.collate([(a[0].numpy(), a[1].numpy()), (b_ok[0].numpy(), b_ok[1].numpy())])
    np.testing.assert_array_equal(x.coords.numpy(), want_c)
    np.testing.assert_array_equal(x.feats.numpy(), want_f)
    assert x.batch_counts == want_n


def test_sparse_collate_reports_the_first_repeat_of_a_sparse_tensor_sample():
    s = lattice.SparseTensor(_coords([[4, 1, 1, 1], [4, 2, 2, 2], [4, 1, 1, 1]]), torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"^\[sparse_collate\] samples\[0\] coords: .* got row 2 \(1, 1, 1\) "
                                         r"equal to row 0"):
        ops.sparse_collate([s])


# ---- inputs written after the call --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_writing_into_the_coordinates_after_construction_changes_nothing(kind):
    """The coordinate index and relations are cached on the tensor; the tensor keeps its own copy
    of the caller's coordinates, so a later write into them cannot leave the cache describing
    other rows (it used to: the second conv still used the old neighbours of the moved row)."""
    rows = [[0, 0, 0, 0], [0, 1, 0, 0], [0, 5, 0, 0]]
    c = torch.tensor(rows, dtype=torch.int32) if kind == "torch" else np.array(rows, dtype=np.int32)
    x = lattice.SparseTensor(c, torch.ones(3, 1, dtype=torch.float64))
    w = torch.ones(27, 1, 1, dtype=torch.float64)
    first = ops.subm_conv3d(x, w, kernel_size=3).feats
    c[2, 1] = 2  # the caller reuses its array
    assert x.coords.tolist() == rows
    second = ops.subm_conv3d(x, w, kernel_size=3).feats
    assert torch.equal(first, second)
    rel = oracle.subm_relation(np.array(rows), 3, 1)
    oracle.assert_close(second, oracle.conv_forward(np.ones((3, 1)), np.ones((27, 1, 1)), rel.in_idx, rel.out_idx,
                                                    rel.k_idx, rel.n_out), "f64", "subm_conv3d")


# ---- point <-> voxel with a voxel size that does not match -------------------------------------


def _scan(n=100, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, generator=g, dtype=torch.float64) * 5


@pytest.mark.parametrize("mode", ["nearest", "trilinear"])
@pytest.mark.parametrize("wrong", [0.2, 0.05])
def test_build_point_voxel_map_with_the_wrong_voxel_size_raises(mode, wrong):
    """Voxelized at 0.1, mapped at 0.2 (or 0.05): used to leave ~94% of the points at -1."""
    p = _scan()
    x = ops.voxelize(p, torch.ones(100, 1, dtype=torch.float64), 0.1)
    with pytest.raises(ValueError, match=r"^\[build_point_voxel_map\] voxel_size: expected the stride-1 voxel size "
                                         r"the voxels were built with, got \((0.2|0.05), .*, under which \d+ of 100 "
                                         r"points match no voxel and \d+ of \d+ voxels .*voxel size near \(0.09"):
        ops.build_point_voxel_map(p, x, mode, voxel_size=wrong)
    # allow_mismatch returns the oracle's map; the right voxel size passes the check
    m = ops.build_point_voxel_map(p, x, mode, voxel_size=wrong, allow_mismatch=True)
    idx, w = pv_oracle.point_voxel_map(p.numpy(), x.coords.numpy(), wrong, mode, True, None, 0.0)
    np.testing.assert_array_equal(m.indices.numpy(), idx)
    oracle.assert_close(m.weights, w, "f64", "weights")
    good = ops.build_point_voxel_map(p, x, mode, voxel_size=0.1)
    assert bool((good.indices >= 0).any(dim=1).all())


def test_build_point_voxel_map_legitimate_partial_matches_pass():
    """Either half of the mismatch rule alone is legitimate: pruned voxels (points without a
    voxel, every voxel hit) and a subset of the points (voxels without a point)."""
    p = _scan(400, seed=1)
    x = ops.voxelize(p, torch.ones(400, 1, dtype=torch.float64), 0.5)
    keep = torch.zeros(len(x), dtype=torch.bool)
    keep[: len(x) // 5] = True  # 80% of the voxels pruned
    pruned = ops.prune(x, keep)
    m = ops.build_point_voxel_map(p, pruned, voxel_size=0.5)
    assert int((m.indices[:, 0] < 0).sum()) > 200  # most points unmatched: still no error
    sub = ops.build_point_voxel_map(p[:10], x, voxel_size=0.5)  # most voxels get no point
    assert bool((sub.indices[:, 0] >= 0).all())
    with pytest.raises(TypeError, match=r"^\[build_point_voxel_map\] allow_mismatch: expected a bool"):
        ops.build_point_voxel_map(p, x, voxel_size=0.5, allow_mismatch=1)


# ---- readers: header text that is not UTF-8 ----------------------------------------------------


def _las_with_software(software: bytes) -> tuple[bytes, dict]:
    data, expected = io_samples.las_bytes(np.random.default_rng(3), 2, 1, 5)
    b = bytearray(data)
    b[58:90] = software.ljust(32, b"\0")
    b[26:58] = b"Syst\xe8me".ljust(32, b"\0")
    return bytes(b), expected


def test_las_header_with_latin1_text_is_read_as_latin1(tmp_path):
    data, expected = _las_with_software(b"Caf\xe9 LiDAR 2.0")
    path = tmp_path / "latin1.las"
    path.write_bytes(data)
    cloud = lio.read_las(path)
    assert cloud.meta["generating_software"] == "Café LiDAR 2.0"
    assert cloud.meta["system_identifier"] == "Système"
    for name, values in expected.items():  # binary fields do not depend on the text
        np.testing.assert_array_equal(cloud[name], values, err_msg=name)
    # valid UTF-8 stays UTF-8 (not double-decoded)
    path.write_bytes(_las_with_software("Café".encode())[0])
    assert lio.read(path).meta["generating_software"] == "Café"


@pytest.mark.parametrize("encoding", ["ascii", "binary_little_endian", "binary_big_endian"])
def test_ply_comment_and_property_name_in_latin1(tmp_path, encoding):
    vertex = io_samples.ply_sample_vertex(np.random.default_rng(4), 5)
    data = io_samples.ply_bytes(encoding, vertex)
    data = data.replace(b"comment io_samples", b"comment caf\xe9 \xff\xfe").replace(b" quality\n", b" qualit\xe9\n")
    path = tmp_path / f"latin1_{encoding}.ply"
    path.write_bytes(data)
    cloud = lio.read_ply(path)
    np.testing.assert_array_equal(cloud["qualité"], dict(vertex)["quality"])
    np.testing.assert_array_equal(cloud["xyz"], np.stack([dict(vertex)[a] for a in "xyz"], axis=1))


@pytest.mark.parametrize("data_kind", ["ascii", "binary", "binary_compressed"])
def test_pcd_field_name_in_latin1(tmp_path, data_kind):
    fields = io_samples.pcd_sample_fields(np.random.default_rng(5), 4)
    data = io_samples.pcd_bytes(fields, data_kind).replace(b" label ", b" lab\xe9l ")
    path = tmp_path / f"latin1_{data_kind}.pcd"
    path.write_bytes(data)
    cloud = lio.read_pcd(path)
    np.testing.assert_array_equal(cloud["labél"], dict(fields)["label"])


@pytest.mark.parametrize("reader,name", [("read_las", "t.las"), ("read_ply", "t.ply"), ("read_pcd", "t.pcd"),
                                         ("read_kitti", "t.bin")])
def test_reader_errors_name_the_reader_and_the_path(tmp_path, reader, name):
    path = tmp_path / name
    path.write_bytes(b"\xe9\xff\x00garbage that is no point cloud\n\xe9")
    with pytest.raises(ValueError, match=rf"^\[{reader}\] {re.escape(str(path))}: expected "):
        getattr(lio, reader)(path)


def test_reader_error_built_from_non_utf8_header_words_is_readable(tmp_path):
    """A message built from raw header words (here the PCD field list, after a Latin-1 byte
    replaced the newline before SIZE) escapes the byte: found by the fuzz test, the message used
    to be a ValueError without any text (Python could not decode it)."""
    fields = io_samples.pcd_sample_fields(np.random.default_rng(6), 3)
    data = io_samples.pcd_bytes(fields, "ascii").replace(b"hist\nSIZE", b"hist\xe9SIZE")
    path = tmp_path / "broken.pcd"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=rf"^\[read_pcd\] {re.escape(str(path))}: expected SIZE with 12 entries "
                                         r"\(one per field: x y z rgb label hist\\xe9SIZE 4 4 4 4 2 8\), got 0 entries$"):
        lio.read(path)


# ---- BatchNorm channel count --------------------------------------------------------------------


@pytest.mark.parametrize("cls", [lnn.BatchNorm, lnn.SyncBatchNorm])
def test_batch_norm_with_the_wrong_channel_count_is_a_lattice_error(cls):
    x = lattice.SparseTensor(_coords([[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0]]), torch.randn(3, 4))
    name = cls.__name__
    with pytest.raises(ValueError, match=rf"^\[{name}\] input: expected features with C=8 channels "
                                         rf"\({name}\(8\)\), got 4 channels \(shape \(3, 4\)\)$"):
        cls(8)(x)
    bn = cls(4).eval()
    want = features_oracle.batch_norm(x.feats.numpy(), bn.running_mean.numpy(), bn.running_var.numpy(),
                                      bn.weight.detach().numpy(), bn.bias.detach().numpy(), 1e-5)
    oracle.assert_close(bn(x).feats.detach(), want, "f32", name)


# ---- negative batch ids: one rule, one message --------------------------------------------------

NEG = [[0, 0, 0, 0], [-1, 1, 0, 0], [-2, 2, 0, 0]]
NEG_MSG = r"coords: expected batch ids >= 0, got batch id -1 at row 1$"


def test_negative_batch_ids_rejected_at_construction_when_validating():
    with pytest.raises(ValueError, match=r"^\[SparseTensor\] " + NEG_MSG):
        lattice.SparseTensor(_coords(NEG), torch.zeros(3, 1), validate=True)
    x = lattice.SparseTensor(_coords(NEG), torch.zeros(3, 1))  # not validated: accepted
    with pytest.raises(ValueError, match=r"^\[SparseTensor\] " + NEG_MSG):
        x.validate()
    assert lattice.SparseTensor(_coords([[0, -5, -5, -5]]), torch.zeros(1, 1), validate=True).validate() is not None


@pytest.mark.parametrize("op", ["global_sum_pool", "global_avg_pool", "global_max_pool", "dense"])
def test_ops_that_read_batch_ids_reject_negative_ones_with_the_same_message(op):
    x = lattice.SparseTensor(_coords(NEG), torch.ones(3, 2))
    fn = (lambda t: t.dense(origin=(0, 0, 0))) if op == "dense" else getattr(ops, op)
    with pytest.raises(ValueError, match=rf"^\[{op}\] " + NEG_MSG):
        fn(x)


@pytest.mark.parametrize("op", ["sparse_quantize", "voxelize", "build_point_voxel_map"])
def test_point_batch_indices_follow_the_same_rule(op):
    p = torch.rand(3, 3, dtype=torch.float64)
    b = torch.tensor([0, -1, -2])
    v = lattice.SparseTensor(_coords([[0, 0, 0, 0]]), torch.zeros(1, 1))
    call = {"sparse_quantize": lambda: ops.sparse_quantize(p, 1.0, batch_indices=b),
            "voxelize": lambda: ops.voxelize(p, torch.zeros(3, 1), 1.0, batch_indices=b),
            "build_point_voxel_map": lambda: ops.build_point_voxel_map(p, v, voxel_size=1.0, batch_indices=b)}[op]
    with pytest.raises(ValueError, match=rf"^\[{op}\] batch_indices: expected batch ids >= 0, got batch id -1 at row 1$"):
        call()
    big = torch.tensor([0, 2**31, 0])
    with pytest.raises(ValueError, match=rf"^\[{op}\] batch_indices: expected batch ids below 2\^31, got batch id "
                                         rf"2147483648 at row 1$"):
        {"sparse_quantize": lambda: ops.sparse_quantize(p, 1.0, batch_indices=big),
         "voxelize": lambda: ops.voxelize(p, torch.zeros(3, 1), 1.0, batch_indices=big),
         "build_point_voxel_map": lambda: ops.build_point_voxel_map(p, v, voxel_size=1.0, batch_indices=big)}[op]()


def test_ops_that_only_key_on_the_batch_accept_negative_ids_and_equal_the_oracle():
    """Convolution treats the batch as one more key column: a negative id is a batch like any
    other (documented; no validation cost), and the result is the oracle's."""
    c = np.array(NEG + [[-1, 1, 0, 1]], dtype=np.int32)
    f = torch.randn(4, 2, dtype=torch.float64)
    w = torch.randn(27, 2, 3, dtype=torch.float64)
    y = ops.subm_conv3d(lattice.SparseTensor(torch.from_numpy(c), f), w, kernel_size=3)
    rel = oracle.subm_relation(c, 3, 1)
    oracle.assert_close(y.feats, oracle.conv_forward(f.numpy(), w.numpy(), rel.in_idx, rel.out_idx, rel.k_idx,
                                                     rel.n_out), "f64", "subm_conv3d")


# ---- ConvTranspose3d without coordinates= concatenated with the skip -----------------------------


def test_cat_of_a_generated_transposed_output_explains_the_fix():
    torch.manual_seed(0)
    c = torch.unique(torch.randint(0, 8, (60, 3)), dim=0)
    c = torch.cat([torch.zeros(len(c), 1, dtype=torch.long), c], 1).int()
    skip = lattice.SparseTensor(c, torch.randn(len(c), 4))
    down = lnn.Conv3d(4, 8, 2, stride=2)(skip)
    up = lnn.ConvTranspose3d(8, 4, 2, stride=2)
    with pytest.raises(ValueError, match=r"^\[cat\] tensors\[1\]: expected the coordinate identity of tensors\[0\] "
                                         r".*tensors\[0\] comes from conv_transpose3d \(nn.ConvTranspose3d\) called "
                                         r"without coordinates=.*pass the skip tensor as coordinates= \(here tensors\[1\]: "
                                         rf"up\(x, coordinates=skip\)\), so the output carries the skip's coordinate "
                                         rf"key \(key {skip.key}\)"):
        ops.cat([up(down), skip])
    out = ops.cat([up(down, coordinates=skip), skip])  # the fix the message names
    assert out.key == skip.key and out.feats.shape == (len(skip), 8)
