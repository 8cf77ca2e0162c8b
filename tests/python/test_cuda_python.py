"""The Python layer on CUDA: device checks, SparseTensor.to/.cuda/.cpu, streams, explain.

The device checks themselves run everywhere (a ``meta`` tensor stands in for "another device" on a
machine without a GPU); the rest needs a CUDA device and lattice's CUDA backend and is skipped with
"no GPU" otherwise (the only skip). explain() on CUDA tensors is asserted against the admission
table (cuda_admission.py) for the device's tier: the exact route chosen, not "one of the CUDA routes".
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import cuda_admission as adm
import lattice
from conftest import random_coords
from lattice import nn as lnn
from lattice import ops
from lattice._device import as_device, check_device, device_name
from lattice.tensor import SparseTensor


needs_cuda = adm.needs_gpu()  # the only skip: "no GPU" (no CUDA device, or lattice built without CUDA)
DEV = torch.device("cuda", 0)


def _coords(n=300, seed=3):
    return torch.from_numpy(random_coords(np.random.default_rng(seed), n, batches=2, extent=7, spread=6))


# ---- device checks (no GPU needed: meta tensors are "another device") --------------------------


def test_check_device_message_names_op_argument_and_both_devices():
    with pytest.raises(ValueError, match=r"^\[conv3d\] weight: expected a tensor on cpu, got meta$"):
        check_device("conv3d", "weight", torch.empty(2, device="meta"), torch.device("cpu"))
    check_device("conv3d", "bias", None, torch.device("cpu"))
    check_device("conv3d", "weight", torch.empty(2), torch.device("cpu"))


def test_sparse_tensor_rejects_features_on_another_device_before_the_core():
    c = _coords()
    with pytest.raises(ValueError, match=r"\[SparseTensor\] feats: expected a tensor on cpu, got meta"):
        SparseTensor(c, torch.empty(c.shape[0], 4, device="meta"))


def test_conv_weight_and_bias_on_another_device_raise_value_error():
    x = SparseTensor(_coords(), torch.randn(300, 4))
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] weight: expected a tensor on cpu, got meta"):
        ops.subm_conv3d(x, torch.empty(5, 3, 3, 3, 4, device="meta"))
    with pytest.raises(ValueError, match=r"\[conv3d\] bias: expected a tensor on cpu, got meta"):
        ops.conv3d(x, torch.randn(5, 2, 2, 2, 4), torch.empty(5, device="meta"), stride=2)
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] weight: expected a tensor on cpu, got meta"):
        lattice.explain("subm_conv3d", x, torch.empty(5, 3, 3, 3, 4, device="meta"))


def test_feature_op_parameters_on_another_device_raise_value_error():
    x = SparseTensor(_coords(), torch.randn(300, 4))
    with pytest.raises(ValueError, match=r"\[linear\] weight: expected a tensor on cpu, got meta"):
        ops.linear(x, torch.empty(3, 4, device="meta"))
    with pytest.raises(ValueError, match=r"\[layer_norm\] weight: expected a tensor on cpu, got meta"):
        ops.layer_norm(x, torch.empty(4, device="meta"))
    with pytest.raises(ValueError, match=r"\[BatchNorm\] weight: expected a tensor on cpu, got meta"):
        lnn.BatchNorm(4, device="meta")(x)


def test_point_ops_reject_mixed_devices():
    p = torch.rand(50, 3)
    with pytest.raises(ValueError, match=r"\[voxelize\] feats: expected a tensor on cpu, got meta"):
        ops.voxelize(p, torch.empty(50, 2, device="meta"), 0.1)
    with pytest.raises(ValueError, match=r"\[sparse_quantize\] batch_indices: expected a tensor on cpu, got meta"):
        ops.sparse_quantize(p, 0.1, torch.zeros(50, dtype=torch.int64, device="meta"))


def test_coordinate_utilities_reject_mixed_devices():
    c = _coords()
    x = SparseTensor(c, torch.randn(300, 2))
    with pytest.raises(ValueError, match=r"\[lookup_coords\] queries: expected a tensor on cpu, got meta"):
        ops.lookup_coords(c, torch.empty(4, 4, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match=r"\[union_coords\] rhs: expected a tensor on cpu, got meta"):
        ops.union_coords(x, torch.empty(4, 4, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match=r"\[prune\] mask: expected a tensor on cpu, got meta"):
        ops.prune(x, torch.empty(300, dtype=torch.bool, device="meta"))


def test_as_device_parses_names_and_indices():
    assert as_device("cpu") == torch.device("cpu")
    assert as_device(1) == torch.device("cuda", 1)
    assert as_device("cuda:2") == torch.device("cuda", 2)
    assert as_device("cuda").type == "cuda" and as_device("cuda").index is not None
    assert device_name(torch.device("cpu")) == "cpu"
    with pytest.raises(ValueError, match=r"\[SparseTensor.to\] device"):
        as_device("tpu")
    with pytest.raises(TypeError, match=r"\[SparseTensor.to\] device"):
        as_device(True)


def test_to_same_device_keeps_identity_and_casts_dtype():
    x = SparseTensor(_coords(), torch.randn(300, 3))
    assert x.to("cpu").key == x.key and x.cpu().key == x.key
    y = x.to(torch.float64)
    assert y.key == x.key and y.dtype == torch.float64
    z = x.to("cpu", torch.float16)
    assert z.key == x.key and z.dtype == torch.float16
    w = x.to(dtype=torch.bfloat16, device=torch.device("cpu"))
    assert w.key == x.key and w.dtype == torch.bfloat16
    with pytest.raises(TypeError, match=r"\[SparseTensor.to\]"):
        x.to([1])


# ---- on a GPU ----------------------------------------------------------------------------------


@needs_cuda
def test_sparse_tensor_on_cuda_and_ops_return_cuda_tensors():
    c = _coords()
    x = SparseTensor(c.to(DEV), torch.randn(300, 4, device=DEV))
    assert x.device.type == "cuda" and x.coords.is_cuda
    w = torch.randn(6, 3, 3, 3, 4, device=DEV)
    y = ops.subm_conv3d(x, w)
    assert y.feats.is_cuda and y.key == x.key
    d = ops.conv3d(x, torch.randn(6, 2, 2, 2, 4, device=DEV), stride=2)
    assert d.feats.is_cuda and d.coords.is_cuda
    u = ops.conv_transpose3d(d, torch.randn(4, 2, 2, 2, 6, device=DEV), stride=2, coordinates=x)
    assert u.key == x.key and u.feats.is_cuda
    assert ops.max_pool3d(x, 2).feats.is_cuda
    assert ops.global_avg_pool(x).is_cuda
    assert (x + x).feats.is_cuda and ops.sparse_mul(x, u).feats.is_cuda
    assert ops.union_coords(x, x).is_cuda and ops.morton_order(x).is_cuda
    assert ops.relu(x).feats.is_cuda and ops.linear(x, torch.randn(3, 4, device=DEV)).feats.is_cuda
    q = ops.sparse_quantize(torch.rand(100, 3, device=DEV), 0.1)
    assert all(t.is_cuda for t in q)
    v = ops.voxelize(torch.rand(100, 3, device=DEV), torch.randn(100, 2, device=DEV), 0.2)
    m = ops.build_point_voxel_map(torch.rand(100, 3, device=DEV), v, voxel_size=0.2)
    assert v.feats.is_cuda and m.indices.is_cuda and ops.devoxelize(v, m).is_cuda


@needs_cuda
def test_autograd_on_cuda_returns_cuda_gradients():
    x = SparseTensor(_coords().to(DEV), torch.randn(300, 4, device=DEV, requires_grad=True))
    w = torch.randn(5, 3, 3, 3, 4, device=DEV, requires_grad=True)
    b = torch.randn(5, device=DEV, requires_grad=True)
    y = ops.max_pool3d(ops.subm_conv3d(x, w, b), 2)
    y.feats.square().sum().backward()
    assert x.feats.grad.is_cuda and w.grad.is_cuda and b.grad.is_cuda


@needs_cuda
def test_mixed_devices_raise_clear_value_errors():
    c = _coords()
    x = SparseTensor(c.to(DEV), torch.randn(300, 4, device=DEV))
    xc = SparseTensor(c, torch.randn(300, 4))
    msg = "expected a tensor on cuda:0, got cpu"
    with pytest.raises(ValueError, match=r"\[SparseTensor\] feats: " + msg):
        SparseTensor(c.to(DEV), torch.randn(300, 4))
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] weight: " + msg):
        ops.subm_conv3d(x, torch.randn(5, 3, 3, 3, 4))
    with pytest.raises(ValueError, match=r"\[conv3d\] bias: " + msg):
        ops.conv3d(x, torch.randn(5, 2, 2, 2, 4, device=DEV), torch.randn(5), stride=2)
    with pytest.raises(ValueError, match=r"\[conv_transpose3d\] coordinates: " + msg):
        ops.conv_transpose3d(ops.conv3d(x, torch.randn(4, 2, 2, 2, 4, device=DEV), stride=2),
                             torch.randn(4, 2, 2, 2, 4, device=DEV), stride=2, coordinates=xc)
    with pytest.raises(ValueError, match=r"\[sparse_add\] rhs: " + msg):
        ops.sparse_add(x, xc)
    with pytest.raises(ValueError, match=r"\[sparse_add\] rhs: expected a tensor on cpu, got cuda:0"):
        xc + x
    with pytest.raises(ValueError, match=r"\[max_pool3d\] coordinates: " + msg):
        ops.max_pool3d(x, 2, coordinates=xc)
    with pytest.raises(ValueError, match=r"\[linear\] weight: " + msg):
        ops.linear(x, torch.randn(3, 4))
    with pytest.raises(ValueError, match=r"\[BatchNorm\] weight: " + msg):
        lnn.BatchNorm(4)(x)
    with pytest.raises(ValueError, match=r"\[lookup_coords\] queries: " + msg):
        ops.lookup_coords(x, c)
    with pytest.raises(ValueError, match=r"\[voxelize\] feats: " + msg):
        ops.voxelize(torch.rand(10, 3, device=DEV), torch.randn(10, 2), 0.1)
    v = ops.voxelize(torch.rand(10, 3), torch.randn(10, 2), 0.1)
    with pytest.raises(ValueError, match=r"\[build_point_voxel_map\] voxels: expected a tensor on cuda:0, got cpu"):
        ops.build_point_voxel_map(torch.rand(10, 3, device=DEV), v, voxel_size=0.1)
    with pytest.raises(ValueError, match=r"\[sparse_collate\] samples\[1\] coords: " + msg):
        ops.sparse_collate([(c.to(DEV), torch.randn(300, 2, device=DEV)), (c, torch.randn(300, 2))])


@needs_cuda
def test_to_cuda_and_back_makes_new_identities_and_keeps_autograd():
    f = torch.randn(300, 4, requires_grad=True)
    x = SparseTensor(_coords(), f, stride=2, batch_counts=None)
    g = x.cuda()
    assert g.device.type == "cuda" and g.coords.is_cuda and g.key != x.key and g.stride == x.stride
    assert torch.equal(g.coords.cpu(), x.coords) and torch.equal(g.feats.detach().cpu(), f.detach())
    h = g.to(torch.float16)
    assert h.key == g.key and h.dtype == torch.float16
    back = g.cpu()
    assert back.device.type == "cpu" and back.key not in (x.key, g.key)
    g.feats.sum().backward()
    assert f.grad is not None and torch.equal(f.grad, torch.ones_like(f))
    assert x.to("cuda:0").device == DEV and x.to(0).device == DEV


@needs_cuda
def test_work_runs_on_the_current_torch_stream():
    c = _coords(2000, 5)
    x = SparseTensor(c.to(DEV), torch.randn(c.shape[0], 16, device=DEV))
    w = torch.randn(16, 3, 3, 3, 16, device=DEV)
    ref = ops.subm_conv3d(x, w).feats
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = ops.subm_conv3d(x, w).feats
        assert lattice._core.core.current_stream(0) == s.cuda_stream
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(got, ref)


@needs_cuda
def test_non_contiguous_cuda_features_are_accepted():
    c = _coords()
    wide = torch.randn(300, 8, device=DEV)
    x = SparseTensor(c.to(DEV), wide[:, ::2])
    w = torch.randn(3, 3, 3, 3, 4, device=DEV)
    assert torch.equal(ops.subm_conv3d(x, w).feats, ops.subm_conv3d(x.replace_feats(wide[:, ::2].contiguous()), w).feats)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_explain_with_cuda_tensors_names_the_table_route(dtype):
    """Every family on CUDA tensors: explain() chooses exactly the route the admission table names
    for this tier (implicit_gemm_sm80 for 16-bit conv from sm80 on, cuda_gather_gemm_scatter
    for float32 without tf32 and on older GPUs), every row's verdict matches, and the route
    that runs is the one explained (forcing the other admitted CUDA conv route also works)."""
    tier = adm.device_tier()
    c = _coords()
    key = adm.dtype_key(dtype)
    x = SparseTensor(c.to(DEV), torch.randn(300, 16, device=DEV, dtype=dtype))
    w = torch.randn(16, 3, 3, 3, 16, device=DEV, dtype=dtype)
    geometry = adm.conv_geometry("submanifold", 27, 16, 16, x.feats.element_size())
    for pass_ in ("forward", "input_grad", "weight_grad"):
        for tf32 in (False, True):
            k = adm.dtype_key(dtype, tf32)
            e = lattice.explain("subm_conv3d", x, w, pass_=pass_, allow_tf32=tf32)
            chosen = adm.assert_explanation(e, "conv", pass_, k, geometry, tier)
            assert chosen in ("cuda_gather_gemm_scatter", "implicit_gemm_sm80"), str(e)
            assert "cuda" in str(e)
    # both CUDA conv routes, where admitted, give the same values as the chosen one (f32 accumulation)
    ref = ops.subm_conv3d(x, w).feats
    for route in ("cuda_gather_gemm_scatter", "implicit_gemm_sm80"):
        want = adm.verdict("conv", route, "forward", key, geometry, tier)
        if want == adm.ADMITTED:
            got = ops.subm_conv3d(x, w, route=route).feats
            problems = adm.compare(got, ref, key)
            assert not problems, f"{route}: {problems}"
        else:
            adm.assert_forced_call_raises(lambda: ops.subm_conv3d(x, w, route=route), "subm_conv3d", route, want)
    xp = SparseTensor(c.to(DEV), x.feats)
    for pass_ in ("forward", "input_grad"):
        adm.assert_explanation(lattice.explain("max_pool3d", x, 2, pass_=pass_), "pool", pass_, key, "forward", tier)
    adm.assert_explanation(lattice.explain("sparse_add", x, xp), "algebra", "align", "i32", "outer", tier)
    adm.assert_explanation(lattice.explain("sparse_add", x, xp, pass_="combine"), "algebra", "forward", key, "aligned", tier)
    adm.assert_explanation(lattice.explain("downsample_coords", x.coords), "coords", "downsample", "i32", "-", tier)
    adm.assert_explanation(lattice.explain("sparse_quantize", torch.rand(10, 3, device=DEV)), "quantize", "forward",
                           "f32", "-", tier)
    p = torch.rand(10, 3, device=DEV)
    adm.assert_explanation(lattice.explain("voxelize", p, torch.randn(10, 2, device=DEV, dtype=dtype), 0.1),
                           "point_voxel", "forward", key, "voxelize", tier)
    v = ops.voxelize(p, torch.randn(10, 2, device=DEV), 0.1)
    adm.assert_explanation(lattice.explain("build_point_voxel_map", p, v), "point_voxel", "build_map", "f32",
                           "build_point_voxel_map", tier)
