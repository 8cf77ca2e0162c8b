"""Benchmark cases by group, and the presets that select them.

Groups (BENCHMARKS.md "Axes"): ``conv`` (submanifold k3, forward k2 s2 and k3 s2, transposed k2 s2
onto a target, generative k2 s2, pointwise k1), ``relations`` (coordinate index and map building
alone), ``pooling`` (max k2 s2, avg k3 s2, global avg, unpool k2 s2 onto the skip), ``point_voxel`` (sparse_quantize), ``networks`` (MinkUNet42),
``quantized`` (packed int4 / int8 weights vs f32 / f16: a subm3 conv and MinkUNet42 inference).

A case is labelled by public shape — group / operation geometry / workload / channels — and records
the route that ran beside its numbers. Dtype and device are properties of the run, not of the name,
so ``--compare`` can put a float16 run next to a float32 one.

Conv timings (milliseconds, median and p95 of the repeats):

=============  ====================================================================================
``map_cold``   fresh SparseTensor(s) + ``lattice.ops.conv.plan`` (coordinate index + relation)
``map_hot``    ``plan`` on a tensor whose relation is cached (the cache lookup)
``cold``       fresh SparseTensor(s) + the public op: map building + forward (BENCHMARKS "cold")
``hot``        the public op on a tensor whose relation is cached: forward only (BENCHMARKS "hot")
``input_grad`` ``core.conv_backward`` with only the input gradient requested (relation cached)
``weight_grad`` ``core.conv_backward`` with only the weight gradient requested
``fwd_bwd``    the public op with features and weight requiring grad, then ``torch.autograd.grad``
=============  ====================================================================================
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch

import lattice
from lattice import models
from lattice import nn as lnn
from lattice import ops
from lattice._core import core, from_core, to_core
from lattice.tensor import SparseTensor

from . import anchors, workloads
from .timing import measure

# -- run context -------------------------------------------------------------------------------------


@dataclass
class Context:
    """What every case needs: device, dtype, repeat policy and the same-run ceilings."""

    device: str
    dtype: torch.dtype
    repeats: Optional[int] = None
    warmup: int = 1
    ceilings: dict = field(default_factory=dict)
    seed: int = 0

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).replace("torch.", "")

    def generator(self, salt: int) -> torch.Generator:
        return torch.Generator(device="cpu").manual_seed(self.seed * 1_000_003 + salt)

    def randn(self, *shape: int, salt: int, scale: float = 1.0) -> torch.Tensor:
        """Fresh random values (never zeros), generated on CPU for reproducibility, then moved."""
        t = torch.randn(*shape, generator=self.generator(salt)) * scale
        return t.to(device=self.device, dtype=self.dtype)

    def time(self, fn: Callable[[Any], Any], setup: Optional[Callable[[], Any]] = None,
             repeats: Optional[int] = None) -> dict:
        return measure(fn, device=self.device, repeats=repeats or self.repeats, warmup=self.warmup,
                       setup=setup).as_dict()


@dataclass
class Case:
    """One benchmark: ``run(ctx)`` returns the result dict (see report.py for its fields)."""

    name: str
    group: str
    run: Callable[[Context], dict]
    workload: str = ""


class CaseSkipped(Exception):
    """Raised by a case that cannot run here; the message is the printed reason."""


# -- metric helpers ----------------------------------------------------------------------------------


def _rate(amount: Optional[float], timing: Optional[dict]) -> Optional[float]:
    if amount is None or timing is None or not timing.get("median_ms"):
        return None
    return amount / (timing["median_ms"] * 1e-3)


def attach_rates(result: dict, ctx: Context, work: dict[str, tuple[Optional[float], Optional[float]]]) -> None:
    """For each timing with known work (flop, bytes): achieved FLOP/s, bytes/s and % of the ceilings."""
    rates = {}
    gemm = ctx.ceilings.get("gemm_flops")
    copy = ctx.ceilings.get("copy_bytes_per_s")
    for key, (flop, nbytes) in work.items():
        t = result["timings"].get(key)
        if t is None:
            continue
        f, b = _rate(flop, t), _rate(nbytes, t)
        rates[key] = {
            "flop": flop,
            "bytes": nbytes,
            "flop_per_s": f,
            "bytes_per_s": b,
            "pct_gemm_ceiling": (100.0 * f / gemm) if (f is not None and gemm) else None,
            "pct_copy_ceiling": (100.0 * b / copy) if (b is not None and copy) else None,
        }
    result["rates"] = rates


def attach_anchor(result: dict, ctx: Context, columns: dict[str, str], row: Optional[dict[str, float]]) -> None:
    """our/anchor ratios for the timings that match a column of an anchor row (lower is better)."""
    if row is None or result.get("workload_source") != "shared":
        return
    ratios = {}
    for timing_key, col in columns.items():
        t = result["timings"].get(timing_key)
        if t is not None and col in row:
            ratios[timing_key] = {"anchor_ms": row[col], "ours_ms": t["median_ms"], "ratio": t["median_ms"] / row[col],
                                  "column": col}
    if ratios:
        result["anchor"] = {"engine": anchors.describe(ctx.device, ctx.dtype_name), "ratios": ratios}


# -- convolution -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConvGeometry:
    tag: str  # name part: subm3, k2s2, k3s2, tr_k2s2, gen_k2s2, pw
    op: str  # public op name
    kind: str  # relation kind
    kernel: int
    stride: int
    coarse_input: bool  # input is the k2 s2 parent of the workload (transposed, generative)
    onto_target: bool  # output lands on the workload's own rows (transposed onto skip)
    anchor_columns: tuple[tuple[str, str], ...] = ()


GEOMETRIES = {
    g.tag: g
    for g in (
        ConvGeometry("subm3", "subm_conv3d", "submanifold", 3, 1, False, False,
                     (("hot", "subm3_hot"), ("cold", "subm3_cold"), ("fwd_bwd", "subm3_fwd_bwd"))),
        ConvGeometry("k2s2", "conv3d", "forward", 2, 2, False, False, (("cold", "k2s2_cold"),)),
        ConvGeometry("k3s2", "conv3d", "forward", 3, 2, False, False),
        ConvGeometry("tr_k2s2", "conv_transpose3d", "transposed_target", 2, 2, True, True),
        ConvGeometry("gen_k2s2", "generative_conv_transpose3d", "generative", 2, 2, True, False),
        ConvGeometry("pw", "subm_conv3d", "submanifold", 1, 1, False, False),
    )
}

_OP_FN = {
    "subm_conv3d": ops.subm_conv3d,
    "conv3d": ops.conv3d,
    "conv_transpose3d": ops.conv_transpose3d,
    "generative_conv_transpose3d": ops.generative_conv_transpose3d,
}


class _ConvSetup:
    """Inputs of one conv case on the device: coordinates, features, weight, gradient."""

    def __init__(self, ctx: Context, geom: ConvGeometry, workload: str, c_in: int, c_out: int) -> None:
        self.ctx, self.geom = ctx, geom
        dev = ctx.device
        fine = torch.from_numpy(np.array(workloads.coords(workload))).to(dev)
        self.fine = fine
        if geom.coarse_input:
            probe = SparseTensor(fine, torch.empty(fine.shape[0], 0, device=dev))
            pw = torch.empty(1, 2, 2, 2, 1, device=dev)
            p = ops.conv.plan("conv3d", "forward", probe, pw, kernel_size=2, stride=2)
            self.in_coords, self.in_stride = from_core(p.output.coords()).clone(), 2
        else:
            self.in_coords, self.in_stride = fine, 1
        n_in = self.in_coords.shape[0]
        self.feats = ctx.randn(n_in, c_in, salt=1)
        k = geom.kernel
        self.weight = ctx.randn(c_out, k, k, k, c_in, salt=2, scale=1.0 / math.sqrt(c_in * k**3))
        self.target_feats = torch.empty(fine.shape[0], 0, device=dev, dtype=ctx.dtype)
        self.kw: dict[str, Any] = {"kernel_size": k}
        if geom.stride != 1:
            self.kw["stride"] = geom.stride

    def fresh(self) -> tuple[SparseTensor, Optional[SparseTensor]]:
        """New SparseTensors (new coordinate identities, nothing cached) over the same values."""
        x = SparseTensor(self.in_coords, self.feats, stride=self.in_stride)
        t = SparseTensor(self.fine, self.target_feats) if self.geom.onto_target else None
        return x, t

    def kwargs(self, target: Optional[SparseTensor]) -> dict:
        kw = dict(self.kw)
        if target is not None:
            kw["coordinates"] = target
        return kw

    def call(self, x: SparseTensor, target: Optional[SparseTensor],
             weight: Optional[torch.Tensor] = None) -> SparseTensor:
        return _OP_FN[self.geom.op](x, self.weight if weight is None else weight, **self.kwargs(target))

    def plan(self, x: SparseTensor, target: Optional[SparseTensor]) -> Any:
        return ops.conv.plan(self.geom.op, self.geom.kind, x, self.weight, **self.kwargs(target))

    def routes(self, x: SparseTensor, target: Optional[SparseTensor]) -> dict[str, Optional[str]]:
        out = {}
        for pass_ in ("forward", "input_grad", "weight_grad"):
            out[pass_] = lattice.explain(self.geom.op, x, self.weight, pass_=pass_, **self.kwargs(target)).chosen
        return out


def _relation_fields(p: Any) -> dict:
    r = p.relation
    return {
        "relation_kind": r.kind,
        "n_in": int(r.n_in),
        "n_out": int(r.n_out),
        "pairs": int(r.n_edges),
        "kernel_volume": int(r.kernel_volume),
        "avg_offsets": (r.n_edges / r.n_out) if r.n_out else 0.0,
    }


def conv_work(n_in: int, n_out: int, pairs: int, kvol: int, c_in: int, c_out: int,
              esize: int) -> dict[str, tuple[float, float]]:
    """(FLOP, bytes) per timed pass. FLOP = 2 * pairs * C_in * C_out per pass. Bytes (estimate):
    gathered source rows + weights + written rows; weight grad reads both sides of every pair."""
    flop = 2.0 * pairs * c_in * c_out
    wbytes = kvol * c_in * c_out * esize
    fwd = (pairs * c_in + n_out * c_out) * esize + wbytes
    dx = (pairs * c_out + n_in * c_in) * esize + wbytes
    dw = pairs * (c_in + c_out) * esize + wbytes
    return {
        "cold": (flop, fwd),
        "hot": (flop, fwd),
        "input_grad": (flop, dx),
        "weight_grad": (flop, dw),
        "fwd_bwd": (3 * flop, fwd + dx + dw),
    }


def conv_case(tag: str, workload: str, c_in: int, c_out: int) -> Case:
    geom = GEOMETRIES[tag]
    chan = f"C{c_in}" if c_in == c_out else f"C{c_in}x{c_out}"
    name = f"conv/{tag}/{workload}/{chan}"

    def run(ctx: Context) -> dict:
        s = _ConvSetup(ctx, geom, workload, c_in, c_out)
        x, tgt = s.fresh()
        s.call(x, tgt)  # builds and caches the relation of the hot tensor
        p = s.plan(x, tgt)
        res: dict[str, Any] = {
            "op": geom.op, "kernel_size": geom.kernel, "stride": geom.stride, "c_in": c_in, "c_out": c_out,
            **_relation_fields(p),
        }
        res["routes"] = s.routes(x, tgt)
        res["route"] = res["routes"]["forward"]
        gy = ctx.randn(res["n_out"], c_out, salt=3)
        timings: dict[str, dict] = {}

        timings["map_cold"] = ctx.time(lambda a: s.plan(*a), setup=s.fresh)
        timings["map_hot"] = ctx.time(lambda _: s.plan(x, tgt))
        timings["cold"] = ctx.time(lambda a: s.call(*a), setup=s.fresh)
        with torch.no_grad():
            timings["hot"] = ctx.time(lambda _: s.call(x, tgt))

        def backward(need_x: bool, need_w: bool) -> Callable[[Any], Any]:
            def fn(_: Any) -> list:
                grads = core.conv_backward(p, to_core(s.feats), to_core(s.weight), to_core(gy), need_x, need_w, False)
                return [from_core(g) for g in grads if g is not None]
            return fn

        timings["input_grad"] = ctx.time(backward(True, False))
        timings["weight_grad"] = ctx.time(backward(False, True))
        fx = s.feats.clone().requires_grad_(True)
        fw = s.weight.clone().requires_grad_(True)
        xg = x.replace_feats(fx)  # same coordinate identity: relation stays cached

        def fwd_bwd(_: Any) -> Any:
            y = s.call(xg, tgt, fw)
            return torch.autograd.grad(y.feats, (fx, fw), gy)

        timings["fwd_bwd"] = ctx.time(fwd_bwd)
        res["timings"] = timings
        res["workload_source"] = workloads.source(workload)
        esize = torch.empty(0, dtype=ctx.dtype).element_size()
        work = conv_work(res["n_in"], res["n_out"], res["pairs"], res["kernel_volume"], c_in, c_out, esize)
        attach_rates(res, ctx, work)
        if c_in == c_out and geom.anchor_columns:
            row = anchors.conv_anchor(ctx.device, ctx.dtype_name, workload, c_in)
            attach_anchor(res, ctx, dict(geom.anchor_columns), row)
        return res

    return Case(name, "conv", run, workload)


# -- relations / coordinates (map building alone) ----------------------------------------------------


def relation_case(tag: str, workload: str, channels: int = 32) -> Case:
    """Coordinate index and relation building alone; the route is the forward route of the conv
    (at ``channels`` in and out) that would consume the relation."""
    geom = GEOMETRIES[tag]
    name = f"relations/{tag}/{workload}"

    def run(ctx: Context) -> dict:
        s = _ConvSetup(ctx, geom, workload, channels, channels)
        x, tgt = s.fresh()
        p = s.plan(x, tgt)
        res: dict[str, Any] = {"op": geom.op, "kernel_size": geom.kernel, "stride": geom.stride, **_relation_fields(p)}
        res["route"] = lattice.explain(geom.op, x, s.weight, **s.kwargs(tgt)).chosen
        res["route_note"] = f"forward route of the C{channels} conv consuming this relation"
        # Device memory of the relation after one forward on a fresh tensor: its stored map plus the
        # views that forward's route reads (Relation.view_bytes; every other view is built on demand).
        xf, tf = s.fresh()
        s.call(xf, tf)
        rf = s.plan(xf, tf).relation
        res["forward_views"] = rf.built_views()
        res["forward_view_bytes"] = int(rf.view_bytes)
        res["forward_bytes_per_edge"] = res["forward_view_bytes"] / res["pairs"] if res["pairs"] else 0.0

        def index(a: tuple) -> Any:
            xi, ti = a
            xi.validate()  # builds the coordinate hash index (and checks rows are unique)
            if ti is not None:
                ti.validate()
            return a

        res["timings"] = {
            "index": ctx.time(index, setup=s.fresh),
            "map_cold": ctx.time(lambda a: s.plan(*a), setup=s.fresh),
            "map_hot": ctx.time(lambda _: s.plan(x, tgt)),
        }
        res["workload_source"] = workloads.source(workload)
        res["rates"] = {}
        return res

    return Case(name, "relations", run, workload)


# -- point / voxel -----------------------------------------------------------------------------------


def quantize_case(points_name: str, voxel: float) -> Case:
    name = f"point_voxel/sparse_quantize/{points_name}/v{voxel:g}"

    def run(ctx: Context) -> dict:
        pts = torch.from_numpy(np.array(workloads.points(points_name))).to(ctx.device)
        c, inv, counts = ops.sparse_quantize(pts, voxel)
        m, n = int(c.shape[0]), int(pts.shape[0])
        res: dict[str, Any] = {
            "op": "sparse_quantize", "voxel_size": voxel, "n_in": n, "n_out": m, "pairs": n,
            "avg_offsets": n / m if m else 0.0,
            "route": lattice.explain("sparse_quantize", pts).chosen,
            "route_note": "pairs = point->voxel pairs; avg = points per voxel",
        }
        res["timings"] = {"quantize": ctx.time(lambda _: ops.sparse_quantize(pts, voxel))}
        res["workload_source"] = "kitti scan" if points_name.startswith("kitti") else "lattice.bench"
        # bytes: read points, write (M, 4) int32 coords, (P,) int64 inverse, (M,) int64 counts
        nbytes = float(n * pts.element_size() * 3 + m * 16 + n * 8 + m * 8)
        attach_rates(res, ctx, {"quantize": (None, nbytes)})
        return res

    return Case(name, "point_voxel", run, points_name)


# -- pooling -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolGeometry:
    tag: str  # name part: max_k2s2, avg_k3s2, global_avg, unpool_k2s2
    op: str  # public op name
    kernel: int  # 0 for global pooling
    stride: int
    coarse_input: bool  # input is the k2 s2 parent of the workload, output lands on the workload (unpool)


POOL_GEOMETRIES = {
    g.tag: g
    for g in (
        PoolGeometry("max_k2s2", "max_pool3d", 2, 2, False),
        PoolGeometry("avg_k3s2", "avg_pool3d", 3, 2, False),
        PoolGeometry("global_avg", "global_avg_pool", 0, 1, False),
        PoolGeometry("unpool_k2s2", "pool_transpose3d", 2, 2, True),
    )
}
POOL_TAGS = tuple(POOL_GEOMETRIES)


def pool_case(tag: str, workload: str, channels: int) -> Case:
    """Pooling timings: ``map_cold`` (fresh tensor + plan), ``cold`` (fresh tensor + op), ``hot``
    (op on a cached relation), ``input_grad`` (``core.pool_backward``), ``fwd_bwd`` (op +
    ``torch.autograd.grad``). Pairs = edges (rows for global pooling). Bytes (estimate): read the
    gathered rows, write the output rows (forward), the reverse for the gradient."""
    geom = POOL_GEOMETRIES[tag]
    name = f"pooling/{tag}/{workload}/C{channels}"

    def run(ctx: Context) -> dict:
        dev = ctx.device
        fine = torch.from_numpy(np.array(workloads.coords(workload))).to(dev)
        target_feats = torch.empty(fine.shape[0], 0, device=dev, dtype=ctx.dtype)
        if geom.coarse_input:
            probe = SparseTensor(fine, torch.empty(fine.shape[0], 0, device=dev))
            down = ops.pool.plan_pool("max_pool3d", probe, 2, 2)
            in_coords, in_stride = from_core(down.output.coords()).clone(), 2
        else:
            in_coords, in_stride = fine, 1
        feats = ctx.randn(in_coords.shape[0], channels, salt=1)

        def fresh() -> tuple[SparseTensor, Optional[SparseTensor]]:
            x = SparseTensor(in_coords, feats, stride=in_stride)
            return x, (SparseTensor(fine, target_feats) if geom.coarse_input else None)

        def kwargs(t: Optional[SparseTensor]) -> dict:
            if geom.kernel == 0:
                return {}
            kw: dict[str, Any] = {"kernel_size": geom.kernel, "stride": geom.stride}
            if t is not None:
                kw["coordinates"] = t
            return kw

        fn = getattr(ops, geom.op)
        explain_args = lambda x, t: ((x,), kwargs(t))  # noqa: E731

        def plan(x: SparseTensor, t: Optional[SparseTensor]) -> Any:
            if geom.op == "global_avg_pool":
                return ops.pool.plan_global_pool(geom.op, x, "avg")
            if geom.op == "pool_transpose3d":
                return ops.pool.plan_pool_transpose(geom.op, x, **kwargs(t))
            return ops.pool.plan_pool(geom.op, x, mode=geom.op[:3], **kwargs(t))

        x, tgt = fresh()
        fn(x, **kwargs(tgt))
        p = plan(x, tgt)
        n_in, n_out, pairs = int(p.n_in), int(p.n_out), int(p.n_edges)
        res: dict[str, Any] = {"op": geom.op, "kernel_size": geom.kernel, "stride": geom.stride, "c_in": channels,
                               "c_out": channels, "n_in": n_in, "n_out": n_out, "pairs": pairs,
                               "avg_offsets": pairs / n_out if n_out else 0.0}
        args, kw = explain_args(x, tgt)
        res["routes"] = {ps: lattice.explain(geom.op, *args, pass_=ps, **kw).chosen for ps in ("forward", "input_grad")}
        res["route"] = res["routes"]["forward"]
        gy = ctx.randn(n_out, channels, salt=3)
        _, argmax = core.pool_forward(p, to_core(feats))
        argmax_t = None if argmax is None else from_core(argmax)
        timings: dict[str, dict] = {}
        timings["map_cold"] = ctx.time(lambda a: plan(*a), setup=fresh)
        timings["cold"] = ctx.time(lambda a: fn(a[0], **kwargs(a[1])), setup=fresh)
        with torch.no_grad():
            timings["hot"] = ctx.time(lambda _: fn(x, **kwargs(tgt)))
        timings["input_grad"] = ctx.time(
            lambda _: from_core(core.pool_backward(p, to_core(gy), None if argmax_t is None else to_core(argmax_t))))
        fx = feats.clone().requires_grad_(True)
        xg = x.replace_feats(fx)

        def fwd_bwd(_: Any) -> Any:
            y = fn(xg, **kwargs(tgt))
            return torch.autograd.grad(y.feats if isinstance(y, SparseTensor) else y, (fx,), gy)

        timings["fwd_bwd"] = ctx.time(fwd_bwd)
        res["timings"] = timings
        res["workload_source"] = workloads.source(workload)
        esize = torch.empty(0, dtype=ctx.dtype).element_size()
        moved = float((pairs + n_out) * channels * esize)
        attach_rates(res, ctx, {"cold": (None, moved), "hot": (None, moved), "input_grad": (None, moved),
                                "fwd_bwd": (None, 2 * moved)})
        return res

    return Case(name, "pooling", run, workload)


# -- sparse algebra and coordinate utilities ---------------------------------------------------------

ALGEBRA_TAGS = ("add_outer", "add_same_key", "mul_inner", "union", "lookup", "morton_order")


def algebra_case(tag: str, workload: str, channels: int) -> Case:
    """Coordinate-aligned algebra and coordinate utilities on a workload ``W`` and its copy shifted by
    one voxel in x (``W + e_x``: rows overlap where x-neighbours exist). ``op`` = median time of the
    call (no relation cache is involved, so cold == hot). Bytes (estimate): feature rows read and
    written, coordinate rows read."""
    name = f"algebra/{tag}/{workload}/C{channels}"

    def run(ctx: Context) -> dict:
        dev = ctx.device
        c = torch.from_numpy(np.array(workloads.coords(workload))).to(dev)
        shifted = c.clone()
        shifted[:, 1] += 1
        a = SparseTensor(c, ctx.randn(c.shape[0], channels, salt=1))
        b = SparseTensor(shifted, ctx.randn(c.shape[0], channels, salt=2))
        same = a.replace_feats(ctx.randn(c.shape[0], channels, salt=3))
        esize = torch.empty(0, dtype=ctx.dtype).element_size()
        if tag == "add_outer":
            op, fn, args = "sparse_add", ops.sparse_add, (a, b)
        elif tag == "add_same_key":
            op, fn, args = "sparse_add", ops.sparse_add, (a, same)
        elif tag == "mul_inner":
            op, fn, args = "sparse_mul", ops.sparse_mul, (a, b)
        elif tag == "union":
            op, fn, args = "union_coords", ops.union_coords, (c, shifted)
        elif tag == "lookup":
            op, fn, args = "lookup_coords", ops.lookup_coords, (c, shifted)
        else:
            op, fn, args = "morton_order", ops.morton_order, (c,)
        out = fn(*args)
        n_out = int(out.feats.shape[0] if isinstance(out, SparseTensor) else out.shape[0])
        n_in = int(sum(x.shape[0] if isinstance(x, torch.Tensor) else len(x) for x in args))
        res: dict[str, Any] = {"op": op, "c_in": channels, "c_out": channels, "n_in": n_in, "n_out": n_out,
                               "pairs": n_in, "avg_offsets": 1.0,
                               "route": lattice.explain(op, *args).chosen}
        res["timings"] = {"op": ctx.time(lambda _: fn(*args))}
        res["workload_source"] = workloads.source(workload)
        feat_bytes = (n_in + n_out) * channels * esize if op.startswith("sparse_") else 0
        attach_rates(res, ctx, {"op": (None, float(feat_bytes + n_in * 16))})
        return res

    return Case(name, "algebra", run, workload)


# -- networks: MinkUNet42 (BENCHMARKS.md "End-to-end network") ---------------------------------------


# The network lives in lattice.models (re-exported here for callers of lattice.bench.cases).
MinkUNet42 = models.MinkUNet42


_MODULE_OPS = {
    lnn.SubmConv3d: ("subm_conv3d", "submanifold"),
    lnn.Conv3d: ("conv3d", "forward"),
    lnn.ConvTranspose3d: ("conv_transpose3d", "transposed"),
    lnn.GenerativeConvTranspose3d: ("generative_conv_transpose3d", "generative"),
}


def record_conv_layers(model: torch.nn.Module, x: SparseTensor) -> list[dict]:
    """Runs ``model(x)`` once with hooks on every lattice conv module; per layer: op, N, pairs, route."""
    layers: list[dict] = []
    handles = []

    def hook_for(name: str, mod: torch.nn.Module):
        op, kind = _MODULE_OPS[type(mod)]

        def hook(m: torch.nn.Module, inputs: tuple, _out: Any) -> None:
            inp = inputs[0]
            kw: dict[str, Any] = {"kernel_size": m.kernel_size}
            if hasattr(m, "stride") and m.stride != (1, 1, 1):
                kw["stride"] = m.stride
            k = kind
            if len(inputs) > 1 and inputs[1] is not None:
                kw["coordinates"] = inputs[1]
                k = "transposed_target" if op == "conv_transpose3d" else "target"
            p = ops.conv.plan(op, k, inp, m.weight, **kw)  # cached: the call just built it
            rec = {"layer": name, "op": op, "c_in": m.in_channels, "c_out": m.out_channels,
                   "kernel_size": list(m.kernel_size), "stride": list(getattr(m, "stride", (1, 1, 1))),
                   **_relation_fields(p)}
            e = lattice.explain(op, inp, m.weight.detach(), **kw)
            rec["route"] = e.chosen
            rec["tuned"] = bool(e.tuned_chosen)  # chosen by a lattice.tune measurement, not the rank order
            layers.append(rec)
        return hook

    for name, mod in model.named_modules():
        if type(mod) in _MODULE_OPS:
            handles.append(mod.register_forward_hook(hook_for(name, mod)))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return layers


def time_conv_layers(model: torch.nn.Module, x: SparseTensor, layers: list[dict], repeats: int = 5) -> None:
    """Adds ``fwd_ms`` to each record of :func:`record_conv_layers`: the median over ``repeats``
    inferences on ``x`` (its maps cached by the recording call) of each conv module's forward
    time. The device is synchronised before and after every layer (CUDA events on a GPU,
    ``perf_counter`` on the CPU), so a layer's time is its own work plus one launch latency, and
    the layers' sum is above a pipelined inference's time."""
    times: dict[str, list[float]] = {}
    cuda = x.feats.is_cuda
    starts: dict[str, Any] = {}
    handles = []

    def pre_for(name: str):
        def pre(_m: torch.nn.Module, _inputs: tuple) -> None:
            if cuda:
                torch.cuda.synchronize()
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                starts[name] = ev
            else:
                starts[name] = time.perf_counter()
        return pre

    def post_for(name: str):
        def post(_m: torch.nn.Module, _inputs: tuple, _out: Any) -> None:
            if cuda:
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                torch.cuda.synchronize()
                ms = float(starts[name].elapsed_time(ev))
            else:
                ms = 1e3 * (time.perf_counter() - starts[name])
            times.setdefault(name, []).append(ms)
        return post

    for name, mod in model.named_modules():
        if type(mod) in _MODULE_OPS:
            handles.append(mod.register_forward_pre_hook(pre_for(name)))
            handles.append(mod.register_forward_hook(post_for(name)))
    try:
        with torch.no_grad():
            for _ in range(repeats):
                model(x)
    finally:
        for h in handles:
            h.remove()
    for rec in layers:
        got = times.get(rec["layer"])
        rec["fwd_ms"] = float(np.median(got)) if got else None


def network_case(workload: str, batch: int) -> Case:
    name = f"networks/minkunet42/{workload}/b{batch}"

    def run(ctx: Context) -> dict:
        dev = ctx.device
        coords = torch.from_numpy(np.array(workloads.coords(workload))).to(dev)
        n = coords.shape[0]
        got = int(coords[:, 0].max().item()) + 1 if n else 0
        if got != batch:
            raise ValueError(f"[bench] {name}: workload has {got} batches, expected {batch}")
        torch.manual_seed(ctx.seed)
        model = MinkUNet42().to(device=dev, dtype=ctx.dtype)
        feats = ctx.randn(n, 4, salt=11)
        labels = torch.randint(0, 19, (n,), generator=ctx.generator(12)).to(dev)

        def fresh() -> SparseTensor:  # fresh tensor per call: every map is rebuilt (as the anchors)
            return SparseTensor(coords, feats)

        model.eval()
        x_layers = fresh()
        layers = record_conv_layers(model, x_layers)
        time_conv_layers(model, x_layers, layers, repeats=3)
        with torch.no_grad():
            t_inf = ctx.time(lambda x: model(x), setup=fresh)

        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

        def step(x: SparseTensor) -> Any:
            opt.zero_grad(set_to_none=True)
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out.feats.float(), labels)
            loss.backward()
            opt.step()
            return loss.detach()

        t_train = ctx.time(step, setup=fresh)
        routes: dict[str, int] = {}
        for rec in layers:
            routes[str(rec["route"])] = routes.get(str(rec["route"]), 0) + 1
        pairs = sum(r["pairs"] for r in layers)
        rows_out = sum(r["n_out"] for r in layers)
        esize = torch.empty(0, dtype=ctx.dtype).element_size()
        flop = bytes_fwd = 0.0
        for r in layers:
            w = conv_work(r["n_in"], r["n_out"], r["pairs"], r["kernel_volume"], r["c_in"], r["c_out"], esize)
            flop += w["hot"][0]
            bytes_fwd += w["hot"][1]
        res: dict[str, Any] = {
            "op": "MinkUNet42", "batch": batch, "n_in": n, "n_out": n, "pairs": pairs,
            "avg_offsets": pairs / rows_out if rows_out else 0.0,
            "route": ", ".join(f"{k} x{v}" for k, v in sorted(routes.items(), key=lambda kv: -kv[1])),
            "routes": routes, "conv_layers": len(layers), "layers": layers,
            "params": sum(p.numel() for p in model.parameters()),
            "timings": {"inference": t_inf, "train_step": t_train},
            "workload_source": workloads.source(workload),
            "note": "maps rebuilt every call (fresh SparseTensor); FLOP counts sparse conv layers only",
        }
        attach_rates(res, ctx, {"inference": (flop, bytes_fwd), "train_step": (3 * flop, 3 * bytes_fwd)})
        attach_anchor(res, ctx, {"inference": "inference", "train_step": "train_step"},
                      anchors.network_anchor(ctx.device, ctx.dtype_name, workload, batch))
        return res

    return Case(name, "networks", run, workload)


# -- quantized: packed int4 / int8 weights vs float (issue 7) ------------------------------------------

QUANT_FORMATS = ("f32", "f16", "int8", "int4")


def _max_rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """max |y - ref| / max |ref| (float32 comparison)."""
    ref = ref.float()
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    return float((y.float() - ref).abs().max()) / scale if scale > 0 else 0.0


def calibrate_batchnorm(model: torch.nn.Module, x: SparseTensor) -> None:
    """Sets every BatchNorm's running statistics to those of one forward over ``x`` (a random-init
    network otherwise shrinks its activations layer after layer, and output errors say little)."""
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    saved = [b.momentum for b in bns]
    for b in bns:
        b.reset_running_stats()
        b.momentum = None  # cumulative average: one batch gives exactly its statistics
    was_training = model.training
    model.train()
    with torch.no_grad():
        model(x)
    model.train(was_training)
    for b, m in zip(bns, saved):
        b.momentum = m


def quantized_conv_case(workload: str, channels: int) -> Case:
    """subm3 forward with f32 / f16 / int8 / int4 weights (int: f32 activations, packed weight,
    the quantized route table): weight bytes, hot time and max relative error vs the f32 op."""
    name = f"quantized/subm3/{workload}/C{channels}"

    def run(ctx: Context) -> dict:
        if ctx.device != "cpu":
            raise CaseSkipped("the quantized routes run on CPU in this build")
        coords = torch.from_numpy(np.array(workloads.coords(workload)))
        feats = torch.randn(coords.shape[0], channels, generator=ctx.generator(21))
        w = torch.randn(channels, 3, 3, 3, channels, generator=ctx.generator(22)) / math.sqrt(27 * channels)
        x32 = SparseTensor(coords, feats)
        x16 = x32.replace_feats(feats.half())
        ref = ops.subm_conv3d(x32, w).feats
        p = ops.conv.plan("subm_conv3d", "submanifold", x32, w, kernel_size=3)
        res: dict[str, Any] = {"op": "subm_conv3d", "kernel_size": 3, "c_in": channels, "c_out": channels,
                               **_relation_fields(p)}
        args = {"f32": (x32, w), "f16": (x16, w.half()),
                "int8": (x32, lattice.quantize_weight(w, bits=8)), "int4": (x32, lattice.quantize_weight(w, bits=4))}
        timings: dict[str, dict] = {}
        formats: dict[str, dict] = {}
        routes: dict[str, Any] = {}
        for fmt, (x, wt) in args.items():
            nbytes = wt.nbytes() if isinstance(wt, lattice.QuantizedWeight) else wt.numel() * wt.element_size()
            with torch.no_grad():
                y = ops.subm_conv3d(x, wt)
                timings[fmt] = ctx.time(lambda _, x=x, wt=wt: ops.subm_conv3d(x, wt))
            routes[fmt] = lattice.explain("subm_conv3d", x, wt).chosen
            formats[fmt] = {"weight_bytes": nbytes, "max_rel_err": _max_rel_err(y.feats, ref), "route": routes[fmt]}
        res.update({"timings": timings, "formats": formats, "routes": routes, "route": routes["int4"],
                    "workload_source": workloads.source(workload),
                    "note": "max_rel_err = max|y - y_f32| / max|y_f32|; int formats: f32 activations"})
        return res

    return Case(name, "quantized", run, workload)


def quantized_network_case(workload: str) -> Case:
    """MinkUNet42 inference (batch 1, fresh SparseTensor per call) with f32 / f16 weights and with
    ``lattice.nn.quantize(model, bits=8 / 4)`` (f32 activations): weight bytes, time, max relative
    error of the output logits vs the f32 model (BatchNorm statistics calibrated on the input)."""
    name = f"quantized/minkunet42/{workload}/b1"

    def run(ctx: Context) -> dict:
        import copy

        if ctx.device != "cpu":
            raise CaseSkipped("the quantized routes run on CPU in this build")
        coords = torch.from_numpy(np.array(workloads.coords(workload)))
        n = coords.shape[0]
        torch.manual_seed(ctx.seed)
        model = MinkUNet42()
        feats = torch.randn(n, 4, generator=ctx.generator(11))
        calibrate_batchnorm(model, SparseTensor(coords, feats))
        model.eval()
        layers = record_conv_layers(model, SparseTensor(coords, feats))
        models = {"f32": (model, feats), "f16": (copy.deepcopy(model).half(), feats.half()),
                  "int8": (lnn.quantize(copy.deepcopy(model), bits=8), feats),
                  "int4": (lnn.quantize(copy.deepcopy(model), bits=4), feats)}
        timings: dict[str, dict] = {}
        formats: dict[str, dict] = {}
        with torch.no_grad():
            ref = model(SparseTensor(coords, feats)).feats
            for fmt, (m, f) in models.items():
                stem_w = m.stem[1].conv.weight  # the second stem conv (32 -> 32)
                stem_w = stem_w.detach() if isinstance(stem_w, torch.Tensor) else stem_w
                formats[fmt] = {"weight_bytes": lnn.weight_bytes(m), "weight_bytes_report": lnn.weight_bytes_report(m),
                                "max_rel_err": None,
                                "route": lattice.explain("subm_conv3d", SparseTensor(coords, torch.zeros(n, 32, dtype=f.dtype)),
                                                         stem_w, kernel_size=3).chosen}
                try:
                    y = m(SparseTensor(coords, f)).feats
                except RuntimeError as exc:  # e.g. torch 1.13 has no float16 batch_norm on CPU
                    formats[fmt]["not_run"] = str(exc)
                    continue
                timings[fmt] = ctx.time(lambda x, m=m: m(x), setup=lambda f=f: SparseTensor(coords, f))
                formats[fmt]["max_rel_err"] = _max_rel_err(y, ref)
        route = formats["int4"]["route"]  # of the stem's second conv (32 -> 32); every layer's table is the same
        pairs = sum(r["pairs"] for r in layers)
        rows_out = sum(r["n_out"] for r in layers)
        return {"op": "MinkUNet42", "batch": 1, "n_in": n, "n_out": n, "pairs": pairs,
                "avg_offsets": pairs / rows_out if rows_out else 0.0, "route": route,
                "conv_layers": len(layers), "timings": timings, "formats": formats,
                "workload_source": workloads.source(workload),
                "note": "max_rel_err = max|y - y_f32| / max|y_f32| of the logits; maps rebuilt every call"}

    return Case(name, "quantized", run, workload)


# -- presets ----------------------------------------------------------------------------------------

# -- large inputs (issue 18): correct results and peak memory past the sizes the other cases use --


def _peak_rss_bytes() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def _surface_points(n: int, seed: int) -> np.ndarray:
    """``n`` points on a gently curved ground surface (a street scan's dominant structure) over
    300 m x 300 m, so voxels have the few in-plane neighbours real scans have: float32 (n, 3)."""
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0.0, 300.0, size=(n, 2))
    z = 0.5 * np.sin(xy[:, 0] / 17.0) + 0.3 * np.cos(xy[:, 1] / 11.0) + rng.normal(0.0, 0.03, n)
    return np.concatenate([xy, z[:, None] + 2.0], axis=1).astype(np.float32)


def large_case(n_points: int, channels: int = 8, voxel: float = 0.1) -> Case:
    """A scan of ``n_points`` points voxelized at ``voxel`` and one subm3 convolution at
    ``channels`` (CPU: 10M points gives ~6M voxels and ~50M edges). Checks 4096 sampled output
    rows against a float64 evaluation from the coordinates (numpy, searchsorted over packed keys:
    independent of lattice's hash), and records the process's peak resident memory before and after
    (``peak_rss_bytes``; on CUDA also torch's and lattice's allocator peaks)."""
    name = f"large/subm3/surface_{workloads.format_count(n_points)}/C{channels}"

    def run(ctx: Context) -> dict:
        dev = torch.device(ctx.device)
        rss0 = _peak_rss_bytes()
        pts = torch.from_numpy(_surface_points(n_points, ctx.seed + 5))
        coords = torch.floor(pts / voxel).to(torch.int32)
        coords = torch.cat([torch.zeros(len(coords), 1, dtype=torch.int32), coords], 1)
        coords = torch.unique(coords, dim=0)  # sorted rows: (batch, x, y, z)
        n = len(coords)
        feats = torch.randn(n, channels, generator=ctx.generator(1)).to(ctx.dtype)
        w = (torch.randn(channels, 3, 3, 3, channels, generator=ctx.generator(2)) / 27 ** 0.5).to(ctx.dtype)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        x = lattice.SparseTensor(coords.to(dev), feats.to(dev))
        wd = w.to(dev)
        with torch.no_grad():
            timing = ctx.time(lambda _: ops.subm_conv3d(x, wd), repeats=3)
            y = ops.subm_conv3d(x, wd).feats.double().cpu()
        p = lattice.ops.conv.plan("subm_conv3d", "submanifold", x, wd)
        n_edges = int(p.relation.n_edges)
        # independent check of sampled rows: packed keys, sorted, searchsorted for each neighbour
        c = coords.numpy().astype(np.int64)
        lo = c[:, 1:].min(0) - 1
        ext = c[:, 1:].max(0) - lo + 2
        key = lambda q: ((q[..., 0] - lo[0]) * ext[1] + (q[..., 1] - lo[1])) * ext[2] + (q[..., 2] - lo[2])
        keys = key(c[:, 1:])
        assert np.all(np.diff(keys) > 0), "unique sorted rows give increasing keys"
        rows = np.random.default_rng(ctx.seed + 9).choice(n, size=min(4096, n), replace=False)
        offs = np.array([(a, b, d) for a in (-1, 0, 1) for b in (-1, 0, 1) for d in (-1, 0, 1)])  # z fastest
        q = c[rows][:, None, 1:] + offs[None]
        qk = key(q)
        pos = np.searchsorted(keys, qk)
        pos = np.minimum(pos, n - 1)
        hit = keys[pos] == qk
        x64 = feats.double().numpy()
        w64 = w.double().permute(1, 2, 3, 4, 0).reshape(27, channels, channels).numpy()
        want = np.zeros((len(rows), channels))
        for k in range(27):
            m = hit[:, k]
            want[m] += x64[pos[m, k]] @ w64[k]
        got = y.numpy()[rows]
        err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
        tol = {"float32": 1e-5, "float64": 1e-12}.get(ctx.dtype_name, 1e-2)
        res: dict[str, Any] = {
            "op": "subm_conv3d", "n_points": n_points, "n_in": n, "n_out": n, "pairs": n_edges,
            "avg_offsets": n_edges / max(n, 1), "channels": channels, "voxel_size": voxel,
            "route": lattice.explain("subm_conv3d", x, wd).chosen,
            "timings": {"hot": timing},
            "checked_rows": len(rows), "max_rel_err": err, "tolerance": tol, "correct": err <= tol,
            "peak_rss_bytes": _peak_rss_bytes(), "peak_rss_bytes_before": rss0,
        }
        if dev.type == "cuda":
            res["cuda_torch_peak_bytes"] = int(torch.cuda.max_memory_allocated(dev))
            res["cuda_lattice_live_bytes"] = int(lattice.cuda.memory_stats()["live_bytes"])
        res["rates"] = {}
        if not res["correct"]:
            raise AssertionError(f"{name}: sampled rows differ from the float64 evaluation: {err} > {tol}")
        return res

    return Case(name, "large", run, "surface")


def large_cube_case(side: int, channels: int = 8) -> Case:
    """A dense ``side``^3 cube (the GPU preset: 512^3 = 134M rows, 3.6e9 subm3 edges, past 2^31)
    through one subm3 convolution at ``channels``, coordinates and features made on the device.
    Checks 4096 sampled output rows against a float64 evaluation by index arithmetic (row r is
    (x * side + y) * side + z; its neighbours need no hash), checks the edge count against
    (3 side - 2)^3, and records the relation's view bytes per edge right after the forward
    (``forward_bytes_per_edge``: the stored map plus what the route read; issue 18 asks <= 16 for
    the implicit-GEMM forward), the process's peak RSS and, on CUDA, torch's allocator peak and
    lattice's live bytes."""
    name = f"large/subm3/cube{side}/C{channels}"

    def run(ctx: Context) -> dict:
        dev = torch.device(ctx.device)
        rss0 = _peak_rss_bytes()
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        g = torch.arange(side, dtype=torch.int32, device=dev)
        n = side ** 3
        coords = torch.zeros(n, 4, dtype=torch.int32, device=dev)
        coords[:, 1] = g.repeat_interleave(side * side)
        coords[:, 2] = g.repeat_interleave(side).repeat(side)
        coords[:, 3] = g.repeat(side * side)
        gen = torch.Generator(device=dev).manual_seed(ctx.seed * 1_000_003 + 1)
        feats = torch.randn(n, channels, generator=gen, device=dev).to(ctx.dtype)
        w = (torch.randn(channels, 3, 3, 3, channels, generator=ctx.generator(2)) / 27 ** 0.5).to(ctx.dtype)
        wd = w.to(dev)
        x = lattice.SparseTensor(coords, feats)
        with torch.no_grad():
            y = ops.subm_conv3d(x, wd).feats
            rel = lattice.ops.conv.plan("subm_conv3d", "submanifold", x, wd).relation
            views, view_bytes = rel.built_views(), int(rel.view_bytes)
            timing = ctx.time(lambda _: ops.subm_conv3d(x, wd), repeats=3)
        n_edges = int(rel.n_edges)
        want_edges = (3 * side - 2) ** 3
        rows = torch.from_numpy(np.random.default_rng(ctx.seed + 9).choice(n, size=min(4096, n), replace=False))
        xi, yi, zi = rows // (side * side), (rows // side) % side, rows % side
        want = torch.zeros(len(rows), channels, dtype=torch.float64)
        w64 = w.double().permute(1, 2, 3, 4, 0).reshape(27, channels, channels)
        k = 0
        for dx in (-1, 0, 1):
            for dy in (-1, 0, 1):
                for dz in (-1, 0, 1):  # kernel rows x-major, z fastest
                    ax, ay, az = xi + dx, yi + dy, zi + dz
                    ok = (ax >= 0) & (ax < side) & (ay >= 0) & (ay < side) & (az >= 0) & (az < side)
                    nb = (ax * side + ay) * side + az
                    src = feats[nb[ok].to(dev)].double().cpu()
                    want[ok] += src @ w64[k]
                    k += 1
        got = y[rows.to(dev)].double().cpu()
        err = float((got - want).abs().max() / max(float(want.abs().max()), 1e-30))
        tol = {"float32": 1e-5, "float64": 1e-12}.get(ctx.dtype_name, 1e-2)
        res: dict[str, Any] = {
            "op": "subm_conv3d", "side": side, "n_in": n, "n_out": n, "pairs": n_edges,
            "avg_offsets": n_edges / max(n, 1), "channels": channels,
            "route": lattice.explain("subm_conv3d", x, wd).chosen,
            "timings": {"hot": timing},
            "checked_rows": len(rows), "max_rel_err": err, "tolerance": tol,
            "correct": err <= tol and n_edges == want_edges,
            "forward_views": views, "forward_view_bytes": view_bytes,
            "forward_bytes_per_edge": view_bytes / max(n_edges, 1),
            "peak_rss_bytes": _peak_rss_bytes(), "peak_rss_bytes_before": rss0,
        }
        if dev.type == "cuda":
            res["cuda_torch_peak_bytes"] = int(torch.cuda.max_memory_allocated(dev))
            res["cuda_lattice_live_bytes"] = int(lattice.cuda.memory_stats()["live_bytes"])
        res["rates"] = {}
        if n_edges != want_edges:
            raise AssertionError(f"{name}: {n_edges} edges, expected (3 side - 2)^3 = {want_edges}")
        if err > tol:
            raise AssertionError(f"{name}: sampled rows differ from the float64 evaluation: {err} > {tol}")
        return res

    return Case(name, "large", run, "cube")


CONV_TAGS = ("subm3", "k2s2", "k3s2", "tr_k2s2", "gen_k2s2", "pw")


@dataclass
class Selection:
    """Options that shape the case list (see ``lattice.bench --help``)."""

    preset: str = "smoke"
    device: str = "cpu"
    channels: Optional[list[int]] = None
    sizes: Optional[list[int]] = None
    case_filter: Optional[str] = None


def _resize(workload: str, sizes: Optional[list[int]]) -> list[str]:
    """``grid_20k`` with sizes [1e5, 1e6] -> [grid_100k, grid_1m]; other names unchanged."""
    m = re.match(r"^((?:grid|plane|isolated|line\d*|block\d*))_\w+$", workload)
    if not sizes or not m:
        return [workload]
    return [f"{m.group(1)}_{workloads.format_count(n)}" for n in sizes]


def _network_workloads(batch: int) -> str:
    if workloads.kitti_path() is not None:
        return "kitti" if batch == 1 else "kitti_x2"
    return "lidar" if batch == 1 else "lidar_x2"


def _preset_specs(sel: Selection) -> list[tuple]:
    """('conv', tag, workload, C) | ('relations', tag, workload) | ('quantize', points, voxel) |
    ('pool', tag, workload, C) | ('algebra', tag, workload, C) | ('network', workload, batch)."""
    specs: list[tuple] = []
    cuda = sel.device == "cuda"
    kitti_points = "kitti_points" if workloads.kitti_path() is not None else "lidar_points"
    if sel.preset == "smoke":
        for tag in CONV_TAGS:
            specs.append(("conv", tag, "grid_20k", 16))
        specs += [("conv", "subm3", "block4_10k", 16), ("conv", "subm3", "line8_10k", 16)]
        # one anchor row (kitti C32) so the anchor path runs in CI
        if workloads.kitti_path() is not None:
            specs += [("conv", "subm3", "kitti", 32), ("conv", "k2s2", "kitti", 32)]
        specs += [("relations", t, "grid_20k") for t in ("subm3", "k2s2", "tr_k2s2", "gen_k2s2")]
        specs.append(("quantize", "lidar_small_points", 0.05))
        specs += [("pool", t, "grid_20k", 16) for t in POOL_TAGS]
        specs += [("algebra", t, "grid_20k", 16) for t in ALGEBRA_TAGS]
        specs.append(("network", "lidar_tiny", 1))  # small: smoke checks the network runs, not its speed
        specs.append(("quantized_conv", "grid_20k", 32))  # the network comparison is in standard / full
    elif sel.preset == "standard":
        table = anchors.GPU if cuda else anchors.CPU
        rows = list(table["conv"].keys())
        for wl, c in rows:
            specs += [("conv", "subm3", wl, c), ("conv", "k2s2", wl, c)]
        for wl in dict.fromkeys(wl for wl, _ in rows):
            specs += [("relations", "subm3", wl), ("relations", "k2s2", wl)]
        specs.append(("quantize", kitti_points, 0.05))
        for wl in dict.fromkeys(wl for wl, _ in rows):
            specs += [("pool", "max_k2s2", wl, 32), ("pool", "global_avg", wl, 32)]
            specs += [("algebra", t, wl, 32) for t in ("add_outer", "union", "lookup")]
        specs.append(("network", _network_workloads(1), 1))
        if cuda:
            specs += [("network", "lidar", 1), ("network", "lidar_x2", 2)]
        if not cuda:
            specs += [("quantized_conv", _network_workloads(1), 64), ("quantized_network", _network_workloads(1))]
    elif sel.preset == "gpu":
        # the issue-6 rows (minutes on the GPU machine): kitti subm3 C=32/64/128 (hot, cold, fwd+bwd)
        # and k2 s2 cold, MinkUNet42 batch 1 inference and training step; next to the GPU anchors
        wl = _network_workloads(1)
        for c in (32, 64, 128):
            specs.append(("conv", "subm3", wl, c))
        specs.append(("conv", "k2s2", wl, 64))
        specs.append(("network", wl, 1))
        specs.append(("large_cube", 512, 8))  # issue 18: 134M rows, 3.6e9 edges; bytes per edge, peak memory
    elif sel.preset == "full":
        chans = (32, 64, 128) if cuda else (32, 64)
        for wl in workloads.ANCHOR_WORKLOADS:
            for c in chans:
                specs += [("conv", t, wl, c) for t in CONV_TAGS]
            specs += [("relations", t, wl) for t in CONV_TAGS if t != "pw"]
            specs += [("pool", t, wl, c) for t in POOL_TAGS for c in chans]
            specs += [("algebra", t, wl, 32) for t in ALGEBRA_TAGS]
        families = ["grid", "plane", "isolated"] + [f"{f}{s}" for f in ("line", "block") for s in (2, 4, 8)]
        for fam in families:
            for n in ("10k", "100k", "1m"):
                wl = f"{fam}_{n}"
                specs += [("conv", "subm3", wl, 32), ("conv", "k2s2", wl, 32), ("relations", "subm3", wl)]
        for pts in dict.fromkeys([kitti_points, "lidar_points"]):
            specs += [("quantize", pts, v) for v in (0.05, 0.1, 0.2)]
        for b in (1, 2):
            specs.append(("network", _network_workloads(b), b))
        specs += [("network", "lidar", 1), ("network", "lidar_x2", 2)]
        if not cuda:
            specs += [("quantized_conv", _network_workloads(1), c) for c in (32, 64, 128)]
            specs.append(("quantized_network", _network_workloads(1)))
        specs.append(("large", 10_000_000, 8))  # issue 18: a 10M-point scan, result and peak memory
    else:
        raise ValueError(f"[bench] preset: expected smoke, standard, full or gpu, got {sel.preset!r}")
    return specs


def build_cases(sel: Selection) -> list[Case]:
    """The preset's cases after --channels / --size overrides and --case-filter, deduplicated."""
    cases: dict[str, Case] = {}
    for spec in _preset_specs(sel):
        kind = spec[0]
        if kind == "conv":
            _, tag, wl, c = spec
            for w in _resize(wl, sel.sizes):
                for ch in (sel.channels or [c]):
                    cs = conv_case(tag, w, ch, ch)
                    cases.setdefault(cs.name, cs)
        elif kind == "relations":
            for w in _resize(spec[2], sel.sizes):
                cs = relation_case(spec[1], w)
                cases.setdefault(cs.name, cs)
        elif kind == "quantize":
            cs = quantize_case(spec[1], spec[2])
            cases.setdefault(cs.name, cs)
        elif kind == "pool":
            _, tag, wl, c = spec
            for w in _resize(wl, sel.sizes):
                for ch in (sel.channels or [c]):
                    cs = pool_case(tag, w, ch)
                    cases.setdefault(cs.name, cs)
        elif kind == "algebra":
            _, tag, wl, c = spec
            for w in _resize(wl, sel.sizes):
                for ch in (sel.channels or [c]):
                    cs = algebra_case(tag, w, ch)
                    cases.setdefault(cs.name, cs)
        elif kind == "network":
            cs = network_case(spec[1], spec[2])
            cases.setdefault(cs.name, cs)
        elif kind == "quantized_conv":
            for ch in (sel.channels or [spec[2]]):
                cs = quantized_conv_case(spec[1], ch)
                cases.setdefault(cs.name, cs)
        elif kind == "quantized_network":
            cs = quantized_network_case(spec[1])
            cases.setdefault(cs.name, cs)
        elif kind == "large":
            cs = large_case(spec[1], spec[2])
            cases.setdefault(cs.name, cs)
        elif kind == "large_cube":
            cs = large_cube_case(spec[1], spec[2])
            cases.setdefault(cs.name, cs)
    out = list(cases.values())
    if sel.case_filter:
        try:
            rx: Optional[re.Pattern] = re.compile(sel.case_filter)
        except re.error:
            rx = None  # not a regex: substring match only
        out = [c for c in out if sel.case_filter in c.name or (rx is not None and rx.search(c.name))]
    return out


def skipped_groups(sel: Selection) -> dict[str, str]:
    """Groups that have no cases yet, with the reason printed by the runner."""
    out = {}
    if not hasattr(ops, "max_pool3d") and not hasattr(ops, "pool3d"):
        out["pooling"] = "pooling ops not landed yet (issue 4)"
    return out


def cuda_unavailable_reason() -> Optional[str]:
    """None when CUDA cases can run, else why not (from lattice.device_caps() and torch)."""
    caps = lattice.device_caps().get("cuda", {})
    if not caps.get("built"):
        return "lattice was built without the CUDA backend"
    if not caps.get("device_count"):
        return f"no CUDA device for lattice ({caps.get('status') or 'unknown status'})"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None
