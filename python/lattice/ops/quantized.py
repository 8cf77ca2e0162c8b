"""Packed int4 / int8 weights at inference (SEMANTICS.md "Packed affine quantization").

``lattice.ops.linear`` and every convolution accept a :class:`lattice.QuantizedWeight` in place
of a float weight; this module is their quantized path. Contract: the result equals the float op
on ``dequantize_weight(Q).to(feats.dtype)`` within float32 accumulation tolerance. Activations
float32 / float16 / bfloat16 (float64 runs the ``dequant_reference`` route); scales may have any
of float16 / bfloat16 / float32 independently of the activations.

Routes (family ``quantized``, shown by ``lattice.explain``):

* ``cuda_decode_conv`` (CUDA, preferred there): the whole weight decoded on the device to a
  transient array of the activation dtype, then the float conv route of the conv table on it
  (``implicit_gemm_sm80``'s tensor cores for float16 / bfloat16 on sm_80+: the kernels of an f16
  model). The transient array returns to the pool after the call.
* ``cuda_dequant_gemm`` (CUDA, when forced): a SIMT implicit-GEMM kernel that decodes each
  (16 input channels x 64 output channels) slice of W[k] into shared memory inside the kernel
  (f32 accumulation, deterministic): no dequantized copy of the weight in device memory, but
  an order of magnitude slower than the tensor-core route on an H200.
* ``fused_dequant_gemm`` (CPU, preferred): the gather / GEMM / scatter loop of the float
  ``gather_gemm_scatter`` route with W decoded tile by tile (per offset, a block of C_in rows x
  C_out) into a per-thread buffer: no dequantized copy of the whole weight per call.
* ``dequant_reference`` (CPU, or CUDA with f32 / f16 / bf16): the whole weight dequantized, then
  the float conv route of the conv table (``pointwise_matmul`` for linear; on CUDA
  ``cuda_gather_gemm_scatter``).

Devices: features, the packed weight's tensors and bias all on one device (CPU or one CUDA
device); otherwise ``ValueError("[op] weight: expected a tensor on cuda:0, got cpu")``.

Inference only: when features or bias require grad, the output does too, and backward raises
``RuntimeError("[op] weight: expected a float weight for training, got a QuantizedWeight ...")``.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .._core import core, from_core, optional_core, to_core
from .._device import check_device
from ..quantize import QuantizedWeight

ROUTES = ("cuda_decode_conv", "cuda_dequant_gemm", "fused_dequant_gemm", "dequant_reference")


def is_quantized(weight: Any) -> bool:
    return isinstance(weight, QuantizedWeight)


def core_weight(q: QuantizedWeight) -> tuple:
    """The 7 fields the core reads (packed, scales, biases as DLPack capsules)."""
    return (to_core(q.packed), to_core(q.scales), to_core(q.biases), int(q.bits), int(q.group_size),
            str(q.layout), [int(d) for d in q.shape])


def training_error(op: str) -> RuntimeError:
    return RuntimeError(
        f"[{op}] weight: expected a float weight for training, got a QuantizedWeight "
        "(packed weights are inference-only; dequantize_weight() for training)"
    )


class _InferenceOnly(torch.autograd.Function):
    """Runs a quantized forward; its backward is the inference-only error."""

    @staticmethod
    def forward(ctx: Any, feats: torch.Tensor, bias: Optional[torch.Tensor], op: str, run: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.op = op
        return run()

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):  # type: ignore[override]
        raise training_error(ctx.op)


def _check_route(op: str, route: Any) -> Optional[str]:
    if route is not None and not isinstance(route, str):
        raise TypeError(f"[{op}] route: expected a route name (str) or None, got {type(route).__name__}")
    return route


def _check_bias(op: str, bias: Any) -> None:
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"[{op}] bias: expected a torch.Tensor or None, got {type(bias).__name__}")


def _check_devices(op: str, feats: torch.Tensor, weight: QuantizedWeight, bias: Any) -> None:
    """Packed words, scales, biases and bias on the device of the features."""
    for t in (weight.packed, weight.scales, weight.biases):
        check_device(op, "weight", t, feats.device)
    check_device(op, "bias", bias, feats.device)


def _apply(op: str, feats: torch.Tensor, bias: Optional[torch.Tensor], run: Any) -> torch.Tensor:
    if torch.is_grad_enabled() and (feats.requires_grad or (bias is not None and bias.requires_grad)):
        return _InferenceOnly.apply(feats, bias, op, run)
    return run()


def conv_forward(op: str, p: Any, feats: torch.Tensor, weight: QuantizedWeight, bias: Optional[torch.Tensor],
                 route: Optional[str]) -> torch.Tensor:
    """Output features of a planned convolution ``p`` with a packed weight."""
    _check_bias(op, bias)
    route = _check_route(op, route)
    _check_devices(op, feats, weight, bias)

    def run() -> torch.Tensor:
        return from_core(core.quantized_conv_forward(p, to_core(feats), core_weight(weight), optional_core(bias), route))

    return _apply(op, feats, bias, run)


def linear_forward(feats: torch.Tensor, weight: QuantizedWeight, bias: Optional[torch.Tensor],
                   route: Optional[str]) -> torch.Tensor:
    """``feats @ W^T + bias`` for a ``linear`` packed weight (C_out, C_in)."""
    _check_bias("linear", bias)
    route = _check_route("linear", route)
    _check_devices("linear", feats, weight, bias)

    def run() -> torch.Tensor:
        return from_core(core.quantized_linear(to_core(feats), core_weight(weight), optional_core(bias), route))

    return _apply("linear", feats, bias, run)


def explain_conv(p: Any, feats: torch.Tensor, weight: QuantizedWeight, route: Optional[str] = None) -> Any:
    _check_devices(p.op, feats, weight, None)
    return core.explain_quantized_conv(p, to_core(feats), core_weight(weight), _check_route(p.op, route))


def explain_linear(feats: torch.Tensor, weight: QuantizedWeight, route: Optional[str] = None) -> Any:
    _check_devices("linear", feats, weight, None)
    return core.explain_quantized_linear(to_core(feats), core_weight(weight), _check_route("linear", route))


def dequantize_kernel_major(weight: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """What ``dequant_reference`` multiplies by: (K, C_in, C_out) of ``dtype`` (linear: W^T as
    (1, C_in, C_out)), decoded by the core on the weight's device."""
    if not is_quantized(weight):
        raise TypeError(f"[dequantize] weight: expected a lattice.QuantizedWeight, got {type(weight).__name__}")
    like = torch.empty(0, dtype=dtype)
    return from_core(core.quantized_dequantize_kernel_major(core_weight(weight), to_core(like)))
