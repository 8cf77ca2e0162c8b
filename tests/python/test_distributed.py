"""Issue 15: lattice networks under torch.nn.parallel.DistributedDataParallel (gloo, CPU, 2 ranks).

Every multi-process run is a pair of subprocesses (tests/python/ddp_worker.py, or
examples/train_ddp.py with torchrun's environment variables set by hand) joined through
``init_method=file://`` in the test's temporary folder; output goes to files (no pipe can fill up
and block a rank), and every wait has a hard timeout after which both processes are killed, so
this file can fail but never hang.

What is proved:

* one DDP step on two ranks, each holding half of a 4-sample batch, gives the gradients, updated
  parameters and BatchNorm buffers of one process on the whole batch (SyncBatchNorm), or of one
  process running BatchNorm on each half (plain BatchNorm per rank); each case also differs from
  the other case's reference, so the comparison can fail;
* DDP hands the caller's SparseTensor object to the module (``device_ids=None``);
* every ``lattice.models`` network trains for two DDP steps with ``find_unused_parameters=False``,
  every parameter gets a gradient in the first step, and both ranks end with the same weights; a
  control network with an unused parameter fails the same procedure;
* examples/train_ddp.py resumed from a mid-epoch checkpoint continues with bitwise the same
  losses and final weights, and its DistributedSampler order covers the data set once per epoch;
* a rank that raises makes the other fail instead of hanging.

Tolerance of the float64 comparisons: ``max|ddp - ref| <= 1e-10 * max|ref|`` per tensor. The two
sides compute the same sums in a different order (per-rank partial sums of the conv weight
gradients and of the BatchNorm statistics, DDP's (g0 + g1) / 2 average): float64 rounding of a
sum of n terms moves it by at most about n * 2^-53 relative to sum|terms|, ~1e-13 for the ~1000
rows here, compounded over a few dozen layers of backward. Measured: 1.5e-14 (SyncBatchNorm:
gradients and updated parameters; buffers 2e-15) and 0 / 2e-16 (per-rank BatchNorm, where the
sums are the same except DDP's average). 1e-10 sits four orders above that and far below the
effect of a real error (missing synchronisation, a wrong loss scale, per-half instead of
whole-batch statistics: measured O(1) relative, checked below to exceed 1e-4).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import lattice
from lattice import nn as lnn
from lattice.data import sparse_collate_fn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ddp_worker as W  # noqa: E402

pytestmark = pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                                reason="torch built without torch.distributed / gloo")

EXAMPLE = HERE.parents[1] / "examples" / "train_ddp.py"
RTOL = 1e-10
LAUNCH_TIMEOUT_S = 120  # hard limit per two-rank launch (they take 5-20 s)


def _env() -> dict:
    env = dict(os.environ)
    pkg = str(Path(lattice.__file__).resolve().parents[1])
    env["PYTHONPATH"] = pkg + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _launch(argv_for_rank, folder: Path, tag: str, env_for_rank=None, timeout: float = LAUNCH_TIMEOUT_S) -> list[dict]:
    """Starts two processes, waits for both with a hard deadline (then kills both and fails),
    returns ``[{"rc", "out", "err"}]`` per rank."""
    folder.mkdir(parents=True, exist_ok=True)
    procs, logs = [], []
    for rank in range(2):
        out, err = open(folder / f"{tag}.{rank}.out", "w"), open(folder / f"{tag}.{rank}.err", "w")
        env = _env()
        if env_for_rank:
            env.update(env_for_rank(rank))
        procs.append(subprocess.Popen(argv_for_rank(rank), stdout=out, stderr=err, env=env, cwd=str(folder)))
        logs.append((out, err))
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=30)
        pytest.fail(f"{tag}: the two ranks did not finish within {timeout} s (killed)")
    finally:
        for out, err in logs:
            out.close()
            err.close()
    return [{"rc": p.returncode, "out": (folder / f"{tag}.{r}.out").read_text(),
             "err": (folder / f"{tag}.{r}.err").read_text()} for r, p in enumerate(procs)]


def _worker(scenario: str, folder: Path, timeout: float = LAUNCH_TIMEOUT_S) -> list[dict]:
    init = folder / f"init_{scenario.replace(',', '_')}"
    return _launch(lambda r: [sys.executable, str(HERE / "ddp_worker.py"), scenario, str(r), "2", str(init), str(folder)],
                   folder, scenario.replace(",", "_"), timeout=timeout)


def _ok(results: list[dict], what: str) -> None:
    for r, res in enumerate(results):
        assert res["rc"] == 0, f"{what}: rank {r} exited with {res['rc']}:\n{res['err'][-3000:]}"


@pytest.fixture(scope="module")
def worker_folder(tmp_path_factory):
    """One two-rank launch of the ``step``, ``models`` and ``bn`` scenarios (results are files)."""
    folder = tmp_path_factory.mktemp("ddp_worker")
    _ok(_worker("step,models,bn", folder), "step,models,bn")
    return folder


@pytest.fixture(scope="module")
def step_results(worker_folder):
    return [torch.load(worker_folder / f"step_rank{r}.pt") for r in range(2)]


@pytest.fixture(scope="module")
def models_report(worker_folder):
    return [json.loads((worker_folder / f"models_rank{r}.json").read_text()) for r in range(2)]


# ---- single-process references (same data, initialisation, loss and optimiser as the worker) --------


def _sgd_tree(model: torch.nn.Module, grads: dict) -> dict:
    """Gradients, the parameters after one SGD step and the buffers of ``model``."""
    return {"grads": grads,
            "params": {n: (p.detach() - W.LR * grads[n]) for n, p in model.named_parameters()},
            "buffers": {n: b.detach().clone() for n, b in model.named_buffers()}}


@pytest.fixture(scope="module")
def whole_batch_reference():
    """One process, the whole batch in one SparseTensor: BatchNorm statistics over all 4 samples."""
    samples = W.make_samples(0)
    n_total = sum(int(s["labels"].numel()) for s in samples)
    model = W.make_model()
    (W.ce_sum(model, sparse_collate_fn(samples)) / n_total).backward()
    return _sgd_tree(model, {n: p.grad.clone() for n, p in model.named_parameters()})


@pytest.fixture(scope="module")
def per_half_reference():
    """One process, two copies of the model (same initial weights), each runs one half (its own
    BatchNorm statistics and buffers); the loss is the sum over both halves / N, the gradient of a
    shared parameter is the sum of the copies' gradients. Buffers: copy r = what rank r holds."""
    samples = W.make_samples(0)
    n_total = sum(int(s["labels"].numel()) for s in samples)
    copies = [W.make_model(), W.make_model()]
    loss = sum(W.ce_sum(m, sparse_collate_fn(samples[2 * r:2 * r + 2])) for r, m in enumerate(copies)) / n_total
    loss.backward()
    grads = {n: p.grad + q.grad for (n, p), (_, q) in zip(copies[0].named_parameters(), copies[1].named_parameters())}
    out = _sgd_tree(copies[0], grads)
    out["buffers_per_rank"] = [{n: b.detach().clone() for n, b in m.named_buffers()} for m in copies]
    return out


def _max_rel(a: dict, b: dict) -> float:
    """max over tensors of max|a - b| / max|b| (integer buffers compared exactly: inf if unequal)."""
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    worst = 0.0
    for k in a:
        x, y = a[k], b[k]
        assert x is not None and y is not None, f"{k}: no gradient"
        if not y.dtype.is_floating_point:
            worst = max(worst, 0.0 if torch.equal(x, y) else float("inf"))
            continue
        worst = max(worst, float((x - y).abs().max()) / max(float(y.abs().max()), 1e-300))
    return worst


def _assert_close(a: dict, b: dict, what: str) -> None:
    rel = _max_rel(a, b)
    assert rel <= RTOL, f"{what}: max relative difference {rel:.3e} > {RTOL:.0e}"


# ---- one step on two ranks = one step of one process -------------------------------------------------


def test_ddp_sync_batchnorm_step_equals_one_process_on_the_whole_batch(step_results, whole_batch_reference):
    for rank, res in enumerate(step_results):
        r = res["sync"]
        assert r["bn_types"] == ["SyncBatchNorm", "SyncBatchNorm1d"]
        _assert_close(r["grads"], whole_batch_reference["grads"], f"rank {rank} gradients")
        _assert_close(r["params"], whole_batch_reference["params"], f"rank {rank} updated parameters")
        # running statistics from the global batch (unbiased variance with the global count)
        _assert_close(r["buffers"], whole_batch_reference["buffers"], f"rank {rank} BatchNorm buffers")


def test_ddp_sync_batchnorm_really_synchronises(step_results, per_half_reference, whole_batch_reference):
    """The sync result is far from the per-half statistics result (so the test above can fail),
    and the loss each rank saw is its share of the whole batch's mean loss."""
    assert _max_rel(step_results[0]["sync"]["grads"], per_half_reference["grads"]) > 1e-4
    assert _max_rel(step_results[0]["sync"]["buffers"], per_half_reference["buffers_per_rank"][0]) > 1e-4


def test_ddp_plain_batchnorm_step_equals_one_process_with_batchnorm_per_half(step_results, per_half_reference,
                                                                             whole_batch_reference):
    for rank, res in enumerate(step_results):
        r = res["plain"]
        assert r["bn_types"] == ["BatchNorm", "BatchNorm1d"]
        _assert_close(r["grads"], per_half_reference["grads"], f"rank {rank} gradients")
        _assert_close(r["params"], per_half_reference["params"], f"rank {rank} updated parameters")
        _assert_close(r["buffers"], per_half_reference["buffers_per_rank"][rank], f"rank {rank} BatchNorm buffers")
    assert _max_rel(step_results[0]["plain"]["grads"], whole_batch_reference["grads"]) > 1e-4


def test_ddp_hands_the_sparse_tensor_to_the_module_unchanged(step_results):
    """device_ids=None: DDP calls the module with the caller's objects (no scatter, no copy)."""
    assert all(res[mode]["same_object"] for res in step_results for mode in ("sync", "plain"))


def test_ddp_rank_losses_sum_to_the_whole_batch_mean_loss(step_results):
    samples = W.make_samples(0)
    n_total = sum(int(s["labels"].numel()) for s in samples)
    model = W.make_model()
    with torch.no_grad():
        ref = W.ce_sum(model, sparse_collate_fn(samples)) / n_total
    total = sum(res["sync"]["loss"] for res in step_results) / 2  # each rank's loss is scaled by world size
    assert abs(float(total) - float(ref)) <= RTOL * abs(float(ref))


# ---- every lattice.models network under DDP with find_unused_parameters=False --------------------------

NETWORKS = ["MinkUNet18", "MinkUNet34", "MinkUNet42", "SparseResNet21D", "VoxelBackBone8x"]


@pytest.mark.parametrize("name", NETWORKS)
def test_model_trains_under_ddp_with_find_unused_parameters_false(models_report, name):
    for rank, report in enumerate(models_report):
        e = report[name]
        assert e["error"] is None, f"rank {rank}: {e['error']}"
        assert e["no_grad_after_step1"] == [], f"rank {rank}: parameters without a gradient: {e['no_grad_after_step1']}"
    assert models_report[0][name]["digest"] == models_report[1][name]["digest"], "ranks diverged"


def test_unused_parameter_control_fails_the_same_procedure(models_report):
    """The procedure above detects an unused parameter (it is not vacuous in this torch)."""
    for report in models_report:
        e = report["control_unused_parameter"]
        assert e["no_grad_after_step1"] == ["unused.weight", "unused.bias"]
        assert e["error"] is not None and "finished reduction" in e["error"]


def test_find_unused_parameters_true_needs_tensor_outputs(models_report):
    """docs/distributed.md: with find_unused_parameters=True DDP searches the *output* for tensors
    (tensors, lists, tuples, dicts) and finds none in a SparseTensor; returning ``.feats`` (or a
    dict / tuple holding it) works."""
    for report in models_report:
        assert report["find_unused_true_tensor_output"]["error"] is None
        assert report["find_unused_true_tensor_output"]["no_grad_after_step1"] == []
        assert "mark a variable ready only once" in (report["find_unused_true_sparse_output"]["error"] or "")


# ---- lattice's CPU synchronised batch norm alone ----------------------------------------------------------


@pytest.mark.parametrize("case", list(W.BN_CASES))
def test_cpu_sync_batchnorm_equals_batch_norm_over_the_concatenated_ranks(worker_folder, case):
    """Two ranks' SyncBatchNorm (uneven rows, an empty rank, momentum None, affine False,
    untracked statistics) = torch.nn.BatchNorm1d on all rows in one process, for two training
    steps: outputs (rows in rank order), input gradients of the loss summed over the ranks, the
    sum of the ranks' weight / bias gradients (DDP would average them), and the running buffers
    (global unbiased variance; equal on both ranks)."""
    ranks = [torch.load(worker_folder / f"bn_rank{r}.pt")[case] for r in range(2)]
    kwargs, n0, n1 = W.BN_CASES[case]
    feats, r, rm = W.bn_case_data(case)
    ref = torch.nn.BatchNorm1d(6, **kwargs).double()
    if ref.running_mean is not None:
        ref.running_mean.copy_(rm)
    if ref.weight is not None:
        with torch.no_grad():
            ref.weight.copy_(torch.linspace(0.5, 2.0, 6))
            ref.bias.copy_(torch.linspace(-1.0, 1.0, 6))
    for step in range(2):
        x = feats.clone().requires_grad_(True)
        y = ref(x * (step + 1))
        (y * r).sum().backward()
        got = [rk[step] for rk in ranks]
        torch.testing.assert_close(torch.cat([g["y"] for g in got]), y.detach(), rtol=RTOL, atol=RTOL)
        torch.testing.assert_close(torch.cat([g["dx"] for g in got]), x.grad, rtol=RTOL, atol=RTOL)
        if ref.weight is not None:
            torch.testing.assert_close(got[0]["dw"] + got[1]["dw"], ref.weight.grad, rtol=RTOL, atol=RTOL)
            torch.testing.assert_close(got[0]["db"] + got[1]["db"], ref.bias.grad, rtol=RTOL, atol=RTOL)
            ref.weight.grad = ref.bias.grad = None
        expected = {k: v for k, v in ref.state_dict().items() if k not in ("weight", "bias")}
        for g in got:
            buffers = {k[len("bn."):]: v for k, v in g["buffers"].items() if k[len("bn."):] not in ("weight", "bias")}
            assert buffers.keys() == expected.keys()
            for k, v in buffers.items():
                torch.testing.assert_close(v, expected[k], rtol=RTOL, atol=RTOL)


# ---- SyncBatchNorm conversion is DDP-compatible on CPU ---------------------------------------------------


def test_converted_sync_batchnorm_child_is_not_a_torch_sync_batchnorm_and_shares_state():
    """DDP refuses a CPU module holding a torch.nn.SyncBatchNorm; lattice's child is a _BatchNorm
    that is not one, with the same state_dict names and the original parameters and buffers."""
    model = W.make_model(torch.float32)
    before = model.state_dict()
    weight = model.stem[0].bn.bn.weight
    converted = lnn.convert_sync_batchnorm(model)
    child = converted.stem[0].bn.bn
    assert isinstance(child, lnn.SyncBatchNorm1d) and isinstance(child, torch.nn.modules.batchnorm._BatchNorm)
    assert not any(isinstance(m, torch.nn.SyncBatchNorm) for m in converted.modules())
    assert child.weight is weight and list(converted.state_dict()) == list(before)


# ---- examples/train_ddp.py: checkpoint / resume, sampler order ---------------------------------------------


def _example_module():
    spec = importlib.util.spec_from_file_location("train_ddp_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    """Run A: 3 epochs of 2 steps (8 scans, 2 ranks x 2 scans), checkpoints kept every 3 steps
    (step 3 is mid-epoch 2). Run B: resumed from A's step-3 checkpoint to the end."""
    folder = tmp_path_factory.mktemp("ddp_example")
    scans = folder / "scans"
    _example_module().make_scans(str(scans), 8, 1200)  # in this process: one interpreter start-up less
    common = ["--data", str(scans), "--epochs", "3", "--batch-size", "2", "--model", "MinkUNet18", "--cr", "0.125",
              "--voxel-size", "0.2", "--threads", "1", "--seed", "3",
              "--device", "cpu"]  # the gloo CPU test: on a GPU machine "auto" would pick cuda (one GPU, two ranks)

    def run(tag: str, extra: list[str]) -> list[dict]:
        init = folder / f"init_{tag}"
        env = lambda r: {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}  # noqa: E731
        res = _launch(lambda r: [sys.executable, str(EXAMPLE), *common, "--dist-url", f"file://{init}", *extra],
                      folder, tag, env_for_rank=env)
        _ok(res, tag)
        return res

    a = run("A", ["--checkpoint-dir", str(folder / "ckA"), "--checkpoint-every", "3", "--keep-checkpoints",
                  "--log-json", str(folder / "A.json")])
    b = run("B", ["--checkpoint-dir", str(folder / "ckB"), "--resume", str(folder / "ckA" / "step_000003.pt"),
                  "--log-json", str(folder / "B.json")])
    return {"folder": folder, "A": a, "B": b,
            "logA": json.loads((folder / "A.json").read_text()), "logB": json.loads((folder / "B.json").read_text())}


def test_example_resume_from_mid_epoch_checkpoint_continues_with_identical_losses(example_runs):
    log_a, log_b = example_runs["logA"], example_runs["logB"]
    assert [r["step"] for r in log_a] == [1, 2, 3, 4, 5, 6] and [r["step"] for r in log_b] == [4, 5, 6]
    assert [(r["loss"], r["indices"]) for r in log_b] == [(r["loss"], r["indices"]) for r in log_a[3:]]  # bitwise
    assert len({r["loss"] for r in log_a}) == 6  # the losses move: the comparison is not between constants
    folder = example_runs["folder"]
    a, b = torch.load(folder / "ckA" / "last.pt"), torch.load(folder / "ckB" / "last.pt")
    assert a["position"] == b["position"] == {"epoch": 3, "batch": 0, "global_step": 6}
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    mid = torch.load(folder / "ckA" / "step_000003.pt")
    assert mid["position"] == {"epoch": 1, "batch": 1, "global_step": 3}
    assert not all(torch.equal(mid["model"][k], a["model"][k]) for k in a["model"])


def test_example_sampler_covers_the_data_once_per_epoch_and_reshuffles(example_runs):
    log = example_runs["logA"]
    orders = []
    for epoch in range(3):
        rows = [r for r in log if r["epoch"] == epoch]
        seen = [i for r in rows for rank in r["indices"] for i in rank]
        assert sorted(seen) == list(range(8)), f"epoch {epoch}: {seen}"
        orders.append(seen)
    assert len({tuple(o) for o in orders}) == 3  # set_epoch: a different order every epoch


def test_example_prints_a_progress_line_per_epoch_on_rank_0(example_runs):
    out0, out1 = example_runs["A"][0]["out"], example_runs["A"][1]["out"]
    lines = [line for line in out0.splitlines() if line.startswith("epoch ")]
    assert [line.split()[1] for line in lines] == ["1/3", "2/3", "3/3"] and all(" loss " in x for x in lines)
    assert "epoch " not in out1
    assert "resumed from" in example_runs["B"][0]["out"]


# ---- a failing rank does not hang the other -------------------------------------------------------------


def test_a_rank_that_raises_does_not_hang_the_other(tmp_path):
    t0 = time.monotonic()
    res = _worker("raise", tmp_path, timeout=W.PG_TIMEOUT_S + 60)
    elapsed = time.monotonic() - t0
    assert res[1]["rc"] != 0 and "injected failure on rank 1" in res[1]["err"]
    assert res[0]["rc"] != 0, "rank 0 finished a step without rank 1"
    assert not (tmp_path / "raise_rank0_finished").exists()
    assert elapsed < W.PG_TIMEOUT_S + 45
