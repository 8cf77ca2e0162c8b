"""explain() is the whole decision of a convolution: the relation route (family "relation":
cpu_hash, cuda_hash; src/route/relation_routes.cpp) that builds the relation, then the conv route.

Each test proves that the relation decision is part of the explanation (``prior``), names every
row of the relation table with its verdict (the rejected row with its reason), and is the route
that actually builds the relation (the printed table is the table of the data's device), and that
str(explain(...)) shows both tables, relation first.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import cuda_admission as adm
import lattice
from conftest import random_coords
from lattice import quantize_weight
from lattice.routes import route_names
from lattice.tensor import SparseTensor


def _tensor(device: str = "cpu", channels: int = 4) -> tuple[SparseTensor, torch.Tensor]:
    c = torch.from_numpy(random_coords(np.random.default_rng(11), 150, batches=2, extent=6, spread=4))
    x = SparseTensor(c.to(device), torch.randn(c.shape[0], channels, device=device))
    return x, torch.randn(5, 3, 3, 3, channels, device=device)


def _rows(e) -> dict:
    return {r["route"]: r for r in e.rows}


def test_relation_family_is_in_the_route_table():
    """The rows are declared once and reach the Python route lists (cuda row first: rank order)."""
    assert route_names("relation") == ["cuda_hash", "cpu_hash"]
    assert route_names("relation", device="cpu") == ["cpu_hash"]
    assert route_names("relation", device="cuda") == ["cuda_hash"]


def test_cpu_subm_conv3d_explains_the_relation_route_then_the_conv_route():
    x, w = _tensor()
    e = lattice.explain("subm_conv3d", x, w)
    (rel,) = e.prior
    assert rel.chosen == "cpu_hash"
    rows = _rows(rel)
    assert set(rows) == set(route_names("relation"))  # every row of the relation table
    assert not rows["cuda_hash"]["admitted"] and rows["cuda_hash"]["reason"] == "runs on cuda; the data is on cpu"
    assert "submanifold relation, K=27" in rel.problem and f"{x.feats.shape[0]} input rows on cpu" in rel.problem
    # the conv decision is unchanged and still the top-level choice
    assert e.chosen in route_names("conv", device="cpu")
    assert set(_rows(e)) == set(route_names("conv"))
    text = str(e)
    head, conv = text.split("route decision for subm_conv3d forward")
    assert head.startswith("first:\n") and "-> cpu_hash" in head and "rejected: runs on cuda" in head
    assert f"-> {e.chosen}" in conv and "implicit_gemm_sm80" in conv and "cuda_hash" not in conv


def test_every_conv_op_and_pass_lists_its_relation_kind():
    """The relation problem is the plan's: its kind for each op, on every pass."""
    x, w = _tensor()
    for op, kw, kind in (("conv3d", {"stride": 2}, "forward"),
                         ("conv_transpose3d", {"stride": 1}, "transposed"),
                         ("generative_conv_transpose3d", {"stride": 1}, "generative")):
        for pass_ in ("forward", "input_grad", "weight_grad"):
            (rel,) = lattice.explain(op, x, w, pass_=pass_, **kw).prior
            assert rel.chosen == "cpu_hash" and f"{kind} relation" in rel.problem, (op, pass_, rel.problem)


def test_quantized_conv_explains_the_relation_route_too():
    x, w = _tensor(channels=32)
    e = lattice.explain("subm_conv3d", x, quantize_weight(w, bits=8))
    (rel,) = e.prior
    assert rel.chosen == "cpu_hash" and str(e).startswith("first:\n")


@adm.needs_gpu()
def test_cuda_subm_conv3d_explains_the_relation_route_then_the_conv_route():
    x, w = _tensor("cuda")
    e = lattice.explain("subm_conv3d", x, w)
    (rel,) = e.prior
    assert rel.chosen == "cuda_hash"
    rows = _rows(rel)
    assert not rows["cpu_hash"]["admitted"] and rows["cpu_hash"]["reason"].startswith("runs on cpu; the data is on cuda")
    assert e.chosen in route_names("conv", device="cuda")
    head, conv = str(e).split("route decision for subm_conv3d forward")
    assert "-> cuda_hash" in head and "rejected: runs on cpu" in head and f"-> {e.chosen}" in conv
