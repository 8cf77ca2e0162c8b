"""The benchmark harness (lattice.bench): the smoke preset runs every case, reports a route, N and
pairs, and writes its files. No timing value is asserted beyond being positive."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import lattice.bench as bench
from lattice.bench import cases, workloads

CONV_TAGS = {"subm3", "k2s2", "k3s2", "tr_k2s2", "gen_k2s2", "pw"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, int]:
    out = tmp_path_factory.mktemp("bench_smoke")
    rc = bench.main(["--preset", "smoke", "--output", str(out)])
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return out, doc, rc


def _allowed_skip(r: dict) -> bool:
    # Only the KITTI rows may skip, and only where shared/data is absent.
    return r["status"] == "skipped" and workloads.kitti_path() is None and "unavailable" in r["reason"]


def test_bench_smoke_every_case_runs_exit_code_zero(smoke):
    _, doc, rc = smoke
    assert rc == 0
    assert doc["results"], "smoke selected no case"
    bad = [(r["name"], r["status"], r.get("reason"))
           for r in doc["results"] if r["status"] != "ok" and not _allowed_skip(r)]
    assert not bad


def test_bench_smoke_cases_cover_every_group_and_conv_geometry(smoke):
    _, doc, _ = smoke
    names = [r["name"] for r in doc["results"]]
    groups = {r["group"] for r in doc["results"]}
    assert {"conv", "relations", "point_voxel", "networks"} <= groups
    assert {n.split("/")[1] for n in names if n.startswith("conv/")} == CONV_TAGS
    assert any(n.startswith("networks/minkunet42/") for n in names)
    assert "pooling" in groups and "pooling" not in doc["skipped_groups"]
    assert {n.split("/")[1] for n in names if n.startswith("pooling/")} == set(cases.POOL_TAGS)


def test_bench_smoke_results_report_route_n_and_pairs(smoke):
    _, doc, _ = smoke
    for r in doc["results"]:
        if r["status"] != "ok":
            continue
        assert isinstance(r["route"], str) and r["route"], r["name"]
        assert r["n_in"] > 0 and r["n_out"] > 0 and r["pairs"] > 0, r["name"]
        assert r["avg_offsets"] > 0, r["name"]
        assert r["timings"], r["name"]
        for key, t in r["timings"].items():
            assert t["median_ms"] > 0 and t["p95_ms"] > 0, (r["name"], key)
            assert t["repeats"] >= 5 and len(t["samples_ms"]) == t["repeats"], (r["name"], key)


def test_bench_smoke_conv_results_split_map_cold_hot_and_gradients(smoke):
    _, doc, _ = smoke
    conv = [r for r in doc["results"] if r["group"] == "conv" and r["status"] == "ok"]
    assert conv
    for r in conv:
        assert set(r["timings"]) >= {"map_cold", "map_hot", "cold", "hot", "input_grad", "weight_grad", "fwd_bwd"}
        assert set(r["routes"]) == {"forward", "input_grad", "weight_grad"}
        assert all(isinstance(v, str) and v for v in r["routes"].values())
        hot = r["rates"]["hot"]
        assert hot["flop"] == 2.0 * r["pairs"] * r["c_in"] * r["c_out"]
        assert hot["flop_per_s"] > 0 and hot["bytes_per_s"] > 0
        assert hot["pct_gemm_ceiling"] > 0 and hot["pct_copy_ceiling"] > 0


def test_bench_smoke_network_records_every_conv_layer(smoke):
    _, doc, _ = smoke
    (net,) = [r for r in doc["results"] if r["group"] == "networks"]
    assert set(net["timings"]) == {"inference", "train_step"}
    # MinkUNet42: 2 stem + 4 x (1 down + 4 subm) + 3 stage projections
    #             + 4 x (1 up + 4 subm + 1 projection) = 49 sparse conv layers
    assert net["conv_layers"] == 49 == len(net["layers"])
    assert sum(layer["pairs"] for layer in net["layers"]) == net["pairs"]
    assert all(layer["route"] for layer in net["layers"])
    # nothing was tuned in this process: every layer's route is the rank order's (lattice.tune marks others)
    assert all(layer["tuned"] is False for layer in net["layers"])
    # Every layer has its own forward time (issue 19: the route and time per layer are visible),
    # and the per-layer table in results.txt shows them.
    assert all(isinstance(layer["fwd_ms"], float) and layer["fwd_ms"] > 0 for layer in net["layers"])


def test_bench_smoke_writes_json_table_and_png_files(smoke):
    out, doc, _ = smoke
    for name in ("results.json", "results.txt", "time_per_case.png", "anchor_ratio.png"):
        assert (out / name).is_file(), name
    for png in ("time_per_case.png", "anchor_ratio.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "results.txt").read_text(encoding="utf-8")
    assert all(r["name"] in table for r in doc["results"])
    assert "conv layers (fwd ms" in table and "encoders.0.0.conv" in table


def test_bench_smoke_json_has_environment_and_ceilings(smoke):
    _, doc, _ = smoke
    env = doc["environment"]
    for key in ("git_sha", "cpu_model", "threads", "gpu_name", "torch_version", "cuda_version",
                "lattice_backend_info", "lattice_device_caps"):
        assert key in env, key
    assert env["cpu_model"] and env["torch_version"] and "lattice" in env["lattice_backend_info"]
    assert doc["ceilings"]["gemm_flops"] > 0 and doc["ceilings"]["copy_bytes_per_s"] > 0


def test_bench_compare_same_file_prints_unit_ratios(smoke, capsys):
    out, _, _ = smoke
    path = str(out / "results.json")
    assert bench.main(["--compare", path, path]) == 0
    text = capsys.readouterr().out
    assert "geometric mean B/A" in text and "1.000" in text


def test_bench_cuda_without_device_skips_with_reason(tmp_path):
    if cases.cuda_unavailable_reason() is None:
        pytest.skip("a CUDA device is present: the cuda cases run instead of skipping")
    rc = bench.main(["--device", "cuda", "--preset", "smoke", "--case-filter", "conv/pw/", "--output", str(tmp_path)])
    doc = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert rc == 0 and doc["results"]
    assert all(r["status"] == "skipped" and r["reason"] for r in doc["results"])


def test_bench_case_filter_substring_selects_matching_cases():
    sel = cases.Selection(preset="smoke", case_filter="relations/")
    names = [c.name for c in cases.build_cases(sel)]
    assert names and all(n.startswith("relations/") for n in names)


def test_bench_size_and_channels_override_sized_workloads():
    sel = cases.Selection(preset="smoke", sizes=[5000], channels=[8], case_filter="conv/subm3/grid")
    assert [c.name for c in cases.build_cases(sel)] == ["conv/subm3/grid_5k/C8"]


def test_bench_line_and_block_families_have_exact_n_and_unique_rows():
    import numpy as np

    for name, n in (("line4_1000", 1000), ("block2_10k", 10_000), ("block8_1000", 1000)):
        c = workloads.coords(name)
        assert c.shape == (n, 4) and c.dtype == np.int32
        assert len(np.unique(c, axis=0)) == n


def test_large_case_checks_sampled_rows_and_records_peak_memory() -> None:
    """The issue-18 large-input case (10M points in the full preset) at a CI size: its independent
    float64 check of sampled rows passes on a correct conv and it records the peak memory."""
    ctx = cases.Context(device="cpu", dtype=__import__("torch").float32, repeats=1)
    r = cases.large_case(300_000, 4).run(ctx)
    assert r["correct"] and r["checked_rows"] == 4096 and r["max_rel_err"] <= r["tolerance"]
    assert r["pairs"] > r["n_in"] > 200_000 and r["peak_rss_bytes"] >= r["peak_rss_bytes_before"] > 0
    assert "large/subm3/surface_10m/C8" in {c.name for c in cases.build_cases(cases.Selection(preset="full"))}


def test_large_cube_case_checks_rows_edges_and_records_view_bytes() -> None:
    """The issue-18 dense-cube case (512^3 in the GPU preset) at a CI size on CPU: sampled rows
    against the float64 index-arithmetic evaluation, the exact edge count (3 side - 2)^3, and the
    relation's view bytes per edge after the forward (the CPU route's map + out_ptr + per-offset
    grouping: under 16 bytes per edge on a dense cube, no edge list built)."""
    ctx = cases.Context(device="cpu", dtype=__import__("torch").float32, repeats=1)
    r = cases.large_cube_case(24, 4).run(ctx)
    assert r["correct"] and r["pairs"] == 70 ** 3 and r["max_rel_err"] <= r["tolerance"]
    assert "edge_list" not in r["forward_views"] and 0 < r["forward_bytes_per_edge"] <= 16
    assert "large/subm3/cube512/C8" in {c.name for c in cases.build_cases(cases.Selection(preset="gpu", device="cuda"))}


def test_large_cube_case_fails_on_a_wrong_convolution(monkeypatch) -> None:
    """The cube check can fail: a conv that drops one corner offset is caught."""
    real = cases.ops.subm_conv3d

    def wrong(x, w, *a, **k):
        w = w.clone()
        w[:, 0, 0, 0, :] = 0
        return real(x, w, *a, **k)

    monkeypatch.setattr(cases.ops, "subm_conv3d", wrong)
    ctx = cases.Context(device="cpu", dtype=__import__("torch").float32, repeats=1)
    with pytest.raises(AssertionError, match="sampled rows differ"):
        cases.large_cube_case(12, 4).run(ctx)


def test_large_case_fails_on_a_wrong_convolution(monkeypatch) -> None:
    """The check can fail: a conv that drops the centre offset's contribution is caught."""
    real = cases.ops.subm_conv3d

    def wrong(x, w, *a, **k):
        w = w.clone()
        w[:, 1, 1, 1, :] = 0
        return real(x, w, *a, **k)

    monkeypatch.setattr(cases.ops, "subm_conv3d", wrong)
    ctx = cases.Context(device="cpu", dtype=__import__("torch").float32, repeats=1)
    with pytest.raises(AssertionError, match="sampled rows differ"):
        cases.large_case(100_000, 4).run(ctx)
