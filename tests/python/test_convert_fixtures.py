"""lattice.convert.from_minkowski against MinkowskiEngine 0.5.4's own outputs.

The fixtures ``tests/fixtures/minkowski_<net>.npz`` were written by
``scripts/make_convert_fixtures.py`` with a CPU build of ME 0.5.4 (source in
``../shared/anchors``): ME's examples MinkUNet18A / MinkUNet34C layouts (narrow channel tables),
random weights from a fixed seed, BatchNorm in eval with running statistics measured on the input,
two crops of lattice's synthetic ray-cast street scan (``lattice._demo_data.synthetic_scan``) quantized by ME's ``sparse_quantize`` (batch indices 0 and 1,
negative coordinates included), and ME's output features with ME's coordinates, in ME's row order.
ME itself is not imported here.

What the tests prove: converting ME's state_dict with ``lattice.convert.from_minkowski`` into
``lattice.models.MinkUNet18 / MinkUNet34(channels=...)`` and running lattice on the same input
reproduces ME's logits at every voxel (rows matched by coordinates). That covers, against the real
library rather than our reading of its source: ME's kernel-offset order (x fastest) for the k5
stem, the k3 residual convs and the k2 s2 strided and transposed convs, ME's (K, C_in, C_out)
layout including the transposed conv's, the 1x1 (C_in, C_out) shortcut and ``final`` kernels, the
``final`` bias, ``*.bn.*`` BatchNorm entries, the odd-kernel centring, the floor of negative
coordinates under striding, the transposed conv landing on the skip's coordinates, and the
``ME.cat(up, skip)`` channel order.

Tolerance. ME and lattice evaluate the same float32 network; only the order of the float32 sums
differs (ME: one GEMM per kernel offset scattered into the output rows, lattice: its own route),
so each layer's output differs by a few ulps of its accumulated terms, and the differences grow
through the ~40 layers. ``TOL = 2e-5`` relative to the largest |logit| bounds that with room: the
test also measures both float32 results against lattice in float64 and asserts that each sits
within the same bound of it, i.e. ME's deviation is float32 rounding, not a different function.
The negative controls show the bound discriminates: the same weights with a kernel-row order that
is wrong only for the 2x2x2 (strided / transposed) kernels, or for all kernels, or a transposed
conv whose offset is mirrored, miss ME's output by orders of magnitude more than ``TOL``.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

import lattice
from lattice import convert, models

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NETS = ["minkunet18a", "minkunet34c"]
TOL = 2e-5  # relative to max |ME logit|; see the module docstring


def load(name: str):
    with np.load(FIXTURES / f"minkowski_{name}.npz", allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        sd = OrderedDict((str(k), torch.from_numpy(z[f"sd/{k}"].copy())) for k in z["sd_keys"])
        fx = {k: torch.from_numpy(z[k].copy()) for k in ("input_coords", "input_feats", "out_coords", "out_feats")}
    return meta, sd, fx


def lattice_net(meta):
    cls = getattr(models, meta["lattice"])
    return cls(meta["in_channels"], meta["num_classes"], channels=meta["channels"])


def run(meta, sd, fx, dtype=torch.float32, convert_fn=None):
    """Convert ``sd``, run the lattice network on the fixture input; logits in ME's row order.

    The input rows are fed in a fixed shuffled order (ME kept the quantizer's order), so the result
    only matches when rows are matched by coordinates, not by position."""
    model = lattice_net(meta)
    model.load_state_dict((convert_fn or convert.from_minkowski)(sd, model))  # strict
    model = model.to(dtype).eval()
    perm = torch.randperm(len(fx["input_coords"]), generator=torch.Generator().manual_seed(1))
    x = lattice.SparseTensor(fx["input_coords"][perm], fx["input_feats"][perm].to(dtype))
    with torch.no_grad():
        y = model(x)
    return y.feats[me_rows_in(y.coords, fx["out_coords"])]


def me_rows_in(coords: torch.Tensor, me_coords: torch.Tensor) -> torch.Tensor:
    """idx with ``coords[idx] == me_coords`` row for row (both must be the same set of rows)."""
    assert coords.shape == me_coords.shape, (coords.shape, me_coords.shape)
    a, b = coords.long(), me_coords.long()
    lo = torch.minimum(a.min(0).values, b.min(0).values)
    span = torch.maximum(a.max(0).values, b.max(0).values) - lo + 1
    def key(c):
        k = torch.zeros(len(c), dtype=torch.long)
        for d in range(4):
            k = k * span[d] + (c[:, d] - lo[d])
        return k
    ka, kb = key(a), key(b)
    oa = torch.argsort(ka)
    pos = torch.searchsorted(ka[oa], kb)
    idx = oa[pos.clamp(max=len(ka) - 1)]
    assert torch.equal(ka[idx], kb), "ME's output coordinates are not lattice's output coordinates"
    return idx


@pytest.fixture(scope="module", params=NETS)
def case(request):
    meta, sd, fx = load(request.param)
    return request.param, meta, sd, fx


def test_fixture_is_what_the_docstring_says(case):
    """The fixture is a real ME run on a non-trivial input: two batch indices, negative
    coordinates, BatchNorm statistics that are not the defaults, ME output on the input's sites."""
    name, meta, sd, fx = case
    assert meta["me_version"].startswith("0.5.4") and meta["net"] == name
    c = fx["input_coords"]
    assert c.dtype == torch.int32 and len(c) > 1000 and set(c[:, 0].tolist()) == {0, 1}
    assert (c[:, 1:] < 0).any() and len(torch.unique(c, dim=0)) == len(c)
    means = [v for k, v in sd.items() if k.endswith("running_mean")]
    assert len(means) > 20 and all(v.abs().max() > 0 for v in means)
    assert not any(torch.allclose(v, torch.ones_like(v)) for k, v in sd.items() if k.endswith("running_var"))
    assert fx["out_feats"].shape == (len(c), meta["num_classes"])
    me_rows_in(c, fx["out_coords"])  # ME's output sits on exactly the input's coordinates


def test_from_minkowski_reproduces_minkowski_output(case):
    """The converted lattice network gives ME's logits at every voxel (fp32 tolerance), and both
    float32 results are within the same bound of lattice's float64 evaluation."""
    name, meta, sd, fx = case
    me = fx["out_feats"].double()
    scale = me.abs().max().item()
    assert scale > 0.1  # non-trivial logits
    tol = TOL * scale
    ours = run(meta, sd, fx).double()
    exact = run(meta, sd, fx, torch.float64)
    err = (ours - me).abs().max().item()
    assert err <= tol, f"{name}: max |lattice - ME| = {err:.3g} > {tol:.3g}"
    assert (me - exact).abs().max().item() <= tol, f"{name}: ME is not within float32 rounding of the float64 result"
    assert (ours - exact).abs().max().item() <= tol
    # the argmax (the segmentation) agrees wherever the top two logits are not within the tolerance
    top2 = exact.topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > 4 * tol
    assert clear.float().mean() > 0.9
    assert torch.equal(ours.argmax(1)[clear], me.argmax(1)[clear])


def _minkowski_with(order_for):
    """from_minkowski with the kernel rows read in ``order_for(kernel_size)`` instead of ME's."""
    def conv_fn(sd, model):
        return convert._convert(sd, model, "minkowski",
                                lambda t, k: convert.weight_from_kernel_major(t["kernel"], k, order_for(k)))
    return conv_fn


def _mirrored_transposed(sd, model):
    """from_minkowski, then every transposed conv's kernel offsets mirrored (k -> 1 - k)."""
    out = convert.from_minkowski(sd, model)
    for name, m in model.named_modules():
        if isinstance(m, lattice.nn.ConvTranspose3d):
            out[f"{name}.weight"] = out[f"{name}.weight"].flip(1, 2, 3).contiguous()
    return out


@pytest.mark.parametrize("wrong", ["z_fastest_k2_only", "z_fastest_all", "mirrored_transposed"])
def test_wrong_conversions_miss_minkowski_output(wrong):
    """Negative controls: plausible conversion mistakes (the kernel-offset permutation wrong for
    the 2x2x2 kernels only, for every kernel, or the transposed conv's offsets mirrored) are far
    outside the tolerance, so the tolerance above cannot hide them."""
    meta, sd, fx = load("minkunet18a")
    fn = {"z_fastest_k2_only": _minkowski_with(lambda k: "z_fastest" if tuple(k) == (2, 2, 2) else "minkowski"),
          "z_fastest_all": _minkowski_with(lambda k: "z_fastest"),
          "mirrored_transposed": _mirrored_transposed}[wrong]
    me = fx["out_feats"].double()
    err = (run(meta, sd, fx, convert_fn=fn).double() - me).abs().max().item()
    assert err > 100 * TOL * me.abs().max().item(), f"{wrong}: error {err:.3g} is within the tolerance"
