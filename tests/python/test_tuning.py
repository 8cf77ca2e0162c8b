"""Measured route choices (lattice.tune, lattice/route/tuning.h; issue 19's tuner) on the CPU.

What is checked: a tuning run records one choice per bucket and pass, times every admitted
candidate except the reference oracle, never touches the model, and afterwards every call of the
bucket runs the recorded route (bitwise the forced route's output); explain() shows the
measurement; a recorded route that is not admitted for a call falls back to the rank order and
says so; a forced route wins and is never tuned; the saved table reloads in another process of
the same build and is refused (with a warning) from another build; malformed files raise.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import lattice
import lattice.nn as lnn
from lattice._core import core
from conftest import random_coords

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_table(tmp_path, monkeypatch):
    monkeypatch.setenv("LATTICE_CACHE_DIR", str(tmp_path / "cache"))
    lattice.clear_tuning()
    yield
    lattice.clear_tuning()
    core.set_conv_tuning(False)


def _input(seed: int = 0, n: int = 400, c: int = 8) -> lattice.SparseTensor:
    rng = np.random.default_rng(seed)
    coords = torch.from_numpy(random_coords(rng, n, batches=2, extent=7))
    torch.manual_seed(seed)
    return lattice.SparseTensor(coords, torch.randn(coords.shape[0], c))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = lnn.SubmConv3d(8, 16, 3)
        self.bn = lnn.BatchNorm(16)
        self.b = lnn.SubmConv3d(16, 16, 1)  # 1x1 onto its own rows: pointwise_matmul and gather_gemm_scatter admitted
        self.down = lnn.Conv3d(16, 8, 2, stride=2)

    def forward(self, x):
        return self.down(self.b(self.bn(self.a(x))))


def _entries_by_pass():
    out = {}
    for e in lattice.tuning_entries():
        out.setdefault(e["key"].split(",")[0], []).append(e)
    return out


def test_tune_records_each_bucket_and_pass_and_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    net = Net().train()
    x = _input()
    net(x).feats.sum().backward()  # gradients present before tuning: they must survive it
    before = {k: v.detach().clone() for k, v in net.state_dict().items()}
    grads = {n: p.grad.clone() for n, p in net.named_parameters()}
    report = lattice.tune(net, x, backward=True, reps=2, save=False)
    assert net.training
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k  # batch norm statistics included
    for n, p in net.named_parameters():
        assert torch.equal(p.grad, grads[n]), n
    keys = [e["key"] for e in report]
    assert len(keys) == len(set(keys)) and len(report) == len(lattice.tuning_entries())
    # three convs (subm 3^3, subm 1x1, k2 s2), each with forward and weight gradient; an input
    # gradient for the two whose input needs one (x's features do not)
    passes = _entries_by_pass()
    assert {k: len(v) for k, v in passes.items()} == {"conv forward": 3, "conv input_grad": 2, "conv weight_grad": 3}
    for e in report:
        names = [t[0] for t in e["times"]]
        assert "reference" not in names  # the oracle is never a candidate
        assert e["route"] in names
        assert all(ms is not None and ms >= 0 and err == "" for _, ms, err in e["times"])
        best = min(ms for _, ms, _ in e["times"])
        assert dict((r, ms) for r, ms, _ in e["times"])[e["route"]] == best
        if "K=1 " in e["key"] and "identity" in e["key"]:
            assert names == ["pointwise_matmul", "gather_gemm_scatter"]  # rank order
        else:
            assert names == ["gather_gemm_scatter"]
    assert "bucket(s) measured" in str(report)


def test_a_second_tuning_run_measures_nothing_new():
    net = Net().eval()
    x = _input(1)
    first = lattice.tune(net, x, reps=1, save=False)
    assert len(first) == 3
    assert len(lattice.tune(net, x, reps=1, save=False)) == 0


def test_a_recorded_choice_decides_while_admitted_and_explain_shows_it():
    x = _input(2, c=16)
    w = torch.randn(16, 1, 1, 1, 16)
    by_rank = lattice.explain("subm_conv3d", x, w)
    assert by_rank.chosen == "pointwise_matmul" and by_rank.tuned == ""
    lattice.tune(lambda t: lattice.ops.subm_conv3d(t, w), x, reps=1, save=False)
    (entry,) = lattice.tuning_entries()
    # record the lower-ranked candidate as the winner: every call of the bucket must run it
    core.set_tuned(entry["key"], "gather_gemm_scatter", [("pointwise_matmul", 9.0, ""), ("gather_gemm_scatter", 1.0, "")])
    e = lattice.explain("subm_conv3d", x, w)
    assert e.chosen == "gather_gemm_scatter" and e.tuned_chosen
    text = str(e)
    assert "tuned: measured for bucket [" in text and "'gather_gemm_scatter' 1.000 ms" in text
    assert "admitted, not the measured choice" in text
    y = lattice.ops.subm_conv3d(x, w).feats
    forced = lattice.ops.subm_conv3d(x, w, route="gather_gemm_scatter").feats
    assert torch.equal(y, forced)
    # a forced route still wins over the record
    assert lattice.explain("subm_conv3d", x, w, route="pointwise_matmul").chosen == "pointwise_matmul"
    # another bucket (other channel count) is not covered
    assert lattice.explain("subm_conv3d", x, torch.randn(8, 1, 1, 1, 16)).tuned == ""


def test_a_recorded_route_that_is_not_admitted_falls_back_to_the_rank_order():
    x = _input(3)
    w = torch.randn(8, 3, 3, 3, 8)
    lattice.tune(lambda t: lattice.ops.subm_conv3d(t, w), x, reps=1, save=False)
    (entry,) = lattice.tuning_entries()
    core.set_tuned(entry["key"], "pointwise_matmul", [("pointwise_matmul", 0.5, "")])  # needs kernel volume 1
    e = lattice.explain("subm_conv3d", x, w)
    assert e.chosen == "gather_gemm_scatter" and not e.tuned_chosen
    assert "not admitted for this call (needs kernel volume 1, got 27): the rank order decides" in str(e)
    assert torch.equal(lattice.ops.subm_conv3d(x, w).feats, lattice.ops.subm_conv3d(x, w, route="gather_gemm_scatter").feats)


def test_forced_calls_are_not_tuned(monkeypatch):
    x = _input(4)
    w = torch.randn(8, 3, 3, 3, 8)
    lattice.tune(lambda t: lattice.ops.subm_conv3d(t, w, route="reference"), x, reps=1, save=False)
    assert lattice.tuning_entries() == []
    monkeypatch.setenv("LATTICE_FORCE_ROUTE", "conv:reference")
    lattice.tune(lambda t: lattice.ops.subm_conv3d(t, w), x, reps=1, save=False)
    assert lattice.tuning_entries() == []


def test_tuning_is_off_outside_tune_even_after_an_error():
    x = _input(5)

    def broken(t):
        lattice.ops.subm_conv3d(t, torch.randn(8, 3, 3, 3, 8))
        raise RuntimeError("model failed")

    with pytest.raises(RuntimeError, match="model failed"):
        lattice.tune(broken, x, reps=1, save=False)
    assert not core.conv_tuning_enabled()
    n = len(lattice.tuning_entries())
    lattice.ops.subm_conv3d(x, torch.randn(4, 3, 3, 3, 8))  # a new bucket, outside tune: not measured
    assert len(lattice.tuning_entries()) == n


def test_saved_table_reloads_in_a_new_process_of_this_build(tmp_path):
    net = Net().eval()
    x = _input(6)
    report = lattice.tune(net, x, reps=1)
    path = report.path
    assert path is not None and path.parent == tmp_path / "cache" and path.name == f"tuning-{core.tuning_build_id()}.json"
    doc = json.loads(path.read_text())
    assert doc["build"] == core.tuning_build_id() and len(doc["entries"]) == 3
    code = ("import lattice; n = lattice.load_tuning(); "
            "print(n, sorted((e['key'], e['route']) for e in lattice.tuning_entries()))")
    env = dict(os.environ, LATTICE_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    expected = sorted((e["key"], e["route"]) for e in lattice.tuning_entries())
    assert out.strip() == f"3 {expected}"


def test_load_tuning_refuses_another_build_and_malformed_files(tmp_path):
    assert lattice.load_tuning() == 0  # no file yet: nothing to load
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"lattice_tuning": 1, "build": "0000", "entries": [
        {"key": "k", "route": "gather_gemm_scatter", "times": [["gather_gemm_scatter", 1.0, ""]]}]}))
    with pytest.warns(RuntimeWarning, match="measured by another build"):
        assert lattice.load_tuning(path) == 0
    assert lattice.tuning_entries() == []
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"\[load_tuning\] path: expected a lattice tuning file \(JSON\)"):
        lattice.load_tuning(path)
    path.write_text(json.dumps({"something": 1}))
    with pytest.raises(ValueError, match=r"\[load_tuning\] path: expected a lattice tuning file of format 1"):
        lattice.load_tuning(path)
    path.write_text(json.dumps({"lattice_tuning": 1, "build": core.tuning_build_id(), "entries": [{"key": "k"}]}))
    with pytest.raises(ValueError, match=r"\[load_tuning\] entries: expected \{key, route, times\} records"):
        lattice.load_tuning(path)
    for bad_time in (["gather_gemm_scatter", "fast", ""], [3, 1.0, ""], ["gather_gemm_scatter", 1.0, None],
                     ["gather_gemm_scatter", True, ""], ["gather_gemm_scatter", 1.0]):
        path.write_text(json.dumps({"lattice_tuning": 1, "build": core.tuning_build_id(), "entries": [
            {"key": "k", "route": "gather_gemm_scatter", "times": [bad_time]}]}))
        with pytest.raises(ValueError, match=r"\[load_tuning\] entries: expected \{key, route, times\} records"):
            lattice.load_tuning(path)
    assert lattice.tuning_entries() == []
    path.write_text(json.dumps({"lattice_tuning": 1, "build": core.tuning_build_id(), "entries": [
        {"key": "k", "route": "warp_speed", "times": []}]}))
    with pytest.raises(ValueError, match=r"\[load_tuning\] route: expected one of 'pointwise_matmul'.*got 'warp_speed'"):
        lattice.load_tuning(path)
    with pytest.raises(FileNotFoundError, match=r"\[load_tuning\] path: expected an existing tuning file"):
        lattice.load_tuning(tmp_path / "missing.json")


def test_core_set_tuned_checks_its_arguments():
    with pytest.raises(ValueError, match=r"\[load_tuning\] key: expected a tuning bucket key, got ''"):
        core.set_tuned("", "gather_gemm_scatter", [])
    with pytest.raises(ValueError, match=r"\[load_tuning\] times: expected \(route, ms or None, error\) triples"):
        core.set_tuned("k", "gather_gemm_scatter", [("gather_gemm_scatter", 1.0)])


def test_tune_checks_its_arguments():
    x = _input(7)
    with pytest.raises(TypeError, match=r"\[tune\] model: expected a callable"):
        lattice.tune(3, x)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"\[tune\] reps: expected a positive int"):
            lattice.tune(Net(), x, reps=bad)
    with pytest.raises(TypeError, match=r"\[tune\] loss_fn: expected a callable or None"):
        lattice.tune(Net(), x, backward=True, loss_fn=3)
    with pytest.raises(ValueError, match=r"\[set_conv_tuning\] reps: expected a positive repeat count, got 0"):
        core.set_conv_tuning(True, 0)
    assert not core.conv_tuning_enabled()


def test_tune_minkunet42_with_backward_then_the_step_runs_the_recorded_routes():
    """TorchSparse's tune() crashed on MinkUNet42 with its backward option (issue 19): ours tunes
    every pass of every layer, and a training step afterwards gives the bits of an untuned step
    whose conv calls are forced to the recorded routes (on this CPU they are the rank order's
    unless a pointwise layer measured gather_gemm_scatter faster)."""
    from lattice.models import MinkUNet42

    torch.manual_seed(0)
    net = MinkUNet42(in_channels=4, num_classes=5, cr=0.25).train()
    x = _input(8, n=600, c=4)
    report = lattice.tune(net, x, backward=True, reps=1, save=False)
    assert len(report) > 20
    for e in report:
        assert e["route"] in ("gather_gemm_scatter", "pointwise_matmul")
        assert all(ms is not None for _, ms, _ in e["times"]), e

    def step():
        net.zero_grad()
        out = net(x)
        out.feats.float().sum().backward()
        return out.feats.detach().clone(), [p.grad.clone() for p in net.parameters()]

    tuned_out, tuned_grads = step()
    again_out, again_grads = step()  # a tuned process is as deterministic as an untuned one
    assert torch.equal(tuned_out, again_out)
    for a, b in zip(tuned_grads, again_grads):
        assert torch.equal(a, b)
    recorded = {e["key"]: e["route"] for e in lattice.tuning_entries()}
    lattice.clear_tuning()
    rank_out, rank_grads = step()
    if all(r == "gather_gemm_scatter" or "K=1 " in k for k, r in recorded.items()) and all(
            r == "pointwise_matmul" for k, r in recorded.items() if "K=1 " in k and "identity" in k):
        # every bucket recorded the rank order's route: the very same bits
        assert torch.equal(tuned_out, rank_out)
        for a, b in zip(tuned_grads, rank_grads):
            assert torch.equal(a, b)
    else:  # some 1x1 layer measured gather_gemm_scatter faster: its sums run in another order
        torch.testing.assert_close(tuned_out, rank_out, rtol=1e-4, atol=1e-4)


def test_bench_layer_records_mark_the_tuned_layers():
    from lattice.bench.cases import record_conv_layers

    net = Net().eval()
    x = _input(10)
    lattice.tune(net, x, reps=1, save=False)
    (one_by_one,) = [e for e in lattice.tuning_entries() if "K=1 " in e["key"]]
    core.set_tuned(one_by_one["key"], "gather_gemm_scatter", [("gather_gemm_scatter", 1.0, "")])
    layers = {r["layer"]: r for r in record_conv_layers(net, x)}
    assert (layers["b"]["route"], layers["b"]["tuned"]) == ("gather_gemm_scatter", True)
    assert (layers["a"]["route"], layers["a"]["tuned"]) == ("gather_gemm_scatter", True)  # its record is the rank's route
    lattice.clear_tuning()
    layers = {r["layer"]: r for r in record_conv_layers(net, x)}
    assert (layers["b"]["route"], layers["b"]["tuned"]) == ("pointwise_matmul", False)


# ---- CUDA (the CUDA parity suite; skipped with "no GPU" elsewhere) -----------------------------

import cuda_admission as adm  # noqa: E402


@adm.needs_gpu()
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_cuda_tune_minkunet42_with_backward_records_device_buckets_and_runs_them(dtype):
    """On a GPU the candidates are the CUDA routes admitted for the dtype (float32: only
    cuda_gather_gemm_scatter without allow_tf32, and cuda_pointwise_matmul on the 1x1x1 identity
    buckets); timing waits for the device, so tuning works on
    torch's stream and leaves nothing queued; a step afterwards is reproducible and each layer's
    output is the recorded route's (checked on one layer through route=)."""
    from lattice.models import MinkUNet42

    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    net = MinkUNet42(in_channels=4, num_classes=5, cr=0.25).to(dev).train()
    x = _input(9, n=3000, c=4).to(dev)
    if dtype == torch.float16:
        net = net.half()
        x = x.replace_feats(x.feats.half())
    report = lattice.tune(net, x, backward=True, reps=2, save=False)
    assert len(report) > 20
    allowed = {"cuda_pointwise_matmul", "implicit_gemm_sm80", "cuda_gather_gemm_scatter"}
    for e in report:
        assert "cuda sm_" in e["key"], e["key"]
        names = [t[0] for t in e["times"]]
        assert set(names) <= allowed and e["route"] in names, e
        # the 1x1x1 identity buckets (the shortcuts) also time the one-GEMM route, in rank order
        identity = ", identity" in e["key"]
        assert ("cuda_pointwise_matmul" in names) == identity, e
        if dtype == torch.float32:
            assert names == (["cuda_pointwise_matmul"] if identity else []) + ["cuda_gather_gemm_scatter"], e
        assert all(ms is not None and ms > 0 for _, ms, _ in e["times"]), e

    def step():
        net.zero_grad()
        out = net(x)
        out.feats.float().sum().backward()
        torch.cuda.synchronize()
        return out.feats.detach().clone(), [p.grad.clone() for p in net.parameters()]

    a_out, a_grads = step()
    b_out, b_grads = step()
    assert torch.equal(a_out, b_out)
    for a, b in zip(a_grads, b_grads):
        assert torch.equal(a, b)
    # one layer on its own: the tuned call gives the bits of the recorded route forced
    conv = lnn.SubmConv3d(x.feats.shape[1], 16, 3, bias=False).to(dev).to(dtype)
    lattice.tune(conv, x, reps=1, save=False)
    e = lattice.explain("subm_conv3d", x, conv.weight)
    assert e.tuned and e.tuned_chosen, str(e)
    with torch.no_grad():
        tuned = conv(x).feats
        forced = lattice.ops.subm_conv3d(x, conv.weight, route=e.chosen).feats
    assert torch.equal(tuned, forced)
