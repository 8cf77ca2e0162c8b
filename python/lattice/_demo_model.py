"""The network and the per-layer profile of ``python -m lattice.demo`` (helpers; see lattice/demo.py).

* ``SparseUNet``: a small MinkUNet-style sparse U-Net from ``lattice.nn``;
* ``LayerProfiler``: forward hooks that record every leaf lattice module call (rows, channels,
  stride, time, the relation it uses) and, on request, the route ``lattice.explain`` chooses;
* ``layer_table``: the per-layer table (route, relation built/reused, cold and hot time).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

import lattice
from lattice import nn as lnn
from lattice import ops
from lattice.tensor import SparseTensor


# ------------------------------------------------------------------------------------------------
# The network
# ------------------------------------------------------------------------------------------------


class ConvBlock(torch.nn.Module):
    """conv -> BatchNorm -> ReLU; ``forward(x, target)`` passes ``target`` to (transposed) convs."""

    def __init__(self, conv: torch.nn.Module) -> None:
        super().__init__()
        self.conv = conv
        self.bn = lnn.BatchNorm(conv.out_channels)
        self.relu = lnn.ReLU()

    def forward(self, x: SparseTensor, target: Optional[SparseTensor] = None) -> SparseTensor:
        y = self.conv(x) if target is None else self.conv(x, target)  # positional: hooks see it
        return self.relu(self.bn(y))


class ResidualBlock(torch.nn.Module):
    """Two submanifold k3 convs with BatchNorm; ReLU after adding the shortcut.

    The shortcut is the input, or a 1x1 submanifold conv + BatchNorm when the channel count
    changes (a kernel-1 identity relation: the route layer runs it as a plain matmul).
    """

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv1 = lnn.SubmConv3d(c_in, c_out, 3)
        self.bn1 = lnn.BatchNorm(c_out)
        self.relu1 = lnn.ReLU()
        self.conv2 = lnn.SubmConv3d(c_out, c_out, 3)
        self.bn2 = lnn.BatchNorm(c_out)
        self.proj: Optional[torch.nn.Module] = None
        if c_in != c_out:
            self.proj = torch.nn.Sequential(lnn.SubmConv3d(c_in, c_out, 1), lnn.BatchNorm(c_out))
        self.relu2 = lnn.ReLU()

    def forward(self, x: SparseTensor) -> SparseTensor:
        y = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        shortcut = x if self.proj is None else self.proj(x)
        return self.relu2(y.replace_feats(y.feats + shortcut.feats))


class SparseUNet(torch.nn.Module):
    """A three-level sparse U-Net (strides 1, 2, 4, 8) with width ``c`` at full resolution.

    encoder: stem subm k3 (c_in -> c); per level a k2 s2 conv (doubling channels) and a
    residual block. decoder: per level a k2 s2 transposed conv onto the skip's coordinates,
    concatenation with the skip, a residual block (1x1 projection for the channel change);
    the last level a subm k3 block. head: a per-voxel linear layer to the classes.
    """

    def __init__(self, c_in: int, c: int, num_classes: int) -> None:
        super().__init__()
        w = [c, 2 * c, 4 * c, 8 * c]
        self.stem = ConvBlock(lnn.SubmConv3d(c_in, w[0], 3))
        self.down1 = ConvBlock(lnn.Conv3d(w[0], w[1], 2, stride=2))
        self.enc1 = ResidualBlock(w[1], w[1])
        self.down2 = ConvBlock(lnn.Conv3d(w[1], w[2], 2, stride=2))
        self.enc2 = ResidualBlock(w[2], w[2])
        self.down3 = ConvBlock(lnn.Conv3d(w[2], w[3], 2, stride=2))
        self.enc3 = ResidualBlock(w[3], w[3])
        self.up3 = ConvBlock(lnn.ConvTranspose3d(w[3], w[2], 2, stride=2))
        self.dec3 = ResidualBlock(2 * w[2], w[2])
        self.up2 = ConvBlock(lnn.ConvTranspose3d(w[2], w[1], 2, stride=2))
        self.dec2 = ResidualBlock(2 * w[1], w[1])
        self.up1 = ConvBlock(lnn.ConvTranspose3d(w[1], w[0], 2, stride=2))
        self.dec1 = ConvBlock(lnn.SubmConv3d(2 * w[0], w[0], 3))
        self.head = lnn.Linear(w[0], num_classes)

    def forward(self, x: SparseTensor) -> tuple[SparseTensor, list[SparseTensor]]:
        """Returns the per-voxel logits (on the input's coordinates) and the encoder levels."""
        s0 = self.stem(x)
        s1 = self.enc1(self.down1(s0))
        s2 = self.enc2(self.down2(s1))
        s3 = self.enc3(self.down3(s2))
        u2 = self.dec3(ops.cat([self.up3(s3, s2), s2]))
        u1 = self.dec2(ops.cat([self.up2(u2, s1), s1]))
        u0 = self.dec1(ops.cat([self.up1(u1, s0), s0]))
        return self.head(u0), [s0, s1, s2, s3]


# ------------------------------------------------------------------------------------------------
# Per-layer profiling
# ------------------------------------------------------------------------------------------------

_CONV_OPS: dict[type, str] = {
    lnn.SubmConv3d: "subm_conv3d",
    lnn.Conv3d: "conv3d",
    lnn.ConvTranspose3d: "conv_transpose3d",
}
_PROFILED = (lnn.SubmConv3d, lnn.Conv3d, lnn.ConvTranspose3d, lnn.Linear, lnn.BatchNorm, lnn.ReLU)


@dataclass
class LayerCall:
    """One call of a leaf module during a forward pass (sizes and keys only: no tensors are kept,
    so recording a pass does not hold on to its activations)."""

    name: str
    module: torch.nn.Module
    n_in: int
    c_in: int
    stride_in: str
    relation_key: Optional[tuple[Any, ...]]  # convs: what the relation cache keys the relation by
    n_out: int = 0
    c_out: int = 0
    stride_out: str = ""
    seconds: float = 0.0
    route: str = ""  # filled by an explain pass


class LayerProfiler:
    """Records every leaf lattice module call with forward hooks; ``take()`` returns one pass.

    With ``explain = True`` the pre-hook also asks ``lattice.explain`` for the route of each conv
    (forward, input-grad and weight-grad passes) with the module's own arguments; use that on an
    untimed pass.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls: list[LayerCall] = []
        self.explain = False
        self._start: list[float] = []
        self._handles: list[Any] = []
        for name, module in model.named_modules():
            if isinstance(module, _PROFILED):
                self._handles.append(module.register_forward_pre_hook(self._pre(name)))
                self._handles.append(module.register_forward_hook(self._post))

    def _pre(self, name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, inputs: tuple[Any, ...]) -> None:
            x: SparseTensor = inputs[0]
            target: Optional[SparseTensor] = inputs[1] if len(inputs) > 1 else None
            key = _relation_key(module, x, target) if type(module) in _CONV_OPS else None
            call = LayerCall(name, module, len(x), int(x.feats.shape[1]), _stride(x), key)
            if self.explain and type(module) in _CONV_OPS:
                routes = [conv_route(module, x, target, p) for p in ("forward", "input_grad", "weight_grad")]
                call.route = routes[0] if len(set(routes)) == 1 else "/".join(routes)
            self.calls.append(call)
            self._start.append(time.perf_counter())

        return hook

    def _post(self, module: torch.nn.Module, inputs: tuple[Any, ...], output: SparseTensor) -> None:
        elapsed = time.perf_counter() - self._start.pop()
        call = next(c for c in reversed(self.calls) if c.module is module)
        call.seconds, call.n_out, call.c_out, call.stride_out = elapsed, len(output), int(output.feats.shape[1]), _stride(output)

    def take(self) -> list[LayerCall]:
        """The calls recorded since the last ``take``, in call order."""
        calls, self.calls = self.calls, []
        return calls

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def _relation_key(module: torch.nn.Module, x: SparseTensor, target: Optional[SparseTensor]) -> tuple[Any, ...]:
    """What the relation cache keys a conv call's relation by (input, target, op kind, geometry)."""
    geometry = tuple(getattr(module, a, None) for a in ("kernel_size", "stride", "padding", "dilation", "expand"))
    return (_CONV_OPS[type(module)], x.key, None if target is None else target.key, geometry)


def conv_route(module: torch.nn.Module, x: SparseTensor, target: Optional[SparseTensor], pass_: str = "forward") -> str:
    """The route ``lattice.explain`` reports for this conv module called on ``x`` (and ``target``)."""
    op = _CONV_OPS[type(module)]
    kw: dict[str, Any] = {"kernel_size": module.kernel_size, "dilation": module.dilation}
    if op != "subm_conv3d":
        kw.update(stride=module.stride, padding=module.padding, coordinates=target)
    if op == "conv3d":
        kw["expand"] = module.expand
    return lattice.explain(op, x, module.weight, pass_=pass_, **kw).chosen or "none admitted"


# ------------------------------------------------------------------------------------------------
# Report formatting
# ------------------------------------------------------------------------------------------------


def _stride(t: SparseTensor) -> str:
    s = t.stride
    return str(s[0]) if s[0] == s[1] == s[2] else "x".join(map(str, s))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    """A plain text table: a header, a rule, one line per row; ``right`` columns right-aligned."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def _min_seconds(samples: list[list[LayerCall]]) -> list[float]:
    """Per call position, the fastest of the passes (every pass makes the same calls in order)."""
    return [min(calls[i].seconds for calls in samples) for i in range(len(samples[0]))]


def layer_table(
    cold: list[list[LayerCall]], hot: list[list[LayerCall]], routes: list[LayerCall]
) -> tuple[str, float, float]:
    """The per-layer table (convs and the head) and the summed BatchNorm/ReLU times (cold, hot).

    ``cold``/``hot`` hold the calls of several forward passes (times: the per-layer minimum);
    ``routes`` is an explain pass. The "relation" column says whether the cold pass built the
    layer's relation or reused one that an earlier layer built for the same coordinates and
    geometry.
    """
    cold_s, hot_s = _min_seconds(cold), _min_seconds(hot)
    seen: set[tuple[Any, ...]] = set()
    rows = []
    feature_cold = feature_hot = 0.0
    for i, (c, r) in enumerate(zip(cold[0], routes)):
        m = c.module
        if isinstance(m, (lnn.BatchNorm, lnn.ReLU)):
            feature_cold += cold_s[i]
            feature_hot += hot_s[i]
            continue
        if c.relation_key is not None:
            k, s = m.kernel_size, getattr(m, "stride", (1, 1, 1))
            op_text = _CONV_OPS[type(m)] + (f" k{k[0]}" if k[0] == k[1] == k[2] else " k" + "x".join(map(str, k)))
            op_text += (f" s{s[0]}" if s != (1, 1, 1) else "") + (" >skip" if c.relation_key[2] is not None else "")
            relation = "reused" if c.relation_key in seen else "built"
            seen.add(c.relation_key)
            route = r.route
        else:
            op_text, route, relation = "linear", "torch.nn.Linear", "-"
        rows.append([
            c.name, op_text, f"{c.n_in:,}", f"{c.n_out:,}", str(c.c_in), str(c.c_out),
            f"{c.stride_in}->{c.stride_out}", route, relation, _ms(cold_s[i]), _ms(hot_s[i]),
        ])
    headers = ["layer", "op", "N in", "N out", "C in", "C out", "stride", "route (fwd[/dx/dW])", "relation",
               "cold ms", "hot ms"]
    right = [False, False, True, True, True, True, False, False, False, True, True]
    return format_table(headers, rows, right), feature_cold, feature_hot


