"""`python -m lattice.demo`: runs in-process on small scans and prints what README promises.

The demo must work without the repository's shared/ folder (it ray-casts its own scan); the
real SemanticKITTI scan in <repo>/../shared/data is used only when it is present.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from lattice import demo

REPO = Path(__file__).resolve().parents[2]
KITTI_SCAN = REPO.parent / "shared" / "data" / "semantickitti" / "000000.bin"

CONV_LAYERS = [
    "stem.conv", "down1.conv", "enc1.conv1", "enc1.conv2", "down2.conv", "enc2.conv1", "enc2.conv2",
    "down3.conv", "enc3.conv1", "enc3.conv2", "up3.conv", "dec3.conv1", "dec3.conv2", "dec3.proj.0",
    "up2.conv", "dec2.conv1", "dec2.conv2", "dec2.proj.0", "up1.conv", "dec1.conv",
]


def _final_loss(text: str) -> float:
    match = re.search(r"^loss:\s+(\S+)$", text, re.MULTILINE)
    assert match, f"no 'loss:' line in the demo output:\n{text}"
    return float(match.group(1))


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


def test_demo_small_synthetic_scan_prints_route_table_and_finite_loss(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--max-points", "30000", "--seed", "1", "--channels", "8"]) == 0
    out = capsys.readouterr().out

    assert re.search(r"^scan:\s+synthetic 64-beam street scan \(seed 1\), cropped .*: 30,000 points", out, re.MULTILINE)
    assert re.search(r"^voxels:\s+[\d,]+ at 5 cm", out, re.MULTILINE)
    rows = _table_rows(out)
    assert list(rows) == [*CONV_LAYERS, "head"]
    for name in CONV_LAYERS:
        cells = rows[name]
        route = cells[7]
        expected = "pointwise_matmul" if name.endswith("proj.0") else "gather_gemm_scatter"
        assert route == expected, f"{name}: route {route!r} in {cells}"
        assert cells[8] in ("built", "reused"), cells
        assert all(math.isfinite(float(v)) for v in cells[9:11]), cells
    # The transposed convs land on the skip's rows; the strided convs shrink them.
    assert rows["up1.conv"][3] == rows["stem.conv"][3]
    assert int(rows["down1.conv"][3].replace(",", "")) < int(rows["down1.conv"][2].replace(",", ""))
    assert rows["enc1.conv2"][8] == "reused" and rows["stem.conv"][8] == "built"

    assert re.search(r"^rows per level: stride 1: [\d,]+, stride 2: [\d,]+, stride 4: [\d,]+, stride 8: [\d,]+$",
                     out, re.MULTILINE)
    assert re.search(r"^output:\s+logits \(\d+, 4\) float32", out, re.MULTILINE)
    assert re.search(r"^time:\s+forward cold [\d.]+ ms, backward [\d.]+ ms, forward hot [\d.]+ ms", out, re.MULTILINE)
    assert "lattice 0.1" in out and "cpu:" in out and "cuda:" in out  # backend_info()
    assert math.isfinite(_final_loss(out))


def test_demo_quiet_prints_only_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--max-points", "15000", "--channels", "8", "--steps", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "route (fwd" not in out and "... " not in out and "lattice 0.1" not in out
    assert re.search(r"^step 2:\s+loss \S+", out, re.MULTILINE)
    assert math.isfinite(_final_loss(out))


def test_demo_kitti_scan_cropped_runs(capsys: pytest.CaptureFixture[str]) -> None:
    if not KITTI_SCAN.exists():
        reason = f"the SemanticKITTI scan is not here: {KITTI_SCAN}"
        print(f"skipping: {reason}")
        pytest.skip(reason)
    assert demo.main(["--scan", str(KITTI_SCAN), "--max-points", "30000", "--channels", "8"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^scan:\s+.*000000\.bin \(000000\.label classes\), cropped .*: 30,000 points", out, re.MULTILINE)
    assert "gather_gemm_scatter" in out and "pointwise_matmul" in out
    assert math.isfinite(_final_loss(out))


def test_demo_does_not_read_the_shared_folder() -> None:
    """The demo builds its scan in code: no import of shared/bench, no path into shared/."""
    source = Path(demo.__file__).read_text()
    imports = [line for line in source.splitlines() if re.match(r"\s*(import|from)\s", line)]
    assert not [line for line in imports if "bench" in line or "workloads" in line], imports
    assert "../shared" not in source and '"shared"' not in source


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


def test_read_kitti_scan_rejects_a_file_that_is_not_float4_records(tmp_path: Path) -> None:
    bad = tmp_path / "bad.bin"
    np.arange(6, dtype=np.float32).tofile(bad)
    with pytest.raises(ValueError, match=r"\[demo\] --scan: expected float32 \(x, y, z, reflectance\) records"):
        demo.read_kitti_scan(str(bad))


@pytest.mark.parametrize("argv", [["--voxel-size", "0"], ["--channels", "0"], ["--steps", "0"],
                                  ["--scan", "/nonexistent/scan.bin"]])
def test_demo_bad_argument_exits_with_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        demo.main(argv)
    assert info.value.code == 2
    assert "[demo] --" in capsys.readouterr().err
