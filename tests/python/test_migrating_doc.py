"""docs/migrating.md: the training script is run as written (a few steps on a small crop of the
SemanticKITTI scan, through its 2-worker DataLoader), so the documented pipeline cannot rot."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KITTI = REPO / ".." / "shared" / "data" / "semantickitti"


def _block(name: str) -> str:
    text = (REPO / "docs" / "migrating.md").read_text(encoding="utf-8")
    m = re.search(rf"<!-- {name}:begin -->\s*```python\n(.*?)```\s*<!-- {name}:end -->", text, re.S)
    assert m, f"docs/migrating.md: no {name} code block"
    return m.group(1)


def test_training_script_is_short():
    assert len(_block("train-minkunet18").strip().splitlines()) <= 30  # issue 13: "a 30-line script"


@pytest.mark.skipif(not (KITTI / "000000.bin").is_file(), reason="../shared/data/semantickitti not present")
def test_training_script_runs_and_the_loss_goes_down(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_block("train-minkunet18"), encoding="utf-8")
    env = dict(os.environ, KITTI_DIR=str(KITTI), CROP_M="4", STEPS="5",
               PYTHONPATH=str(REPO / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"step \d+: loss ([0-9.]+)", run.stdout)]
    assert len(losses) == 5, run.stdout
    assert losses[-1] < losses[0], losses
