"""Sparse convolutions (SEMANTICS.md "Convolution").

``Y[o] = sum over edges (i, o, k) of X[i] @ W[k] (+ bias)``. Weights are
``(C_out, Kx, Ky, Kz, C_in)`` (dense layout) or ``(K, C_in, C_out)`` (kernel-major, as TorchSparse /
MinkowskiEngine). Features and weight share one float dtype; float16/bfloat16 accumulate in float32.
Every function is differentiable in features, weight and bias.
"""
from __future__ import annotations

import collections

from typing import Any, Optional, Sequence, Union

import torch

from .._autocast import _eligible as _autocast_eligible
from .._autocast import autocast_dtype, cast
from .._core import as_triple, core, from_core, to_core
from .._device import check_device
from ..autograd import ConvFunction, conv_forward
from ..tensor import SparseTensor
from . import quantized as _quantized

IntOr3 = Union[int, Sequence[int]]


def _kernel_size(op: str, weight: torch.Tensor, kernel_size: Optional[IntOr3]) -> tuple[int, int, int]:
    if _quantized.is_quantized(weight):  # a packed weight: its logical shape stands in for weight.shape
        return _quantized_kernel_size(op, weight, kernel_size)
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"[{op}] weight: expected a torch.Tensor or a lattice.QuantizedWeight, got {type(weight).__name__}")
    if weight.dim() == 5:
        from_weight = tuple(weight.shape[1:4])  # torch.Size holds plain ints
        if kernel_size is None:
            return from_weight  # type: ignore[return-value]
        ks = as_triple(kernel_size, "kernel_size", op)
        if ks != from_weight:
            raise ValueError(
                f"[{op}] weight: expected (C_out, {ks[0]}, {ks[1]}, {ks[2]}, C_in) for kernel_size={ks}, "
                f"got {tuple(weight.shape)}"
            )
        return ks
    if kernel_size is None:
        raise ValueError(
            f"[{op}] kernel_size: expected a kernel size for a weight of shape {tuple(weight.shape)} "
            "(only a (C_out, Kx, Ky, Kz, C_in) weight implies it), got None"
        )
    return as_triple(kernel_size, "kernel_size", op)


def _quantized_kernel_size(op: str, weight: Any, kernel_size: Optional[IntOr3]) -> tuple[int, int, int]:
    """Kernel size of a QuantizedWeight: implied by a dense_5d one, required for kernel_major."""
    if weight.layout == "linear":
        raise ValueError(f"[{op}] weight: expected a QuantizedWeight with layout 'kernel_major' or 'dense_5d', "
                         "got layout 'linear'")
    if weight.layout == "dense_5d":
        from_weight = tuple(int(v) for v in weight.shape[1:4])
        if kernel_size is None:
            return from_weight  # type: ignore[return-value]
        ks = as_triple(kernel_size, "kernel_size", op)
        if ks != from_weight:
            raise ValueError(f"[{op}] weight: expected a QuantizedWeight of logical shape (C_out, {ks[0]}, {ks[1]}, "
                             f"{ks[2]}, C_in) for kernel_size={ks}, got {tuple(weight.shape)}")
        return ks
    if kernel_size is None:
        raise ValueError(f"[{op}] kernel_size: expected a kernel size for a kernel_major QuantizedWeight of logical "
                         f"shape {tuple(weight.shape)}, got None")
    return as_triple(kernel_size, "kernel_size", op)


def _check_input(op: str, x: Any, what: str = "input") -> SparseTensor:
    if not isinstance(x, SparseTensor):
        raise TypeError(f"[{op}] {what}: expected a lattice.SparseTensor, got {type(x).__name__}")
    return x


def plan(
    op: str,
    kind: str,
    x: SparseTensor,
    weight: torch.Tensor,
    *,
    kernel_size: Optional[IntOr3] = None,
    stride: IntOr3 = 1,
    padding: IntOr3 = 0,
    dilation: IntOr3 = 1,
    expand: bool = False,
    coordinates: Optional[SparseTensor] = None,
    route: Optional[str] = None,
    deterministic: bool = True,
    allow_tf32: bool = False,
) -> Any:
    """Validates geometry and builds (or fetches from the cache) the relation of one conv call."""
    _check_input(op, x)
    ks = _kernel_size(op, weight, kernel_size)
    if not (isinstance(weight, torch.Tensor) and weight.device == x._feats.device):  # equal: nothing to check
        check_device(op, "weight", weight, x.device)
    target = None
    if coordinates is not None:
        target = _check_input(op, coordinates, "coordinates")._cs
        check_device(op, "coordinates", coordinates, x.device)
    if route is not None and not isinstance(route, str):
        raise TypeError(f"[{op}] route: expected a route name (str) or None, got {type(route).__name__}")
    if _quantized.is_quantized(weight):
        route = None  # a "quantized" route, passed to the forward (the float route stays the conv table's)
    return core.plan_conv(
        op, kind, x._cs, ks, as_triple(stride, "stride", op), as_triple(padding, "padding", op),
        as_triple(dilation, "dilation", op), bool(expand), bool(deterministic), bool(allow_tf32), route, target,
    )


def _run(p: Any, x: SparseTensor, weight: torch.Tensor, bias: Optional[torch.Tensor], op: str,
         route: Optional[str] = None) -> SparseTensor:
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"[{op}] bias: expected a torch.Tensor or None, got {type(bias).__name__}")
    # torch.autocast: features, weight and bias in the autocast dtype, as torch's conv3d (_autocast.py)
    amp = autocast_dtype(x._feats.device)
    feats_in = x._feats
    if amp is not None:
        feats_in = cast(feats_in, amp)
        bias = cast(bias, amp)
    if _quantized.is_quantized(weight):  # packed int4/int8 weight: inference-only quantized routes
        feats = _quantized.conv_forward(op, p, feats_in, weight, bias, route)
        if p.output.key == x.key:
            return x.replace_feats(feats)
        return SparseTensor._from_core(p.output, feats)
    if bias is not None and bias.device != feats_in.device:
        check_device(op, "bias", bias, x.device)
    if _core_prepares(weight, amp, feats_in):
        # a training weight as it is (dense, float32 master under autocast), permuted and cast inside
        # the autograd node -- on CUDA by the core in one device pass, on the CPU by torch -- and its
        # gradient returned in the same form (ConvFunction)
        feats = ConvFunction.apply(feats_in, weight, bias, p, True if weight.is_cuda else "torch")
    else:
        weight, weight_core = _kernel_major(weight, amp, feats_in.shape[1])
        if torch.is_grad_enabled() and (feats_in.requires_grad or weight.requires_grad or
                                        (bias is not None and bias.requires_grad)):
            feats = ConvFunction.apply(feats_in, weight, bias, p, False, weight_core)
        else:  # nothing to differentiate: the same core call without an autograd node (host time)
            feats = conv_forward(p, feats_in, weight, bias, weight_core)
    # the output features come from the core: a float (N_out, C_out) tensor on x's device, so the
    # result is assembled without the constructor's checks
    out = p.output
    if out.key == x.key:
        return SparseTensor._of(x._cs, x._coords, feats)
    return SparseTensor._of(out, from_core(out.coords()), feats)


# Weight layouts are cached on the weight tensor, keyed by its storage, version counter, dtype and
# the autocast dtype, for weights no gradient is asked of (inference, no_grad, frozen layers). Set
# to False to transform the layout on every call. In-place writes through ``weight.data`` bypass
# torch's version counter (as they bypass autograd's own checks): after such a write, call
# ``lattice.ops.conv.clear_weight_cache(weight)`` or use in-place ops on the weight itself.
CACHE_WEIGHT_LAYOUTS = True
# True (the default): CUDA weights that need a gradient reach the core as they are -- dense or
# kernel-major, and under torch.autocast in their float32 master dtype -- and the core makes the
# kernel-major copy in the feature dtype in one device pass, saves it for the backward and returns
# the weight gradient in the weight's own layout and dtype (see _core_prepares and ConvFunction):
# no torch cast / permute / copy and none of their autograd nodes on every training call.
# Measured on the H200 (docs/performance.md, "Where the host time of a training conv goes"): the
# permutation alone took a MinkUNet42 autocast training step 40.5 -> 36.7 ms in one process. False
# restores torch's cast and permute (tests compare both, bitwise).
CORE_PERMUTES_TRAINING_WEIGHTS = True
# Where the training weight's permute (and its cast under autocast) runs for weights on the CPU:
# True (the default) inside the conv's autograd node (ConvFunction(prepare="torch"): torch's permute
# and one copy in the forward, the kernel-major gradient mapped back by .to(dtype) and a permuted
# view in the backward), False as torch autograd ops before the node (three more nodes per call).
# Same bits either way (exact copies, the same kernels; tests/python/test_conv_host_path.py).
# CPU-measured with scripts/host_overhead.py (docs/host_path.md): the small U-Net's training step
# 0.90x with the node (the subm call alone: no difference beyond noise). The core's own permute
# (the CUDA path) is slower on the CPU (its strided copy: that U-Net step 1.8x), so it stays CUDA's.
PERMUTE_IN_NODE = True
_CACHE_ATTR = "_lattice_kernel_major"


def clear_weight_cache(weight: torch.Tensor) -> None:
    """Drops the cached kernel-major copy of ``weight`` (see ``CACHE_WEIGHT_LAYOUTS``)."""
    if hasattr(weight, _CACHE_ATTR):
        delattr(weight, _CACHE_ATTR)


def _core_prepares(weight: torch.Tensor, amp: Optional[torch.dtype], feats: torch.Tensor) -> bool:
    """True for a weight that needs a gradient (training) when CORE_PERMUTES_TRAINING_WEIGHTS (CUDA)
    or PERMUTE_IN_NODE (any other device): ConvFunction takes it as it is and makes the kernel-major
    copy in the feature dtype inside its node (on CUDA the core, in one device pass; elsewhere
    torch's permute and copy), and returns the gradient in the weight's own layout and dtype. Only when the dtypes agree, or autocast would
    cast the weight to the features' dtype (torch's rule: not float64); any other mismatch takes the
    usual path, whose core call raises the dtype error."""
    if not (weight.requires_grad and torch.is_grad_enabled()):
        return False
    if not (CORE_PERMUTES_TRAINING_WEIGHTS if weight.is_cuda else PERMUTE_IN_NODE):
        return False
    if weight.dim() not in (3, 5):
        return False
    if weight.dtype == feats.dtype:
        return True
    return amp is not None and amp == feats.dtype and _autocast_eligible(weight, amp)


def kernel_major_weight(weight: torch.Tensor, amp: Optional[torch.dtype], c_in: int) -> torch.Tensor:
    """The weight the core reads: kernel-major (K, C_in, C_out), contiguous, in the autocast dtype.

    A dense (C_out, Kx, Ky, Kz, C_in) weight that needs no gradient is permuted and cast by torch
    in one copy on its device, and the result is cached per weight version (CACHE_WEIGHT_LAYOUTS).
    A dense weight that needs a gradient (training) is permuted and cast by torch, and autograd
    maps the gradient back; with ``CORE_PERMUTES_TRAINING_WEIGHTS`` (CUDA) / ``PERMUTE_IN_NODE``
    (CPU) a conv call hands such a weight to ConvFunction as it is instead (_core_prepares), which
    permutes it inside the autograd node and returns its gradient in the same dense layout, saving
    the autograd nodes of torch's permute / copy on every call (host time that decides a training
    step on the GPU). A 3-D weight is already kernel-major and is only cast under
    autocast; a 5-D weight whose shape does not match is left to the core, which raises the shape
    error.
    """
    return _kernel_major(weight, amp, c_in)[0]


def _kernel_major(weight: torch.Tensor, amp: Optional[torch.dtype], c_in: int) -> tuple[torch.Tensor, Any]:
    """:func:`kernel_major_weight` and, for a cached layout, the core's array of it
    (``core.HeldArray``, made once per cache entry: the per-call DLPack conversion of the cached
    tensor is skipped); None otherwise (the caller converts the tensor)."""
    dense = weight.dim() == 5 and weight.shape[4] == c_in
    if not dense:
        return cast(weight, amp), None
    needs_grad = weight.requires_grad and torch.is_grad_enabled()
    if needs_grad and weight.is_cuda and CORE_PERMUTES_TRAINING_WEIGHTS:
        return cast(weight, amp).contiguous(), None
    dtype = amp if (amp is not None and weight.dtype != torch.float64 and weight.dtype != amp) else weight.dtype
    key = None
    if CACHE_WEIGHT_LAYOUTS and not needs_grad:
        key = (weight.data_ptr(), weight._version, weight.dtype, dtype, weight.shape, weight.stride())
        hit = getattr(weight, _CACHE_ATTR, None)
        if hit is not None and hit[0] == key:
            return hit[1], hit[2]
    kv = int(weight.shape[1]) * int(weight.shape[2]) * int(weight.shape[3])
    km = weight.permute(1, 2, 3, 4, 0).reshape(kv, weight.shape[4], weight.shape[0])
    # One copy that permutes and casts (``to(memory_format=...)`` would return the 3-D view itself:
    # torch only recognises channels-last formats, so the view counts as "contiguous format").
    km = torch.empty(km.shape, dtype=dtype, device=weight.device).copy_(km)
    if key is not None:
        held_km = core.hold(to_core(km))  # km is contiguous: the core can hold it as it is
        try:
            setattr(weight, _CACHE_ATTR, (key, km, held_km))
        except (AttributeError, RuntimeError):  # e.g. a tensor subclass without a __dict__
            return km, None
        return km, held_km
    return km, None


def conv3d(
    input: SparseTensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    kernel_size: Optional[IntOr3] = None,
    stride: IntOr3 = 1,
    padding: IntOr3 = 0,
    dilation: IntOr3 = 1,
    coordinates: Optional[SparseTensor] = None,
    expand: bool = False,
    route: Optional[str] = None,
    deterministic: bool = True,
    allow_tf32: bool = False,
) -> SparseTensor:
    """Forward (strided) sparse convolution.

    Output support: with stride 1 the input rows (same identity); otherwise the unique
    ``floor_div(coords, stride)`` in first-occurrence order (``expand=True``: every output whose
    window holds an input). With ``coordinates=target`` the output is exactly the target's rows
    (the target must carry the output stride). Output stride = input stride * stride.

    Args:
        input: SparseTensor (N_in, C_in).
        weight: (C_out, Kx, Ky, Kz, C_in) or (K, C_in, C_out), same dtype as the features.
            Or a ``lattice.QuantizedWeight`` (layout dense_5d or kernel_major; inference only,
            see ``lattice.ops.quantized``), for every conv op of this module.
        bias: optional (C_out,).
        kernel_size: int or 3 ints; implied by a 5-D weight, required for a 3-D one.
        stride, padding, dilation: int or 3 ints (>= 1, >= 0, >= 1).
        coordinates: optional target SparseTensor.
        expand: spconv-style output growth (no target only).
        route: force a route by name ("reference", "gather_gemm_scatter", ...); raises when the
            route is not admitted for this problem.
            With a QuantizedWeight: "fused_dequant_gemm", "cuda_decode_conv", "cuda_dequant_gemm" or "dequant_reference".
    """
    kind = "target" if coordinates is not None else "forward"
    p = plan("conv3d", kind, input, weight, kernel_size=kernel_size, stride=stride, padding=padding,
             dilation=dilation, expand=expand, coordinates=coordinates, route=route,
             deterministic=deterministic, allow_tf32=allow_tf32)
    return _run(p, input, weight, bias, "conv3d", route)


def subm_conv3d(
    input: SparseTensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    kernel_size: Optional[IntOr3] = None,
    dilation: IntOr3 = 1,
    route: Optional[str] = None,
    deterministic: bool = True,
    allow_tf32: bool = False,
) -> SparseTensor:
    """Submanifold convolution: output rows are the input rows (same identity); odd kernels only."""
    p = plan("subm_conv3d", "submanifold", input, weight, kernel_size=kernel_size, dilation=dilation,
             route=route, deterministic=deterministic, allow_tf32=allow_tf32)
    return _run(p, input, weight, bias, "subm_conv3d", route)


def conv_transpose3d(
    input: SparseTensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    kernel_size: Optional[IntOr3] = None,
    stride: IntOr3 = 1,
    padding: IntOr3 = 0,
    dilation: IntOr3 = 1,
    coordinates: Optional[SparseTensor] = None,
    route: Optional[str] = None,
    deterministic: bool = True,
    allow_tf32: bool = False,
) -> SparseTensor:
    """Transposed sparse convolution (indexed offsets ``0..K-1`` times dilation).

    Without ``coordinates`` the output is the unique ``coords*stride + offset - padding`` in
    first-occurrence order; with ``coordinates=target`` (typically the skip connection of a U-Net)
    it is exactly the target's rows and identity. Output stride = input stride / stride (exact).
    """
    kind = "transposed_target" if coordinates is not None else "transposed"
    p = plan("conv_transpose3d", kind, input, weight, kernel_size=kernel_size, stride=stride, padding=padding,
             dilation=dilation, coordinates=coordinates, route=route, deterministic=deterministic,
             allow_tf32=allow_tf32)
    out = _run(p, input, weight, bias, "conv_transpose3d", route)
    if coordinates is None:
        note_generated(out.key, len(input), len(out), "conv_transpose3d")
    return out


# Coordinate identities whose rows a transposed conv generated (no coordinates=): lets ops.cat name
# that cause when a U-Net skip concatenation then fails (a migration trap: TorchSparse and
# MinkowskiEngine land transposed convs on the encoder's coordinates implicitly). Bounded.
GENERATED: "collections.OrderedDict[int, tuple[int, int, str]]" = collections.OrderedDict()


def note_generated(key: int, n_in: int, n_out: int, op: str) -> None:
    GENERATED[key] = (n_in, n_out, op)
    while len(GENERATED) > 4096:
        GENERATED.popitem(last=False)


def generative_conv_transpose3d(
    input: SparseTensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    kernel_size: Optional[IntOr3] = None,
    stride: IntOr3 = 1,
    dilation: IntOr3 = 1,
    route: Optional[str] = None,
    deterministic: bool = True,
    allow_tf32: bool = False,
) -> SparseTensor:
    """Generative transposed convolution: every child ``coords*stride + offset`` (deduplicated)."""
    p = plan("generative_conv_transpose3d", "generative", input, weight, kernel_size=kernel_size, stride=stride,
             dilation=dilation, route=route, deterministic=deterministic, allow_tf32=allow_tf32)
    return _run(p, input, weight, bias, "generative_conv_transpose3d", route)


# op name -> (relation kind chooser, accepted keywords), used by lattice.explain
CONV_OPS = {
    "conv3d": conv3d,
    "subm_conv3d": subm_conv3d,
    "conv_transpose3d": conv_transpose3d,
    "generative_conv_transpose3d": generative_conv_transpose3d,
}
