"""The short host paths of a conv call (issue 12: GPU training is host-bound; docs/host_path.md).

A conv call's Python takes shortcuts where the general path re-checks or re-converts what cannot
have changed: ``lattice._core.borrow`` (a DLPack capsule without the detached alias for a call's
own arguments), ``from_core`` (torch's C entry point, not the Python wrapper), the CUDA stream
handed to the core only when torch's current stream changed, ``autocast_dtype`` (the torch API
decided once), ``SparseTensor.replace_feats`` (only the new features checked), the conv's output
assembled without the constructor's checks, the cached kernel-major weight and a module's bias
passed to the core as held arrays, and ``ops.conv.PERMUTE_IN_NODE`` (the CPU training weight's
permute inside the conv's autograd node). What these tests prove:

* each short path gives what the general path gives, bit for bit (values, dtypes, shapes,
  outputs and every gradient, with the switch on and off, under CPU autocast, for every conv kind);
* the general path still runs, with its error messages, where the short one does not apply
  (non-contiguous or wrongly typed tensors, tensors on another device, autocast on, a changed
  stream -- simulated on the CPU, and for real on a GPU when present);
* nothing the caller passed is modified (values, version counters, ``requires_grad``);
* what is cached follows the tensor: an in-place update (version counter), a new storage
  (``.data =``) or the tensor's death (weak references) invalidates or frees it.
"""
from __future__ import annotations

import gc
import os
import threading
import weakref

import numpy as np
import pytest
import torch
import torch.utils.dlpack

import lattice
import lattice.nn as lnn
from conftest import random_coords
from lattice import _autocast, _core, _held, ops
from lattice._core import borrow, core, from_core, to_core
from lattice.ops import conv as conv_mod
from lattice.tensor import SparseTensor


def _x(seed: int = 3, n: int = 300, c: int = 4, dtype: torch.dtype = torch.float32, stride: int = 1) -> SparseTensor:
    rng = np.random.default_rng(seed)
    coords = torch.from_numpy(random_coords(rng, n, batches=2, extent=5, spread=6))
    feats = torch.from_numpy(rng.standard_normal((coords.shape[0], c))).to(dtype)
    return SparseTensor(coords, feats, stride)


def _old_to_core(t: torch.Tensor):
    """The general conversion the short paths must agree with (detach, then DLPack)."""
    return torch.utils.dlpack.to_dlpack(t.detach())


# ---- DLPack conversions ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
                                   torch.int64, torch.uint8])
def test_borrow_round_trip_equals_the_general_conversion(dtype) -> None:
    t = (torch.arange(24).reshape(6, 4) % 3).to(dtype)
    a, b = from_core(borrow(t)), from_core(_old_to_core(t))
    assert a.dtype == b.dtype == dtype and a.shape == b.shape and a.stride() == b.stride()
    assert a.data_ptr() == t.data_ptr()  # shared, not copied
    assert torch.equal(a, b)


def test_borrow_of_a_tensor_that_needs_a_gradient_detaches_and_leaves_it_alone() -> None:
    w = torch.randn(5, 3, requires_grad=True)
    got = from_core(borrow(w))
    assert not got.requires_grad and torch.equal(got, w.detach())
    assert w.requires_grad and w.is_leaf and w.grad is None and w._version == 0


def test_borrow_of_a_strided_cpu_tensor_keeps_its_strides() -> None:
    base = torch.randn(6, 8)
    t = base.t()[::2]  # non-contiguous on the CPU: the core reads strided CPU arrays as they are
    got = from_core(borrow(t))
    assert got.stride() == t.stride() and torch.equal(got, t)


def test_to_core_keeps_the_storage_alive_when_the_tensor_gets_another() -> None:
    """to_core wraps a detached alias: a later ``set_`` on the caller's tensor leaves the capsule's
    memory valid (what borrow skips, for arguments consumed within one call)."""
    t = torch.arange(10, dtype=torch.float32)
    cap = to_core(t)
    t.set_(torch.zeros(3))
    gc.collect()
    assert torch.equal(from_core(cap), torch.arange(10, dtype=torch.float32))


def test_from_core_equals_torch_from_dlpack_on_core_outputs() -> None:
    x = _x()
    a = from_core(x._cs.coords())
    b = torch.utils.dlpack.from_dlpack(x._cs.coords())
    assert a.dtype == b.dtype == torch.int32 and torch.equal(a, b) and torch.equal(a, x.coords)


def test_the_cached_process_id_follows_a_fork() -> None:
    assert _core._pid == os.getpid()
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, b"1" if _core._pid == os.getpid() and not _core._streams_set.by_device else b"0")
        os._exit(0)
    os.close(w)
    answer = os.read(r, 1)
    os.waitpid(pid, 0)
    os.close(r)
    assert answer == b"1"


# ---- the stream handed to the core -------------------------------------------------------------


class _FakeCuda:
    """Stands in for a CUDA tensor in _hand_over_stream (which reads only ``.device.index``)."""

    device = torch.device("cuda", 0)


def test_the_stream_is_handed_to_the_core_only_when_it_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    current = {"stream": 111}
    monkeypatch.setattr(_core, "_raw_stream", lambda index: current["stream"])
    monkeypatch.setattr(_core.core, "set_current_stream", lambda i, s: calls.append((i, s)))
    _core.forget_streams()
    t = _FakeCuda()
    _core._hand_over_stream(t)
    _core._hand_over_stream(t)
    assert calls == [(0, 111)]
    current["stream"] = 222  # a torch.cuda.stream(...) context
    _core._hand_over_stream(t)
    _core._hand_over_stream(t)
    current["stream"] = 111  # the context ends
    _core._hand_over_stream(t)
    assert calls == [(0, 111), (0, 222), (0, 111)]
    _core.forget_streams()
    _core._hand_over_stream(t)
    assert calls[-1] == (0, 111) and len(calls) == 4
    _core.forget_streams()


def test_each_thread_hands_its_own_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The core's current stream is thread-local (as torch's is): a thread whose core stream was
    never set gets it set, even when another thread already set the same value."""
    calls: list[str] = []
    monkeypatch.setattr(_core, "_raw_stream", lambda index: 7)
    monkeypatch.setattr(_core.core, "set_current_stream", lambda i, s: calls.append(threading.current_thread().name))
    _core.forget_streams()
    _core._hand_over_stream(_FakeCuda())
    th = threading.Thread(target=_core._hand_over_stream, args=(_FakeCuda(),), name="other")
    th.start()
    th.join()
    _core._hand_over_stream(_FakeCuda())
    assert calls == [threading.current_thread().name, "other"]
    _core.forget_streams()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_a_conv_on_a_side_stream_runs_on_that_stream_after_one_on_the_default() -> None:
    x = _x().to("cuda")
    conv = lnn.SubmConv3d(4, 6, 3).cuda().eval()
    with torch.no_grad():
        want = conv(x).feats
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            got = conv(x).feats  # queued on s: correct only if the core launched on s
            again = conv(x).feats
        torch.cuda.current_stream().wait_stream(s)
        back = conv(x).feats
    torch.cuda.synchronize()
    assert torch.equal(got, want) and torch.equal(again, want) and torch.equal(back, want)


# ---- autocast_dtype ----------------------------------------------------------------------------


def _autocast_reference(device: torch.device):
    """The general rule (torch's public API asked every time)."""
    kind = device.type
    if kind == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    if kind == "cuda":
        try:
            on = torch.is_autocast_enabled("cuda")  # type: ignore[call-arg]
        except TypeError:
            on = torch.is_autocast_enabled()
        return (torch.get_autocast_gpu_dtype() if on else None)
    return None


@pytest.mark.parametrize("device", ["cpu", "cuda", "meta"])
def test_autocast_dtype_outside_and_inside_autocast_equals_the_reference(device) -> None:
    d = torch.device(device)
    assert _autocast.autocast_dtype(d) is None and _autocast_reference(d) is None
    with torch.autocast("cpu", torch.bfloat16):
        assert _autocast.autocast_dtype(d) == _autocast_reference(d)
        assert _autocast.autocast_dtype(torch.device("cpu")) == torch.bfloat16
        with torch.autocast("cpu", enabled=False):
            assert _autocast.autocast_dtype(torch.device("cpu")) is None
    assert _autocast.autocast_dtype(d) is None


def test_a_conv_under_cpu_autocast_still_runs_in_the_autocast_dtype() -> None:
    x = _x()
    conv = lnn.SubmConv3d(4, 6, 3, bias=True)
    with torch.autocast("cpu", torch.bfloat16):
        y = conv(x)
    assert y.feats.dtype == torch.bfloat16
    want = ops.subm_conv3d(x.to(torch.bfloat16), conv.weight.to(torch.bfloat16), conv.bias.to(torch.bfloat16))
    assert torch.equal(y.feats, want.feats)


# ---- replace_feats and the conv's output ---------------------------------------------------------


def test_replace_feats_keeps_identity_and_takes_the_features_as_they_are() -> None:
    x = _x()
    f = torch.randn(len(x), 7)
    y = x.replace_feats(f)
    assert y.key == x.key and y.coords is x.coords and y.feats is f and y.stride == x.stride


def test_replace_feats_with_the_wrong_rows_raises_as_before() -> None:
    x = _x()
    with pytest.raises(ValueError, match=rf"\[SparseTensor\] feats: expected shape \(N={len(x)}, C\), got \(3, 4\)"):
        x.replace_feats(torch.randn(3, 4))
    with pytest.raises(ValueError, match=r"\[SparseTensor\] feats: expected shape"):
        x.replace_feats(torch.randn(len(x)))


def test_replace_feats_with_integer_features_raises_as_before() -> None:
    x = _x()
    with pytest.raises(TypeError, match=r"\[SparseTensor\] feats: expected a float tensor .*got torch.int64"):
        x.replace_feats(torch.zeros(len(x), 2, dtype=torch.int64))


def test_replace_feats_with_numpy_or_another_device_takes_the_general_path() -> None:
    x = _x()
    y = x.replace_feats(np.ones((len(x), 2), np.float32))
    assert isinstance(y.feats, torch.Tensor) and y.key == x.key
    with pytest.raises(ValueError, match=r"\[SparseTensor\] feats: expected a tensor on cpu, got meta"):
        x.replace_feats(torch.empty(len(x), 2, device="meta"))


@pytest.mark.parametrize("op", ["subm", "strided", "transposed"])
def test_conv_output_is_what_the_checked_constructor_builds(op) -> None:
    x = _x()
    w = torch.randn(5, 3, 3, 3, 4) if op == "subm" else torch.randn(5, 2, 2, 2, 4)
    with torch.no_grad():
        if op == "subm":
            y = ops.subm_conv3d(x, w)
        elif op == "strided":
            y = ops.conv3d(x, w, stride=2)
        else:
            y = ops.conv_transpose3d(ops.conv3d(x, torch.randn(4, 2, 2, 2, 4), stride=2), w, stride=2)
    checked = SparseTensor(y.coords, y.feats, _coordinate_set=y._cs)
    assert y.key == checked.key and torch.equal(y.coords, checked.coords) and y.feats.shape == (len(y), 5)
    assert y.stride == checked.stride and y.feats.dtype == torch.float32


# ---- plan: kernel size, devices ----------------------------------------------------------------


def test_kernel_size_from_a_dense_weight_is_plain_ints() -> None:
    ks = conv_mod._kernel_size("subm_conv3d", torch.zeros(2, 3, 1, 5, 4), None)
    assert ks == (3, 1, 5) and all(type(v) is int for v in ks)
    assert conv_mod._kernel_size("subm_conv3d", torch.zeros(2, 3, 1, 5, 4), (3, 1, 5)) == (3, 1, 5)
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] weight: expected \(C_out, 3, 3, 3, C_in\) for "
                                         r"kernel_size=\(3, 3, 3\), got \(2, 3, 1, 5, 4\)"):
        conv_mod._kernel_size("subm_conv3d", torch.zeros(2, 3, 1, 5, 4), 3)


def test_as_triple_fast_path_still_refuses_bools_and_out_of_range_values() -> None:
    assert _core.as_triple((1, 2, 3), "stride", "conv3d") == (1, 2, 3)
    assert _core.as_triple(2, "stride", "conv3d") == (2, 2, 2)
    with pytest.raises(ValueError, match=r"\[conv3d\] stride: expected an int or 3 ints, got \(True, 1, 1\)"):
        _core.as_triple((True, 1, 1), "stride", "conv3d")
    with pytest.raises(ValueError, match=r"\[conv3d\] stride: expected values within int32, got \(2147483648, 1, 1\)"):
        _core.as_triple((2**31, 1, 1), "stride", "conv3d")
    with pytest.raises(TypeError, match=r"\[conv3d\] stride: expected an int or 3 ints, got bool"):
        _core.as_triple(True, "stride", "conv3d")


def test_weight_or_bias_on_another_device_raises_as_before() -> None:
    x = _x()
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] weight: expected a tensor on cpu, got meta"):
        ops.subm_conv3d(x, torch.empty(5, 3, 3, 3, 4, device="meta"))
    with pytest.raises(ValueError, match=r"\[subm_conv3d\] bias: expected a tensor on cpu, got meta"):
        ops.subm_conv3d(x, torch.randn(5, 3, 3, 3, 4), torch.empty(5, device="meta"))


def test_a_weight_of_the_wrong_dtype_raises_the_same_error_with_and_without_a_gradient() -> None:
    x = _x()
    w = torch.randn(5, 3, 3, 3, 4, dtype=torch.float64)
    msg = r"\[subm_conv3d\] weight: expected float32 \(the dtype of feats\), got float64"
    with torch.no_grad(), pytest.raises(TypeError, match=msg):
        ops.subm_conv3d(x, w)
    with pytest.raises(TypeError, match=msg):
        ops.subm_conv3d(x, w.requires_grad_(True))


# ---- cached weight layouts and held biases -------------------------------------------------------


def _plain(x: SparseTensor, conv: torch.nn.Module) -> torch.Tensor:
    """The conv through the general conversions (fresh layout, capsules of plain tensors)."""
    p = conv_mod.plan("subm_conv3d", "submanifold", x, conv.weight)
    w = conv.weight.detach()
    km = w.permute(1, 2, 3, 4, 0).reshape(-1, w.shape[4], w.shape[0]).contiguous()
    b = None if conv.bias is None else _old_to_core(conv.bias.detach().clone())
    return from_core(core.conv_forward(p, _old_to_core(x.feats), _old_to_core(km), b))


def test_no_grad_call_equals_the_general_conversions_bitwise() -> None:
    x = _x()
    conv = lnn.SubmConv3d(4, 6, 3, bias=True).eval()
    with torch.no_grad():
        first, second = conv(x).feats, conv(x).feats  # the second call hits the cached layout
    assert torch.equal(first, _plain(x, conv)) and torch.equal(second, first)


def test_an_in_place_weight_update_invalidates_the_held_layout() -> None:
    x = _x()
    conv = lnn.SubmConv3d(4, 6, 3).eval()
    with torch.no_grad():
        conv(x)
        held_before = getattr(conv.weight, conv_mod._CACHE_ATTR)[2]
        conv.weight.mul_(-3.0)  # bumps the version counter
        y = conv(x).feats
        assert getattr(conv.weight, conv_mod._CACHE_ATTR)[2] is not held_before
    assert torch.equal(y, _plain(x, conv))


def test_the_cached_layout_dies_with_the_weight() -> None:
    x = _x()
    conv = lnn.SubmConv3d(4, 6, 3).eval()
    with torch.no_grad():
        conv(x)
    km_ref = weakref.ref(getattr(conv.weight, conv_mod._CACHE_ATTR)[1])
    del conv
    gc.collect()
    assert km_ref() is None


def test_a_module_bias_is_held_and_sees_in_place_updates_and_new_storage() -> None:
    x = _x()
    conv = lnn.SubmConv3d(4, 6, 3, bias=True).eval()
    with torch.no_grad():
        conv(x)
        assert id(conv.bias) in _held._HELD
        conv.bias.add_(1.5)  # same storage: the held array sees it
        assert torch.equal(conv(x).feats, _plain(x, conv))
        conv.bias.data = torch.randn(6)  # a new storage: a new held array
        assert torch.equal(conv(x).feats, _plain(x, conv))
    key = id(conv.bias)
    del conv
    gc.collect()
    assert key not in _held._HELD


def test_a_plain_bias_tensor_is_not_held() -> None:
    x = _x()
    w, b = torch.randn(6, 3, 3, 3, 4), torch.randn(6)
    before = len(_held._HELD)
    with torch.no_grad():
        ops.subm_conv3d(x, w, b)
    assert len(_held._HELD) == before and id(b) not in _held._HELD


# ---- PERMUTE_IN_NODE: the CPU training weight's permute inside the autograd node -----------------


def _train(monkeypatch, in_node: bool, op: str, dtype: torch.dtype, bias: bool, amp: bool = False):
    monkeypatch.setattr(conv_mod, "PERMUTE_IN_NODE", in_node)
    x = _x(dtype=dtype, stride=2 if op == "transposed" else 1)
    torch.manual_seed(11)
    ks, kw = (3, {}) if op == "subm" else (2, {"stride": 2})
    w = (torch.randn(6, ks, ks, ks, 4) * 0.3).to(dtype).requires_grad_(True)
    b = torch.randn(6).to(dtype).requires_grad_(True) if bias else None
    xf = x.replace_feats(x.feats.clone().requires_grad_(True))
    with torch.autocast("cpu", torch.bfloat16, enabled=amp):
        if op == "subm":
            y = ops.subm_conv3d(xf, w, b)
        elif op == "strided":
            y = ops.conv3d(xf, w, b, **kw)
        else:
            y = ops.conv_transpose3d(xf, w, b, **kw)
    g = torch.randn(y.feats.shape).to(y.feats.dtype)
    y.feats.backward(g)
    return [y.feats.detach(), xf.feats.grad, w.grad] + ([b.grad] if bias else [])


@pytest.mark.parametrize("op", ["subm", "strided", "transposed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [False, True])
def test_permute_in_node_equals_torch_permute_bitwise(monkeypatch, op, dtype, bias) -> None:
    a = _train(monkeypatch, True, op, dtype, bias)
    b = _train(monkeypatch, False, op, dtype, bias)
    for name, u, v in zip(("output", "input grad", "weight grad", "bias grad"), a, b):
        assert u.dtype == v.dtype and u.shape == v.shape, name
        assert torch.equal(u, v), f"{name} differs"
    assert a[2].is_contiguous()  # the parameter's gradient in its own (dense) layout


@pytest.mark.parametrize("op", ["subm", "strided"])
def test_permute_in_node_under_cpu_autocast_equals_torch_permute_bitwise(monkeypatch, op) -> None:
    a = _train(monkeypatch, True, op, torch.float32, True, amp=True)
    b = _train(monkeypatch, False, op, torch.float32, True, amp=True)
    assert a[0].dtype == torch.bfloat16 and a[2].dtype == torch.float32
    for u, v in zip(a, b):
        assert u.dtype == v.dtype and torch.equal(u, v)


def test_permute_in_node_with_a_kernel_major_or_viewed_weight(monkeypatch) -> None:
    """A 3-D kernel-major weight (cast under autocast in the node) and lattice.nn.Linear's viewed
    (C_out, 1, 1, 1, C_in) weight give the same bits either way."""
    results = []
    for in_node in (True, False):
        monkeypatch.setattr(conv_mod, "PERMUTE_IN_NODE", in_node)
        x = _x()
        torch.manual_seed(2)
        km = torch.randn(27, 4, 6, requires_grad=True)
        lin = lnn.Linear(4, 5)
        with torch.autocast("cpu", torch.bfloat16):
            y1 = ops.subm_conv3d(x, km, kernel_size=3)
        y2 = lin(x)
        (y1.feats.float().square().sum() + y2.feats.square().sum()).backward()
        results.append([y1.feats.detach(), y2.feats.detach(), km.grad, lin.weight.grad, lin.bias.grad])
    for u, v in zip(*results):
        assert u.dtype == v.dtype and torch.equal(u, v)


def test_permute_in_node_puts_the_parameter_next_to_the_conv_node(monkeypatch) -> None:
    def weight_edge(in_node: bool) -> str:
        monkeypatch.setattr(conv_mod, "PERMUTE_IN_NODE", in_node)
        w = torch.randn(6, 3, 3, 3, 4, requires_grad=True)
        y = ops.subm_conv3d(_x(), w)
        return type(y.feats.grad_fn.next_functions[1][0]).__name__

    assert weight_edge(True) == "AccumulateGrad"
    assert weight_edge(False) != "AccumulateGrad"  # torch's copy / reshape / permute nodes


def test_a_training_call_modifies_nothing_it_was_given() -> None:
    x = _x()
    fx = x.feats.clone().requires_grad_(True)
    xs = x.replace_feats(fx)
    conv = lnn.SubmConv3d(4, 6, 3, bias=True)
    saved = [t.detach().clone() for t in (fx, conv.weight, conv.bias)]
    versions = [t._version for t in (fx, conv.weight, conv.bias)]
    y = conv(xs)
    y.feats.sum().backward()
    for t, s, v in zip((fx, conv.weight, conv.bias), saved, versions):
        assert torch.equal(t.detach(), s) and t._version == v and t.requires_grad and t.is_leaf
    assert torch.equal(x.feats, saved[0])


def test_non_contiguous_features_give_the_contiguous_result_bitwise() -> None:
    x = _x(c=8)
    strided = x.replace_feats(x.feats[:, ::2])
    dense = x.replace_feats(x.feats[:, ::2].contiguous())
    assert not strided.feats.is_contiguous()
    conv = lnn.SubmConv3d(4, 6, 3, bias=True)
    with torch.no_grad():
        assert torch.equal(conv(strided).feats, conv(dense).feats)
    grads = []
    for t in (strided, dense):
        f = t.feats.detach().clone() if t is dense else x.feats.detach().clone()[:, ::2]
        f.requires_grad_(True)
        conv.zero_grad()
        conv(t.replace_feats(f)).feats.square().sum().backward()
        grads.append((f.grad.clone(), conv.weight.grad.clone(), conv.bias.grad.clone()))
    for u, v in zip(*grads):
        assert torch.equal(u, v)


def test_a_frozen_layer_passes_its_held_layout_to_forward_and_backward() -> None:
    """A weight without a gradient under autograd (a frozen layer, features need one): the cached
    layout's held array serves the forward and the backward; the input gradient is the general
    path's."""
    x = _x()
    conv = lnn.SubmConv3d(4, 6, 3).requires_grad_(False)
    grads = []
    for _ in range(2):  # the second call hits the cache
        f = x.feats.clone().requires_grad_(True)
        conv(x.replace_feats(f)).feats.square().sum().backward()
        grads.append(f.grad)
    p = conv_mod.plan("subm_conv3d", "submanifold", x, conv.weight)
    km = conv_mod.kernel_major_weight(conv.weight, None, 4)
    f = x.feats.clone().requires_grad_(True)
    y = lattice.autograd.ConvFunction.apply(f, km, None, p)
    y.square().sum().backward()
    assert torch.equal(grads[0], f.grad) and torch.equal(grads[1], f.grad)
