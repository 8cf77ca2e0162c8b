"""`python -m lattice.demo`: trains in-process on small scans and prints what README promises.

The demo must work without the repository's shared/ folder (it ray-casts its own scan); the
real SemanticKITTI scan in <repo>/../shared/data is used only when it is present (otherwise that
test is skipped with the reason printed).
"""
from __future__ import annotations

import io
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from lattice import demo
from lattice._demo_data import holdout_tiles
from lattice._demo_report import ProgressBar, class_weights, confusion, iou_per_class, majority_class, mean_iou

REPO = Path(__file__).resolve().parents[2]
KITTI_SCAN = REPO.parent / "shared" / "data" / "semantickitti" / "000000.bin"
KITTI_LABELS = KITTI_SCAN.with_suffix(".label")

CONV_LAYERS = [
    "stem.conv", "down1.conv", "enc1.conv1", "enc1.conv2", "down2.conv", "enc2.conv1", "enc2.conv2",
    "down3.conv", "enc3.conv1", "enc3.conv2", "up3.conv", "dec3.conv1", "dec3.conv2", "dec3.proj.0",
    "up2.conv", "dec2.conv1", "dec2.conv2", "dec2.proj.0", "up1.conv", "dec1.conv",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# The short SemanticKITTI run of the CI test: the whole scan (structure appears only beyond ~15 m,
# so a crop near the sensor has two or three classes) at 20 cm voxels (42k rows), widths 8..64, 60
# steps at lr 0.02. Measured on the 2-core dev machine: 13-16 s; voxel mIoU 0.64 / 0.58 / 0.72
# (seeds 0 / 1 / 2) against 0.10 for the majority-class predictor, final loss 0.16-0.37 from 1.6-1.8.
KITTI_TEST_ARGS = ["--voxel-size", "0.2", "--channels", "8", "--steps", "60", "--lr", "0.02"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[demo.DemoResult, str]:
    result = demo.run(demo.build_parser().parse_args(argv))
    return result, capsys.readouterr().out


def _final_loss(text: str) -> float:
    match = re.search(r"^loss:\s+(\S+)$", text, re.MULTILINE)
    assert match, f"no 'loss:' line in the demo output:\n{text}"
    return float(match.group(1))


def _miou_line(text: str) -> tuple[float, float]:
    match = re.search(r"^miou:\s+([\d.]+) on voxels vs ([\d.]+) for the majority-class predictor", text, re.MULTILINE)
    assert match, f"no 'miou:' line in the demo output:\n{text}"
    return float(match.group(1)), float(match.group(2))


def _table_rows(text: str) -> dict[str, list[str]]:
    """Layer name -> cells of the per-layer table (split on runs of two or more spaces)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("layer ") and "route" in line)
    rows = {}
    for line in lines[start + 2:]:
        if not line.strip() or line.startswith("BatchNorm"):
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = cells
    return rows


def _iou_rows(text: str) -> dict[str, list[str]]:
    """Class name (and "mIoU") -> cells of the per-class IoU table."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("class ") and "IoU voxels" in line)
    rows = {}
    for line in lines[start + 2:]:
        if not line.strip() or line.startswith("miou:"):
            break
        if not line.startswith("---"):
            cells = re.split(r"\s{2,}", line.strip())
            rows[cells[0]] = cells
    return rows


def _assert_pngs(result: demo.DemoResult, out_dir: Path, text: str) -> None:
    assert [Path(p).name for p in result.pngs] == ["bev.png", "loss.png"]
    for p in result.pngs:
        path = Path(p)
        assert path.parent == out_dir.resolve()
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000, p
        assert str(path) in text  # the run says where it wrote them


# ------------------------------------------------------------------------------------------------
# Runs
# ------------------------------------------------------------------------------------------------


def test_demo_short_synthetic_training_loss_falls_writes_pngs_and_prints_the_route_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The whole street (a crop near the sensor is all ground) at 25 cm: 17k voxels, about 2 s.
    out_dir = tmp_path / "out"
    result, out = _run(["--voxel-size", "0.25", "--seed", "1", "--channels", "8", "--steps", "12",
                        "--out", str(out_dir)], capsys)

    assert re.search(r"^scan:\s+synthetic 64-beam street scan \(seed 1\): [\d,]+ points", out, re.MULTILINE)
    assert re.search(r"^voxels:\s+[\d,]+ at 25 cm", out, re.MULTILINE)
    assert re.search(r"^train \[#+\] 12/12  loss [\d.]+  mIoU [\d.]+ .* took ", out, re.MULTILINE)  # the progress bar
    # Training: the loss falls, the final loss is what the last line says.
    assert len(result.losses) == 12 and all(math.isfinite(v) for v in result.losses)
    assert result.losses[-1] < 0.8 * result.losses[0], result.losses
    assert math.isclose(_final_loss(out), result.final_loss, rel_tol=1e-5)
    assert re.search(r"^trained: loss [\d.]+ -> [\d.]+ in 12 steps", out, re.MULTILINE)
    # Scores: a table with every class and the mIoU row; the summary line agrees with the result.
    rows = _iou_rows(out)
    assert list(rows) == [*demo.SYNTHETIC_CLASSES, "mIoU"]
    miou, majority = _miou_line(out)
    assert miou == pytest.approx(result.miou, abs=5e-4) and majority == pytest.approx(result.majority_miou, abs=5e-4)
    assert 0.0 <= result.majority_miou < result.miou <= 1.0
    _assert_pngs(result, out_dir, out)

    # The profile: the foundation demo's per-layer routes, timings, rows per level, output shape.
    table = _table_rows(out)
    assert list(table) == [*CONV_LAYERS, "head"]
    for name in CONV_LAYERS:
        cells = table[name]
        expected = "pointwise_matmul" if name.endswith("proj.0") else "gather_gemm_scatter"
        assert cells[7] == expected, f"{name}: route {cells[7]!r} in {cells}"
        assert cells[8] in ("built", "reused"), cells
        assert all(math.isfinite(float(v)) for v in cells[9:11]), cells
    assert table["up1.conv"][3] == table["stem.conv"][3]  # the transposed convs land on the skip's rows
    assert int(table["down1.conv"][3].replace(",", "")) < int(table["down1.conv"][2].replace(",", ""))
    assert table["enc1.conv2"][8] == "reused" and table["stem.conv"][8] == "built"
    assert re.search(r"^rows per level: stride 1: [\d,]+, stride 2: [\d,]+, stride 4: [\d,]+, stride 8: [\d,]+$",
                     out, re.MULTILINE)
    assert re.search(r"^output:\s+logits \(\d+, 4\) float32", out, re.MULTILINE)
    assert re.search(r"^time:\s+forward cold [\d.]+ ms, backward [\d.]+ ms, forward hot [\d.]+ ms", out, re.MULTILINE)
    assert "lattice 0.1" in out and "cpu:" in out and "cuda:" in out  # backend_info()


def test_demo_quiet_prints_only_the_summary_and_still_writes_the_pngs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.main(["--max-points", "8000", "--channels", "8", "--steps", "3", "--quiet",
                      "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "route (fwd" not in out and "... " not in out and "lattice 0.1" not in out
    assert "train [" not in out and "\r" not in out  # no progress bar
    assert re.search(r"^trained: loss \S+ -> \S+ in 3 steps", out, re.MULTILINE)
    _miou_line(out)
    assert math.isfinite(_final_loss(out))
    assert (tmp_path / "bev.png").is_file() and (tmp_path / "loss.png").is_file()


def test_demo_profile_flag_overrides_quiet_and_no_profile_drops_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--max-points", "5000", "--channels", "4", "--steps", "1", "--out", str(tmp_path)]
    _, out = _run([*base, "--quiet", "--profile"], capsys)
    assert list(_table_rows(out)) == [*CONV_LAYERS, "head"] and "lattice 0.1" in out
    _, out = _run([*base, "--no-profile"], capsys)
    assert "route (fwd" not in out and "rows per level" not in out and "train [" in out


def test_demo_is_deterministic_for_a_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--max-points", "6000", "--channels", "4", "--steps", "3", "--quiet", "--out", str(tmp_path)]
    a, _ = _run([*base, "--seed", "3"], capsys)
    b, _ = _run([*base, "--seed", "3"], capsys)
    c, _ = _run([*base, "--seed", "4"], capsys)
    assert a.losses == b.losses and a.final_loss == b.final_loss and a.ious == b.ious
    assert a.losses != c.losses


def test_demo_holdout_scores_the_hidden_tiles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result, out = _run(["--voxel-size", "0.3", "--channels", "4", "--steps", "2", "--quiet", "--holdout", "0.3",
                        "--out", str(tmp_path)], capsys)
    assert re.search(r"^holdout: labels of [\d,]+ voxels in 30% of the 8 m tiles hidden", out, re.MULTILINE)
    assert re.search(r"^held out: [\d.]+ on the [\d,]+ held-out voxels vs [\d.]+", out, re.MULTILINE)
    assert result.holdout_voxels > 0 and math.isfinite(result.holdout_miou)
    assert "IoU held out" in out


def test_demo_labels_option_maps_semantickitti_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A KITTI .bin + SemanticKITTI .label pair written here (the synthetic street with raw ids and
    instance ids, a few unlabeled points), under names the auto-discovery would not find."""
    scan = demo.synthetic_scan(seed=2)
    rng = np.random.default_rng(0)
    raw_of_class = np.array([40, 50, 10, 80], np.uint32)  # road, building, car, pole
    raw = raw_of_class[scan.labels]
    raw[(scan.labels == 0) & (rng.uniform(size=len(raw)) < 0.3)] = 72  # terrain: ground too
    raw[rng.uniform(size=len(raw)) < 0.02] = 0  # unlabeled
    raw |= rng.integers(0, 50, len(raw)).astype(np.uint32) << 16  # instance ids
    bin_path, label_path = tmp_path / "scan.bin", tmp_path / "other_name.label"
    scan.points.tofile(bin_path)
    raw.tofile(label_path)

    result, out = _run(["--scan", str(bin_path), "--labels", str(label_path), "--max-points", "15000",
                        "--channels", "4", "--steps", "2", "--quiet", "--out", str(tmp_path / "o")], capsys)
    assert re.search(r"^scan:\s+.*scan\.bin \(other_name\.label classes\), cropped .*: 15,000 points", out, re.MULTILINE)
    assert result.class_names == demo.KITTI_CLASSES
    classes = re.search(r"^classes: (.*) voxels; ([\d,]+) ignored$", out, re.MULTILINE)
    assert classes and "vegetation 0" in classes.group(1)
    assert math.isfinite(result.final_loss)


def test_demo_kitti_scan_trains_and_beats_the_majority_predictor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not KITTI_SCAN.exists() or not KITTI_LABELS.exists():
        reason = f"the SemanticKITTI scan is not here: {KITTI_SCAN} (+ .label)"
        print(f"skipping: {reason}")
        pytest.skip(reason)
    out_dir = tmp_path / "kitti"
    result, out = _run(["--scan", str(KITTI_SCAN), "--labels", str(KITTI_LABELS), *KITTI_TEST_ARGS, "--quiet",
                        "--out", str(out_dir)], capsys)
    assert re.search(r"^scan:\s+.*000000\.bin \(000000\.label classes\): 123,389 points", out, re.MULTILINE)
    assert list(_iou_rows(out)) == [*demo.KITTI_CLASSES, "mIoU"]
    assert result.losses[-1] < 0.5 * result.losses[0], result.losses
    assert result.final_loss < 0.5 * result.losses[0]
    assert result.miou > result.majority_miou + 0.3, (result.miou, result.majority_miou, result.ious)
    assert result.point_miou > result.point_majority_miou + 0.3
    _assert_pngs(result, out_dir, out)


# ------------------------------------------------------------------------------------------------
# Pieces
# ------------------------------------------------------------------------------------------------


def test_synthetic_scan_is_a_street_of_about_100k_points_with_every_class() -> None:
    scan = demo.synthetic_scan(seed=0)
    assert scan.points.dtype == np.float32 and scan.points.shape[1] == 4
    assert 80_000 <= len(scan.points) <= 130_000
    assert set(np.unique(scan.labels)) == set(range(len(demo.CLASS_NAMES)))
    assert np.isfinite(scan.points).all()
    assert ((scan.points[:, 3] >= 0) & (scan.points[:, 3] <= 1)).all()
    ground = scan.points[scan.labels == 0]
    assert np.allclose(ground[:, 2], -demo.SENSOR_HEIGHT_M, atol=0.1)
    assert np.array_equal(demo.synthetic_scan(seed=0).points, scan.points)  # deterministic per seed


def test_map_kitti_labels_groups_raw_ids_and_ignores_unlabeled_and_outliers() -> None:
    raw_ids = [40, 44, 48, 49, 60, 72, 50, 51, 52, 10, 18, 30, 99, 252, 254, 70, 71, 80, 81, 0, 1, 999]
    expected = [0] * 6 + [1] * 3 + [2] * 6 + [3] * 2 + [4] * 2 + [demo.IGNORE_INDEX] * 3
    raw = np.array(raw_ids, np.uint32) | (np.arange(len(raw_ids), dtype=np.uint32) << 16)  # instance ids
    assert demo.map_kitti_labels(raw).tolist() == expected


def test_voxel_labels_are_the_majority_with_ties_to_the_smallest_class() -> None:
    inverse = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3, 4, 4, 4, 4])
    labels = torch.tensor([2, 1, 2, 3, 1, -100, -100, 0, 3, -100, -100, -100])
    got = demo.majority_labels(inverse, labels, 5, 4)
    assert got.tolist() == [2, 1, demo.IGNORE_INDEX, 0, 3]


def test_scores_iou_majority_and_class_weights_by_hand() -> None:
    truth = torch.tensor([0, 0, 0, 0, 1, 1, 2, -100])
    pred = torch.tensor([0, 0, 0, 1, 1, 0, 3, 2])
    ious = iou_per_class(confusion(pred, truth, 4))
    assert ious[:3] == [pytest.approx(3 / 5), pytest.approx(1 / 3), 0.0] and math.isnan(ious[3])
    assert mean_iou(ious) == pytest.approx((3 / 5 + 1 / 3 + 0) / 3)
    assert majority_class(truth, 4) == 0
    assert majority_class(torch.tensor([2, 2, 1, 1]), 3) == 1  # ties: the smallest id
    w = class_weights(torch.tensor([0] * 64 + [1] * 16 + [2] * 4), 4)
    assert w[3] == 0 and float(w[1] / w[0]) == pytest.approx(2.0) and float(w[2] / w[0]) == pytest.approx(4.0)
    freq = torch.tensor([64, 16, 4, 0]) / 84
    assert float((w * freq).sum()) == pytest.approx(1.0)


def test_progress_bar_rewrites_one_line_on_a_terminal_and_prints_lines_elsewhere() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Terminal()
    bar = ProgressBar(4, tty)
    for i in range(4):
        bar.update(i + 1, 1.0 / (i + 1))
    bar.close()
    text = tty.getvalue()
    assert text.count("\r") == 4 and text.endswith("\n") and text.count("\n") == 1
    assert "train [" + "#" * 28 + "] 4/4  loss 0.2500" in text

    log = io.StringIO()
    bar = ProgressBar(100, log)
    for i in range(100):
        bar.update(i + 1, 1.0)
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and 10 <= len(lines) <= 12 and " 100/100 " in lines[-1]

    quiet = io.StringIO()
    bar = ProgressBar(3, quiet, enabled=False)
    bar.update(1, 1.0)
    bar.close()
    assert quiet.getvalue() == ""


def test_holdout_tiles_are_deterministic_and_about_the_fraction() -> None:
    xy = torch.stack(torch.meshgrid(torch.arange(-400, 400), torch.arange(-400, 400), indexing="ij"), -1).view(-1, 2)
    coords = torch.cat([torch.zeros(len(xy), 1, dtype=torch.int64), xy, torch.zeros(len(xy), 1, dtype=torch.int64)], 1)
    held = holdout_tiles(coords, 0.1, 0.25, seed=0)
    assert 0.18 < float(held.float().mean()) < 0.32
    assert torch.equal(held, holdout_tiles(coords, 0.1, 0.25, seed=0))
    assert not torch.equal(held, holdout_tiles(coords, 0.1, 0.25, seed=1))
    assert not holdout_tiles(coords, 0.1, 0.0, seed=0).any()


def test_demo_does_not_read_the_shared_folder() -> None:
    """The demo builds its scan in code: no import of shared/bench, no path into shared/."""
    folder = Path(demo.__file__).parent
    for path in [folder / "demo.py", *sorted(folder.glob("_demo_*.py"))]:
        source = path.read_text()
        imports = [line for line in source.splitlines() if re.match(r"\s*(import|from)\s", line)]
        assert not [line for line in imports if "bench" in line or "workloads" in line], (path, imports)
        assert "../shared" not in source and '"shared"' not in source, path


def test_read_kitti_scan_rejects_a_file_that_is_not_float4_records(tmp_path: Path) -> None:
    bad = tmp_path / "bad.bin"
    np.arange(6, dtype=np.float32).tofile(bad)
    with pytest.raises(ValueError, match=r"\[demo\] --scan: expected float32 \(x, y, z, reflectance\) records"):
        demo.read_kitti_scan(str(bad))


def test_read_kitti_scan_rejects_labels_of_another_length(tmp_path: Path) -> None:
    scan, labels = tmp_path / "a.bin", tmp_path / "a.label"
    np.zeros((5, 4), np.float32).tofile(scan)
    np.zeros(4, np.uint32).tofile(labels)
    with pytest.raises(ValueError, match=r"\[demo\] --labels: .* has 4 entries .* but .* has 5 points"):
        demo.read_kitti_scan(str(scan), str(labels))


@pytest.mark.parametrize("argv", [["--voxel-size", "0"], ["--channels", "0"], ["--steps", "0"], ["--lr", "0"],
                                  ["--holdout", "1"], ["--scan", "/nonexistent/scan.bin"],
                                  ["--labels", "/nonexistent/scan.label"]])
def test_demo_bad_argument_exits_with_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        demo.main(argv)
    assert info.value.code == 2
    assert "[demo] --" in capsys.readouterr().err
